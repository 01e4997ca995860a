"""Record batches -> whole, validated episodes: ``EpisodeChunk``, flat per-step arrays
plus lengths, and ``take_episodes`` / ``concat_chunks`` over it.

An episode cut by a record-batch boundary is carried into the next batch; every file ends
its episodes (an episode never spans files). Both layouts (one row per step, one row per
episode with list columns) become the same flat rows, then ``EpisodeAssembler._finish``
orders steps, validates values (``validate``) and packs the chunk. Validation reports the
file, episode id and step of the first problem - or, for ``--on-invalid drop`` and ``ope
inspect``, gives each episode a verdict, leaves the invalid ones out and counts them.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ope_cli.data.columns import DataSchema
from ope_cli.data.decode import (
    StepConverter,
    Where,
    episode_ids,
    list_lengths,
    list_parts,
    null_message,
    null_reason,
    numbers,
    plain,
)
from ope_cli.data.ids import REAPPEARS, SeenKeys, display_id, id_keys, run_starts
from ope_cli.data.sources import SourcedBatch
from ope_cli.data.steps import Steps, map_arrays, step_field
from ope_cli.data.validate import Check, OnInvalid, Validation, read_flag, value_checks
from ope_cli.errors import DataError, InvalidValueError, first_line, where

ChunkChecks = Callable[["EpisodeChunk"], Iterable[Check]]
# The list columns of the episode layout, in the order their lengths are compared.
EPISODE_ROLES = (
    "reward",
    "action",
    "observation",
    "step",
    "behavior_prob",
    "behavior_log_prob",
    "target_prob",
    "target_log_prob",
    "q_value",
    "v_value",
)


def twin_steps(array: pa.Array, lengths: np.ndarray) -> pa.Array:
    """[n] float64 steps of a cross-checked list column (``DataSchema.cross_checked``), null
    in the episodes whose list is null or not ``lengths`` [E] long: those are not compared,
    the others are (one such episode left the whole record batch uncompared, and a
    disagreement anywhere else in it unseen)."""
    own = list_lengths(array)
    usable = np.asarray(array.is_valid(), bool) & (own == lengths)
    values = pc.list_flatten(array.filter(pa.array(usable)))
    step_usable = np.repeat(usable, lengths)
    steps = np.full(step_usable.size, np.nan)
    steps[step_usable] = np.asarray(values.to_numpy(zero_copy_only=False), np.float64)
    return pa.array(steps, mask=~step_usable)


@dataclasses.dataclass(frozen=True)
class EpisodeChunk:
    """Complete episodes from one file, steps in order, as flat arrays.

    Shapes: E episodes, N = sum(lengths) steps.
      ids: [E] episode ids (int64, or object array of str) for messages and reports.
      keys: [E] uint64 stable hashes of the ids (duplicate checks, resampling groups).
      lengths: [E] int64 steps per episode (>= 1).
      steps: Steps of [N, ...] arrays (``chunk.reward`` reads ``chunk.steps.reward``).
    """

    file: str
    ids: np.ndarray
    keys: np.ndarray
    lengths: np.ndarray
    steps: Steps

    def __getattr__(self, name: str) -> np.ndarray | None:
        return step_field(self, name)

    @property
    def num_episodes(self) -> int:
        return int(self.lengths.shape[0])

    @property
    def num_steps(self) -> int:
        return int(self.steps.action.shape[0])

    @property
    def offsets(self) -> np.ndarray:
        """[E + 1] start row of each episode, then the total."""
        return np.concatenate([[0], np.cumsum(self.lengths)])

    def locate(self, row: int) -> tuple[object, int]:
        """(episode id, step) of flat row ``row``."""
        offsets = self.offsets
        episode = int(np.searchsorted(offsets, row, side="right") - 1)
        return display_id(self.ids[episode]), int(row - offsets[episode])


def take_episodes(chunk: EpisodeChunk, episodes: np.ndarray) -> EpisodeChunk:
    """The sub-chunk of the given episode indices ([k] int), steps gathered in one go
    (np.take: 3-6x faster than fancy indexing on the rows of a 2-d array)."""
    lengths = chunk.lengths[episodes]
    rows = np.repeat(chunk.offsets[episodes], lengths) + (
        np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    )
    return dataclasses.replace(
        chunk,
        ids=chunk.ids[episodes],
        keys=chunk.keys[episodes],
        lengths=lengths,
        steps=map_arrays(lambda values: np.take(values, rows, axis=0), chunk.steps),
    )


def concat_chunks(chunks: list[EpisodeChunk]) -> EpisodeChunk:
    """One chunk holding the episodes of ``chunks`` in order (file of the first)."""
    if len(chunks) == 1:
        return chunks[0]

    def joined(*parts: np.ndarray) -> np.ndarray:
        return np.concatenate(parts)

    return dataclasses.replace(
        chunks[0],
        ids=joined(*(c.ids for c in chunks)),
        keys=joined(*(c.keys for c in chunks)),
        lengths=joined(*(c.lengths for c in chunks)),
        steps=map_arrays(joined, *(c.steps for c in chunks)),
    )


class _Rows(NamedTuple):
    """Per-row arrays of a stretch of rows (of possibly several episodes), either layout."""

    keys: np.ndarray  # [n] uint64 (row-level id keys)
    ids: np.ndarray  # [n] ids for display
    step: np.ndarray | None  # [n] logged step numbers, or None without a step column
    steps: Steps  # [n, ...] per-step fields
    flags: np.ndarray | None = None  # [n] uint16 bits of READ_FLAGS (unless on_invalid=error)

    @property
    def num_rows(self) -> int:
        return int(self.keys.shape[0])

    def slice(self, start: int, stop: int | None = None) -> _Rows:
        return map_arrays(lambda values: values[start:stop], self)

    def take(self, order: np.ndarray) -> _Rows:
        # np.take: 3-6x faster than values[order] on the rows of a 2-d array (observations)
        return map_arrays(lambda values: np.take(values, order, axis=0), self)

    def owned(self) -> _Rows:
        """The rows in arrays of their own: a view (e.g. of the record batch's Arrow
        buffers) is copied, so that keeping the rows does not keep what they view."""
        return map_arrays(lambda values: values if values.base is None else values.copy(), self)

    @staticmethod
    def concat(*parts: _Rows) -> _Rows:
        return map_arrays(lambda *arrays: np.concatenate(arrays), *parts)


class EpisodeAssembler:
    """Turns the record batches of one dataset, in order, into validated EpisodeChunks.

    ``on_invalid`` (``validate.ON_INVALID``): ``error`` raises a DataError at the first
    problem; ``drop`` leaves out the episodes with a bad value (counted in ``validation``)
    and raises for structural problems (FATAL_REASONS); ``collect`` records every problem
    and never raises for one (``ope inspect``). ``chunk_checks(chunk)`` adds checks of the
    policies (action and state ranges) and bounds to the same validation.
    """

    def __init__(
        self,
        schema: DataSchema,
        on_invalid: OnInvalid | str = "error",
        chunk_checks: ChunkChecks | None = None,
        widths: dict[str, int | None] | None = None,
        first_row: int = 0,
    ):
        self.schema = schema
        self.validation = Validation(on_invalid)
        self.chunk_checks = chunk_checks
        self.converter = StepConverter(schema, widths)
        # the rows of an episode that may continue in the next record batch, in parts: a long
        # episode is joined once when it ends, not again with every batch it spans
        self._carry: list[_Rows] = []
        self._seen = SeenKeys()
        # episode layout without ids: the global row number (``first_row``: that of the
        # first row read, past the files of the processes before this one)
        self._next_row_id = first_row
        self.rows_read = 0

    @property
    def policy(self) -> OnInvalid:
        return self.validation.policy

    def chunks(self, batches: Iterable[SourcedBatch]) -> Iterator[EpisodeChunk]:
        for sourced in batches:
            self.rows_read += sourced.batch.num_rows
            try:
                if self.schema.layout == "episode":
                    chunk = self._episode_rows(sourced)
                else:
                    chunk = self._step_rows(sourced)
            except pa.ArrowException as error:  # values a damaged file decoded into (bad UTF-8)
                raise DataError(
                    f"{sourced.file}: cannot convert the values read: {first_line(error)} "
                    "(is the file damaged?)"
                ) from None
            if chunk is not None and chunk.num_episodes:
                # handed over without a name here: this generator waits at the yield while
                # the chunk's batches are made and walked, and must not keep it alive then
                # (a very long episode would be held twice, as read and as padded)
                handed, chunk = [chunk], None
                yield handed.pop()

    def abandon_file(self) -> None:
        """Forgets the rows carried from a file whose reading failed (``ope inspect`` goes on
        with the next file)."""
        self._carry = []

    def seen_keys(self) -> np.ndarray:
        """[E] sorted uint64 keys of every episode assembled so far."""
        return self._seen.all_keys()

    @property
    def seen(self) -> SeenKeys:
        """The keys of every episode assembled so far, with the file each was read from."""
        return self._seen

    def _new_flags(self, rows: int) -> np.ndarray | None:
        """[rows] uint16 read flags when problems are recorded rather than raised."""
        return np.zeros(rows, np.uint16) if self.policy.keep_going else None

    # step layout ---------------------------------------------------------------------

    def _read_step_rows(self, sourced: SourcedBatch) -> _Rows:
        batch, file = sourced.batch, sourced.file
        col = self.schema.columns
        id_array = episode_ids(plain(batch.column(col["episode"])), col["episode"], file)
        keys = id_keys(id_array)
        ids = id_array.to_numpy(zero_copy_only=False)
        flags = self._new_flags(batch.num_rows)
        step = None
        if "step" in col:
            at_id = Where(file, lambda row: (display_id(ids[row]), None), flags)
            step = numbers(
                plain(batch.column(col["step"])), col["step"], np.int64, at_id, "null_step", -1
            )

        def locate(row: int) -> tuple[object, int | None]:
            return display_id(ids[row]), int(step[row]) if step is not None else None

        read = self.schema.read_roles
        steps = self.converter.steps(
            lambda role: plain(batch.column(read[role])), Where(file, locate, flags)
        )
        return _Rows(keys=keys, ids=ids, step=step, steps=steps, flags=flags)

    def _step_rows(self, sourced: SourcedBatch) -> EpisodeChunk | None:
        rows = self._read_step_rows(sourced)
        if self._carry:
            continued = self._carry[0]
            if (
                not sourced.last_in_file
                and np.all(rows.keys == continued.keys[0])
                and np.all(rows.ids == continued.ids[0])
            ):  # all its own
                self._carry.append(rows.owned())
                return None
            rows = _Rows.concat(*self._carry, rows)
            self._carry = []
        if rows.num_rows == 0:
            return None
        starts = run_starts(rows.keys, rows.ids)
        if not sourced.last_in_file:
            # The last episode may continue in the next record batch of this file.
            self._carry = [rows.slice(int(starts[-1])).owned()]
            rows = rows.slice(0, int(starts[-1]))
            starts = starts[:-1]
            if not starts.size:
                return None
        lengths = np.diff(np.concatenate([starts, [rows.num_rows]]))
        return self._finish(sourced.file, rows, starts, lengths)

    # episode layout ------------------------------------------------------------------

    def _episode_ids(self, batch: pa.RecordBatch, file: str) -> tuple[np.ndarray, np.ndarray]:
        """([E] display ids, [E] uint64 keys) of one record batch of episodes; without an
        id column, the global row number."""
        col = self.schema.columns
        count = batch.num_rows
        self._next_row_id += count
        if "episode" not in col:
            ids = np.arange(self._next_row_id - count, self._next_row_id, dtype=np.int64)
            return ids, id_keys(ids)
        id_array = episode_ids(plain(batch.column(col["episode"])), col["episode"], file)
        return id_array.to_numpy(zero_copy_only=False), id_keys(id_array)

    def _episode_rows(self, sourced: SourcedBatch) -> EpisodeChunk | None:
        batch, file = sourced.batch, sourced.file
        if batch.num_rows == 0:
            return None
        episode_ids, episode_keys = self._episode_ids(batch, file)
        if self.policy.keep_going:
            keep = self._screen_episode_lists(file, batch, episode_ids)
            if not keep.all():
                self._remember(file, episode_keys[~keep], episode_ids[~keep])
                if not keep.any():
                    return None
                batch = batch.filter(pa.array(keep))
                episode_ids, episode_keys = episode_ids[keep], episode_keys[keep]
        flat, lengths = self._flatten_lists(batch, file, episode_ids)
        row_episode = np.repeat(np.arange(batch.num_rows), lengths)
        episode_start = np.cumsum(lengths) - lengths
        flags = self._new_flags(int(lengths.sum()))
        step = None

        def locate(row: int) -> tuple[object, int]:
            e = int(row_episode[row])
            return display_id(episode_ids[e]), int(
                step[row] if step is not None else row - episode_start[e]
            )

        at = Where(file, locate, flags)
        if "step" in flat:
            step = numbers(flat["step"], self.schema.columns["step"], np.int64, at, "null_step", -1)
        rows = _Rows(
            keys=episode_keys[row_episode],
            ids=episode_ids[row_episode],
            step=step,
            steps=self.converter.steps(flat.get, at),
            flags=flags,
        )
        empty = np.flatnonzero(lengths == 0)
        if empty.size:
            raise InvalidValueError(  # --on-invalid drop leaves it out (screened before)
                f"{where(file, display_id(episode_ids[int(empty[0])]))}episode has no steps "
                f"({empty.size} empty episode(s) in this batch)",
                reason="empty_episode",
            )
        return self._finish(file, rows, episode_start, lengths)

    def _flatten_lists(
        self, batch: pa.RecordBatch, file: str, episode_ids: np.ndarray
    ) -> tuple[dict[str, pa.Array], np.ndarray]:
        """({role: flattened values}, [E] steps per episode) of the list columns; lists of
        one episode with different lengths are a DataError."""
        col = self.schema.read_roles
        at = Where(file, lambda e: (display_id(episode_ids[e]), None))
        flat: dict[str, pa.Array] = {}
        lengths = None
        roles = [role for role in EPISODE_ROLES if role in col]
        anchor = col[roles[0]]  # the rewards' lists, or where none are read the actions'
        for role in roles:
            array = plain(batch.column(col[role]))
            if role in self.schema.cross_checked:  # after reward's: ``lengths`` is known
                flat[role] = twin_steps(array, lengths)
                continue
            # a null list is droppable, as a null value is (its error named no --on-invalid)
            values, role_lengths, _ = list_parts(array, col[role], at, null_reason(role))
            if lengths is None:
                lengths = role_lengths
            elif (mismatch := np.flatnonzero(role_lengths != lengths)).size:
                e = int(mismatch[0])
                raise InvalidValueError(  # --on-invalid drop leaves it out (screened before)
                    f"{where(file, display_id(episode_ids[e]))}list column {col[role]!r} has "
                    f"{int(role_lengths[e])} entries but {anchor!r} has {int(lengths[e])} "
                    f"({mismatch.size} episode(s) disagree{_final_entry(role_lengths, lengths)})",
                    reason="lists_disagree",
                )
            flat[role] = values
        return flat, lengths

    def _screen_episode_lists(
        self, file: str, batch: pa.RecordBatch, episode_ids: np.ndarray
    ) -> np.ndarray:
        """[E] bool: the episodes (rows) whose list columns are usable. Null lists, empty
        episodes and lists of different lengths are recorded (and dropped) here, before the
        lists are flattened into steps."""
        col = self.schema.columns
        roles = [role for role in EPISODE_ROLES if role in col]
        arrays = {role: plain(batch.column(col[role])) for role in roles}
        null = {role: np.asarray(pc.is_null(arrays[role]), bool) for role in roles}
        lengths = {role: list_lengths(arrays[role]) for role in roles}
        anchor = roles[0]  # reward, or where no reward is read, action
        steps = lengths[anchor]
        checks = [Check(null_reason(role), null_message(col[role]), null[role]) for role in roles]
        checks.append(Check("empty_episode", "episode has no steps", (steps == 0) & ~null[anchor]))
        checks.extend(
            Check(
                "lists_disagree",
                f"list column {col[role]!r} and {col[anchor]!r} have different lengths",
                (lengths[role] != steps) & ~null[role] & ~null[anchor],
            )
            for role in roles[1:]
        )
        # the steps a dropped episode is counted with: its rewards', or where that list is
        # null its longest list's (they were counted as 0)
        longest = np.max(np.stack(list(lengths.values())), axis=0)
        counted = np.where(null[anchor], longest, steps)
        first = self.validation.judge(
            file,
            checks,
            counted,
            np.arange(steps.size),
            lambda e: (display_id(episode_ids[e]), None),
            per_episode=True,
        )
        return self.validation.keep(first, counted)

    def _remember(self, file: str, keys: np.ndarray, ids: np.ndarray) -> None:
        """Records the ids of episodes dropped before _finish (so a reappearance is caught)."""
        reappearing = self._seen.add(file, keys, ids, raise_error=self.policy.fatal_errors)
        if reappearing is not None:
            self.validation.found(
                Check("episode_reappears", REAPPEARS, reappearing),
                file,
                (display_id(ids[reappearing[0]]), None),
                (reappearing.size, 0),
            )

    # shared --------------------------------------------------------------------------

    def _structure_checks(
        self, file: str, rows: _Rows, starts: np.ndarray, lengths: np.ndarray
    ) -> tuple[_Rows, list[Check]]:
        """Rows in step order, and the checks of reappearing ids and of the steps."""
        # Reappearing ids first: a split episode would otherwise look like a missing step.
        reappearing = self._seen.add(
            file, rows.keys[starts], rows.ids[starts], raise_error=self.policy.fatal_errors
        )
        checks: list[Check] = []
        if reappearing is not None:  # every row of a later part (the rows it invalidates)
            later_part = np.repeat(np.isin(np.arange(starts.size), reappearing), lengths)
            checks.append(Check("episode_reappears", REAPPEARS, later_part))
        if rows.step is not None:
            rows = _null_steps_in_place(rows, starts, lengths)
            rows, step_checks = _order_steps(file, rows, starts, lengths, self.policy.keep_going)
            if reappearing is not None:  # a later part's steps do not start at 0: no news
                step_checks = [
                    check._replace(rows=check.rows & ~later_part) for check in step_checks
                ]
            checks.extend(step_checks)
        if rows.flags is not None and rows.flags.any():
            checks = [*self.converter.flag_checks(rows.flags), *checks]
        return rows, checks

    def _finish(
        self, file: str, rows: _Rows, starts: np.ndarray, lengths: np.ndarray
    ) -> EpisodeChunk:
        """Orders steps, validates values, and packs the episodes starting at ``starts``."""
        rows, checks = self._structure_checks(file, rows, starts, lengths)
        chunk = EpisodeChunk(
            file=file,
            ids=rows.ids[starts],
            keys=rows.keys[starts],
            lengths=lengths.astype(np.int64),
            steps=rows.steps,
        )
        all_checks = itertools.chain(
            checks,
            value_checks(chunk.steps, self.schema),
            self.chunk_checks(chunk) if self.chunk_checks else (),
        )
        episode_of_row = _LazyEpisodeOfRow(chunk.lengths)
        first = self.validation.judge(
            file, all_checks, chunk.lengths, episode_of_row, _locate(chunk, rows.step)
        )
        if first is not None and (first >= 0).any():
            keep = self.validation.keep(first, chunk.lengths)
            chunk = take_episodes(chunk, np.flatnonzero(keep))
        return dataclasses.replace(chunk, steps=self.converter.logs(chunk.steps))


def _locate(chunk: EpisodeChunk, step: np.ndarray | None):
    """(episode id, step) of a flat row of ``chunk``: the row's own step where the data
    has a step column (a later part of a split episode, or an episode missing a step,
    does not count its steps from 0), else its place in its episode."""
    if step is None:
        return chunk.locate

    def locate(row: int) -> tuple[object, int]:
        return chunk.locate(row)[0], int(step[row])

    return locate


class _LazyEpisodeOfRow:
    """episode_of_row[rows] for a chunk, built on first use (only when a check fails)."""

    def __init__(self, lengths: np.ndarray):
        self._lengths = lengths
        self._array: np.ndarray | None = None

    def __getitem__(self, rows: np.ndarray) -> np.ndarray:
        if self._array is None:
            self._array = np.repeat(np.arange(self._lengths.size), self._lengths)
        return self._array[rows]


def _null_steps_in_place(rows: _Rows, starts: np.ndarray, lengths: np.ndarray) -> _Rows:
    """Rows whose step is null (recorded in ``flags``, the value filled) with their row's
    position in its episode as the step: sorted by the fill, a null at step 20 was reported
    at step 0, with a missing step there besides."""
    if rows.flags is None:
        return rows
    null = (rows.flags & read_flag("null_step")) != 0
    if not null.any():
        return rows
    position = np.arange(rows.num_rows) - np.repeat(starts, lengths)
    step = rows.step.copy()
    step[null] = position[null]
    return rows._replace(step=step)


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
        episode = display_id(rows.ids[row])
        bad_episodes = np.unique(episode_of_row[bad]).size
        step, expected = int(rows.step[row]), int(position[row])
        if row > starts[episode_of_row[row]] and rows.step[row] == rows.step[row - 1]:
            problem = f"step {step} appears more than once"
        elif step < expected:  # sorted, and every step before it in place: below 0
            problem = f"step {step} is out of range (steps must be 0, 1, ..., length-1)"
        elif expected == 0:  # its first rows are elsewhere: in another file, or process's
            problem = (
                f"step 0 is missing: its first step is {step} (steps must be 0, 1, ..., "
                "length-1; are its first rows in another file? an episode's rows must all "
                "be in one file)"
            )
        else:
            problem = f"step {expected} is missing (steps must be 0, 1, ..., length-1)"
        raise InvalidValueError(
            f"{where(file, episode)}{problem} ({bad_episodes} episode(s) affected)"
        )
    first_bad = bad[np.concatenate([[True], np.diff(episode_of_row[bad]) != 0])]
    repeated = (first_bad > starts[episode_of_row[first_bad]]) & (
        rows.step[first_bad] == rows.step[np.maximum(first_bad - 1, 0)]
    )
    duplicate, missing = np.zeros(n, bool), np.zeros(n, bool)
    duplicate[first_bad[repeated] - 1] = True  # the first row of the repeated step
    missing[first_bad[~repeated]] = True  # the row where the missing step belongs
    return rows, [
        Check("duplicate_step", "a step appears more than once", duplicate),
        Check(  # a step below 0 leaves one of 0, ..., length-1 without its row, too
            "missing_step",
            "a step is missing or out of range (steps must be 0, 1, ..., length-1)",
            missing,
            # located at the step missing there, or at the step below 0
            np.where(rows.step > position, position, rows.step),
        ),
    ]


def _final_entry(role_lengths: np.ndarray, lengths: np.ndarray) -> str:
    """What to say where every episode (of a batch) lists exactly one entry more than it
    has steps: a final observation, as Minari stores one, which no step reads."""
    if not np.array_equal(role_lengths, lengths + 1):
        return ""
    return (
        "; each lists one entry more than its steps, as a final observation would: drop the "
        "last entry of each list"
    )
