"""What a report warns about, once for every format: the table's footer prints the messages,
JSON lists them as ``"warnings": [{"code", "message", "policy"}]`` and CSV in a ``warnings``
column, so a script learns what a person reading the table would.

``policy`` is the policy's name as in ``results[i].policy``, or None for the whole run.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from ope_cli.choosing.comparison import best_set_replicates, betting_does_not_apply
from ope_cli.choosing.selection import bonferroni_level, equal_to_rounding
from ope_cli.estimation.estimators import get as get_estimator
from ope_cli.estimation.estimators.base import and_list, title
from ope_cli.estimation.estimators.importance import UNDERFLOW, ZERO_NOTES
from ope_cli.estimation.run_plan import GAMMA_DEFAULT, default_gamma_message
from ope_cli.models.behavior import ESTIMATED_BEHAVIOR_OFF
from ope_cli.models.q_models.base import (
    DM_TAKES_Q_AS_EXACT,
    FITTED_Q_INTERVALS,  # dm, dr, wdr's intervals leave out the fit's error
    Q_FIT_NOT_CONVERGED,
    Q_UNLOGGED_ACTIONS,  # pi_e's mass on actions a fitted Q-hat gives 0
    unconverged_message,
    unlogged_warning,
)
from ope_cli.report.formatting import discount, fixed, percent, significant
from ope_cli.results import NO_MAGNITUDE, EvaluationResult, PolicyResult

# Thresholds on the trajectory-weight diagnostics.
ESS_FRACTION_WARNING = 0.1  # fewer effective episodes than this share of n
MAX_SHARE_WARNING = 0.5  # one episode holds more than this share of the total weight
MEAN_WEIGHT_RANGE = (0.5, 2.0)  # the mean weight is 1 in expectation when propensities are right
# ... and a mean weight this many of its standard errors above 1, and 5% or more, says the
# same: heavy tails pull a sample mean below 1 with a standard error too small, but a mean
# above 1 comes from large weights, which widen it (right propensities on generated data
# of every environment: at most 1.4; a fitted model missing the behavior's spread: 1.945,
# 31, inside MEAN_WEIGHT_RANGE)
MEAN_WEIGHT_ABOVE = (4.0, 1.05)
# ... or this many standard errors below 1, and 5% or more, with light tails (an effective
# sample size of at least this share of the episodes, where heavy tails cannot be what
# pulls it down): the policy puts probability where the logs have (almost) none, whose
# value no importance weight sees (an action never logged in a state: IS 0.283 +- 0.005,
# mean weight 0.69, ESS 97%, where the truth is 0.59, with nothing said)
MEAN_WEIGHT_BELOW = (4.0, 0.95, 0.5)
# The discount matters once an episode has a second step: a return then sums rewards at
# different times, and gamma = 1 weighs the last as much as the first.
GAMMA_MATTERS_FROM_STEPS = 2

# Codes of run-wide warnings (policy None) and of per-policy ones.
GAMMA_REPLACED = "gamma_not_the_data_s"  # --gamma other than the discount the data declares
ASYMPTOTIC_INTERVALS = "asymptotic_intervals"
BETTING_FITTED_BEHAVIOR = "betting_with_estimated_behavior"
FLOORED_PROPENSITIES = "floored_propensities"
NO_WEIGHT = "all_weights_zero"
ACTIONS_UNCHECKED = "actions_unchecked"
LOW_ESS = "low_ess"
ONE_EPISODE_DOMINATES = "one_episode_dominates"
WEIGHTS_OVERFLOW = "weights_overflow"
MEAN_WEIGHT_OFF = "mean_weight_far_from_one"
ZERO_WIDTH = "zero_width_interval"
OUTSIDE = "estimate_outside_interval"  # an interval not centred on its estimate excludes it
# An estimate this many standard errors (combined) from the one the logged propensities
# give: on generated data of every environment, in-sample fits of the right model moved
# every estimator by 0.74 at most; models that could not represent the behavior (its
# choice, or its spread, driven by |x|) by 3.5 to 21
BEHAVIOR_GAP_STANDARD_ERRORS = 3.0
DM_FAR_FROM_DR = "dm_far_from_dr"
# dm's interval from a Q-hat not known to be exact (a checkpoint, an entry point, critic
# columns): it takes Q-hat as exact (--q fit's case is FITTED_Q_INTERVALS)
DM_Q_AS_EXACT = "dm_takes_q_as_exact"
# DM further than this many of DR's standard errors from DR: Q-hat is likely biased
DM_DR_STANDARD_ERRORS = 3.0
Q_MISMATCH = "q_mismatch"  # dr, wdr given a Q of another policy or discount
NOT_RANKED = "not_ranked"
NO_BEST_SET = "could_be_best_undetermined"  # too few replicates for the set's level
UNRESOLVED_BEST_SET = "could_be_best_unresolved"  # a set held policies nothing could exclude
SELECTION = "selection"  # a selection metric left out or undefined (--truth)
DROPPED = "dropped_invalid_episodes"  # --on-invalid drop left episodes out
FLOAT32_RANGE = "float32_range"  # float32 arithmetic on data it cannot hold to 1e-4
# float32 keeps 7 digits: logits of observations from 1e4 on lose 1e-4 and more of a
# weight to rounding (a QA run: 1e6 -> IS 6% off); rewards and critic values from 1e4 on
# lose their spread (rewards 1e6 + U(0, 1): WPDIS's standard error 2% off; V-hat 1e4 +
# N(0, 1): dm's 71%); products of weights and rewards below about 1e-30 underflow to 0
FLOAT32_VALUE_MAGNITUDE, FLOAT32_SMALL_MAGNITUDE = 4, 30
# rewards (or episode returns, or an observation's feature) whose size is this many digits
# above their standard deviation: float32 (7 digits) resolves their differences to 1e-3 at
# best (a QA run: rewards 9000 + N(0, 0.01), 5 digits: WPDIS's standard error 26% off;
# returns 2.7e8 +- 67, 6 digits: WIS's 19%; observations 5000 + U(0, 1), 4 digits: a
# linear Q fit's dm 57 standard errors off, at 1000 + U(0, 1) 0.1); integer returns of
# -1000 +- 0.5 (3 digits) are exact
FLOAT32_SPREAD_DIGITS = 4
FLOAT64_RANGE = "float64_range"  # values at float64's edges, which the kernel can lose
# XLA on CPU flushes values below float64's smallest normal number to zero: a weight (far
# below the batch's largest) or a discount gamma^t that small times a reward, return or
# Q-hat near float64's largest loses its term (a QA run: WIS 1.0 for 1.738, IS 3.4e-301
# for 3.4e-21), and subnormal rewards count as 0
FLOAT64_SMALLEST_NORMAL = float(np.finfo(np.float64).tiny)  # 2.2e-308
# what an estimate can lose is said where it exceeds this share of the estimate (or of its
# standard error) and this much in all: far below any value a reader tells from 0
FLOAT64_LOSS_SHARE, FLOAT64_LOSS_FLOOR = 1e-9, 1e-290
# an estimate of exactly 0 with no spread is named where the lost terms can add up to this:
# every term flushed (rewards of 1e300 where 0.01^t < 1e-308: IS 0.0 for 1e-10), not every
# weight 0 (rewards of 1e20 on episodes the policy never takes: a bound of 4e-285)
FLOAT64_ZERO_LOSS = 1e-100


@dataclasses.dataclass(frozen=True)
class Warning:  # noqa: A001 - the report's word; the builtin is not used here
    """One warning: a stable ``code`` for scripts, the ``message`` a person reads, and the
    ``policy`` it concerns (None: the whole run)."""

    code: str
    message: str
    policy: str | None = None

    def to_dict(self) -> dict[str, str | None]:
        return {"code": self.code, "message": self.message, "policy": self.policy}


def ess_count(ess: float | None, episodes: int) -> str:
    """The effective sample size to one decimal, never rounded onto or across the warning's
    threshold (ESS_FRACTION_WARNING of the episodes)."""
    return fixed(ess, 1, limit=ESS_FRACTION_WARNING * episodes)


def underflowed(d, weight: float | None) -> str | None:
    """The cell of a mean or largest weight of 0 beside weights that are not all zero
    ("< 5e-324"): they underflow float64 (the table showed 0, beside "zero weights 0.0%")."""
    if weight == 0 and d.zero_weight_fraction is not None and d.zero_weight_fraction < 1:
        return f"< {np.finfo(np.float64).smallest_subnormal:.0e}"
    return None


def mean_weight(value: float | None, digits: int) -> str:
    """The mean weight to ``digits`` significant digits, never rounded onto or across the
    nearer end of MEAN_WEIGHT_RANGE (0.49996 was "0.5, far from 1")."""
    low, high = MEAN_WEIGHT_RANGE
    nearer = None if value is None else (low if value < math.sqrt(low * high) else high)
    return significant(value, digits, limit=nearer)


def policy_warnings(
    policy: PolicyResult, episodes: int, propensities: str = "given"
) -> list[Warning]:
    """Warnings about one policy's trajectory weights, in plain words; ``propensities``:
    where the behavior probabilities come from (``propensity_source``)."""
    d, name = policy.diagnostics, policy.policy

    def warn(code: str, text: str) -> Warning:
        return Warning(code, f"{name}: {text}", name)

    if d.zero_weight_fraction == 1.0:
        return [
            warn(
                NO_WEIGHT,
                "every trajectory weight is zero: the policy gives probability 0 to a logged "
                "action in every episode, so these logs say nothing about it.",
            )
        ]
    warnings = []
    if not policy.actions_checked:
        warnings.append(warn(ACTIONS_UNCHECKED, unchecked_actions_message("this entry point")))
    if d.ess_fraction is not None and d.ess_fraction < ESS_FRACTION_WARNING:
        warnings.append(
            warn(
                LOW_ESS,
                f"the effective sample size is {ess_count(d.ess, episodes)} of {episodes:,} "
                f"episodes ({percent(d.ess_fraction, 1, limit=ESS_FRACTION_WARNING)}): the "
                "estimates rest on a few heavily weighted "
                "episodes; the policy is probably too far from the behavior policy for "
                "these logs (expect wide or overconfident intervals).",
            )
        )
    if d.max_weight_share is not None and d.max_weight_share > MAX_SHARE_WARNING:
        warnings.append(
            warn(
                ONE_EPISODE_DOMINATES,
                f"one episode holds {percent(d.max_weight_share, 0, limit=MAX_SHARE_WARNING)} "
                f"of the total weight: {_dominated(policy)}",
            )
        )
    warnings.extend(_mean_weight_warnings(policy, episodes, propensities, warn))
    warnings.extend(_zero_width_warnings(policy, episodes, warn))
    warnings.extend(_outside_warnings(policy, warn))
    warnings.extend(_model_warnings(policy, warn))
    return warnings


def _outside_warnings(policy: PolicyResult, warn) -> list[Warning]:
    """Estimates outside their own interval. A betting interval is a confidence set for the
    value made from the rewards' bounds, one for the estimators that share its variables
    (is and wis, say); a percentile interval is the replicates' quantiles: neither is
    centred on the estimate, and on heavy weights IS can land outside it (1.029 against
    [0.5192, 1.017] on generated data), which the table showed without a word."""
    names = [
        name
        for name, e in policy.estimates.items()
        if None not in (e.value, e.ci_low, e.ci_high) and not e.ci_low <= e.value <= e.ci_high
    ]
    if not names:
        return []
    methods = sorted({policy.ci_methods.get(name) or "" for name in names})
    why = "; ".join(f"{m}: {UNCENTRED.get(m, 'not centred on it')}" for m in methods)
    return [
        warn(
            OUTSIDE,
            f"{', '.join(names)}: the estimate lies outside its own interval, which is not "
            f"centred on it ({why}); heavy weights have thrown the estimate far from where "
            "the interval puts the value: read the interval, not the point.",
        )
    ]


# why an interval method's interval need not contain its estimate
UNCENTRED = {
    "betting": "a confidence set for the value from the rewards' bounds, shared by the estimators",
    "percentile": "the bootstrap replicates' quantiles",
    "bootstrap-t": "the studentized replicates' quantiles",
}


def _model_warnings(policy: PolicyResult, warn) -> list[Warning]:
    """A fitted Q-hat that did not converge, and DM far from DR: DR corrects Q-hat with the
    logged rewards and stays unbiased when Q-hat is wrong, DM does not, and DM's interval
    counts only its sampling spread, so a biased Q-hat gives DM a narrow interval around
    the wrong value."""
    warnings = _unconverged_fit_warnings(policy, warn) + _dm_far_from_dr_warnings(policy, warn)
    unlogged = unlogged_warning(policy.q.fit if policy.q is not None else None)
    if unlogged is not None:
        warnings.append(warn(Q_UNLOGGED_ACTIONS, unlogged))
    if policy.q is not None and policy.q.mismatch is not None:
        warnings.append(
            warn(
                Q_MISMATCH,
                f"{policy.q.mismatch}. dr and wdr stay unbiased with any Q-hat, so it is "
                "used, but their variance is not the one this policy's own Q-hat gives.",
            )
        )
    return warnings


def _unconverged_fit_warnings(policy: PolicyResult, warn) -> list[Warning]:
    fit = policy.q.fit if policy.q is not None else None
    converged = (fit or {}).get("converged")
    if converged is None or all(converged if isinstance(converged, list) else [converged]):
        return []
    iterations = fit.get("iterations")
    ran = max(iterations) if isinstance(iterations, list) else iterations
    discrete = policy.q.kind != "mlp_q_sa"
    message = unconverged_message(fit.get("model"), ran, discrete, "--q fit:linear")
    return [warn(Q_FIT_NOT_CONVERGED, message)]


def _dm_far_from_dr_warnings(policy: PolicyResult, warn) -> list[Warning]:
    """dm more than DM_DR_STANDARD_ERRORS of dr's standard errors from dr; with a standard
    error of 0 (every return the same), any dm that is not dr to rounding is (dm 5.0 +- 0
    against dr 1.0 +- 0 said nothing)."""
    dm, dr = policy.estimates.get("dm"), policy.estimates.get("dr")
    if dm is None or dr is None or None in (dm.value, dr.value, dr.stderr):
        return []
    if dr.stderr > 0:
        distance = abs(dm.value - dr.value) / dr.stderr
        if distance <= DM_DR_STANDARD_ERRORS:
            return []
        # never rounded onto the threshold: 3.01 read "3 of dr's standard errors"
        shown = (
            f"{distance:,.0f}"
            if distance >= 100
            else significant(distance, 2, limit=DM_DR_STANDARD_ERRORS)
        )
        how_far = f"dm is {shown} of dr's standard errors from dr"
    elif not equal_to_rounding(dm.value, dr.value):
        how_far = f"dm is {dm.value:.4g} where dr is {dr.value:.4g}, with a standard error of 0"
    else:
        return []
    return [
        warn(
            DM_FAR_FROM_DR,
            f"{how_far}: Q-hat is probably biased for this policy, and dm's interval, which "
            "counts only its sampling spread, does not cover that; prefer dr or wdr, or a "
            "better Q model.",
        )
    ]


def _no_spread(policy: PolicyResult, names: list[str], episodes: int) -> str:
    message = (
        f"{', '.join(names)}: the interval has no width: the standard error is 0, as the "
        f"{episodes:,} episodes show no spread in these values (each gives the same value, "
        "or one episode holds all the weight). That is not a certain value; more episodes "
        "(or --horizon STEPS, for betting intervals where they apply) give an honest "
        "interval."
    )
    notes = {n: policy.estimates[n].note or "" for n in names}
    lost = [n for n in names if notes[n].startswith(tuple(ZERO_NOTES))]
    if lost:
        precision = next(p for note, p in ZERO_NOTES.items() if notes[lost[0]].startswith(note))
        message += (
            f" For {', '.join(lost)}, {precision} may also have lost a spread: their values "
            "share a constant far larger than it (in every reward, say); subtracting it "
            "from the rewards shows whether there is one."
        )
    return message


def _zero_width_warnings(policy: PolicyResult, episodes: int, warn) -> list[Warning]:
    """Intervals of no width from two episodes or more: every episode gave the same value
    (all returns 0, a Q-hat of 0 everywhere) or one episode holds all the weight, so the
    standard error is 0 and the interval states a certainty that a sample cannot give.
    Where an estimate's standard error is 0 only to the run's precision (its note says
    so), a constant far above the values' spread may also have hidden that spread; where
    its values are below float64's range (UNDERFLOW), that is the reason, not the spread."""
    if episodes < 2:
        return []
    names = [
        name
        for name, e in policy.estimates.items()
        if e.ci_low is not None and e.ci_high is not None and e.ci_low == e.ci_high
    ]
    below = [n for n in names if policy.estimates[n].note == UNDERFLOW]
    names = [n for n in names if n not in below]
    parts = []
    if below:
        parts.append(
            f"{', '.join(below)}: the interval has no width because the values are below "
            "float64's range (every weight underflows): 0 is them to float64's precision, "
            "not a certainty."
        )
    if names:
        parts.append(_no_spread(policy, names, episodes))
    if not parts:
        return []
    message = " ".join(parts)
    return [warn(ZERO_WIDTH, message)]


# MEAN_WEIGHT_ABOVE's bar where the propensities were fitted out-of-fold, which raise the
# mean weight on their own (Jensen's inequality: the right model on 1,000 bandit episodes,
# 3 folds, gave 1.10, 4.5 standard errors above 1; one missing the behavior's spread 1.946,
# 31)
MEAN_WEIGHT_ABOVE_OUT_OF_FOLD = (10.0, 1.2)


def mean_weight_off(d, episodes: int, propensities: str = "given") -> str | None:
    """How the mean weight of diagnostics ``d`` is off, in words, or None: "far from 1"
    (outside MEAN_WEIGHT_RANGE), or "N standard errors above 1" (MEAN_WEIGHT_ABOVE, or
    MEAN_WEIGHT_ABOVE_OUT_OF_FOLD for ``propensities`` "out_of_fold":
    ``propensity_source``)."""
    if d.mean_weight is None:
        return None
    low, high = MEAN_WEIGHT_RANGE
    if not low <= d.mean_weight <= high:
        return "far from 1"
    above = _standard_errors_above_one(d.mean_weight, d.ess, episodes)
    if above is None:
        return None
    if above < 0:
        return _below_one(d, -above)
    bar = MEAN_WEIGHT_ABOVE_OUT_OF_FOLD if propensities == "out_of_fold" else MEAN_WEIGHT_ABOVE
    if above <= bar[0] or d.mean_weight < bar[1]:
        return None
    if math.isinf(above):
        return "above 1 in every episode alike (the weights have no spread)"
    return f"{_errors(above, bar[0])} standard errors above 1"


def _errors(count: float, limit: float) -> str:
    """A count of standard errors to 2 significant digits, never rounded onto ``limit``,
    written out from 100 on (320 and 7,400, not 3.2e+02 and 7.4e+03)."""
    if float(format(count, ".2g")) < 100:
        return significant(count, 2, limit=limit)
    return f"{round(count, 1 - math.floor(math.log10(count))):,.0f}"


def _below_one(d, below: float) -> str | None:
    """How a mean weight ``below`` of its standard errors under 1 is off, where MEAN_WEIGHT_BELOW
    says so (light tails), else None."""
    bar, at_most, light = MEAN_WEIGHT_BELOW
    if below <= bar or d.mean_weight > at_most or not (d.ess_fraction or 0.0) >= light:
        return None
    if math.isinf(below):
        return "below 1 in every episode alike (the weights have no spread)"
    return f"{_errors(below, bar)} standard errors below 1"


def propensity_source(result: EvaluationResult) -> str:
    """Where the run's propensities come from, as the mean weight's warning reads them:
    "given" (a logged column, a --behavior policy), "estimated" (--behavior estimate, in
    sample) or "out_of_fold" (--behavior-cross-fit K > 1)."""
    fit = result.behavior.fit if result.behavior is not None else None
    if fit is None:
        return "given"
    return "estimated" if fit.cross_fit == 1 else "out_of_fold"


# what to check where the mean weight is off, by where the propensities come from
_CHECK_PROPENSITIES = {
    "given": "check that the behavior probabilities are those of the logged actions (not "
    "log-probabilities, not of another action) and that the policy sees the observations "
    "it was trained on",
    "estimated": "check the estimated behavior model (with few episodes it fits their "
    "noise: a linear softmax on 30 bandit episodes gave 0.16 to 0.31; or it misses what the "
    "behavior depends on) and that the policy sees the observations it was trained on",
}
_CHECK_PROPENSITIES["out_of_fold"] = (
    _CHECK_PROPENSITIES["estimated"] + " (out-of-fold probabilities, --behavior-cross-fit, "
    "raise it too, though rarely this far)"
)


def _dominated(policy: PolicyResult) -> str:
    """What one dominating episode is all of, among the estimates ``policy`` reports: WIS
    and WPDIS divide by the sum of the weights, so they are its return; WDR is the
    direct method's average over every episode plus weighted corrections, so only its
    correction is that episode's."""
    titles = [title(name) for name in ("wis", "wpdis") if name in policy.estimates]
    said = (
        f"{and_list(titles)} {'is' if len(titles) == 1 else 'are'} essentially that single "
        "episode's return"
        if titles
        else "the self-normalised estimates are essentially that single episode's return"
    )
    if "wdr" in policy.estimates:
        said += f", and {title('wdr')}'s correction to the Q-hat estimate is that episode's"
    return said + "."


def _mean_weight_warnings(
    policy: PolicyResult, episodes: int, propensities: str, warn
) -> list[Warning]:
    d = policy.diagnostics
    if d.mean_weight is None:
        return [
            warn(
                WEIGHTS_OVERFLOW,
                "the trajectory weights overflow float64: the policy and the behavior "
                "probabilities disagree by orders of magnitude.",
            )
        ]
    how_far = mean_weight_off(d, episodes, propensities)
    if how_far is None:
        return []
    low, high = MEAN_WEIGHT_RANGE
    also = ""
    if not low <= d.mean_weight <= high:  # outside the range, heavy tails can also cause it
        also = "; with very heavy-tailed weights, too few episodes can also cause it"
    elif d.mean_weight < 1.0:  # below 1 with light tails (``_below_one``)
        also = (
            f"; or, as the weights seen are light-tailed (an effective sample size of "
            f"{significant(100 * d.ess_fraction, 3)}% of the episodes), the policy puts about "
            f"{significant(100 * (1.0 - d.mean_weight), 2)}% of its probability where the "
            "logs have (almost) none (actions the behavior never or rarely takes there, "
            "whose large weights these episodes do not show), whose value no "
            "importance-weighted estimate sees"
        )
    return [
        warn(
            MEAN_WEIGHT_OFF,
            f"the mean weight is {underflowed(d, d.mean_weight) or mean_weight(d.mean_weight, 3)}, "
            f"{how_far} (its expected "
            f"value when the behavior probabilities are right): "
            f"{_CHECK_PROPENSITIES[propensities]}{also}.",
        )
    ]


def _standard_errors_above_one(mean: float, ess: float | None, episodes: int) -> float | None:
    """(mean - 1) over the mean weight's standard error, which the effective sample size
    gives (sum w^2 / n = mean^2 n / ess); None without one."""
    if ess is None or not ess > 0 or episodes < 2:
        return None
    spread = mean * math.sqrt(max(episodes / ess - 1.0, 0.0) / (episodes - 1))
    if spread > 0:
        return (mean - 1.0) / spread
    # every weight the same: a mean off 1 is exact, not noise (200 weights of 1.5 were
    # not warned of, where 1.5 +- 0.001 were: 7,400 standard errors above 1)
    return math.inf if mean > 1.0 else -math.inf if mean < 1.0 else None


def gamma_warning(result: EvaluationResult) -> Warning | None:
    """gamma = 1 by default (neither --gamma nor the data gave one) on episodes long enough
    for the discount to change their returns."""
    return default_gamma_warning(result.gamma_source, result.dataset.max_length)


def default_gamma_warning(gamma_source: str, longest: int) -> Warning | None:
    """``gamma_warning`` of a run whose discount comes from ``gamma_source`` and whose
    longest episode has ``longest`` steps (evaluate's, inspect's)."""
    if gamma_source != "default" or longest < GAMMA_MATTERS_FROM_STEPS:
        return None
    return Warning(
        GAMMA_DEFAULT,
        default_gamma_message(
            f"returns of up to {longest:,} steps are summed undiscounted", "the policies are"
        ),
    )


def replaced_gamma(result: EvaluationResult) -> float | None:
    """The discount the data declares where --gamma gave another, else None."""
    return _replaced(result.gamma, result.gamma_source, result.declared_gamma)


def _replaced(gamma: float, gamma_source: str, declared: float | None) -> float | None:
    if gamma_source != "option" or declared is None or declared == gamma:
        return None
    return declared


def unchecked_actions_message(whose: str) -> str:
    return (
        f"the logged actions are not checked against {whose}'s action count (it declares "
        "no n_actions attribute): an action beyond its range would be clamped to the last "
        "one, not reported."
    )


def behavior_actions_warning(result: EvaluationResult) -> Warning | None:
    """A --behavior entry point that declares no n_actions, as an evaluation policy's
    ACTIONS_UNCHECKED: its log pi_b of an action past its range is its last action's (a
    logged action 7 of a 3-action policy gave is 3.735 with no word)."""
    if result.behavior is None or result.behavior.actions_checked:
        return None
    return Warning(
        ACTIONS_UNCHECKED,
        unchecked_actions_message(f"the --behavior entry point {result.behavior.name}"),
    )


def gamma_replaced_warning(result: EvaluationResult) -> Warning | None:
    """--gamma other than the discount the data declares: the option wins, as documented,
    and every format says which one the numbers are for (the title line alone named
    --gamma, not the 0.95 it replaced)."""
    return replaced_gamma_warning(
        result.gamma, result.gamma_source, result.declared_gamma, "the estimates are of returns"
    )


def replaced_gamma_warning(
    gamma: float, gamma_source: str, declared: float | None, numbers: str
) -> Warning | None:
    """GAMMA_REPLACED of any command whose ``numbers`` (what they are of) are discounted by
    ``gamma``, from ``gamma_source``, where the data declares ``declared`` (fit-q and inspect
    said nothing of a --gamma that replaced it, evaluate did)."""
    if _replaced(gamma, gamma_source, declared) is None:
        return None
    return Warning(
        GAMMA_REPLACED,
        f"gamma is {discount(gamma)} (--gamma), not the {discount(declared)} the data "
        f"declares: {numbers} discounted by {discount(gamma)}; leave out --gamma for the "
        "data's own.",
    )


def asymptotic_warning(result: EvaluationResult) -> Warning | None:
    """Intervals that rest on a normal approximation or a bootstrap (not finite-sample):
    the run's method, or under betting the estimators betting does not apply to."""
    if result.confidence.interval != "betting":
        return Warning(ASYMPTOTIC_INTERVALS, f"intervals: {result.confidence.method}")
    methods = {n: m for p in result.results for n, m in p.ci_methods.items() if m}
    asymptotic = [name for name, method in methods.items() if method != "betting"]
    if not asymptotic:
        return None
    return Warning(
        ASYMPTOTIC_INTERVALS,
        f"{', '.join(asymptotic)}: normal intervals (asymptotic: they may cover less often "
        "than stated), as betting intervals do not apply to these estimators",
    )


def fitted_betting_warning(result: EvaluationResult) -> Warning | None:
    """Betting intervals on behavior probabilities fitted in the run: their finite-sample
    guarantee assumes the true ones (the table's intervals line said so; JSON and CSV
    only in ``confidence.method``, where normal intervals are warned of in every format)."""
    fit = result.behavior.fit if result.behavior is not None else None
    if fit is None or result.confidence.interval != "betting":
        return None
    return Warning(
        BETTING_FITTED_BEHAVIOR,
        "betting intervals: their finite-sample guarantee assumes the true behavior "
        f"probabilities; --behavior estimate fitted them ({fit.model}), so it holds only as "
        "far as the fit does.",
    )


def floored_warning(result: EvaluationResult) -> Warning | None:
    """--behavior estimate raised estimated probabilities to --min-propensity."""
    fit = result.behavior.fit if result.behavior is not None else None
    if fit is None or not fit.floored:
        return None
    return Warning(
        FLOORED_PROPENSITIES,
        f"{fit.floored:,} estimated behavior probabilities were below --min-propensity "
        f"{fit.min_propensity:g} and raised to it: the weights of those steps are capped.",
    )


def behavior_fit_warning(result: EvaluationResult) -> Warning | None:
    """--behavior estimate's iterative fit stopped by its step cap, short of its optimum."""
    fit = result.behavior.fit if result.behavior is not None else None
    if fit is None or fit.stopped_short is None:
        return None
    from ope_cli.models.behavior_models.base import BEHAVIOR_FIT_NOT_CONVERGED
    from ope_cli.models.behavior_models.softmax import stopped_short_message

    message = stopped_short_message(fit.model, fit.stopped_short)
    return Warning(BEHAVIOR_FIT_NOT_CONVERGED, message)


def behavior_overfit_warning(result: EvaluationResult) -> Warning | None:
    """--behavior estimate:mlp_softmax fitted in sample scores far worse on held-out
    episodes than on those it was fitted on (600 bandit episodes: every IS interval 28%
    low, with nothing said; ``ope fit-behavior`` warned of the same fit), or could not be
    scored so (the held-out fifth or the rest had no episode: it said nothing)."""
    fit = result.behavior.fit if result.behavior is not None else None
    if fit is None:
        return None
    from ope_cli.models.behavior_models.command import (
        BEHAVIOR_FIT_OVERFITS,
        BEHAVIOR_FIT_UNCHECKED,
        overfit_message,
        unchecked_message,
    )
    from ope_cli.models.behavior_models.fitting import HELD_OUT_MODELS

    if fit.heldout_mean_log_likelihood is None:  # scored only in sample: a fold held none
        scored = fit.model in HELD_OUT_MODELS and fit.cross_fit == 1
        message = unchecked_message(fit.model, fit.episodes, None) if scored else None
        return None if message is None else Warning(BEHAVIOR_FIT_UNCHECKED, message)
    message = overfit_message(fit.model, fit.mean_log_likelihood, fit.heldout_mean_log_likelihood)
    return None if message is None else Warning(BEHAVIOR_FIT_OVERFITS, message)


def estimated_behavior_warnings(result: EvaluationResult) -> list[Warning]:
    """--behavior estimate on data that also logs propensities, where an estimate moves
    more than BEHAVIOR_GAP_STANDARD_ERRORS from the one the logged column gives: the model
    cannot represent the behavior (or the column is wrong), and the intervals, which
    take the model as exact, do not show it (IS 0.064 +- 0.011 against 0.498 +- 0.012,
    the truth 0.5, with nothing said; the mean weight was 1.00 under both)."""
    fit = result.behavior.fit if result.behavior is not None else None
    if fit is None or not fit.logged_gap:
        return []
    warnings = []
    for policy, gap in fit.logged_gap.items():
        if gap is None or gap["standard_errors"] <= BEHAVIOR_GAP_STANDARD_ERRORS:
            continue
        mine, theirs = gap["estimated"], gap["logged"]
        apart = significant(gap["standard_errors"], 2, limit=BEHAVIOR_GAP_STANDARD_ERRORS)
        warnings.append(
            Warning(
                ESTIMATED_BEHAVIOR_OFF,
                f"{policy}: {gap['estimator']} is {significant(mine['value'], 4)} (standard "
                f"error {significant(mine['stderr'], 2)}) with the estimated behavior model "
                f"({fit.model}) and {significant(theirs['value'], 4)} "
                f"({significant(theirs['stderr'], 2)}) with the logged column "
                f"{fit.logged_column!r}, {apart} standard errors apart: "
                f"{_why_apart(fit.cross_fit, gap['standard_errors'])}",
                policy,
            )
        )
    return warnings


# Gaps of the out-of-fold estimates below this many standard errors may be the folds' own
# noise (the right model on 100 chain episodes, 3 folds: 3.5); far beyond it, the model
# (one missing the behavior's spread, cross-fitted: 21 and 14,000)
FOLD_NOISE_STANDARD_ERRORS = 10.0


def _why_apart(folds: int, standard_errors: float) -> str:
    """What an estimate far from the logged column's says: the model misses what the
    behavior depends on; or, fitted out-of-fold and a modest gap, possibly the noise of
    each fold's model, fitted on fewer episodes, which neither side's standard error
    counts."""
    missing = (
        "the model misses what the behavior depends on (or the column is wrong), and the "
        "intervals, which take the model as exact, do not show it."
    )
    if folds == 1 or standard_errors >= FOLD_NOISE_STANDARD_ERRORS:
        return (
            f"{missing} `ope fit-behavior` compares the two step by step; try another model "
            "(--behavior estimate:MODEL), or leave out --behavior if the column is right."
        )
    return (
        f"each fold's model (--behavior-cross-fit {folds}) is fitted on the other folds' "
        "episodes, and with few of them its own noise, which no standard error here counts, "
        "can move the estimates this far (--behavior-cross-fit 1 shows whether it does); "
        f"else {missing}"
    )


def fitted_q_warnings(result: EvaluationResult) -> list[Warning]:
    """The intervals of the estimators that read a fitted Q-hat (--q fit) leave out the
    fit's own error (coverage studies on ``ope generate chain``, 100 datasets of 300
    episodes each: dm's 95% interval covered the truth 2-37% of the time, dr's and wdr's
    65-85% where heavy weights met a poor fit, 90-96% elsewhere). One warning for the run
    where every policy's Q-hat is fitted, else one per policy whose Q-hat is (a run-wide
    one sat on the rows of a policy given an exact checkpoint)."""
    fitted = [p for p in result.results if p.q is not None and p.q.fit is not None]
    reading = [name for name in result.estimators if get_estimator(name).needs]
    if not reading:
        return []
    return _run_or_each(result, fitted, lambda _, policy: _fitted_q(reading, policy))


def _run_or_each(result: EvaluationResult, concerned: list, warning) -> list[Warning]:
    """``warning(policies, policy name or None)`` once for the run where every policy is
    ``concerned``, else once per concerned policy: a run-wide warning sits on every
    policy's rows (CSV), those of policies it does not concern too."""
    if concerned and len(concerned) == len(result.results):
        return [warning(concerned, None)]
    return [warning([p], p.policy) for p in concerned]


def _fitted_q(reading: list[str], policy: str | None = None) -> Warning:
    said = []
    if "dm" in reading:
        said.append(f"dm's {DM_TAKES_Q_AS_EXACT}")
    corrected = [f"{name}'s" for name in reading if name != "dm"]
    if corrected:
        said.append(
            f"{' and '.join(corrected)} correct Q-hat with the logged rewards but can cover "
            "less often than stated"
        )
    return Warning(
        FITTED_Q_INTERVALS,
        ("" if policy is None else f"{policy}: ")
        + f"{', '.join(reading)} read a fitted Q-hat (--q fit), and their intervals leave "
        f"out the fit's own error: {'; '.join(said)}.",
        policy,
    )


def dm_q_as_exact_warnings(result: EvaluationResult) -> list[Warning]:
    """dm's interval from a Q-hat that is not fitted in the run (whose warning is
    FITTED_Q_INTERVALS) and not marked exact (``ope generate``'s checkpoints are): it
    counts the spread of V-hat over the logged start states alone (a control log with a
    checkpoint of ``ope fit-q``: dm 9.268 in [9.257, 9.278], truth 6.08, nothing said).
    One warning for the run where every policy reads such a Q, else one per policy that
    does (a run-wide one sat on the rows of a policy whose Q is exact)."""
    if "dm" not in result.estimators:
        return []
    taking = [
        p for p in result.results if p.q is not None and p.q.source != "fit" and not p.q.exact
    ]
    return _run_or_each(
        result, taking, lambda ps, policy: _dm_q_as_exact(sorted({p.q.name for p in ps}), policy)
    )


def _dm_q_as_exact(taken: list[str], policy: str | None = None) -> Warning:
    named = and_list(taken) if len(taken) <= 3 else f"{len(taken)} Q sources"
    return Warning(
        DM_Q_AS_EXACT,
        ("" if policy is None else f"{policy}: ")
        + f"dm's interval takes Q-hat ({named}) as exact: it counts only the spread of V-hat "
        "over the logged start states, not Q-hat's own error, so it can be narrow around a "
        "biased value; dr and wdr correct Q-hat with the logged rewards (with them, a dm far "
        "from dr is warned of).",
        policy,
    )


def best_set_warning(result: EvaluationResult) -> Warning | None:
    """The could-be-best sets left undetermined: under ``--ci betting`` the estimators
    betting does not apply to have no paired intervals (``Pairing.has_intervals``); else
    their Bonferroni-level comparisons need more bootstrap replicates than were drawn
    (``Pairing.replicates_too_few``)."""
    flags = [p.could_be_best or {} for p in result.results]
    undetermined = [
        name for name in result.estimators if any(f.get(name, 0) is None for f in flags)
    ]
    if not undetermined:
        return None
    without = [name for name in undetermined if _without_paired_intervals(result, name)]
    few = [name for name in undetermined if name not in without]
    said = []
    if without:
        said.append(
            f"no could-be-best set for {', '.join(without)}: betting intervals do not apply "
            "to them, so no comparison can exclude a policy (--ci auto gives them normal "
            "intervals)"
        )
    if few:
        policies, confidence = len(result.results), result.confidence.level
        each = bonferroni_level(confidence, policies)
        said.append(
            f"no could-be-best set for {', '.join(few)}: each of its {policies - 1} "
            f"comparisons is at {each:.4g} (Bonferroni, {policies} policies), whose bootstrap "
            f"quantiles need at least {best_set_replicates(confidence, policies)} replicates "
            "(--bootstrap-samples)"
        )
    return Warning(NO_BEST_SET, "; ".join(said))


def _without_paired_intervals(result: EvaluationResult, name: str) -> bool:
    """Whether estimator ``name`` has no interval by the run's method (betting, which does
    not apply to it, chosen by ``--ci betting`` rather than by ``--ci auto``)."""
    return betting_does_not_apply(result.confidence.interval, name) and all(
        p.ci_methods.get(name) is None for p in result.results
    )


def ranking_warnings(result: EvaluationResult, ranks: list[int | None], rank_by: str) -> list:
    """A policy with no value for the ranking estimator is left out of the ranking."""
    if len(result.results) < 2:
        return []
    return [
        Warning(
            NOT_RANKED,
            f"{p.policy}: "
            + (
                f"its every {rank_by} weight is zero (the logs say nothing about it)"
                if rank_by in p.weightless
                else f"no {rank_by} value"
            )
            + ", so it is left out of the ranking",
            p.policy,
        )
        for p, rank in zip(result.results, ranks, strict=True)
        if rank is None
    ]


# the checks of a policy's (or a Q function's) ranges: one policy's drops every policy's episode
POLICY_RANGES = ("action_out_of_range", "state_out_of_range")


def dropped_line(result: EvaluationResult) -> str:
    """One line saying how many invalid episodes --on-invalid drop left out, and why."""
    if not result.dataset.episodes_dropped:
        return "--on-invalid drop: no invalid episodes, nothing dropped"
    reasons = "; ".join(
        f"{reason} {counts['episodes']:,} episode(s), {counts['steps']:,} step(s)"
        for reason, counts in result.dataset.dropped.items()
    )
    line = (
        f"--on-invalid drop: dropped {result.dataset.episodes_dropped:,} invalid episode(s), "
        f"{result.dataset.steps_dropped:,} step(s), not in the estimates ({reasons})"
    )
    if len(result.results) > 1 and set(POLICY_RANGES) & set(result.dataset.dropped):
        # one candidate's ranges moved another's estimates (WPDIS 2.392 alone, 2.025 beside
        # a policy of 9 states), and nothing said which
        line += (
            "; an episode outside one policy's (or its Q function's) action or state range is "
            "left out for every policy, so that their comparisons stay paired: evaluate "
            "that policy on its own to keep the other policies' episodes"
        )
    return line


def dropped_warning(result: EvaluationResult) -> Warning | None:
    """That --on-invalid drop left episodes out of the estimates (``dropped_line``)."""
    if not result.dataset.episodes_dropped:
        return None
    return Warning(DROPPED, dropped_line(result))


def float32_warning(result: EvaluationResult) -> Warning | None:
    """A float32 run on data whose magnitudes float32 cannot carry to 1e-4: far-off
    observations (un-normalised sensor values), rewards or critic values, or rewards so
    small that their weighted products underflow."""
    magnitudes = result.dataset.magnitudes
    if result.runtime.precision != "float32" or magnitudes is None:
        return None
    observation, large, small, critic, action, rewards, returns, features, cancel = magnitudes
    found = []
    if observation >= FLOAT32_VALUE_MAGNITUDE:
        found.append(f"observations reach 1e{observation} in magnitude")
    if action >= FLOAT32_VALUE_MAGNITUDE:
        found.append(f"actions reach 1e{action}")
    if large >= FLOAT32_VALUE_MAGNITUDE:
        found.append(f"rewards reach 1e{large}")
    if small >= FLOAT32_SMALL_MAGNITUDE:
        found.append(f"rewards as small as 1e-{small}")
    if critic >= FLOAT32_VALUE_MAGNITUDE:
        found.append(f"the critic's Q-hat or V-hat values reach 1e{critic}")
    one_step = result.dataset.max_length == 1  # its returns are its rewards
    for what, digits in (
        ("rewards", rewards),
        ("episode returns", NO_MAGNITUDE if one_step else returns),
        # observations of 1e4 and more are said so above: their spread is then lost too
        ("observations", NO_MAGNITUDE if observation >= FLOAT32_VALUE_MAGNITUDE else features),
    ):
        if digits >= FLOAT32_SPREAD_DIGITS:
            found.append(f"the {what} vary by 1e-{digits} of their size or less")
    if not one_step and cancel >= FLOAT32_SPREAD_DIGITS and returns < FLOAT32_SPREAD_DIGITS:
        found.append(
            f"the episode returns vary by 1e-{cancel} of the rewards' size or less (the "
            "rewards cancel in them)"
        )
    if not found:
        return None
    return Warning(
        FLOAT32_RANGE,
        f"float32 (this run's precision) keeps about 7 digits, and {', '.join(found)}: the "
        "policies' log-probabilities, the weighted rewards or their standard errors can lose "
        "their value to rounding or leave float32's range; check the estimates with "
        "--precision float64.",
    )


def float64_warning(result: EvaluationResult) -> Warning | None:
    """Values at float64's edges (``FLOAT64_RANGE``): subnormal rewards, or rewards or
    critic values so large that what the kernel can flush to zero (``float64_loss``)
    exceeds FLOAT64_LOSS_SHARE of an estimate or of a difference between two."""
    magnitudes = result.dataset.magnitudes
    if result.runtime.precision == "float32" or magnitudes is None:
        return None
    _, large, small, critic, *_ = magnitudes
    found = []
    if small > -math.log10(FLOAT64_SMALLEST_NORMAL):
        found.append(f"rewards as small as 1e-{small} (below 2.2e-308 the kernel takes them as 0)")
    for what, size, critics in (("rewards", large, False), ("Q-hat or V-hat values", critic, True)):
        named, losses, unweighted = [], [], float64_loss(result, size)
        for policy in result.results:  # its terms are as large as its weights make them
            loss = unweighted * _largest_weight(policy, result.dataset.episodes)
            names = _float64_exposed(policy, loss, critics) if loss >= FLOAT64_LOSS_FLOOR else ""
            if names:
                named.append(names + (f" ({policy.policy})" if len(result.results) > 1 else ""))
                losses.append(loss)
        loss = unweighted  # the logging policy's weights are 1
        if (
            not critics
            and loss >= FLOAT64_LOSS_FLOOR
            and _discount_flushes(result)
            and _float64_moves(result.behavior_value, None, loss)
        ):  # returns lose only the steps where gamma^t is below 2.2e-308
            named.append("the logging policy's value (its mean discounted return)")
            losses.append(loss)
        if named:
            most = max(losses)
            amount = f"{most:.1e}" if math.isfinite(most) else "more than float64 holds"
            found.append(
                f"{what} reach 1e{size}: the terms counted as 0 can add up to {amount}, more "
                f"than 1e-9 of {'; '.join(named)}"
            )
    if not found:
        return None
    return Warning(
        FLOAT64_RANGE,
        "float64 holds values down to 2.2e-308, below which the kernel counts a product "
        "(a weight far below the largest, or a discount gamma^t, times a value) as 0, and "
        f"{', and '.join(found)}; treat these as approximate.",
    )


def float64_loss(result: EvaluationResult, size: int) -> float:
    """What an estimate can lose to products the kernel flushes to zero, for values below
    10^(``size`` + 1): below 2.2e-308 of them for each step of each episode (an upper
    bound: a weighted estimate's lost terms add up over the episodes); 0 for no values."""
    if size <= NO_MAGNITUDE:
        return 0.0
    cells = max(1, result.dataset.episodes) * max(1, result.dataset.max_length)
    return math.exp(math.log(FLOAT64_SMALLEST_NORMAL * cells) + (size + 1) * math.log(10))


def _largest_weight(policy: PolicyResult, episodes: int) -> float:
    """A bound on ``policy``'s largest per-decision weight, at least 1: ``episodes`` times
    its largest mean weight at a step (weights are not negative); inf where one overflowed."""
    mean_t = np.asarray(policy.profile.mean_weight_t, np.float64)
    if mean_t.size == 0 or np.isnan(mean_t).all():
        return 1.0
    return max(1.0, float(np.nanmax(mean_t)) * max(1, episodes))


def _discount_flushes(result: EvaluationResult) -> bool:
    """Whether gamma^t falls below 2.2e-308 within the longest episode."""
    steps, gamma = result.dataset.max_length, result.gamma
    if not 0 < gamma < 1:  # 0^t is exactly 0 past step 0, 1^t exactly 1
        return False
    return (steps - 1) * math.log(gamma) < math.log(FLOAT64_SMALLEST_NORMAL)


def _float64_moves(value: float | None, stderr: float | None, lost: float) -> bool:
    """Whether ``lost`` can move ``value`` by more than FLOAT64_LOSS_SHARE of its size or
    standard error, or from exactly 0 (no spread) by FLOAT64_ZERO_LOSS."""
    if value is None:
        return False
    if value == 0 and not stderr:
        return lost >= FLOAT64_ZERO_LOSS
    return lost > FLOAT64_LOSS_SHARE * max(abs(value), stderr or 0.0)


def _float64_exposed(policy: PolicyResult, loss: float, critics: bool) -> str:
    """The estimates of ``policy`` (those that read Q-hat or V-hat, with ``critics``), and
    its differences from the baseline (each can lose twice ``loss``), that ``loss`` can
    move by more than FLOAT64_LOSS_SHARE of their size or standard error, or from exactly 0
    by FLOAT64_ZERO_LOSS ("" if none)."""
    reads = [n for n in policy.estimates if not critics or get_estimator(n).needs]
    if policy.diagnostics.zero_weight_fraction == 1:  # W G = 0 exactly: 0 is no flush
        reads = [n for n in reads if policy.estimates[n].value != 0 or critics]
    names = [
        n
        for n in reads
        if _float64_moves(policy.estimates[n].value, policy.estimates[n].stderr, loss)
    ]
    differences = [
        n
        for n in reads
        if n in (policy.comparison or {})
        and _float64_moves(policy.comparison[n].delta, policy.comparison[n].stderr, 2 * loss)
    ]
    if differences:
        names.append(f"the difference in {and_list(differences)}")
    return and_list(names) if names else ""


def run_warnings(
    result: EvaluationResult, ranks: list[int | None] | None = None, rank_by: str | None = None
) -> list[Warning]:
    """Every warning of the run: run-wide ones first, then each policy's, in order.
    ``ranks`` (rank_policies by ``rank_by``) adds the policies left out of the ranking."""
    # about Q-hat's error: the run's, or some policies' own
    q_error = [*fitted_q_warnings(result), *dm_q_as_exact_warnings(result)]
    run = [
        gamma_warning(result),
        gamma_replaced_warning(result),
        dropped_warning(result),
        floored_warning(result),
        behavior_actions_warning(result),
        behavior_fit_warning(result),
        behavior_overfit_warning(result),
        float32_warning(result),
        float64_warning(result),
        asymptotic_warning(result),
        fitted_betting_warning(result),
        *(w for w in q_error if w.policy is None),
        best_set_warning(result),
    ]
    warnings = [w for w in run if w is not None]
    warnings.extend(estimated_behavior_warnings(result))
    propensities = propensity_source(result)
    warnings.extend(Warning(UNRESOLVED_BEST_SET, note) for note in result.best_set_notes)
    warnings.extend(Warning(SELECTION, note, policy) for policy, note in result.selection_notes)
    for policy in result.results:
        warnings.extend(policy_warnings(policy, result.dataset.episodes, propensities))
        warnings.extend(w for w in q_error if w.policy == policy.policy)
    if ranks is not None and rank_by is not None:
        warnings.extend(ranking_warnings(result, ranks, rank_by))
    return warnings
