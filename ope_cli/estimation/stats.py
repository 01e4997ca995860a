"""Mergeable float64 accumulators of batch statistics, and the final estimates.

``init() -> merge(acc, from_batch(batch)) -> finalize(acc)``: the same merge serves
batches, devices and processes, which is why streamed, sharded and multi-process
results agree. Every scaled sum is stored with the running maximum log scale of its kind
(``estimators.base.Scale``); merging rescales both sides to the larger maximum
(log-sum-exp) and shifts centred moments to the pivot of the heavier side. Nothing here
knows a particular estimator: ``finalize`` hands the merged sums to each registered one.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from math import comb
from statistics import NormalDist
from typing import NamedTuple

import numpy as np

from ope_cli.estimation.estimators import available, get, names
from ope_cli.estimation.estimators.base import (
    BETTING_BINS,
    BETTING_VARIABLES,
    GROUP_STEP_FIELDS,
    HISTOGRAM_BINS,
    HISTOGRAM_LOG10_RANGE,
    STEP_BLOCK_CELLS,
    BatchStatistics,
    Context,
    Grouped,
    Sum,
    Sums,
    group_total,
    sum_spec,
    sums_of,
)
from ope_cli.estimation.estimators.logspace import finite, rescale, scaled, to_larger
from ope_cli.estimation.intervals import INTERVALS, betting_intervals, bootstrap_interval

__all__ = ["INTERVALS", "Accumulator", "Diagnostics", "Estimate", "Profile"]


# The merged statistics of one policy (float64 host arrays) are the kernel's own record.
Accumulator = BatchStatistics

# Per-group per-step cells (K x T) that finalisation lays out as one array, to combine and
# leave out groups in a few vectorised steps; beyond, it combines the rows one by one in
# memory of one row (a very long episode).
DENSE_CELLS = 1 << 22


def _rows(x) -> list[np.ndarray]:
    """Per-group rows [..., T_g] (float64) of per-step sums: a list as it is, or an
    array [..., K, T] split into K rows of T."""
    if isinstance(x, list | tuple):
        return [np.asarray(row, np.float64) for row in x]
    x = np.asarray(x, np.float64)
    return [x[..., k, :] for k in range(x.shape[-2])]


def from_batch(batch) -> Accumulator:
    """One batch's statistics for one policy (a BatchStatistics of device or NumPy arrays)
    as float64, the per-group per-step sums as rows; for P stacked policies (every leaf
    with a leading [P] axis), a stacked accumulator (``unstack``)."""

    def convert(field: str, value):
        if not isinstance(value, dict):
            return np.asarray(value, np.float64)
        if field in GROUP_STEP_FIELDS:
            return {name: _rows(x) for name, x in value.items()}
        arrays = {name: np.asarray(x, np.float64) for name, x in value.items()}
        if field in ("log_scales", "pivots"):
            return {name: x if x.ndim else float(x) for name, x in arrays.items()}
        return arrays

    return Accumulator(**{field: convert(field, v) for field, v in batch._asdict().items()})


def unstack(acc: Accumulator) -> list[Accumulator]:
    """The P accumulators of a stacked one (leaves with a leading [P] axis: ``from_batch``
    of P stacked policies' statistics, merged as one)."""
    policies = acc.log_weight_histogram.shape[0]

    def row(p: int, field: str, value):
        if not isinstance(value, dict):
            return value[p]
        if field in ("log_scales", "pivots"):
            return {name: float(x[p]) for name, x in value.items()}
        if field in GROUP_STEP_FIELDS:
            return {name: [r[p] for r in rows] for name, rows in value.items()}
        return {name: x[p] for name, x in value.items()}

    return [
        Accumulator(**{field: row(p, field, v) for field, v in acc._asdict().items()})
        for p in range(policies)
    ]


def init(
    num_groups: int,
    num_replicates: int = 0,
    betting: bool = False,
    estimators: tuple[str, ...] | None = None,
) -> Accumulator:
    """The accumulator of no episodes (the identity of ``merge``) with the sums of
    ``estimators`` (None: every registered one that needs no per-step inputs)."""
    specs = sums_of(available() if estimators is None else estimators)
    scalar = [s for s in specs if isinstance(s, Sum)]
    steps = [s for s in specs if not isinstance(s, Sum)]

    def zeros(rows: int, spec: Sum) -> np.ndarray:
        return np.zeros((rows,) if spec.moments is None else (rows, spec.moments + 1))

    scales = {s.scale.name: s.scale for s in scalar if s.scale is not None}
    step_scales = {s.scale.name for s in steps}
    return Accumulator(
        log_scales={name: -math.inf for name in scales},
        pivots={name: 0.0 for name, scale in scales.items() if scale.pivot is not None},
        sums={s.name: zeros(num_groups, s) for s in scalar},
        replicate_sums={s.name: zeros(num_replicates, s) for s in scalar},
        step_log_scales={name: _empty_rows(num_groups) for name in step_scales},
        step_sums={s.name: _empty_rows(num_groups) for s in steps},
        replicate_step_log_scales={name: np.zeros(0) for name in step_scales},
        replicate_step_sums={s.name: np.zeros((num_replicates, 0)) for s in steps},
        log_weight_histogram=np.zeros(HISTOGRAM_BINS + 2),
        betting_histogram=np.zeros((len(BETTING_VARIABLES), BETTING_BINS + 1 if betting else 0)),
    )


def _empty_rows(num_groups: int) -> list[np.ndarray]:
    return [np.zeros(0) for _ in range(num_groups)]


def _lengthen_scale(scale_t: np.ndarray, extra: int) -> np.ndarray:
    """[..., L + extra]: every episode has ended, so the weights stay at the last step's."""
    last = scale_t[..., -1:] if scale_t.shape[-1] else np.full(scale_t.shape[:-1] + (1,), -np.inf)
    return np.concatenate([scale_t, np.repeat(last, extra, -1)], -1)


def _ended(name: str, sum_rt: np.ndarray, extra: int) -> np.ndarray:
    """[..., rows, extra]: the steps after ``sum_rt``'s last, by the StepSum's
    ``after_end`` (hold the last step, or zeros)."""
    rows = sum_rt.shape[:-1]
    if sum_rt.shape[-1] == 0 or sum_spec(name).after_end == "zero":
        return np.zeros((*rows, extra))
    return np.repeat(sum_rt[..., -1:], extra, -1)


def _lengthen_sum(name: str, sum_rt: np.ndarray, extra: int) -> np.ndarray:
    """[..., rows, L + extra] by the StepSum's ``after_end``: hold the last step, or zeros."""
    return np.concatenate([sum_rt, _ended(name, sum_rt, extra)], -1)


def _steps(name: str, sum_rt: np.ndarray, start: int, stop: int) -> np.ndarray:
    """Steps ``start:stop`` of ``sum_rt`` lengthened as ``_lengthen_sum`` does."""
    known = sum_rt[..., start:stop]
    missing = stop - max(start, sum_rt.shape[-1])
    return known if missing <= 0 else np.concatenate([known, _ended(name, sum_rt, missing)], -1)


def extend(acc: Accumulator, length: int, rows=None) -> Accumulator:
    """The per-step arrays of ``acc`` lengthened to ``length`` with ended-episode values,
    and each group's rows to ``rows`` ([K]; None: ``length`` too, K x ``length`` cells)."""
    return _extend_groups(extend_replicates(acc, length), length if rows is None else rows)


def row_lengths(acc: Accumulator) -> np.ndarray:
    """[K] the length of each group's per-step rows."""
    scales = next(iter(acc.step_log_scales.values()), [])
    return np.array([row.shape[-1] for row in scales], np.int64)


def _longer_row(lengthen, row: np.ndarray, length: int) -> np.ndarray:
    return lengthen(row, length - row.shape[-1]) if row.shape[-1] < length else row


def _extend_groups(acc: Accumulator, lengths) -> Accumulator:
    """The per-group rows of ``acc`` lengthened to ``lengths`` (an int, or [K] one per
    group) where they are shorter."""

    def longer(lengthen, rows: list) -> list:
        wanted = np.broadcast_to(lengths, (len(rows),))
        return [_longer_row(lengthen, row, int(n)) for row, n in zip(rows, wanted, strict=True)]

    return acc._replace(
        step_log_scales={k: longer(_lengthen_scale, v) for k, v in acc.step_log_scales.items()},
        step_sums={
            k: longer(functools.partial(_lengthen_sum, k), v) for k, v in acc.step_sums.items()
        },
    )


def _replicate_length(acc: Accumulator) -> int:
    return max((x.shape[-1] for x in acc.replicate_step_log_scales.values()), default=0)


def extend_replicates(acc: Accumulator, length: int) -> Accumulator:
    """``extend`` of the replicates' per-step arrays only (each group's rows as they are)."""
    extra = length - _replicate_length(acc)
    if extra <= 0:
        return acc
    return acc._replace(
        replicate_step_log_scales={
            k: _lengthen_scale(v, extra) for k, v in acc.replicate_step_log_scales.items()
        },
        replicate_step_sums={
            k: _lengthen_sum(k, v, extra) for k, v in acc.replicate_step_sums.items()
        },
    )


def _shift_moments(moments: np.ndarray, delta: float) -> np.ndarray:
    """[..., m + 1] sums of v (x - c)^k re-centred on c' = c - delta: sums of v (x - c')^k
    = sum_j C(k, j) delta^(k - j) sum v (x - c)^j. ``delta``: a float, or [P] for P stacked
    policies' moments [P, ..., m + 1]."""
    if np.all(delta == 0.0):
        return moments
    # astronomically large returns overflow to inf, not an error
    delta = np.reshape(np.asarray(delta, np.float64), np.shape(delta) + (1,) * (moments.ndim - 1))
    out = np.zeros_like(moments)
    with np.errstate(over="ignore", invalid="ignore"):
        for k in range(moments.shape[-1]):
            for j in range(k + 1):
                out[..., k] += comb(k, j) * delta[..., 0] ** (k - j) * moments[..., j]
    return np.where(delta == 0.0, moments, out)  # an unshifted side stays exact


def _merge_scalar(a: Accumulator, b: Accumulator):
    """(log_scales, pivots, sums, replicate_sums) of the union: log-sum-exp per scale, and
    centred moments re-centred on the pivot of the side with the larger scale."""
    log_scales, factors, pivots, deltas = {}, {}, {}, {}
    for name in {**a.log_scales, **b.log_scales}:
        la, lb = a.log_scales.get(name, -math.inf), b.log_scales.get(name, -math.inf)
        larger, *factors[name] = to_larger(la, lb)
        log_scales[name] = _scalar_like(larger)
        if name in a.pivots or name in b.pivots:
            ca, cb = a.pivots.get(name, 0.0), b.pivots.get(name, 0.0)
            # The heavier side keeps its pivot (ties: the smaller, so merge commutes); a
            # side without weight has nothing to shift.
            pivot = np.where(la > lb, ca, np.where(lb > la, cb, np.minimum(ca, cb)))
            pivots[name] = _scalar_like(pivot)
            deltas[name] = (
                np.where(la > -math.inf, ca - pivot, 0.0),
                np.where(lb > -math.inf, cb - pivot, 0.0),
            )

    def merged(x: dict, y: dict) -> dict:
        out = {}
        for name in {**x, **y}:
            spec = sum_spec(name)
            xa = x.get(name, np.zeros_like(y.get(name)))
            xb = y.get(name, np.zeros_like(xa))
            if spec.scale is None:
                out[name] = xa + xb
                continue
            fa, fb = factors[spec.scale.name]
            if spec.power == 2:
                fa, fb = fa * fa, fb * fb
            if spec.moments is not None:
                da, db = deltas[spec.scale.name]
                xa, xb = _shift_moments(xa, da), _shift_moments(xb, db)
            with np.errstate(invalid="ignore", over="ignore"):  # inf sums: NaN, noted later
                out[name] = xa * _per_row(fa, xa) + xb * _per_row(fb, xb)
        return out

    return log_scales, pivots, merged(a.sums, b.sums), merged(a.replicate_sums, b.replicate_sums)


def _scalar_like(x: np.ndarray) -> float | np.ndarray:
    """A 0-d result as a float (one policy's accumulator); [P] stays an array (stacked)."""
    return float(x) if np.ndim(x) == 0 else x


def _per_row(factor, x: np.ndarray):
    """A per-policy factor ([] or [P]) shaped to broadcast over ``x`` ([P, ...] when
    stacked)."""
    return np.reshape(factor, np.shape(factor) + (1,) * (x.ndim - np.ndim(factor)))


def _both_sides(a: dict, b: dict, name: str, empty: float) -> tuple[np.ndarray, np.ndarray]:
    """``a[name]`` and ``b[name]``, a side without it filled with ``empty`` (the other's
    shape): what no episode contributes."""
    if name not in a:
        return np.full_like(b[name], empty), b[name]
    if name not in b:
        return a[name], np.full_like(a[name], empty)
    return a[name], b[name]


def _merge_steps(scales_a: dict, sums_a: dict, scales_b: dict, sums_b: dict):
    """(scales, sums) of per-step sums, log-sum-exp per (row, step). A side shorter than
    the other is lengthened by its ended-episode values (as ``extend`` does), a block of
    steps at a time: merging a short batch into a very long episode's [R, T] bootstrap
    sums makes one new [R, T] array per sum and temporaries of STEP_BLOCK_CELLS."""
    length = max((x.shape[-1] for d in (scales_a, scales_b) for x in d.values()), default=0)
    scales, factors = {}, {}
    for name in {**scales_a, **scales_b}:
        sa, sb = _both_sides(scales_a, scales_b, name, -np.inf)
        sa, sb = (_longer_row(_lengthen_scale, x, length) for x in (sa, sb))
        scales[name], *factors[name] = to_larger(sa, sb)
    sums = {}
    for name in {**sums_a, **sums_b}:
        fa, fb = factors[sum_spec(name).scale.name]
        sums[name] = _merged_sum(name, sums_a.get(name), sums_b.get(name), fa, fb)
    return scales, sums


def _merged_sum(name: str, xa, xb, fa: np.ndarray, fb: np.ndarray) -> np.ndarray:
    """xa * fa + xb * fb over ``fa``'s steps, each side lengthened by ``_steps`` (a missing
    side is 0: what no episode contributes), in blocks of steps."""
    present = xa if xa is not None else xb
    rows, length = present.shape[:-1], fa.shape[-1]
    if fa.ndim < present.ndim:  # per-step scales [..., L] of replicate sums [..., R, L]
        fa, fb = fa[..., None, :], fb[..., None, :]

    def block(start: int, stop: int) -> np.ndarray:
        part_a, part_b = (0.0 if x is None else _steps(name, x, start, stop) for x in (xa, xb))
        return part_a * fa[..., start:stop] + part_b * fb[..., start:stop]

    per_block = max(1, STEP_BLOCK_CELLS // max(1, math.prod(rows)))
    if length <= per_block:
        return block(0, length)
    out = np.empty((*rows, length), np.result_type(present, fa))
    for start in range(0, length, per_block):
        out[..., start : start + per_block] = block(start, min(start + per_block, length))
    return out


def _group_row(acc: Accumulator, group: int) -> tuple[dict, dict, int]:
    """(scales, sums, length) of one group's per-step rows."""
    scales = {k: v[group] for k, v in acc.step_log_scales.items()}
    sums = {k: v[group] for k, v in acc.step_sums.items()}
    length = max((x.shape[-1] for x in (*scales.values(), *sums.values())), default=0)
    return scales, sums, length


def _one_length(a: Accumulator, b: Accumulator) -> bool:
    """Whether every per-group per-step row of ``a`` and ``b`` has one shape, with steps:
    then the rows merge group by group as one stacked array would, element for element."""
    rows = [
        row
        for acc in (a, b)
        for field in (acc.step_log_scales, acc.step_sums)
        for group_rows in field.values()
        for row in group_rows
    ]
    return bool(rows) and rows[0].shape[-1] > 0 and all(r.shape == rows[0].shape for r in rows)


def _stacked_rows(acc: Accumulator) -> tuple[dict, dict]:
    """(scales, sums) of one side for ``_merge_steps``: its per-group rows stacked [K, ..., L]."""
    scales = {k: np.stack(rows) for k, rows in acc.step_log_scales.items()}
    return scales, {k: np.stack(rows) for k, rows in acc.step_sums.items()}


def _merge_group_steps(a: Accumulator, b: Accumulator) -> tuple[dict, dict]:
    """(scales, sums) of the per-group per-step rows of ``a`` and ``b``, group by group:
    each pair lengthened to the longer (log-sum-exp). A group with no step on one side
    keeps the other side's rows as they are (what log-sum-exp gives them): merging a short
    batch into a very long episode's sums costs the short batch's rows."""
    same_names = set(a.step_log_scales) == set(b.step_log_scales) and set(a.step_sums) == set(
        b.step_sums
    )
    if same_names and _one_length(a, b):  # every row alike: one merge of [K, ..., L] arrays
        merged = _merge_steps(*_stacked_rows(a), *_stacked_rows(b))
        return tuple({k: list(stacked) for k, stacked in part.items()} for part in merged)
    scales: dict[str, list] = {k: [] for k in {**a.step_log_scales, **b.step_log_scales}}
    sums: dict[str, list] = {k: [] for k in {**a.step_sums, **b.step_sums}}
    for group in range(a.sums["count"].shape[-1]):
        scales_a, sums_a, length_a = _group_row(a, group)
        scales_b, sums_b, length_b = _group_row(b, group)
        if same_names and min(length_a, length_b) == 0:
            merged = (scales_b, sums_b) if length_a == 0 else (scales_a, sums_a)
        else:  # the shorter side lengthened by its ended-episode values, as they merge
            merged = _merge_steps(scales_a, sums_a, scales_b, sums_b)
        for out, rows in zip((scales, sums), merged, strict=True):
            for k, row in rows.items():
                out[k].append(row)
    return scales, sums


def _longer_rows(scales: dict, sums: dict, length: int) -> tuple[dict, dict]:
    """One group's rows lengthened to ``length`` where they are shorter."""
    return (
        {k: _longer_row(_lengthen_scale, v, length) for k, v in scales.items()},
        {k: _longer_row(functools.partial(_lengthen_sum, k), v, length) for k, v in sums.items()},
    )


def _empty(acc: Accumulator) -> bool:
    """Whether ``acc`` is ``init``'s: no episode, no step."""
    return acc.length == 0 and not np.any(acc.sums["count"])


def merge(a: Accumulator, b: Accumulator) -> Accumulator:
    """Statistics of the union of the episodes behind ``a`` and ``b``."""
    if _empty(a) and set(a.sums) == set(b.sums):  # the identity: nothing to rescale
        return b
    if _empty(b) and set(a.sums) == set(b.sums):
        return a
    step = _merge_group_steps(a, b)
    log_scales, pivots, sums, replicate_sums = _merge_scalar(a, b)
    replicate_step = _merge_steps(
        a.replicate_step_log_scales,
        a.replicate_step_sums,
        b.replicate_step_log_scales,
        b.replicate_step_sums,
    )
    return Accumulator(
        log_scales=log_scales,
        pivots=pivots,
        sums=sums,
        replicate_sums=replicate_sums,
        step_log_scales=step[0],
        step_sums=step[1],
        replicate_step_log_scales=replicate_step[0],
        replicate_step_sums=replicate_step[1],
        log_weight_histogram=a.log_weight_histogram + b.log_weight_histogram,
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


def _estimate(
    value: float | None, stderr: float | None, z: float, note: str | None = None
) -> Estimate:
    value, stderr = finite(value), finite(stderr)
    if value is None:  # an undefined estimate has no spread either (overflow said 0.0)
        stderr = None
    if value is None or stderr is None:
        return Estimate(value, stderr, None, None, note)
    return Estimate(value, stderr, finite(value - z * stderr), finite(value + z * stderr), note)


def restricted(acc: Accumulator, estimators: tuple[str, ...]) -> Accumulator:
    """``acc`` with only the sums ``estimators`` read (and the core ones): what resampling
    one estimator needs, without combining every other per-step sum again."""
    keep = {spec.name for spec in sums_of(estimators)}

    def own(sums: dict) -> dict:
        return {name: value for name, value in sums.items() if name in keep}

    return acc._replace(
        sums=own(acc.sums),
        replicate_sums=own(acc.replicate_sums),
        step_sums=own(acc.step_sums),
        replicate_step_sums=own(acc.replicate_step_sums),
    )


def grouped_sums(acc: Accumulator, length: int) -> Grouped:
    """The merged sums (extended to ``length`` steps) as estimators read them: laid out as
    [K, length] arrays when that is at most DENSE_CELLS cells, else combined row by row
    (``_row_by_row``)."""
    if not _fits_dense(acc, length):
        return _row_by_row(acc, length)
    acc = dense_groups(acc, length)
    every_factors = {k: _rescaled_groups(v[:, :length]) for k, v in acc.step_log_scales.items()}

    def select(groups: np.ndarray) -> Sums:
        step_scales = {k: v[groups, :length] for k, v in acc.step_log_scales.items()}
        combined = {k: np.max(v, axis=0) for k, v in step_scales.items()}
        factors = {
            k: _selected_factors(every_factors[k], step_scales[k], groups, combined[k])
            for k in step_scales
        }
        step_sums = {}
        for name, sum_kt in acc.step_sums.items():
            scale = sum_spec(name).scale.name
            with np.errstate(over="ignore", invalid="ignore"):  # beyond float64: noted later
                step_sums[name] = np.sum(sum_kt[groups, :length] * factors[scale], axis=0)
        return Sums(
            {k: group_total(v[groups]) for k, v in acc.sums.items()},
            acc.log_scales,
            acc.pivots,
            step_sums,
            combined,
        )

    every = np.arange(acc.sums["count"].shape[0])
    groups = np.flatnonzero(acc.sums["count"] > 0)
    return Grouped(select(every), groups, select, lambda: leave_one_out_sums(acc, length)[1])


def _fits_dense(acc: Accumulator, length: int) -> bool:
    """Whether the K groups' rows of ``length`` steps fit DENSE_CELLS laid out as one array."""
    return len(acc.sums["count"]) * length <= DENSE_CELLS


def dense_groups(acc: Accumulator, length: int) -> Accumulator:
    """``acc`` with its per-group rows lengthened to ``length`` and stacked: [..., K, length]
    arrays (the layout ``grouped_sums`` and ``leave_one_out_sums`` index)."""
    scales = list(acc.step_log_scales.values())
    if scales and all(isinstance(v, np.ndarray) and v.shape[-1] >= length for v in scales):
        return acc  # laid out already
    acc = acc._replace(
        step_log_scales={k: _rows(v) for k, v in acc.step_log_scales.items()},
        step_sums={k: _rows(v) for k, v in acc.step_sums.items()},
    )
    acc = _extend_groups(acc, length)

    def stacked(rows: list) -> np.ndarray:
        return np.stack([row[..., :length] for row in rows], axis=-2)

    return acc._replace(
        step_log_scales={k: stacked(v) for k, v in acc.step_log_scales.items()},
        step_sums={k: stacked(v) for k, v in acc.step_sums.items()},
    )


def _row_by_row(acc: Accumulator, length: int) -> Grouped:
    """``grouped_sums`` in the memory of DENSE_CELLS and a few rows of ``length``, for a
    very long episode: a selection's short rows (at most DENSE_CELLS / K steps) are
    combined as one [G, head] array, whose totals are lengthened as an ended episode's
    (past every short row, each is constant, hence so are their totals), and each long
    row is merged into them (log-sum-exp); the jackknife selects its leave-one-outs one
    by one."""
    lengths = row_lengths(acc)
    head = max(1, DENSE_CELLS // len(lengths))
    long = lengths > head

    def select(groups: np.ndarray) -> Sums:
        short = [int(g) for g in groups if 0 < lengths[g] and not long[g]]
        scales = {k: np.full(0, -np.inf) for k in acc.step_log_scales}
        sums = {k: np.zeros(0) for k in acc.step_sums}
        if short:
            rows = max(int(lengths[g]) for g in short)
            part = dense_groups(_rows_of(acc, short), rows)
            scales = {k: np.max(v, axis=0) for k, v in part.step_log_scales.items()}
            for name, sum_gt in part.step_sums.items():
                scale = sum_spec(name).scale.name
                factor_gt = rescale(part.step_log_scales[scale], scales[scale][None, :])
                sums[name] = np.sum(sum_gt * factor_gt, axis=0)
        scales, sums = _longer_rows(scales, sums, length)
        for g in (int(g) for g in groups if long[g]):
            rows = _group_row(acc, g)[:2]  # may run past ``length``, or end before it
            cut = ({k: v[..., :length] for k, v in part.items()} for part in rows)
            scales, sums = _merge_steps(scales, sums, *cut)
        return Sums(
            {k: group_total(v[groups]) for k, v in acc.sums.items()},
            acc.log_scales,
            acc.pivots,
            {k: v[:length] for k, v in sums.items()},
            {k: v[:length] for k, v in scales.items()},
        )

    every = np.arange(acc.sums["count"].shape[0])
    return Grouped(select(every), np.flatnonzero(acc.sums["count"] > 0), select, None)


def _rows_of(acc: Accumulator, groups: list[int]) -> Accumulator:
    """``acc``'s per-group per-step rows of ``groups`` only (its other fields as they are)."""
    return acc._replace(
        step_log_scales={k: [v[g] for g in groups] for k, v in acc.step_log_scales.items()},
        step_sums={k: [v[g] for g in groups] for k, v in acc.step_sums.items()},
    )


def _rescaled_groups(log_scale_kt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(max over groups [T], each group's factor to it [K, T]) of per-step log scales."""
    combined_t = np.max(log_scale_kt, axis=0)
    return combined_t, rescale(log_scale_kt, combined_t[None, :])


def _selected_factors(every, log_scale_gt, groups, combined_t) -> np.ndarray:
    """[G, T] factors of the ``groups`` rows to their own max ``combined_t``
    (log-sum-exp rescaling): the factors to every group's max where that max is
    the same (leaving one group out changes it at few steps), computed anew elsewhere."""
    every_t, factor_kt = every
    factor_gt = factor_kt[groups]
    changed = ~(combined_t == every_t)
    if np.any(changed):
        factor_gt[:, changed] = rescale(log_scale_gt[:, changed], combined_t[None, changed])
    return factor_gt


class _LeaveOneOutScales(NamedTuple):
    """Per-step log scales [K, T] of the groups, as leaving one group out changes them: the
    max only changes at the steps where g alone holds it, to the second largest there."""

    to_every_kt: np.ndarray  # factors of each group to the all-group max
    to_second_kt: np.ndarray  # factors to the second largest (inf for the holder itself)
    others_kt: np.ndarray  # [K, T] bool: not the step's sole holder of the max
    left_out_gt: np.ndarray  # [G, T] bool: group g alone holds the max at step t
    scales_gt: np.ndarray  # [G, T] the leave-out max log scales


def _leave_one_out_scales(scale_kt: np.ndarray, groups: np.ndarray) -> _LeaveOneOutScales:
    """The leave-one-out scales of per-step log scales ``scale_kt`` for the ``groups`` [G]."""
    every_t = np.max(scale_kt, axis=0)
    top_kt = scale_kt == every_t[None, :]
    holder_t = np.where(top_kt.sum(axis=0) == 1, np.argmax(scale_kt, axis=0), -1)
    second_t = np.max(np.where(top_kt, -np.inf, scale_kt), axis=0)
    left_out_gt = groups[:, None] == holder_t[None, :]
    return _LeaveOneOutScales(
        rescale(scale_kt, every_t[None, :]),
        rescale(scale_kt, second_t[None, :]),
        np.arange(scale_kt.shape[0])[:, None] != holder_t[None, :],
        left_out_gt,
        np.where(left_out_gt, second_t[None, :], every_t[None, :]),
    )


def leave_one_out_sums(acc: Accumulator, length: int) -> tuple[np.ndarray, Sums]:
    """(the non-empty groups [G], Sums with a leading [G] axis: every episode but those of
    group g), for estimators that evaluate sums with leading axes (``replicates``), all
    groups at once. Per step, the other groups are combined relative to their own largest
    scale (log-sum-exp), never by subtracting a group: relative to the all-group max,
    except at the steps where g alone holds it, where they are every group but that one,
    relative to the second largest."""
    acc = dense_groups(acc, length)
    groups = np.flatnonzero(acc.sums["count"] > 0)
    others_gk = groups[:, None] != np.arange(acc.sums["count"].shape[0])[None, :]
    weights_gk = others_gk.astype(np.float64)
    with np.errstate(invalid="ignore", over="ignore"):  # inf sums (overflow): NaN, noted later
        sums = {k: np.tensordot(weights_gk, v, axes=(1, 0)) for k, v in acc.sums.items()}
    used = {sum_spec(name).scale.name for name in acc.step_sums}  # (``restricted``'s)
    scales = {
        k: _leave_one_out_scales(v[:, :length], groups)
        for k, v in acc.step_log_scales.items()
        if k in used
    }
    step_sums = {}
    for name, sum_kt in acc.step_sums.items():
        scale = scales[sum_spec(name).scale.name]
        sum_kt = sum_kt[:, :length]
        with np.errstate(invalid="ignore", over="ignore"):  # the holder's own inf factor
            without_holder_t = np.sum(
                np.where(scale.others_kt, sum_kt * scale.to_second_kt, 0.0), axis=0
            )
        with np.errstate(invalid="ignore", over="ignore"):
            out_gt = weights_gk @ (sum_kt * scale.to_every_kt)
        step_sums[name] = np.where(scale.left_out_gt, without_holder_t[None, :], out_gt)
    step_scales = {k: v.scales_gt for k, v in scales.items()}
    return groups, Sums(sums, acc.log_scales, acc.pivots, step_sums, step_scales)


def leave_one_out_values(acc: Accumulator, length: int, values_of) -> tuple[np.ndarray, np.ndarray]:
    """(the non-empty groups [G], [G] ``values_of(sums)`` of the sums of every episode but
    those of each group): ``values_of`` reads Sums with a leading [G] axis (an estimator's
    ``replicates``). All groups at once (``leave_one_out_sums``) within DENSE_CELLS; past
    it (a very long episode), one group at a time, row by row."""
    if _fits_dense(acc, length):
        groups, sums = leave_one_out_sums(acc, length)
        return groups, np.asarray(values_of(sums), np.float64)
    grouped = grouped_sums(acc, length)
    groups = grouped.groups
    values = [values_of(_with_leading_axis(grouped.select(groups[groups != g])))[0] for g in groups]
    return groups, np.asarray(values, np.float64)


def _with_leading_axis(sums: Sums) -> Sums:
    """``sums`` as a leading axis of one: what ``values_of`` of ``leave_one_out_values`` reads."""
    return dataclasses.replace(
        sums,
        sums={k: v[None] for k, v in sums.sums.items()},
        step_sums={k: v[None] for k, v in sums.step_sums.items()},
        step_log_scales={k: v[None] for k, v in sums.step_log_scales.items()},
    )


def replicate_sums(acc: Accumulator, length: int) -> Sums:
    """The bootstrap replicates' sums (leading axis [R])."""
    return Sums(
        acc.replicate_sums,
        acc.log_scales,
        acc.pivots,
        {k: v[:, :length] for k, v in acc.replicate_step_sums.items()},
        {k: v[:length] for k, v in acc.replicate_step_log_scales.items()},
    )


def _with_interval(estimate: Estimate, interval: tuple) -> Estimate:
    low, high, note = interval
    return dataclasses.replace(estimate, ci_low=low, ci_high=high, note=estimate.note or note)


def _intervals(acc, estimates, context, confidence, interval, betting_range):
    """The estimates with their intervals replaced by the ``interval`` method's."""
    out = dict(estimates)
    if interval == "betting":
        if betting_range is None or acc.betting_histogram.shape[-1] == 0:
            raise ValueError("betting intervals need a reward range and the betting histogram")
        bounds = betting_intervals(acc.betting_histogram, betting_range, confidence)
        for name, estimate in estimates.items():
            kind = get(name).betting
            missing = (None, None, "betting intervals do not apply to this estimator")
            out[name] = _with_interval(estimate, bounds[kind] if kind else missing)
    elif interval != "normal":
        replicates = replicate_sums(acc, context.max_length)
        for name, estimate in estimates.items():
            estimator = get(name)
            if estimator.replicates is None or estimate.value is None or estimate.stderr is None:
                continue
            values, stderrs = estimator.replicates(replicates, context)
            studentized = interval == "bootstrap-t" and estimator.studentized
            bounds = bootstrap_interval(
                estimate.value,
                estimate.stderr,
                values,
                stderrs if studentized else None,
                confidence,
            )
            out[name] = _with_interval(estimate, bounds)
    return out


def mean_return(acc: Accumulator) -> float:
    """The mean discounted return of the logged episodes (core sums): the logging policy's
    own value, every weight 1."""
    return acc.total("return_sum") / acc.total("count")


def diagnostics(acc: Accumulator) -> Diagnostics:
    """The trajectory-weight diagnostics (SPEC 4) from the core sums."""
    n, sum_w = acc.total("count"), acc.total("sum_w")
    log_scale = acc.log_scales["trajectory"]
    ess = sum_w**2 / acc.total("sum_w2") if sum_w > 0 else None
    return Diagnostics(
        ess=finite(ess),
        ess_fraction=finite(ess / n) if ess is not None else None,
        mean_weight=scaled(sum_w / n, log_scale),
        # The largest weight is exp(scale), which is 1 after scaling.
        max_weight=scaled(1.0, log_scale) if sum_w > 0 else 0.0,
        max_weight_share=finite(1.0 / sum_w) if sum_w > 0 else None,
        zero_weight_fraction=float(acc.total("zero_count") / n),
    )


def weightless(acc: Accumulator, estimators: tuple[str, ...]) -> tuple[str, ...]:
    """The ``estimators`` whose weights are all zero, so that the logs say nothing of the
    policy by them (``all_weights_zero``): the trajectory weights' (is, wis) where every
    episode's is 0, the per-decision weights' (pdis, wpdis) where every episode's weight at
    step 0 is (a later step's is then 0 too), as ``Estimator.betting`` names its weights;
    an estimator read from a Q-hat never."""
    n = acc.total("count")
    if n == 0:
        return ()
    first_steps = [np.asarray(row)[..., :1] for row in _rows(acc.step_sums.get("w_t", []))]
    zero = {
        "trajectory": acc.total("zero_count") == n,
        "decision": bool(first_steps) and all(not np.any(row) for row in first_steps),
    }
    return tuple(
        name for name in estimators if not get(name).needs and zero.get(get(name).betting, False)
    )


def _held(acc: Accumulator) -> tuple[str, ...]:
    """The registered estimators whose every sum ``acc`` holds."""
    held = set(acc.sums) | set(acc.step_sums)
    return tuple(n for n in names() if all(spec.name in held for spec in get(n).sums))


def finalize(
    acc: Accumulator,
    gamma: float,
    max_length: int,
    confidence: float,
    interval: str = "normal",
    betting_range: tuple[float, float, float] | None = None,
    estimators: tuple[str, ...] | None = None,
    precision: str = "float64",
) -> tuple[dict[str, Estimate], Diagnostics]:
    """The estimates of ``estimators`` (None: every registered one whose sums ``acc``
    holds, in registration order)
    with intervals at ``confidence`` (method ``interval``, one of INTERVALS), and the
    diagnostics; ``precision``: the kernel's arithmetic, which rounded the terms.
    ``betting`` needs ``betting_range`` = (a, b, H) of
    estimators.reduction.betting_variables and an accumulator that holds their histogram."""
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    acc = extend_replicates(acc, max_length)  # the groups' rows: by ``grouped_sums``
    context = Context(gamma, max_length, precision)
    grouped = grouped_sums(acc, max_length)
    estimates = {}
    for name in _held(acc) if estimators is None else estimators:
        point = get(name).finalize(grouped, context)
        estimates[name] = _estimate(point.value, point.stderr, z, point.note)
    estimates = _intervals(acc, estimates, context, confidence, interval, betting_range)
    return estimates, diagnostics(acc)


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
    """The per-step WPDIS path and weight mass (core sums wr_t, w_t), and the log-weight
    histogram."""
    totals = grouped_sums(acc, max_length).totals
    num_t, den_t = totals.step_sums["wr_t"], totals.step_sums["w_t"]
    log_scale_t = totals.step_log_scales["step"]
    discount_t = Context(gamma, max_length).discount_t
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
