"""What an evaluation will compute, decided before any data is read: the checks of option
values the command line cannot check by type, and the interval plan (``--ci auto``
resolved, and the bounds betting intervals rely on)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from statistics import NormalDist
from typing import TYPE_CHECKING

from ope_cli.config import EvaluationConfig, IntervalConfig, QConfig, check_v_samples
from ope_cli.data.sources import DeclaredBounds, is_reward_range
from ope_cli.data.validate import bounds_checks
from ope_cli.errors import UsageError
from ope_cli.estimation.estimators import available as estimator_available
from ope_cli.estimation.estimators import get as estimator_get
from ope_cli.estimation.estimators import names as estimator_names
from ope_cli.estimation.estimators.base import describe_betting, describe_bootstrap_t
from ope_cli.estimation.estimators.doubly_robust import Q_FIELDS
from ope_cli.estimation.intervals import BOOTSTRAP_METHODS
from ope_cli.models.behavior import check_behavior_option, is_estimate
from ope_cli.models.q_models.base import draws_with_seed

if TYPE_CHECKING:  # annotations only
    from ope_cli.models.policies import Policy
    from ope_cli.results import PolicyResult

INTERVAL_METHODS = {  # {estimators...} are filled from the estimator registry
    "betting": "betting: finite-sample intervals, valid for any number of episodes, from the "
    "weights' non-negativity and rewards in [{low:g}, {high:g}] ({bounds_source}){widened}, "
    "discounted horizon {horizon:g}{betting_estimators}",
    "normal": "normal approximation, estimate +- z * standard error",
    "percentile": "Poisson bootstrap, percentile interval ({samples} replicates, seed {seed})",
    "bootstrap-t": "Poisson bootstrap, {bootstrap_t_estimators} "
    "({samples} replicates, seed {seed})",
}


ESTIMATED_BEHAVIOR = (
    " (their guarantee assumes the true behavior probabilities; --behavior estimate fitted "
    "them, so it holds only as far as the fit does)"
)
ASYMPTOTIC = (
    " (asymptotic: heavy-tailed weights make it cover less often than stated; "
    "{needs} gives finite-sample betting intervals)"
)


def _missing_bounds(reward_range, horizon: int | None, gamma: float) -> str:
    """The options that would bound every episode's return, for betting intervals: the
    reward range, and at gamma 1 a horizon too (the one the footer named alone was then
    refused: "--reward-range with gamma 1 also needs --horizon")."""
    unbounded = gamma >= 1.0 and horizon is None
    if reward_range is None:
        return "--reward-range LOW HIGH" + (" with --horizon STEPS" if unbounded else "")
    return "--horizon STEPS (or --gamma < 1)"


def _betting_needs(reward_range, horizon: int | None, gamma: float, available: bool) -> str:
    """What gives betting intervals (``_missing_bounds``); where the bounds already allow
    them, asking for them."""
    return "--ci betting (or auto)" if available else _missing_bounds(reward_range, horizon, gamma)


DEFAULT_GAMMA = 1.0
# where a run's discount comes from, and how a message or report says it
GAMMA_SOURCES = {"option": "--gamma", "data": "declared by the data", "default": "the default"}
GAMMA_DEFAULT = "gamma_default"  # the warning that no one gave a discount (every command's)


def default_gamma_message(summed: str, meant: str) -> str:
    """The ``gamma_default`` warning's words: ``summed`` says what is then undiscounted,
    ``meant`` what the discount would be meant with."""
    return (
        "gamma is 1, the default: neither --gamma nor the data's metadata gives a discount, "
        f"so {summed}. If {meant} meant with a discount, pass --gamma (or declare "
        '"gamma" in the data\'s ope metadata).'
    )


def resolve_gamma(gamma: float | None, declared: DeclaredBounds) -> tuple[float, str]:
    """(the discount, where it comes from): ``--gamma`` wins, else what the data declares,
    else DEFAULT_GAMMA. A discount of -0.0 is 0.0 (every output printed "-0")."""
    if gamma is not None:
        return float(gamma) + 0.0, "option"
    if declared.gamma is not None:
        return declared.gamma + 0.0, "data"
    return DEFAULT_GAMMA, "default"


def fewest_replicates(confidence: float) -> int:
    """The fewest bootstrap replicates whose quantiles at (1 - confidence) / 2 and its
    complement are not the extreme replicates (at least 10): with fewer, a "99%" interval
    from 10 replicates is their range, far narrower than it says."""
    if not 0 < confidence < 1:
        return 10
    return max(10, math.ceil(2 / (1 - confidence) - 1e-9))


def check_config(config: EvaluationConfig) -> None:
    """Option values the command line cannot check by type alone."""
    if config.gamma is not None and not 0.0 <= config.gamma <= 1.0:
        raise UsageError(f"--gamma must be in [0, 1], got {config.gamma}")
    if not 0.0 < config.intervals.confidence < 1.0:
        raise UsageError(f"--confidence must be in (0, 1), got {config.intervals.confidence}")
    unknown = [e for e in config.estimators or () if e not in estimator_names()]
    if unknown:
        raise UsageError(
            f"unknown estimator {unknown[0]!r} (choose from {', '.join(estimator_names())})"
        )
    _check_q_options(config)
    config.batching.check()
    method = config.intervals.method
    if method not in ("auto", *INTERVAL_METHODS):
        raise UsageError(f"--ci must be one of auto, {', '.join(INTERVAL_METHODS)}, got {method!r}")
    _check_interval_options(config)
    check_behavior_option(
        config.behavior.policy, config.behavior.min_propensity, config.behavior.cross_fit
    )
    config.columns.check()
    named = _named_probability_columns(config, "behavior")
    policy = config.behavior.policy
    if policy is not None and not is_estimate(policy) and named:  # it would not be read
        raise UsageError(  # (an estimate is compared with the logged column, so it is read)
            f"{named[0]} names a logged behavior column, but --behavior {policy} gives the "
            "behavior probabilities instead; drop one"
        )
    target = _named_probability_columns(config, "target")
    if config.policies and target:  # the policies give the target probabilities
        raise UsageError(
            f"{target[0]} names a logged target column, which serves a run without --policy, "
            "but --policy gives the target probabilities; drop one"
        )


def _named_probability_columns(config: EvaluationConfig, kind: str) -> list[str]:
    """The options that name a ``kind`` (behavior or target) probability column or its log."""
    columns = config.columns
    return [
        f"--{kind}-{option}-col"
        for option, field in (("prob", f"{kind}_prob"), ("log-prob", f"{kind}_log_prob"))
        if getattr(columns, field) is not None
    ]


def has_q_source(config: EvaluationConfig) -> bool:
    """Whether the run has Q-hat (``--q``, or ``--q-col`` with ``--v-col``)."""
    return bool(config.q.sources) or config.columns.q_value is not None


def reported_estimators(config: EvaluationConfig) -> tuple[str, ...]:
    """The estimators a run reports: ``--estimator``'s, else every one its inputs allow."""
    if config.estimators:
        return tuple(config.estimators)
    return estimator_available(Q_FIELDS if has_q_source(config) else ())


def _check_q_options(config: EvaluationConfig) -> None:
    columns = config.columns
    if (columns.q_value is None) != (columns.v_value is None):
        raise UsageError("--q-col and --v-col go together: Q-hat of the logged action and V-hat")
    check_v_samples(config.q.v_samples)
    if config.q.cross_fit < 1:
        raise UsageError(
            f"--cross-fit must be a positive number of folds, got {config.q.cross_fit}"
        )
    fitted = any(source.split(":", 1)[0] == "fit" for source in config.q.sources)
    if config.q.cross_fit != QConfig.cross_fit and not fitted:  # it would change nothing
        raise UsageError("--cross-fit applies to --q fit[:MODEL] only")
    if config.q.v_samples != QConfig.v_samples and not config.q.sources:  # nothing to draw for
        raise UsageError("--v-samples applies to --q only (V-hat of continuous actions)")
    needing = [e for e in config.estimators or () if estimator_get(e).needs]
    if has_q_source(config) and config.estimators and not needing:  # it would change nothing
        source = "--q" if config.q.sources else "--q-col with --v-col"
        *others, last = [e for e in estimator_names() if estimator_get(e).needs]
        users = f"{', '.join(others)} and {last}" if others else last
        raise UsageError(
            f"{source} is used by {users} only; the estimators asked for "
            f"({', '.join(config.estimators)}) use none of it (add one of them, or drop {source})"
        )
    if not has_q_source(config):
        if needing:
            raise UsageError(
                f"--estimator {needing[0]} needs a Q source: --q Q.npz|package.module:name|fit, "
                "or --q-col with --v-col"
            )


def _check_interval_options(config: EvaluationConfig) -> None:
    intervals = config.intervals
    if intervals.reward_range is not None:
        low, high = intervals.reward_range
        if not is_reward_range(low, high):
            raise UsageError(f"--reward-range needs finite LOW < HIGH, got {low} {high}")
    if intervals.horizon is not None and intervals.horizon < 1:
        raise UsageError(f"--horizon must be a positive number of steps, got {intervals.horizon}")
    needed = fewest_replicates(intervals.confidence)
    bootstrap = intervals.method in BOOTSTRAP_METHODS
    if intervals.bootstrap_samples != IntervalConfig.bootstrap_samples and not bootstrap:
        raise UsageError(  # it changed nothing (-3 was accepted too)
            "--bootstrap-samples applies to --ci percentile and bootstrap-t only (their "
            "replicates also give --baseline's P(better))"
        )
    if bootstrap and intervals.bootstrap_samples < needed:
        raise UsageError(
            f"--bootstrap-samples must be at least {needed} for {intervals.confidence:.4g} "
            f"intervals (a replicate beyond each end), got {intervals.bootstrap_samples}"
        )
    if not 0 <= intervals.seed < 2**32:
        raise UsageError(f"--seed must be in [0, 2^32), got {intervals.seed}")
    if config.runtime.precision not in (None, "float32", "float64"):
        raise UsageError(f"--precision must be float32 or float64, got {config.runtime.precision}")
    if config.on_invalid not in ("error", "drop"):
        raise UsageError(f"--on-invalid must be error or drop, got {config.on_invalid!r}")


def check_seed_applies(config: EvaluationConfig, method: str, q_models, action_kind: str):
    """UsageError for a ``--seed`` (other than its default) that would change nothing: no
    bootstrap (``method``) and no --q source that draws from it (``draws_with_seed``;
    ``q_models``: each --q source's fitted model, None for one given whole)."""
    if config.intervals.seed == IntervalConfig.seed or method in BOOTSTRAP_METHODS:
        return
    if any(draws_with_seed(model, action_kind) for model in q_models):
        return
    raise UsageError(
        "--seed applies to --ci percentile and bootstrap-t, --q fit:mlp and a --q over "
        f"continuous actions (V-hat's draws); this run has none of them ({method} intervals)"
    )


@dataclasses.dataclass(frozen=True)
class IntervalPlan:
    """The interval method of a run and, for betting, the bounds it relies on; and the
    run's discount with where it comes from (GAMMA_SOURCES). The bounds given or declared
    are checked against the data whatever the method (``checked``)."""

    method: str
    reward_range: tuple[float, float] | None = None
    horizon: int | None = None
    bounds_source: str | None = None  # where the reward range comes from
    horizon_source: str | None = None
    betting_range: tuple[float, float, float] | None = (
        None  # (a, b, H): estimators.betting_variables
    )
    gamma: float = DEFAULT_GAMMA
    gamma_source: str = "option"
    declared_gamma: float | None = None  # the data's, also where --gamma replaces it
    # what finite-sample (betting) intervals would still need, in options
    betting_needs: str = "--reward-range LOW HIGH"
    # (reward range, horizon, (their sources)) given or declared: checked on every episode
    checked: tuple = (None, None, (None, None))

    def describe(self, config: EvaluationConfig) -> str:
        estimators = reported_estimators(config)
        if self.betting_range is None:
            return INTERVAL_METHODS[self.method].format(
                samples=config.intervals.bootstrap_samples,
                seed=config.intervals.seed,
                bootstrap_t_estimators=describe_bootstrap_t(estimators),
            ) + ASYMPTOTIC.format(needs=self.betting_needs)
        low, high = self.reward_range
        a, b, _ = self.betting_range
        described = INTERVAL_METHODS["betting"].format(
            low=low,
            high=high,
            # the range the bets take: an ended episode's reward 0 lies in it (the JSON's
            # reward_range is the one given)
            widened=f" widened to [{a:g}, {b:g}] to hold 0" if (a, b) != (low, high) else "",
            horizon=self.betting_range[2],
            bounds_source=self.bounds_source,
            # none (only dm, dr, wdr reported): no empty clause ("horizon 20; ; standard")
            betting_estimators="".join(f"; {d}" for d in [describe_betting(estimators)] if d),
        )
        if is_estimate(config.behavior.policy):  # the weights' mean is 1 only for the true pi_b
            described += ESTIMATED_BEHAVIOR
        return described

    def chunk_checks(self, chunk):
        reward_range, horizon, sources = self.checked
        return bounds_checks(chunk.steps, chunk.lengths, reward_range, horizon, sources)


def _betting_range(
    reward_range: tuple[float, float] | None, horizon: int | None, gamma: float
) -> tuple[float, float, float] | None:
    """(a, b, H) of betting intervals: the reward range widened to hold the absorbing
    reward 0, and the discounted horizon; None where the return is not bounded."""
    if reward_range is None or (gamma == 1.0 and horizon is None):
        return None
    if horizon is None:
        discounted_horizon = 1.0 / (1.0 - gamma)
    elif gamma == 1.0:
        discounted_horizon = float(horizon)
    else:
        discounted_horizon = (1.0 - gamma**horizon) / (1.0 - gamma)
    return (min(reward_range[0], 0.0), max(reward_range[1], 0.0), discounted_horizon)


def plan_intervals(config: EvaluationConfig, declared: DeclaredBounds) -> IntervalPlan:
    """Resolves the discount (``resolve_gamma``), ``--ci auto`` (betting when the rewards
    are bounded, else normal) and the bounds of betting intervals: options first, then what
    the data declares."""
    gamma, gamma_source = resolve_gamma(config.gamma, declared)
    reward_range = config.intervals.reward_range or declared.reward_range
    horizon = config.intervals.horizon or declared.horizon

    def source(option: str, value) -> str:
        return option if value is not None else "declared by the data"

    sources = (
        source("--reward-range", config.intervals.reward_range),
        source("--horizon", config.intervals.horizon),
    )
    # every plan's: the discount, and the bounds checked on every episode whatever the method
    shared = {
        "gamma": gamma,
        "gamma_source": gamma_source,
        "declared_gamma": declared.gamma,
        "checked": (reward_range, horizon, sources),
    }
    betting_range = _betting_range(reward_range, horizon, gamma)
    method = config.intervals.method
    # a range asked for betting intervals that the discount leaves unbounded; with another
    # --ci it only checks the rewards, which needs no horizon
    betting_asked = method in ("auto", "betting")
    if config.intervals.reward_range is not None and betting_range is None and betting_asked:
        raise UsageError(
            f"--reward-range with gamma 1 ({GAMMA_SOURCES[gamma_source]}) also needs --horizon "
            "STEPS: without discounting, only a horizon bounds the return"
        )
    # auto means betting where the bounds allow it and a reported estimator has it: with
    # -e dr alone, the run's intervals are normal ones, and say so
    betting = [name for name in estimator_names() if estimator_get(name).betting]
    reported_betting = set(betting) & set(reported_estimators(config))
    if method == "auto":
        method = "betting" if betting_range is not None and reported_betting else "normal"
    if method != "betting":
        needs = _betting_needs(reward_range, horizon, gamma, betting_range is not None)
        if betting_range is not None and not reported_betting:
            needs = f"--estimator {'|'.join(betting)}"
        return IntervalPlan(method, **shared, betting_needs=needs)
    if betting_range is None:
        missing = (
            _missing_bounds(reward_range, horizon, gamma)
            if reward_range is None
            else "--horizon STEPS (with --gamma 1 the return is bounded only by a horizon)"
        )
        raise UsageError(
            f"--ci betting needs bounds on every episode's return: pass {missing}, or "
            "declare it in the data's schema metadata (see the README)"
        )

    return IntervalPlan("betting", reward_range, horizon, *sources, betting_range, **shared)


# --- every estimate has an interval or a reason ------------------------------------------

# a null interval's reason where the estimator gave none: the estimate, or only its spread
NO_VALUE = "no interval: the estimate is undefined"
NO_INTERVAL = (
    "no interval: the standard error is undefined (one episode, too few with finite terms, "
    "or squares of the terms beyond float64's range)"
)
NO_BETTING = "betting intervals do not apply to this estimator"
# beside an interval that needs none (betting's)
NO_STDERR = "no standard error: too few episodes (or terms beyond float64)"


def _interval_method(name: str, method: str) -> str | None:
    """The method a finished interval of estimator ``name`` comes from, under ``method``."""
    estimator = estimator_get(name)
    if method == "betting":
        return "betting" if estimator.betting else None
    if method == "normal" or estimator.replicates is None:
        return "normal"
    return "bootstrap-t" if method == "bootstrap-t" and estimator.studentized else "percentile"


def complete_intervals(
    result: PolicyResult, plan: IntervalPlan, config: EvaluationConfig
) -> PolicyResult:
    """``result`` with each estimate's interval method named (``ci_methods``) and every null
    interval explained by a note. Under ``--ci auto`` an estimator that betting does not
    apply to (dm, dr, wdr) gets the normal interval, as auto means per estimator."""
    z = NormalDist().inv_cdf(0.5 + config.intervals.confidence / 2)
    estimates, methods = {}, {}
    for name, estimate in result.estimates.items():
        method = _interval_method(name, plan.method)
        fallback = config.intervals.method == "auto" and method is None and plan.method == "betting"
        if fallback:  # normal, with an interval where there is a standard error
            method = "normal"
            note = None if estimate.note == NO_BETTING else estimate.note
            low = high = None
            if estimate.value is not None and estimate.stderr is not None:
                low = estimate.value - z * estimate.stderr
                high = estimate.value + z * estimate.stderr
            estimate = dataclasses.replace(estimate, ci_low=low, ci_high=high, note=note)
        if estimate.ci_low is None or estimate.ci_high is None:
            note = estimate.note or (
                NO_BETTING
                if method is None and plan.method == "betting"
                else NO_VALUE
                if estimate.value is None
                else NO_INTERVAL
            )
            estimate = dataclasses.replace(estimate, ci_low=None, ci_high=None, note=note)
        elif estimate.stderr is None and estimate.note is None:
            estimate = dataclasses.replace(estimate, note=NO_STDERR)
        estimates[name], methods[name] = estimate, method
    return dataclasses.replace(result, estimates=estimates, ci_methods=methods)


def annotate_results(
    results: Sequence[PolicyResult],
    policies: Sequence[Policy],
    plan: IntervalPlan,
    config: EvaluationConfig,
) -> list[PolicyResult]:
    """Each policy's result with its label and source (``--policy NAME=PATH``) and its
    intervals completed (``complete_intervals``)."""
    return [
        dataclasses.replace(
            complete_intervals(result, plan, config), label=policy.label, source=policy.source
        )
        for result, policy in zip(results, policies, strict=True)
    ]
