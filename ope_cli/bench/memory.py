"""``ope bench --memory``: peak RSS of ``ope evaluate`` subprocesses on 1x and 10x data."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

import numpy as np

from ope_cli.bench.config import MEMORY_FACTOR, Progress, evaluate_command
from ope_cli.bench.data import episodes_for_steps, generate_data, generated_checkpoint
from ope_cli.bench.measure import ratio
from ope_cli.config import BatchingConfig


def peak_rss_of(command: list[str], env: dict, stdout_path: Path) -> tuple[int, float]:
    """(peak resident set size in bytes, wall seconds) of one child process, which must
    succeed; its stdout goes to ``stdout_path``.

    The peak is the child's own ``VmHWM`` (/proc/<pid>/status), read every few milliseconds
    once it has exec'd ``command`` (its command line is then exactly ``command``; before,
    it is the forking parent's copy). Not ``ru_maxrss``: Linux folds the forking parent's
    high-water mark into the child's at exec, so a big parent would hide the child's.
    """
    started = time.perf_counter()
    peak_kib = 0
    exec_cmdline = b"".join(os.fsencode(part) + b"\0" for part in command)
    with open(stdout_path, "wb") as stdout, tempfile.TemporaryFile() as stderr:
        child = subprocess.Popen(
            command, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL, env=env
        )
        status_path = Path(f"/proc/{child.pid}/status")
        cmdline_path = Path(f"/proc/{child.pid}/cmdline")
        while child.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                if cmdline_path.read_bytes() == exec_cmdline:  # its own memory from here on
                    for line in status_path.read_text().splitlines():
                        if line.startswith("VmHWM:"):
                            peak_kib = max(peak_kib, int(line.split()[1]))
            time.sleep(0.005)
        stderr.seek(0)
        message = stderr.read().decode(errors="replace").strip()[-500:]
    if child.returncode != 0:
        raise RuntimeError(f"{' '.join(command[:4])} ... exited {child.returncode}: {message}")
    return peak_kib * 1024, time.perf_counter() - started


def _peak_run(command: list[str], env: dict, stdout_path: Path) -> dict:
    """One ``ope evaluate`` child's peak RSS and seconds, with its steps (real, padded) and
    longest episode from its JSON report."""
    peak, seconds = peak_rss_of(command, env, stdout_path)
    reported = json.loads(stdout_path.read_text())
    return {
        "steps": reported["dataset"]["steps"],
        "padded_steps": reported["runtime"]["padded_steps"],
        "longest": reported["dataset"]["max_length"],
        "peak_rss_bytes": peak,
        "peak_rss_mib": peak / 2**20,
        "seconds": seconds,
    }


def measure_memory(
    directory: Path,
    base_steps: int,
    seed: int,
    batching: BatchingConfig,
    progress: Progress,
) -> dict:
    """Peak RSS of ``ope evaluate`` subprocesses on 1x and MEMORY_FACTORx generated data,
    and on as many steps as the MEMORY_FACTORx data in one long episode among the 1x data's
    episodes (SPEC 6: the same peak; the short ones give it every resampling group), with
    a checkpoint of the generated data's sizes."""
    checkpoint = generated_checkpoint(directory, seed)
    runs, lengths = {}, {}
    # a warm compilation cache, as a user's second run has: compiling adds ~55 MiB to every
    # peak, a constant on both sides of the ratios that pulls them towards 1
    env = dict(os.environ, OPE_CACHE_DIR=str(directory / "memory-cache"))
    big = MEMORY_FACTOR * base_steps
    cases = {  # name: (episodes, seed)
        "1x": (episodes_for_steps(base_steps), seed + 1),
        f"{MEMORY_FACTOR}x": (episodes_for_steps(big), seed + MEMORY_FACTOR),
        "one_episode": (None, seed + MEMORY_FACTOR + 1),
    }
    for name, (episodes, data_seed) in cases.items():
        path = directory / f"memory_{name}.parquet"
        if episodes is None:  # the long episode, then the 1x data's episodes: as many
            # steps as the 10x data has (generated sizes only approach what is asked)
            short, many = lengths["1x"], int(lengths[f"{MEMORY_FACTOR}x"].sum())
            long = np.concatenate([[max(many - int(short.sum()), 1)], short])
            info = generate_data(path, long.size, data_seed, long)
        else:
            info = generate_data(path, episodes, data_seed)
        lengths[name] = info["lengths"]
        command = evaluate_command(str(path), checkpoint, batching)
        if not runs:  # one untimed run fills the cache with the configuration's kernels
            progress("memory: one ope evaluate fills the compilation cache")
            peak_rss_of(command, env, directory / f"memory_{name}.json")
        progress(f"memory: ope evaluate on {info['steps']:,} steps ({name}) in a subprocess")
        runs[name] = _peak_run(command, env, directory / f"memory_{name}.json")
        path.unlink()
    many, base = runs[f"{MEMORY_FACTOR}x"]["peak_rss_bytes"], runs["1x"]["peak_rss_bytes"]
    return {
        **runs,
        "growth": ratio(many, base),
        # against 1x, as the growth is (against the 10x data it hid the growth that run
        # already had: 1.20 where 1x gives 1.66)
        "one_episode_ratio": ratio(runs["one_episode"]["peak_rss_bytes"], base),
        "factor": MEMORY_FACTOR,  # asked; the steps generated: each run's "steps"
        "method": "VmHWM of each ope evaluate child, read while it runs; one compilation "
        "cache, warmed by an untimed run first; one_episode_ratio: one long episode among the "
        "1x data's, as many steps as the 10x data / the 1x data",
    }
