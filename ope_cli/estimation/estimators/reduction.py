"""The one generic reduction of a batch walked in fixed time windows: per-episode carries
and per-step values -> per-group sums.

Shapes: B episodes, C steps (a window), K resampling groups, R bootstrap replicates. Pure JAX
(no jit, no devices here). ``advance_window`` walks the next C steps of every episode of a
batch: the shared per-episode quantities (log weights, the return so far, the betting
variables' running sums) and each estimator's ``advance`` are vmapped over the episodes,
and every declared per-step sum is reduced per group and step. ``finish_batch`` turns the
carries into per-episode values (each estimator's ``finish``, the diagnostics' weight
histogram, the betting histogram) and reduces every declared sum relative to the batch's
largest log scale of its kind (``base.Scale``). Its shapes depend on B alone.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from ope_cli.estimation.estimators.base import (
    BETTING_BIN_WIDTH,
    BETTING_BINS,
    BETTING_LOG_RANGE,
    BETTING_VARIABLES,
    HISTOGRAM_BINS,
    HISTOGRAM_LOG10_RANGE,
    STEP,
    BatchStatistics,
    Scale,
    StepSum,
    Sum,
    Trajectory,
    Window,
    available,
    core_step_values,
    core_values,
    get,
    relative,
    rescaled,
    safe_log_scale,
    sum_spec,
    sums_of,
)


class StepStatistics(NamedTuple):
    """The per-step sums of one window [.., C] for one policy; a pytree keyed by name."""

    # [K, C], or [1, C] for a one-lane window's own group (``Groups.one_row``)
    step_log_scales: dict[str, jax.Array]  # per-step scale -> [K, C] max over a group
    step_sums: dict[str, jax.Array]  # StepSum -> [K, C] (lag 1: column c is step c - 1)
    replicate_step_log_scales: dict[str, jax.Array]  # per-step scale -> [C] max over the batch
    replicate_step_sums: dict[str, jax.Array]  # StepSum -> [R, C]


class ScalarStatistics(NamedTuple):
    """The per-episode sums of a batch for one policy, once its last window is walked."""

    log_scales: dict[str, jax.Array]  # scalar scale -> [] max over episodes of its log scale
    pivots: dict[str, jax.Array]  # scalar scale with a pivot -> [] the batch's pivot
    sums: dict[str, jax.Array]  # Sum -> [K] (or [K, m + 1] with moments)
    replicate_sums: dict[str, jax.Array]  # Sum -> [R] (or [R, m + 1]) bootstrap-weighted
    log_weight_histogram: jax.Array  # [HISTOGRAM_BINS + 2] episodes per log10-weight bin
    betting_histogram: jax.Array  # [4, BETTING_BINS + 1] episodes per log bin ([4, 0] if off)


class EpisodeCarry(NamedTuple):
    """What the kernel carries for each episode from one window to the next ([] leaves per
    episode; [B] for a batch): the shared Trajectory, each estimator's own carry by name,
    and the betting variables' per-decision sums (lower, upper; relative to the largest
    W_t so far), or () without betting intervals."""

    trajectory: Trajectory
    estimators: dict[str, Any]
    betting: tuple


def init_carry(zero, estimators: tuple[str, ...], betting: bool) -> EpisodeCarry:
    """The carry before the first window, made from ``zero`` (a [] or [B] array of the
    kernel's dtype: NumPy on the host, or traced)."""
    trajectory = Trajectory(
        log_w=zero,
        log_peak=zero - math.inf,
        return_=zero,
        log_discounted_peak=zero - math.inf,
        steps=zero,
    )
    own = {name: get(name).init(zero) for name in estimators}
    return EpisodeCarry(trajectory, own, (zero, zero) if betting else ())


def log_ratios(
    log_target_t: jax.Array, log_behavior_t: jax.Array, step_mask_t: jax.Array
) -> jax.Array:
    """log(pi_e / pi_b) per step, shape [..., T]; 0 on padded steps (absorbing), through
    ``where`` so that whatever the policy computed on padding (even NaN) never leaks in."""
    return jnp.where(step_mask_t, log_target_t - log_behavior_t, 0.0)


def log_weights(
    log_target_t: jax.Array, log_behavior_t: jax.Array, step_mask_t: jax.Array
) -> jax.Array:
    """Cumulative log importance weights log W_t = sum_{k<=t} log(pi_e/pi_b), shape [..., T]
    (padded steps add 0)."""
    return jnp.cumsum(log_ratios(log_target_t, log_behavior_t, step_mask_t), axis=-1)


def one_hot(index_b: jax.Array, size: int, dtype) -> jax.Array:
    """[B, size] 1 at each row's index: a batch's sums per group (once per batch, in the
    finish) become matrix products, which XLA compiles far faster than scatters."""
    return (index_b[:, None] == jnp.arange(size)[None, :]).astype(dtype)


def _log10_histogram(log_w_b: jax.Array, include_b: jax.Array, dtype) -> jax.Array:
    """[HISTOGRAM_BINS + 2] counts of log10(w) per bin (first and last: out of range)."""
    low, high = HISTOGRAM_LOG10_RANGE
    width = (high - low) / HISTOGRAM_BINS
    log10_w = jnp.where(include_b, log_w_b / jnp.log(10.0), low)
    bins = jnp.clip(jnp.floor((log10_w - low) / width).astype(jnp.int32) + 1, 0, HISTOGRAM_BINS + 1)
    # a scatter of B counts, not a [B, bins] one-hot product: the finish of P stacked
    # policies would write [P, B, bins] (exact counts either way)
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


def log_discount(steps: jax.Array, log_gamma: jax.Array) -> jax.Array:
    """log gamma^t as t log(gamma) (0 at t = 0, also for gamma = 0): finite where gamma^t
    underflows, long before gamma^t W_t does."""
    return jnp.where(steps == 0, 0.0, steps * log_gamma)


def betting_inputs(
    betting_range: tuple[float, float, float] | None, horizon: int | None, gamma: float
) -> tuple[float, ...] | None:
    """The kernel's betting constants (a, b, H, h, log gamma, 1 - gamma) from a plan's (a,
    b, H), its horizon h in steps (None: infinite) and the discount; None without betting.
    log gamma and 1 - gamma are taken in float64: a float32 gamma of 0.9999995 is 5% off
    in 1 - gamma."""
    if betting_range is None:
        return None
    horizon = math.inf if horizon is None else float(horizon)
    log_gamma = math.log(gamma) if gamma > 0 else -math.inf
    return (*betting_range, horizon, log_gamma, 1.0 - float(gamma))


def betting_advance(sums: tuple, window: Window, betting_range: jax.Array) -> tuple:
    """The per-decision betting sums of ONE episode after ``window``:
    (sum_t gamma^t W_t (r_t - a), sum_t gamma^t W_t (b - r_t)) over the steps walked,
    padding included (there r = 0 and W stays the final weight), relative to the largest
    gamma^t W_t so far (the size of the terms: relative to the largest W_t, those of a
    long episode underflow)."""
    low, high = betting_range[0], betting_range[1]
    before, after = window.before.log_discounted_peak, window.after.log_discounted_peak
    w_t = relative(window.log_w_t + window.log_discount_t, after)
    return (
        rescaled(sums[0], before, after) + jnp.sum(w_t * (window.reward_t - low)),
        rescaled(sums[1], before, after) + jnp.sum(w_t * (high - window.reward_t)),
    )


def _weight_of_the_rest(trajectory: Trajectory, betting_range: jax.Array) -> jax.Array:
    """W_{T-1} sum_{t=T}^{h-1} gamma^t relative to the largest gamma^t W_t, T the steps walked:
    the final weight over the horizon's steps not walked (negative where the padding walked
    past h), in closed form, (gamma^T - gamma^h) / (1 - gamma) or h - T, each power taken
    with the weight in log space (H minus the walked discounts cancels catastrophically
    once gamma^T is below float precision, and W_{T-1} can be far above the scale)."""
    horizon, log_gamma, one_minus_gamma = betting_range[3], betting_range[4], betting_range[5]
    walked = trajectory.steps
    scale, log_w = trajectory.log_discounted_peak, trajectory.log_w
    undiscounted = relative(log_w, scale) * (horizon - walked)
    head = relative(log_w + log_discount(walked, log_gamma), scale)
    tail = relative(log_w + log_discount(horizon, log_gamma), scale)
    return jnp.where(one_minus_gamma == 0.0, undiscounted, (head - tail) / one_minus_gamma)


def betting_variables(sums: tuple, trajectory: Trajectory, betting_range: jax.Array) -> jax.Array:
    """[4] log of the BETTING_VARIABLES of ONE episode (-inf for a zero).

    With rewards in [a, b] (a <= 0 <= b, as the absorbing reward 0 must be), a discounted
    horizon H = sum_{t < h} gamma^t and R = (b - a) H, each is >= 0 and, because the
    weights have mean 1 under the behavior policy, has mean v = (V - a H) / R or 1 - v:

      trajectory_low  = W_{T-1} (G - a H) / R
      trajectory_high = W_{T-1} (b H - G) / R
      decision_low    = [sum_t gamma^t W_t (r_t - a) + W_{T-1} (-a) (H - sum_t gamma^t)] / R
      decision_high   = [sum_t gamma^t W_t (b - r_t) + W_{T-1} b (H - sum_t gamma^t)] / R

    The per-step sums (``betting_advance``) run over the walked padding too, where r = 0 and
    W stays W_{T-1}; the last term tops them up to the horizon, so padding cancels out.
    The per-decision ones are kept relative to the largest gamma^t W_t.
    ``betting_range`` [6] = (a, b, H, h, log gamma, 1 - gamma) (``betting_inputs``).
    """
    low, high, horizon = betting_range[0], betting_range[1], betting_range[2]
    span = (high - low) * horizon
    rest = _weight_of_the_rest(trajectory, betting_range)
    decision_low = sums[0] - low * rest
    decision_high = sums[1] + high * rest

    def log_of(value, log_scale):
        # Rounding can leave -1e-16 where the exact value is 0; never take the log of it.
        return jnp.log(jnp.maximum(value, 0.0) / span) + log_scale

    g = trajectory.return_
    return jnp.stack(
        [
            log_of(g - low * horizon, trajectory.log_w),
            log_of(high * horizon - g, trajectory.log_w),
            log_of(decision_low, trajectory.log_discounted_peak),
            log_of(decision_high, trajectory.log_discounted_peak),
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


class WeightedWindow(NamedTuple):
    """The next C steps of a batch of B episodes as one policy's statistics need them.

    Attributes:
      log_ratio_bt: [B, C] log(pi_e / pi_b) (``log_ratios``: 0 on padding).
      reward_bt: [B, C] rewards, any value on padding.
      step_mask_bt: [B, C] True on real steps.
      episode_mask_b: [B] True on real episodes.
      group_b: [B] int resampling group in [0, K).
      counts_br: [B, R] bootstrap counts of each episode in each replicate (R may be 0).
      start: [] int, the step of the episodes that column 0 holds.
      fields: further per-step inputs [B, C, ...] for estimators (``Window.fields``).
    """

    log_ratio_bt: jax.Array
    reward_bt: jax.Array
    step_mask_bt: jax.Array
    episode_mask_b: jax.Array
    group_b: jax.Array
    counts_br: jax.Array
    start: jax.Array | int = 0
    fields: dict[str, jax.Array] = {}  # noqa: RUF012 - a NamedTuple default, never mutated


def _advance_one(carry: EpisodeCarry, steps: tuple, estimators, betting_range):
    """(carry, {StepSum name: [C]}, Window) of ONE episode after its next C steps
    ``steps`` = (log_ratio_t, reward_t, (discount_t, log_discount_t), step_mask_t, first_t,
    fields)."""
    log_ratio_t, reward_t, (discount_t, log_discount_t), step_mask_t, first_t, fields = steps
    before = carry.trajectory
    log_w_t = before.log_w + jnp.cumsum(log_ratio_t)
    after = Trajectory(
        log_w=log_w_t[-1],
        log_peak=jnp.maximum(before.log_peak, jnp.max(log_w_t)),
        return_=before.return_ + reward_t @ discount_t,
        log_discounted_peak=jnp.maximum(
            before.log_discounted_peak, jnp.max(log_w_t + log_discount_t)
        ),
        steps=before.steps + log_ratio_t.shape[-1],
    )
    log_w_prev_t = jnp.concatenate([before.log_w[None], log_w_t[:-1]])
    window = Window(
        log_w_t,
        log_w_prev_t,
        reward_t,
        discount_t,
        log_discount_t,
        step_mask_t,
        first_t,
        fields,
        before,
        after,
    )
    values = core_step_values(window)
    own = {}
    for name in estimators:
        own[name], step_values = get(name).advance(carry.estimators[name], window)
        values.update(step_values)
    betting = () if betting_range is None else betting_advance(carry.betting, window, betting_range)
    return EpisodeCarry(after, own, betting), values, window


class Groups(NamedTuple):
    """The resampling groups of a window's B lanes: ``index_b`` [B] int in [0, K) (past
    it: no group), ``count`` K, and ``own_row``: a one-lane window's per-group per-step
    sums are its lane's group's row alone, [1, C] rather than [K, C] (the kernel's host
    code places it: ``kernel.window_groups``); else every group's row."""

    index_b: jax.Array
    count: int
    own_row: bool = False

    @property
    def one_row(self) -> bool:
        return self.own_row and self.index_b.shape[0] == 1


class _StepWeights(NamedTuple):
    """A per-step scale's weights in a window: each (group, step)'s largest log scale
    [K, C] (one row: ``Groups.one_row``) and every cell's weight relative to it [B, C];
    the batch's largest per step [C] and every cell's weight relative to that [B, C] (the
    bootstrap replicates')."""

    group_scale_kt: jax.Array
    w_bt: jax.Array
    replicate_scale_t: jax.Array
    w_rep_bt: jax.Array


def _step_weights(log_scale_bt, groups: Groups) -> _StepWeights:
    """The _StepWeights of per-cell log scales ``log_scale_bt`` [B, C] (-inf: no weight)."""
    if groups.one_row:  # the lane's own group's max: its own scale, the same bits
        group_scale_kt = log_scale_bt
        w_bt = jnp.exp(log_scale_bt - safe_log_scale(group_scale_kt))
    else:
        # per window, so scatters (cost per cell) rather than one-hot products (per cell
        # and group): they compile slower but run the many windows of many policies faster
        group_scale_kt = jax.ops.segment_max(
            log_scale_bt, groups.index_b, num_segments=groups.count
        )
        w_bt = jnp.exp(log_scale_bt - safe_log_scale(group_scale_kt)[groups.index_b])
    replicate_scale_t = jnp.max(log_scale_bt, axis=0)
    w_rep_bt = jnp.exp(log_scale_bt - safe_log_scale(replicate_scale_t))
    return _StepWeights(group_scale_kt, w_bt, replicate_scale_t, w_rep_bt)


def _one_step_earlier(weights: _StepWeights, log_w_before_b, groups: Groups):
    """The _StepWeights of log W_{t-1} from those of log W_t (``weights``): column c is
    column c - 1 (the same maxima over the same numbers, hence the same bits), and column
    0 is the weight before the window (``log_w_before_b`` [B]), scaled on its own."""
    first = _step_weights(log_w_before_b[:, None], groups)

    def shifted(first_column, full):
        return jnp.concatenate([first_column, full[..., :-1]], axis=-1)

    return _StepWeights(*(shifted(a, b) for a, b in zip(first, weights, strict=True)))


def _step_sums(specs, values_bt, windows, real_b, groups: Groups, counts_rb, dtype):
    """StepStatistics of ``specs``: per-step sums [K, C] (one row: ``Groups.one_row``)
    relative to a per-(group, step) max log scale, and bootstrap replicates [R, C] relative
    to a per-step max over the batch (nothing is subtracted from those later). The
    per-group scales keep ratios of per-step
    sums defined when late weights drifted hundreds of e-folds from early ones, and leaving
    one group out (the jackknife) never subtracts a dominant group from the rest. A lag-1
    sum is scaled by W_{t-1}, the weight of the step it belongs to: the weights of W_t one
    step later, where those are computed (the per-step weight's own sums)."""
    out = StepStatistics({}, {}, {}, {})
    kinds = {(spec.scale.name, spec.lag): spec.scale for spec in specs}
    scaled = {}
    for (scale_name, lag), scale in sorted(kinds.items(), key=lambda kind: kind[0][1]):
        if lag and kinds.get((scale_name, 0)) == STEP:  # W_{t-1}: W_t's, one step later
            before_b = jnp.where(real_b, windows.before.log_w, -jnp.inf)
            weights = _one_step_earlier(scaled[scale_name], before_b, groups)
        else:
            log_scale_bt = windows.log_w_prev_t if lag else jax.vmap(scale.log_scale)(windows)
            log_scale_bt = jnp.where(real_b[:, None], log_scale_bt, -jnp.inf)
            weights = _step_weights(log_scale_bt, groups)
        if not lag:  # a lag-1 sum's scale is its step's: the one of the lag-0 sums there
            scaled[scale_name] = weights
            out.step_log_scales[scale_name] = weights.group_scale_kt
            out.replicate_step_log_scales[scale_name] = weights.replicate_scale_t
        own = [spec for spec in specs if (spec.scale.name, spec.lag) == (scale_name, lag)]
        values = [values_bt[spec.name].astype(dtype) for spec in own]
        lane_ubt = jnp.where(
            real_b[:, None, None], jnp.stack([v * weights.w_bt for v in values], 1), 0.0
        )
        group_ukt = (
            lane_ubt  # the lane's own group's sum: itself
            if groups.one_row
            else jax.ops.segment_sum(lane_ubt, groups.index_b, num_segments=groups.count)
        )
        replicate_urt = jnp.einsum(
            "rb,ubt->urt", counts_rb, jnp.stack([v * weights.w_rep_bt for v in values])
        )
        for u, spec in enumerate(own):
            out.step_sums[spec.name] = group_ukt[:, u]
            out.replicate_step_sums[spec.name] = replicate_urt[u]
    return out


def _counts_rb(counts_br: jax.Array, episode_mask_b: jax.Array, dtype) -> jax.Array:
    """[R, B] bootstrap counts as weights, 0 for filler rows."""
    return (counts_br.astype(dtype) * episode_mask_b.astype(dtype)[:, None]).T


def advance_window(
    carry: EpisodeCarry,
    window: WeightedWindow,
    gamma: jax.Array | float,
    num_groups: int,
    estimators: tuple[str, ...],
    betting_range: jax.Array | None = None,
    own_row: bool = False,
) -> tuple[EpisodeCarry, StepStatistics]:
    """Walks the next C steps of a batch for one policy: (carry, StepStatistics).

    Args:
      carry: EpisodeCarry of [B] leaves (``init_carry`` before the first window).
      window: the window's log ratios, rewards, masks, groups and bootstrap counts.
      gamma: discount factor (a traced float64 scalar, so one compilation serves every
        gamma).
      num_groups: K.
      estimators: the registered estimators whose sums to compute.
      betting_range: [3] (a, b, H) of ``betting_variables``, or None.
      own_row: a one-lane window's per-group sums are its group's row alone, [1, C]
        (``Groups``): a very long episode's windows then make and send 1/K of the cells.
    """
    log_ratio_bt, reward_bt, step_mask_bt, episode_mask_b, group_b, counts_br, start, fields = (
        window
    )
    dtype = log_ratio_bt.dtype
    real_bt = step_mask_bt & episode_mask_b[:, None]
    log_ratio_bt = jnp.where(real_bt, log_ratio_bt, 0.0)
    reward_bt = jnp.where(real_bt, reward_bt, 0.0)
    step_t = jnp.asarray(start) + jnp.arange(log_ratio_bt.shape[-1])
    # in float64 whatever the precision, then rounded: gamma^t of a float32 gamma (0.9999995
    # as 0.99999952) was 3e-3 off at t = 300,000 in every float32 estimate but wpdis
    log_gamma = jnp.log(jnp.asarray(gamma, jnp.float64))
    log_discount_64 = log_discount(step_t.astype(jnp.float64), log_gamma)
    discount_t = jnp.exp(log_discount_64).astype(dtype)
    log_discount_t = log_discount_64.astype(dtype)
    first_bt = real_bt & (step_t == 0)[None, :]
    if betting_range is not None:
        betting_range = betting_range.astype(dtype)
    steps = (log_ratio_bt, reward_bt, (discount_t, log_discount_t), step_mask_bt, first_bt, fields)
    advance = jax.vmap(
        lambda c, s: _advance_one(c, s, estimators, betting_range),
        in_axes=(0, (0, 0, None, 0, 0, 0)),
    )
    carry, values_bt, windows = advance(carry, steps)
    specs = tuple(s for s in sums_of(estimators) if isinstance(s, StepSum))
    counts_rb = _counts_rb(counts_br, episode_mask_b, dtype)
    groups = Groups(group_b, num_groups, own_row)
    statistics = _step_sums(specs, values_bt, windows, episode_mask_b, groups, counts_rb, dtype)
    return carry, statistics


def _magnitude_b(scale: Scale, values_b: dict) -> jax.Array:
    """[B] |t| of a scale's ``magnitude`` term where it is finite, else 1 (a term that
    overflowed stays as it is: its sums are NaN or inf, and the estimate says why)."""
    term_b = values_b[scale.magnitude]
    return jnp.where(jnp.isfinite(term_b), jnp.abs(term_b), 1.0)


def episode_log_scales(scale: Scale, trajectory: Trajectory, values_b: dict) -> jax.Array:
    """[B] each episode's own log scale of the scalar kind ``scale`` (with a magnitude,
    plus log|t|: -inf for a zero term)."""
    own_b = values_b[scale.own] if scale.own else jax.vmap(scale.log_scale)(trajectory)
    if scale.magnitude is None:
        return own_b
    return own_b + jnp.log(_magnitude_b(scale, values_b))


def relative_to_magnitude(value_b, scale: Scale | None, values_b: dict, power: int):
    """[B] ``value_b`` relative to its kind's magnitude t: the term itself (power 1) is
    sign(t), its square (power 2) 1, exactly, even where t^2 underflowed (an episode whose
    weight peaked e^400 above its term lost its square: a standard error of 0); 0 where
    t = 0; as it is where t is not finite (its sums then say it overflowed)."""
    if scale is None or scale.magnitude is None:
        return value_b
    term_b = values_b[scale.magnitude]
    return jnp.where(jnp.isfinite(term_b), jnp.sign(term_b) ** power, value_b)


def _batch_scales(specs, trajectory: Trajectory, real_b, values_b: dict):
    """({scale: [B] each episode's own log scale}, {scale: [] largest}, {scale: [] pivot},
    {scale: [B] pivot deviation}) of the scalar scales of ``specs``; the batch's pivot is
    that of the episode with the largest scale."""
    scales = {spec.scale.name: spec.scale for spec in specs if spec.scale is not None}
    own_b, log_scales, pivots, deviations_b = {}, {}, {}, {}
    for name, scale in scales.items():
        own_b[name] = jnp.where(real_b, episode_log_scales(scale, trajectory, values_b), -jnp.inf)
        log_scales[name] = jnp.max(own_b[name])
        if scale.pivot is not None:
            if isinstance(scale.pivot, str):  # a finish() value
                pivot_b = jnp.where(real_b, values_b[scale.pivot], 0.0)
            else:
                pivot_b = jnp.where(real_b, jax.vmap(scale.pivot)(trajectory), 0.0)
            pivots[name] = pivot_b[jnp.argmax(own_b[name])]
            deviations_b[name] = pivot_b - pivots[name]
    return own_b, log_scales, pivots, deviations_b


# An episode term that overflowed (|t| < e^(709.8 + log T): T steps of at most float64's
# largest) and whose weight lies this far below the batch's scale is below float64's
# resolution of the largest term (e^-37) even for episodes of e^50 steps: it counts as 0
NEGLIGIBLE_LOG_FACTOR = -(709.8 + 50.0 + 37.0)


def _scalar_sums(specs, values_b, scales, real_b, group_b, counts_rb, num_groups, dtype):
    """(sums [K, ...], replicate_sums [R, ...]) of the scalar ``specs``: each episode's value
    rescaled from its own log scale to the batch's, with moments times (pivot - batch
    pivot)^k, stacked into [B, F] so that two matrix products (groups, replicates) reduce
    every column."""
    own_b, log_scales, _, deviations_b = scales
    columns, layout = [], []
    for spec in specs:
        value_b = values_b[spec.name].astype(dtype)
        if spec.scale is not None:
            value_b = relative_to_magnitude(value_b, spec.scale, values_b, spec.power)
            name = spec.scale.name
            log_factor_b = own_b[name] - safe_log_scale(log_scales[name])
            factor_b = jnp.exp(spec.power * log_factor_b.astype(dtype))
            # a term that overflowed stays as it is (its sums then say so), also where its
            # factor underflowed (e^-709 is subnormal, which XLA on CPU flushes to zero),
            # unless its weight is so small that it cannot count (0 * inf: weight 0)
            scaled_b = jnp.where(factor_b > 0, value_b * factor_b, 0.0)
            kept_b = jnp.isfinite(value_b) | (log_factor_b < NEGLIGIBLE_LOG_FACTOR)
            value_b = jnp.where(kept_b, scaled_b, value_b)
        if spec.moments is None:
            layout.append((spec.name, 1))
            columns.append(value_b)
        else:
            layout.append((spec.name, spec.moments + 1))
            deviation_b = deviations_b[spec.scale.name].astype(dtype)
            columns.extend(value_b * deviation_b**k for k in range(spec.moments + 1))
    per_episode_bf = jnp.where(real_b[:, None], jnp.stack(columns, axis=-1), 0.0)
    group_kf = one_hot(group_b, num_groups, dtype).T @ per_episode_bf
    replicate_rf = counts_rb @ per_episode_bf
    sums, replicate_sums, start = {}, {}, 0
    for (name, width), spec in zip(layout, specs, strict=True):
        part = slice(start, start + width)
        one = spec.moments is None
        sums[name] = group_kf[:, start] if one else group_kf[:, part]
        replicate_sums[name] = replicate_rf[:, start] if one else replicate_rf[:, part]
        start += width
    return sums, replicate_sums


def _finish_one(carry: EpisodeCarry, estimators) -> dict:
    """{Sum name: []} of ONE episode whose last window was walked."""
    values = core_values(carry.trajectory)
    for name in estimators:
        values.update(get(name).finish(carry.estimators[name], carry.trajectory))
    return values


def episode_terms(carry: EpisodeCarry, estimators: tuple[str, ...]) -> dict[str, jax.Array]:
    """Each episode's term of every estimator that is a mean of terms (``Estimator.term``)
    and its own log scale: {name: [B] value relative to exp(power * scale), name + "/scale":
    [B] the scale (0 when the term is not scaled)}, and {"return": [B]} the discounted
    return G. What paired differences between policies are made of (``paired``)."""
    trajectory = carry.trajectory
    values_b = jax.vmap(lambda c: _finish_one(c, estimators))(carry)
    terms = {"return": trajectory.return_}
    for name in estimators:
        term = get(name).term
        if term is None:
            continue
        scale = sum_spec(term).scale
        terms[name] = relative_to_magnitude(values_b[term], scale, values_b, 1)
        terms[name + "/scale"] = (
            jnp.zeros_like(trajectory.return_)
            if scale is None
            else episode_log_scales(scale, trajectory, values_b)
        )
    return terms


def finish_batch(
    carry: EpisodeCarry,
    episode_mask_b: jax.Array,
    group_b: jax.Array,
    counts_br: jax.Array,
    num_groups: int,
    estimators: tuple[str, ...],
    betting_range: jax.Array | None = None,
) -> ScalarStatistics:
    """ScalarStatistics of a batch whose last window was walked ([B] carries); the shapes
    depend on B alone."""
    trajectory = carry.trajectory
    dtype = trajectory.return_.dtype
    values_b = jax.vmap(lambda c: _finish_one(c, estimators))(carry)
    specs = tuple(s for s in sums_of(estimators) if isinstance(s, Sum))
    scales = _batch_scales(specs, trajectory, episode_mask_b, values_b)
    # the batch's sums over episodes in float64 whatever the kernel's precision: float32
    # sums of squares around a mean 1e3 above their spread lost it (IS's standard error
    # 3% low, at 1e4 0.0), where float32 terms alone keep it
    widest = jax.dtypes.canonicalize_dtype(jnp.float64)
    counts_rb = _counts_rb(counts_br, episode_mask_b, widest)
    sums, replicate_sums = _scalar_sums(
        specs, values_b, scales, episode_mask_b, group_b, counts_rb, num_groups, widest
    )
    if betting_range is None:
        betting_histogram = jnp.zeros((len(BETTING_VARIABLES), 0), dtype)
    else:
        log_x_bv = jax.vmap(lambda b, t: betting_variables(b, t, betting_range.astype(dtype)))(
            carry.betting, trajectory
        )
        betting_histogram = _betting_histogram(log_x_bv.T, episode_mask_b, dtype)
    nonzero_b = episode_mask_b & (trajectory.log_w != -jnp.inf)
    return ScalarStatistics(
        log_scales=scales[1],
        pivots=scales[2],
        sums=sums,
        replicate_sums=replicate_sums,
        log_weight_histogram=_log10_histogram(trajectory.log_w, nonzero_b, dtype),
        betting_histogram=betting_histogram,
    )


def lagged(statistics: StepStatistics) -> StepStatistics:
    """The per-step sums of a window that is the whole of its batch, with every lag-1 sum
    moved to the step it belongs to (its last step gets 0: after it every episode ended)."""

    def shifted(name: str, x: jax.Array) -> jax.Array:
        if not sum_spec(name).lag:
            return x
        return jnp.concatenate([x[..., 1:], jnp.zeros_like(x[..., :1])], axis=-1)

    return statistics._replace(
        step_sums={k: shifted(k, v) for k, v in statistics.step_sums.items()},
        replicate_step_sums={k: shifted(k, v) for k, v in statistics.replicate_step_sums.items()},
    )


def combine(step: StepStatistics, scalar: ScalarStatistics) -> BatchStatistics:
    """BatchStatistics of a batch from its (assembled) per-step and scalar parts."""
    return BatchStatistics(**step._asdict(), **scalar._asdict())


# A whole padded batch as one policy's statistics need it: one window of its T steps.
WeightedBatch = WeightedWindow


def batch_statistics(
    batch: WeightedBatch,
    gamma: jax.Array | float,
    num_groups: int,
    betting_range: jax.Array | None = None,
    estimators: tuple[str, ...] | None = None,
) -> BatchStatistics:
    """Statistics of a whole padded batch for one policy, walked as one window (the kernel
    walks the same functions window by window).

    Args:
      batch: the batch's log ratios, rewards, masks, groups and bootstrap counts ([B, T]).
      gamma: discount factor.
      num_groups: K.
      betting_range: [3] (a, b, H) of ``betting_variables`` to histogram them, or None.
      estimators: the registered estimators whose sums to compute (None: every registered
        one that ``batch.fields`` allow).
    """
    estimators = available(tuple(batch.fields)) if estimators is None else estimators
    dtype = batch.log_ratio_bt.dtype
    zero = jnp.zeros(batch.episode_mask_b.shape, dtype)
    carry = init_carry(zero, estimators, betting_range is not None)
    window = batch._replace(start=0)
    carry, step = advance_window(carry, window, gamma, num_groups, estimators, betting_range)
    scalar = finish_batch(
        carry,
        batch.episode_mask_b,
        batch.group_b,
        batch.counts_br,
        num_groups,
        estimators,
        betting_range,
    )
    return combine(lagged(step), scalar)
