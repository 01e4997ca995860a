"""Column roles, aliases, layout detection and type checks, from the Arrow schema alone."""

from __future__ import annotations

import dataclasses
from typing import Literal

import pyarrow as pa

from ope_cli.config import ColumnMapping
from ope_cli.errors import DataError

Layout = Literal["step", "episode"]
ObservationKind = Literal["index", "scalar", "vector"]
ActionKind = Literal["discrete", "continuous"]

# Default names first, then the aliases the spec recognises; plural forms serve the
# episode layout but are accepted in either.
ALIASES: dict[str, tuple[str, ...]] = {
    "episode": (
        "episode_id",
        "episode",
        "episode_ids",
        "episode_index",
        "trajectory_id",
        "traj_id",
    ),
    "step": ("step", "steps", "t", "timestep", "step_id"),
    "observation": ("observation", "observations", "obs", "state", "states"),
    "action": ("action", "actions"),
    "reward": ("reward", "rewards"),
    "behavior_prob": (
        "behavior_prob",
        "behavior_probs",
        "action_prob",
        "action_probs",
        "propensity",
        "propensities",
        "pscore",
    ),
    "behavior_log_prob": (
        "behavior_log_prob",
        "behavior_log_probs",
        "behavior_logp",
        "log_propensity",
    ),
    "target_prob": ("target_prob", "target_probs"),
    "target_log_prob": ("target_log_prob", "target_log_probs"),
    # the user's critic (--q-col/--v-col): read only when named (NAMED_ONLY), never guessed
    "q_value": ("q_value",),
    "v_value": ("v_value",),
}
NAMED_ONLY = frozenset({"q_value", "v_value"})  # roles whose column is read only when named

OPTION_FOR_ROLE = {
    "episode": "--episode-col",
    "step": "--step-col",
    "observation": "--obs-col",
    "action": "--action-col",
    "reward": "--reward-col",
    "behavior_prob": "--behavior-prob-col",
    "behavior_log_prob": "--behavior-log-prob-col",
    "target_prob": "--target-prob-col",
    "target_log_prob": "--target-log-prob-col",
    "q_value": "--q-col",
    "v_value": "--v-col",
}


@dataclasses.dataclass(frozen=True)
class DataSchema:
    """Which column plays which role, and what kind of values it holds.

    Attributes:
      layout: ``step`` (one row per step) or ``episode`` (one row per episode, list columns).
      columns: role -> column name, for the roles present.
      observation_kind: ``index`` (integer state), ``scalar`` or ``vector``; None if absent.
      observation_dim: vector length when the type fixes it (fixed-size list), else None.
      action_kind: ``discrete`` (integer) or ``continuous`` (number or vector).
      action_is_vector: whether continuous actions are lists of numbers.
      behavior_is_log: the behavior column holds log-probabilities.
      target: ``prob``/``log_prob`` when target probabilities are logged, else None.
      behavior_logged: the behavior probabilities are read from a column (False: a
        ``--behavior`` policy computes them and no behavior column is read).
      cross_checked: role -> column of a probability column found beside its log (or the
        other way round) with neither named by its option: read too, and compared with the
        one used (``decode.StepConverter``), so that two columns that disagree are refused
        rather than one of them picked without a word.
    """

    layout: Layout
    columns: dict[str, str]
    observation_kind: ObservationKind | None
    observation_dim: int | None
    action_kind: ActionKind
    action_is_vector: bool
    behavior_is_log: bool
    target: Literal["prob", "log_prob"] | None
    behavior_logged: bool = True
    cross_checked: dict[str, str] = dataclasses.field(default_factory=dict)
    source: str | None = None

    @property
    def target_role(self) -> str:
        """The role of the logged target column (``target_prob`` or ``target_log_prob``)."""
        return "target_prob" if self.target == "prob" else "target_log_prob"

    @property
    def read_columns(self) -> list[str]:
        """The column names to project when reading, in a stable order."""
        return list(dict.fromkeys(self.read_roles.values()))

    @property
    def read_roles(self) -> dict[str, str]:
        """role -> column of every column read: the roles' and the cross-checked ones."""
        return {**self.columns, **self.cross_checked}


def observations_held(kind: ObservationKind | None) -> str:
    """What an observation column of ``kind`` holds, in words for messages."""
    words = {"index": "integer states", "scalar": "floating-point numbers", "vector": "vectors"}
    return words.get(kind or "", "no observations")


def is_list(dtype: pa.DataType) -> bool:
    """Whether a column of ``dtype`` holds lists (any list flavour, views included)."""
    return (
        pa.types.is_list(dtype)
        or pa.types.is_large_list(dtype)
        or pa.types.is_fixed_size_list(dtype)
        or pa.types.is_list_view(dtype)
        or pa.types.is_large_list_view(dtype)
    )


def _is_number(dtype: pa.DataType) -> bool:
    return pa.types.is_integer(dtype) or pa.types.is_floating(dtype)


def role_candidates(role: str, names: list[str]) -> list[str]:
    """The ``names`` that ``role`` would find without its option (its default name or an
    alias, in any case)."""
    return [] if role in NAMED_ONLY else [name for name in names if name.lower() in ALIASES[role]]


OPTIONAL_ROLES = ("step", "episode")  # read when a column has their name


TWINS = {  # a probability and its log: found together, one is read and the other compared
    "behavior_prob": "behavior_log_prob",
    "behavior_log_prob": "behavior_prob",
    "target_prob": "target_log_prob",
    "target_log_prob": "target_prob",
}


def compared_roles(schema: DataSchema, mapping: ColumnMapping) -> tuple[str, ...]:
    """The roles every file of a dataset must find alike, by name: those ``schema`` reads
    that no option names, the optional ones it found no column for (a later file's 'step'
    would have been read, had the first file had it), and the twin of a probability read
    by name (a later file's log beside it would have been compared)."""
    read = [role for role in schema.read_roles if getattr(mapping, role, None) is None]
    absent = [
        role
        for role in OPTIONAL_ROLES
        if role not in schema.columns and getattr(mapping, role) is None
    ]
    twins = [
        TWINS[role] for role in read if role in TWINS and getattr(mapping, TWINS[role]) is None
    ]
    return tuple(dict.fromkeys([*read, *absent, *twins]))


ROLE_WORDS = {
    "episode": "episode id",
    "behavior_prob": "behavior probability",
    "behavior_log_prob": "behavior log-probability",
    "target_prob": "target probability",
    "target_log_prob": "target log-probability",
}


def role_words(role: str) -> str:
    """A role in words, as the README names it ("behavior probability")."""
    return ROLE_WORDS.get(role, role.replace("_", " "))


def _candidates(role: str, names: list[str], mapping: ColumnMapping) -> list[str]:
    """The columns that could play ``role``: the one its option names, else every column
    whose name is its default or an alias, in any case (several: ``_refuse_ambiguous``)."""
    override = getattr(mapping, role)
    if override is not None:
        if override not in names:
            raise DataError(
                f"column {override!r} given by {OPTION_FOR_ROLE[role]} is not in the data "
                f"(columns: {', '.join(names)})"
            )
        return [override]
    return role_candidates(role, names)


class AmbiguousColumns(DataError):
    """Two columns could each play a role the run reads (``_refuse_ambiguous``)."""


def _refuse_ambiguous(candidates: dict[str, list[str]], read: dict[str, str]) -> None:
    """A DataError for a role read (``read``: role -> column) that two columns could play
    ('reward' beside 'Reward', 'pscore' beside 'action_prob'): one was picked by column
    order or alias rank, without a word. Roles the run does not read pass."""
    for role in read:
        found = candidates.get(role, [])
        if len(found) > 1:
            raise AmbiguousColumns(
                f"columns {', '.join(map(repr, found))} could each be the {role_words(role)}; "
                "name the "
                f"one to use with {OPTION_FOR_ROLE[role]}, or rename or drop the other"
            )


def _missing(role: str, names: list[str], what: str) -> DataError:
    aliases = ", ".join(ALIASES[role][:4])
    return DataError(
        f"no {what} column found (looked for {aliases}, ...; columns present: "
        f"{', '.join(names)}); name it with {OPTION_FOR_ROLE[role]}"
    )


def _type_error(column: str, expected: str, actual: pa.DataType, role: str) -> DataError:
    return DataError(
        f"column {column!r} has type {actual}, expected {expected} "
        f"(use {OPTION_FOR_ROLE[role]} if another column holds the {role.replace('_', ' ')})"
    )


def resolve_schema(
    schema: pa.Schema,
    mapping: ColumnMapping,
    *,
    logged_target: bool,
    source: str | None = None,
    logged_behavior: bool = True,
    reads_reward: bool = True,
) -> DataSchema:
    """Detects the layout and column roles of ``schema``; raises DataError naming the column
    (and ``source``, the data's path, when given).

    With ``logged_target`` the evaluation policy's probabilities come from the data
    (no ``--policy``), so a target column is required and observations are not;
    otherwise observations are required and target columns are not read. Without
    ``logged_behavior`` (a ``--behavior`` policy) no behavior column is read; without
    ``reads_reward`` (a fit to the logged actions) no reward column is.
    """
    if source is None:
        return _resolve_schema(schema, mapping, logged_target, logged_behavior, reads_reward)
    try:
        resolved = _resolve_schema(schema, mapping, logged_target, logged_behavior, reads_reward)
    except DataError as error:
        raise type(error)(f"{source}: {error}") from None
    return dataclasses.replace(resolved, source=source)


@dataclasses.dataclass(frozen=True)
class _ColumnTypes:
    """The types of the chosen ``columns`` of ``schema`` as ``layout`` reads them, and the
    error of one of the wrong kind, naming the column that decided the layout
    (``decided_by``, or None)."""

    schema: pa.Schema
    columns: dict[str, str]
    layout: Layout
    decided_by: str | None

    def value_type(self, role: str) -> pa.DataType:
        """The type of one step's value of ``role`` (the list's item in the episode layout),
        a dictionary's values' type (Arrow IPC files keep dictionary-encoded columns as
        such; they are decoded as read)."""
        dtype = self.schema.field(self.columns[role]).type
        if self.layout == "episode":
            if not is_list(dtype):
                why = _why(self.decided_by, "holds lists")
                raise _type_error(
                    self.columns[role], f"a list column (episode layout{why})", dtype, role
                )
            dtype = dtype.value_type
        return dtype.value_type if pa.types.is_dictionary(dtype) else dtype

    def wrong_type(self, role: str, expected: str) -> DataError:
        dtype = self.schema.field(self.columns[role]).type
        if self.layout == "step" and is_list(dtype) and self.decided_by is not None:
            expected += f" (step layout, one row a step{_why(self.decided_by, 'holds no lists')})"
        return _type_error(self.columns[role], expected, dtype, role)


def _resolve_schema(
    schema: pa.Schema,
    mapping: ColumnMapping,
    logged_target: bool,
    logged_behavior: bool = True,
    reads_reward: bool = True,
) -> DataSchema:
    columns, cross_checked = _select_columns(
        list(schema.names), mapping, logged_target, logged_behavior, reads_reward
    )
    layout, decided_by = _layout(schema, mapping, columns["action"])
    types = _ColumnTypes(schema, columns, layout, decided_by)
    value_type, wrong_type = types.value_type, types.wrong_type

    for role in NUMERIC_ROLES:
        if role in columns and not _is_number(value_type(role)):
            raise wrong_type(role, "numbers")
    _check_episode_ids(schema, columns, layout, list(schema.names))
    if "step" in columns and not pa.types.is_integer(value_type("step")):
        raise wrong_type("step", "integers")

    action_kind, action_is_vector = _action_kind(value_type("action"))
    if action_kind is None:
        raise wrong_type("action", "integers, numbers or lists of numbers")
    observation_kind, observation_dim = None, None
    if "observation" in columns:
        observation_kind, observation_dim = _observation_kind(value_type("observation"))
        if observation_kind is None:
            raise wrong_type("observation", "numbers, integer states or lists of numbers")
    target = (
        "prob" if "target_prob" in columns else "log_prob" if "target_log_prob" in columns else None
    )
    return DataSchema(
        layout=layout,
        columns=columns,
        observation_kind=observation_kind,
        observation_dim=observation_dim,
        action_kind=action_kind,
        action_is_vector=action_is_vector,
        behavior_is_log="behavior_log_prob" in columns,
        target=target,
        behavior_logged=logged_behavior,
        cross_checked={
            role: name
            for role, name in cross_checked.items()
            if _could_be_read(schema.field(name).type, layout)
        },
    )


def _could_be_read(dtype: pa.DataType, layout: Layout) -> bool:
    """Whether a column of ``dtype`` holds numbers as ``layout`` reads them (a cross-checked
    column that does not is left unread, as it was before it was compared)."""
    if (layout == "episode") != is_list(dtype):
        return False
    return _is_number(dtype.value_type if is_list(dtype) else dtype)


def _prefer(
    columns: dict[str, str], plain: str, log: str, log_option: str | None, plain_option: str | None
) -> dict[str, str]:
    """Keeps one of a probability column and its log when both are found: an explicit
    option wins, else the plain probability; returns {role: column} of the other when no
    option chose (it is then compared with the one kept), else {}."""
    if plain not in columns or log not in columns:
        return {}
    other = plain if log_option is not None and plain_option is None else log
    name = columns.pop(other)
    return {} if log_option is not None or plain_option is not None else {other: name}


# Columns whose values must be numbers
NUMERIC_ROLES = (
    *("reward", "behavior_prob", "behavior_log_prob", "target_prob", "target_log_prob"),
    *("q_value", "v_value"),
)
# Columns of one value a step, read or not: scalars in the step layout, lists in the episode
# layout (an action may be a vector a step, a list in either)
LAYOUT_ROLES = ("reward", "step", "behavior_prob", "behavior_log_prob", "target_prob")


def _why(column: str | None, holds: str) -> str:
    """ ", as COLUMN HOLDS": why the data reads as its layout (nothing without a column)."""
    return "" if column is None else f", as {column!r} {holds}"


def _layout(schema: pa.Schema, mapping: ColumnMapping, action: str) -> tuple[Layout, str | None]:
    """(the data's layout, the column that decided it): "episode" where the first column
    of LAYOUT_ROLES it has holds lists. Without one (a log of actions alone, for ``ope
    fit-behavior``), the action column's type tells where it can: lists of lists (vectors a
    step) or no lists; lists of numbers (a vector a step, or a number a step of an
    episode) are a DataError."""
    names = list(schema.names)
    for role in LAYOUT_ROLES:
        if found := _candidates(role, names, mapping):
            return "episode" if is_list(schema.field(found[0]).type) else "step", found[0]
    dtype = schema.field(action).type
    if not is_list(dtype):
        return "step", None
    if is_list(dtype.value_type):
        return "episode", action
    raise DataError(
        f"column {action!r} holds lists of numbers, and without a reward, step or "
        "probability column that can be vector actions (one row a step) or an episode's "
        "actions (one row an episode): add a step column, or a reward column"
    )


def _select_columns(
    names: list[str],
    mapping: ColumnMapping,
    logged_target: bool,
    logged_behavior: bool = True,
    reads_reward: bool = True,
) -> tuple[dict, dict]:
    """({role: column name} of the roles found, checked for the required ones; {role:
    column name} of the columns read to be compared with their twin: ``_prefer``)."""
    candidates = {role: _candidates(role, names, mapping) for role in ALIASES}
    columns = {role: found[0] for role, found in candidates.items() if found}
    if not logged_target:
        columns.pop("target_prob", None)
        columns.pop("target_log_prob", None)
    elif "target_prob" not in columns and "target_log_prob" not in columns:
        raise DataError(
            "no --policy given and the data has no target_prob or target_log_prob column; "
            "pass --policy CKPT.npz or name the column with --target-prob-col"
        )
    if not reads_reward:
        columns.pop("reward", None)
    for role in ("reward", "action") if reads_reward else ("action",):
        if role not in columns:
            raise _missing(role, names, role)
    if not logged_behavior:  # --behavior computes them: the column is not read
        columns.pop("behavior_prob", None)
        columns.pop("behavior_log_prob", None)
    elif "behavior_prob" not in columns and "behavior_log_prob" not in columns:
        raise DataError(
            "no behavior probability column (behavior_prob, behavior_log_prob, ...); pass "
            "--behavior CKPT|package.module:name to compute them from the behavior policy, "
            "--behavior estimate to fit it to the logged actions, or "
            f"name the column with --behavior-prob-col (columns present: {', '.join(names)})"
        )
    cross_checked = _prefer(
        columns,
        "behavior_prob",
        "behavior_log_prob",
        mapping.behavior_log_prob,
        mapping.behavior_prob,
    )
    cross_checked |= _prefer(
        columns, "target_prob", "target_log_prob", mapping.target_log_prob, mapping.target_prob
    )
    if not logged_target and "observation" not in columns:
        raise _missing("observation", names, "observation")
    _refuse_ambiguous(candidates, {**columns, **cross_checked})
    return columns, cross_checked


def _check_episode_ids(schema: pa.Schema, columns: dict, layout: str, names: list[str]) -> None:
    """Episode ids are integers or strings; the step layout needs them."""
    if "episode" not in columns:
        if layout == "step":
            raise _missing("episode", names, "episode id")
        return
    id_type = schema.field(columns["episode"]).type
    if pa.types.is_dictionary(id_type):
        id_type = id_type.value_type
    if not (
        pa.types.is_integer(id_type)
        or pa.types.is_string(id_type)
        or pa.types.is_large_string(id_type)
        or pa.types.is_string_view(id_type)
    ):
        raise _type_error(columns["episode"], "integers or strings", id_type, "episode")


def _action_kind(action_type: pa.DataType) -> tuple[ActionKind | None, bool]:
    """(discrete or continuous, whether a vector); (None, False) for an unusable type."""
    if pa.types.is_integer(action_type):
        return "discrete", False
    if pa.types.is_floating(action_type):
        return "continuous", False
    if is_list(action_type) and _is_number(action_type.value_type):
        return "continuous", True
    return None, False


def _observation_kind(obs_type: pa.DataType) -> tuple[ObservationKind | None, int | None]:
    """(index, scalar or vector; the fixed size of a vector or None); None for an unusable type."""
    if pa.types.is_integer(obs_type):
        return "index", None
    if pa.types.is_floating(obs_type):
        return "scalar", None
    if is_list(obs_type) and _is_number(obs_type.value_type):
        return "vector", obs_type.list_size if pa.types.is_fixed_size_list(obs_type) else None
    return None, None
