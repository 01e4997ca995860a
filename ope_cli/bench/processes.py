"""Whole processes, as a user types them: the floor of any JAX program, ``ope evaluate``
with an empty and with a warm persistent compilation cache (and with a Q checkpoint on
another empty one), a second dataset with other episode lengths on that warm cache, a
10,000-step bandit log, and a fresh Python process reading the same columns with pyarrow
(the I/O floor), beside one that only imports pyarrow.parquet; and ``ope evaluate`` with K
policies beside one (``measure_many_policies``)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ope_cli.bench.config import BenchConfig, Progress, evaluate_command, process_environment
from ope_cli.bench.data import generate_data, generated_checkpoint
from ope_cli.config import BatchingConfig

BANDIT_STEPS = 10_000
WARMING_EPISODES = 200  # a first run compiles every window shape, whatever its data
FLOOR_CODE = "import jax; jax.numpy.zeros(1).block_until_ready()"  # the small-data floor
# SPEC 6's import floor of the process ratio: jax, numpy and pyarrow, and the device touched
IMPORT_FLOOR_CODE = "import jax, numpy, pyarrow; jax.numpy.zeros(1).block_until_ready()"
PYARROW_FLOOR_CODE = "import pyarrow.parquet"
# pyarrow loaded as ope loads it, with pandas hidden (``__main__.load_pyarrow_without_pandas``):
# where pandas is installed, pyarrow imports it (0.2 s) only to recognise pandas objects,
# which is no part of what reading needs; both sides of the ratio are spared it
PYARROW_CODE = """
import sys
from ope_cli.__main__ import load_pyarrow_without_pandas
load_pyarrow_without_pandas()
import numpy as np, pyarrow as pa, pyarrow.dataset as ds
for batch in ds.dataset(sys.argv[1]).to_batches(columns=sys.argv[2].split(",")):
    for column in batch.columns:
        if pa.types.is_list(column.type) or pa.types.is_fixed_size_list(column.type):
            column.flatten().to_numpy().reshape(len(column), -1)
        else:
            np.asarray(column.to_numpy(zero_copy_only=False))
"""


def _run(command: list[str], env: dict[str, str]) -> tuple[float, str]:
    """(wall seconds, stdout) of one process, which must succeed."""
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        message = done.stderr.strip().splitlines()[-1:] or [""]
        raise RuntimeError(f"{' '.join(command[:4])} ... exited {done.returncode}: {message[0]}")
    return seconds, done.stdout


def _seconds(run: float | dict) -> float:
    return run["seconds"] if isinstance(run, dict) else run


def _interleaved(rounds: int, runs: dict[str, Callable[[], float | dict]]) -> dict:
    """The fastest of ``rounds`` runs of each of ``runs`` (name -> one timed run: its seconds,
    or an ``_evaluate`` dict), taken in turn round after round: a host whose speed drifts
    slows the floors and the runs of a round alike, so their differences and ratios keep
    to the code (one block of each after the other measured a floor 0.81 s in one run of
    the bench and 0.52 s in the next)."""
    results: dict[str, list] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            results[name].append(run())
    return {name: min(each, key=_seconds) for name, each in results.items()}


def _evaluate(
    data: str, checkpoint: str, batching: BatchingConfig, env: dict, *options: str
) -> dict:
    """One ``ope evaluate`` process: its wall seconds, its JSON runtime block's counts and
    its real and padded steps."""
    seconds, stdout = _run([*evaluate_command(data, checkpoint, batching), *options], env)
    document = json.loads(stdout)
    runtime = document["runtime"]
    keys = ("compilations", "compile_seconds", "cache_hits", "batch_shapes", "padded_steps")
    counts = {key: runtime[key] for key in keys}
    return {"seconds": seconds, **counts, "real_steps": document["dataset"]["steps"]}


def write_bytecode(directory: Path, seed: int, batching: BatchingConfig) -> None:
    """One untimed ``ope evaluate`` (no compilation cache) on a little generated data, so
    that the bytecode of every module a run imports is in ``process_environment``'s
    cache before any process is timed; once per work directory."""
    if (directory / "bytecode").is_dir():
        return
    data = directory / "bytecode.parquet"
    generate_data(data, WARMING_EPISODES, seed)
    env = process_environment(directory, OPE_CACHE_DIR="off")
    _evaluate(str(data), generated_checkpoint(directory, seed), batching, env)
    data.unlink()


def emptied(cache: Path) -> str:
    """``cache`` as an empty compilation cache: a --out directory of an earlier bench holds
    its kernels, and the "empty cache" runs then compiled nothing (0.0 s, judged met)."""
    shutil.rmtree(cache, ignore_errors=True)
    return str(cache)


def measure_processes(
    directory: Path,
    data: str,
    columns: list[str],
    checkpoints: tuple[str, str],
    config: BenchConfig,
    progress: Progress,
) -> dict:
    """Wall times of whole processes; every ``ope evaluate`` shares one compilation cache,
    empty at first, in ``directory`` (the one with a Q checkpoint has its own); floors,
    the pyarrow read and warm runs: the fastest of ``config.rounds``, in turn
    (``_interleaved``). ``checkpoints``: (a policy, a Q checkpoint for it)."""
    checkpoint, q = checkpoints
    batching, python = config.batching, sys.executable
    env = process_environment(directory, OPE_CACHE_DIR=emptied(directory / "process-cache"))
    progress("whole processes: their modules' bytecode, then ope evaluate with an empty cache")
    write_bytecode(directory, config.seed, batching)
    cold = _evaluate(data, checkpoint, batching, env)
    progress("whole processes: ope evaluate --q CKPT with another empty cache")
    q_env = dict(env, OPE_CACHE_DIR=emptied(directory / "process-cache-q"))
    cold_q = _evaluate(data, checkpoint, batching, q_env, "--q", q)
    other, (bandit_path, bandit_checkpoint) = measure_other_data(directory, config, env, progress)
    progress("whole processes, in turn: the floors, the pyarrow read, ope evaluate (warm)")
    best = _interleaved(
        config.rounds,
        {
            "floor": lambda: _run([python, "-c", FLOOR_CODE], env)[0],
            "import_floor": lambda: _run([python, "-c", IMPORT_FLOOR_CODE], env)[0],
            "pyarrow": lambda: _run([python, "-c", PYARROW_CODE, data, ",".join(columns)], env)[0],
            "pyarrow_floor": lambda: _run([python, "-c", PYARROW_FLOOR_CODE], env)[0],
            "warm": lambda: _evaluate(data, checkpoint, batching, env),
            "bandit": lambda: _evaluate(str(bandit_path), bandit_checkpoint, batching, env),
        },
    )
    bandit_path.unlink()
    floor, import_floor, warm = best["floor"], best["import_floor"], best["warm"]
    read, above = best["pyarrow"] - best["pyarrow_floor"], warm["seconds"] - import_floor
    return {
        "import_jax_floor_seconds": floor,
        "import_floor_seconds": import_floor,
        "pyarrow_read_seconds": best["pyarrow"],
        "import_pyarrow_floor_seconds": best["pyarrow_floor"],
        "evaluate_cold_cache": cold,
        "evaluate_cold_cache_q": cold_q,
        "evaluate_warm_cache": warm,
        "other_lengths_warm_cache": other,
        "bandit_warm_cache": {**best["bandit"], "steps": BANDIT_STEPS},
        "bandit_over_floor_seconds": best["bandit"]["seconds"] - floor,
        # whether the processes read their modules' bytecode from the work directory's
        # cache, as an installed package's are (without it each compiles ope's modules)
        "bytecode_cached": any((directory / "bytecode").rglob("*.pyc")),
        # (ope evaluate above the import floor) / (pyarrow's read above its import);
        # None where the read or ope's time above its floor is within the floors' noise
        # (tiny data: a floor measured slower than the whole warm run)
        "evaluate_over_pyarrow": above / read if read > 0 and above > 0 else None,
        "method": "wall time of each process as typed; the import floors (jax alone; jax, "
        "numpy and pyarrow), the pyarrow read and its floor, ope evaluate warm and on a "
        "bandit log: the fastest of several rounds, each round running every one of them in "
        "turn; one compilation cache for every ope evaluate, empty before the first",
    }


def measure_other_data(
    directory: Path, config: BenchConfig, env: dict, progress: Progress
) -> tuple[dict, tuple[Path, str]]:
    """``ope evaluate`` on the warm cache of another dataset (other lengths), with its step
    count, and (a bandit log's path, a checkpoint of its sizes), its shape compiled into the
    cache (``measure_processes`` times it). Both are generated; with ``--data`` (a cache
    warmed by other columns) one untimed run on generated data warms it first."""
    batching, seed = config.batching, config.seed
    checkpoint = generated_checkpoint(directory, seed)
    if config.data is not None:
        warm_path = directory / "warm_generated.parquet"
        generate_data(warm_path, WARMING_EPISODES, seed)
        progress("whole processes: one ope evaluate on generated data warms its kernels")
        _evaluate(str(warm_path), checkpoint, batching, env)
        warm_path.unlink()
    rng = np.random.default_rng([seed, 9])
    other_path = directory / "other_lengths.parquet"
    other_lengths = rng.integers(2, 120, size=3_000)  # uniform, not long-tailed
    generate_data(other_path, other_lengths.size, seed + 9, lengths=other_lengths)
    progress("whole processes: another dataset (other lengths) on the warm cache")
    other = _evaluate(str(other_path), checkpoint, batching, env)
    other_path.unlink()
    bandit_path = directory / "bandit.parquet"
    generate_data(bandit_path, BANDIT_STEPS, seed + 10, lengths=np.ones(BANDIT_STEPS, np.int64))
    progress(f"whole processes: a {BANDIT_STEPS:,}-step bandit log on the warm cache")
    bandit = _evaluate(str(bandit_path), checkpoint, batching, env)
    # the bandit log is other data too: its first run's compilations count (it compiles
    # none when the catalogue holds its shape), and later runs time the small-data target
    other = {
        **other,
        "steps": int(other_lengths.sum()),
        "bandit_compilations": bandit["compilations"],
    }
    return other, (bandit_path, checkpoint)


def measure_many_policies(
    directory: Path, data: str, checkpoints: list[str], config: BenchConfig, progress: Progress
) -> dict:
    """``ope evaluate DATA --policy c1 ... --policy cK`` beside the same with ``c1`` alone, as
    whole processes: each first with its own empty compilation cache (the first run, which
    compiles), then warm, alternating, the fastest of ``config.rounds`` each."""
    k, batching = len(checkpoints), config.batching
    runs = {1: checkpoints[:1], k: checkpoints}
    caches = {n: emptied(directory / f"process-cache-{n}-policies") for n in runs}

    def evaluate(n: int) -> dict:
        env = process_environment(directory, OPE_CACHE_DIR=str(caches[n]))
        first, *rest = runs[n]
        return _evaluate(data, first, batching, env, *(f"--policy={c}" for c in rest))

    progress(f"whole processes: ope evaluate with {k} policies and with 1, empty caches")
    cold = {n: evaluate(n) for n in runs}
    progress(f"whole processes: ope evaluate with {k} policies and with 1, warm caches")
    warm = {n: [] for n in runs}
    for _ in range(config.rounds):
        for n in runs:
            warm[n].append(evaluate(n))
    warm = {n: min(each, key=lambda run: run["seconds"]) for n, each in warm.items()}
    return {
        "k": k,
        "warm_cache_seconds_1": warm[1]["seconds"],
        "warm_cache_seconds_k": warm[k]["seconds"],
        "warm_cache_ratio": warm[k]["seconds"] / warm[1]["seconds"],
        "cold_cache_seconds_1": cold[1]["seconds"],
        "cold_cache_seconds_k": cold[k]["seconds"],
        "cold_cache_ratio": cold[k]["seconds"] / cold[1]["seconds"],
        "method": "wall time of whole ope evaluate processes, K policies / 1 on the same "
        f"data; cold: each with its own empty compilation cache; warm: fastest of "
        f"{config.rounds}, alternating",
    }
