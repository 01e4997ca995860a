"""D4RL-style HDF5 files: flat per-step datasets ``observations`` [N, ...], ``actions``
[N, ...], ``rewards`` [N], ``terminals`` [N] and ``timeouts`` [N], with optional
``next_observations`` and ``infos/action_log_probs`` (the behavior log-probabilities).
A dataset of one number per step may also be stored [N, 1] (integer actions included).

An episode ends at a step whose terminal or timeout flag is set; the steps after the last
flag form a final, truncated episode. The file is read in slices of the datasets and each
slice becomes a step-layout record batch with the standard column names (``episode_id``
numbered from the flags, ``step``, ``observation``, ``action``, ``reward`` and, when the
file has it, ``behavior_log_prob``), plus every other per-step dataset under its HDF5 path (so
``--behavior-log-prob-col infos/action_log_probs`` names it, and ``action_probs`` is
found as the behavior probability); ``observations``, ``actions`` and ``rewards`` are the
standard columns only (under their paths too, each would be a second column for its role).
h5py is an optional dependency, imported when a file is opened.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Any

import numpy as np
import pyarrow as pa

from ope_cli.data.columns import ALIASES, role_candidates
from ope_cli.data.sources.base import DeclaredBounds, SourcedBatch
from ope_cli.errors import DataError, first_line

NAME = "d4rl"
MAGIC = b"\x89HDF\r\n\x1a\n"
REQUIRED = ("observations", "actions", "rewards", "terminals", "timeouts")
FLAGS = ("terminals", "timeouts")
BEHAVIOR_KEY = "infos/action_log_probs"
# standard column name -> the dataset it views; episode_id and step come from the flags
STANDARD = {
    "observation": "observations",
    "action": "actions",
    "reward": "rewards",
    "behavior_log_prob": BEHAVIOR_KEY,
}
# datasets of one number per step: [N] or, as some writers store them, [N, 1]
ONE_PER_STEP = ("rewards", BEHAVIOR_KEY, *FLAGS)
IGNORED_GROUPS = ("metadata/",)  # D4RL keeps the data-collecting policy's weights here
INSTALL_HINT = "pip install 'ope-cli[hdf5]'"
_COUNT_ROWS = 1 << 20  # rows of flags read at a time when counting a file's episodes
_READ_ERRORS = (OSError, RuntimeError, KeyError, ValueError, TypeError)


def sniff(head: bytes) -> bool:
    return head.startswith(MAGIC)


def _h5py() -> Any:
    """The h5py module; a DataError saying how to install it when it is missing."""
    try:
        import h5py
    except ImportError:
        raise DataError(f"reading HDF5 files needs h5py: {INSTALL_HINT}") from None
    return h5py


def _open_file(h5py: Any, path: str) -> Any:
    try:
        return h5py.File(path, "r")
    except _READ_ERRORS as error:
        raise DataError(
            f"{path}: cannot open HDF5 file (truncated or corrupt?): {first_line(error)}"
        ) from None


def _roles_named(key: str) -> set[str]:
    """The column roles a dataset's path names (``action_probs``: behavior_prob)."""
    return {role for role in ALIASES if role_candidates(role, [key])}


def _one_per_step(key: str, dataset: Any) -> bool:
    """Whether ``dataset`` holds one number per step: [N], or [N, 1] for the rewards, flags
    and behavior log-probabilities, integer (discrete) actions and any dataset named after
    a column role (``action_probs``)."""
    if len(dataset.shape) == 1:
        return True
    single = int(np.prod(dataset.shape[1:])) == 1
    discrete = key == "actions" and np.issubdtype(dataset.dtype, np.integer)
    named = bool(_roles_named(key)) and key not in STANDARD.values()  # not float actions
    return single and (key in ONE_PER_STEP or discrete or named)


def _arrow_type(key: str, dataset: Any) -> pa.DataType | None:
    """The Arrow type of one row of ``dataset`` (one per step -> a number, [N, ...] -> a
    fixed-size list of the flattened row); None for values that are not numbers or
    booleans."""
    dtype = dataset.dtype
    if not (np.issubdtype(dtype, np.number) or dtype == np.bool_):
        return None
    value = pa.from_numpy_dtype(dtype)
    if _one_per_step(key, dataset):
        return value
    return pa.list_(value, int(np.prod(dataset.shape[1:])))


def _per_step_datasets(handle: Any, path: str) -> dict[str, Any]:
    """{HDF5 path: dataset} of every dataset outside the ignored groups."""
    found: dict[str, Any] = {}

    def visit(name: str, item: Any) -> None:
        if hasattr(item, "shape") and not name.startswith(IGNORED_GROUPS):
            found[name] = item

    try:
        handle.visititems(visit)
    except _READ_ERRORS as error:
        raise DataError(
            f"{path}: cannot read the HDF5 file's contents: {first_line(error)}"
        ) from None
    return found


@dataclasses.dataclass(frozen=True)
class FileLayout:
    """What one file holds: its rows N and {column name: HDF5 dataset path}, in the
    order of ``schema``."""

    rows: int
    columns: dict[str, str]
    schema: pa.Schema


def describe_file(h5py: Any, path: str) -> FileLayout:
    """The columns of one D4RL-style file, checked: the required datasets are present, hold
    numbers and have the same number of rows; raises DataError naming the file and key."""
    with _open_file(h5py, path) as handle:
        datasets = _per_step_datasets(handle, path)
        for key in REQUIRED:
            if key not in datasets:
                raise DataError(
                    f"{path}: HDF5 file has no {key!r} dataset (a D4RL-style file needs "
                    f"{', '.join(REQUIRED)})"
                )
        rows = int(datasets["rewards"].shape[0]) if datasets["rewards"].shape else 0
        checked = [*REQUIRED, *(k for k in ("next_observations", BEHAVIOR_KEY) if k in datasets)]
        for key in checked:
            shape = datasets[key].shape
            if not shape or shape[0] != rows:
                raise DataError(
                    f"{path}: datasets have different lengths: {key!r} has "
                    f"{shape[0] if shape else 0} rows, 'rewards' has {rows}"
                )
            if _arrow_type(key, datasets[key]) is None:
                raise DataError(
                    f"{path}: dataset {key!r} has dtype {datasets[key].dtype}, expected numbers"
                )
        for key in FLAGS:
            if not _one_per_step(key, datasets[key]):
                raise DataError(f"{path}: dataset {key!r} must be one flag per step [N]")
        # the roles the standard columns give: a dataset named after one of them
        # ('observations' beside 'observation') would be a second column for it
        supplied = {"episode", "step", *(role for role, key in STANDARD.items() if key in datasets)}
        extra = {  # other per-step datasets, under their HDF5 paths: one named after a
            # role ('action_probs') only as one number per step, which that role reads
            key: key
            for key, dataset in datasets.items()
            if dataset.shape
            and dataset.shape[0] == rows
            and _arrow_type(key, dataset) is not None
            and not _roles_named(key) & supplied
            and (not _roles_named(key) or _one_per_step(key, dataset))
        }
        columns = {"episode_id": "", "step": ""}
        columns.update({name: key for name, key in STANDARD.items() if key in datasets})
        columns.update(extra)
        fields = [pa.field("episode_id", pa.int64()), pa.field("step", pa.int64())]
        fields += [
            pa.field(name, _arrow_type(key, datasets[key])) for name, key in columns.items() if key
        ]
    return FileLayout(rows, columns, pa.schema(fields))


def _episode_count(h5py: Any, path: str, rows: int) -> int:
    """Episodes in one file: its flagged steps, plus one when steps follow the last flag."""
    with _open_file(h5py, path) as handle:
        flagged, last_done = 0, True
        for start in range(0, rows, _COUNT_ROWS):
            done = _done(handle, start, min(start + _COUNT_ROWS, rows))
            flagged += int(done.sum())
            last_done = bool(done[-1])
    return flagged + (0 if last_done else 1)


def _done(handle: Any, start: int, stop: int) -> np.ndarray:
    """[stop - start] bool: the step ends its episode (terminal or timeout)."""
    terminal = np.asarray(handle["terminals"][start:stop]).reshape(stop - start) != 0
    timeout = np.asarray(handle["timeouts"][start:stop]).reshape(stop - start) != 0
    return terminal | timeout


def _to_arrow(values: np.ndarray, dtype: pa.DataType) -> pa.Array:
    """[n, ...] values -> n Arrow values of ``dtype`` (fixed-size lists of flattened rows)."""
    if pa.types.is_fixed_size_list(dtype):
        flat = np.ascontiguousarray(values).reshape(-1)
        return pa.FixedSizeListArray.from_arrays(
            pa.array(flat, type=dtype.value_type), dtype.list_size
        )
    return pa.array(np.ascontiguousarray(values).reshape(len(values)), type=dtype)


@dataclasses.dataclass
class _EpisodeCursor:
    """Where the reading stands in a file's episodes: episodes ended before the slice, and
    the row the current episode starts at."""

    episodes_before: int
    episode_start: int = 0

    def number(self, done: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray]:
        """([n] episode ids, [n] steps) of the rows start..start+n with ``done`` flags."""
        n = done.size
        row = np.arange(start, start + n, dtype=np.int64)
        ended_before = np.cumsum(done, dtype=np.int64) - done
        episode_id = self.episodes_before + ended_before
        after_flag = np.concatenate([[False], done[:-1]])
        candidate = np.where(after_flag, row, self.episode_start)
        episode_start = np.maximum.accumulate(candidate)
        self.episodes_before += int(done.sum())
        self.episode_start = start + n if done[-1] else int(episode_start[-1])
        return episode_id, row - episode_start


@dataclasses.dataclass(frozen=True)
class D4rlDataset:
    """D4RL-style HDF5 files read as one step-layout dataset (the ``sources.Dataset``
    protocol). Episode ids count on across files (``first_episode``), so that ids stay
    unique and the same whichever files a process reads.

    Attributes:
      source: what the user passed (file, directory or glob).
      files: HDF5 files in read order.
      layouts: {file: FileLayout}.
      first_episode: {file: id of its first episode}.
      schema: the columns of every file, each number as wide as the widest file's.
    """

    source: str
    files: tuple[str, ...]
    layouts: dict[str, FileLayout]
    first_episode: dict[str, int]
    schema: pa.Schema
    format: str = NAME

    def declared_bounds(self) -> DeclaredBounds:
        return DeclaredBounds()

    def restrict(self, files: tuple[str, ...]) -> D4rlDataset:
        return dataclasses.replace(self, files=tuple(files))

    def count_rows(self) -> int | None:
        return sum(self.layouts[f].rows for f in self.files)

    def iter_batches(self, columns: list[str], rows: int) -> Iterator[SourcedBatch]:
        """Step-layout record batches of ``columns``, ``rows`` steps each, file by file."""
        h5py = _h5py()
        schema = pa.schema([self.schema.field(c) for c in columns])
        for file in self.files:
            layout = self.layouts[file]
            cursor = _EpisodeCursor(self.first_episode[file])
            with _open_file(h5py, file) as handle:
                if layout.rows == 0:
                    yield SourcedBatch(file, pa.RecordBatch.from_pylist([], schema=schema), True, 0)
                for start in range(0, layout.rows, rows):
                    stop = min(start + rows, layout.rows)
                    try:
                        batch = _read_slice(handle, layout, cursor, schema, start, stop)
                    except _READ_ERRORS as error:
                        raise DataError(
                            f"{file}: cannot read rows {start}..{stop - 1}: {first_line(error)}"
                        ) from None
                    yield SourcedBatch(file, batch, stop == layout.rows, start)


def _read_slice(
    handle: Any,
    layout: FileLayout,
    cursor: _EpisodeCursor,
    schema: pa.Schema,
    start: int,
    stop: int,
) -> pa.RecordBatch:
    """Rows start..stop-1 of ``schema``'s columns as one record batch."""
    episode_id, step = cursor.number(_done(handle, start, stop), start)
    read: dict[str, np.ndarray] = {}  # one read per dataset, however many columns view it
    arrays = []
    for field in schema:
        if field.name == "episode_id":
            arrays.append(pa.array(episode_id))
        elif field.name == "step":
            arrays.append(pa.array(step))
        else:
            key = layout.columns[field.name]
            if key not in read:
                read[key] = handle[key][start:stop]
            arrays.append(_to_arrow(read[key], field.type))
    return pa.RecordBatch.from_arrays(arrays, schema=schema)


def open_files(source: str, files: list[str], base_dir: str | None) -> D4rlDataset:
    """Opens each file to describe it (no data is read, except the flags of a dataset of
    several files, to number their episodes); raises DataError."""
    h5py = _h5py()
    layouts = {f: describe_file(h5py, f) for f in files}
    first_episode, count = {}, 0
    for file in files:
        first_episode[file] = count
        if len(files) > 1:
            count += _episode_count(h5py, file, layouts[file].rows)
    return D4rlDataset(source, tuple(files), layouts, first_episode, _common_schema(layouts))


def _common_schema(layouts: dict[str, FileLayout]) -> pa.Schema:
    """The first file's schema, each number column as wide as any file stores it (files
    may store rewards as float32 in one and float64 in another, actions as int32 and
    int64, as Parquet files may; KIND_DECIDES columns keep integers or floats); raises
    DataError naming the first dataset that differs in any other way."""
    (first, layout), *others = layouts.items()
    fields = list(layout.schema)
    for file, other in others:
        held, other_held = set(layout.columns.values()), set(other.columns.values())
        if held != other_held:
            lacks, also = sorted(held - other_held), sorted(other_held - held)
            differs = (
                f"no dataset {lacks[0]!r}, which {first} has"
                if lacks
                else f"a dataset {also[0]!r} that {first} has not"
            )
            raise DataError(f"{file}: it has {differs}; read files with the same datasets together")
        keys = layout.columns
        for index, mine in enumerate(fields):
            theirs, own = other.schema.field(mine.name), layout.schema.field(mine.name)
            wider = _wider(mine.type, theirs.type)
            if mine.name in KIND_DECIDES and _kind(mine.type) != _kind(theirs.type):
                wider = None
            if wider is None:
                raise DataError(
                    f"{file}: dataset {keys[mine.name]!r} holds {theirs.type}, but "
                    f"{own.type} in {first}; read files that store it alike together"
                )
            fields[index] = mine.with_type(wider)
    return pa.schema(fields)


# Columns whose integers and floats mean different things (discrete and continuous
# actions; state indices and features): files must agree on their kind, not only widen
KIND_DECIDES = ("action", "observation")


def _kind(dtype: pa.DataType) -> str:
    """ "i" for integers, "f" for floats (of a fixed-size list: its values'), else "?"."""
    if pa.types.is_fixed_size_list(dtype):
        dtype = dtype.value_type
    return "i" if pa.types.is_integer(dtype) else "f" if pa.types.is_floating(dtype) else "?"


def _wider(a: pa.DataType, b: pa.DataType) -> pa.DataType | None:
    """The type that holds both number types exactly as NumPy promotes them (int32 and
    int64: int64; float32 and float64: float64; an integer and a float: the float, wide
    enough), or fixed-size lists of them of one size; ``a`` where they are equal; None
    where they differ otherwise (booleans and numbers; uint64 and int64, which no integer
    holds)."""
    if a.equals(b):
        return a
    if pa.types.is_fixed_size_list(a) and pa.types.is_fixed_size_list(b):
        if a.list_size != b.list_size:
            return None
        value = _wider(a.value_type, b.value_type)
        return None if value is None else pa.list_(value, a.list_size)
    lists = pa.types.is_fixed_size_list(a) or pa.types.is_fixed_size_list(b)
    if lists or _kind(a) == "?" or _kind(b) == "?":
        return None
    wider = np.result_type(a.to_pandas_dtype(), b.to_pandas_dtype())
    if pa.types.is_integer(a) and pa.types.is_integer(b) and wider.kind == "f":
        return None
    return pa.from_numpy_dtype(wider)
