"""The files of ``ope generate``: step-layout Parquet logs (with the declared reward range,
horizon and discount in the schema metadata) and byte-reproducible .npz checkpoints."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import jax
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ope_cli.data.sources import METADATA_KEY
from ope_cli.envs.base import Environment, Params
from ope_cli.envs.rollout import simulate

BLOCK_EPISODES = 1 << 17  # episodes simulated and written at a time (bounds memory)
# ... and at most this many steps' worth under a horizon: a block is held whole while it
# is simulated (300 episodes of 10M steps asked for 24 GB, then more, instead of streaming)
BLOCK_STEPS = 1 << 22
ROW_GROUP_ROWS = 1 << 17


def _column(values: np.ndarray) -> pa.Array:
    """[N] -> a scalar column; [N, d] -> a list<float64> column."""
    if values.ndim == 1:
        return pa.array(values)
    offsets = np.arange(0, values.size + 1, values.shape[1], dtype=np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values.reshape(-1)))


def _table(data: dict[str, np.ndarray], declared: dict) -> pa.Table:
    """The step-layout table, with the bounds every episode keeps to in its schema metadata
    (what ``ope evaluate --ci betting`` relies on)."""
    names = ("episode_id", "step", "observation", "action", "reward", "behavior_prob")
    table = pa.table({name: _column(data[name]) for name in names})
    return table.replace_schema_metadata({METADATA_KEY: json.dumps(declared)})


def block_episodes(horizon: int | None) -> int:
    """Episodes simulated and written at a time: BLOCK_EPISODES, fewer where ``horizon``
    lets them reach BLOCK_STEPS steps (never fewer than one). The data does not depend on
    it: an episode's steps depend only on the seed and its id."""
    if horizon is None:
        return BLOCK_EPISODES
    return max(1, min(BLOCK_EPISODES, BLOCK_STEPS // horizon))


def write_logs(
    environment: Environment,
    params: Params,
    data_key: jax.Array,
    episodes: int,
    horizon: int | None,
    files: int,
    out: Path,
    gamma: float | None = None,
) -> tuple[int, int]:
    """Simulates and writes the episodes, whole ones per file; returns (steps, longest episode).
    ``gamma``: the discount of the true values, declared in the metadata (None: not declared)."""
    if files == 1:
        paths = [out / "logs.parquet"]
    else:
        (out / "logs").mkdir(exist_ok=True)
        paths = [out / "logs" / f"part-{k:05d}.parquet" for k in range(files)]
    bounds = [k * episodes // files for k in range(files + 1)]
    declared = {"reward_range": environment.reward_range, "horizon": horizon}
    if gamma is not None:
        declared["gamma"] = gamma
    steps = longest = 0
    block = block_episodes(horizon)
    for path, first, last in zip(paths, bounds[:-1], bounds[1:], strict=True):
        writer = None
        for start in range(first, last, block):
            data = simulate(environment, params, data_key, start, min(block, last - start), horizon)
            table = _table(data, declared)
            writer = writer or pq.ParquetWriter(path, table.schema, compression="snappy")
            writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
            steps += len(data["step"])
            longest = max(longest, int(data["step"].max()) + 1)
        writer.close()
    return steps, longest


def write_npz(path: Path, kind: str, arrays: Params) -> None:
    """Like np.savez, with a fixed date in the archive so equal arrays give equal bytes;
    numbers as float64, text and booleans as they are."""
    entries = {"kind": np.array(kind)}
    for name, value in arrays.items():
        value = np.asarray(value)
        entries[name] = value if value.dtype.kind in "USb" else value.astype(np.float64)
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, value in entries.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            with archive.open(info, "w", force_zip64=True) as member:
                np.lib.format.write_array(member, value, allow_pickle=False)
