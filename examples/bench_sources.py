"""Steps per second of reading the same logged episodes from Parquet, a D4RL-style HDF5 file
and a Minari dataset (HDF5 and Arrow storage): the source alone (the record batches of the
columns ``ope evaluate`` reads) and ``ope evaluate`` end to end. No test runs it:

    python examples/bench_sources.py [--episodes 2000] [--median-length 100] [--repeats 3]

The Minari datasets are written in Minari's on-disk layout with h5py / pyarrow (the tests
build theirs with the ``minari`` library itself), so this needs neither minari nor gymnasium.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

import ope_cli
from ope_cli.config import ColumnMapping
from ope_cli.schema import resolve_schema
from ope_cli.sources import open_dataset

OBS_DIM, N_ACTIONS = 8, 4


def make_steps(episodes: int, median_length: int, seed: int = 0) -> dict[str, np.ndarray]:
    """[E] lengths and flat per-step arrays, plus [N + E, D] observations (each episode's
    N + 1 observations, the last one its final state)."""
    rng = np.random.default_rng(seed)
    lengths = np.clip(np.rint(rng.lognormal(np.log(median_length), 0.5, episodes)), 1, None)
    lengths = lengths.astype(np.int64)
    n = int(lengths.sum())
    return {
        "lengths": lengths,
        "observations": rng.normal(size=(n + episodes, OBS_DIM)).astype(np.float32),
        "actions": rng.integers(0, N_ACTIONS, n),
        "rewards": rng.normal(size=n),
        "log_probs": np.log(rng.uniform(0.1, 1.0, n)),
    }


def _step_observations(data: dict) -> np.ndarray:
    """[N, D]: every observation but each episode's final state."""
    lengths = data["lengths"]
    final = np.cumsum(lengths + 1) - 1
    keep = np.ones(len(data["observations"]), bool)
    keep[final] = False
    return data["observations"][keep]


def write_parquet(path: Path, data: dict) -> Path:
    lengths = data["lengths"]
    obs = _step_observations(data)
    table = pa.table(
        {
            "episode_id": np.repeat(np.arange(lengths.size), lengths),
            "step": np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths),
            "observation": pa.FixedSizeListArray.from_arrays(pa.array(obs.reshape(-1)), OBS_DIM),
            "action": data["actions"],
            "reward": data["rewards"],
            "behavior_log_prob": data["log_probs"],
        }
    )
    pq.write_table(table, path)
    return path


def write_d4rl(path: Path, data: dict) -> Path:
    terminals = np.zeros(data["lengths"].sum(), bool)
    terminals[np.cumsum(data["lengths"]) - 1] = True
    with h5py.File(path, "w") as handle:
        handle["observations"] = _step_observations(data)
        handle["actions"] = data["actions"]
        handle["rewards"] = data["rewards"]
        handle["terminals"] = terminals
        handle["timeouts"] = np.zeros_like(terminals)
        handle["infos/action_log_probs"] = data["log_probs"]
    return path


def _minari_metadata(folder: Path, data: dict, data_format: str) -> None:
    box = {"type": "Box", "dtype": "float32", "shape": [OBS_DIM]}
    box.update(low=[-np.inf] * OBS_DIM, high=[np.inf] * OBS_DIM)
    metadata = {
        "data_format": data_format,
        "total_episodes": int(data["lengths"].size),
        "total_steps": int(data["lengths"].sum()),
        "observation_space": json.dumps(box),
        "action_space": json.dumps({"type": "Discrete", "dtype": "int64", "n": N_ACTIONS}),
    }
    (folder / "metadata.json").write_text(json.dumps(metadata))


def _episodes(data: dict):
    """(id, [n + 1, D] observations, n actions, rewards, [n + 1] info log-probs) each."""
    lengths = data["lengths"]
    steps = np.concatenate([[0], np.cumsum(lengths)])
    obs_start = steps + np.arange(lengths.size + 1)
    for i, n in enumerate(lengths):
        part = slice(steps[i], steps[i + 1])
        infos = np.concatenate([[0.0], data["log_probs"][part]])  # row 0: the reset's info
        observations = data["observations"][obs_start[i] : obs_start[i] + n + 1]
        yield i, observations, data["actions"][part], data["rewards"][part], infos


def write_minari_hdf5(folder: Path, data: dict) -> Path:
    (folder / "data").mkdir(parents=True)
    with h5py.File(folder / "data" / "main_data.hdf5", "w") as handle:
        for i, obs, actions, rewards, infos in _episodes(data):
            group = handle.create_group(f"episode_{i}")
            group["observations"], group["actions"], group["rewards"] = obs, actions, rewards
            group["terminations"] = np.arange(rewards.size) == rewards.size - 1
            group["truncations"] = np.zeros(rewards.size, bool)
            group["infos/action_log_probs"] = infos
    _minari_metadata(folder / "data", data, "hdf5")
    return folder


def write_minari_arrow(folder: Path, data: dict) -> Path:
    for i, obs, actions, rewards, infos in _episodes(data):
        episode = folder / "data" / str(i)
        episode.mkdir(parents=True)
        pad = lambda values: np.concatenate([values, np.zeros(1, values.dtype)])  # noqa: E731
        flags = np.arange(rewards.size) == rewards.size - 1
        table = pa.table(
            {
                "observations": pa.FixedSizeListArray.from_arrays(
                    pa.array(obs.reshape(-1)), OBS_DIM
                ),
                "actions": pad(actions),
                "rewards": pad(rewards),
                "terminations": pad(flags),
                "truncations": np.zeros(obs.shape[0], bool),
                "infos": pa.StructArray.from_arrays([pa.array(infos)], ["action_log_probs"]),
            }
        )
        with ipc.new_file(episode / "part-0.arrow", table.schema) as writer:
            writer.write_table(table)
        (episode / "metadata.json").write_text(
            json.dumps({"id": i, "total_steps": int(len(rewards))})
        )
    _minari_metadata(folder / "data", data, "arrow")
    return folder


def read_rate(source: str, repeats: int) -> float:
    """Steps per second of the source's record batches alone (best of ``repeats``)."""
    best = np.inf
    for _ in range(repeats):
        started = time.perf_counter()
        data = open_dataset(source)
        schema = resolve_schema(data.schema, ColumnMapping(), logged_target=False)
        steps = sum(b.batch.num_rows for b in data.iter_batches(schema.read_columns, 65_536))
        best = min(best, time.perf_counter() - started)
    return steps / best


def evaluate_rate(source: str, policy: str, repeats: int) -> float:
    """Steps per second of ope evaluate end to end (best of ``repeats``, compiled)."""
    best, steps = np.inf, 0
    for _ in range(repeats):
        started = time.perf_counter()
        result = ope_cli.evaluate(ope_cli.EvaluationConfig(source, policies=(policy,)))
        best = min(best, time.perf_counter() - started)
        steps = result.steps
    return steps / best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--median-length", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    data = make_steps(args.episodes, args.median_length)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        rng = np.random.default_rng(1)
        policy = root / "pi.npz"
        np.savez(
            policy,
            kind="linear_softmax",
            weight=rng.normal(size=(OBS_DIM, N_ACTIONS)),
            bias=np.zeros(N_ACTIONS),
        )
        sources = {
            "parquet": write_parquet(root / "steps.parquet", data),
            "d4rl hdf5": write_d4rl(root / "d4rl.hdf5", data),
            "minari hdf5": write_minari_hdf5(root / "minari-hdf5", data),
            "minari arrow": write_minari_arrow(root / "minari-arrow", data),
        }
        evaluate_rate(str(sources["parquet"]), str(policy), 1)  # compile the kernel once
        steps = int(data["lengths"].sum())
        print(f"{args.episodes} episodes, {steps:,} steps (median length {args.median_length})")
        print(f"{'source':<14} {'read steps/s':>14} {'vs parquet':>10} {'evaluate steps/s':>17}")
        base = None
        for name, path in sources.items():
            read = read_rate(str(path), args.repeats)
            full = evaluate_rate(str(path), str(policy), args.repeats)
            base = base or (read, full)
            print(
                f"{name:<14} {read:>14,.0f} {read / base[0]:>10.2f} {full:>17,.0f}"
                f" ({full / base[1]:.2f})"
            )


if __name__ == "__main__":
    main()
