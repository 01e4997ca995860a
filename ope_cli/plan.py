"""What an evaluation will compute, decided before any data is read: the checks of option
values the command line cannot check by type, and the interval plan (``--ci auto``
resolved, and the bounds betting intervals rely on)."""

from __future__ import annotations

import dataclasses

from ope_cli.behavior import check_behavior_option
from ope_cli.config import EvaluationConfig
from ope_cli.errors import UsageError
from ope_cli.estimators import available as estimator_available
from ope_cli.estimators import get as estimator_get
from ope_cli.estimators import names as estimator_names
from ope_cli.estimators.base import describe_betting, describe_bootstrap_t
from ope_cli.estimators.doubly_robust import Q_FIELDS
from ope_cli.sources import DeclaredBounds, is_reward_range
from ope_cli.validate import bounds_checks

INTERVAL_METHODS = {  # {estimators...} are filled from the estimator registry
    "betting": "betting: finite-sample intervals, valid for any number of episodes, from the "
    "weights' non-negativity and rewards in [{low:g}, {high:g}] ({bounds_source}), "
    "discounted horizon {horizon:g}; {betting_estimators}",
    "normal": "normal approximation, estimate +- z * standard error",
    "percentile": "Poisson bootstrap, percentile interval ({samples} replicates, seed {seed})",
    "bootstrap-t": "Poisson bootstrap, {bootstrap_t_estimators} "
    "({samples} replicates, seed {seed})",
}


ASYMPTOTIC = (
    " (asymptotic: heavy-tailed weights make it cover less often than stated; "
    "--reward-range LOW HIGH gives finite-sample betting intervals)"
)


def check_config(config: EvaluationConfig) -> None:
    """Option values the command line cannot check by type alone."""
    if not 0.0 <= config.gamma <= 1.0:
        raise UsageError(f"--gamma must be in [0, 1], got {config.gamma}")
    if not 0.0 < config.confidence < 1.0:
        raise UsageError(f"--confidence must be in (0, 1), got {config.confidence}")
    unknown = [e for e in config.estimators or () if e not in estimator_names()]
    if unknown:
        raise UsageError(
            f"unknown estimator {unknown[0]!r} (choose from {', '.join(estimator_names())})"
        )
    _check_q_options(config)
    b = config.batching
    if b.read_rows < 1 or b.batch_steps < 1 or b.min_bucket < 1:
        raise UsageError("batching options must be positive")
    if config.interval not in ("auto", *INTERVAL_METHODS):
        raise UsageError(
            f"--ci must be one of auto, {', '.join(INTERVAL_METHODS)}, got {config.interval!r}"
        )
    _check_interval_options(config)
    check_behavior_option(config.behavior, config.min_propensity, config.behavior_cross_fit)


def has_q_source(config: EvaluationConfig) -> bool:
    """Whether the run has Q-hat (``--q``, or ``--q-col`` with ``--v-col``)."""
    return bool(config.q) or config.columns.q_value is not None


def reported_estimators(config: EvaluationConfig) -> tuple[str, ...]:
    """The estimators a run reports: ``--estimator``'s, else every one its inputs allow."""
    if config.estimators:
        return tuple(config.estimators)
    return estimator_available(Q_FIELDS if has_q_source(config) else ())


def _check_q_options(config: EvaluationConfig) -> None:
    columns = config.columns
    if (columns.q_value is None) != (columns.v_value is None):
        raise UsageError("--q-col and --v-col go together: Q-hat of the logged action and V-hat")
    if config.v_samples < 1:
        raise UsageError(f"--v-samples must be a positive number, got {config.v_samples}")
    if config.cross_fit < 1:
        raise UsageError(f"--cross-fit must be a positive number of folds, got {config.cross_fit}")
    if not has_q_source(config):
        needing = [e for e in config.estimators or () if estimator_get(e).needs]
        if needing:
            raise UsageError(
                f"--estimator {needing[0]} needs a Q source: --q Q.npz|package.module:name|fit, "
                "or --q-col with --v-col"
            )


def _check_interval_options(config: EvaluationConfig) -> None:
    if config.reward_range is not None:
        low, high = config.reward_range
        if not is_reward_range(low, high):
            raise UsageError(f"--reward-range needs finite LOW < HIGH, got {low} {high}")
    if config.horizon is not None and config.horizon < 1:
        raise UsageError(f"--horizon must be a positive number of steps, got {config.horizon}")
    if config.interval in ("percentile", "bootstrap-t") and config.bootstrap_samples < 10:
        raise UsageError(f"--bootstrap-samples must be at least 10, got {config.bootstrap_samples}")
    if not 0 <= config.seed < 2**32:
        raise UsageError(f"--seed must be in [0, 2^32), got {config.seed}")
    if config.precision not in (None, "float32", "float64"):
        raise UsageError(f"--precision must be float32 or float64, got {config.precision}")
    if config.on_invalid not in ("error", "drop"):
        raise UsageError(f"--on-invalid must be error or drop, got {config.on_invalid!r}")


@dataclasses.dataclass(frozen=True)
class IntervalPlan:
    """The interval method of a run and, for betting, the bounds it relies on."""

    method: str
    reward_range: tuple[float, float] | None = None
    horizon: int | None = None
    bounds_source: str | None = None  # where the reward range comes from
    horizon_source: str | None = None
    betting_range: tuple[float, float, float] | None = (
        None  # (a, b, H): estimators.betting_variables
    )

    def describe(self, config: EvaluationConfig) -> str:
        estimators = reported_estimators(config)
        if self.betting_range is None:
            return (
                INTERVAL_METHODS[self.method].format(
                    samples=config.bootstrap_samples,
                    seed=config.seed,
                    bootstrap_t_estimators=describe_bootstrap_t(estimators),
                )
                + ASYMPTOTIC
            )
        low, high = self.reward_range
        return INTERVAL_METHODS["betting"].format(
            low=low,
            high=high,
            horizon=self.betting_range[2],
            bounds_source=self.bounds_source,
            betting_estimators=describe_betting(estimators),
        )

    def chunk_checks(self, chunk):
        return bounds_checks(
            chunk.steps,
            chunk.lengths,
            self.reward_range,
            self.horizon,
            (self.bounds_source, self.horizon_source),
        )


def plan_intervals(config: EvaluationConfig, declared: DeclaredBounds) -> IntervalPlan:
    """Resolves ``--ci auto`` (betting when the rewards are bounded, else normal) and the
    bounds of betting intervals: options first, then what the data declares."""
    reward_range = config.reward_range or declared.reward_range
    horizon = config.horizon or declared.horizon
    betting_range = None
    if reward_range is not None and (config.gamma < 1 or horizon is not None):
        gamma = config.gamma
        if horizon is None:
            discounted_horizon = 1.0 / (1.0 - gamma)
        elif gamma == 1.0:
            discounted_horizon = float(horizon)
        else:
            discounted_horizon = (1.0 - gamma**horizon) / (1.0 - gamma)
        # The absorbing reward 0 after an episode ends must lie in the range too.
        betting_range = (min(reward_range[0], 0.0), max(reward_range[1], 0.0), discounted_horizon)
    method = config.interval
    if config.reward_range is not None and betting_range is None:
        raise UsageError(
            "--reward-range with --gamma 1 also needs --horizon STEPS: without "
            "discounting, only a horizon bounds the return"
        )
    if method == "auto":
        method = "betting" if betting_range is not None else "normal"
    if method != "betting":
        return IntervalPlan(method)
    if betting_range is None:
        missing = (
            "--reward-range LOW HIGH"
            if reward_range is None
            else "--horizon STEPS (with --gamma 1 the return is bounded only by a horizon)"
        )
        raise UsageError(
            f"--ci betting needs bounds on every episode's return: pass {missing}, or "
            "declare it in the data's schema metadata (see the README)"
        )

    def source(option: str, value) -> str:
        return option if value is not None else "declared by the data"

    return IntervalPlan(
        "betting",
        reward_range,
        horizon,
        source("--reward-range", config.reward_range),
        source("--horizon", config.horizon),
        betting_range,
    )
