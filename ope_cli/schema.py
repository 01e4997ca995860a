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
}

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
    """

    layout: Layout
    columns: dict[str, str]
    observation_kind: ObservationKind | None
    observation_dim: int | None
    action_kind: ActionKind
    action_is_vector: bool
    behavior_is_log: bool
    target: Literal["prob", "log_prob"] | None

    @property
    def target_role(self) -> str:
        """The role of the logged target column (``target_prob`` or ``target_log_prob``)."""
        return "target_prob" if self.target == "prob" else "target_log_prob"

    @property
    def read_columns(self) -> list[str]:
        """The column names to project when reading, in a stable order."""
        return list(dict.fromkeys(self.columns.values()))


def _is_list(dtype: pa.DataType) -> bool:
    return (
        pa.types.is_list(dtype)
        or pa.types.is_large_list(dtype)
        or pa.types.is_fixed_size_list(dtype)
        or pa.types.is_list_view(dtype)
        or pa.types.is_large_list_view(dtype)
    )


def _is_number(dtype: pa.DataType) -> bool:
    return pa.types.is_integer(dtype) or pa.types.is_floating(dtype)


def _find_column(role: str, names: list[str], mapping: ColumnMapping) -> str | None:
    override = getattr(mapping, role)
    if override is not None:
        if override not in names:
            raise DataError(
                f"column {override!r} given by {OPTION_FOR_ROLE[role]} is not in the data "
                f"(columns: {', '.join(names)})"
            )
        return override
    lower = {name.lower(): name for name in names}
    for alias in ALIASES[role]:
        if alias in lower:
            return lower[alias]
    return None


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
    schema: pa.Schema, mapping: ColumnMapping, *, logged_target: bool, source: str | None = None
) -> DataSchema:
    """Detects the layout and column roles of ``schema``; raises DataError naming the column
    (and ``source``, the data's path, when given).

    With ``logged_target`` the evaluation policy's probabilities come from the data
    (no ``--policy``), so a target column is required and observations are not;
    otherwise observations are required and target columns are not read.
    """
    if source is None:
        return _resolve_schema(schema, mapping, logged_target)
    try:
        return _resolve_schema(schema, mapping, logged_target)
    except DataError as error:
        raise DataError(f"{source}: {error}") from None


def _resolve_schema(schema: pa.Schema, mapping: ColumnMapping, logged_target: bool) -> DataSchema:
    names = list(schema.names)
    found = {role: _find_column(role, names, mapping) for role in ALIASES}
    columns = {role: name for role, name in found.items() if name is not None}
    if not logged_target:
        columns.pop("target_prob", None)
        columns.pop("target_log_prob", None)
    elif "target_prob" not in columns and "target_log_prob" not in columns:
        raise DataError(
            "no --policy given and the data has no target_prob or target_log_prob column; "
            "pass --policy CKPT.npz or name the column with --target-prob-col"
        )

    for role, what in (("reward", "reward"), ("action", "action")):
        if role not in columns:
            raise _missing(role, names, what)
    if "behavior_prob" not in columns and "behavior_log_prob" not in columns:
        raise _missing("behavior_prob", names, "behavior probability")
    if "behavior_prob" in columns and "behavior_log_prob" in columns:
        # Explicit options win; otherwise prefer the plain probability.
        if mapping.behavior_log_prob is not None and mapping.behavior_prob is None:
            del columns["behavior_prob"]
        else:
            del columns["behavior_log_prob"]
    if "target_prob" in columns and "target_log_prob" in columns:
        if mapping.target_log_prob is not None and mapping.target_prob is None:
            del columns["target_prob"]
        else:
            del columns["target_log_prob"]
    if not logged_target and "observation" not in columns:
        raise _missing("observation", names, "observation")

    reward_type = schema.field(columns["reward"]).type
    layout: Layout = "episode" if _is_list(reward_type) else "step"

    def value_type(role: str) -> pa.DataType:
        dtype = schema.field(columns[role]).type
        if layout == "episode":
            if not _is_list(dtype):
                raise _type_error(columns[role], "a list column (episode layout)", dtype, role)
            return dtype.value_type
        return dtype

    for role in ("reward", "behavior_prob", "behavior_log_prob", "target_prob", "target_log_prob"):
        if role in columns and not _is_number(value_type(role)):
            raise _type_error(columns[role], "numbers", schema.field(columns[role]).type, role)

    if "episode" in columns:
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
    elif layout == "step":
        raise _missing("episode", names, "episode id")

    if "step" in columns and not pa.types.is_integer(value_type("step")):
        raise _type_error(columns["step"], "integers", schema.field(columns["step"]).type, "step")

    action_type = value_type("action")
    if pa.types.is_integer(action_type):
        action_kind: ActionKind = "discrete"
        action_is_vector = False
    elif pa.types.is_floating(action_type):
        action_kind, action_is_vector = "continuous", False
    elif _is_list(action_type) and _is_number(action_type.value_type):
        action_kind, action_is_vector = "continuous", True
    else:
        raise _type_error(
            columns["action"],
            "integers, numbers or lists of numbers",
            schema.field(columns["action"]).type,
            "action",
        )

    observation_kind: ObservationKind | None = None
    observation_dim = None
    if "observation" in columns:
        obs_type = value_type("observation")
        if pa.types.is_integer(obs_type):
            observation_kind = "index"
        elif pa.types.is_floating(obs_type):
            observation_kind = "scalar"
        elif _is_list(obs_type) and _is_number(obs_type.value_type):
            observation_kind = "vector"
            if pa.types.is_fixed_size_list(obs_type):
                observation_dim = obs_type.list_size
        else:
            raise _type_error(
                columns["observation"],
                "numbers, integer states or lists of numbers",
                schema.field(columns["observation"]).type,
                "observation",
            )

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
    )
