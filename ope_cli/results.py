"""Result objects of ``ope evaluate``: what the core returns and every formatter reads.

Plain frozen dataclasses with no behaviour beyond derived numbers, so the formatters in
``ope_cli.report`` depend on this module only, never on the pipeline that fills them.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the formatters must not pull in JAX through stats
    from ope_cli.data.columns import DataSchema
    from ope_cli.estimation.stats import Diagnostics, Estimate, Profile
    from ope_cli.models.behavior import BehaviorSource


NO_MAGNITUDE = -1_000  # the decimal magnitude of no value (DatasetSummary.magnitudes)


@dataclasses.dataclass(frozen=True)
class QSource:
    """Where a policy's Q-hat (dm, dr, wdr) comes from.

    ``source``: checkpoint, entry_point, fit or columns; ``name``: as given; ``kind``: the
    checkpoint kind (or the fitted model's); ``fit``: the fitted Q evaluation's statistics
    (model, episodes, steps, folds, Bellman residuals, seconds), else None; ``mismatch``:
    why a checkpoint is not its policy's Q for the run's gamma, where only dr and wdr use it
    (a run that reports dm refuses such a Q), else None; ``exact``: the checkpoint says it
    holds the policy's exact Q (``ope generate``'s), and it is this run's (no ``mismatch``).
    """

    source: str
    name: str
    kind: str | None = None
    fit: dict | None = None
    mismatch: str | None = None
    exact: bool = False

    def describe(self) -> str:
        if self.source == "columns":
            return f"Q-hat and V-hat from the columns {self.name}"
        if self.source == "fit":
            fit = self.fit or {}
            folds = fit.get("folds", 1)
            crossed = f", cross-fitted over {folds} folds" if folds > 1 else ", in-sample"
            return f"Q-hat fitted in this run (fitted Q evaluation, {self.kind}{crossed})"
        return f"Q-hat from {self.name} ({self.kind}{', exact' if self.exact else ''})"


@dataclasses.dataclass(frozen=True)
class Comparison:
    """V̂(policy) - V̂(baseline) for one estimator, paired on the same episodes (SPEC 11);
    None where undefined (``note`` says why when it can)."""

    delta: float | None
    stderr: float | None
    ci_low: float | None
    ci_high: float | None
    p_improvement: float | None  # share of bootstrap replicates with a positive difference
    note: str | None = None


@dataclasses.dataclass(frozen=True)
class PolicyResult:
    """One policy's estimates {estimator: Estimate}, trajectory-weight diagnostics and the
    per-step profile behind the figures."""

    policy: str
    estimates: dict[str, Estimate]
    diagnostics: Diagnostics
    profile: Profile
    # False when logged discrete actions could not be checked against the policy's action
    # count (an entry point that declares no n_actions): the report says so.
    actions_checked: bool = True
    q: QSource | None = None  # with a Q source: where this policy's Q-hat comes from
    # what tables and figures call it (policies.label_policies); None: ``policy``
    label: str | None = None
    # the checkpoint or entry point of a policy named with --policy NAME=PATH, else None
    source: str | None = None
    # {estimator: the interval method its interval comes from}: betting, normal,
    # percentile or bootstrap-t; None where no interval could be had (the estimate's
    # note says why)
    ci_methods: dict[str, str | None] = dataclasses.field(default_factory=dict)
    # with --baseline, for every other policy: {estimator: Comparison} against it
    comparison: dict[str, Comparison] | None = None
    # with two or more policies: {estimator: whether this policy could be the best}
    could_be_best: dict[str, bool | None] | None = None  # None for an estimator: undetermined
    # the estimators whose weights are all zero: the logs say nothing of the policy by them
    # (its value, 0 +- 0 or undefined, ranks and compares with nothing: stats.weightless)
    weightless: tuple[str, ...] = ()

    @property
    def shown(self) -> str:
        """The name tables and figures show."""
        return self.label or self.policy


def estimated(policy: PolicyResult, estimator: str) -> float | None:
    """``policy``'s estimate by ``estimator``, None where there is none: not reported,
    undefined, or the formula's value of weights that are all zero (``weightless``), which
    ranks, selects and is drawn as no estimate."""
    estimate = policy.estimates.get(estimator)
    if estimate is None or estimator in policy.weightless:
        return None
    return estimate.value


@dataclasses.dataclass(frozen=True)
class DatasetSummary:
    """What was read: the JSON document's "dataset" block (less the behavior policy)."""

    source: str
    layout: str
    schema: DataSchema
    files: int
    episodes: int
    steps: int
    rows_read: int
    max_length: int
    # --on-invalid drop: invalid episodes left out, by reason {reason: {"episodes", "steps"}};
    # every row read is used or dropped (step layout: rows_read = steps + steps_dropped).
    on_invalid: str = "error"
    episodes_dropped: int = 0
    steps_dropped: int = 0
    dropped: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    # decimal magnitudes (floor log10) of the largest |observation| and |reward|, of 1 /
    # the smallest non-zero |reward|, of the largest critic value and |action|, and the
    # digits the rewards', returns' and observations' size stands above their spread
    # (-1000: none), for float32's warning (``pipeline.magnitudes``; a float64 run
    # measures the rewards' and critic's sizes alone, for float64's); not in the JSON
    magnitudes: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True)
class ConfidenceSummary:
    """How the intervals were made: the JSON document's "confidence" block. ``interval``:
    the run's interval method; ``method``: its description, with the standard errors'."""

    level: float
    interval: str
    method: str
    reward_range: tuple[float, float] | None
    horizon: int | None
    replicates: int = 0  # bootstrap replicates drawn (0: none)


@dataclasses.dataclass(frozen=True)
class RuntimeSummary:
    """Where and how fast the run ran: the JSON document's "runtime" block."""

    seconds: float
    backend: str
    devices: int
    processes: int
    process_id: int
    precision: str
    padded_steps: int
    batch_shapes: list[tuple[int, int]]
    compiles: int  # kernel traces: one per new (batch shape, policy function) in the process
    # XLA compilations run, and executables read from the persistent compilation cache
    # instead; compile_seconds: the time spent on both
    compilations: int = 0
    compile_seconds: float = 0.0
    cache_hits: int = 0


@dataclasses.dataclass(frozen=True)
class EvaluationResult:
    """Everything a report shows; independent of the terminal and output format. Grouped
    as the JSON document is: ``dataset``, ``confidence`` and ``runtime`` blocks."""

    dataset: DatasetSummary
    gamma: float
    estimators: tuple[str, ...]
    confidence: ConfidenceSummary
    results: list[PolicyResult]
    runtime: RuntimeSummary
    # where the behavior probabilities come from: the data's column or a --behavior policy
    behavior: BehaviorSource | None = None
    # where ``gamma`` comes from: "option" (--gamma), "data" (declared in the schema
    # metadata) or "default" (1.0); the data's declared discount, if any, also under --gamma
    gamma_source: str = "option"
    declared_gamma: float | None = None
    # --baseline: the policy (its name as given, or "behavior") the others are compared to
    baseline: str | None = None
    # the logging policy's own value: the mean discounted return of the logged episodes
    # (computed with --baseline or two or more policies; else None)
    behavior_value: float | None = None
    # --truth: {policy name: true value or None}, and {estimator: selection metrics}
    truth: dict[str, float | None] | None = None
    selection: dict[str, dict[str, float | None]] | None = None
    selection_notes: tuple[tuple[str | None, str], ...] = ()  # (policy or None: run, note)
    # could-be-best sets that may be too large: policies in them whose difference from
    # the best rounding did not resolve (``comparison.compare_results``)
    best_set_notes: tuple[str, ...] = ()

    @property
    def steps_per_second(self) -> float:
        """Steps used per second of wall time (0 when no time was measured)."""
        seconds = self.runtime.seconds
        return self.dataset.steps / seconds if seconds > 0 else 0.0
