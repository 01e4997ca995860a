"""How a Minari dataset's episodes are stored: one HDF5 file with a group per episode
(``main_data.hdf5``), or one Arrow IPC or Parquet file per episode (``<id>/part-0.*``).
Each storage lists its episodes and their files, describes the leaves of an episode
(``observations/pos``, ``infos/action_log_probs``, ...) and reads the leaves of a group of
episodes at once, each leaf as one NumPy array of their rows, episode after episode.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import mmap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from ope_cli.data.sources.hdf5_raw import RawReader, Unsupported
from ope_cli.errors import DataError, first_line

HDF5_FILE = "main_data.hdf5"
CHUNK_CACHE = 1 << 20  # bytes of chunk cache per open dataset
INSTALL_HINT = "pip install 'ope-cli[minari]'"
READ_ERRORS = (OSError, RuntimeError, KeyError, ValueError, TypeError, pa.ArrowException)


@dataclasses.dataclass(frozen=True)
class Leaf:
    """One stored array of an episode: its dtype and the shape of one row."""

    dtype: np.dtype
    shape: tuple[int, ...]


def _h5py() -> Any:
    try:
        import h5py
    except ImportError:
        raise DataError(f"reading Minari HDF5 datasets needs h5py: {INSTALL_HINT}") from None
    return h5py


class Hdf5Storage:
    """``data/main_data.hdf5``: groups ``episode_<id>`` holding ``observations`` (a dataset,
    or a group for Dict/Tuple spaces, Tuple members named ``_index_<i>``), ``actions``,
    ``rewards``, ``terminations``, ``truncations`` and an optional ``infos`` group."""

    format = "hdf5"

    def __init__(self, data_dir: Path):
        self.path = str(data_dir / HDF5_FILE)
        if not Path(self.path).is_file():
            raise DataError(f"{data_dir}: Minari HDF5 dataset has no {HDF5_FILE}")

    @staticmethod
    def tuple_member(index: int) -> str:
        return f"_index_{index}"

    @contextlib.contextmanager
    def opened(self) -> Iterator[Any]:
        h5py = _h5py()
        try:
            # a one-slot chunk cache: each dataset is read once, whole, and the default
            # cache (521 slots per dataset) doubles the cost of opening a small dataset
            handle = h5py.File(self.path, "r", rdcc_nslots=1, rdcc_nbytes=CHUNK_CACHE)
        except READ_ERRORS as error:
            raise DataError(
                f"{self.path}: cannot open HDF5 file (truncated or corrupt?): {first_line(error)}"
            ) from None
        with handle:
            yield handle

    def episodes(self) -> dict[int, str]:
        """{episode id: the file holding it}, in id order."""
        with self.opened() as handle:
            names = [n for n in handle.keys() if n.startswith("episode_")]
        ids = sorted(_episode_number(n[len("episode_") :], self.path) for n in names)
        return {i: self.path for i in ids}

    def leaves(self, episode: int) -> dict[str, Leaf]:
        """{path: Leaf} of every dataset in one episode's group."""
        found: dict[str, Leaf] = {}

        def visit(name: str, item: Any) -> None:
            if hasattr(item, "shape"):
                found[name] = Leaf(item.dtype, tuple(item.shape[1:]))

        with self.opened() as handle:
            try:
                handle[f"episode_{episode}"].visititems(visit)
            except READ_ERRORS as error:
                raise DataError(
                    f"{self.path}: cannot read episode {episode}: {first_line(error)}"
                ) from None
        return found

    @contextlib.contextmanager
    def reader(self) -> Iterator[Any]:
        """A function (episode ids, leaf paths) -> Episodes. libhdf5 costs about 0.1 ms to
        open a small dataset and as much to read it, and Minari stores several per episode,
        so a dataset's storage is decoded from its object header instead (hdf5_raw) and its
        values are taken from a memory map of the file; libhdf5 (h5py's low-level API)
        reads what hdf5_raw does not decode (filters, strings, newer file formats)."""
        h5py = _h5py()
        with self.opened() as handle:
            leaf = _Hdf5Leaves(h5py, handle, self.path)

            def read(episodes: list[int], paths: list[str]) -> Episodes:
                return leaf.episodes(episodes, paths)

            yield read


class _Hdf5Leaves:
    """Reads episodes' leaves of one open HDF5 file (see Hdf5Storage.reader): libhdf5 lists
    an episode's links (with the address of each dataset's object header), hdf5_raw finds
    where the values lie and they are taken from a memory map of the file; a dataset that
    hdf5_raw does not decode is read through libhdf5."""

    def __init__(self, h5py: Any, handle: Any, path: str):
        self.h5py, self.handle, self.path = h5py, handle, path
        self.memory_types: dict[np.dtype, Any] = {}
        with open(path, "rb") as file:  # the map outlives the file object
            mapped = mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            self.raw: RawReader | None = RawReader(np.frombuffer(mapped, np.uint8))
        except Unsupported:
            self.raw = None

    def episodes(self, episodes: list[int], paths: list[str]) -> Episodes:
        """Every leaf of ``paths`` of each episode, joined (N from ``rewards``)."""
        parts: dict[str, list[np.ndarray]] = {p: [] for p in paths}
        counting = list(dict.fromkeys([*paths, "rewards"]))
        counts = {p: np.zeros(len(episodes), np.int64) for p in counting}
        for i, episode in enumerate(episodes):
            try:
                leaves = self._episode(episode, counting, parts)
            except READ_ERRORS as error:
                raise DataError(
                    f"{self.path}: cannot read episode {episode}: {first_line(error)}"
                ) from None
            for path, rows in leaves.items():
                counts[path][i] = rows
        return Episodes(
            {p: _join(v, p, self.path) for p, v in parts.items()},
            {p: counts[p] for p in paths},
            counts["rewards"],
        )

    def _episode(
        self, episode: int, paths: list[str], parts: dict[str, list[np.ndarray]]
    ) -> dict[str, int]:
        """{path: rows} of one episode's leaves, appending those in ``parts`` to it."""
        name = f"episode_{episode}"
        addresses = self._addresses(name)
        group, rows = None, {}
        for path in paths:
            values = self._values(addresses.get(path), path not in parts)
            if values is None:
                group = group or self.h5py.h5g.open(self.handle.id, name.encode())
                try:
                    dataset = self.h5py.h5d.open(group, path.encode())
                except KeyError:
                    raise DataError(f"{self.path}: episode {episode} has no {path!r}") from None
                values = self._read(dataset)
            rows[path] = values.shape[0] if values.ndim else 0
            if path in parts:
                parts[path].append(values)
        return rows

    def _addresses(self, name: str) -> dict[str, int]:
        """{path: object header address} of the objects under group ``name``: decoded by
        hdf5_raw, else listed by libhdf5."""
        h5py = self.h5py
        try:
            info = self.handle.id.links.get_info(name.encode())
        except KeyError:
            raise DataError(f"{self.path}: no group {name!r}") from None
        if self.raw is not None and info.type == h5py.h5l.TYPE_HARD:
            with contextlib.suppress(Unsupported):
                return self.raw.links(info.u)
        found: dict[str, int] = {}

        def visit(link: bytes, info: Any) -> None:
            if info.type == h5py.h5l.TYPE_HARD:
                found[link.decode()] = info.u

        group = h5py.h5g.open(self.handle.id, name.encode())  # held while visited
        group.links.visit(visit, info=True)
        return found

    def _values(self, address: int | None, rows_only: bool) -> np.ndarray | None:
        """[K, ...] values of the dataset at ``address`` (a view of the file), or None when
        libhdf5 must read it."""
        if self.raw is None or address is None:
            return None
        try:
            return self.raw.read(address, rows_only)
        except Unsupported:
            return None

    def _read(self, dataset: Any) -> np.ndarray:
        """A dataset read through libhdf5."""
        h5py, dtype = self.h5py, dataset.dtype
        if dtype.kind not in "biuf":  # strings, references: the high-level reader
            return np.asarray(h5py.Dataset(dataset)[()])
        values = np.empty(dataset.shape, dtype)
        if dtype not in self.memory_types:
            self.memory_types[dtype] = h5py.h5t.py_create(dtype)
        dataset.read(h5py.h5s.ALL, h5py.h5s.ALL, values, self.memory_types[dtype])
        return values


@dataclasses.dataclass(frozen=True)
class Episodes:
    """Leaves of E consecutive episodes read at once.

    Attributes:
      values: {leaf path: [sum K, ...] the episodes' rows, one episode after the other}.
      counts: {leaf path: [E] rows K of each episode}.
      steps: [E] steps N of each episode.
    """

    values: dict[str, np.ndarray]
    counts: dict[str, np.ndarray]
    steps: np.ndarray


def _join(parts: list[np.ndarray], path: str, where: str) -> np.ndarray:
    """The episodes' rows of one leaf, one after the other (a copy, never a file view)."""
    if not parts:
        return np.zeros(0)
    if len(parts) == 1:
        return np.array(parts[0])
    try:
        return np.concatenate(parts)
    except ValueError:
        shapes = sorted({str(p.shape[1:]) for p in parts})
        raise DataError(f"{where}: episodes store {path!r} with rows of shapes {shapes}") from None


class ArrowStorage:
    """``data/<id>/part-0.arrow`` (or ``.parquet``): one record batch per episode whose
    columns ``observations``, ``actions``, ``rewards``, ``terminations``, ``truncations``
    and ``infos`` (structs for Dict/Tuple spaces and nested infos, Tuple members named
    ``<i>``) have as many rows as the observations, padded after the N steps; the episode's
    ``metadata.json`` says N (``total_steps``)."""

    def __init__(self, data_dir: Path, file_format: str):
        self.data_dir = data_dir
        self.format = file_format
        self.suffix = ".arrow" if file_format == "arrow" else ".parquet"
        self._episodes: dict[int, str] | None = None

    @staticmethod
    def tuple_member(index: int) -> str:
        return str(index)

    def episodes(self) -> dict[int, str]:
        """{episode id: its file}, in id order (listed once)."""
        if self._episodes is None:
            self._episodes = self._list_episodes()
        return self._episodes

    def _list_episodes(self) -> dict[int, str]:
        found = {}
        for directory in self.data_dir.iterdir():
            if directory.is_dir() and not directory.name.startswith((".", "_")):
                parts = sorted(directory.glob(f"*{self.suffix}"))
                if not parts:
                    raise DataError(f"{directory}: episode directory has no {self.suffix} file")
                if len(parts) > 1:
                    raise DataError(f"{directory}: episode directory has {len(parts)} data files")
                found[_episode_number(directory.name, str(directory))] = str(parts[0])
        return dict(sorted(found.items()))

    def _table(self, file: str, columns: list[str] | None = None) -> pa.Table:
        try:
            if self.format == "arrow":
                table = ipc.open_file(file).read_all()
                return table if columns is None else table.select(columns)
            return pq.read_table(file, columns=columns)
        except READ_ERRORS as error:
            raise DataError(f"{file}: cannot read: {first_line(error)}") from None

    def leaves(self, episode: int) -> dict[str, Leaf]:
        file = self.episodes()[episode]
        schema = ipc.open_file(file).schema if self.format == "arrow" else pq.read_schema(file)
        found: dict[str, Leaf] = {}
        for field in schema:
            _arrow_leaves(field, field.name, found)
        return found

    @contextlib.contextmanager
    def reader(self) -> Iterator[Any]:
        """A function (episode ids, leaf paths) -> Episodes, reading each episode's file."""

        def read(episodes: list[int], paths: list[str]) -> Episodes:
            read_files = [self._episode(e, paths) for e in episodes]
            steps = np.array([n for _, n in read_files], np.int64)
            counts, values = {}, {}
            for path in paths:
                parts = [arrays[path] for arrays, _ in read_files]
                counts[path] = np.array([len(p) for p in parts], np.int64)
                values[path] = _join(parts, path, str(self.data_dir))
            return Episodes(values, counts, steps)

        yield read

    def _episode(self, episode: int, paths: list[str]) -> tuple[dict[str, np.ndarray], int]:
        """({path: [K, ...] array}, steps N) of one episode (its own file)."""
        file = self.episodes()[episode]
        steps = _total_steps(Path(file).parent)
        tops = list(dict.fromkeys(p.split("/")[0] for p in paths))
        table = self._table(file, tops)
        arrays = {}
        try:
            for path in paths:
                top, *rest = path.split("/")
                column: Any = table.column(top).combine_chunks()
                for part in rest:
                    column = column.field(part)
                arrays[path] = _to_numpy(column)
        except READ_ERRORS as error:
            raise DataError(f"{file}: cannot read episode {episode}: {first_line(error)}") from None
        return arrays, steps


def _arrow_leaves(field: pa.Field, path: str, found: dict[str, Leaf]) -> None:
    dtype = field.type
    if pa.types.is_struct(dtype):
        for child in dtype:
            _arrow_leaves(child, f"{path}/{child.name}", found)
        return
    shape: tuple[int, ...] = ()
    if pa.types.is_fixed_size_list(dtype):
        shape, dtype = (dtype.list_size,), dtype.value_type
    try:
        found[path] = Leaf(np.dtype(dtype.to_pandas_dtype()), shape)
    except (NotImplementedError, TypeError):
        found[path] = Leaf(np.dtype(object), shape)


def _to_numpy(column: pa.Array) -> np.ndarray:
    """[K] or [K, d] NumPy values of a number or fixed-size list column."""
    if pa.types.is_fixed_size_list(column.type):
        size = column.type.list_size
        flat = column.flatten().to_numpy(zero_copy_only=False)
        return flat.reshape(len(column), size)
    return column.to_numpy(zero_copy_only=False)


def _total_steps(episode_dir: Path) -> int:
    path = episode_dir / "metadata.json"
    try:
        steps = json.loads(path.read_text())["total_steps"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise DataError(
            f"{path}: cannot read the episode's 'total_steps' ({first_line(error)})"
        ) from None
    return int(steps)


def _episode_number(text: str, where: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise DataError(f"{where}: {text!r} is not an episode number") from None
