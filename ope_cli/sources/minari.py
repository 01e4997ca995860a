"""Minari datasets (the Farama standard for offline RL), read directly with h5py or pyarrow:
neither the ``minari`` package nor an environment is needed.

A source is a dataset directory (holding ``data/metadata.json``), its ``data`` directory,
or ``minari:DATASET_ID`` under ``MINARI_DATASETS_PATH`` (default ``~/.minari/datasets``).
An episode's N actions pair with its first N observations; its (N+1)-th observation is the
final state, read as the last step's ``next_observation`` (null when the episode stores
only N observations). Infos with N+1 rows pair row t+1 (the info of the step that took
action t) with action t; infos with N rows pair row t with action t. Dict and Tuple
observations are flattened in the order of ``gymnasium.spaces.flatten`` (Discrete members
one-hot). Batches have the standard column names (``episode_id``, ``step``,
``observation``, ``action``, ``reward``, ``behavior_log_prob`` from
``infos/action_log_probs``), ``terminations`` and ``truncations``, and every numeric leaf
of the infos (and of Dict/Tuple observations) under its path, e.g. ``infos/action_log_probs``.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pyarrow as pa

from ope_cli.errors import DataError
from ope_cli.sources.base import DeclaredBounds, SourcedBatch, first_line
from ope_cli.sources.minari_spaces import arrow_type, flat_size, flatten, space_leaves
from ope_cli.sources.minari_storage import READ_ERRORS, ArrowStorage, Hdf5Storage, Leaf

NAME = "minari"
PREFIX = "minari:"
REQUIRED = ("observations", "actions", "rewards", "terminations", "truncations")
BEHAVIOR_KEY = "infos/action_log_probs"
STORAGE_FORMATS = ("hdf5", "arrow", "parquet")
STEP_LEAVES = {"action": "actions", "reward": "rewards"}
FLAG_LEAVES = ("terminations", "truncations")


@dataclasses.dataclass(frozen=True)
class Column:
    """One output column: how it is made (``id``, ``step``, ``observation``,
    ``next_observation``, ``step_leaf``: the first N rows of a leaf, ``info``: a leaf
    paired by its row count), from which leaves, and its Arrow type."""

    kind: str
    paths: tuple[str, ...]
    type: pa.DataType


@dataclasses.dataclass(frozen=True)
class Layout:
    """The columns of a dataset and how observations flatten.

    Attributes:
      columns: {output column name: Column}, in schema order.
      observation: (leaf path, space) of each observation leaf, in flatten order.
      composite: observations are a Dict or Tuple space (flattened to float64 vectors).
    """

    columns: dict[str, Column]
    observation: tuple[tuple[str, dict], ...]
    composite: bool

    @property
    def schema(self) -> pa.Schema:
        return pa.schema([pa.field(n, c.type) for n, c in self.columns.items()])


# ------------------------------------------------------------------------- finding it


def root() -> Path:
    """The local Minari root: MINARI_DATASETS_PATH, else ~/.minari/datasets."""
    configured = os.environ.get("MINARI_DATASETS_PATH")
    return Path(configured) if configured else Path.home() / ".minari" / "datasets"


def _data_dir(path: Path) -> Path | None:
    """The ``data`` directory of a Minari dataset directory (or of the data directory)."""
    if (path / "data" / "metadata.json").is_file():
        return path / "data"
    if path.name == "data" and (path / "metadata.json").is_file():
        return path
    return None


def claims(source: str) -> bool:
    """Whether ``source`` names a Minari dataset (``minari:ID`` or a dataset directory)."""
    return source.startswith(PREFIX) or _data_dir(Path(source)) is not None


def resolve(source: str) -> Path:
    """The data directory of ``source``; raises DataError."""
    if not source.startswith(PREFIX):
        found = _data_dir(Path(source))
        if found is None:
            raise DataError(f"{source}: not a Minari dataset directory (no data/metadata.json)")
        return found
    dataset_id = source[len(PREFIX) :]
    base = root()
    candidates = [base / dataset_id]
    if dataset_id and not re.search(r"-v\d+$", dataset_id):  # no version: the latest
        pattern = re.compile(re.escape(Path(dataset_id).name) + r"-v(\d+)$")
        parent = (base / dataset_id).parent
        versions = [p for p in parent.glob("*-v*") if pattern.match(p.name)]
        candidates += sorted(versions, key=lambda p: -int(pattern.match(p.name).group(1)))
    for candidate in candidates:
        found = _data_dir(candidate)
        if found is not None:
            return found
    raise DataError(
        f"{source}: no Minari dataset {dataset_id!r} under {base} "
        "(set MINARI_DATASETS_PATH to the directory that holds it)"
    )


def _metadata(data_dir: Path) -> dict:
    path = data_dir / "metadata.json"
    try:
        metadata = json.loads(path.read_text())
        if not isinstance(metadata, dict):
            raise ValueError("not a JSON object")
    except (OSError, ValueError) as error:
        raise DataError(f"{path}: cannot read Minari metadata: {first_line(error)}") from None
    for key in ("data_format", "observation_space", "action_space"):
        if key not in metadata:
            raise DataError(f"{path}: Minari metadata has no {key!r}")
    return metadata


def _space(metadata: dict, key: str, path: Path) -> dict:
    raw = metadata[key]
    try:
        space = json.loads(raw) if isinstance(raw, str) else raw
        if not isinstance(space, dict) or "type" not in space:
            raise ValueError("not a serialised space")
    except ValueError as error:
        raise DataError(f"{path}: cannot read {key!r}: {first_line(error)}") from None
    return space


def _storage(data_dir: Path, file_format: str) -> Hdf5Storage | ArrowStorage:
    if file_format == "hdf5":
        return Hdf5Storage(data_dir)
    if file_format in ("arrow", "parquet"):
        return ArrowStorage(data_dir, file_format)
    raise DataError(
        f"{data_dir / 'metadata.json'}: unknown Minari storage format {file_format!r} "
        f"(expected {', '.join(STORAGE_FORMATS)})"
    )


# ---------------------------------------------------------------------------- layout


def describe(storage, first_episode: int, obs_space: dict, where: str) -> Layout:
    """The columns of a dataset from its observation space and first episode's leaves."""
    leaves = storage.leaves(first_episode)
    for key in REQUIRED:
        if key not in leaves and not any(p.startswith(key + "/") for p in leaves):
            raise DataError(f"{where}: episode {first_episode} has no {key!r}")
    observation = tuple(space_leaves(obs_space, "observations", storage.tuple_member))
    for path, _ in observation:
        if path not in leaves:
            raise DataError(f"{where}: episode {first_episode} has no {path!r}")
    composite = obs_space["type"] in ("Dict", "Tuple")
    obs_type = _observation_type(observation, leaves, composite, where)
    columns = {
        "episode_id": Column("id", (), pa.int64()),
        "step": Column("step", (), pa.int64()),
        "observation": Column("observation", (), obs_type),
        "next_observation": Column("next_observation", (), obs_type),
    }
    for name, key in (*STEP_LEAVES.items(), *((f, f) for f in FLAG_LEAVES)):
        dtype = arrow_type(leaves[key]) if key in leaves else None
        if dtype is None:
            raise DataError(f"{where}: episode {first_episode}: {key!r} must hold numbers")
        columns[name] = Column("step_leaf", (key,), dtype)
    if BEHAVIOR_KEY in leaves and arrow_type(leaves[BEHAVIOR_KEY]) is not None:
        columns["behavior_log_prob"] = Column("info", (BEHAVIOR_KEY,), pa.float64())
    for path, leaf in leaves.items():
        dtype = arrow_type(leaf)
        if dtype is None:
            continue
        if path.startswith("infos/"):
            columns[path] = Column("info", (path,), dtype)
        elif composite and path.startswith("observations/"):
            columns[path] = Column("step_leaf", (path,), dtype)
    return Layout(columns, observation, composite)


def _observation_type(
    observation: tuple[tuple[str, dict], ...], leaves: dict[str, Leaf], composite: bool, where: str
) -> pa.DataType:
    if composite:
        return pa.list_(pa.float64(), sum(flat_size(space) for _, space in observation))
    obs_type = arrow_type(leaves["observations"])
    if obs_type is None:
        raise DataError(
            f"{where}: observations of dtype {leaves['observations'].dtype} are not numbers"
        )
    return obs_type


# --------------------------------------------------------------------------- reading


def _leaves_needed(layout: Layout, names: list[str]) -> list[str]:
    paths: list[str] = []
    for name in names:
        column = layout.columns[name]
        if column.kind in ("observation", "next_observation"):
            paths += [p for p, _ in layout.observation]
        paths += column.paths
    return list(dict.fromkeys(paths))


def _check_rows(values: np.ndarray, n: int, path: str, episode: int, where: str) -> None:
    rows = values.shape[0] if values.ndim else 0
    if rows not in (n, n + 1):
        noun = "observations" if path.startswith("observations") else "rows"
        raise DataError(
            f"{where}: episode {episode}: {path!r} has {rows} {noun} for {n} actions "
            f"(expected {n} or {n + 1})"
        )


def _observations(raw: dict[str, np.ndarray], layout: Layout, n: int) -> np.ndarray:
    """[K, ...] observations of one episode (K = N or N + 1), flattened when composite."""
    if not layout.composite:
        values = raw["observations"]
        return values.reshape(values.shape[0], -1) if values.ndim > 1 else values
    return np.concatenate([flatten(raw[p], space) for p, space in layout.observation], axis=1)


def episode_columns(
    raw: dict[str, np.ndarray], n: int, episode: int, layout: Layout, names: list[str], where: str
) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    """{column: ([N, ...] values, [N] validity or None)} of one episode of N steps."""
    for path in raw:
        _check_rows(raw[path], n, path, episode, where)
    out: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
    observations = None
    for name in names:
        column = layout.columns[name]
        if column.kind == "id":
            out[name] = (np.full(n, episode, np.int64), None)
        elif column.kind == "step":
            out[name] = (np.arange(n, dtype=np.int64), None)
        elif column.kind in ("observation", "next_observation"):
            if observations is None:
                observations = _observations(raw, layout, n)
            out[name] = _observation_column(observations, n, column.kind)
        else:
            values = raw[column.paths[0]]
            shift = 1 if column.kind == "info" and values.shape[0] == n + 1 else 0
            if column.kind == "step_leaf" and column.paths[0] in REQUIRED[1:]:
                _check_step_rows(values, n, column.paths[0], episode, where)
            out[name] = (values[shift : shift + n], None)
    return out


def _check_step_rows(values: np.ndarray, n: int, path: str, episode: int, where: str) -> None:
    """Actions, rewards and flags have N rows (Arrow storage pads them to N + 1)."""
    if values.shape[0] < n:
        raise DataError(f"{where}: episode {episode}: {path!r} has {values.shape[0]} rows, not {n}")


def _observation_column(
    observations: np.ndarray, n: int, kind: str
) -> tuple[np.ndarray, np.ndarray | None]:
    if kind == "observation":
        return observations[:n], None
    if observations.shape[0] == n + 1:
        return observations[1:], None
    padded = np.concatenate([observations[1:], np.zeros_like(observations[:1])])
    valid = np.ones(n, bool)
    valid[-1:] = False
    return padded, valid


def _to_arrow(values: np.ndarray, valid: np.ndarray | None, dtype: pa.DataType) -> pa.Array:
    """[n, ...] values -> n Arrow values of ``dtype`` (null where ``valid`` is False)."""
    mask = None if valid is None else pa.array(~valid)
    if pa.types.is_fixed_size_list(dtype):
        flat = np.ascontiguousarray(values, dtype.value_type.to_pandas_dtype()).reshape(-1)
        return pa.FixedSizeListArray.from_arrays(pa.array(flat), dtype.list_size, mask=mask)
    return pa.array(
        np.ascontiguousarray(values.reshape(-1), dtype.to_pandas_dtype()), mask=mask, type=dtype
    )


class _Batcher:
    """Collects episodes' columns and cuts them into record batches of ``rows`` rows."""

    def __init__(self, schema: pa.Schema, rows: int):
        self.schema, self.rows = schema, rows
        self.pending: list[dict[str, tuple[np.ndarray, np.ndarray | None]]] = []
        self.pending_rows = 0

    def add(self, columns: dict, n: int) -> Iterator[pa.RecordBatch]:
        self.pending.append(columns)
        self.pending_rows += n
        if self.pending_rows >= self.rows:
            yield from self.flush(keep_tail=True)

    def flush(self, keep_tail: bool = False) -> Iterator[pa.RecordBatch]:
        if not self.pending:
            return
        joined = {}
        for field in self.schema:
            parts = [p[field.name] for p in self.pending]
            values = np.concatenate([v for v, _ in parts])
            valid = None
            if any(m is not None for _, m in parts):
                valid = np.concatenate(
                    [np.ones(len(v), bool) if m is None else m for v, m in parts]
                )
            joined[field.name] = (values, valid)
        total, start = self.pending_rows, 0
        self.pending, self.pending_rows = [], 0
        while total - start >= self.rows or (not keep_tail and start < total):
            stop = min(start + self.rows, total)
            yield self._batch(joined, start, stop)
            start = stop
        if start < total:
            tail = {
                k: (v[start:], None if m is None else m[start:]) for k, (v, m) in joined.items()
            }
            self.pending, self.pending_rows = [tail], total - start

    def _batch(self, joined: dict, start: int, stop: int) -> pa.RecordBatch:
        arrays = []
        for field in self.schema:
            values, valid = joined[field.name]
            part = None if valid is None else valid[start:stop]
            arrays.append(_to_arrow(values[start:stop], part, field.type))
        return pa.RecordBatch.from_arrays(arrays, schema=self.schema)


@dataclasses.dataclass(frozen=True)
class MinariDataset:
    """A Minari dataset read as one step-layout dataset (the ``sources.Dataset`` protocol).

    Attributes:
      source: what the user passed.
      data_dir: the dataset's ``data`` directory.
      files: the files holding the episodes read (one HDF5 file, or one file per episode).
      storage: the Hdf5Storage or ArrowStorage.
      layout: the columns and how observations flatten.
      episodes: (episode id, its file) of the episodes read, in id order.
      total_steps: steps of the whole dataset from its metadata (None once restricted).
    """

    source: str
    data_dir: Path
    files: tuple[str, ...]
    storage: Hdf5Storage | ArrowStorage
    layout: Layout
    episodes: tuple[tuple[int, str], ...]
    total_steps: int | None
    format: str = NAME

    @property
    def schema(self) -> pa.Schema:
        return self.layout.schema

    def declared_bounds(self) -> DeclaredBounds:
        return DeclaredBounds()

    def restrict(self, files: tuple[str, ...]) -> MinariDataset:
        keep = set(files)
        episodes = tuple(e for e in self.episodes if e[1] in keep)
        return dataclasses.replace(self, files=tuple(files), episodes=episodes, total_steps=None)

    def count_rows(self) -> int | None:
        return self.total_steps

    def iter_batches(self, columns: list[str], rows: int) -> Iterator[SourcedBatch]:
        """Step-layout record batches of ``columns``, ``rows`` steps each, episode by
        episode; one HDF5 file (or the data directory) is the batches' file, and an error
        names the file of its episode (one of ``files``)."""
        where = self.storage.path if isinstance(self.storage, Hdf5Storage) else str(self.data_dir)
        schema = pa.schema([self.schema.field(c) for c in columns])
        paths = _leaves_needed(self.layout, columns)
        batcher, offset = _Batcher(schema, rows), 0

        def flush() -> Iterator[SourcedBatch]:
            nonlocal offset
            last = list(batcher.flush()) or [schema.empty_table().to_batches(1)[0]]
            for i, batch in enumerate(last):
                yield SourcedBatch(where, batch, i == len(last) - 1, offset)
                offset += batch.num_rows

        for file, group in _by_file(self.episodes):
            with self.storage.reader(file) as read:
                for episode in group:
                    try:
                        parts, n = self._episode(read, file, episode, paths, columns)
                    except DataError:  # the episodes read before it still count (inspect)
                        yield from flush()
                        raise
                    for batch in batcher.add(parts, n):
                        yield SourcedBatch(where, batch, False, offset)
                        offset += batch.num_rows
        yield from flush()

    def _episode(self, read, file: str, episode: int, paths: list[str], columns: list[str]):
        """({column: (values, validity)}, N) of one episode; DataError naming its file."""
        try:
            raw, n = read(episode, paths)
        except READ_ERRORS as error:
            raise DataError(f"{file}: cannot read episode {episode}: {first_line(error)}") from None
        return episode_columns(raw, n, episode, self.layout, columns, file), n


def _by_file(episodes: tuple[tuple[int, str], ...]) -> Iterator[tuple[str, list[int]]]:
    """Runs of consecutive episodes in the same file: (file, [episode ids])."""
    run: list[int] = []
    current = None
    for episode, file in episodes:
        if file != current and run:
            yield current, run
            run = []
        current = file
        run.append(episode)
    if run:
        yield current, run


def open_source(source: str) -> MinariDataset:
    """Opens a Minari dataset (directory or ``minari:ID``); raises DataError."""
    data_dir = resolve(source)
    metadata = _metadata(data_dir)
    storage = _storage(data_dir, metadata["data_format"])
    obs_space = _space(metadata, "observation_space", data_dir / "metadata.json")
    episodes = storage.episodes()
    if not episodes:
        raise DataError(f"{source}: Minari dataset has no episodes")
    layout = describe(storage, next(iter(episodes)), obs_space, source)
    files = tuple(dict.fromkeys(episodes.values()))
    total = metadata.get("total_steps")
    return MinariDataset(
        source,
        data_dir,
        files,
        storage,
        layout,
        tuple(episodes.items()),
        int(total) if isinstance(total, int) else None,
    )
