"""Record batches -> whole, validated episodes as flat per-step arrays plus lengths.

An episode cut by a record-batch boundary is carried into the next batch; every
file ends its episodes (an episode never spans files). Validation is vectorised
and reports the file, episode id and step of the first problem and how many rows
share it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator

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
    data = np.frombuffer(data_buffer, np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
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
    if isinstance(ids, pa.Array) and (pa.types.is_string(ids.type) or pa.types.is_large_string(ids.type)
                                      or pa.types.is_string_view(ids.type)):
        return hash_strings(ids)
    return mix64(np.asarray(ids).astype(np.int64).view(np.uint64))


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


def _check_no_nulls(array: pa.Array, column: str, file: str, locate: Locate | None) -> None:
    if array.null_count:
        first = int(np.flatnonzero(np.asarray(pc.is_null(array)))[0])
        place = where(file, *locate(first)) if locate else f"{file}: "
        raise DataError(f"{place}column {column!r} is null ({array.null_count} null value(s) in this "
                        "record batch); every step needs a value")


def _numbers(array: pa.Array, column: str, file: str, dtype: type, locate: Locate | None = None) -> np.ndarray:
    _check_no_nulls(array, column, file, locate)
    return np.asarray(array.to_numpy(zero_copy_only=False), dtype=dtype)


def _list_parts(array: pa.Array, column: str, file: str, locate: Locate | None = None
                ) -> tuple[pa.Array, np.ndarray]:
    """(flattened values, [n] lengths) of a list or fixed-size-list array."""
    _check_no_nulls(array, column, file, locate)
    if pa.types.is_fixed_size_list(array.type):
        return array.flatten(), np.full(len(array), array.type.list_size, np.int64)
    return pc.list_flatten(array), np.asarray(pc.list_value_length(array), dtype=np.int64)


def _vectors(array: pa.Array, column: str, file: str, locate: Locate) -> np.ndarray:
    """[n, d] float64 from a column of equal-length number lists; ragged -> DataError."""
    values, lengths = _list_parts(array, column, file, locate)
    if len(lengths) == 0:
        return np.zeros((0, 0))
    ragged = np.flatnonzero(lengths != lengths[0])
    if ragged.size:
        episode, step = locate(int(ragged[0]))
        raise DataError(
            f"{where(file, episode, step)}column {column!r} holds a vector of length "
            f"{int(lengths[ragged[0]])}, but earlier vectors have length {int(lengths[0])} "
            f"({ragged.size} ragged row(s) in this batch)"
        )
    dim = int(lengths[0])
    return _numbers(values, column, file, np.float64,
                    lambda index: locate(index // max(dim, 1))).reshape(len(lengths), dim)


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

    def slice(self, start: int, stop: int | None = None) -> _Rows:
        return _Rows(**{
            name: None if value is None else value[start:stop]
            for name, value in dataclasses.asdict(self).items()
        })

    @staticmethod
    def concat(first: _Rows, second: _Rows) -> _Rows:
        return _Rows(**{
            name: None if getattr(first, name) is None
            else np.concatenate([getattr(first, name), getattr(second, name)])
            for name in (f.name for f in dataclasses.fields(_Rows))
        })


def _log_probability(array: np.ndarray, is_log: bool) -> np.ndarray:
    if is_log:
        return array
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.log(array)


class EpisodeAssembler:
    """Turns the record batches of one dataset, in order, into validated EpisodeChunks."""

    def __init__(self, schema: DataSchema):
        self.schema = schema
        self._carry: _Rows | None = None
        self._seen = _SeenKeys()
        self._next_row_id = 0  # episode layout without ids: the global row number
        self.rows_read = 0

    def chunks(self, batches: Iterable[SourcedBatch]) -> Iterator[EpisodeChunk]:
        for sourced in batches:
            self.rows_read += sourced.batch.num_rows
            if self.schema.layout == "episode":
                chunk = self._episode_rows(sourced)
            else:
                chunk = self._step_rows(sourced)
            if chunk is not None and chunk.num_episodes:
                yield chunk

    def seen_keys(self) -> np.ndarray:
        """[E] sorted uint64 keys of every episode assembled so far."""
        return self._seen.all_keys()

    # step layout ---------------------------------------------------------------------

    def _read_step_rows(self, sourced: SourcedBatch) -> _Rows:
        s, batch, file = self.schema, sourced.batch, sourced.file
        col = s.columns
        id_array = _plain(batch.column(col["episode"]))
        _check_no_nulls(id_array, col["episode"], file, None)
        keys = id_keys(id_array)
        ids = id_array.to_numpy(zero_copy_only=False)
        step = None
        if "step" in col:
            step = _numbers(_plain(batch.column(col["step"])), col["step"], file, np.int64,
                            lambda row: (_display_id(ids[row]), None))

        def locate(row: int) -> tuple[object, int | None]:
            return _display_id(ids[row]), int(step[row]) if step is not None else None

        return _Rows(
            keys=keys,
            ids=ids,
            step=step,
            observation=self._observation(_plain(batch.column(col["observation"])), file, locate)
            if "observation" in col else None,
            action=self._action(_plain(batch.column(col["action"])), file, locate),
            reward=_numbers(_plain(batch.column(col["reward"])), col["reward"], file, np.float64, locate),
            log_behavior=_numbers(_plain(batch.column(self._behavior_column)), self._behavior_column,
                                  file, np.float64, locate),
            log_target=self._target(batch, file, locate),
        )

    @property
    def _behavior_column(self) -> str:
        col = self.schema.columns
        return col["behavior_log_prob"] if self.schema.behavior_is_log else col["behavior_prob"]

    def _target(self, batch: pa.RecordBatch, file: str, locate: Locate) -> np.ndarray | None:
        if self.schema.target is None:
            return None
        name = self.schema.columns[self.schema.target_role]
        return _numbers(_plain(batch.column(name)), name, file, np.float64, locate)

    def _observation(self, array: pa.Array, file: str, locate) -> np.ndarray:
        name = self.schema.columns["observation"]
        if self.schema.observation_kind == "vector":
            return _vectors(array, name, file, locate)
        dtype = np.int64 if self.schema.observation_kind == "index" else np.float64
        return _numbers(array, name, file, dtype, locate)

    def _action(self, array: pa.Array, file: str, locate) -> np.ndarray:
        name = self.schema.columns["action"]
        if self.schema.action_kind == "discrete":
            return _numbers(array, name, file, np.int64, locate)
        if self.schema.action_is_vector:
            return _vectors(array, name, file, locate)
        return _numbers(array, name, file, np.float64, locate)

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
            episode_ids = np.arange(self._next_row_id, self._next_row_id + n_episodes, dtype=np.int64)
            episode_keys = id_keys(episode_ids)
        self._next_row_id += n_episodes

        flat: dict[str, pa.Array] = {}
        lengths = None
        for role in ("reward", "action", "observation", "step", "behavior_prob", "behavior_log_prob",
                     "target_prob", "target_log_prob"):
            if role not in col:
                continue
            values, role_lengths = _list_parts(_plain(batch.column(col[role])), col[role], file,
                                               lambda e: (_display_id(episode_ids[e]), None))
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
        step = None

        def locate(row: int) -> tuple[object, int]:
            e = int(row_episode[row])
            return _display_id(episode_ids[e]), int(step[row] if step is not None else row - episode_start[e])

        if "step" in flat:
            step = _numbers(flat["step"], col["step"], file, np.int64, locate)

        rows = _Rows(
            keys=episode_keys[row_episode],
            ids=episode_ids[row_episode],
            step=step,
            observation=self._observation(flat["observation"], file, locate) if "observation" in flat else None,
            action=self._action(flat["action"], file, locate),
            reward=_numbers(flat["reward"], col["reward"], file, np.float64, locate),
            log_behavior=_numbers(flat[self._behavior_role], self._behavior_column, file, np.float64,
                                  locate),
            log_target=None if s.target is None else _numbers(
                flat[s.target_role], col[s.target_role], file, np.float64, locate
            ),
        )
        empty = np.flatnonzero(lengths == 0)
        if empty.size:
            raise DataError(
                f"{where(file, _display_id(episode_ids[int(empty[0])]))}episode has no steps "
                f"({empty.size} empty episode(s) in this batch)"
            )
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        return self._finish(file, rows, starts, lengths)

    @property
    def _behavior_role(self) -> str:
        return "behavior_log_prob" if self.schema.behavior_is_log else "behavior_prob"

    # shared --------------------------------------------------------------------------

    def _finish(self, file: str, rows: _Rows, starts: np.ndarray, lengths: np.ndarray) -> EpisodeChunk:
        """Orders steps, validates values, and packs the episodes starting at ``starts``."""
        # Reappearing ids first: a split episode would otherwise look like a missing step.
        self._seen.add(file, rows.keys[starts], rows.ids[starts])
        if rows.step is not None:
            rows = _order_steps(file, rows, starts, lengths)
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
        _check_values(chunk, self.schema)
        return dataclasses.replace(
            chunk,
            log_behavior=_log_probability(chunk.log_behavior, self.schema.behavior_is_log),
            log_target=None if chunk.log_target is None
            else _log_probability(chunk.log_target, self.schema.target == "log_prob"),
        )


def _order_steps(file: str, rows: _Rows, starts: np.ndarray, lengths: np.ndarray) -> _Rows:
    """Sorts rows by step within each episode; a duplicate or missing step is a DataError."""
    n = rows.step.shape[0]
    episode_of_row = np.repeat(np.arange(lengths.size), lengths)
    position = np.arange(n) - np.repeat(starts, lengths)
    if not np.array_equal(rows.step, position):
        order = np.lexsort((rows.step, episode_of_row))
        rows = _Rows(**{
            name: None if value is None else value[order]
            for name, value in dataclasses.asdict(rows).items()
        })
        bad = np.flatnonzero(rows.step != position)
        if bad.size:
            row = int(bad[0])
            episode = _display_id(rows.ids[row])
            bad_episodes = np.unique(episode_of_row[bad]).size
            if row > starts[episode_of_row[row]] and rows.step[row] == rows.step[row - 1]:
                problem = f"step {int(rows.step[row])} appears more than once"
            else:
                problem = f"step {int(position[row])} is missing (steps must be 0, 1, ..., length-1)"
            raise DataError(f"{where(file, episode)}{problem} ({bad_episodes} episode(s) affected)")
    return rows


def _fail_rows(chunk: EpisodeChunk, bad: np.ndarray, problem: str) -> None:
    """Raises a DataError for the first of the flagged rows ``bad`` ([N] bool)."""
    rows = np.flatnonzero(bad)
    if rows.size:
        episode, step = chunk.locate(int(rows[0]))
        raise DataError(f"{where(chunk.file, episode, step)}{problem} ({rows.size} row(s) affected)")


def _finite_rows(values: np.ndarray) -> np.ndarray:
    """[N] bool: every entry of each row ([N] or [N, d]) is finite."""
    finite = np.isfinite(values)
    return finite.all(axis=-1) if finite.ndim > 1 else finite


def _check_values(chunk: EpisodeChunk, schema: DataSchema) -> None:
    """Vectorised value checks of the spec's 'bad values' section."""
    discrete = schema.action_kind == "discrete"
    _fail_rows(chunk, ~np.isfinite(chunk.reward), "reward is NaN or infinite")
    behavior = chunk.log_behavior  # still as logged: probabilities or log-probabilities
    if schema.behavior_is_log:
        _fail_rows(chunk, np.isnan(behavior), "behavior log-probability is NaN")
        _fail_rows(chunk, behavior == -np.inf, "behavior log-probability is -inf (probability 0)")
        _fail_rows(chunk, behavior == np.inf, "behavior log-probability is +inf")
        if discrete:
            _fail_rows(chunk, behavior > PROBABILITY_TOLERANCE,
                       "behavior log-probability is > 0 (probability > 1) for a discrete action")
    else:
        _fail_rows(chunk, np.isnan(behavior), "behavior probability is NaN")
        _fail_rows(chunk, behavior <= 0, "behavior probability is <= 0")
        _fail_rows(chunk, np.isinf(behavior), "behavior probability is infinite")
        if discrete:
            _fail_rows(chunk, behavior > 1 + PROBABILITY_TOLERANCE,
                       "behavior probability is > 1 for a discrete action")
    if chunk.log_target is not None:
        target = chunk.log_target
        if schema.target == "log_prob":
            _fail_rows(chunk, np.isnan(target) | (target == np.inf), "target log-probability is NaN or +inf")
        else:
            _fail_rows(chunk, ~np.isfinite(target) | (target < 0), "target probability is negative, NaN or infinite")
            if discrete:
                _fail_rows(chunk, target > 1 + PROBABILITY_TOLERANCE, "target probability is > 1 for a discrete action")
    if discrete:
        _fail_rows(chunk, chunk.action < 0, "action is negative")
    else:
        _fail_rows(chunk, ~_finite_rows(chunk.action), "action is NaN or infinite")
    if chunk.observation is not None:
        if chunk.observation.dtype.kind == "f":
            _fail_rows(chunk, ~_finite_rows(chunk.observation), "observation is NaN or infinite")
        elif schema.observation_kind == "index":
            _fail_rows(chunk, chunk.observation < 0, "observation (state index) is negative")


class _SeenKeys:
    """Episode keys seen so far, to catch an episode id that reappears (non-contiguous
    rows, or an episode split over files). 8 bytes per episode, amortised O(log n) checks.
    """

    def __init__(self) -> None:
        self._sorted = np.zeros(0, np.uint64)
        self._pending: list[np.ndarray] = []
        self._pending_size = 0

    def add(self, file: str, keys: np.ndarray, ids: np.ndarray) -> None:
        """Records the episodes' keys ([E] uint64); DataError if one was seen before."""
        unique, first_index, counts = np.unique(keys, return_index=True, return_counts=True)
        if (counts > 1).any():
            self._fail(file, ids[int(first_index[np.argmax(counts > 1)])])
        seen = np.zeros(keys.shape, bool)
        if self._sorted.size:
            position = np.searchsorted(self._sorted, keys).clip(max=self._sorted.size - 1)
            seen |= self._sorted[position] == keys
        for block in self._pending:
            seen |= np.isin(keys, block)
        if seen.any():
            self._fail(file, ids[int(np.argmax(seen))])
        self._pending.append(unique)
        self._pending_size += unique.size
        if self._pending_size > max(4096, self._sorted.size // 4) or len(self._pending) > 16:
            self._sorted = np.sort(np.concatenate([self._sorted, *self._pending]))
            self._pending, self._pending_size = [], 0

    def all_keys(self) -> np.ndarray:
        """[E] sorted uint64 keys of every episode seen."""
        return np.sort(np.concatenate([self._sorted, *self._pending]))

    @staticmethod
    def _fail(file: str, episode_id: object) -> None:
        raise DataError(
            f"{where(file, _display_id(episode_id))}episode id appears in more than one "
            "place (its rows must be contiguous within one file)"
        )
