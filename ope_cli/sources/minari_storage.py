"""How a Minari dataset's episodes are stored: one HDF5 file with a group per episode
(``main_data.hdf5``), or one Arrow IPC or Parquet file per episode (``<id>/part-0.*``).
Each storage lists its episodes and their files, describes the leaves of an episode
(``observations/pos``, ``infos/action_log_probs``, ...) and reads leaves as NumPy arrays.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from ope_cli.errors import DataError
from ope_cli.sources.base import first_line

HDF5_FILE = "main_data.hdf5"
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
            handle = h5py.File(self.path, "r")
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
    def reader(self, file: str) -> Iterator[Any]:
        """A function (episode id, leaf paths) -> ({path: [K, ...] array}, steps N). It uses
        h5py's low-level API: the high-level one costs several times more per small dataset,
        and Minari stores a few small datasets per episode."""
        h5py = _h5py()
        memory_types: dict[np.dtype, Any] = {}

        def read_leaf(group: Any, episode: int, path: str) -> np.ndarray:
            try:
                dataset = h5py.h5d.open(group, path.encode())
            except KeyError:
                raise DataError(f"{self.path}: episode {episode} has no {path!r}") from None
            dtype = dataset.dtype
            if dtype.kind not in "biuf":  # strings, references: the high-level reader
                return np.asarray(h5py.Dataset(dataset)[()])
            values = np.empty(dataset.shape, dtype)
            if dtype not in memory_types:
                memory_types[dtype] = h5py.h5t.py_create(dtype)
            dataset.read(h5py.h5s.ALL, h5py.h5s.ALL, values, memory_types[dtype])
            return values

        with self.opened() as handle:

            def read(episode: int, paths: list[str]) -> tuple[dict[str, np.ndarray], int]:
                name = f"episode_{episode}"
                try:
                    group = h5py.h5g.open(handle.id, name.encode())
                except KeyError:
                    raise DataError(f"{self.path}: no group {name!r}") from None
                arrays = {p: read_leaf(group, episode, p) for p in paths}
                rewards = arrays.get("rewards")
                if rewards is None:
                    rewards = read_leaf(group, episode, "rewards")
                return arrays, int(rewards.shape[0])

            yield read


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
    def reader(self, file: str) -> Iterator[Any]:
        def read(episode: int, paths: list[str]) -> tuple[dict[str, np.ndarray], int]:
            steps = _total_steps(Path(file).parent)
            tops = list(dict.fromkeys(p.split("/")[0] for p in paths))
            table = self._table(file, tops)
            arrays = {}
            for path in paths:
                top, *rest = path.split("/")
                column: Any = table.column(top).combine_chunks()
                for part in rest:
                    column = column.field(part)
                arrays[path] = _to_numpy(column)
            return arrays, steps

        yield read


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
