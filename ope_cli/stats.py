"""Mergeable float64 accumulators of batch statistics, and the final estimates.

``init() -> update(acc, batch) / merge(a, b) -> finalize(acc)``: the same merge
serves batches, devices and processes, which is why streamed, sharded and
multi-process results agree. Every scaled sum is stored with the running maximum
log-weight it is relative to; merging rescales to the larger maximum (log-sum-exp).
"""

from __future__ import annotations

import dataclasses
import math
from statistics import NormalDist

import numpy as np

from ope_cli.config import ESTIMATORS
from ope_cli.estimators import BatchStatistics

_SCALAR_SUMS_TRAJECTORY = ("sum_w", "sum_wg")
_SQUARED_SUMS_TRAJECTORY = ("sum_w2", "sum_w2g", "sum_w2g2")


@dataclasses.dataclass(frozen=True)
class Accumulator:
    """Float64 running statistics of one policy over every batch seen so far.

    Same fields as ``BatchStatistics``; the per-step arrays have length L, the longest
    bucket seen. For t >= L every episode has ended, so its WPDIS denominator is the
    trajectory weight sum (``group_sum_w``) and its numerator 0.
    """

    count: float
    zero_count: float
    log_scale_trajectory: float
    sum_w: float
    sum_w2: float
    sum_wg: float
    sum_w2g: float
    sum_w2g2: float
    group_count: np.ndarray  # [K]
    group_sum_w: np.ndarray  # [K]
    log_scale_step: float
    sum_p: float
    sum_p2: float
    log_scale_t: np.ndarray  # [L]
    group_num_t: np.ndarray  # [K, L]
    group_den_t: np.ndarray  # [K, L]


def from_batch(batch: BatchStatistics) -> Accumulator:
    """An accumulator holding one batch's statistics (device arrays -> float64)."""
    values = {name: np.asarray(value, np.float64) for name, value in batch._asdict().items()}
    return Accumulator(**{
        name: float(value) if value.ndim == 0 else value for name, value in values.items()
    })


def init(num_groups: int) -> Accumulator:
    """The accumulator of no episodes."""
    zeros = np.zeros(num_groups)
    return Accumulator(
        count=0.0, zero_count=0.0, log_scale_trajectory=-math.inf, sum_w=0.0, sum_w2=0.0,
        sum_wg=0.0, sum_w2g=0.0, sum_w2g2=0.0, group_count=zeros, group_sum_w=zeros,
        log_scale_step=-math.inf, sum_p=0.0, sum_p2=0.0, log_scale_t=np.zeros(0),
        group_num_t=np.zeros((num_groups, 0)), group_den_t=np.zeros((num_groups, 0)),
    )


def _rescale(log_scale, new_log_scale):
    """exp(log_scale - new_log_scale), and 1 where both are equal (also both -inf)."""
    with np.errstate(invalid="ignore"):
        return np.where(log_scale == new_log_scale, 1.0, np.exp(log_scale - new_log_scale))


def _extend(acc: Accumulator, length: int) -> Accumulator:
    """The per-step arrays of ``acc`` lengthened to ``length`` with ended-episode values."""
    extra = length - acc.log_scale_t.shape[-1]
    if extra <= 0:
        return acc
    num_groups = acc.group_count.shape[0]
    return dataclasses.replace(
        acc,
        log_scale_t=np.concatenate([acc.log_scale_t, np.full(extra, acc.log_scale_trajectory)]),
        group_num_t=np.concatenate([acc.group_num_t, np.zeros((num_groups, extra))], axis=-1),
        group_den_t=np.concatenate(
            [acc.group_den_t, np.repeat(acc.group_sum_w[:, None], extra, axis=-1)], axis=-1
        ),
    )


def merge(a: Accumulator, b: Accumulator) -> Accumulator:
    """Statistics of the union of the episodes behind ``a`` and ``b``."""
    length = max(a.log_scale_t.shape[-1], b.log_scale_t.shape[-1])
    a, b = _extend(a, length), _extend(b, length)

    scale_trajectory = max(a.log_scale_trajectory, b.log_scale_trajectory)
    fa, fb = _rescale(a.log_scale_trajectory, scale_trajectory), _rescale(b.log_scale_trajectory, scale_trajectory)
    scale_step = max(a.log_scale_step, b.log_scale_step)
    pa, pb = _rescale(a.log_scale_step, scale_step), _rescale(b.log_scale_step, scale_step)
    scale_t = np.maximum(a.log_scale_t, b.log_scale_t)
    ta, tb = _rescale(a.log_scale_t, scale_t), _rescale(b.log_scale_t, scale_t)

    def linear(name: str, x: float, y: float) -> float:
        return getattr(a, name) * x + getattr(b, name) * y

    return Accumulator(
        count=a.count + b.count,
        zero_count=a.zero_count + b.zero_count,
        log_scale_trajectory=scale_trajectory,
        **{name: float(linear(name, fa, fb)) for name in _SCALAR_SUMS_TRAJECTORY},
        **{name: float(linear(name, fa * fa, fb * fb)) for name in _SQUARED_SUMS_TRAJECTORY},
        group_count=a.group_count + b.group_count,
        group_sum_w=a.group_sum_w * fa + b.group_sum_w * fb,
        log_scale_step=scale_step,
        sum_p=float(a.sum_p * pa + b.sum_p * pb),
        sum_p2=float(a.sum_p2 * pa * pa + b.sum_p2 * pb * pb),
        log_scale_t=scale_t,
        group_num_t=a.group_num_t * ta + b.group_num_t * tb,
        group_den_t=a.group_den_t * ta + b.group_den_t * tb,
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
    if value == 0.0:
        return 0.0
    log_magnitude = math.log(abs(value)) + log_scale
    if log_magnitude > 709.7:  # exp overflows float64
        return None
    return _finite(math.copysign(math.exp(log_magnitude), value))


def _sample_variance(total: float, total_sq: float, n: float) -> float:
    """Unbiased variance of n numbers from their sum and sum of squares (clipped at 0)."""
    return max(total_sq - total * total / n, 0.0) / (n - 1)


def _estimate(value: float | None, stderr: float | None, z: float, note: str | None = None) -> Estimate:
    value, stderr = _finite(value), _finite(stderr)
    if value is None or stderr is None:
        return Estimate(value, stderr, None, None, note)
    return Estimate(value, stderr, _finite(value - z * stderr), _finite(value + z * stderr), note)


def _wpdis(num_t: np.ndarray, den_t: np.ndarray, discount_t: np.ndarray) -> float | None:
    if not (den_t > 0).all():
        return None
    return float(np.sum(discount_t * num_t / den_t))


def finalize(
    acc: Accumulator, gamma: float, max_length: int, confidence: float
) -> tuple[dict[str, Estimate], Diagnostics]:
    """The four estimates (normal intervals at ``confidence``) and the diagnostics."""
    n = acc.count
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    estimates: dict[str, Estimate] = {}

    is_value = _scaled(acc.sum_wg / n, acc.log_scale_trajectory)
    is_stderr = (
        _scaled(math.sqrt(_sample_variance(acc.sum_wg, acc.sum_w2g2, n) / n), acc.log_scale_trajectory)
        if n > 1 else None
    )
    estimates["is"] = _estimate(is_value, is_stderr, z, None if is_value is not None else
                                "trajectory weights overflow float64")

    if acc.sum_w > 0:
        wis = acc.sum_wg / acc.sum_w
        residual = acc.sum_w2g2 - 2 * wis * acc.sum_w2g + wis * wis * acc.sum_w2
        wis_stderr = math.sqrt(max(residual, 0.0)) / acc.sum_w if n > 1 else None
        estimates["wis"] = _estimate(wis, wis_stderr, z)
    else:
        estimates["wis"] = Estimate(None, None, None, None, "every trajectory weight is zero")

    pdis_value = _scaled(acc.sum_p / n, acc.log_scale_step)
    pdis_stderr = (
        _scaled(math.sqrt(_sample_variance(acc.sum_p, acc.sum_p2, n) / n), acc.log_scale_step)
        if n > 1 else None
    )
    estimates["pdis"] = _estimate(pdis_value, pdis_stderr, z, None if pdis_value is not None else
                                  "per-decision weights overflow float64")

    estimates["wpdis"] = _finalize_wpdis(acc, gamma, max_length, z)

    ess = acc.sum_w**2 / acc.sum_w2 if acc.sum_w2 > 0 else None
    diagnostics = Diagnostics(
        ess=_finite(ess),
        ess_fraction=_finite(ess / n) if ess is not None else None,
        mean_weight=_scaled(acc.sum_w / n, acc.log_scale_trajectory),
        max_weight=_scaled(1.0, acc.log_scale_trajectory) if acc.sum_w > 0 else 0.0,
        # The largest weight is exp(scale), i.e. 1 after scaling.
        max_weight_share=_finite(1.0 / acc.sum_w) if acc.sum_w > 0 else None,
        zero_weight_fraction=acc.zero_count / n,
    )
    return {name: estimates[name] for name in ESTIMATORS}, diagnostics


def _finalize_wpdis(acc: Accumulator, gamma: float, max_length: int, z: float) -> Estimate:
    """WPDIS and its delete-a-group jackknife standard error over the K id-hash groups."""
    acc = _extend(acc, max_length)
    num_gt, den_gt = acc.group_num_t[:, :max_length], acc.group_den_t[:, :max_length]
    discount_t = gamma ** np.arange(max_length, dtype=np.float64)
    num_t, den_t = num_gt.sum(axis=0), den_gt.sum(axis=0)
    value = _wpdis(num_t, den_t, discount_t)
    if value is None:
        first = int(np.argmax(~(den_t > 0)))
        return Estimate(None, None, None, None, f"every episode has zero weight at step {first}")
    groups = np.flatnonzero(acc.group_count > 0)
    leave_out = [_wpdis(num_t - num_gt[g], den_t - den_gt[g], discount_t) for g in groups]
    if len(groups) < 2 or any(v is None for v in leave_out):
        return _estimate(value, None, z, "too few episode groups for a standard error")
    leave_out = np.asarray(leave_out)
    k = len(groups)
    stderr = math.sqrt((k - 1) / k * np.sum((leave_out - leave_out.mean()) ** 2))
    return _estimate(value, stderr, z)
