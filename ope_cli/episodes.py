"""Record batches -> whole, validated episodes as flat per-step arrays plus lengths.

An episode cut by a record-batch boundary is carried into the next batch; every
file ends its episodes (an episode never spans files). Validation is vectorised
and reports the file, episode id and step of the first problem and how many rows
share it - or, for ``--on-invalid drop`` and ``ope inspect``, turns the same checks
into a per-episode verdict (the first failing check, one of REASONS), leaves the
invalid episodes out and counts them (``Validation``).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ope_cli.errors import DataError, where
from ope_cli.reader import SourcedBatch
from ope_cli.schema import DataSchema

PROBABILITY_TOLERANCE = 1e-6  # float32-logged probabilities of 1 may read as 1 + 1 ulp


@dataclasses.dataclass(frozen=True)
class EpisodeChunk:
    """Complete episodes from one file, steps in order, as flat arrays.

    Shapes: E episodes, N = sum(lengths) steps.
      ids: [E] episode ids (int64, or object array of str) for messages and reports.
      keys: [E] uint64 stable hashes of the ids (duplicate checks, resampling groups).
      lengths: [E] int64 steps per episode (>= 1).
      observation: [N] (index or scalar) or [N, obs_dim]; None when not read.
      action: [N] int64 (discrete), [N] float64 (scalar continuous) or [N, act_dim] float64.
      reward: [N] float64.
      log_behavior: [N] float64 log pi_b(a|s).
      log_target: [N] float64 logged log pi_e(a|s), or None.
    """

    file: str
    ids: np.ndarray
    keys: np.ndarray
    lengths: np.ndarray
    observation: np.ndarray | None
    action: np.ndarray
    reward: np.ndarray
    log_behavior: np.ndarray
    log_target: np.ndarray | None

    @property
    def num_episodes(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def num_steps(self) -> int:
        return int(self.reward.shape[0])

    @property
    def offsets(self) -> np.ndarray:
        """[E + 1] start row of each episode, then the total."""
        return np.concatenate([[0], np.cumsum(self.lengths)])

    def locate(self, row: int) -> tuple[object, int]:
        """(episode id, step) of flat row ``row``."""
        offsets = self.offsets
        episode = int(np.searchsorted(offsets, row, side="right") - 1)
        return _display_id(self.ids[episode]), int(row - offsets[episode])


def _display_id(value: object) -> object:
    return value.item() if isinstance(value, np.generic) else value


# --- hashing -----------------------------------------------------------------------------

_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def mix64(values: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: a fixed, well-spread bijection on uint64 ([n] -> [n])."""
    with np.errstate(over="ignore"):
        z = values.astype(np.uint64) + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _MIX_1
        z = (z ^ (z >> np.uint64(27))) * _MIX_2
        return z ^ (z >> np.uint64(31))


def hash_strings(array: pa.Array) -> np.ndarray:
    """[n] uint64 hashes of a string array's UTF-8 bytes, computed without a Python loop."""
    array = pc.cast(array, pa.large_string()) if not pa.types.is_large_string(array.type) else array
    _, offsets_buffer, data_buffer = array.buffers()
    offsets = np.frombuffer(offsets_buffer, np.int64)[array.offset : array.offset + len(array) + 1]
    data = (
        np.frombuffer(data_buffer, np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    )
    lengths = np.diff(offsets)
    starts = offsets[:-1]
    total = int(lengths.sum())
    hashes = np.zeros(len(array), np.uint64)
    if total:
        row = np.repeat(np.arange(len(array)), lengths)
        position = np.arange(total) - np.repeat(starts - starts[0], lengths)
        byte_index = np.repeat(starts, lengths) + position
        with np.errstate(over="ignore"):
            powers = np.cumprod(np.full(int(lengths.max()), 1099511628211, np.uint64))
            terms = (data[byte_index].astype(np.uint64) + np.uint64(1)) * powers[position]
        np.add.at(hashes, row, terms)
    return mix64(hashes ^ mix64(lengths.astype(np.uint64)))


def id_keys(ids: np.ndarray | pa.Array) -> np.ndarray:
    """[n] uint64 keys of episode ids (integers or strings)."""
    if isinstance(ids, pa.Array) and (
        pa.types.is_string(ids.type)
        or pa.types.is_large_string(ids.type)
        or pa.types.is_string_view(ids.type)
    ):
        return hash_strings(ids)
    return mix64(np.asarray(ids).astype(np.int64).view(np.uint64))


# --- what can be wrong -------------------------------------------------------------------

OnInvalid = Literal["error", "drop", "collect"]

# Why an episode is invalid: the stable keys of the report's ``dropped`` block and of
# ``ope inspect``'s problems. An episode with several problems counts under the first one
# found (in the order of the checks), so the dropped counts add up to the totals.
REASONS: tuple[str, ...] = (
    "null_step",
    "null_observation",
    "null_action",
    "null_reward",
    "null_behavior_prob",
    "null_target_prob",
    "ragged_observation",
    "ragged_action",
    "empty_episode",
    "lists_disagree",
    "duplicate_step",
    "missing_step",
    "reward_not_finite",
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
    # Never dropped: they are about the dataset or its structure, not one episode's values.
    "observation_size",
    "action_size",
    "episode_reappears",
    "file_error",
    "reward_out_of_range",
    "episode_too_long",
)
FATAL_REASONS = frozenset(
    {
        "observation_size",
        "action_size",
        "episode_reappears",
        "file_error",
        "reward_out_of_range",
        "episode_too_long",
    }
)
_REASON_INDEX = {reason: i for i, reason in enumerate(REASONS)}
# Problems found while converting a record batch, kept per row as bits until the episode
# they belong to is complete.
_READ_FLAGS: tuple[str, ...] = REASONS[:8]

Check = tuple[str, str, np.ndarray]  # (reason, problem, [N] bool: the rows that have it)


def bounds_checks(
    chunk: EpisodeChunk,
    reward_range: tuple[float, float] | None,
    horizon: int | None,
    reward_source: str | None,
    horizon_source: str | None,
) -> Iterator[Check]:
    """Rewards outside ``reward_range`` and steps at or beyond ``horizon`` (None: no check).
    Never dropped (FATAL_REASONS): the bounds are a promise about every episode, and
    betting intervals are only as good as it."""
    if reward_range is not None:
        low, high = reward_range
        yield (
            "reward_out_of_range",
            f"reward is outside the range [{low:g}, {high:g}] "
            f"({reward_source}) that betting intervals rely on",
            (chunk.reward < low) | (chunk.reward > high),
        )
    if horizon is not None:
        position = np.arange(chunk.num_steps) - np.repeat(chunk.offsets[:-1], chunk.lengths)
        yield (
            "episode_too_long",
            f"episode is longer than the horizon of {horizon} steps "
            f"({horizon_source}) that betting intervals rely on",
            position >= horizon,
        )


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


class Validation:
    """What the checks found and what was dropped (``--on-invalid drop``, ``ope inspect``)."""

    def __init__(self) -> None:
        self.problems: dict[tuple[str, str], Problem] = {}
        self.dropped: dict[str, list[int]] = {}  # reason -> [episodes, steps]

    def found(
        self,
        reason: str,
        message: str,
        file: str | None,
        episode: object,
        step: int | None,
        episodes: int,
        steps: int,
    ) -> None:
        problem = self.problems.get((reason, message))
        if problem is None:
            problem = self.problems[(reason, message)] = Problem(
                reason, message, file=file, episode=episode, step=step
            )
        problem.episodes += episodes
        problem.steps += steps

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
            counts[_REASON_INDEX[reason]] = pair
        return counts


def dropped_by_reason(counts: np.ndarray) -> dict[str, dict[str, int]]:
    """{reason: {"episodes", "steps"}} of the reasons with dropped episodes, from
    ``Validation.dropped_counts`` (summed over processes)."""
    return {
        reason: {"episodes": int(counts[i, 0]), "steps": int(counts[i, 1])}
        for i, reason in enumerate(REASONS)
        if counts[i, 0]
    }


# --- Arrow -> NumPy ----------------------------------------------------------------------


def _plain(array: pa.Array) -> pa.Array:
    """A single, non-dictionary, non-view array (views become large strings)."""
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if pa.types.is_string_view(array.type):
        array = pc.cast(array, pa.large_string())
    return array


Locate = Callable[[int], tuple[object, int | None]]  # row -> (episode id, step)
RowOf = Callable[[np.ndarray], np.ndarray]  # value indices -> row indices


def _null_reason(role: str) -> str:
    return "null_" + role.replace("_log_prob", "_prob")


def _null_message(column: str) -> str:
    return f"column {column!r} is null (every step needs a value)"


def _mark(flags: np.ndarray, reason: str, rows: np.ndarray) -> None:
    flags[rows] |= np.uint16(1 << _READ_FLAGS.index(reason))


def _check_no_nulls(
    array: pa.Array,
    column: str,
    file: str,
    locate: Locate | None,
    flags: np.ndarray | None = None,
    reason: str | None = None,
    row_of: RowOf | None = None,
) -> bool:
    """Whether ``array`` has nulls: a DataError without ``flags``, else their rows marked."""
    if not array.null_count:
        return False
    null_at = np.flatnonzero(np.asarray(pc.is_null(array)))
    rows = null_at if row_of is None else row_of(null_at)
    if flags is None:
        place = where(file, *locate(int(rows[0]))) if locate else f"{file}: "
        count = np.unique(rows).size if row_of is not None else rows.size
        raise DataError(
            f"{place}column {column!r} is null; every step needs a value ({count} "
            "row(s) affected in this record batch)"
        )
    _mark(flags, reason, rows)
    return True


def _numbers(
    array: pa.Array,
    column: str,
    file: str,
    dtype: type,
    locate: Locate | None = None,
    flags: np.ndarray | None = None,
    reason: str | None = None,
    fill: float = 0,
    row_of: RowOf | None = None,
) -> np.ndarray:
    """[n] ``dtype`` values; a null is an error, or (with ``flags``) ``fill`` and a marked row."""
    if _check_no_nulls(array, column, file, locate, flags, reason, row_of):
        if fill < 0 and pa.types.is_unsigned_integer(array.type):
            fill = 0
        array = pc.fill_null(array, fill)
    return np.asarray(array.to_numpy(zero_copy_only=False), dtype=dtype)


def _list_parts(
    array: pa.Array,
    column: str,
    file: str,
    locate: Locate | None = None,
    flags: np.ndarray | None = None,
    reason: str | None = None,
) -> tuple[pa.Array, np.ndarray, np.ndarray | None]:
    """(flattened values, [n] lengths, [n] bool null rows or None) of a list or
    fixed-size-list array. With ``flags``, a null list is marked and holds no values (a
    fixed-size one keeps its null slots)."""
    nulls = _check_no_nulls(array, column, file, locate, flags, reason)
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


def _vectors(
    array: pa.Array,
    column: str,
    file: str,
    locate: Locate,
    dim: int | None,
    flags: np.ndarray | None = None,
    role: str = "observation",
) -> np.ndarray:
    """[n, d] floats from a column of number lists of length ``dim`` (None: the batch's usual
    length). Another length is a DataError, or (with ``flags``) a marked row of zeros. Float32
    vectors stay float32 (the kernel casts on the device: half the host copies and transfer)."""
    null_reason = _null_reason(role)
    values, lengths, null_rows = _list_parts(array, column, file, locate, flags, null_reason)
    dtype = np.float32 if pa.types.is_float32(values.type) else np.float64
    n = len(lengths)
    if null_rows is None:
        null_rows = np.zeros(n, bool)
    usable = lengths[~null_rows]
    if dim is None:
        if usable.size == 0:
            return np.zeros((n, 0))
        dim = int(usable[0]) if (usable == usable[0]).all() else int(np.bincount(usable).argmax())
    ragged = (lengths != dim) & ~null_rows
    starts = np.cumsum(lengths) - lengths

    def row_of(index: np.ndarray) -> np.ndarray:
        return np.searchsorted(starts, index, side="right") - 1

    if ragged.any():
        bad = np.flatnonzero(ragged)
        if flags is None:
            episode, step = locate(int(bad[0]))
            raise DataError(
                f"{where(file, episode, step)}column {column!r} holds a vector of length "
                f"{int(lengths[bad[0]])}, but the other vectors have length {dim} "
                f"({bad.size} ragged row(s) in this batch)"
            )
        _mark(flags, f"ragged_{role}", bad)
    flat = _numbers(values, column, file, dtype, locate, flags, null_reason, 0, row_of)
    if not ragged.any() and not null_rows.any():
        return flat.reshape(n, dim)
    matrix = np.zeros((n, dim), dtype)
    good = ~ragged & ~null_rows
    matrix[good] = flat[starts[good][:, None] + np.arange(dim)]
    return matrix


# --- assembly ----------------------------------------------------------------------------


@dataclasses.dataclass
class _Rows:
    """Per-row arrays of a step-layout stretch (rows of possibly several episodes)."""

    keys: np.ndarray  # [n] uint64 (row-level id keys)
    ids: np.ndarray  # [n] ids for display
    step: np.ndarray | None
    observation: np.ndarray | None
    action: np.ndarray
    reward: np.ndarray
    log_behavior: np.ndarray
    log_target: np.ndarray | None
    flags: np.ndarray | None = None  # [n] uint16 bits of _READ_FLAGS (unless on_invalid=error)

    def _fields(self) -> dict[str, np.ndarray | None]:
        # Not dataclasses.asdict, which deep-copies every array.
        return {field.name: getattr(self, field.name) for field in dataclasses.fields(self)}

    def slice(self, start: int, stop: int | None = None) -> _Rows:
        return _Rows(
            **{
                name: None if value is None else value[start:stop]
                for name, value in self._fields().items()
            }
        )

    def take(self, order: np.ndarray) -> _Rows:
        return _Rows(
            **{
                name: None if value is None else value[order]
                for name, value in self._fields().items()
            }
        )

    @staticmethod
    def concat(first: _Rows, second: _Rows) -> _Rows:
        return _Rows(
            **{
                name: None
                if getattr(first, name) is None
                else np.concatenate([getattr(first, name), getattr(second, name)])
                for name in (f.name for f in dataclasses.fields(_Rows))
            }
        )


def _log_probability(array: np.ndarray, is_log: bool) -> np.ndarray:
    if is_log:
        return array
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(array)


ChunkChecks = Callable[["EpisodeChunk"], Iterable[Check]]


class EpisodeAssembler:
    """Turns the record batches of one dataset, in order, into validated EpisodeChunks.

    ``on_invalid``: ``error`` raises a DataError at the first problem; ``drop`` leaves out
    the episodes with a bad value (counted in ``validation``) and raises for structural
    problems (FATAL_REASONS); ``collect`` records every problem and never raises for one
    (``ope inspect``). ``chunk_checks(chunk)`` adds checks of the policies (action and
    state ranges) to the same validation.
    """

    def __init__(
        self,
        schema: DataSchema,
        on_invalid: OnInvalid = "error",
        chunk_checks: ChunkChecks | None = None,
    ):
        if on_invalid not in ("error", "drop", "collect"):
            raise ValueError(f"on_invalid must be error, drop or collect, got {on_invalid!r}")
        self.schema = schema
        self.on_invalid = on_invalid
        self.chunk_checks = chunk_checks
        self.validation = Validation()
        self._carry: _Rows | None = None
        self._seen = _SeenKeys()
        self._next_row_id = 0  # episode layout without ids: the global row number
        self._dims: dict[str, int | None] = {"observation": schema.observation_dim, "action": None}
        self.rows_read = 0

    def chunks(self, batches: Iterable[SourcedBatch]) -> Iterator[EpisodeChunk]:
        for sourced in batches:
            self.rows_read += sourced.batch.num_rows
            try:
                if self.schema.layout == "episode":
                    chunk = self._episode_rows(sourced)
                else:
                    chunk = self._step_rows(sourced)
            except pa.ArrowException as error:  # values a damaged file decoded into (bad UTF-8)
                lines = str(error).strip().splitlines() or [type(error).__name__]
                raise DataError(
                    f"{sourced.file}: cannot convert the values read: {lines[0]} "
                    "(is the file damaged?)"
                ) from None
            if chunk is not None and chunk.num_episodes:
                yield chunk

    def abandon_file(self) -> None:
        """Forgets the rows carried from a file whose reading failed (``ope inspect`` goes on
        with the next file)."""
        self._carry = None

    def seen_keys(self) -> np.ndarray:
        """[E] sorted uint64 keys of every episode assembled so far."""
        return self._seen.all_keys()

    @property
    def _flags_mode(self) -> bool:
        return self.on_invalid != "error"

    # step layout ---------------------------------------------------------------------

    def _read_step_rows(self, sourced: SourcedBatch) -> _Rows:
        s, batch, file = self.schema, sourced.batch, sourced.file
        col = s.columns
        id_array = _plain(batch.column(col["episode"]))
        _check_no_nulls(id_array, col["episode"], file, None)
        keys = id_keys(id_array)
        ids = id_array.to_numpy(zero_copy_only=False)
        flags = np.zeros(batch.num_rows, np.uint16) if self._flags_mode else None
        step = None
        if "step" in col:
            step = _numbers(
                _plain(batch.column(col["step"])),
                col["step"],
                file,
                np.int64,
                lambda row: (_display_id(ids[row]), None),
                flags,
                "null_step",
                -1,
            )

        def locate(row: int) -> tuple[object, int | None]:
            return _display_id(ids[row]), int(step[row]) if step is not None else None

        return _Rows(
            keys=keys,
            ids=ids,
            step=step,
            observation=self._observation(
                _plain(batch.column(col["observation"])), file, locate, flags
            )
            if "observation" in col
            else None,
            action=self._action(_plain(batch.column(col["action"])), file, locate, flags),
            reward=_numbers(
                _plain(batch.column(col["reward"])),
                col["reward"],
                file,
                np.float64,
                locate,
                flags,
                "null_reward",
            ),
            log_behavior=self._behavior(
                _plain(batch.column(self._behavior_column)), file, locate, flags
            ),
            log_target=self._target(_plain(batch.column(col[s.target_role])), file, locate, flags)
            if s.target is not None
            else None,
            flags=flags,
        )

    @property
    def _behavior_column(self) -> str:
        col = self.schema.columns
        return col["behavior_log_prob"] if self.schema.behavior_is_log else col["behavior_prob"]

    def _behavior(self, array: pa.Array, file: str, locate: Locate, flags) -> np.ndarray:
        return _numbers(
            array,
            self._behavior_column,
            file,
            np.float64,
            locate,
            flags,
            "null_behavior_prob",
            0.0 if self.schema.behavior_is_log else 1.0,
        )

    def _target(self, array: pa.Array, file: str, locate: Locate, flags) -> np.ndarray:
        name = self.schema.columns[self.schema.target_role]
        return _numbers(
            array,
            name,
            file,
            np.float64,
            locate,
            flags,
            "null_target_prob",
            0.0 if self.schema.target == "log_prob" else 1.0,
        )

    def _observation(self, array: pa.Array, file: str, locate, flags) -> np.ndarray:
        name = self.schema.columns["observation"]
        if self.schema.observation_kind == "vector":
            return self._vector_column(array, "observation", file, locate, flags)
        dtype = np.int64 if self.schema.observation_kind == "index" else np.float64
        return _numbers(array, name, file, dtype, locate, flags, "null_observation")

    def _action(self, array: pa.Array, file: str, locate, flags) -> np.ndarray:
        name = self.schema.columns["action"]
        if self.schema.action_kind == "discrete":
            return _numbers(array, name, file, np.int64, locate, flags, "null_action")
        if self.schema.action_is_vector:
            return self._vector_column(array, "action", file, locate, flags)
        return _numbers(array, name, file, np.float64, locate, flags, "null_action")

    def _vector_column(self, array: pa.Array, role: str, file: str, locate, flags) -> np.ndarray:
        column = self.schema.columns[role]
        # The first rows set the size; later batches' other sizes are ragged rows.
        matrix = _vectors(array, column, file, locate, self._dims[role], flags, role)
        if len(matrix) and self._dims[role] is None:
            self._dims[role] = matrix.shape[1]
        return matrix

    def _step_rows(self, sourced: SourcedBatch) -> EpisodeChunk | None:
        rows = self._read_step_rows(sourced)
        if self._carry is not None:
            rows = _Rows.concat(self._carry, rows)
            self._carry = None
        n = rows.reward.shape[0]
        if n == 0:
            return None
        starts = np.concatenate([[0], np.flatnonzero(rows.keys[1:] != rows.keys[:-1]) + 1])
        if not sourced.last_in_file:
            # The last episode may continue in the next record batch of this file.
            self._carry = rows.slice(int(starts[-1]))
            rows = rows.slice(0, int(starts[-1]))
            starts = starts[:-1]
            if not starts.size:
                return None
        lengths = np.diff(np.concatenate([starts, [rows.reward.shape[0]]]))
        return self._finish(sourced.file, rows, starts, lengths)

    # episode layout ------------------------------------------------------------------

    _EPISODE_ROLES = (
        "reward",
        "action",
        "observation",
        "step",
        "behavior_prob",
        "behavior_log_prob",
        "target_prob",
        "target_log_prob",
    )

    def _episode_rows(self, sourced: SourcedBatch) -> EpisodeChunk | None:
        s, batch, file = self.schema, sourced.batch, sourced.file
        col = s.columns
        n_episodes = batch.num_rows
        if n_episodes == 0:
            return None
        if "episode" in col:
            id_array = _plain(batch.column(col["episode"]))
            _check_no_nulls(id_array, col["episode"], file, None)
            episode_keys = id_keys(id_array)
            episode_ids = id_array.to_numpy(zero_copy_only=False)
        else:
            episode_ids = np.arange(
                self._next_row_id, self._next_row_id + n_episodes, dtype=np.int64
            )
            episode_keys = id_keys(episode_ids)
        self._next_row_id += n_episodes
        if self._flags_mode:
            keep = self._screen_episode_lists(file, batch, episode_ids)
            if not keep.all():
                self._remember(file, episode_keys[~keep], episode_ids[~keep])
                if not keep.any():
                    return None
                batch = batch.filter(pa.array(keep))
                episode_ids, episode_keys = episode_ids[keep], episode_keys[keep]
                n_episodes = batch.num_rows

        flat: dict[str, pa.Array] = {}
        lengths = None
        for role in self._EPISODE_ROLES:
            if role not in col:
                continue
            values, role_lengths, _ = _list_parts(
                _plain(batch.column(col[role])),
                col[role],
                file,
                lambda e: (_display_id(episode_ids[e]), None),
            )
            if lengths is None:
                lengths = role_lengths
            elif (mismatch := np.flatnonzero(role_lengths != lengths)).size:
                e = int(mismatch[0])
                raise DataError(
                    f"{where(file, _display_id(episode_ids[e]))}list column {col[role]!r} has "
                    f"{int(role_lengths[e])} entries but {col['reward']!r} has {int(lengths[e])} "
                    f"({mismatch.size} episode(s) disagree)"
                )
            flat[role] = values
        row_episode = np.repeat(np.arange(n_episodes), lengths)
        episode_start = np.cumsum(lengths) - lengths
        flags = np.zeros(int(lengths.sum()), np.uint16) if self._flags_mode else None
        step = None

        def locate(row: int) -> tuple[object, int]:
            e = int(row_episode[row])
            return _display_id(episode_ids[e]), int(
                step[row] if step is not None else row - episode_start[e]
            )

        if "step" in flat:
            step = _numbers(
                flat["step"], col["step"], file, np.int64, locate, flags, "null_step", -1
            )

        rows = _Rows(
            keys=episode_keys[row_episode],
            ids=episode_ids[row_episode],
            step=step,
            observation=self._observation(flat["observation"], file, locate, flags)
            if "observation" in flat
            else None,
            action=self._action(flat["action"], file, locate, flags),
            reward=_numbers(
                flat["reward"], col["reward"], file, np.float64, locate, flags, "null_reward"
            ),
            log_behavior=self._behavior(flat[self._behavior_role], file, locate, flags),
            log_target=None
            if s.target is None
            else self._target(flat[s.target_role], file, locate, flags),
            flags=flags,
        )
        empty = np.flatnonzero(lengths == 0)
        if empty.size:
            raise DataError(
                f"{where(file, _display_id(episode_ids[int(empty[0])]))}episode has no steps "
                f"({empty.size} empty episode(s) in this batch)"
            )
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        return self._finish(file, rows, starts, lengths)

    def _screen_episode_lists(
        self, file: str, batch: pa.RecordBatch, episode_ids: np.ndarray
    ) -> np.ndarray:
        """[E] bool: the episodes (rows) whose list columns are usable. Null lists, empty
        episodes and lists of different lengths are recorded (and dropped) here, before the
        lists are flattened into steps."""
        col = self.schema.columns
        roles = [role for role in self._EPISODE_ROLES if role in col]
        arrays = {role: _plain(batch.column(col[role])) for role in roles}
        null = {role: np.asarray(pc.is_null(arrays[role]), bool) for role in roles}
        lengths = {
            role: np.asarray(pc.fill_null(pc.list_value_length(arrays[role]), 0), np.int64)
            if not pa.types.is_fixed_size_list(arrays[role].type)
            else np.full(len(arrays[role]), arrays[role].type.list_size, np.int64)
            for role in roles
        }
        steps = lengths["reward"]
        checks: list[Check] = [
            (_null_reason(role), _null_message(col[role]), null[role]) for role in roles
        ]
        checks.append(("empty_episode", "episode has no steps", (steps == 0) & ~null["reward"]))
        for role in roles[1:]:
            checks.append(
                (
                    "lists_disagree",
                    f"list column {col[role]!r} and {col['reward']!r} have different lengths",
                    (lengths[role] != steps) & ~null[role] & ~null["reward"],
                )
            )
        first = self._judge(
            file,
            checks,
            steps,
            np.arange(steps.size),
            lambda e: (_display_id(episode_ids[e]), None),
            per_episode=True,
        )
        return self._drop(first, steps)

    def _remember(self, file: str, keys: np.ndarray, ids: np.ndarray) -> None:
        """Records the ids of episodes dropped before _finish (so a reappearance is caught)."""
        reappearing = self._seen.add(file, keys, ids, raise_error=self.on_invalid != "collect")
        if reappearing is not None:
            self.validation.found(
                "episode_reappears",
                _REAPPEARS,
                file,
                _display_id(ids[reappearing[0]]),
                None,
                reappearing.size,
                0,
            )

    @property
    def _behavior_role(self) -> str:
        return "behavior_log_prob" if self.schema.behavior_is_log else "behavior_prob"

    # shared --------------------------------------------------------------------------

    def _finish(
        self, file: str, rows: _Rows, starts: np.ndarray, lengths: np.ndarray
    ) -> EpisodeChunk:
        """Orders steps, validates values, and packs the episodes starting at ``starts``."""
        # Reappearing ids first: a split episode would otherwise look like a missing step.
        reappearing = self._seen.add(
            file, rows.keys[starts], rows.ids[starts], raise_error=self.on_invalid != "collect"
        )
        checks: list[Check] = []
        if reappearing is not None:
            row_mask = np.zeros(rows.reward.shape[0], bool)
            row_mask[starts[reappearing]] = True
            checks.append(("episode_reappears", _REAPPEARS, row_mask))
        if rows.step is not None:
            rows, step_checks = _order_steps(file, rows, starts, lengths, self._flags_mode)
            checks.extend(step_checks)
        chunk = EpisodeChunk(
            file=file,
            ids=rows.ids[starts],
            keys=rows.keys[starts],
            lengths=lengths.astype(np.int64),
            observation=rows.observation,
            action=rows.action,
            reward=rows.reward,
            log_behavior=rows.log_behavior,
            log_target=rows.log_target,
        )
        if rows.flags is not None and rows.flags.any():
            checks = [*self._flag_checks(rows.flags), *checks]
        all_checks = itertools.chain(
            checks,
            value_checks(chunk, self.schema),
            self.chunk_checks(chunk) if self.chunk_checks else (),
        )
        episode_of_row = _LazyEpisodeOfRow(chunk.lengths)
        first = self._judge(file, all_checks, chunk.lengths, episode_of_row, chunk.locate)
        if first is not None and (first >= 0).any():
            chunk = _select(chunk, self._drop(first, chunk.lengths))
        return dataclasses.replace(
            chunk,
            log_behavior=_log_probability(chunk.log_behavior, self.schema.behavior_is_log),
            log_target=None
            if chunk.log_target is None
            else _log_probability(chunk.log_target, self.schema.target == "log_prob"),
        )

    def _flag_checks(self, flags: np.ndarray) -> Iterator[Check]:
        col = self.schema.columns
        for bit, reason in enumerate(_READ_FLAGS):
            bad = (flags & np.uint16(1 << bit)) != 0
            if not bad.any():
                continue
            role = reason.split("_", 1)[1]
            if reason.startswith("null_"):
                column = (
                    self._behavior_column
                    if role == "behavior_prob"
                    else col[self.schema.target_role]
                    if role == "target_prob"
                    else col[role]
                )
                yield reason, _null_message(column), bad
            else:
                yield (
                    reason,
                    (
                        f"column {col[role]!r} holds a vector whose length is not "
                        f"{self._dims[role]}, the length of the other {role} vectors"
                    ),
                    bad,
                )

    def _judge(
        self,
        file: str,
        checks: Iterable[Check],
        lengths: np.ndarray,
        episode_of_row,
        locate: Locate,
        per_episode: bool = False,
    ) -> np.ndarray | None:
        """Runs ``checks`` in order. on_invalid=error: a DataError at the first problem, as
        ``file: episode E, step T: problem (N row(s) affected)``. Otherwise records each
        problem and returns [E] int16: the index in REASONS of each episode's first problem,
        or -1 (None when nothing was found)."""
        first = None
        for reason, problem, bad in checks:
            rows = np.flatnonzero(bad)
            if not rows.size:
                continue
            episode, step = locate(int(rows[0]))
            if self.on_invalid == "error" or (
                self.on_invalid == "drop" and reason in FATAL_REASONS
            ):
                unit = "episode(s)" if per_episode else "row(s)"
                raise DataError(
                    f"{where(file, episode, step)}{problem} ({rows.size} {unit} affected)"
                )
            episodes = rows if per_episode else np.unique(episode_of_row[rows])
            steps = int(lengths[rows].sum()) if per_episode else rows.size
            self.validation.found(reason, problem, file, episode, step, episodes.size, steps)
            if first is None:
                first = np.full(lengths.size, -1, np.int16)
            fresh = episodes[first[episodes] < 0]
            first[fresh] = _REASON_INDEX[reason]
        return first

    def _drop(self, first: np.ndarray | None, lengths: np.ndarray) -> np.ndarray:
        """[E] bool keep mask; the others are counted as dropped under their first reason."""
        if first is None:
            return np.ones(lengths.size, bool)
        dropped = first >= 0
        if dropped.any():
            for index in np.unique(first[dropped]):
                these = first == index
                self.validation.drop(REASONS[index], int(these.sum()), int(lengths[these].sum()))
        return ~dropped


class _LazyEpisodeOfRow:
    """episode_of_row[rows] for a chunk, built on first use (only when a check fails)."""

    def __init__(self, lengths: np.ndarray):
        self._lengths = lengths
        self._array: np.ndarray | None = None

    def __getitem__(self, rows: np.ndarray) -> np.ndarray:
        if self._array is None:
            self._array = np.repeat(np.arange(self._lengths.size), self._lengths)
        return self._array[rows]


def _select(chunk: EpisodeChunk, keep: np.ndarray) -> EpisodeChunk:
    """The chunk's episodes where ``keep`` ([E] bool) holds."""
    from ope_cli.buckets import take_episodes  # buckets imports this module

    return take_episodes(chunk, np.flatnonzero(keep))


def _order_steps(
    file: str, rows: _Rows, starts: np.ndarray, lengths: np.ndarray, collect: bool
) -> tuple[_Rows, list[Check]]:
    """Sorts rows by step within each episode. A duplicate or missing step is a DataError,
    or with ``collect`` two checks (duplicate, missing) flagging one row per bad episode."""
    n = rows.step.shape[0]
    episode_of_row = np.repeat(np.arange(lengths.size), lengths)
    position = np.arange(n) - np.repeat(starts, lengths)
    if np.array_equal(rows.step, position):
        return rows, []
    rows = rows.take(np.lexsort((rows.step, episode_of_row)))
    bad = np.flatnonzero(rows.step != position)
    if not bad.size:
        return rows, []
    if not collect:
        row = int(bad[0])
        episode = _display_id(rows.ids[row])
        bad_episodes = np.unique(episode_of_row[bad]).size
        if row > starts[episode_of_row[row]] and rows.step[row] == rows.step[row - 1]:
            problem = f"step {int(rows.step[row])} appears more than once"
        else:
            problem = f"step {int(position[row])} is missing (steps must be 0, 1, ..., length-1)"
        raise DataError(f"{where(file, episode)}{problem} ({bad_episodes} episode(s) affected)")
    first_bad = bad[np.concatenate([[True], np.diff(episode_of_row[bad]) != 0])]
    repeated = (first_bad > starts[episode_of_row[first_bad]]) & (
        rows.step[first_bad] == rows.step[np.maximum(first_bad - 1, 0)]
    )
    duplicate, missing = np.zeros(n, bool), np.zeros(n, bool)
    duplicate[first_bad[repeated] - 1] = True  # the first row of the repeated step
    missing[first_bad[~repeated]] = True  # the row where the missing step belongs
    return rows, [
        ("duplicate_step", "a step appears more than once", duplicate),
        ("missing_step", "a step is missing (steps must be 0, 1, ..., length-1)", missing),
    ]


def value_checks(chunk: EpisodeChunk, schema: DataSchema) -> Iterator[Check]:
    """The spec's 'bad values' checks, vectorised, in order; each yields the rows it flags."""
    discrete = schema.action_kind == "discrete"
    yield "reward_not_finite", "reward is NaN or infinite", ~np.isfinite(chunk.reward)
    behavior = chunk.log_behavior  # still as logged: probabilities or log-probabilities
    target = chunk.log_target
    if target is not None:
        target_positive = target > -np.inf if schema.target == "log_prob" else target > 0
    if schema.behavior_is_log:
        yield "behavior_prob_nan", "behavior log-probability is NaN", np.isnan(behavior)
        zero = behavior == -np.inf
        behavior_zero = "behavior log-probability is -inf (probability 0)"
    else:
        yield "behavior_prob_nan", "behavior probability is NaN", np.isnan(behavior)
        zero = behavior == 0
        behavior_zero = "behavior probability is 0"
    if target is not None:
        yield (
            "support_violation",
            f"support violation: the logged target probability is > 0 where the {behavior_zero}",
            zero & target_positive,
        )
        yield "behavior_prob_zero", behavior_zero, zero & ~target_positive
    else:
        yield (
            "behavior_prob_zero",
            f"{behavior_zero}, a support violation wherever the "
            "evaluation policy can take the logged action (importance weights need "
            "pi_b(a|s) > 0)",
            zero,
        )
    if schema.behavior_is_log:
        yield "behavior_prob_infinite", "behavior log-probability is +inf", behavior == np.inf
        if discrete:
            yield (
                "behavior_prob_above_one",
                "behavior log-probability is > 0 (probability > 1) for a discrete action",
                behavior > PROBABILITY_TOLERANCE,
            )
    else:
        yield "behavior_prob_negative", "behavior probability is negative", behavior < 0
        yield "behavior_prob_infinite", "behavior probability is infinite", np.isinf(behavior)
        if discrete:
            yield (
                "behavior_prob_above_one",
                "behavior probability is > 1 for a discrete action",
                behavior > 1 + PROBABILITY_TOLERANCE,
            )
    if target is not None:
        if schema.target == "log_prob":
            yield (
                "target_prob_invalid",
                "target log-probability is NaN or +inf",
                np.isnan(target) | (target == np.inf),
            )
        else:
            yield (
                "target_prob_invalid",
                "target probability is negative, NaN or infinite",
                ~np.isfinite(target) | (target < 0),
            )
            if discrete:
                yield (
                    "target_prob_above_one",
                    "target probability is > 1 for a discrete action",
                    target > 1 + PROBABILITY_TOLERANCE,
                )
    if discrete:
        yield "action_negative", "action is negative", chunk.action < 0
    else:
        yield "action_not_finite", "action is NaN or infinite", ~_finite_rows(chunk.action)
    if chunk.observation is not None:
        if chunk.observation.dtype.kind == "f":
            yield (
                "observation_not_finite",
                "observation is NaN or infinite",
                ~_finite_rows(chunk.observation),
            )
        elif schema.observation_kind == "index":
            yield "state_negative", "observation (state index) is negative", chunk.observation < 0


def _finite_rows(values: np.ndarray) -> np.ndarray:
    """[N] bool: every entry of each row ([N] or [N, d]) is finite."""
    finite = np.isfinite(values)
    if finite.ndim == 1:
        return finite
    if finite.all():  # the common case, without the slow per-row reduction
        return np.ones(finite.shape[0], bool)
    return finite.all(axis=-1)


_REAPPEARS = (
    "episode id appears in more than one place (its rows must be contiguous within one file)"
)


class _SeenKeys:
    """Episode keys seen so far, to catch an episode id that reappears (non-contiguous
    rows, or an episode split over files). 8 bytes per episode, amortised O(log n) checks.
    """

    def __init__(self) -> None:
        self._sorted = np.zeros(0, np.uint64)
        self._pending: list[np.ndarray] = []
        self._pending_size = 0

    def add(
        self, file: str, keys: np.ndarray, ids: np.ndarray, raise_error: bool = True
    ) -> np.ndarray | None:
        """Records the episodes' keys ([E] uint64). An id seen before (or twice here) is a
        DataError, or without ``raise_error`` flagged in the returned [E] bool (None: none)."""
        unique, first_index, counts = np.unique(keys, return_index=True, return_counts=True)
        repeated = None
        if (counts > 1).any():
            if raise_error:
                self._fail(file, ids[int(first_index[np.argmax(counts > 1)])])
            repeated = np.ones(keys.shape, bool)
            repeated[first_index] = False
        seen = np.zeros(keys.shape, bool)
        if self._sorted.size:
            position = np.searchsorted(self._sorted, keys).clip(max=self._sorted.size - 1)
            seen |= self._sorted[position] == keys
        for block in self._pending:
            seen |= np.isin(keys, block)
        if seen.any():
            if raise_error:
                self._fail(file, ids[int(np.argmax(seen))])
            repeated = seen if repeated is None else repeated | seen
        self._pending.append(unique)
        self._pending_size += unique.size
        if self._pending_size > max(4096, self._sorted.size // 4) or len(self._pending) > 16:
            self._sorted = np.sort(np.concatenate([self._sorted, *self._pending]))
            self._pending, self._pending_size = [], 0
        return None if repeated is None else np.flatnonzero(repeated)

    def all_keys(self) -> np.ndarray:
        """[E] sorted uint64 keys of every episode seen."""
        return np.sort(np.concatenate([self._sorted, *self._pending]))

    @staticmethod
    def _fail(file: str, episode_id: object) -> None:
        raise DataError(f"{where(file, _display_id(episode_id))}{_REAPPEARS}")
