"""Where the behavior probabilities come from: the data's propensity column, a
``--behavior`` policy (checkpoint or entry point, loaded like ``--policy``), or a model
estimated from the logged actions (``--behavior estimate[:MODEL]``, fitted by
``ope_cli.models.behavior_models``); the kernel computes log pi_b(a|s) in the same pass as log pi_e.

Host-side only (NumPy): loading and checking the behavior policy against the data, the
report's description of the source (and of an estimated model's fit), and turning the
kernel's count of logged actions the behavior policy gives probability 0 into a DataError
naming the episode and step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np

from ope_cli.data.columns import DataSchema
from ope_cli.data.ids import locate_key
from ope_cli.errors import DataError, PolicyError, UsageError, where
from ope_cli.models.behavior_models.base import MIN_PROPENSITY
from ope_cli.models.policies import Policy, check_against_schema, chunk_checks, load_one_policy
from ope_cli.models.policies.checks import no_log_probability, returns_probabilities

ESTIMATE = "estimate"


def is_estimate(spec: str | None) -> bool:
    """Whether ``--behavior`` asks to estimate pi_b from the data (``estimate[:MODEL]``)."""
    return spec is not None and (spec == ESTIMATE or spec.startswith(ESTIMATE + ":"))


def check_behavior_option(
    spec: str | None, min_propensity: float = MIN_PROPENSITY, cross_fit: int = 1
) -> None:
    """``--behavior estimate[:MODEL]`` names a known model, with a ``--min-propensity`` in
    [0, 1) and a ``--behavior-cross-fit`` of at least 1 (each other than its default only
    when estimating); any other value is a checkpoint or an entry point, loaded later.
    UsageError (exit 2)."""
    if cross_fit != 1 and not is_estimate(spec):
        raise UsageError("--behavior-cross-fit applies to --behavior estimate[:MODEL] only")
    if min_propensity != MIN_PROPENSITY and not is_estimate(spec):
        raise UsageError(
            "--min-propensity applies to --behavior estimate[:MODEL] only (it floors "
            "estimated behavior probabilities; logged ones and checkpoints are used as they are)"
        )
    if spec is None:
        return
    if is_estimate(spec):
        from ope_cli.models.behavior_models.base import check_min_propensity, parse_model

        parse_model(spec)
        check_min_propensity(min_propensity)
        if cross_fit < 1:
            raise UsageError(f"--behavior-cross-fit must be at least 1, got {cross_fit}")
        return
    if not spec.strip():
        raise UsageError(
            "--behavior needs a checkpoint .npz, an entry point package.module:name or "
            "estimate[:MODEL]"
        )


# The warning that a fitted behavior model is far from the logged propensities: evaluate's
# (its estimates, ``BehaviorFit.logged_gap``) and fit-behavior's (its log-weight) alike
ESTIMATED_BEHAVIOR_OFF = "estimated_behavior_far_from_logged"


@dataclasses.dataclass(frozen=True)
class BehaviorFit:
    """What the report says about a behavior model fitted in the run (``--behavior estimate``).

    Attributes:
      model: the model fitted (tabular, linear_softmax, mlp_softmax, linear_gaussian).
      episodes, steps: what it was fitted on.
      mean_log_likelihood: mean log pi_b(a|s) per step (nats; a log-density for continuous
        actions): in-sample, or out-of-fold when cross-fitted.
      min_propensity: the floor raised to at evaluation time; None for a model of
        continuous actions (densities are not floored).
      floored: logged steps whose estimated probability was below the floor (None: as
        ``min_propensity``).
      seconds: wall time of the fitting pass.
      logged_column: the data's propensity column, when it also has one.
      mean_weight: {policy: {"estimated": w, "logged": w}} mean trajectory weights under the
        estimated and the logged propensities (~1 when right), when the data logs both.
      mean_weight_note: why there is no ``mean_weight`` though the data logs propensities
        (the column is invalid in some of the episodes the estimate covers).
      logged_gap: {policy: {"estimator", "estimated": {"value", "stderr"}, "logged": {...},
        "standard_errors"}}: the estimator whose estimate moves furthest between the
        estimated and the logged propensities, in standard errors (the two estimates'
        combined, sqrt(se_e^2 + se_l^2)), when the data logs both; None otherwise, and
        for a policy without two estimates with standard errors.
      cross_fit: K folds of episodes, each evaluated with the model fitted on the others
        (1: in-sample).
      stopped_short: the largest gradient norm of a fit that its step cap stopped short of
        its tolerance (``BehaviorModel.stopped_short``); None where every fit converged.
      heldout_mean_log_likelihood: an in-sample mlp_softmax fit's mean log-likelihood per
        step on a fifth of the episodes (by id hash) under a fit on the rest, as
        ``ope fit-behavior`` scores it; None for the other models and for cross-fits.
    """

    model: str
    episodes: int
    steps: int
    mean_log_likelihood: float
    min_propensity: float | None
    floored: int | None
    seconds: float
    logged_column: str | None = None
    mean_weight: dict[str, dict[str, float | None]] | None = None
    cross_fit: int = 1
    mean_weight_note: str | None = None
    logged_gap: dict[str, dict | None] | None = None
    stopped_short: float | None = None
    heldout_mean_log_likelihood: float | None = None


@dataclasses.dataclass(frozen=True)
class BehaviorSource:
    """Where a run's behavior probabilities come from (the report's ``dataset.behavior``).

    Attributes:
      source: ``column`` (logged in the data), ``checkpoint``, ``entry_point`` or
        ``estimated`` (fitted in the run).
      name: the column name, checkpoint path, entry point or model.
      kind: the checkpoint kind (tabular, ...); None for a column or an entry point.
      fit: for an estimated model, what the fit found; else None.
      actions_checked: False for an entry point that declares no n_actions, over discrete
        actions: nothing bounds the logged actions it is given (as ``Policy``'s).
    """

    source: str
    name: str
    kind: str | None = None
    fit: BehaviorFit | None = None
    actions_checked: bool = True

    def describe(self, labels: dict[str, str] | None = None, timed: bool = True) -> str:
        """The report's footer: one line, two or three for an estimated model; ``labels``:
        {policy: the name the tables give it}, for the lines of an estimated model's mean
        weights; without ``timed``, not the fit's seconds (CSV: equal runs, equal files)."""
        if self.source == "column":
            return f"behavior probabilities: logged, column {self.name!r}"
        if self.fit is not None:
            return _describe_fit(self.fit, labels or {}, timed)
        what = f"checkpoint {self.name} ({self.kind})" if self.kind else f"entry point {self.name}"
        return f"behavior probabilities: computed from {what} (--behavior)"


def _fitted_on(folds: int) -> str:
    if folds == 1:
        return "in-sample"
    return f"out-of-fold: {folds} folds of episodes, each with the model fitted on the others"


def _describe_fit(fit: BehaviorFit, labels: dict[str, str], timed: bool) -> str:
    seconds = f" in {fit.seconds:.2f} s" if timed else ""
    lines = [
        f"behavior probabilities: estimated ({fit.model}) from {fit.steps:,} logged actions "
        f"of {fit.episodes:,} episodes{seconds}; mean log-likelihood "
        f"{fit.mean_log_likelihood:.4g} per step ({_fitted_on(fit.cross_fit)})"
    ]
    if fit.floored is not None:
        lines.append(
            f"{fit.floored:,} estimated probabilities below --min-propensity "
            f"{fit.min_propensity:g} raised to it"
        )
    for policy, weights in (fit.mean_weight or {}).items():
        estimated, logged = (
            "-" if weights[k] is None else f"{weights[k]:.4g}" for k in ("estimated", "logged")
        )
        lines.append(
            f"mean trajectory weight of {labels.get(policy, policy)}: {estimated} estimated, "
            f"{logged} with the "
            f"logged column {fit.logged_column!r} (about 1 when the behavior probabilities "
            "are right)"
        )
    if fit.mean_weight_note is not None:  # the data logs propensities, not compared
        lines.append(fit.mean_weight_note)
    return "\n".join(lines)


def column_source(schema: DataSchema) -> BehaviorSource:
    role = "behavior_log_prob" if schema.behavior_is_log else "behavior_prob"
    return BehaviorSource("column", schema.columns[role])


def policy_source(policy: Policy, discrete: bool = True) -> BehaviorSource:
    """A --behavior policy's BehaviorSource (``discrete``: the data's actions are)."""
    if policy.kind == "entry_point":
        checked = policy.actions_checked or not discrete
        return BehaviorSource("entry_point", policy.name, actions_checked=checked)
    return BehaviorSource("checkpoint", policy.name, policy.kind)


def load_behavior(spec: str, schema: DataSchema) -> Policy:
    """The ``--behavior`` policy, checked against the data's schema before any row is
    read; a PolicyError (exit 4) when it cannot be loaded or does not fit the data."""
    try:
        policy = load_one_policy(spec, "--behavior")
    except PolicyError as error:
        raise PolicyError(f"--behavior: {error}") from None
    if "observation" not in schema.columns:
        raise DataError(
            "--behavior needs the observations, but no observation column was found; "
            "name it with --obs-col"
        )
    try:
        check_against_schema(policy, schema)
    except DataError as error:
        raise PolicyError(f"--behavior {spec} does not fit the data: {error}") from None
    return policy


def check_behavior_actions(behavior: Policy, policies: list[Policy]) -> None:
    """A PolicyError (exit 4) when the behavior policy declares more discrete actions than
    an evaluation policy: an action no policy of the run can take, whose probability the
    behavior takes from the logged ones, so that every weight moves with it. Fewer is
    accepted: ``ope fit-behavior`` sizes its model by the largest logged action, and a
    logged action beyond a behavior's range is refused where it is read."""
    for policy in policies:
        if None not in (behavior.n_actions, policy.n_actions) and (
            behavior.n_actions > policy.n_actions
        ):
            raise PolicyError(
                f"--behavior {behavior.name} is over {behavior.n_actions} actions, but policy "
                f"{policy.name} is over {policy.n_actions}: the behavior's extra actions would "
                "take probability from the logged ones"
            )


def check_behavior_against_chunk(policy: Policy, chunk) -> None:
    """Action and state ranges and sizes of one chunk against the behavior policy (the
    checks ``--policy`` gets); a PolicyError (exit 4) at the first problem: a behavior
    policy that does not fit the data is never a reason to drop episodes. Its own faults
    (probabilities that do not sum to 1) are said to be the --behavior policy's."""
    for check in chunk_checks(policy, chunk, f"--behavior {policy.name}"):
        problem, rows = check.message, np.flatnonzero(check.rows)
        if rows.size:
            episode, step = chunk.locate(int(rows[0]))
            raise PolicyError(
                f"{where(chunk.file, episode, step)}--behavior {policy.name} does not fit the "
                f"data: {problem} ({rows.size} row(s) affected)"
            )


class ZeroProbabilitySteps(NamedTuple):
    """The kernel's count of real steps whose behavior log-probability is not finite
    (-inf: probability 0), and the first one, per device: leaves [D] ([1] per shard).

      count: int32 steps so affected.
      key_hi, key_lo: uint32 halves of the first such step's episode key.
      step: int32 its step in the episode.
      value: its log-probability (-inf, or NaN / +inf from a faulty entry point).
    """

    count: np.ndarray
    key_hi: np.ndarray
    key_lo: np.ndarray
    step: np.ndarray
    value: np.ndarray


def first_zero_probability(found: ZeroProbabilitySteps) -> tuple[int, int, float, int] | None:
    """(episode key, step, log-probability, steps affected) of the first flagged device's
    first step (host arrays [D]), or None when no step was flagged."""
    counts = np.asarray(found.count)
    if not counts.any():
        return None
    device = int(np.flatnonzero(counts)[0])
    key = (int(found.key_hi[device]) << 32) | int(found.key_lo[device])
    return key, int(found.step[device]), float(found.value[device]), int(counts.sum())


def zero_probability_error(
    policy: Policy, first: tuple[int, int, float, int], chunks: Iterable
) -> DataError | PolicyError:
    """The error for a logged action the behavior policy gives probability 0 (a DataError:
    the data cannot come from it) or a value that is no log-probability (NaN, +inf, above
    0 for a discrete action: a PolicyError, the policy's fault), naming its file, episode
    and step, found by key among ``chunks`` (a second, host-only read of the data, done
    only on this error path)."""
    key, step, value, count = first
    location = locate_key(key, step, chunks)
    if value != -np.inf:
        return no_log_probability(
            f"{location}behavior policy {policy.name}", value, count, returns_probabilities(policy)
        )
    return DataError(
        f"{location}behavior policy {policy.name} gives the logged action probability 0 "
        "(log-probability -inf): the data cannot come from this behavior policy "
        f"({count} step(s) so affected in the batch)"
    )
