"""Pure JAX importance-sampling statistics of one padded batch (no jit, no devices here).

Shapes: B episodes, T steps (a padded bucket), K resampling groups. Weights live in
log space; every sum of weights is returned relative to a scale (the batch's maximum
log-weight, as in log-sum-exp) so that products that over- or underflow as plain
numbers still combine exactly in ``stats``. Padding is absorbing: log-ratio 0 and
reward 0 after an episode ends, so W_t stays at the episode's final weight.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

# Columns of the per-group sums. Trajectory terms use w_i = W_{i,T_i-1} / exp(log_scale_trajectory)
# and G_i the discounted return; per-decision terms P_i = sum_t gamma^t W_{i,t} r_{i,t} /
# exp(log_scale_step).
GROUP_SUM_FIELDS = (
    "count",
    "zero_count",
    "sum_w",
    "sum_w2",
    "sum_wg",
    "sum_w2g",
    "sum_w2g2",
    "sum_p",
    "sum_p2",
)


# Histogram of log10 trajectory weights: HISTOGRAM_BINS equal bins over HISTOGRAM_LOG10_RANGE,
# plus one bin below and one above; zero weights are counted in ``zero_count`` instead.
HISTOGRAM_LOG10_RANGE = (-10.0, 10.0)
HISTOGRAM_BINS = 80

# Betting intervals (``stats.betting_lower_bound``) need the law of four non-negative per-episode
# variables, normalised so that their means lie in [0, 1]; a histogram of their natural logs
# is a mergeable summary of it. Rows: BETTING_VARIABLES; column 0 counts values below the
# range (and zeros), column k >= 1 values in [exp(low + (k-1) width), exp(low + k width)), the
# last one also everything above. ``stats`` reads each bin as its lower edge, which never
# overstates a value, so the intervals stay valid.
BETTING_VARIABLES = ("trajectory_low", "trajectory_high", "decision_low", "decision_high")
BETTING_LOG_RANGE = (-32.0, 48.0)
BETTING_BIN_WIDTH = 1.0 / 128
BETTING_BINS = round((BETTING_LOG_RANGE[1] - BETTING_LOG_RANGE[0]) / BETTING_BIN_WIDTH)


class BatchStatistics(NamedTuple):
    """Sufficient statistics of one batch for one policy; merged across batches in ``stats``.

    Every sum is kept per resampling group (rows of ``group_sums``, ``group_num_t``,
    ``group_den_t``), so one matrix product computes them all and later resampling
    (jackknife over groups) needs no second pass.
    """

    log_scale_trajectory: jax.Array  # [] max_i log W_{i,T_i-1} (-inf if every weight is 0)
    log_scale_step: jax.Array  # [] max_{i,t} log W_{i,t}
    group_sums: jax.Array  # [K, F] the GROUP_SUM_FIELDS per group
    group_log_scale_t: jax.Array  # [K, T] max over the group's episodes of log W_{i,t}
    group_num_t: jax.Array  # [K, T] sum_{i in g} W_{i,t} r_{i,t} / exp(group_log_scale_t)
    group_den_t: jax.Array  # [K, T] sum_{i in g} W_{i,t} / exp(group_log_scale_t)
    log_weight_histogram: jax.Array  # [HISTOGRAM_BINS + 2] episodes per log10-weight bin
    replicate_sums: jax.Array  # [R, F] GROUP_SUM_FIELDS weighted by bootstrap counts
    replicate_log_scale_t: jax.Array  # [T] max_i log W_{i,t}
    replicate_num_t: jax.Array  # [R, T] sum_i c_ir W_{i,t} r_{i,t} / exp(replicate_log_scale_t)
    replicate_den_t: jax.Array  # [R, T] sum_i c_ir W_{i,t} / exp(replicate_log_scale_t)
    betting_histogram: jax.Array  # [4, BETTING_BINS + 1] episodes per log bin ([4, 0] if off)


def log_weights(
    log_target_t: jax.Array, log_behavior_t: jax.Array, step_mask_t: jax.Array
) -> jax.Array:
    """Cumulative log importance weights log W_t = sum_{k<=t} log(pi_e/pi_b), shape [..., T].

    Padded steps get log-ratio 0 (absorbing), through ``where`` so that whatever the
    policy computed on padding (even NaN) never leaks in.
    """
    log_ratio_t = jnp.where(step_mask_t, log_target_t - log_behavior_t, 0.0)
    return jnp.cumsum(log_ratio_t, axis=-1)


def _safe_scale(log_scale: jax.Array) -> jax.Array:
    """The scale to subtract: 0 where it is -inf (all weights zero) so exp never sees NaN."""
    return jnp.where(jnp.isfinite(log_scale), log_scale, 0.0)


def _log10_histogram(log_w_b: jax.Array, include_b: jax.Array, dtype) -> jax.Array:
    """[HISTOGRAM_BINS + 2] counts of log10(w) per bin (first and last: out of range)."""
    low, high = HISTOGRAM_LOG10_RANGE
    width = (high - low) / HISTOGRAM_BINS
    log10_w = jnp.where(include_b, log_w_b / jnp.log(10.0), low)
    bins = jnp.clip(jnp.floor((log10_w - low) / width).astype(jnp.int32) + 1, 0, HISTOGRAM_BINS + 1)
    return jax.ops.segment_sum(include_b.astype(dtype), bins, num_segments=HISTOGRAM_BINS + 2)


# Poisson(1) cumulative distribution up to 20 (the rest has probability < 1e-19).
_POISSON_CDF = tuple(sum(math.exp(-1) / math.factorial(j) for j in range(k + 1)) for k in range(21))


def poisson_counts(
    key_hi_b: jax.Array, key_lo_b: jax.Array, seed: jax.Array, num_replicates: int
) -> jax.Array:
    """[B, R] Poisson(1) bootstrap counts, one independent stream per episode.

    Each episode's counts come from a counter-based key of (seed, episode-id hash), so
    they do not depend on which batch, bucket, device or process the episode lands in.
    """
    cdf = jnp.asarray(_POISSON_CDF, jnp.float32)

    def one_episode(hi, lo):
        key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), hi), lo)
        uniform = jax.random.uniform(key, (num_replicates,), jnp.float32)
        return jnp.searchsorted(cdf, uniform, side="right")

    return jax.vmap(one_episode)(key_hi_b, key_lo_b)


def betting_variables(
    log_w_bt: jax.Array,
    reward_bt: jax.Array,
    return_b: jax.Array,
    discount_t: jax.Array,
    betting_range: jax.Array,
) -> jax.Array:
    """[4, B] log of the BETTING_VARIABLES of each episode (-inf for a zero).

    With rewards in [a, b] (a <= 0 <= b, as the absorbing reward 0 must be), a discounted
    horizon H = sum_{t < horizon} gamma^t and R = (b - a) H, each is >= 0 and, because the
    weights have mean 1 under the behavior policy, has mean v = (V - a H) / R or 1 - v:

      trajectory_low  = W_{T-1} (G - a H) / R
      trajectory_high = W_{T-1} (b H - G) / R
      decision_low    = [sum_t gamma^t W_t (r_t - a) + W_{T-1} (-a) (H - sum_t gamma^t)] / R
      decision_high   = [sum_t gamma^t W_t (b - r_t) + W_{T-1} b (H - sum_t gamma^t)] / R

    The per-step sums run over the padded steps too, where r = 0 and W stays W_{T-1}; the
    last term tops them up to the horizon, so padding cancels out. Args: log_w_bt [B, T]
    (-inf rows for padding episodes), reward_bt [B, T] (0 on padding), return_b [B] the
    discounted returns G, discount_t [T], betting_range [3] = (a, b, H).
    """
    low, high, horizon = betting_range[0], betting_range[1], betting_range[2]
    span = (high - low) * horizon
    log_w_final_b = log_w_bt[:, -1]
    rest = horizon - jnp.sum(discount_t)  # discount of the steps after the padded ones
    # Per-decision sums relative to each episode's largest weight, so no exp overflows.
    log_peak_b = jnp.max(log_w_bt, axis=1)
    w_bt = jnp.exp(log_w_bt - _safe_scale(log_peak_b)[:, None])
    w_final_b = w_bt[:, -1]
    decision_low = (w_bt * (reward_bt - low)) @ discount_t - low * rest * w_final_b
    decision_high = (w_bt * (high - reward_bt)) @ discount_t + high * rest * w_final_b

    def log_of(values_b, log_scale_b):
        # Rounding can leave -1e-16 where the exact value is 0; never take the log of it.
        return jnp.log(jnp.maximum(values_b, 0.0) / span) + log_scale_b

    return jnp.stack(
        [
            log_of(return_b - low * horizon, log_w_final_b),
            log_of(high * horizon - return_b, log_w_final_b),
            log_of(decision_low, log_peak_b),
            log_of(decision_high, log_peak_b),
        ]
    )


def _betting_histogram(log_x_vb: jax.Array, include_b: jax.Array, dtype) -> jax.Array:
    """[V, BETTING_BINS + 1] counts per natural-log bin of each variable (see BETTING_LOG_RANGE)."""
    low, high = BETTING_LOG_RANGE
    # -inf (a zero) goes below the range, +inf above; the small margin sends values within
    # rounding of a bin's upper edge to the bin below, which can only understate them.
    position = jnp.clip(jnp.nan_to_num(log_x_vb, nan=low - 1.0), low - 1.0, high + 1.0)
    offset = (position - low) / BETTING_BIN_WIDTH - 1e-3
    bins = jnp.clip(jnp.floor(offset).astype(jnp.int32) + 1, 0, BETTING_BINS)
    one_hot = jax.vmap(
        lambda b: jax.ops.segment_sum(include_b.astype(dtype), b, num_segments=BETTING_BINS + 1)
    )
    return one_hot(bins)


def batch_statistics(
    log_w_bt: jax.Array,
    reward_bt: jax.Array,
    step_mask_bt: jax.Array,
    episode_mask_b: jax.Array,
    group_b: jax.Array,
    counts_br: jax.Array,
    gamma: jax.Array | float,
    num_groups: int,
    betting_range: jax.Array | None = None,
) -> BatchStatistics:
    """Statistics of a padded batch for one policy.

    Args:
      log_w_bt: [B, T] cumulative log weights (``log_weights`` per episode).
      reward_bt: [B, T] rewards, any value on padding.
      step_mask_bt: [B, T] True on real steps.
      episode_mask_b: [B] True on real episodes.
      group_b: [B] int resampling group in [0, num_groups).
      counts_br: [B, R] bootstrap counts of each episode in each replicate (R may be 0).
      gamma: discount factor (a traced scalar, so one compilation serves every gamma).
      num_groups: K.
      betting_range: [3] (a, b, H) of ``betting_variables`` to histogram them, or None.
    """
    dtype = log_w_bt.dtype
    num_steps = log_w_bt.shape[-1]
    log_w_bt = jnp.where(episode_mask_b[:, None], log_w_bt, -jnp.inf)
    reward_bt = jnp.where(step_mask_bt & episode_mask_b[:, None], reward_bt, 0.0)
    discount_t = jnp.asarray(gamma, dtype) ** jnp.arange(num_steps, dtype=dtype)

    # WPDIS sums get a scale per group and step: its ratio sum_i W_it r_it / sum_i W_it stays
    # defined when late weights drifted hundreds of e-folds from early ones, and leaving one
    # group out (the jackknife) never subtracts a dominant group from the rest.
    group_log_scale_t = jax.ops.segment_max(log_w_bt, group_b, num_segments=num_groups)
    w_bt = jnp.exp(log_w_bt - _safe_scale(group_log_scale_t)[group_b])
    real_b = episode_mask_b.astype(dtype)

    def sum_by_group(values_b: jax.Array) -> jax.Array:
        """[K, ...] sums over the real episodes of each group."""
        real = jnp.where(episode_mask_b.reshape((-1,) + (1,) * (values_b.ndim - 1)), values_b, 0.0)
        return jax.ops.segment_sum(real, group_b, num_segments=num_groups)

    per_step_sums = sum_by_group(jnp.concatenate([w_bt * reward_bt, w_bt], axis=-1))

    # Trajectory terms (padding is absorbing: the last column holds final weights) and
    # per-decision terms, each relative to the batch's largest log-weight of its kind.
    log_w_final_b = log_w_bt[:, -1]
    log_scale_trajectory = jnp.max(log_w_final_b)
    log_scale_step = jnp.max(log_w_bt)
    w_b = jnp.exp(log_w_final_b - _safe_scale(log_scale_trajectory))
    w2_b = w_b * w_b
    return_b = reward_bt @ discount_t
    p_b = (jnp.exp(log_w_bt - _safe_scale(log_scale_step)) * reward_bt) @ discount_t
    zero_b = (episode_mask_b & (log_w_final_b == -jnp.inf)).astype(dtype)
    per_episode_bf = jnp.stack(
        [
            real_b,
            zero_b,
            w_b,
            w2_b,
            w_b * return_b,
            w2_b * return_b,
            w2_b * return_b * return_b,
            p_b,
            p_b * p_b,
        ],
        axis=-1,
    )
    # Bootstrap replicates: the same sums, each episode counted c_ir times. One scale per
    # step serves every replicate (nothing is subtracted from these sums later).
    counts_rb = (counts_br.astype(dtype) * real_b[:, None]).T
    replicate_log_scale_t = jnp.max(log_w_bt, axis=0)
    w_t_bt = jnp.exp(log_w_bt - _safe_scale(replicate_log_scale_t))
    replicate_per_step = counts_rb @ jnp.concatenate([w_t_bt * reward_bt, w_t_bt], axis=-1)
    if betting_range is None:
        betting_histogram = jnp.zeros((len(BETTING_VARIABLES), 0), dtype)
    else:
        betting_histogram = _betting_histogram(
            betting_variables(
                log_w_bt, reward_bt, return_b, discount_t, betting_range.astype(dtype)
            ),
            episode_mask_b,
            dtype,
        )
    return BatchStatistics(
        betting_histogram=betting_histogram,
        replicate_sums=counts_rb @ per_episode_bf,
        replicate_log_scale_t=replicate_log_scale_t,
        replicate_num_t=replicate_per_step[:, :num_steps],
        replicate_den_t=replicate_per_step[:, num_steps:],
        log_weight_histogram=_log10_histogram(log_w_final_b, episode_mask_b & (zero_b == 0), dtype),
        log_scale_trajectory=log_scale_trajectory,
        log_scale_step=log_scale_step,
        group_sums=sum_by_group(per_episode_bf),
        group_log_scale_t=group_log_scale_t,
        group_num_t=per_step_sums[:, :num_steps],
        group_den_t=per_step_sums[:, num_steps:],
    )
