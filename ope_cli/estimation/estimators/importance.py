"""Importance-sampling estimators (SPEC 4): is, wis, pdis, wpdis, registered in that order.

Notation: W_t the cumulative weight of an episode, G its discounted return, n episodes.
Per-episode carries and values are written for one episode; every sum is relative to its
scale (``base.TRAJECTORY``: W_{T-1}; ``WEIGHTED_RETURN``: |W_{T-1} G|; ``PER_DECISION``:
|P|, P relative to the largest gamma^t W_t of a step with a reward; ``base.STEP``: W_t).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import NamedTuple

import numpy as np

from ope_cli.estimation.estimators.base import (
    STEP,
    TRAJECTORY,
    Context,
    Estimator,
    Grouped,
    Point,
    Scale,
    StepSum,
    Sum,
    Sums,
    Trajectory,
    Window,
    jnp,
    register,
    relative,
    rescaled,
    sum_over_steps,
    sum_spec,
)
from ope_cli.estimation.estimators.logspace import finite, scaled_array

# --- per-episode carry and values (JAX, one episode) -----------------------------------------


def trajectory_values(carry: dict, trajectory: Trajectory) -> dict:
    """IS: W G and W^2 G^2 (its own, ``WEIGHTED_RETURN``); WIS: W G, and W and W^2 for its
    centred moments (relative to W: G, G^2, G, 1 and 1)."""
    g = trajectory.return_
    one = jnp().ones_like(g)
    return {"is_wg": g, "is_w2g2": g * g, "sum_wg": g, "wis_w": one, "wis_w2": one}


def per_decision_init(zero) -> dict:
    """PDIS carries P = sum_t gamma^t W_t r_t so far, relative to exp(``log_scale``), the
    largest gamma^t W_t of a step with a reward so far (relative to the largest W_t, long
    episodes' terms underflowed to 0; relative to the largest gamma^t W_t, so did those of
    an episode whose weight passed e^709 and fell back before its rewards)."""
    return {"p": zero, "log_scale": zero - math.inf}


def rewarded_log_scale(log_scale, *weighted_values):
    """The largest of ``log_scale`` and the log weights of the steps whose value is not 0,
    over the ``(log_weight_t, value_t)`` pairs [C] of ``weighted_values`` (one reduction
    for them all): the scale of a sum of weighted values that none of its terms exceeds
    by more than the values' size."""
    np_ = jnp()
    candidates_t = [np_.where(v_t != 0, log_w_t, -np_.inf) for log_w_t, v_t in weighted_values]
    largest_t = candidates_t[0]
    for other_t in candidates_t[1:]:
        largest_t = np_.maximum(largest_t, other_t)
    return np_.maximum(log_scale, np_.max(largest_t))


def weighted(log_weight_t, log_scale, value_t):
    """[C] exp(log_weight_t - log_scale) value_t for a ``rewarded_log_scale``: a weight
    above the scale is a step whose value is 0, taken at the scale (exp(0) * 0; inf * 0
    would be NaN)."""
    return relative(jnp().minimum(log_weight_t, log_scale), log_scale) * value_t


def per_decision_advance(carry: dict, window: Window) -> tuple[dict, dict]:
    """P of the steps walked, now relative to the largest gamma^t W_t of a step with a
    reward in this window or before."""
    log_weight_t = window.log_w_t + window.log_discount_t
    before = carry["log_scale"]
    after = rewarded_log_scale(before, (log_weight_t, window.reward_t))
    p = rescaled(carry["p"], before, after) + weighted(log_weight_t, after, window.reward_t).sum()
    return {"p": p, "log_scale": after}, {}


# IS's and PDIS's terms W G and P relative to themselves (``Scale.magnitude``): a batch's
# scale is its largest term's, so that an enormous weight with a zero return (or no
# reward) does not leave every other term underflowing against it.
WEIGHTED_RETURN = Scale("weighted_return", TRAJECTORY.log_scale, magnitude="is_wg")
PER_DECISION = Scale("per_decision", None, magnitude="sum_p", own="pdis_scale")


def per_decision_values(carry: dict, trajectory: Trajectory) -> dict:
    """PDIS: P and P^2, relative to its own scale (and its square)."""
    p = carry["p"]
    return {"sum_p": p, "sum_p2": p * p, "pdis_scale": carry["log_scale"]}


# --- finalisation (NumPy, float64) ----------------------------------------------------------


def centred_squares(total, total_sq, n):
    """sum (x - mean)^2 = sum x^2 - (sum x)^2 / n of n terms from their sum and sum of
    squares: the one rounding of it that the standard error and its resolution check
    (``spread_resolution``) both read (sum x^2 / n - (sum x / n)^2 rounds otherwise: a
    check that found 0 passed a standard error of rounding alone)."""
    return total_sq - total * (total / n)  # (total * total overflows past 1.3e154)


def mean_and_sem(
    total: np.ndarray, total_sq: np.ndarray, n: np.ndarray, log_scale: float
) -> tuple[np.ndarray, np.ndarray]:
    """Mean and sample standard error (ddof 1) from the sum and sum of squares of the
    per-episode terms, both times exp(log_scale) (NaN where undefined or overflowing)."""
    # Sums of squares of astronomically large returns overflow to inf: the value stays, its
    # standard error becomes null (not a warning on stderr).
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        variance = np.maximum(centred_squares(total, total_sq, n), 0.0) / (n - 1)
        stderr = np.where(n > 1, np.sqrt(variance / n), np.nan)
        return scaled_array(total / n, log_scale), scaled_array(stderr, log_scale)


class MeanOfTerms(NamedTuple):
    """The value of a mean-of-terms estimator: ``(sums) -> (mean, sample standard error)``
    ([...] for any leading axes) of its per-episode terms, from their Sum ``total`` and the
    Sum of their squares ``square``, relative to the scalar scale ``scale`` (None: not
    scaled); ``resolution(sums)`` is (note, drop): where float64 does not resolve that
    standard error, what it is good to, or that it is dropped (``spread_resolution``), with
    ``remedy``: what removes the constant that hides the spread. With ``centred``, the
    terms are not scaled and ``square`` names a Sum of moments [..., 3] of the terms about
    the pivot of its scale (one episode's term): the mean and the spread are read from
    them, so a constant in every term cancels nowhere."""

    total: str
    square: str
    scale: str | None
    remedy: str = "subtract a constant from the rewards"
    centred: bool = False

    def _spread_sums(self, sums: Sums) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(sum, sum of squares, count) that the spread is read from: of the terms, or of
        their deviations from the pivot."""
        s = sums.sums
        if self.centred:
            moments = s[self.square]
            return moments[..., 1], moments[..., 2], moments[..., 0]
        return s[self.total], s[self.square], s["count"]

    def __call__(self, sums: Sums) -> tuple[np.ndarray, np.ndarray]:
        s = sums.sums
        log_scale = 0.0 if self.scale is None else sums.log_scales[self.scale]
        if not self.centred:
            return mean_and_sem(s[self.total], s[self.square], s["count"], log_scale)
        deviation, stderr = mean_and_sem(*self._spread_sums(sums), 0.0)
        pivot = self._pivot(sums)
        with np.errstate(invalid="ignore", over="ignore"):  # V-hat beyond float64: not finite
            return pivot + deviation, stderr

    def resolution(self, sums: Sums, precision: str = "float64") -> tuple[str | None, bool]:
        total, square, count = self._spread_sums(sums)
        offset = self._pivot(sums) if self.centred else 0.0
        return spread_resolution(total, square, count, self.remedy, precision, offset)

    def _pivot(self, sums: Sums) -> float | np.ndarray:
        return sums.pivots[sum_spec(self.square).scale.name]

    def underflows(self, sums: Sums) -> bool:
        """Whether the mean is not 0 but below float64's normal range (its terms' weights
        all underflow): it prints as 0 (or a subnormal of few digits)."""
        s = sums.sums
        total, n = float(s[self.total]), float(s["count"])
        log_scale = 0.0 if self.scale is None else float(sums.log_scales[self.scale])
        if total == 0 or n == 0 or not math.isfinite(total) or not math.isfinite(log_scale):
            return False
        return math.log(abs(total) / n) + log_scale < math.log(np.finfo(np.float64).tiny)


is_values = MeanOfTerms("is_wg", "is_w2g2", WEIGHTED_RETURN.name)  # (1/n) sum_i W_i G_i
pdis_values = MeanOfTerms("sum_p", "sum_p2", PER_DECISION.name)  # (1/n) sum_i P_i


def wis_values(sums: Sums) -> tuple[np.ndarray, np.ndarray]:
    """sum W G / sum W and its delta-method standard error
    sqrt(sum_i W_i^2 (G_i - WIS)^2) / sum_i W_i. The numerator comes from moments centred
    on the pivot c (the return of the heaviest episode): with M_k = sum W^2 (G - c)^k and
    d = WIS - c = sum W (G - c) / sum W it is M_2 - 2 d M_1 + d^2 M_0, which does not cancel
    catastrophically when one episode holds nearly all the weight (then d, M_1, M_2 ~ 0)."""
    s = sums.sums
    n, sum_w = s["count"], s["sum_w"]
    moments, first = s["wis_w2"], s["wis_w"]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        wis = np.where(sum_w > 0, s["sum_wg"] / sum_w, np.nan)
        offset = first[..., 1] / first[..., 0]
        residual = (
            moments[..., 2] - 2 * offset * moments[..., 1] + offset * offset * moments[..., 0]
        )
        stderr = np.where((n > 1) & (sum_w > 0), np.sqrt(np.maximum(residual, 0.0)) / sum_w, np.nan)
    return wis, stderr


# an undefined value's reason: the weights, or the returns, left float64's range
IS_OVERFLOW = "the trajectory weights or the returns overflow float64"
PDIS_OVERFLOW = "the per-decision weights or the rewards overflow float64"
NO_WEIGHT = "every trajectory weight is zero"
RESOLVED = 1e-6  # a standard error that float64 sums resolve worse than this gets a note
# Past this, the computed spread is within a few hundred roundings of the terms' squares:
# it may be rounding alone (a standard error 45x or 6,000,000x too large was noted "good to
# about 5e-01"), so the standard error is dropped (null), not noted.
UNRESOLVED = 1e-3
NOT_RESOLVED = "standard error not resolved"
SUBTRACT = MeanOfTerms._field_defaults["remedy"]


def zero_to_precision(precision: str = "float64") -> str:
    """The note of a spread that cancelled to nothing in ``precision`` arithmetic: equal
    terms, or a spread below rounding."""
    return f"standard error 0 to {precision}'s precision"


# every precision's note of a spread that cancelled, and the precision it names
ZERO_NOTES = {zero_to_precision(p): p for p in ("float64", "float32")}
# the note of a value whose weights all underflow (it is not 0, but prints so)
UNDERFLOW = (
    "below float64's range (1e-308): every weight underflows, so the value and its standard "
    "error print as 0 (or a subnormal of few digits)"
)


def _resolution(
    lost: float, ratio: str, remedy: str = SUBTRACT, where: str = "float64 sums"
) -> tuple[str | None, bool]:
    """(note, drop) of a standard error whose rounding is ``lost`` of it: nothing up to
    RESOLVED, what it is good to up to UNRESOLVED, beyond it dropped (null) with the reason;
    ``ratio`` says why (the size of the sums against the spread), ``remedy`` what helps,
    ``where`` which rounding loses it."""
    if lost <= RESOLVED:
        return None, False
    if lost > UNRESOLVED:
        return f"{NOT_RESOLVED} in {where}: {ratio} ({remedy})", True
    # float32 terms: what rounding them costs, not what their float32 inputs (Q-hat from
    # far-off observations, say) lost before, which the float32_range warning names
    source = "" if where == "float64 sums" else f" from rounding its {where}"
    return f"standard error good to about {lost:.0e} only{source}: {ratio}", False


def spread_resolution(
    total: float,
    total_sq: float,
    n: float,
    remedy: str = SUBTRACT,
    precision: str = "float64",
    offset: float = 0.0,
) -> tuple[str | None, bool]:
    """(note, drop) of a standard error from the sum and sum of squares of n terms
    (``_resolution``): sum x^2 - (sum x)^2 / n cancels when the terms' mean is far above
    their spread (e.g. a large constant in every reward); the relative error of that
    difference is about eps * mean(x^2) / spread. Terms computed in ``precision``
    "float32" were each rounded by up to eps32 * |x| / 2 too, which moves their standard
    deviation by about e / sqrt(12 n) + e^2 / 24 of itself, e = eps32 * size / spread
    (measured: V-hat 1e4 + N(0, 1) on 5,000 episodes, 4.9e-6 by this: 3.2e-6 off; 1e5 on
    2,000, 8e-5: 4e-5; a Q checkpoint of 1e6 on 2,000, 1.4e-3, dropped: dm 4.7% off).
    With ``offset`` c, the sums are of the terms' deviations x - c from a pivot (centred
    moments): their sums cancel little, and the terms' size c + x rounds them."""
    total, total_sq, n = (float(np.asarray(x)) for x in (total, total_sq, n))
    offset = float(np.asarray(offset))
    if offset and total_sq == 0 and n > 1 and precision != "float64":
        # equal terms about the pivot, each rounded to ``precision`` at its size: a spread
        # below that rounding is gone (V-hat of 1000 + 1e-6 N(0, 1) in float32: 0 +- 0)
        return (
            f"{zero_to_precision(precision)}: any spread of the terms is below their "
            f"{precision} rounding",
            False,
        )
    if not (n > 1 and math.isfinite(total) and math.isfinite(total_sq) and total_sq > 0):
        return None, False
    squares = total_sq / n
    spread = centred_squares(total, total_sq, n) / n
    if spread <= 0:  # equal terms (a constant return) or a spread below the rounding
        below = "their squares' sum" if precision == "float64" else "the terms or their squares"
        return (
            f"{zero_to_precision(precision)}: any spread of the terms is below the rounding "
            f"of {below}",
            False,
        )
    size = math.sqrt(squares / spread)  # what the sums hold: root mean square over spread
    in_sums = np.finfo(np.float64).eps * size * size
    if offset:  # the terms' own root mean square over their spread
        with np.errstate(over="ignore"):
            size = math.sqrt(
                max(offset * offset + 2 * offset * (total / n) + squares, 0.0) / spread
            )
    ratio = f"the terms' mean is {size:.0e} times their spread"
    # float64 terms are the data's or their model's, not rounded by the kernel
    rounding = 0.0 if precision == "float64" else np.finfo(precision).eps * size
    in_terms = rounding / math.sqrt(12 * n) + rounding * rounding / 24
    where = "float64 sums" if in_sums >= in_terms else f"{precision} terms"
    return _resolution(max(in_sums, in_terms), ratio, remedy, where)


def closed_form(values, undefined):
    """finalize() of an estimator given by a vectorised ``values(sums)``; a MeanOfTerms
    also notes, or drops, a standard error that float64 does not resolve
    (``spread_resolution``). ``undefined``: the note of an undefined value, or a function
    of the totals (Sums) giving it."""

    def finalize(grouped: Grouped, context: Context) -> Point:
        value, stderr = (finite(float(x)) for x in values(grouped.totals))
        if value is None:
            note = undefined if isinstance(undefined, str) else undefined(grouped.totals)
            return Point(None, stderr, note)
        if not isinstance(values, MeanOfTerms):
            return Point(value, stderr)
        if values.underflows(grouped.totals):
            return Point(value, stderr, UNDERFLOW)
        if stderr is None:
            return Point(value, stderr)
        note, drop = values.resolution(grouped.totals, context.precision)
        cancelled = note is not None and note.startswith(tuple(ZERO_NOTES))
        if cancelled and _groups_differ(values, grouped):
            note, drop = spread_cancelled(values.remedy), True
        return Point(value, None if drop else stderr, note)

    return finalize


def spread_cancelled(remedy: str, evidence: str = "the episode-id hash groups' means") -> str:
    """The note of a spread that cancelled to 0 in the sums of squares of terms that do
    differ, as ``evidence`` shows."""
    return (
        f"{NOT_RESOLVED} in float64 sums: the terms' squares cancel to no spread, though "
        f"{evidence} differ ({remedy})"
    )


def _groups_differ(values: MeanOfTerms, grouped: Grouped) -> bool:
    """Whether the resampling groups show a spread beyond float64's rounding: their
    leave-one-group-out means (sums of the other groups, no squares) spread by more than
    JACKKNIFE_ROUNDINGS roundings of their size. Then the terms differ, and a standard
    error that cancelled to 0 (rewards of 1e6 + 0.01 noise) is lost, not 0; equal terms
    give leave-out means equal to their rounding. (A spread that float64 resolves only
    roughly still shows that the terms differ: rewards of 1e12 + N(0, 1) printed 0.)"""
    groups = grouped.groups
    if groups.size < 2:
        return False
    if grouped.leave_one_out is not None:
        leave_out = np.asarray(values(grouped.leave_one_out())[0], np.float64)
    else:
        others = [grouped.select(groups[groups != g]) for g in groups]
        leave_out = np.array([float(values(sums)[0]) for sums in others])
    if not np.isfinite(leave_out).all():
        return False
    spread, size = _jackknife(leave_out), float(np.max(np.abs(leave_out)))
    return math.isfinite(spread) and spread > JACKKNIFE_ROUNDINGS * np.finfo(np.float64).eps * size


def _jackknife(leave_out_g: np.ndarray) -> float:
    """The delete-a-group jackknife standard error of [G] leave-one-group-out values:
    sqrt((G - 1) / G * sum (v_g - mean)^2) (inf where they overflow)."""
    k = leave_out_g.size
    with np.errstate(over="ignore", invalid="ignore"):
        return math.sqrt((k - 1) / k * np.sum((leave_out_g - leave_out_g.mean()) ** 2))


def replicates_of(values):
    def replicates(sums: Sums, context: Context) -> tuple[np.ndarray, np.ndarray | None]:
        return values(sums)

    return replicates


def _wpdis_terms(step_sums: Mapping[str, np.ndarray], discount_t: np.ndarray) -> np.ndarray:
    """[..., L] gamma^t (sum_i W_it r_it) / (sum_i W_it), NaN where no weight is left."""
    num, den = step_sums["wr_t"], step_sums["w_t"]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return np.where(den > 0, discount_t * num / den, np.nan)


def self_normalised_value(sums: Sums, numerator_t: np.ndarray) -> tuple[float | None, int]:
    """(sum_t numerator_t / w_t or None, the first step with no weight left, else -1):
    a per-step self-normalised sum (``numerator_t`` [L] relative to W_t like w_t)."""
    den_t = sums.step_sums["w_t"]
    if not (den_t > 0).all():
        return None, int(np.argmax(~(den_t > 0)))
    with np.errstate(over="ignore", invalid="ignore"):
        return float(np.sum(numerator_t / den_t)), -1


def _wpdis_value(sums: Sums, context: Context) -> tuple[float | None, int]:
    """(WPDIS of ``sums`` or None, the first step with no weight left, else -1)."""
    return self_normalised_value(sums, context.discount_t * sums.step_sums["wr_t"])


def grouped_jackknife(value_of, values_of=None):
    """finalize() of an estimator whose ``value_of(sums, context) -> (value or None, first
    step with no weight left)`` is not a plain mean: the value, and a delete-a-group
    jackknife standard error over the non-empty id-hash groups. ``values_of(sums,
    context) -> [G]`` (NaN where undefined), given, evaluates every leave-out at once on
    ``Grouped.leave_one_out``'s sums."""

    def finalize(grouped: Grouped, context: Context) -> Point:
        value, empty_step = value_of(grouped.totals, context)
        if value is None:
            if empty_step < 0:
                return Point(None, None, "not finite (V-hat or the weighted sums overflow)")
            return Point(None, None, f"every episode has zero weight at step {empty_step}")
        groups = grouped.groups
        if groups.size < 2:
            return Point(finite(value), None, "too few episode groups for a standard error")
        if values_of is not None and grouped.leave_one_out is not None:
            every = np.asarray(values_of(grouped.leave_one_out(), context), np.float64)
            leave_out = [None if np.isnan(v) else float(v) for v in every]
        else:
            leave_out = [value_of(grouped.select(groups[groups != g]), context)[0] for g in groups]
        if any(v is None for v in leave_out):
            return Point(
                finite(value), None, "a group holds all the weight at some step; no standard error"
            )
        leave_out_g = np.asarray(leave_out)
        stderr, note = _resolved_spread(_jackknife(leave_out_g), np.max(np.abs(leave_out_g)))
        return Point(finite(value), finite(stderr), note)

    return finalize


# each leave-out value carries roundings of its sums over steps and episodes: about this many
# float64 epsilons of its size (11% and 33% errors measured where the formula gives 1e-2, 8e-2)
JACKKNIFE_ROUNDINGS = 10.0


def _resolved_spread(stderr: float, size: float) -> tuple[float | None, str | None]:
    """A jackknife standard error from leave-out values of magnitude ``size``, or None where
    their rounding (JACKKNIFE_ROUNDINGS eps * size) is beyond UNRESOLVED of it; its note."""
    # stderr 0: every leave-out estimate equal, a constant return per step
    if not (math.isfinite(stderr) and math.isfinite(size)) or size == 0 or stderr == 0:
        return stderr, None
    lost = JACKKNIFE_ROUNDINGS * np.finfo(np.float64).eps * size / stderr
    note, drop = _resolution(lost, f"the estimate is {size / stderr:.0e} times its standard error")
    return None if drop else stderr, note


wpdis_finalize = grouped_jackknife(
    _wpdis_value, lambda sums, context: wpdis_replicates(sums, context)[0]
)
wpdis_finalize.__doc__ = """WPDIS = sum_t gamma^t sum_i W_it r_it / sum_i W_it, with a
delete-a-group jackknife standard error over the non-empty id-hash groups."""


def wpdis_replicates(sums: Sums, context: Context) -> tuple[np.ndarray, None]:
    """[R] WPDIS of each bootstrap replicate (NaN where some step has no weight); no
    replicate standard errors, so bootstrap-t falls back to the percentile interval."""
    with np.errstate(over="ignore", invalid="ignore"):
        return sum_over_steps(_wpdis_terms, sums.step_sums, context.discount_t), None


IS = register(
    Estimator(
        name="is",
        title="IS",
        stderr_method="sample standard error",
        sums=(Sum("is_wg", WEIGHTED_RETURN), Sum("is_w2g2", WEIGHTED_RETURN, power=2)),
        finish=trajectory_values,
        finalize=closed_form(is_values, IS_OVERFLOW),
        term="is_wg",
        replicates=replicates_of(is_values),
        studentized=True,
        betting="trajectory",
    )
)


def _wis_undefined(sums: Sums) -> str:
    weighted = float(np.asarray(sums.sums["count"])) - float(np.asarray(sums.sums["zero_count"]))
    return NO_WEIGHT if weighted <= 0 else "not finite in float64: the weighted returns overflow"


_wis_closed_form = closed_form(wis_values, _wis_undefined)


def wis_finalize(grouped: Grouped, context: Context) -> Point:
    """WIS and its delta-method standard error; where one episode holds all the weight
    (every other weight is zero), that error is 0 by construction, not a measured spread:
    null, with the reason."""
    point = _wis_closed_form(grouped, context)
    s = grouped.totals.sums
    weighted = float(np.asarray(s["count"])) - float(np.asarray(s["zero_count"]))
    if point.value is not None and point.stderr is not None and weighted <= 1:
        return Point(point.value, None, "one episode holds all the weight; no standard error")
    return point


WIS = register(
    Estimator(
        name="wis",
        title="WIS",
        stderr_method="delta method",
        sums=(
            Sum("sum_wg", TRAJECTORY),
            Sum("wis_w", TRAJECTORY, moments=1),
            Sum("wis_w2", TRAJECTORY, power=2, moments=2),
        ),
        finish=trajectory_values,
        finalize=wis_finalize,
        replicates=replicates_of(wis_values),
        studentized=True,
        betting="trajectory",
    )
)
PDIS = register(
    Estimator(
        name="pdis",
        title="PDIS",
        stderr_method="sample standard error",
        sums=(Sum("sum_p", PER_DECISION), Sum("sum_p2", PER_DECISION, power=2)),
        init=per_decision_init,
        advance=per_decision_advance,
        finish=per_decision_values,
        finalize=closed_form(pdis_values, PDIS_OVERFLOW),
        term="sum_p",
        replicates=replicates_of(pdis_values),
        studentized=True,
        betting="decision",
    )
)
WPDIS = register(
    Estimator(
        name="wpdis",
        title="WPDIS",
        stderr_method="grouped jackknife over 32 episode-id hash groups",
        sums=(StepSum("wr_t", STEP, after_end="zero"), StepSum("w_t", STEP, after_end="hold")),
        finalize=wpdis_finalize,
        replicates=wpdis_replicates,
        betting="decision",
    )
)
