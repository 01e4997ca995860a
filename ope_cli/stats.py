"""Mergeable float64 accumulators of batch statistics, and the final estimates.

``init() -> merge(acc, from_batch(batch)) -> finalize(acc)``: the same merge serves
batches, devices and processes, which is why streamed, sharded and multi-process
results agree. Every scaled sum is stored with the running maximum log-weight it is
relative to; merging rescales both sides to the larger maximum (log-sum-exp).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from statistics import NormalDist

import numpy as np

from ope_cli.config import ESTIMATORS
from ope_cli.estimators import (
    BETTING_BIN_WIDTH,
    BETTING_BINS,
    BETTING_LOG_RANGE,
    BETTING_VARIABLES,
    GROUP_SUM_FIELDS,
    HISTOGRAM_BINS,
    HISTOGRAM_LOG10_RANGE,
    BatchStatistics,
)

_FIELD = {name: i for i, name in enumerate(GROUP_SUM_FIELDS)}
# How each column of group_sums scales: by 1 (counts), w, w^2, P or P^2.
_SCALING = {
    "count": "one",
    "zero_count": "one",
    "sum_w": "w",
    "sum_w2": "w2",
    "sum_wg": "w",
    "sum_w2g": "w2",
    "sum_w2g2": "w2",
    "sum_p": "p",
    "sum_p2": "p2",
}


@dataclasses.dataclass(frozen=True)
class Accumulator:
    """Float64 running statistics of one policy over every batch seen so far.

    The per-step arrays have length L, the longest bucket seen. For t >= L every episode
    has ended, so each group's WPDIS terms there equal those at L - 1 with no reward
    (``extend``).
    """

    log_scale_trajectory: float
    log_scale_step: float
    group_sums: np.ndarray  # [K, F] columns GROUP_SUM_FIELDS
    group_log_scale_t: np.ndarray  # [K, L]
    group_num_t: np.ndarray  # [K, L]
    group_den_t: np.ndarray  # [K, L]
    log_weight_histogram: np.ndarray  # [HISTOGRAM_BINS + 2]
    replicate_sums: np.ndarray  # [R, F] bootstrap replicates of the group_sums columns
    replicate_log_scale_t: np.ndarray  # [L]
    replicate_num_t: np.ndarray  # [R, L]
    replicate_den_t: np.ndarray  # [R, L]
    betting_histogram: np.ndarray  # [4, BETTING_BINS + 1] ([4, 0] without betting intervals)

    def total(self, field: str) -> float:
        """A GROUP_SUM_FIELDS column summed over groups."""
        return float(self.group_sums[:, _FIELD[field]].sum())


def from_batch(batch: BatchStatistics) -> Accumulator:
    """One batch's statistics for one policy (device or NumPy arrays) as float64."""
    values = {name: np.asarray(value, np.float64) for name, value in batch._asdict().items()}
    return Accumulator(
        **{name: float(value) if value.ndim == 0 else value for name, value in values.items()}
    )


def init(num_groups: int, num_replicates: int = 0, betting: bool = False) -> Accumulator:
    """The accumulator of no episodes (the identity of ``merge``)."""
    return Accumulator(
        log_scale_trajectory=-math.inf,
        log_scale_step=-math.inf,
        group_sums=np.zeros((num_groups, len(GROUP_SUM_FIELDS))),
        group_log_scale_t=np.zeros((num_groups, 0)),
        group_num_t=np.zeros((num_groups, 0)),
        group_den_t=np.zeros((num_groups, 0)),
        log_weight_histogram=np.zeros(HISTOGRAM_BINS + 2),
        replicate_sums=np.zeros((num_replicates, len(GROUP_SUM_FIELDS))),
        replicate_log_scale_t=np.zeros(0),
        replicate_num_t=np.zeros((num_replicates, 0)),
        replicate_den_t=np.zeros((num_replicates, 0)),
        betting_histogram=np.zeros((len(BETTING_VARIABLES), BETTING_BINS + 1 if betting else 0)),
    )


def _rescale(log_scale, new_log_scale):
    """exp(log_scale - new_log_scale), and 1 where both are equal (also both -inf)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.where(log_scale == new_log_scale, 1.0, np.exp(log_scale - new_log_scale))


def _lengthen(scale_t: np.ndarray, num_rt: np.ndarray, den_rt: np.ndarray, extra: int):
    """Per-step arrays (scale [.., L], sums [rows, L]) lengthened by ``extra`` steps after
    every episode ended: each row keeps its last weights and gets no more reward."""
    rows = num_rt.shape[0]
    if scale_t.shape[-1] == 0:
        last_scale = np.full(scale_t.shape[:-1] + (1,), -math.inf)
        last_den = np.zeros((rows, 1))
    else:
        last_scale, last_den = scale_t[..., -1:], den_rt[:, -1:]
    return (
        np.concatenate([scale_t, np.repeat(last_scale, extra, -1)], -1),
        np.concatenate([num_rt, np.zeros((rows, extra))], -1),
        np.concatenate([den_rt, np.repeat(last_den, extra, -1)], -1),
    )


def extend(acc: Accumulator, length: int) -> Accumulator:
    """The per-step arrays of ``acc`` lengthened to ``length`` with ended-episode values."""
    extra = length - acc.group_log_scale_t.shape[-1]
    if extra <= 0:
        return acc
    group = _lengthen(acc.group_log_scale_t, acc.group_num_t, acc.group_den_t, extra)
    replicate = _lengthen(
        acc.replicate_log_scale_t, acc.replicate_num_t, acc.replicate_den_t, extra
    )
    return dataclasses.replace(
        acc,
        group_log_scale_t=group[0],
        group_num_t=group[1],
        group_den_t=group[2],
        replicate_log_scale_t=replicate[0],
        replicate_num_t=replicate[1],
        replicate_den_t=replicate[2],
    )


def _column_factors(trajectory: float, step: float) -> np.ndarray:
    """[F] factor of each group_sums column for trajectory/step rescaling factors."""
    by_kind = {"one": 1.0, "w": trajectory, "w2": trajectory**2, "p": step, "p2": step**2}
    return np.array([by_kind[_SCALING[name]] for name in GROUP_SUM_FIELDS])


def merge(a: Accumulator, b: Accumulator) -> Accumulator:
    """Statistics of the union of the episodes behind ``a`` and ``b``."""
    length = max(a.group_log_scale_t.shape[-1], b.group_log_scale_t.shape[-1])
    a, b = extend(a, length), extend(b, length)
    trajectory = max(a.log_scale_trajectory, b.log_scale_trajectory)
    step = max(a.log_scale_step, b.log_scale_step)
    factors_a = _column_factors(
        _rescale(a.log_scale_trajectory, trajectory), _rescale(a.log_scale_step, step)
    )
    factors_b = _column_factors(
        _rescale(b.log_scale_trajectory, trajectory), _rescale(b.log_scale_step, step)
    )
    scale_gt = np.maximum(a.group_log_scale_t, b.group_log_scale_t)
    ta, tb = _rescale(a.group_log_scale_t, scale_gt), _rescale(b.group_log_scale_t, scale_gt)
    scale_t = np.maximum(a.replicate_log_scale_t, b.replicate_log_scale_t)
    ra, rb = _rescale(a.replicate_log_scale_t, scale_t), _rescale(b.replicate_log_scale_t, scale_t)
    return Accumulator(
        log_scale_trajectory=trajectory,
        log_scale_step=step,
        group_sums=a.group_sums * factors_a + b.group_sums * factors_b,
        group_log_scale_t=scale_gt,
        group_num_t=a.group_num_t * ta + b.group_num_t * tb,
        group_den_t=a.group_den_t * ta + b.group_den_t * tb,
        log_weight_histogram=a.log_weight_histogram + b.log_weight_histogram,
        replicate_sums=a.replicate_sums * factors_a + b.replicate_sums * factors_b,
        replicate_log_scale_t=scale_t,
        replicate_num_t=a.replicate_num_t * ra + b.replicate_num_t * rb,
        replicate_den_t=a.replicate_den_t * ra + b.replicate_den_t * rb,
        betting_histogram=a.betting_histogram + b.betting_histogram,
    )


# --- final estimates ---------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Estimate:
    """A point estimate with its standard error and confidence interval; None = not finite."""

    value: float | None
    stderr: float | None
    ci_low: float | None
    ci_high: float | None
    note: str | None = None


@dataclasses.dataclass(frozen=True)
class Diagnostics:
    """Trajectory-weight diagnostics of the spec (None where undefined)."""

    ess: float | None
    ess_fraction: float | None
    mean_weight: float | None
    max_weight: float | None
    max_weight_share: float | None
    zero_weight_fraction: float | None


def _finite(x: float | None) -> float | None:
    return float(x) if x is not None and math.isfinite(x) else None


def _scaled(value: float, log_scale: float) -> float | None:
    """value * exp(log_scale) without overflowing on the way; None if the result is not finite."""
    if value == 0.0 or not math.isfinite(value):
        return 0.0 if value == 0.0 else None
    log_magnitude = math.log(abs(value)) + log_scale
    if log_magnitude > 709.7:  # exp overflows float64
        return None
    return _finite(math.copysign(math.exp(log_magnitude), value))


def _scaled_array(values: np.ndarray, log_scale: float) -> np.ndarray:
    """values * exp(log_scale), NaN where that overflows float64 (or values are NaN)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        magnitude = np.log(np.abs(values)) + log_scale
        out = np.sign(values) * np.exp(np.minimum(magnitude, 709.7))
    return np.where(values == 0, 0.0, np.where(magnitude > 709.7, np.nan, out))


def _sum_estimates(
    sums: np.ndarray, log_scale_trajectory: float, log_scale_step: float
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """(value, stderr) of IS, WIS and PDIS from GROUP_SUM_FIELDS sums [..., F] (NaN where
    undefined). Serves the totals and every bootstrap replicate alike.

    IS and PDIS: mean and sample standard error (ddof 1) of the per-episode terms; WIS: the
    delta method, Var ~ sum_i w_i^2 (G_i - WIS)^2 / (sum_i w_i)^2, expanded into sums.
    """
    column = {name: sums[..., i] for name, i in _FIELD.items()}
    n = column["count"]
    out = {}
    # Sums of squares of astronomically large returns overflow to inf: the value stays, its
    # standard error becomes null (not a warning on stderr).
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        for name, first, second, log_scale in (
            ("is", "sum_wg", "sum_w2g2", log_scale_trajectory),
            ("pdis", "sum_p", "sum_p2", log_scale_step),
        ):
            total, total_sq = column[first], column[second]
            variance = np.maximum(total_sq - total * total / n, 0.0) / (n - 1)
            stderr = np.where(n > 1, np.sqrt(variance / n), np.nan)
            out[name] = (_scaled_array(total / n, log_scale), _scaled_array(stderr, log_scale))
        sum_w = column["sum_w"]
        wis = np.where(sum_w > 0, column["sum_wg"] / sum_w, np.nan)
        residual = column["sum_w2g2"] - 2 * wis * column["sum_w2g"] + wis * wis * column["sum_w2"]
        wis_stderr = np.where(
            (n > 1) & (sum_w > 0), np.sqrt(np.maximum(residual, 0.0)) / sum_w, np.nan
        )
    out["wis"] = (wis, wis_stderr)
    return out


def _estimate(
    value: float | None, stderr: float | None, z: float, note: str | None = None
) -> Estimate:
    value, stderr = _finite(value), _finite(stderr)
    if value is None or stderr is None:
        return Estimate(value, stderr, None, None, note)
    return Estimate(value, stderr, _finite(value - z * stderr), _finite(value + z * stderr), note)


UNDEFINED = {
    "is": "the trajectory weights overflow float64",
    "wis": "every trajectory weight is zero",
    "pdis": "the per-decision weights overflow float64",
}
INTERVALS = ("betting", "normal", "percentile", "bootstrap-t")
MIN_VALID_REPLICATES = 0.9  # below this share of defined replicates, no bootstrap interval


def _bootstrap_interval(
    estimate: Estimate,
    replicates: np.ndarray,
    replicate_stderr: np.ndarray | None,
    confidence: float,
) -> Estimate:
    """Replaces a normal interval by a Poisson-bootstrap one: percentile, or studentized
    (bootstrap-t) when replicate standard errors are given."""
    if estimate.value is None or estimate.stderr is None:
        return estimate
    low_q, high_q = (1 - confidence) / 2, (1 + confidence) / 2
    if replicate_stderr is None:
        valid = np.isfinite(replicates)
        if valid.mean() < MIN_VALID_REPLICATES:
            return dataclasses.replace(
                estimate,
                ci_low=None,
                ci_high=None,
                note="too many bootstrap replicates are undefined",
            )
        low, high = np.quantile(replicates[valid], [low_q, high_q])
        return dataclasses.replace(estimate, ci_low=float(low), ci_high=float(high))
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (replicates - estimate.value) / replicate_stderr
    valid = np.isfinite(t)
    if valid.mean() < MIN_VALID_REPLICATES:
        return dataclasses.replace(
            estimate, ci_low=None, ci_high=None, note="too many bootstrap replicates are undefined"
        )
    t_low, t_high = np.quantile(t[valid], [low_q, high_q])
    return dataclasses.replace(
        estimate,
        ci_low=_finite(estimate.value - t_high * estimate.stderr),
        ci_high=_finite(estimate.value - t_low * estimate.stderr),
    )


# Betting intervals: the gambler stakes these fractions of the largest bet that cannot go
# bankrupt, and the wealth averages over them (an equal-weight mixture of 20 fixed bets).
BETTING_FRACTIONS = 0.95 * 2.0 ** (-np.arange(20) / 2)


@functools.cache
def _betting_values() -> np.ndarray:
    """[BETTING_BINS + 1] the value each histogram bin stands for: its lower edge (0 below)."""
    low, _ = BETTING_LOG_RANGE
    return np.concatenate([[0.0], np.exp(low + BETTING_BIN_WIDTH * np.arange(BETTING_BINS))])


def betting_lower_bound(counts: np.ndarray, alpha: float) -> float | None:
    """Lower confidence bound, valid at level 1 - alpha for every sample size, on the mean
    mu in [0, 1] of a non-negative variable X, from the histogram of log X (``counts``
    [BETTING_BINS + 1], see estimators.BETTING_LOG_RANGE). None without data.

    To test mu = m, a gambler bets a fraction c of the largest stake 1/m that cannot go
    bankrupt, so each episode multiplies its wealth by 1 - c + c X_i / m. If mu = m that is a
    non-negative martingale started at 1 for every c, and so is the average over
    BETTING_FRACTIONS; by Markov's inequality it reaches 1/alpha with probability <= alpha.
    Every m whose wealth reaches 1/alpha is rejected. The wealth falls as m grows, so the
    rejected m form an interval [0, m*) that bisection finds; m* is the bound. Reading each
    bin as its lower edge understates X, hence the wealth, so the bound stays valid.
    """
    bins = np.flatnonzero(counts)
    if bins.size == 0:
        return None
    n_k, x_k = counts[bins], _betting_values()[bins]
    threshold = math.log(1.0 / alpha)
    fractions = BETTING_FRACTIONS[:, None]

    def rejected(m: float) -> bool:
        log_wealth_c = np.log1p(fractions * (x_k / m - 1.0)) @ n_k
        top = log_wealth_c.max()
        return top + math.log(np.mean(np.exp(log_wealth_c - top))) >= threshold

    if rejected(1.0):
        return 1.0
    low, high = 0.0, 1.0
    for _ in range(50):
        middle = 0.5 * (low + high)
        low, high = (middle, high) if rejected(middle) else (low, middle)
    return low


def _betting_intervals(
    estimates: dict[str, Estimate],
    histogram: np.ndarray,
    betting_range: tuple[float, float, float],
    confidence: float,
) -> dict[str, Estimate]:
    """Replaces the intervals by betting ones, with 1 - confidence split over both sides:
    trajectory weights for is and wis, per-decision weights for pdis and wpdis (see
    estimators.betting_variables for the variables and their means)."""
    low, high, horizon = betting_range
    alpha = (1.0 - confidence) / 2
    intervals = {}
    for kind, row in (("trajectory", 0), ("decision", 2)):
        v_low = betting_lower_bound(histogram[row], alpha)
        v_high = betting_lower_bound(histogram[row + 1], alpha)
        if v_low is None or v_high is None:
            intervals[kind] = (None, None, None)
        elif v_low > 1.0 - v_high:
            intervals[kind] = (
                None,
                None,
                "the lower betting bound exceeds the upper one: rewards "
                "outside the range, or the behavior policy misses actions of the "
                "evaluated one",
            )
        else:
            intervals[kind] = (
                low * horizon + (high - low) * horizon * v_low,
                low * horizon + (high - low) * horizon * (1.0 - v_high),
                None,
            )
    out = {}
    for name, estimate in estimates.items():
        ci_low, ci_high, note = intervals["trajectory" if name in ("is", "wis") else "decision"]
        out[name] = dataclasses.replace(
            estimate, ci_low=_finite(ci_low), ci_high=_finite(ci_high), note=estimate.note or note
        )
    return out


def finalize(
    acc: Accumulator,
    gamma: float,
    max_length: int,
    confidence: float,
    interval: str = "normal",
    betting_range: tuple[float, float, float] | None = None,
) -> tuple[dict[str, Estimate], Diagnostics]:
    """The four estimates with intervals at ``confidence`` (method ``interval``, one of
    INTERVALS), and the diagnostics. ``betting`` needs ``betting_range`` = (a, b, H) of
    estimators.betting_variables and an accumulator that holds their histogram."""
    totals = acc.group_sums.sum(axis=0)
    n = totals[_FIELD["count"]]
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    acc = extend(acc, max_length)
    estimates: dict[str, Estimate] = {}
    for name, (value, stderr) in _sum_estimates(
        totals, acc.log_scale_trajectory, acc.log_scale_step
    ).items():
        value, stderr = _finite(float(value)), _finite(float(stderr))
        estimates[name] = _estimate(
            value, stderr, z, None if value is not None else UNDEFINED[name]
        )
    estimates["wpdis"] = _finalize_wpdis(acc, gamma, max_length, z)

    if interval == "betting":
        if betting_range is None or acc.betting_histogram.shape[-1] == 0:
            raise ValueError("betting intervals need a reward range and the betting histogram")
        estimates = _betting_intervals(estimates, acc.betting_histogram, betting_range, confidence)
    elif interval != "normal":
        replicates = _sum_estimates(
            acc.replicate_sums, acc.log_scale_trajectory, acc.log_scale_step
        )
        replicates["wpdis"] = (_wpdis_replicates(acc, gamma, max_length), None)
        for name, (values, stderrs) in replicates.items():
            studentized = interval == "bootstrap-t" and stderrs is not None
            estimates[name] = _bootstrap_interval(
                estimates[name], values, stderrs if studentized else None, confidence
            )

    sum_w = totals[_FIELD["sum_w"]]
    ess = sum_w**2 / totals[_FIELD["sum_w2"]] if sum_w > 0 else None
    diagnostics = Diagnostics(
        ess=_finite(ess),
        ess_fraction=_finite(ess / n) if ess is not None else None,
        mean_weight=_scaled(sum_w / n, acc.log_scale_trajectory),
        # The largest weight is exp(scale), which is 1 after scaling.
        max_weight=_scaled(1.0, acc.log_scale_trajectory) if sum_w > 0 else 0.0,
        max_weight_share=_finite(1.0 / sum_w) if sum_w > 0 else None,
        zero_weight_fraction=float(totals[_FIELD["zero_count"]] / n),
    )
    return {name: estimates[name] for name in ESTIMATORS}, diagnostics


def _wpdis_replicates(acc: Accumulator, gamma: float, max_length: int) -> np.ndarray:
    """[R] WPDIS of each bootstrap replicate (NaN where some step has no weight)."""
    num_rt = acc.replicate_num_t[:, :max_length]
    den_rt = acc.replicate_den_t[:, :max_length]
    discount_t = gamma ** np.arange(max_length, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        values = np.sum(discount_t * num_rt / den_rt, axis=-1)
    return np.where((den_rt > 0).all(axis=-1), values, np.nan)


def _combine_groups(
    log_scale_gt: np.ndarray, values_gt: np.ndarray, log_scale_t: np.ndarray
) -> np.ndarray:
    """[T] sum over groups of values_gt * exp(log_scale_gt - log_scale_t) (log-sum-exp style)."""
    return np.sum(values_gt * _rescale(log_scale_gt, log_scale_t[None, :]), axis=0)


def _wpdis(log_scale_gt, num_gt, den_gt, discount_t) -> tuple[float | None, int]:
    """(WPDIS of the given groups or None, the first step with no weight left)."""
    log_scale_t = np.max(log_scale_gt, axis=0)
    den_t = _combine_groups(log_scale_gt, den_gt, log_scale_t)
    if not (den_t > 0).all():
        return None, int(np.argmax(~(den_t > 0)))
    num_t = _combine_groups(log_scale_gt, num_gt, log_scale_t)
    return float(np.sum(discount_t * num_t / den_t)), -1


def _finalize_wpdis(acc: Accumulator, gamma: float, max_length: int, z: float) -> Estimate:
    """WPDIS = sum_t gamma^t sum_i W_it r_it / sum_i W_it, with a delete-a-group jackknife
    standard error over the non-empty id-hash groups."""
    acc = extend(acc, max_length)
    scale_gt, num_gt, den_gt = (
        x[:, :max_length] for x in (acc.group_log_scale_t, acc.group_num_t, acc.group_den_t)
    )
    discount_t = gamma ** np.arange(max_length, dtype=np.float64)
    value, empty_step = _wpdis(scale_gt, num_gt, den_gt, discount_t)
    if value is None:
        return Estimate(
            None, None, None, None, f"every episode has zero weight at step {empty_step}"
        )
    groups = np.flatnonzero(acc.group_sums[:, _FIELD["count"]] > 0)
    if groups.size < 2:
        return _estimate(value, None, z, "too few episode groups for a standard error")
    leave_out = []
    for g in groups:
        others = groups[groups != g]
        leave_out.append(_wpdis(scale_gt[others], num_gt[others], den_gt[others], discount_t)[0])
    if any(v is None for v in leave_out):
        return _estimate(
            value, None, z, "a group holds all the weight at some step; no standard error"
        )
    leave_out_g = np.asarray(leave_out)
    k = groups.size
    with np.errstate(over="ignore", invalid="ignore"):
        stderr = math.sqrt((k - 1) / k * np.sum((leave_out_g - leave_out_g.mean()) ** 2))
    return _estimate(value, stderr, z)


# --- shapes of the data behind the estimates (for reports and plots) -----------------------


@dataclasses.dataclass(frozen=True)
class Profile:
    """Per-step and per-weight views of one policy's statistics.

    Attributes:
      wpdis_partial_t: [L] WPDIS summed up to each step t (its last entry is WPDIS).
      mean_weight_t: [L] mean cumulative weight (1/n) sum_i W_{i,t}; ~1 when all is well.
      histogram_edges: [HISTOGRAM_BINS + 1] log10-weight bin edges.
      histogram_counts: [HISTOGRAM_BINS + 2] episodes below, in each bin, and above.
      zero_weights: episodes with weight exactly 0 (not in the histogram).
    """

    wpdis_partial_t: np.ndarray
    mean_weight_t: np.ndarray
    histogram_edges: np.ndarray
    histogram_counts: np.ndarray
    zero_weights: int


def profile(acc: Accumulator, gamma: float, max_length: int) -> Profile:
    """The per-step WPDIS path and weight mass, and the log-weight histogram."""
    acc = extend(acc, max_length)
    scale_gt, num_gt, den_gt = (
        x[:, :max_length] for x in (acc.group_log_scale_t, acc.group_num_t, acc.group_den_t)
    )
    log_scale_t = np.max(scale_gt, axis=0)
    num_t = _combine_groups(scale_gt, num_gt, log_scale_t)
    den_t = _combine_groups(scale_gt, den_gt, log_scale_t)
    discount_t = gamma ** np.arange(max_length, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        term_t = np.where(den_t > 0, discount_t * num_t / den_t, np.nan)
        mean_weight_t = (
            den_t
            * np.exp(np.where(np.isfinite(log_scale_t), log_scale_t, -np.inf))
            / acc.total("count")
        )
    low, high = HISTOGRAM_LOG10_RANGE
    return Profile(
        wpdis_partial_t=np.cumsum(term_t),
        mean_weight_t=mean_weight_t,
        histogram_edges=np.linspace(low, high, HISTOGRAM_BINS + 1),
        histogram_counts=acc.log_weight_histogram.copy(),
        zero_weights=int(acc.total("zero_count")),
    )
