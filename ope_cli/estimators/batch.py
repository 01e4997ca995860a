"""The one generic reduction of a padded batch: per-episode terms -> per-group sums.

Shapes: B episodes, T steps (a padded bucket), K resampling groups, R bootstrap replicates.
Pure JAX (no jit, no devices here). The shared per-episode quantities (log weights,
returns, the diagnostics' weight histogram, the betting variables) are computed once for
the batch; each estimator's ``terms`` is vmapped over the episodes, and every declared sum
is reduced relative to the batch's largest log scale of its kind (``base.Scale``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from ope_cli.estimators.base import (
    BETTING_BIN_WIDTH,
    BETTING_BINS,
    BETTING_LOG_RANGE,
    BETTING_VARIABLES,
    HISTOGRAM_BINS,
    HISTOGRAM_LOG10_RANGE,
    Episode,
    StepSum,
    Sum,
    available,
    core_terms,
    get,
    sums_of,
)


class BatchStatistics(NamedTuple):
    """Sufficient statistics of one batch for one policy; merged across batches in ``stats``.

    Every sum is kept per resampling group, so later resampling (jackknife over groups)
    needs no second pass. Dicts are keyed by sum (or scale) name; a pytree.
    """

    log_scales: dict[str, jax.Array]  # scalar scale -> [] max over episodes of its log scale
    pivots: dict[str, jax.Array]  # scalar scale with a pivot -> [] the batch's pivot
    sums: dict[str, jax.Array]  # Sum -> [K] (or [K, m + 1] with moments)
    replicate_sums: dict[str, jax.Array]  # Sum -> [R] (or [R, m + 1]) bootstrap-weighted
    step_log_scales: dict[str, jax.Array]  # per-step scale -> [K, T] max over a group
    step_sums: dict[str, jax.Array]  # StepSum -> [K, T]
    replicate_step_log_scales: dict[str, jax.Array]  # per-step scale -> [T] max over the batch
    replicate_step_sums: dict[str, jax.Array]  # StepSum -> [R, T]
    log_weight_histogram: jax.Array  # [HISTOGRAM_BINS + 2] episodes per log10-weight bin
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


def safe_scale(log_scale: jax.Array) -> jax.Array:
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
    if num_replicates == 0:  # no bootstrap: no key derivation to trace and compile
        return jnp.zeros((key_hi_b.shape[0], 0), jnp.int32)
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
    w_bt = jnp.exp(log_w_bt - safe_scale(log_peak_b)[:, None])
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


def per_episode(function, episodes: Episode):
    """``function`` written for one Episode, vmapped over a batch of them ([B, ...] fields;
    the discount [T] is shared)."""
    return jax.vmap(function, in_axes=(Episode(0, 0, None, 0, 0, 0, None),))(episodes)


def episode_terms(episodes: Episode, estimators: tuple[str, ...]) -> dict[str, jax.Array]:
    """{name: [B] or [B, T]} every estimator's (and the core) per-episode terms."""

    def one(episode: Episode) -> dict[str, jax.Array]:
        values = core_terms(episode)
        for name in estimators:
            values.update(get(name).terms(episode))
        return values

    return per_episode(one, episodes)


def _batch_scales(specs, episodes: Episode, real_b):
    """({scale: [] largest log scale}, {scale: [] pivot}, {scale: [B] pivot deviation}) of
    the scalar scales of ``specs``; the pivot is that of the episode with the largest scale."""
    scales = {spec.scale.name: spec.scale for spec in specs if spec.scale is not None}
    log_scales, pivots, deviations_b = {}, {}, {}
    for name, scale in scales.items():
        log_scale_b = jnp.where(real_b, per_episode(scale.log_scale, episodes), -jnp.inf)
        log_scales[name] = jnp.max(log_scale_b)
        if scale.pivot is not None:
            pivot_b = jnp.where(real_b, per_episode(scale.pivot, episodes), 0.0)
            pivots[name] = pivot_b[jnp.argmax(log_scale_b)]
            deviations_b[name] = pivot_b - pivots[name]
    return log_scales, pivots, deviations_b


def _scalar_sums(specs, terms_b, deviations_b, real_b, group_b, counts_rb, num_groups, dtype):
    """(sums [K, ...], replicate_sums [R, ...]) of the scalar ``specs``: the values (already
    relative to the batch's scales), with moments times (pivot - batch pivot)^k, stacked
    into [B, F] so that one segment_sum and one matrix product reduce every column."""
    columns, layout = [], []
    for spec in specs:
        value_b = terms_b[spec.name].astype(dtype)
        if spec.moments is None:
            layout.append((spec.name, 1))
            columns.append(value_b)
        else:
            layout.append((spec.name, spec.moments + 1))
            deviation_b = deviations_b[spec.scale.name]
            columns.extend(value_b * deviation_b**k for k in range(spec.moments + 1))
    per_episode_bf = jnp.where(real_b[:, None], jnp.stack(columns, axis=-1), 0.0)
    group_kf = jax.ops.segment_sum(per_episode_bf, group_b, num_segments=num_groups)
    replicate_rf = counts_rb @ per_episode_bf
    sums, replicate_sums, start = {}, {}, 0
    for (name, width), spec in zip(layout, specs, strict=True):
        part = slice(start, start + width)
        one = spec.moments is None
        sums[name] = group_kf[:, start] if one else group_kf[:, part]
        replicate_sums[name] = replicate_rf[:, start] if one else replicate_rf[:, part]
        start += width
    return sums, replicate_sums


def _step_sums(specs, terms_bt, episodes, real_b, group_b, counts_rb, num_groups, dtype):
    """Per-step sums [K, T] relative to a per-(group, step) max log scale, and bootstrap
    replicates [R, T] relative to a per-step max over the batch (nothing is subtracted from
    those later). The per-group scales keep ratios of per-step sums defined when late
    weights drifted hundreds of e-folds from early ones, and leaving one group out (the
    jackknife) never subtracts a dominant group from the rest."""
    out = ({}, {}, {}, {})  # step_log_scales, step_sums, replicate scales, replicate sums
    scales = {spec.scale.name: spec.scale for spec in specs}
    for scale_name, scale in scales.items():
        log_scale_bt = jnp.where(real_b[:, None], per_episode(scale.log_scale, episodes), -jnp.inf)
        group_scale_kt = jax.ops.segment_max(log_scale_bt, group_b, num_segments=num_groups)
        w_bt = jnp.exp(log_scale_bt - safe_scale(group_scale_kt)[group_b])
        replicate_scale_t = jnp.max(log_scale_bt, axis=0)
        w_rep_bt = jnp.exp(log_scale_bt - safe_scale(replicate_scale_t))
        own = [spec for spec in specs if spec.scale.name == scale_name]
        values_bt = [terms_bt[spec.name].astype(dtype) for spec in own]
        group_ukt = jax.ops.segment_sum(
            jnp.where(real_b[:, None, None], jnp.stack([v * w_bt for v in values_bt], 1), 0.0),
            group_b,
            num_segments=num_groups,
        )
        replicate_urt = jnp.einsum(
            "rb,ubt->urt", counts_rb, jnp.stack([v * w_rep_bt for v in values_bt])
        )
        out[0][scale_name], out[2][scale_name] = group_scale_kt, replicate_scale_t
        for u, spec in enumerate(own):
            out[1][spec.name], out[3][spec.name] = group_ukt[:, u], replicate_urt[u]
    return out


class WeightedBatch(NamedTuple):
    """A padded batch as one policy's statistics need it.

    Attributes:
      log_w_bt: [B, T] cumulative log weights (``log_weights`` per episode).
      reward_bt: [B, T] rewards, any value on padding.
      step_mask_bt: [B, T] True on real steps.
      episode_mask_b: [B] True on real episodes.
      group_b: [B] int resampling group in [0, K).
      counts_br: [B, R] bootstrap counts of each episode in each replicate (R may be 0).
      fields: further per-step inputs [B, T, ...] for estimators (``Episode.fields``).
    """

    log_w_bt: jax.Array
    reward_bt: jax.Array
    step_mask_bt: jax.Array
    episode_mask_b: jax.Array
    group_b: jax.Array
    counts_br: jax.Array
    fields: dict[str, jax.Array] = {}  # noqa: RUF012 - a NamedTuple default, never mutated


def batch_statistics(
    batch: WeightedBatch,
    gamma: jax.Array | float,
    num_groups: int,
    betting_range: jax.Array | None = None,
    estimators: tuple[str, ...] | None = None,
) -> BatchStatistics:
    """Statistics of a padded batch for one policy.

    Args:
      batch: the batch's log weights, rewards, masks, groups and bootstrap counts.
      gamma: discount factor (a traced scalar, so one compilation serves every gamma).
      num_groups: K.
      betting_range: [3] (a, b, H) of ``betting_variables`` to histogram them, or None.
      estimators: the registered estimators whose sums to compute (None: every registered
        one that ``batch.fields`` allow).
    """
    estimators = available(tuple(batch.fields)) if estimators is None else estimators
    log_w_bt, reward_bt, step_mask_bt, episode_mask_b, group_b, counts_br, fields = batch
    dtype = log_w_bt.dtype
    log_w_bt = jnp.where(episode_mask_b[:, None], log_w_bt, -jnp.inf)
    reward_bt = jnp.where(step_mask_bt & episode_mask_b[:, None], reward_bt, 0.0)
    discount_t = jnp.asarray(gamma, dtype) ** jnp.arange(log_w_bt.shape[-1], dtype=dtype)
    return_b = reward_bt @ discount_t
    specs = sums_of(estimators)
    scalar_specs = tuple(s for s in specs if isinstance(s, Sum))
    episodes = Episode(log_w_bt, reward_bt, discount_t, step_mask_bt, return_b, fields, {})
    log_scales, pivots, deviations_b = _batch_scales(scalar_specs, episodes, episode_mask_b)
    episodes = episodes._replace(log_scales=log_scales)
    terms = episode_terms(episodes, estimators)
    counts_rb = (counts_br.astype(dtype) * episode_mask_b.astype(dtype)[:, None]).T
    reduce_args = (episode_mask_b, group_b, counts_rb, num_groups, dtype)
    sums, replicate_sums = _scalar_sums(scalar_specs, terms, deviations_b, *reduce_args)
    step_specs = tuple(s for s in specs if isinstance(s, StepSum))
    step = _step_sums(step_specs, terms, episodes, *reduce_args)
    log_w_final_b = log_w_bt[:, -1]
    if betting_range is None:
        betting_histogram = jnp.zeros((len(BETTING_VARIABLES), 0), dtype)
    else:
        log_x_vb = betting_variables(
            log_w_bt, reward_bt, return_b, discount_t, betting_range.astype(dtype)
        )
        betting_histogram = _betting_histogram(log_x_vb, episode_mask_b, dtype)
    nonzero_b = episode_mask_b & (log_w_final_b != -jnp.inf)
    return BatchStatistics(
        log_scales=log_scales,
        pivots=pivots,
        sums=sums,
        replicate_sums=replicate_sums,
        step_log_scales=step[0],
        step_sums=step[1],
        replicate_step_log_scales=step[2],
        replicate_step_sums=step[3],
        log_weight_histogram=_log10_histogram(log_w_final_b, nonzero_b, dtype),
        betting_histogram=betting_histogram,
    )
