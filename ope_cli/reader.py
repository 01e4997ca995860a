"""Parquet / Arrow IPC files -> projected record batches, each tagged with its file."""

from __future__ import annotations

import dataclasses
import glob
import json
import math
import os
import queue
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TypeVar

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from ope_cli.errors import DataError

PARQUET_MAGIC = b"PAR1"
ARROW_FILE_MAGIC = b"ARROW1"
ARROW_STREAM_CONTINUATION = b"\xff\xff\xff\xff"


@dataclasses.dataclass(frozen=True)
class SourcedBatch:
    """A record batch and the file it came from (so errors can say where)."""

    file: str
    batch: pa.RecordBatch
    last_in_file: bool


# Schema metadata in which data declares bounds that ``--ci betting`` relies on.
METADATA_KEY = "ope"


def is_reward_range(low: float, high: float) -> bool:
    """Whether [low, high] can bound rewards: finite, and low < high."""
    return math.isfinite(low) and math.isfinite(high) and low < high


@dataclasses.dataclass(frozen=True)
class DeclaredBounds:
    """What the data says about every possible episode: rewards in [low, high], and at most
    ``horizon`` steps (None: not declared)."""

    reward_range: tuple[float, float] | None = None
    horizon: int | None = None


@dataclasses.dataclass(frozen=True)
class LoggedDataset:
    """An ordered list of data files read as one dataset.

    Attributes:
      source: what the user passed (file, directory or glob).
      files: data files in read order (sorted paths).
      format: ``parquet`` or ``ipc``.
      dataset: the pyarrow dataset over ``files`` (hive partitions for directories).
      partition_base_dir: the directory hive partitions are relative to, if any.
    """

    source: str
    files: tuple[str, ...]
    format: str
    dataset: ds.Dataset
    partition_base_dir: str | None = None

    @property
    def schema(self) -> pa.Schema:
        return self.dataset.schema

    def declared_bounds(self) -> DeclaredBounds:
        """The reward range and horizon the data declares in its schema metadata (key
        METADATA_KEY, a JSON object with "reward_range": [low, high] and "horizon": steps)."""
        raw = (self.schema.metadata or {}).get(METADATA_KEY.encode())
        if raw is None:
            return DeclaredBounds()
        try:
            declared = json.loads(raw)
            reward_range = declared.get("reward_range")
            horizon = declared.get("horizon")
            if reward_range is not None:
                low, high = (float(x) for x in reward_range)
                if not is_reward_range(low, high):
                    raise ValueError
                reward_range = (low, high)
            if horizon is not None and (
                isinstance(horizon, bool) or int(horizon) != horizon or horizon < 1
            ):
                raise ValueError
        except (ValueError, TypeError, AttributeError):
            raise DataError(
                f"{self.source}: schema metadata {METADATA_KEY!r} must be a JSON object "
                f'like {{"reward_range": [0, 1], "horizon": 100}}, got {raw[:80]!r}'
            ) from None
        return DeclaredBounds(reward_range, None if horizon is None else int(horizon))

    def restrict(self, files: tuple[str, ...]) -> LoggedDataset:
        """The same dataset (schema, partitioning) over a subset of its files."""
        dataset = ds.dataset(
            list(files),
            schema=self.schema,
            format=self.format,
            partitioning="hive" if self.partition_base_dir else None,
            partition_base_dir=self.partition_base_dir,
        )
        return dataclasses.replace(self, files=tuple(files), dataset=dataset)

    def count_rows(self) -> int | None:
        """Total rows from file metadata (cheap for Parquet), or None when unknown."""
        if self.format != "parquet":
            return None
        try:
            return sum(fragment.metadata.num_rows for fragment in self.dataset.get_fragments())
        except (OSError, pa.ArrowException):
            return None


def _sniff_format(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            head = handle.read(8)
    except OSError as error:
        raise DataError(f"{path}: cannot read file ({error.strerror or error})") from None
    if head.startswith(PARQUET_MAGIC):
        return "parquet"
    if head.startswith(ARROW_FILE_MAGIC) or head.startswith(ARROW_STREAM_CONTINUATION):
        return "ipc"
    if not head:
        raise DataError(f"{path}: file is empty (0 bytes), not a Parquet or Arrow file")
    raise DataError(f"{path}: not a Parquet or Arrow IPC/Feather file (unrecognised header)")


def _data_files_in(directory: Path) -> list[str]:
    files = []
    for root, dirs, names in os.walk(directory):
        # Hidden and underscore-prefixed entries are metadata (_SUCCESS, .crc), as in pyarrow.
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
        files.extend(os.path.join(root, n) for n in names if not n.startswith((".", "_")))
    return sorted(files)


def open_dataset(source: str) -> LoggedDataset:
    """Resolves a file, directory or glob into an ordered dataset; raises DataError."""
    path = Path(source)
    base_dir: str | None = None
    if path.is_dir():
        files = _data_files_in(path)
        base_dir = str(path)
        if not files:
            raise DataError(f"{source}: directory holds no data files")
    elif path.is_file():
        files = [str(path)]
    elif glob.has_magic(source):
        files = sorted(f for f in glob.glob(source, recursive=True) if os.path.isfile(f))
        if not files:
            raise DataError(f"{source}: no files match this pattern")
    else:
        raise DataError(f"{source}: no such file or directory")

    formats = {_sniff_format(f) for f in files}
    if len(formats) > 1:
        raise DataError(f"{source}: mixes Parquet and Arrow IPC files; use one format")
    (file_format,) = formats
    try:
        dataset = ds.dataset(
            files,
            format=file_format,
            partitioning="hive" if base_dir else None,
            partition_base_dir=base_dir,
        )
    except (OSError, pa.ArrowException) as error:
        raise DataError(f"{source}: cannot open dataset: {_first_line(error)}") from None
    try:  # a damaged footer can decode into names that are not text
        for field in dataset.schema:
            field.name, str(field.type)
    except (UnicodeDecodeError, pa.ArrowException) as error:
        raise DataError(
            f"{source}: cannot read the schema (column names or types are damaged: "
            f"{_first_line(error)})"
        ) from None
    return LoggedDataset(
        source=source,
        files=tuple(files),
        format=file_format,
        dataset=dataset,
        partition_base_dir=base_dir,
    )


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def _family(dtype: pa.DataType) -> str:
    """What a column holds, ignoring widths and encodings that read the same (int32 and
    int64, float and int, string and large_string, dictionaries, list flavours)."""
    if pa.types.is_dictionary(dtype):
        dtype = dtype.value_type
    if pa.types.is_integer(dtype) or pa.types.is_floating(dtype):
        return "number"
    if (
        pa.types.is_string(dtype)
        or pa.types.is_large_string(dtype)
        or pa.types.is_string_view(dtype)
    ):
        return "string"
    if isinstance(dtype, (pa.ListType, pa.LargeListType, pa.FixedSizeListType)) or (
        pa.types.is_list_view(dtype) or pa.types.is_large_list_view(dtype)
    ):
        return f"list<{_family(dtype.value_type)}>"
    return str(dtype)


def _check_file_schema(data: LoggedDataset, fragment, columns: list[str]) -> None:
    """A file whose columns differ from the dataset's (its first file's) would otherwise be
    cast silently (numeric strings to numbers) or read as nulls; name the file and column."""
    physical = fragment.physical_schema
    for name in columns:
        index = physical.get_field_index(name)
        if index < 0:
            if data.partition_base_dir is None:  # hive partition columns live in the path
                raise DataError(
                    f"{fragment.path}: has no column {name!r}, which the dataset's other files have"
                )
            continue
        actual, expected = physical.field(index).type, data.schema.field(name).type
        if _family(actual) != _family(expected):
            raise DataError(
                f"{fragment.path}: column {name!r} has type {actual} in this file but "
                f"{expected} in the dataset's first file"
            )


def _file_batches(
    data: LoggedDataset, fragment, columns: list[str], rows: int
) -> Iterator[pa.RecordBatch]:
    """One file's record batches. Parquet files are read with a plain ParquetFile reader: the
    dataset scanner decodes far ahead of its consumer (hundreds of MiB on large files),
    while this holds about one row group, so memory does not grow with the data. Columns that
    only exist in hive partition paths need the dataset scanner."""
    physical = fragment.physical_schema
    if data.format == "parquet" and all(physical.get_field_index(c) >= 0 for c in columns):
        return pq.ParquetFile(fragment.path, pre_buffer=False).iter_batches(
            batch_size=rows, columns=columns
        )
    return fragment.to_batches(schema=data.schema, columns=columns, batch_size=rows)


def iter_batches(data: LoggedDataset, columns: list[str], rows: int) -> Iterator[SourcedBatch]:
    """Streams record batches of at most ``rows`` rows, file by file, in file order."""
    for fragment in data.dataset.get_fragments():
        try:
            _check_file_schema(data, fragment, columns)
            batches = _file_batches(data, fragment, columns, rows)
            previous = None
            for batch in batches:
                if previous is not None:
                    yield SourcedBatch(fragment.path, previous, last_in_file=False)
                previous = batch
        except (OSError, pa.ArrowException, UnicodeDecodeError) as error:
            raise DataError(f"{fragment.path}: cannot read: {_first_line(error)}") from None
        if previous is None:  # a file with no rows still ends the file's episodes
            previous = pa.RecordBatch.from_pylist(
                [], schema=pa.schema([data.schema.field(c) for c in columns])
            )
        yield SourcedBatch(fragment.path, previous, last_in_file=True)


T = TypeVar("T")
_DONE = object()


def prefetched(items: Iterable[T], depth: int = 2) -> Iterator[T]:
    """``items`` in order, produced up to ``depth`` ahead by a background thread.

    pyarrow reads and decodes with the GIL released, so the next record batches are read
    while the caller assembles, pads and evaluates the current ones. Memory stays bounded
    by ``depth`` items. An exception raised by ``items`` is re-raised here, in order; when
    the caller stops early (or fails), the thread stops at its next item.
    """
    ready: queue.Queue = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def put(item) -> bool:
        while not stop.is_set():
            try:
                ready.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        try:
            for item in items:
                if not put((item, None)):
                    return
        except BaseException as error:  # noqa: BLE001 - handed to the consumer as it is
            put((_DONE, error))
            return
        put((_DONE, None))

    thread = threading.Thread(target=produce, name="ope-prefetch", daemon=True)
    thread.start()
    try:
        while True:
            item, error = ready.get()
            if error is not None:
                raise error
            if item is _DONE:
                return
            yield item
    finally:
        stop.set()
        thread.join()
