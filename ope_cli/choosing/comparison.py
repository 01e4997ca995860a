"""Paired comparisons between policies evaluated on the same episodes (SPEC 11): each
policy against ``--baseline``, and the sets of policies that could be the best.

Rows are the policies in command-line order and, last, the behavior policy itself (its
value is the mean discounted return of the logged episodes, every weight 1). For an
estimator that is a mean of per-episode terms (``Estimator.term``) a difference and its
standard error come from the paired sums (``paired``): the per-episode differences. For a
self-normalised one (wis, wpdis, wdr) the difference of the two ratio estimates, with the
grouped jackknife over the resampling groups applied to the difference. Intervals follow
the run's ``--ci`` method: ``normal`` from that standard error, ``percentile`` and
``bootstrap-t`` from the paired replicate differences (the Poisson counts are the same for
every policy; bootstrap-t is studentized against the baseline for mean-of-terms estimators
and falls back to the percentile interval elsewhere), ``betting`` as [lo_k - hi_b, hi_k -
lo_b] from the two policies' betting intervals at level 1 - alpha/2 each (the behavior
row's: Hoeffding's bound on the mean return in [a H, b H]). Plain NumPy.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence
from statistics import NormalDist

import numpy as np

from ope_cli.choosing import paired
from ope_cli.choosing.selection import (
    BASELINE_BEHAVIOR,
    DEFAULT_TOP_K,
    RESOLVED,
    bonferroni_level,
    check_top_k,
    could_be_best,
    estimated_best,
    grouped_jackknife_difference,
    missing_truth_note,
    p_improvement,
    read_truth,
    same_path,
    selection_by_estimator,
    tie_share,
)
from ope_cli.errors import UsageError
from ope_cli.estimation.estimators import get
from ope_cli.estimation.estimators.base import Context
from ope_cli.estimation.estimators.logspace import finite
from ope_cli.estimation.intervals import BOOTSTRAP_METHODS, betting_intervals, bootstrap_interval
from ope_cli.estimation.run_plan import NO_BETTING, fewest_replicates
from ope_cli.estimation.stats import (
    Accumulator,
    extend_replicates,
    leave_one_out_sums,
    leave_one_out_values,
    mean_return,
    replicate_sums,
    restricted,
)
from ope_cli.models.policies.base import Policy
from ope_cli.results import Comparison, PolicyResult, estimated


def tied(share: float = RESOLVED) -> str:
    """The note of a tie: differences below ``share`` of the estimates' size."""
    return f"the same estimates to rounding (differences below {share:.0e} of their size are ties)"


TIED = tied()
PERCENTILE_FALLBACK = "bootstrap-t needs replicate standard errors; percentile interval"
NO_DIFFERENCE = "an estimate is undefined, and so is the difference"
# a policy's own betting interval is missing (its bounds cross: its estimate's note says
# why), and a difference's betting interval is made of the two policies' own
CROSSED_BETTING = "no interval: a betting interval it is made of is missing (see the estimates)"


def unresolved_in(precision: str) -> str:
    """The note of a difference whose standard error ``precision`` terms cannot resolve."""
    return (
        f"no standard error: the difference is below what the terms' {precision} rounding "
        "resolves (--precision float64 resolves it), so no interval"
    )


def rounding_only_in(precision: str) -> str:
    """The note of a difference that is itself within what ``precision`` rounding of the
    terms can shift it by: its sign, value and probability of improvement are rounding."""
    return (
        f"no difference: it is within what the terms' {precision} rounding can shift it by "
        "(--precision float64 resolves it)"
    )


NO_WEIGHT = (
    "a policy compared has weights that are all zero for this estimator: the logs say "
    "nothing about it, nor about the difference"
)
NO_SPREAD = (
    "no standard error of the difference (fewer than two episodes with finite values; for a "
    "self-normalised estimator, fewer than three resampling groups, or a group left out "
    "leaves no weight within float64's range), so no interval"
)


class Pairing:
    """Every pair of rows of one run, for every estimator: differences, standard errors,
    intervals at any level. Built once per run from the merged statistics.

    Args:
      accumulators: [P] each policy's merged accumulator.
      results: [P] each policy's result: its {estimator: Estimate}, and the estimators whose
        weights are all zero (``PolicyResult.weightless``).
      sums: the run's paired sums (``paired.PairedSums``, P + 1 rows).
      context: the discount and longest episode.
      methods: {estimator: its interval method} (betting, normal, percentile,
        bootstrap-t): the run's, or normal where ``--ci auto`` falls back to it.
      betting_range: (a, b, H) of the betting intervals, else None.
      baseline: the baseline's row, or None without ``--baseline``.
      precision: the kernel's arithmetic ("float64", "float32"), which the per-episode
        terms are good to (``paired.term_noise``).
    """

    def __init__(
        self,
        accumulators: Sequence[Accumulator],
        results: Sequence[PolicyResult],
        sums: paired.PairedSums,
        context: Context,
        methods: dict[str, str],
        betting_range: tuple[float, float, float] | None,
        baseline: int | None,
        precision: str = "float64",
    ):
        self.accumulators = [extend_replicates(acc, context.max_length) for acc in accumulators]
        self.estimates = [result.estimates for result in results]
        self.sums = sums
        self.context = context
        self.methods = methods
        self.betting_range = betting_range
        self.baseline = baseline
        self.precision = precision
        self.term_noise = (  # float64 terms: below the co-moments' own rounding
            0.0
            if precision == "float64"
            else paired.term_noise(float(np.finfo(precision).eps), context.max_length)
        )
        self.behavior = len(self.accumulators)  # the behavior policy's row
        first = self.accumulators[0]
        self.count = first.total("count")
        self.mean_return = mean_return(first)
        self.weightless = [result.weightless for result in results]

    def candidates(self, name: str) -> dict[int, float | None]:
        """{row: estimate} of the policies by ``name``, as the best is chosen among them:
        None where undefined or resting on weights that are all zero (``says_nothing``)."""
        rows = range(len(self.accumulators))
        return {k: None if self.says_nothing(k, name) else self.value(k, name) for k in rows}

    def says_nothing(self, row: int, name: str) -> bool:
        """Whether estimator ``name`` of ``row`` rests on weights that are all zero
        (``PolicyResult.weightless``): it is never the best, and differs from nothing."""
        return row < len(self.weightless) and name in self.weightless[row]  # behavior: no

    # --- per row ------------------------------------------------------------------------

    def value(self, row: int, name: str) -> float | None:
        if row == self.behavior:
            return finite(self.mean_return)
        return self.estimates[row][name].value

    @functools.cache  # noqa: B019 - one Pairing per run
    def replicates(self, row: int, name: str) -> np.ndarray | None:
        """[R] the row's bootstrap replicate estimates (None without replicates)."""
        first = self.accumulators[0]
        if first.replicate_sums["count"].size == 0:
            return None
        if row == self.behavior:
            with np.errstate(divide="ignore", invalid="ignore"):
                return first.replicate_sums["return_sum"] / first.replicate_sums["count"]
        estimator = get(name)
        if estimator.replicates is None:
            return None
        sums = replicate_sums(self.accumulators[row], self.context.max_length)
        values, _ = estimator.replicates(sums, self.context)
        return np.asarray(values, np.float64)

    @functools.cache  # noqa: B019 - one Pairing per run
    def leave_out(self, row: int, name: str) -> np.ndarray:
        """[G] the row's estimate with each non-empty resampling group left out."""
        if row == self.behavior:
            _, sums = leave_one_out_sums(restricted(self.accumulators[0], ()), 0)
            with np.errstate(divide="ignore", invalid="ignore"):
                return sums.sums["return_sum"] / sums.sums["count"]
        estimator = get(name)
        own = restricted(self.accumulators[row], (name,))
        if estimator.replicates is None:
            return np.full(np.count_nonzero(own.sums["count"] > 0), np.nan)
        _, values = leave_one_out_values(
            own, self.context.max_length, lambda sums: estimator.replicates(sums, self.context)[0]
        )
        return values

    @functools.cache  # noqa: B019 - one Pairing per run
    def betting(self, row: int, name: str, level: float) -> tuple[float | None, float | None]:
        """The row's betting interval at ``level`` (None, None where there is none)."""
        low, high, horizon = self.betting_range
        if row == self.behavior:  # Hoeffding: G in [a H, b H]
            half = (high - low) * horizon * math.sqrt(math.log(2 / (1 - level)) / (2 * self.count))
            return (
                max(self.mean_return - half, low * horizon),
                min(self.mean_return + half, high * horizon),
            )
        kind = get(name).betting
        if kind is None:
            return None, None
        bounds = betting_intervals(
            self.accumulators[row].betting_histogram, self.betting_range, level
        )
        return bounds[kind][0], bounds[kind][1]

    # --- per pair -----------------------------------------------------------------------

    def resolution(self, k: int, b: int, name: str) -> float:
        """The smallest difference of rows k and b that is not rounding: the estimator's
        ``tie_share`` (``RESOLVED`` by default) times the size of their estimates and
        bootstrap replicates."""
        sizes = [abs(v) for v in (self.value(k, name), self.value(b, name)) if v is not None]
        for row in (k, b):
            replicates = self.replicates(row, name)
            if replicates is not None:
                sizes.append(float(np.abs(replicates[np.isfinite(replicates)]).max(initial=0)))
        return tie_share(name) * max(sizes, default=0.0)

    @functools.cache  # noqa: B019 - one Pairing per run: intervals, sets and notes read it
    def difference(self, k: int, b: int, name: str) -> tuple[float | None, float | None]:
        """(Δ, stderr) of V̂(k) - V̂(b); a tie, (0, 0), where both are rounding
        (``resolution``; a Δ below it with a standard error above it is kept as it is:
        zeroed, it centred the interval on 0 and was not called a tie)."""
        tie = self.resolution(k, b, name)
        delta, stderr = self._difference(k, b, name)
        rounding = [x is None or abs(x) <= tie for x in (delta, stderr)]
        if delta is not None and all(rounding):
            return 0.0, None if stderr is None else 0.0
        return delta, stderr

    def _difference(
        self, k: int, b: int, name: str, term_noise: float | None = None
    ) -> tuple[float | None, float | None]:
        """(Δ, stderr), the standard error None below what rounding of ``term_noise`` of
        each term resolves (the run's, ``self.term_noise``, by default)."""
        term_noise = self.term_noise if term_noise is None else term_noise
        if get(name).term is not None:
            rows = paired.differences_from(self.baseline)
            return paired.difference(self.sums, name, k, b, rows, term_noise)
        value_k, value_b = self.value(k, name), self.value(b, name)
        if value_k is None or value_b is None:
            return None, None
        delta = finite(value_k - value_b)
        stderr = grouped_jackknife_difference(
            self.leave_out(k, name), self.leave_out(b, name), delta
        )
        if stderr is not None and stderr > 0 and term_noise > 0:
            log_size = self._log_term_size(k, b, name)
            if paired.below_rounding(math.log(stderr), log_size, term_noise):
                stderr = None  # below what the terms' rounding can shift Δ by
        return delta, stderr

    def _log_term_size(self, k: int, b: int, name: str) -> float:
        """log of the size that rounding of ``name``'s difference scales with: for a mean of
        terms, their root mean square (``paired.log_term_size``); for a self-normalised
        (or Q-hat) one, the logged returns' (a weighted average of returns, whatever the
        weights' scale: not the estimates, near 0 for rewards centred at 0), else the
        estimates' own size."""
        if get(name).term is not None:
            return paired.log_term_size(self.sums, name, k, b)
        term = next(iter(self.sums.means), None)  # each one's row P holds the returns
        if term is not None:
            return paired.log_term_size(self.sums, term, self.behavior, self.behavior)
        size = max(abs(self.value(k, name) or 0.0), abs(self.value(b, name) or 0.0))
        return math.log(size) if size > 0 else -math.inf

    def _replicate_difference(self, k: int, b: int, name: str) -> np.ndarray | None:
        rep_k, rep_b = self.replicates(k, name), self.replicates(b, name)
        if rep_k is None or rep_b is None:
            return None
        with np.errstate(over="ignore", invalid="ignore"):
            difference_r = rep_k - rep_b
            difference_r[np.abs(difference_r) <= self.resolution(k, b, name)] = 0.0
        return difference_r

    def interval(
        self, k: int, b: int, name: str, level: float, studentize: bool = True
    ) -> tuple[float | None, float | None, str | None]:
        """(low, high, note) of V̂(k) - V̂(b) at ``level`` by the run's method (bootstrap-t
        studentized against the baseline only when ``studentize``)."""
        delta, stderr = self.difference(k, b, name)
        method = self.methods[name]
        if method == "betting":
            outer = 1 - (1 - level) / 2
            low_k, high_k = self.betting(k, name, outer)
            low_b, high_b = self.betting(b, name, outer)
            if None in (low_k, high_k, low_b, high_b):
                return None, None, NO_BETTING if get(name).betting is None else CROSSED_BETTING
            return finite(low_k - high_b), finite(high_k - low_b), None
        if delta is None or stderr is None:
            return None, None, None
        if method == "normal":
            z = NormalDist().inv_cdf(0.5 + level / 2)
            return finite(delta - z * stderr), finite(delta + z * stderr), None
        replicates = self._replicate_difference(k, b, name)
        if replicates is None:
            return None, None, None
        studentized = (
            studentize
            and method == "bootstrap-t"
            and get(name).term is not None
            and b == self.baseline
        )
        if studentized and delta == 0.0 and stderr == 0.0 and not np.any(replicates):
            return 0.0, 0.0, None  # a tie (``resolution``): nothing to studentize by
        stderrs = paired.replicate_stderrs(self.sums, name, k, b) if studentized else None
        low, high, note = bootstrap_interval(delta, stderr, replicates, stderrs, level)
        if method == "bootstrap-t" and not studentized and note is None:
            note = PERCENTILE_FALLBACK
        return low, high, note

    def compare(self, k: int, name: str, level: float) -> Comparison:
        """Row ``k`` against the baseline for one estimator."""
        b = self.baseline
        if self.says_nothing(k, name) or self.says_nothing(b, name):
            return Comparison(None, None, None, None, None, NO_WEIGHT)
        delta, stderr = self.difference(k, b, name)
        if delta is None:  # an undefined difference has no spread either (it said 0.0)
            stderr = None
        low, high, note = self.interval(k, b, name, level)
        improvement = p_improvement(
            self.replicates(k, name), self.replicates(b, name), self.resolution(k, b, name)
        )
        # terms coarser than float64 whose rounding hides the spread: the replicates'
        # differences are rounding too, and so is Δ where rounding can shift it as far
        hidden = self.term_noise > 0.0 and self.rounding_hides(k, b, name)
        if hidden:
            improvement = None
            if abs(delta) <= self.rounding_bound(k, b, name):
                return Comparison(None, None, low, high, None, rounding_only_in(self.precision))
        if delta == 0.0 and stderr == 0.0:
            note = tied(tie_share(name))
        elif note is None and delta is None:  # a null always says why (under betting the
            note = NO_DIFFERENCE  # interval of an undefined difference can still be had)
        elif note is None and (low is None or high is None) and stderr is None:
            note = unresolved_in(self.precision) if hidden else NO_SPREAD
        return Comparison(delta, stderr, low, high, improvement, note)

    def rounding_bound(self, k: int, b: int, name: str) -> float:
        """How far rounding of the terms (``term_noise`` of each) can shift V̂(k) - V̂(b):
        the noise times the size it scales with (``_log_term_size``)."""
        return self.term_noise * math.exp(self._log_term_size(k, b, name))

    def replicates_too_few(self, name: str, confidence: float) -> bool:
        """Whether the run drew fewer bootstrap replicates than the could-be-best set of
        ``name`` needs (``best_set_replicates``)."""
        if self.methods[name] not in BOOTSTRAP_METHODS:
            return False
        drawn = self.accumulators[0].replicate_sums["count"].size
        return drawn < best_set_replicates(confidence, len(self.accumulators))

    def has_intervals(self, name: str) -> bool:
        """Whether ``name`` has paired intervals by the run's method: not under ``--ci
        betting`` for an estimator betting does not apply to (``betting_does_not_apply``)."""
        return not betting_does_not_apply(self.methods[name], name)

    def could_be_best(self, name: str, confidence: float) -> list[bool] | None:
        """[P] whether each policy could be the best by ``name`` (Bonferroni over the
        comparisons with the estimated best); None where the replicates are too few for
        its level (``replicates_too_few``) or there are no paired intervals
        (``has_intervals``: every policy was marked, as nothing excluded one). Under
        bootstrap-t every pair's interval is the percentile one: the studentized interval
        exists only against the baseline, and one pair by another method would make the set
        depend on which policy is it."""
        if self.replicates_too_few(name, confidence) or not self.has_intervals(name):
            return None
        policies = range(len(self.accumulators))
        estimates = self.candidates(name)

        def paired_interval(best: int, other: int, level: float):
            if self.says_nothing(other, name):
                return None, None  # no comparison excludes it (the set's rule)
            low, high, _ = self.interval(best, other, name, level, studentize=False)
            return low, high

        flags = could_be_best(estimates, paired_interval, confidence)
        return [flags[k] for k in policies]

    def rounding_hides(self, k: int, b: int, name: str) -> bool:
        """Whether rounding alone leaves V̂(k) - V̂(b) without a standard error: the
        co-moments' (a pair without the baseline, ``paired.difference``) or, where the
        terms are coarser than float64, theirs (without it, one would be had)."""
        delta, stderr = self.difference(k, b, name)
        if delta is None or delta == 0.0 or stderr is not None or float(self.sums.count) < 2:
            return False
        if get(name).term is not None and b != self.baseline and k != self.baseline:
            return True  # a spread of two episodes or more, left undefined by rounding
        return self.term_noise > 0.0 and self._difference(k, b, name, 0.0)[1] is not None

    def unresolved(self, name: str) -> tuple[int | None, list[int]]:
        """(the estimated best row by ``name``, the rows whose paired difference from it
        has a value but no standard error, hence no interval by any method but betting's:
        policies so close to it that rounding cannot resolve the spread of their
        per-episode differences, ``paired.difference``). Nothing excludes them from the
        could-be-best set, so the set may be too large."""
        best = estimated_best(self.candidates(name))
        if best is None or self.methods[name] == "betting":
            return best, []
        others = [k for k in range(len(self.accumulators)) if k != best]
        others = [k for k in others if not self.says_nothing(k, name)]
        return best, [k for k in others if self.rounding_hides(best, k, name)]


# --- a run's comparisons, could-be-best sets and selection metrics ---------------------------


def best_set_replicates(confidence: float, policies: int) -> int:
    """The fewest bootstrap replicates a could-be-best set of ``policies`` needs: each of
    its K - 1 comparisons is at the Bonferroni level, whose quantiles 200 replicates cannot
    give for K of 7 or more at 95% (with 20 policies the set's intervals were guesses from
    the few extreme replicates)."""
    return fewest_replicates(bonferroni_level(confidence, policies))


def resolve_baseline(baseline: str | None, policies: Sequence[Policy]) -> int | None:
    """The ``--baseline`` row: the index of the policy it names (as given: its NAME, path or
    label), ``len(policies)`` for ``behavior``; None without one. UsageError (one line)
    when it names no evaluated policy, or the only one."""
    if baseline is None:
        return None
    if baseline == BASELINE_BEHAVIOR:
        if any(BASELINE_BEHAVIOR in (p.name, p.label) for p in policies):
            raise UsageError(
                f"--baseline {BASELINE_BEHAVIOR} is ambiguous: a --policy is also called "
                f"{BASELINE_BEHAVIOR}; give it another NAME= (the baseline {BASELINE_BEHAVIOR} "
                "is the logging policy)"
            )
        return len(policies)
    rows = [  # its NAME, label or path, or another spelling of the path (./a.npz)
        row
        for row, policy in enumerate(policies)
        if baseline in (policy.name, policy.label, policy.source)
        or same_path(baseline, policy.source or policy.name)
    ]
    given = ", ".join(policy.label or policy.name for policy in policies)
    if len(rows) > 1:
        raise UsageError(
            f"--baseline {baseline} names {len(rows)} --policy values; name it by its label, "
            f"one of {given}"
        )
    if rows and len(policies) == 1:  # the run would compare nothing, and say nothing
        raise UsageError(
            f"--baseline {baseline} is the only --policy: there is nothing to compare with "
            f"it; add the policies to compare, or --baseline {BASELINE_BEHAVIOR} (the "
            "logging policy)"
        )
    if rows:
        return rows[0]
    raise UsageError(
        f"--baseline {baseline}: no --policy is called that; choose one of {given}, "
        f"or {BASELINE_BEHAVIOR} (the logging policy)"
    )


def baseline_name(baseline: str | None, policies: Sequence[Policy]) -> str | None:
    """The baseline as the report names it: ``behavior``, or the name of the policy
    ``--baseline`` names (``results[i].policy``), however it was spelled (a CSV and the
    ranking figure lost a baseline given as ./a.npz for a.npz); None without one."""
    row = resolve_baseline(baseline, policies)
    if row is None or row == len(policies):
        return None if row is None else BASELINE_BEHAVIOR
    return policies[row].name


def betting_does_not_apply(method: str, name: str) -> bool:
    """Whether intervals by ``method`` leave estimator ``name`` without one: betting, which
    does not apply to dm, dr and wdr."""
    return method == "betting" and get(name).betting is None


def interval_methods(estimators: Sequence[str], method: str, interval: str) -> dict[str, str]:
    """{estimator: the method of its paired intervals}: the run's ``method``, normal where
    ``--ci auto`` fell back to it (betting does not apply) or there are no replicates."""
    methods = {}
    for name in estimators:
        estimator = get(name)
        own = method
        if method == "betting" and estimator.betting is None and interval == "auto":
            own = "normal"
        elif method in BOOTSTRAP_METHODS and estimator.replicates is None:
            own = "normal"
        methods[name] = own
    return methods


def top_k_of(top_k: Sequence[int] | None, policies: int) -> tuple[int, ...]:
    """``--top-k``'s k (UsageError for one below 1 or above the policies with a true
    value); the default 1 and 3 keeps those at most ``policies``."""
    if top_k is None:
        return tuple(k for k in DEFAULT_TOP_K if k <= policies) or (1,)
    return check_top_k(top_k, policies)


def compare_results(
    results: Sequence[PolicyResult], pairing: Pairing, confidence: float
) -> tuple[list[PolicyResult], list[str]]:
    """(each result with its comparison against the baseline (every policy but the
    baseline, with one) and, with two or more policies, its could-be-best flags; a note
    per set that holds policies only because their difference from the best is not
    resolved, ``Pairing.unresolved``)."""
    estimators = list(results[0].estimates) if results else []
    sets, unresolved = {}, []
    if len(results) > 1:
        sets = {name: pairing.could_be_best(name, confidence) for name in estimators}
        for name in (name for name in estimators if sets[name] is not None):
            best, rows = pairing.unresolved(name)
            if rows:
                names = [results[k].shown for k in rows]
                option = "" if best == pairing.baseline else f" --baseline {results[best].shown}"
                note = unresolved_note(name, results[best].shown, names, pairing.precision, option)
                unresolved.append(note)
    out = []
    for row, result in enumerate(results):
        comparison = None
        if pairing.baseline is not None and row != pairing.baseline:
            comparison = {name: pairing.compare(row, name, confidence) for name in estimators}
        flags = {name: None if sets[name] is None else sets[name][row] for name in sets} or None
        out.append(dataclasses.replace(result, comparison=comparison, could_be_best=flags))
    return out, unresolved


def unresolved_note(
    name: str, best: str, policies: list[str], precision: str, baseline_option: str
) -> str:
    """The warning that ``policies`` stand in the could-be-best set by ``name`` only because
    their difference from ``best`` has no standard error (``Pairing.unresolved``) in a run
    of ``precision`` arithmetic; ``baseline_option``: the option that makes ``best`` the
    baseline (" --baseline NAME"), empty where it is."""
    listed = ", ".join(policies[:3]) + (f" and {len(policies) - 3:,} more" if policies[3:] else "")
    way_out = (
        f"--baseline {best} takes each policy's differences from it episode by episode, "
        "which resolves them."
        if precision == "float64"
        else f"--precision float64{baseline_option} resolves them."
    )
    return (
        f"the could-be-best set by {name} may be too large: {listed} "
        f"{'differs' if len(policies) == 1 else 'differ'} from the best, {best}, by less "
        f"than {precision} resolves the spread of their per-episode differences (no "
        f"standard error), so no comparison excluded them; {way_out}"
    )


def selection_of(
    results: Sequence[PolicyResult],
    truth: dict[str, float | None],
    keys: Sequence[str],
    baseline_key: str,
    top_k: Sequence[int] | None,
) -> tuple[dict, list[tuple[str | None, str]]]:
    """({estimator: selection metrics}, [(policy or None: the run, note)]) of the results
    against ``truth`` (keyed by ``keys``, one per result; ``baseline_key``: whose true value
    is sharpe@k's J_0)."""
    estimators = list(results[0].estimates)
    # a value of weights that are all zero is no estimate of the policy: it ranks with
    # nothing, so no selection metric counts it either
    estimates = {
        name: {key: estimated(r, name) for key, r in zip(keys, results, strict=True)}
        for name in estimators
    }
    intervals = {
        name: {
            key: (r.estimates[name].ci_low, r.estimates[name].ci_high)
            for key, r in zip(keys, results, strict=True)
        }
        for name in estimators
    }
    with_truth = sum(truth.get(key) is not None for key in keys)
    names = {key: r.shown for key, r in zip(keys, results, strict=True)}  # as the table's
    selection, notes = selection_by_estimator(
        {key: truth.get(key) for key in keys},
        estimates,
        intervals,
        baseline_value=truth.get(baseline_key),
        top_k=top_k_of(top_k, max(with_truth, 1)),
        names=names,
    )
    # a policy without a true value is that policy's warning (it was the run's, policy null)
    missing = [
        (r.policy, missing_truth_note({key: None}, names) + _no_sharpe(key, baseline_key))
        for key, r in zip(keys, results, strict=True)
        if truth.get(key) is None
    ]
    behavior = {} if baseline_key in keys else {baseline_key: truth.get(baseline_key)}
    run = missing_truth_note(behavior, names)
    return selection, missing + [(None, note) for note in ([run] if run else []) + notes]


def _no_sharpe(key: str, baseline_key: str) -> str:
    """What the baseline policy's missing true value also leaves out: sharpe@k, measured
    from it (null without a word; the behavior baseline's note said so)."""
    return "; as the baseline, no sharpe@k" if key == baseline_key else ""


def truth_keys(policies: Sequence[Policy]) -> list[str]:
    """How ``--truth`` names each policy: its path (the NAME=PATH's PATH), else its name."""
    return [policy.source or policy.name for policy in policies]


def read_run_truth(
    truth: str | None, top_k: Sequence[int] | None, policies: Sequence[Policy]
) -> dict[str, float | None] | None:
    """``--truth``'s value of each policy (and of ``behavior``), checked with ``--top-k``
    before the data is read; None without ``--truth``. UsageError (one line)."""
    if truth is None:
        if top_k is not None:
            raise UsageError("--top-k needs --truth FILE (the policies' true values)")
        return None
    keys = truth_keys(policies)
    labels = {p.name: key for p, key in zip(policies, keys, strict=True) if p.source}
    values = read_truth(truth, [*keys, BASELINE_BEHAVIOR], labels)
    top_k_of(top_k, max(sum(values[key] is not None for key in keys), 1))
    return values
