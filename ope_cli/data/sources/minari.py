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
from typing import Any

import numpy as np
import pyarrow as pa

from ope_cli.data.sources.base import DeclaredBounds, SourcedBatch
from ope_cli.data.sources.minari_spaces import arrow_type, flat_size, flatten, space_leaves
from ope_cli.data.sources.minari_storage import ArrowStorage, Episodes, Hdf5Storage, Leaf
from ope_cli.data.sources.remote import on_disk
from ope_cli.errors import DataError, first_line

NAME = "minari"
PREFIX = "minari:"
REQUIRED = ("observations", "actions", "rewards", "terminations", "truncations")
BEHAVIOR_KEY = "infos/action_log_probs"
STORAGE_FORMATS = ("hdf5", "arrow", "parquet")
STEP_LEAVES = {"action": "actions", "reward": "rewards"}
FLAG_LEAVES = ("terminations", "truncations")
FIRST_GROUP, MAX_GROUP = 16, 4096  # episodes read at once: the first group, at most


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
      starts: {output column: the ``start`` of its top-level Discrete space}, where not 0:
        its values are shifted to 0 .. n - 1, the indices a tabular policy reads.
    """

    columns: dict[str, Column]
    observation: tuple[tuple[str, dict], ...]
    composite: bool
    starts: dict[str, int] = dataclasses.field(default_factory=dict)

    @property
    def schema(self) -> pa.Schema:
        return pa.schema([pa.field(n, c.type) for n, c in self.columns.items()])


# ------------------------------------------------------------------------- finding it


def root() -> Path:
    """The local Minari root: MINARI_DATASETS_PATH, else ~/.minari/datasets."""
    configured = os.environ.get("MINARI_DATASETS_PATH")
    if not configured:
        return Path.home() / ".minari" / "datasets"
    local = on_disk(configured)  # a file:// URI's path
    if local is None:
        raise DataError(
            f"MINARI_DATASETS_PATH {configured}: a local directory is needed (Minari datasets "
            "are read from a local disk only; copy it first)"
        )
    return Path(local)


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


def discrete_starts(obs_space: dict, action_space: dict | None) -> dict[str, int]:
    """{column: start} of the top-level Discrete spaces that start elsewhere than 0
    (Discrete(4, start=1) stores the actions 1..4; a policy indexes them 0..3)."""
    starts = {}
    for columns, space in (
        (("observation", "next_observation"), obs_space),
        (("action",), action_space or {}),
    ):
        start = int(space.get("start", 0) or 0) if space.get("type") == "Discrete" else 0
        if start:
            starts.update(dict.fromkeys(columns, start))
    return starts


def describe(
    storage, first_episode: int, obs_space: dict, where: str, action_space: dict | None = None
) -> Layout:
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
    columns.update(_step_leaf_columns(leaves, f"{where}: episode {first_episode}"))
    leaves = {
        path: _one_per_step(leaf) if path.startswith("infos/") else leaf
        for path, leaf in leaves.items()
    }
    behavior = leaves.get(BEHAVIOR_KEY)
    if behavior is not None and behavior.shape == () and arrow_type(behavior) is not None:
        columns["behavior_log_prob"] = Column("info", (BEHAVIOR_KEY,), pa.float64())
    for path, leaf in leaves.items():
        dtype = arrow_type(leaf)
        if dtype is None:
            continue
        if path.startswith("infos/"):
            columns[path] = Column("info", (path,), dtype)
        elif composite and path.startswith("observations/"):
            columns[path] = Column("step_leaf", (path,), dtype)
    return Layout(columns, observation, composite, discrete_starts(obs_space, action_space))


def _one_per_step(leaf: Leaf) -> Leaf:
    """``leaf``, one number per step where it is stored [N, 1] (as Minari's Arrow storage
    keeps every info, and some datasets keep rewards and flags): read as [N]."""
    return dataclasses.replace(leaf, shape=()) if leaf.shape == (1,) else leaf


def _step_leaf_columns(leaves: dict[str, Leaf], where: str) -> dict[str, Column]:
    """The action, reward and flag columns; rewards and flags stored [N, 1] read as [N]."""
    columns = {}
    for name, key in (*STEP_LEAVES.items(), *((f, f) for f in FLAG_LEAVES)):
        leaf = leaves.get(key)
        if leaf is not None and name != "action":
            leaf = _one_per_step(leaf)
        dtype = arrow_type(leaf) if leaf is not None else None
        if dtype is None:
            raise DataError(f"{where}: {key!r} must hold numbers")
        columns[name] = Column("step_leaf", (key,), dtype)
    return columns


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


def _check_rows(read: Episodes, episodes: list[int], files: dict[int, str]) -> None:
    """Every leaf has N or N + 1 rows in each episode, the observation leaves alike;
    raises DataError naming the first bad episode and leaf."""
    n = read.steps
    bad = {p: (c != n) & (c != n + 1) for p, c in read.counts.items()}
    obs = [c for p, c in read.counts.items() if p.startswith("observations")]
    uneven = np.zeros(len(n), bool)
    for counts in obs[1:]:
        uneven |= counts != obs[0]
    if not any(b.any() for b in bad.values()) and not uneven.any():
        return
    first = min(int(np.argmax(b)) for b in (*bad.values(), uneven) if b.any())
    where = f"{files[episodes[first]]}: episode {episodes[first]}"
    for path, counts in read.counts.items():
        if bad[path][first]:
            noun = "observations" if path.startswith("observations") else "rows"
            raise DataError(
                f"{where}: {path!r} has {counts[first]} {noun} for {n[first]} actions "
                f"(expected {n[first]} or {n[first] + 1})"
            )
    raise DataError(f"{where}: observation leaves have different row counts")


def _rows(counts: np.ndarray, steps: np.ndarray, shift: np.ndarray | int) -> np.ndarray:
    """[sum N] indices of rows shift .. shift + N - 1 of each episode in leaf rows joined
    episode after episode (``counts`` [E] rows K each, ``steps`` [E] N each)."""
    first = np.cumsum(counts) - counts + shift  # [E] each episode's first row taken
    step_start = np.cumsum(steps) - steps
    return np.arange(int(steps.sum())) + np.repeat(first - step_start, steps)


def _observations(read: Episodes, layout: Layout) -> np.ndarray:
    """[sum K, ...] the episodes' observations (K = N or N + 1), flattened when composite."""
    if not layout.composite:
        values = read.values["observations"]
        return values.reshape(values.shape[0], -1) if values.ndim > 1 else values
    return np.concatenate(
        [flatten(read.values[p], space) for p, space in layout.observation], axis=1
    )


def _next_observations(
    observations: np.ndarray, counts: np.ndarray, steps: np.ndarray
) -> tuple[np.ndarray, np.ndarray | None]:
    """[sum N, ...] each step's next observation; the last step of an episode stored with
    N observations has none (zeros, invalid)."""
    index = _rows(counts, steps, 1)
    missing = (counts == steps) & (steps > 0)
    if not missing.any():
        return observations[index], None
    valid = np.ones(index.size, bool)
    valid[(np.cumsum(steps) - 1)[missing]] = False
    values = observations[np.where(valid, index, 0)]
    values[~valid] = 0
    return values, valid


def group_columns(
    read: Episodes, episodes: list[int], layout: Layout, names: list[str], files: dict[int, str]
) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    """{column: ([sum N, ...] values, [sum N] validity or None)} of E episodes read at once
    (``episodes`` their ids, ``files`` {id: the file named by an error})."""
    _check_rows(read, episodes, files)
    steps = read.steps
    out: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
    observations = None
    for name in names:
        column = layout.columns[name]
        if column.kind == "id":
            out[name] = (np.repeat(np.asarray(episodes, np.int64), steps), None)
        elif column.kind == "step":
            start = np.cumsum(steps) - steps
            out[name] = (np.arange(int(steps.sum())) - np.repeat(start, steps), None)
        elif column.kind in ("observation", "next_observation"):
            path = layout.observation[0][0]
            if observations is None:
                observations = _observations(read, layout)
            if column.kind == "observation":
                out[name] = (observations[_rows(read.counts[path], steps, 0)], None)
            else:
                out[name] = _next_observations(observations, read.counts[path], steps)
        else:
            path = column.paths[0]
            counts = read.counts[path]
            shift = (counts == steps + 1).astype(np.int64) if column.kind == "info" else 0
            out[name] = (read.values[path][_rows(counts, steps, shift)], None)
    for name, start in layout.starts.items():
        if name in out:
            values, valid = out[name]
            out[name] = (values - np.asarray(start, values.dtype), valid)
    return out


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
        """Step-layout record batches of ``columns``, ``rows`` steps each, read a group of
        episodes at a time (about ``rows`` steps); one HDF5 file (or the data directory) is
        the batches' file, and an error names the file of its episode (one of ``files``)."""
        where = self.storage.path if isinstance(self.storage, Hdf5Storage) else str(self.data_dir)
        schema = pa.schema([self.schema.field(c) for c in columns])
        batcher, offset = _Batcher(schema, rows), 0

        def flush() -> Iterator[SourcedBatch]:
            nonlocal offset
            last = list(batcher.flush()) or [pa.RecordBatch.from_pylist([], schema=schema)]
            for i, batch in enumerate(last):
                yield SourcedBatch(where, batch, i == len(last) - 1, offset)
                offset += batch.num_rows

        for parts, n in self._groups(columns, rows):
            if parts is None:  # a bad episode: the episodes read before it still count
                yield from flush()
                raise n
            for batch in batcher.add(parts, n):
                yield SourcedBatch(where, batch, False, offset)
                offset += batch.num_rows
        yield from flush()

    def _groups(self, columns: list[str], rows: int) -> Iterator[tuple[dict | None, Any]]:
        """(columns, steps) of groups of episodes in id order, about ``rows`` steps each;
        at a bad episode, the good ones of its group one by one, then (None, DataError)."""
        if not self.episodes:
            return
        paths = _leaves_needed(self.layout, columns)
        files = dict(self.episodes)
        ids = [e for e, _ in self.episodes]
        with self.storage.reader() as read:
            start, size = 0, FIRST_GROUP
            while start < len(ids):
                group = ids[start : start + size]
                try:
                    episodes = read(group, paths)
                    parts = group_columns(episodes, group, self.layout, columns, files)
                except DataError:
                    yield from self._one_by_one(read, group, paths, columns, files)
                    return
                steps = int(episodes.steps.sum())
                yield parts, steps
                start += len(group)
                size = int(np.clip(rows * len(group) // max(steps, 1), 1, MAX_GROUP))

    def _one_by_one(self, read, group: list[int], paths: list[str], columns: list[str], files):
        """The episodes of a group that holds a bad one, each alone, up to the bad one."""
        for episode in group:
            try:
                episodes = read([episode], paths)
                parts = group_columns(episodes, [episode], self.layout, columns, files)
            except DataError as error:
                yield None, error
                return
            yield parts, int(episodes.steps.sum())


def open_source(source: str) -> MinariDataset:
    """Opens a Minari dataset (directory or ``minari:ID``); raises DataError."""
    data_dir = resolve(source)
    metadata = _metadata(data_dir)
    storage = _storage(data_dir, metadata["data_format"])
    obs_space = _space(metadata, "observation_space", data_dir / "metadata.json")
    action_space = _space(metadata, "action_space", data_dir / "metadata.json")
    episodes = storage.episodes()
    if not episodes:
        raise DataError(f"{source}: Minari dataset has no episodes")
    layout = describe(storage, next(iter(episodes)), obs_space, source, action_space)
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
