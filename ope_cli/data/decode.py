"""Arrow columns -> NumPy arrays, with null and ragged flags.

Without flags (``--on-invalid error``) a null or a ragged vector is a DataError naming the
file, episode, step and column. With flags ([n] uint16, one bit per ``READ_FLAGS`` reason)
the row is marked, filled with a neutral value, and judged with its episode later
(``StepConverter.flag_checks``). Whole columns are converted at once: no row loops.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ope_cli.data.columns import OPTION_FOR_ROLE, DataSchema
from ope_cli.data.steps import Steps
from ope_cli.data.validate import READ_FLAGS, Check, read_flag
from ope_cli.errors import DataError, InvalidValueError, where

Locate = Callable[[int], tuple[object, int | None]]  # row -> (episode id, step)
RowOf = Callable[[np.ndarray], np.ndarray]  # value indices -> row indices


class Where(NamedTuple):
    """Where converted values come from: the file, ``locate(row)`` -> (episode id, step)
    for messages (None: the file only), and the [n] uint16 flags of rows (None: raise)."""

    file: str
    locate: Locate | None = None
    flags: np.ndarray | None = None

    def mark(self, reason: str, rows: np.ndarray) -> None:
        self.flags[rows] |= read_flag(reason)


def plain(array: pa.Array) -> pa.Array:
    """A single, non-dictionary, non-view array (views become large strings)."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if pa.types.is_string_view(array.type):
        array = pc.cast(array, pa.large_string())
    return array


def null_reason(role: str) -> str:
    return "null_" + role.replace("_log_prob", "_prob")


IN_A_LIST = "has a null in its list"  # a vector column's null entry, not a null row


def null_message(column: str, vector: bool = False) -> str:
    """The problem of a null value in ``column`` (a ``vector`` one: a null row or entry)."""
    either = f" or {IN_A_LIST}" if vector else ""
    return f"column {column!r} is null{either} (every step needs a value)"


def check_no_nulls(
    array: pa.Array,
    column: str,
    at: Where,
    reason: str | None = None,
    row_of: RowOf | None = None,
    what: str = "is null",
) -> bool:
    """Whether ``array`` has nulls: a DataError (``what`` says what is null) without flags,
    else their rows marked."""
    if not array.null_count:
        return False
    null_at = np.flatnonzero(np.asarray(pc.is_null(array)))
    rows = null_at if row_of is None else row_of(null_at)
    if at.flags is None:
        place = where(at.file, *at.locate(int(rows[0]))) if at.locate else f"{at.file}: "
        count = np.unique(rows).size if row_of is not None else rows.size
        raise InvalidValueError(  # a null value's episode can be dropped; a null id cannot
            f"{place}column {column!r} {what}; every step needs a value ({count} "
            "row(s) affected in this record batch)",
            droppable=reason is not None,
        )
    at.mark(reason, rows)
    return True


def numbers(
    array: pa.Array,
    column: str,
    dtype: type,
    at: Where,
    reason: str | None = None,
    fill: float = 0,
    row_of: RowOf | None = None,
    what: str = "is null",
) -> np.ndarray:
    """[n] ``dtype`` values; a null is an error, or (with flags) ``fill`` and a marked row."""
    if check_no_nulls(array, column, at, reason, row_of, what):
        if fill < 0 and pa.types.is_unsigned_integer(array.type):
            fill = 0
        array = pc.fill_null(array, fill)
    values = array.to_numpy(zero_copy_only=False)
    if np.issubdtype(dtype, np.integer) and np.issubdtype(values.dtype, np.floating):
        check_whole(values, column, at, row_of)
    return np.asarray(values, dtype=dtype)


def check_whole(values: np.ndarray, column: str, at: Where, row_of: RowOf | None) -> None:
    """Floats where whole numbers are expected (discrete actions, state indices: a file of
    a dataset whose first file holds integers) are refused unless each is whole; a cast
    would truncate 0.9 to 0 without a word."""
    with np.errstate(invalid="ignore"):
        bad = np.flatnonzero(~np.isfinite(values) | (values != np.trunc(values)))
    if not bad.size:
        return
    rows = bad if row_of is None else row_of(bad)
    place = where(at.file, *at.locate(int(rows[0]))) if at.locate else f"{at.file}: "
    raise InvalidValueError(
        f"{place}column {column!r} holds {float(values[bad[0]])!r} where whole numbers are "
        f"expected (discrete actions, state indices, episode ids); {bad.size} such value(s) "
        "in this record batch",
        droppable=False,
    )


def episode_ids(array: pa.Array, column: str, file: str) -> pa.Array:
    """An id column of one record batch, checked: no nulls, and floats (a later file of a
    dataset whose first file holds integers) only when whole, read as int64; two ids 2.25
    and 2.75 would otherwise both be episode 2."""
    check_no_nulls(array, column, Where(file))
    if pa.types.is_floating(array.type):
        return pa.array(numbers(array, column, np.int64, Where(file)))
    return array


def list_parts(
    array: pa.Array, column: str, at: Where, reason: str | None = None
) -> tuple[pa.Array, np.ndarray, np.ndarray | None]:
    """(flattened values, [n] lengths, [n] bool null rows or None) of a list or
    fixed-size-list array. With flags, a null list is marked and holds no values (a
    fixed-size one keeps its null slots)."""
    nulls = check_no_nulls(array, column, at, reason)
    null_rows = np.asarray(pc.is_null(array), bool) if nulls else None
    if pa.types.is_fixed_size_list(array.type):
        size = array.type.list_size
        values = (
            array.flatten()
            if not nulls
            else array.values.slice(array.offset * size, len(array) * size)
        )
        return values, np.full(len(array), size, np.int64), null_rows
    lengths = pc.list_value_length(array)
    if nulls:
        lengths = pc.fill_null(lengths, 0)
    return pc.list_flatten(array), np.asarray(lengths, dtype=np.int64), null_rows


def list_lengths(array: pa.Array) -> np.ndarray:
    """[n] int64 entries of each list (0 for a null list)."""
    if pa.types.is_fixed_size_list(array.type):
        return np.full(len(array), array.type.list_size, np.int64)
    return np.asarray(pc.fill_null(pc.list_value_length(array), 0), np.int64)


def vectors(
    array: pa.Array, column: str, at: Where, dim: int | None, role: str = "observation"
) -> np.ndarray:
    """[n, d] floats from a column of number lists of length ``dim`` (None: the length of
    the batch's first non-null list). Another length is a DataError, or (with flags) a
    marked row of zeros. Float32 vectors stay float32 (the kernel casts on the device: half
    the host copies and transfer)."""
    reason = null_reason(role)
    values, lengths, null_rows = list_parts(array, column, at, reason)
    dtype = np.float32 if pa.types.is_float32(values.type) else np.float64
    n = len(lengths)
    if null_rows is None:
        null_rows = np.zeros(n, bool)
    if dim is None:  # only without a decided width (StepConverter passes the data's)
        usable = lengths[~null_rows]
        if usable.size == 0:
            return np.zeros((n, 0))
        dim = int(usable[0])
    ragged = (lengths != dim) & ~null_rows
    starts = np.cumsum(lengths) - lengths

    def row_of(index: np.ndarray) -> np.ndarray:
        return np.searchsorted(starts, index, side="right") - 1

    if ragged.any():
        bad = np.flatnonzero(ragged)
        if at.flags is None:
            episode, step = at.locate(int(bad[0]))
            raise InvalidValueError(  # its episode can be dropped (``ragged_...``)
                f"{where(at.file, episode, step)}column {column!r} holds a vector of length "
                f"{int(lengths[bad[0]])}, but the data's vectors have length {dim} "
                f"({bad.size} ragged row(s) in this batch)"
            )
        at.mark(f"ragged_{role}", bad)
    flat = numbers(values, column, dtype, at, reason, 0, row_of, IN_A_LIST)
    if not ragged.any() and not null_rows.any():
        return flat.reshape(n, dim)
    matrix = np.zeros((n, dim), dtype)
    good = ~ragged & ~null_rows
    matrix[good] = flat[starts[good][:, None] + np.arange(dim)]
    return matrix


def log_probability(array: np.ndarray, is_log: bool) -> np.ndarray:
    """[n] log-probabilities of logged probabilities (or the log-probabilities as they are)."""
    if is_log:
        return array
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(array)


def other_role(role: str) -> str:
    """The role of a probability's log (``behavior_log_prob``), or of a log's probability."""
    if "_log_" in role:
        return role.replace("_log_prob", "_prob")
    return role.replace("_prob", "_log_prob")


# Two columns of one probability agree to this (relative) once the log is exponentiated:
# the rounding of a float32 column, not that of a printed one
TWIN_TOLERANCE = 1e-5


def check_twin(used: np.ndarray, arrays: tuple[pa.Array, pa.Array], roles, at: Where) -> None:
    """DataError at the first row where a cross-checked column disagrees with the one used:
    ``used`` [n] the used column's values as logged, ``arrays`` (used, cross-checked) as
    read, ``roles`` ((role, column) used, (role, column) cross-checked). Rows where either
    is null or no probability are not compared (the used column's are judged as such)."""
    (used_role, used_column), (twin_role, twin_column) = roles
    compared = np.asarray(pc.and_(pc.is_valid(arrays[0]), pc.is_valid(arrays[1])))
    twin = np.asarray(pc.fill_null(arrays[1], 0).to_numpy(zero_copy_only=False), np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        probability = np.exp(used) if "_log_" in used_role else used
        twin_probability = np.exp(twin) if "_log_" in twin_role else twin
        same = np.isclose(twin_probability, probability, rtol=TWIN_TOLERANCE, atol=0.0)
        # values that are no probability (NaN, negative, infinite) are the used column's
        # own validation's to judge (and --on-invalid drop's to drop), not a disagreement
        for values in (probability, twin_probability):
            compared &= np.isfinite(values) & (values >= 0)
    bad = np.flatnonzero(compared & ~same)
    if not bad.size:
        return
    row = int(bad[0])
    place = where(at.file, *at.locate(row)) if at.locate else f"{at.file}: "
    options = " or ".join(OPTION_FOR_ROLE[role] for role in sorted((used_role, twin_role)))
    raise DataError(
        f"{place}columns {used_column!r} and {twin_column!r} disagree: probability "
        f"{probability[row]:.6g} against {twin_probability[row]:.6g} ({bad.size} step(s) of "
        f"this batch); name the one to read with {options}"
    )


class StepConverter:
    """The schema's per-step columns of one dataset -> ``Steps`` of [n] NumPy arrays.
    Probabilities stay as logged (validation reads them so); vector sizes are decided once
    for the whole dataset (``widths``: ``episode_stream.vector_widths``, whatever the record
    batches), else by the first batch read, and kept."""

    def __init__(self, schema: DataSchema, widths: dict[str, int | None] | None = None):
        self.schema = schema
        widths = widths or {}
        # decided once for the whole dataset (episode_stream.vector_widths), never per batch
        self.dims: dict[str, int | None] = {
            "observation": schema.observation_dim or widths.get("observation"),
            "action": widths.get("action"),
        }

    @property
    def behavior_role(self) -> str:
        return "behavior_log_prob" if self.schema.behavior_is_log else "behavior_prob"

    def column(self, role: str) -> str:
        return self.schema.columns[role]

    def steps(self, column_of: Callable[[str], pa.Array], at: Where) -> Steps:
        """The per-step fields converted from the arrays ``column_of(role)`` ([n] each); a
        DataError where a cross-checked column disagrees with the one used."""
        s = self.schema
        steps = self._steps(column_of, at)
        for role, other in s.cross_checked.items():
            twin = column_of(role)
            if twin is None:  # its lists could not be compared in this batch
                continue
            used = steps.log_behavior if role.startswith("behavior") else steps.log_target
            used_role = other_role(role)
            arrays = (column_of(used_role), twin)
            check_twin(used, arrays, ((used_role, s.columns[used_role]), (role, other)), at)
        return steps

    def _steps(self, column_of: Callable[[str], pa.Array], at: Where) -> Steps:
        s = self.schema
        return Steps(
            observation=self._observation(column_of("observation"), at)
            if "observation" in s.columns
            else None,
            action=self._action(column_of("action"), at),
            reward=numbers(
                column_of("reward"), self.column("reward"), np.float64, at, "null_reward"
            )
            if "reward" in s.columns
            else None,
            log_behavior=numbers(
                column_of(self.behavior_role),
                self.column(self.behavior_role),
                np.float64,
                at,
                "null_behavior_prob",
                0.0 if s.behavior_is_log else 1.0,
            )
            if s.behavior_logged
            else None,
            log_target=None
            if s.target is None
            else numbers(
                column_of(s.target_role),
                self.column(s.target_role),
                np.float64,
                at,
                "null_target_prob",
                0.0 if s.target == "log_prob" else 1.0,
            ),
            q_value=self._critic(column_of, "q_value", at),
            v_value=self._critic(column_of, "v_value", at),
        )

    def _critic(self, column_of, role: str, at: Where) -> np.ndarray | None:
        """The user's Q-hat or V-hat column (``--q-col``/``--v-col``), when named."""
        if role not in self.schema.columns:
            return None
        return numbers(column_of(role), self.column(role), np.float64, at, f"null_{role}")

    def logs(self, steps: Steps) -> Steps:
        """``steps`` with the logged probabilities as log-probabilities."""
        s = self.schema
        return steps._replace(
            log_behavior=None
            if steps.log_behavior is None
            else log_probability(steps.log_behavior, s.behavior_is_log),
            log_target=None
            if steps.log_target is None
            else log_probability(steps.log_target, s.target == "log_prob"),
        )

    def _observation(self, array: pa.Array, at: Where) -> np.ndarray:
        kind = self.schema.observation_kind
        if kind == "vector":
            return self._vectors(array, "observation", at)
        dtype = np.int64 if kind == "index" else np.float64
        return numbers(array, self.column("observation"), dtype, at, "null_observation")

    def _action(self, array: pa.Array, at: Where) -> np.ndarray:
        if self.schema.action_kind == "discrete":
            return numbers(array, self.column("action"), np.int64, at, "null_action")
        if self.schema.action_is_vector:
            return self._vectors(array, "action", at)
        return numbers(array, self.column("action"), np.float64, at, "null_action")

    def _vectors(self, array: pa.Array, role: str, at: Where) -> np.ndarray:
        # The dataset's size (``widths``; without them, the first batch's, 0 for a batch of
        # nulls, so that every batch's rows have one shape); others are ragged.
        matrix = vectors(array, self.column(role), at, self.dims[role], role)
        if len(matrix) and self.dims[role] is None:
            self.dims[role] = matrix.shape[1]
        return matrix

    def flag_checks(self, flags: np.ndarray) -> Iterator[Check]:
        """The problems marked in ``flags`` ([n] uint16) as checks, in READ_FLAGS order."""
        for reason in READ_FLAGS:
            bad = (flags & read_flag(reason)) != 0
            if not bad.any():
                continue
            role = reason.split("_", 1)[1]
            if reason.startswith("null_"):
                vector = {
                    "observation": self.schema.observation_kind == "vector",
                    "action": self.schema.action_is_vector,
                }.get(role, False)
                yield Check(reason, null_message(self._column_of_null(role), vector), bad)
            else:
                yield Check(
                    reason,
                    f"column {self.column(role)!r} holds a vector whose length is not "
                    f"{self.dims[role]}, the data's length of {role} vectors",
                    bad,
                )

    def _column_of_null(self, role: str) -> str:
        if role == "behavior_prob":
            return self.column(self.behavior_role)
        if role == "target_prob":
            return self.column(self.schema.target_role)
        return self.column(role)
