"""``ope bench --script``: whole warm ``ope evaluate`` processes against a plain NumPy script
(``bench/numpy_script.py``) that reads the same file and computes the same four estimates,
on generated data of SPEC 6's two sizes (3M and 10M steps)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ope_cli.bench.config import (
    GAMMA,
    BenchConfig,
    Progress,
    evaluate_command,
    process_environment,
)
from ope_cli.bench.data import episodes_for_steps, generate_data, generated_checkpoint
from ope_cli.bench.measure import ratio
from ope_cli.bench.memory import peak_rss_of
from ope_cli.bench.processes import write_bytecode

SCRIPT_ESTIMATORS = ("is", "wis", "pdis", "wpdis")
NUMPY_SCRIPT = Path(__file__).with_name("numpy_script.py")  # run as a file: no ope imports
AGREEMENT = 1e-6  # SPEC 4's float64 tolerance between two ways of computing one estimate


def largest_difference(ours: dict, theirs: dict) -> float | None:
    """max over the four estimators of |ours - theirs|, relative to the largest of the
    script's estimates in magnitude, not to each (``summary.relative_difference``): an
    estimate near 0 then cannot void the comparison by its own rounding; None if one is
    missing."""
    pairs = [(ours.get(name), theirs.get(name)) for name in SCRIPT_ESTIMATORS]
    if any(a is None or b is None for a, b in pairs):
        return None
    scale = max(abs(b) for _, b in pairs)
    return max(abs(a - b) for a, b in pairs) / max(scale, 1e-300)


def _run(command: list[str], env: dict, out: Path) -> dict:
    """One process: wall seconds, peak RSS and its JSON stdout."""
    peak, seconds = peak_rss_of(command, env, out)
    return {"seconds": seconds, "peak_rss_mib": peak / 2**20, "stdout": json.loads(out.read_text())}


def _fastest(runs: list[dict]) -> dict:
    best = min(runs, key=lambda run: run["seconds"])
    return {key: value for key, value in best.items() if key != "stdout"}


def _compare(directory: Path, path: Path, checkpoint: str, config: BenchConfig, env) -> dict:
    """``config.rounds`` interleaved runs of the script and of ``ope evaluate`` on ``path``."""
    ope = [*evaluate_command(str(path), checkpoint, config.batching), "--gamma", str(GAMMA)]
    script = [sys.executable, str(NUMPY_SCRIPT), str(path), checkpoint, str(GAMMA)]
    scripts, evaluates = [], []
    for _ in range(config.rounds):
        scripts.append(_run(script, env, directory / "script.json"))
        evaluates.append(_run(ope, env, directory / "evaluate.json"))
    document = evaluates[0]["stdout"]
    ours = {
        name: estimate["value"]
        for name, estimate in document["results"][0]["estimates"].items()
        if name in SCRIPT_ESTIMATORS
    }
    difference = largest_difference(ours, scripts[0]["stdout"])
    evaluate, plain = _fastest(evaluates), _fastest(scripts)
    return {
        "steps": document["dataset"]["steps"],
        "script": plain,
        "evaluate": {
            **evaluate,
            "compilations": max(run["stdout"]["runtime"]["compilations"] for run in evaluates),
        },
        "evaluate_over_script": ratio(evaluate["seconds"], plain["seconds"]),
        "estimates_relative_difference": difference,
        "estimates_agree": difference is not None and difference <= AGREEMENT,
    }


def measure_script(directory: Path, config: BenchConfig, progress: Progress) -> dict:
    """Whole processes on generated data of each of ``config.script_steps``: the plain NumPy
    script and warm ``ope evaluate`` (its compilation cache filled by one untimed run first),
    alternated, the fastest of ``config.rounds`` each; and whether their estimates agree.
    Both evaluate a checkpoint near the generated data's behavior policy."""
    checkpoint = generated_checkpoint(directory, config.seed)
    env = process_environment(directory, OPE_CACHE_DIR=str(directory / "script-cache"))
    write_bytecode(directory, config.seed, config.batching)
    sizes = {}
    for index, steps in enumerate(config.script_steps):
        path = directory / f"script_{steps}.parquet"
        progress(f"numpy script: generating {steps:,} steps")
        generate_data(path, episodes_for_steps(steps), config.seed)
        if index == 0:
            progress("numpy script: a first ope evaluate fills its compilation cache")
            command = evaluate_command(str(path), checkpoint, config.batching)
            _run([*command, "--gamma", str(GAMMA)], env, directory / "evaluate.json")
        progress(f"numpy script and ope evaluate on {steps:,} steps, {config.rounds} rounds")
        sizes[str(steps)] = _compare(directory, path, checkpoint, config, env)
        path.unlink()
    return {
        "sizes": sizes,
        "method": "wall time and peak RSS of whole processes as typed, alternated, the "
        f"fastest of {config.rounds} each; ope evaluate on a compilation cache warmed by one "
        "untimed run; the script reads the whole file with pyarrow and computes IS, WIS, "
        "PDIS and WPDIS on flat float64 step arrays. As plain code does, it lets pyarrow "
        "import pandas (0.2-0.3 s on 2 cores), which ope keeps out of its processes: part "
        "of the margin at 3M steps is that import",
    }
