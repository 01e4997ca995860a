"""Validation: typed checks, the one registry of reasons, and the on-invalid policy.

A check is a ``Check(reason, message, rows)``: the [N] bool rows (or [E] episodes) that
have one problem (and ``steps``, where a row's problem is not at its own step).
``Validation.judge`` runs checks in order and, by the ``OnInvalid`` policy, raises a
DataError at the first problem (``error``), or records every problem and gives each
episode the first reason that fails it (``drop``, ``collect``); ``keep`` then counts the
dropped episodes by reason. Checks are vectorised; no loop over rows.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import numpy as np

from ope_cli.data.columns import DataSchema
from ope_cli.data.steps import Steps
from ope_cli.errors import InvalidValueError, OpeError, where

PROBABILITY_TOLERANCE = 1e-6  # float32-logged probabilities of 1 may read as 1 + 1 ulp
LOG_PROBABILITY_TOLERANCE = math.log1p(PROBABILITY_TOLERANCE)  # its log-probability bound


@dataclasses.dataclass(frozen=True)
class Reason:
    """Why an episode is invalid: a stable key of the report's ``dropped`` block and of
    ``ope inspect``'s problems.

    ``fatal``: never dropped, always an error (about the dataset, its structure or the
    bounds it promises, not one episode's values). ``read_flag``: found while converting a
    record batch, kept per row as a bit until the row's episode is complete.
    """

    name: str
    fatal: bool = False
    read_flag: bool = False


# The one registry, in reporting order: an episode with several problems counts under
# the first of its reasons here.
REGISTRY: tuple[Reason, ...] = (
    *(
        Reason(name, read_flag=True)
        for name in (
            "null_step",
            "null_observation",
            "null_action",
            "null_reward",
            "null_behavior_prob",
            "null_target_prob",
            "null_q_value",
            "null_v_value",
            "ragged_observation",
            "ragged_action",
        )
    ),
    *(
        Reason(name)
        for name in (
            "empty_episode",
            "lists_disagree",
            "duplicate_step",
            "missing_step",
            "reward_not_finite",
            "critic_not_finite",
            "behavior_prob_nan",
            "support_violation",
            "behavior_prob_zero",
            "behavior_prob_negative",
            "behavior_prob_infinite",
            "behavior_prob_above_one",
            "target_prob_invalid",
            "target_prob_above_one",
            "action_negative",
            "action_not_finite",
            "observation_not_finite",
            "state_negative",
            "action_out_of_range",
            "state_out_of_range",
        )
    ),
    *(
        Reason(name, fatal=True)
        for name in (
            "observation_size",
            "action_size",
            "episode_reappears",
            "file_error",
            "reward_out_of_range",
            "episode_too_long",
        )
    ),
)
REASONS: tuple[str, ...] = tuple(reason.name for reason in REGISTRY)
FATAL_REASONS = frozenset(reason.name for reason in REGISTRY if reason.fatal)
READ_FLAGS: tuple[str, ...] = tuple(reason.name for reason in REGISTRY if reason.read_flag)


def read_flag(reason: str) -> np.uint16:
    """The bit of the [n] uint16 read flags that marks rows with ``reason`` (READ_FLAGS)."""
    return np.uint16(1 << READ_FLAGS.index(reason))


REASON_INDEX = {name: index for index, name in enumerate(REASONS)}


class Check(NamedTuple):
    """One kind of problem: ``rows`` ([N] bool over steps, or [E] over episodes) have it."""

    reason: str  # a name in REGISTRY
    message: str
    rows: np.ndarray
    # [N] the step a row's problem is located at, where it is not the row's own (the step
    # missing before it); None: the row's own
    steps: np.ndarray | None = None


@dataclasses.dataclass(frozen=True)
class OnInvalid:
    """What invalid data does: ``keep_going`` records problems per episode instead of
    raising at the first; ``fatal_errors`` still raises for FATAL_REASONS."""

    name: str
    keep_going: bool
    fatal_errors: bool

    def raises(self, reason: str) -> bool:
        return not self.keep_going or (self.fatal_errors and reason in FATAL_REASONS)


ON_INVALID = {
    "error": OnInvalid("error", keep_going=False, fatal_errors=True),  # raise at the first
    "drop": OnInvalid("drop", keep_going=True, fatal_errors=True),  # leave the episode out
    "collect": OnInvalid("collect", keep_going=True, fatal_errors=False),  # ope inspect
}


def on_invalid_policy(name: str | OnInvalid) -> OnInvalid:
    """The policy named ``error``, ``drop`` or ``collect`` (a policy is returned as is)."""
    if isinstance(name, OnInvalid):
        return name
    if name not in ON_INVALID:
        raise ValueError(f"on_invalid must be error, drop or collect, got {name!r}")
    return ON_INVALID[name]


@dataclasses.dataclass
class Problem:
    """One kind of validation problem, how often it occurred, and where it first did."""

    reason: str
    message: str
    episodes: int = 0
    steps: int = 0  # rows (steps) affected; for a whole-episode problem, the episodes' steps
    file: str | None = None
    episode: object = None
    step: int | None = None

    @property
    def location(self) -> str:
        return where(self.file, self.episode, self.step).removesuffix(": ")


Locate = Callable[[int], tuple[object, int | None]]  # row -> (episode id, step)


class Validation:
    """What the checks found and what was dropped, under one ``OnInvalid`` policy."""

    def __init__(self, policy: OnInvalid | str = "error") -> None:
        self.policy = on_invalid_policy(policy)
        self.problems: dict[tuple[str, str], Problem] = {}
        self.dropped: dict[str, list[int]] = {}  # reason -> [episodes, steps]

    def found(
        self, check: Check, file: str | None, at: tuple[object, int | None], counts: tuple
    ) -> None:
        """Records ``check`` first seen at ``at`` (episode, step) affecting ``counts``
        (episodes, steps)."""
        problem = self.problems.get((check.reason, check.message))
        if problem is None:
            problem = self.problems[(check.reason, check.message)] = Problem(
                check.reason, check.message, file=file, episode=at[0], step=at[1]
            )
        problem.episodes += counts[0]
        problem.steps += counts[1]

    def judge(
        self,
        file: str,
        checks: Iterable[Check],
        lengths: np.ndarray,
        episode_of_row: Any,
        locate: Locate,
        per_episode: bool = False,
    ) -> np.ndarray | None:
        """Runs ``checks`` in order. A problem the policy raises for is a DataError as
        ``file: episode E, step T: problem (N row(s) affected among those read with it)``
        (the rows of the episodes judged together, not the whole data's), of the earliest
        row among those problems (the checks after a fatal one, which drop mode never runs
        either, are not run). Otherwise each problem is recorded; returns [E] int16, the
        index in REASONS of each episode's first problem or -1 (None when nothing was
        found). ``episode_of_row[rows]`` maps rows to episodes."""
        first, raised, remaining = None, None, iter(checks)
        while (check := _next_check(remaining, raised is not None)) is not None:
            rows = np.flatnonzero(check.rows)
            if not rows.size:
                continue
            if self.policy.raises(check.reason):
                if raised is None or rows[0] < raised[1][0]:  # the first row in the file
                    raised = (check, rows)
                if check.reason in FATAL_REASONS:
                    break
                continue
            at = locate(int(rows[0]))
            if check.steps is not None:
                at = (at[0], int(check.steps[rows[0]]))
            episodes = rows if per_episode else np.unique(episode_of_row[rows])
            steps = int(lengths[rows].sum()) if per_episode else rows.size
            self.found(check, file, at, (episodes.size, steps))
            if first is None:
                first = np.full(lengths.size, -1, np.int16)
            fresh = episodes[first[episodes] < 0]
            first[fresh] = REASON_INDEX[check.reason]
        if raised is not None:
            check, rows = raised
            unit = "episode(s)" if per_episode else "row(s)"
            raise InvalidValueError(
                f"{where(file, *locate(int(rows[0])))}{check.message} ({rows.size} {unit} "
                "affected among those read with it)",
                droppable=check.reason not in FATAL_REASONS,
                reason=check.reason,
            )
        return first

    def keep(self, first: np.ndarray | None, lengths: np.ndarray) -> np.ndarray:
        """[E] bool keep mask from ``judge``'s verdict; the others are counted as dropped
        under their first reason."""
        if first is None:
            return np.ones(lengths.size, bool)
        dropped = first >= 0
        for index in np.unique(first[dropped]):
            these = first == index
            self.drop(REASONS[index], int(these.sum()), int(lengths[these].sum()))
        return ~dropped

    def drop(self, reason: str, episodes: int, steps: int) -> None:
        counts = self.dropped.setdefault(reason, [0, 0])
        counts[0] += episodes
        counts[1] += steps

    @property
    def episodes_dropped(self) -> int:
        return sum(episodes for episodes, _ in self.dropped.values())

    @property
    def steps_dropped(self) -> int:
        return sum(steps for _, steps in self.dropped.values())

    def dropped_counts(self) -> np.ndarray:
        """[len(REASONS), 2] int64 (episodes, steps) per reason, to sum across processes."""
        counts = np.zeros((len(REASONS), 2), np.int64)
        for reason, pair in self.dropped.items():
            counts[REASON_INDEX[reason]] = pair
        return counts


def dropped_by_reason(counts: np.ndarray) -> dict[str, dict[str, int]]:
    """{reason: {"episodes", "steps"}} of the reasons with dropped episodes, from
    ``Validation.dropped_counts`` (summed over processes)."""
    return {
        reason: {"episodes": int(counts[i, 0]), "steps": int(counts[i, 1])}
        for i, reason in enumerate(REASONS)
        if counts[i, 0]
    }


# --- checks of values ---------------------------------------------------------------------


def _next_check(checks: Iterator[Check], found: bool) -> Check | None:
    """The next of ``checks`` (None after the last). Where making it fails (a policy check
    raises its PolicyError as it is made) once a data problem is ``found``, None: that
    problem is reported first, as it was when the first problem ended the checks."""
    try:
        return next(checks)
    except StopIteration:
        return None
    except OpeError:
        if found:
            return None
        raise


def bounds_checks(
    steps: Steps,
    lengths: np.ndarray,
    reward_range: tuple[float, float] | None,
    horizon: int | None,
    sources: tuple[str | None, str | None] = (None, None),
) -> Iterator[Check]:
    """Rewards outside ``reward_range`` and steps at or beyond ``horizon`` (None: no check)
    of flat [N] steps of episodes of ``lengths`` ([E]); ``sources`` names where the range
    and the horizon come from. Never dropped (FATAL_REASONS): the bounds are a promise
    about every episode (whatever the interval method), and betting intervals are only as
    good as it. A reward that is not
    finite is ``reward_not_finite``'s (droppable), not outside the range."""
    reward_source, horizon_source = sources
    if reward_range is not None and steps.reward is not None:
        low, high = reward_range
        reward = steps.reward
        yield Check(
            "reward_out_of_range",
            f"reward is outside the range [{low:g}, {high:g}] ({reward_source})",
            np.isfinite(reward) & ((reward < low) | (reward > high)),
        )
    if horizon is not None:
        starts = np.cumsum(lengths) - lengths
        position = np.arange(int(lengths.sum())) - np.repeat(starts, lengths)
        yield Check(
            "episode_too_long",
            f"episode is longer than the horizon of {horizon} steps ({horizon_source})",
            position >= horizon,
        )


def value_checks(steps: Steps, schema: DataSchema) -> Iterator[Check]:
    """The spec's 'bad values' checks of flat [N] steps (probabilities still as logged),
    vectorised, in order; each flags the rows that have its problem."""
    if steps.reward is not None:
        yield Check("reward_not_finite", "reward is NaN or infinite", ~np.isfinite(steps.reward))
    for critic, option in ((steps.q_value, "--q-col"), (steps.v_value, "--v-col")):
        if critic is not None:
            yield Check(
                "critic_not_finite", f"the {option} value is NaN or infinite", ~np.isfinite(critic)
            )
    if steps.log_behavior is not None:  # None: a --behavior policy computes them
        yield from _behavior_checks(steps, schema)
    if steps.log_target is not None:
        yield from _target_checks(steps.log_target, schema)
    yield from _action_and_state_checks(steps, schema)


def _behavior_checks(steps: Steps, schema: DataSchema) -> Iterator[Check]:
    behavior, target = steps.log_behavior, steps.log_target
    discrete = schema.action_kind == "discrete"
    if schema.behavior_is_log:
        yield Check("behavior_prob_nan", "behavior log-probability is NaN", np.isnan(behavior))
        zero = behavior == -np.inf
        behavior_zero = "behavior log-probability is -inf (probability 0)"
    else:
        yield Check("behavior_prob_nan", "behavior probability is NaN", np.isnan(behavior))
        zero = behavior == 0
        behavior_zero = "behavior probability is 0"
    if target is not None:
        target_positive = target > -np.inf if schema.target == "log_prob" else target > 0
        yield Check(
            "support_violation",
            f"support violation: the logged target probability is > 0 where the {behavior_zero}",
            zero & target_positive,
        )
        yield Check("behavior_prob_zero", behavior_zero, zero & ~target_positive)
    else:
        yield Check(
            "behavior_prob_zero",
            f"{behavior_zero}, a support violation wherever the "
            "evaluation policy can take the logged action (importance weights need "
            "pi_b(a|s) > 0)",
            zero,
        )
    if schema.behavior_is_log:
        yield Check(
            "behavior_prob_infinite", "behavior log-probability is +inf", behavior == np.inf
        )
        if discrete:
            yield Check(
                "behavior_prob_above_one",
                "behavior log-probability is > 0 (probability > 1) for a discrete action",
                (behavior > PROBABILITY_TOLERANCE) & (behavior != np.inf),
            )
    else:
        # an infinite value is one problem, ``infinite``, not also negative or above 1
        finite = np.isfinite(behavior)
        yield Check(
            "behavior_prob_negative", "behavior probability is negative", finite & (behavior < 0)
        )
        yield Check(
            "behavior_prob_infinite", "behavior probability is infinite", np.isinf(behavior)
        )
        if discrete:
            yield Check(
                "behavior_prob_above_one",
                "behavior probability is > 1 for a discrete action",
                finite & (behavior > 1 + PROBABILITY_TOLERANCE),
            )


def _target_checks(target: np.ndarray, schema: DataSchema) -> Iterator[Check]:
    if schema.target == "log_prob":
        yield Check(
            "target_prob_invalid",
            "target log-probability is NaN or +inf",
            np.isnan(target) | (target == np.inf),
        )
        if schema.action_kind == "discrete":
            yield Check(
                "target_prob_above_one",
                "target log-probability is > 0 (probability > 1) for a discrete action",
                (target > PROBABILITY_TOLERANCE) & (target != np.inf),
            )
        return
    yield Check(
        "target_prob_invalid",
        "target probability is negative, NaN or infinite",
        ~np.isfinite(target) | (target < 0),
    )
    if schema.action_kind == "discrete":
        yield Check(
            "target_prob_above_one",
            "target probability is > 1 for a discrete action",
            np.isfinite(target) & (target > 1 + PROBABILITY_TOLERANCE),
        )


def _action_and_state_checks(steps: Steps, schema: DataSchema) -> Iterator[Check]:
    if schema.action_kind == "discrete":
        # an unsigned 64-bit integer past 2^63 - 1 reads as a negative int64
        yield Check(
            "action_negative",
            "action is negative (or an unsigned one past 2^63 - 1)",
            steps.action < 0,
        )
    else:
        yield Check("action_not_finite", "action is NaN or infinite", ~finite_rows(steps.action))
    observation = steps.observation
    if observation is None:
        return
    if observation.dtype.kind == "f":
        yield Check(
            "observation_not_finite",
            "observation is NaN or infinite",
            ~finite_rows(observation),
        )
    elif schema.observation_kind == "index":
        yield Check(
            "state_negative",
            "observation (state index) is negative or an unsigned one past 2^63 - 1 (an "
            "integer observation is a state index; store features as floats)",
            observation < 0,
        )


def finite_rows(values: np.ndarray) -> np.ndarray:
    """[N] bool: every entry of each row ([N] or [N, d]) is finite."""
    finite = np.isfinite(values)
    if finite.ndim == 1:
        return finite
    if finite.all():  # the common case, without the slow per-row reduction
        return np.ones(finite.shape[0], bool)
    return finite.all(axis=-1)
