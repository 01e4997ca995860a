"""Steps per second of reading the same logged episodes from Parquet, a D4RL-style HDF5 file
and a Minari dataset (HDF5 and Arrow storage): the source alone (the record batches of the
columns ``ope evaluate`` reads) and ``ope evaluate`` end to end. No test runs it:

    python studies/bench_sources.py [--episodes 2000] [--median-length 100] [--repeats 3] [--s3]

With ``--s3`` it also serves the Parquet file from a local S3-compatible server (moto's,
started as a separate process; skipped when moto is not installed) and says how much of the
slower reading ``ope evaluate`` hides behind compute: reads run on a background thread.

The Minari datasets are written in Minari's on-disk layout with h5py / pyarrow (the tests
build theirs with the ``minari`` library itself), so this needs neither minari nor gymnasium.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import h5py
import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

import ope_cli
from ope_cli.data.episode_stream import DataConfig, open_episodes

OBS_DIM, N_ACTIONS = 8, 4
ROW_GROUP = 16_384  # rows per row group and per batch read, Parquet local and on S3


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
    """As minari 0.5.4 writes: every leaf chunked (h5py's chunk shape), resizable."""
    (folder / "data").mkdir(parents=True)
    with h5py.File(folder / "data" / "main_data.hdf5", "w") as handle:
        for i, obs, actions, rewards, infos in _episodes(data):
            group = handle.create_group(f"episode_{i}")
            leaves = {
                "observations": obs,
                "actions": actions,
                "rewards": rewards,
                "terminations": np.arange(rewards.size) == rewards.size - 1,
                "truncations": np.zeros(rewards.size, bool),
                "infos/action_log_probs": infos,
            }
            for key, values in leaves.items():
                group.create_dataset(
                    key, data=values, chunks=True, maxshape=(None, *values.shape[1:])
                )
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
        episodes = open_episodes(DataConfig(source))
        steps = sum(b.batch.num_rows for b in episodes.record_batches())
        best = min(best, time.perf_counter() - started)
    return steps / best


def evaluate_rate(source: str, policy: str, repeats: int, read_rows: int = 65_536) -> float:
    """Steps per second of ope evaluate end to end (best of ``repeats``, compiled)."""
    best, steps = np.inf, 0
    batching = ope_cli.BatchingConfig(read_rows=read_rows)
    for _ in range(repeats):
        started = time.perf_counter()
        config = ope_cli.EvaluationConfig(source, policies=(policy,), batching=batching)
        result = ope_cli.evaluate(config)
        best = min(best, time.perf_counter() - started)
        steps = result.dataset.steps
    return steps / best


@contextlib.contextmanager
def s3_server(folder: Path):
    """An S3-compatible server (moto, its own process) on 127.0.0.1 holding ``folder``'s
    files in bucket ``bench``; the environment points pyarrow at it meanwhile."""
    import pyarrow.fs as pafs

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    command = [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    env = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench"}
    env.update(AWS_ENDPOINT_URL=endpoint, AWS_REGION="us-east-1")
    saved = {key: os.environ.get(key) for key in env}
    try:
        for _ in range(200):
            with contextlib.suppress(OSError):
                urllib.request.urlopen(endpoint, timeout=1).close()
                break
            time.sleep(0.05)
        os.environ.update(env)
        filesystem = pafs.S3FileSystem(
            endpoint_override=endpoint, allow_bucket_creation=True, region="us-east-1"
        )
        filesystem.create_dir("bench")
        pafs.copy_files(str(folder), "bench", destination_filesystem=filesystem)
        yield "s3://bench"
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        server.terminate()
        server.wait()


def seconds(rate_of, source: str, steps: int, *args) -> float:
    return steps / rate_of(source, *args)


@contextlib.contextmanager
def waiting_for_data(read_ahead: bool):
    """Seconds ope evaluate's compute waits for record batches after the first one, and for
    the first one (a [2] list, summed over the runs inside): the reading it does not hide
    (the first batch is always waited for). Without ``read_ahead`` it reads on its own
    thread, between compute steps: then it waits for all of the reading."""
    import ope_cli.estimation.pipeline as pipeline

    saved, waited = pipeline.prefetched, [0.0, 0.0]

    def timed(items, depth=2):
        source = saved(items, depth) if read_ahead else iter(items)
        first = True
        try:
            while True:
                started = time.perf_counter()
                try:
                    item = next(source)
                except StopIteration:
                    return
                finally:
                    waited[first] += time.perf_counter() - started
                    first = False
                yield item
        finally:
            if hasattr(source, "close"):
                source.close()

    pipeline.prefetched = timed
    try:
        yield waited
    finally:
        pipeline.prefetched = saved


def s3_overlap(parquet: Path, policy: str, steps: int, repeats: int) -> None:
    """Seconds ope evaluate spends, and of those waits for data after the first batch with
    and without reading ahead, the Parquet file local and on S3; the share of the reading
    that reading ahead hides behind compute is 1 - (wait with) / (wait without)."""
    folder = parquet.parent / "s3"
    folder.mkdir()
    copy = folder / parquet.name  # row groups and batches of 16,384 rows: reading to hide
    pq.write_table(pq.read_table(parquet), copy, row_group_size=ROW_GROUP)
    print(f"\nparquet local and on S3 (moto, 127.0.0.1): seconds for {steps:,} steps")
    print(f"{'':<8} {'evaluate':>9} {'first batch':>12} {'then waits':>11}", end=" ")
    print(f"{'no read-ahead':>14} {'hidden':>7}")
    with s3_server(folder) as bucket:
        for name, source in (("local", str(copy)), ("s3", f"{bucket}/{parquet.name}")):
            full = seconds(evaluate_rate, source, steps, policy, repeats, ROW_GROUP)
            waits = {}
            for read_ahead in (True, False):
                with waiting_for_data(read_ahead) as waited:
                    evaluate_rate(source, policy, repeats, ROW_GROUP)
                waits[read_ahead] = [w / repeats for w in waited]
            (later, first), alone = waits[True], waits[False][0]
            print(f"{name:<8} {full:>9.3f} {first:>12.3f} {later:>11.3f}", end=" ")
            print(f"{alone:>14.3f} {1 - later / alone:>7.0%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--episodes", type=int, default=2000)
    parser.add_argument("--median-length", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--s3", action="store_true", help="also Parquet on a local S3 server")
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
        if args.s3 and importlib.util.find_spec("moto") is None:
            print("\n--s3: skipped (moto is not installed: pip install 'moto[server]')")
        elif args.s3:
            s3_overlap(sources["parquet"], str(policy), steps, args.repeats)


if __name__ == "__main__":
    main()
