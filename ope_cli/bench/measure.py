"""The timed measurements of ``ope bench``, each prepared (read, compiled, warmed) as a Trial.

- ``io_floor``: pyarrow alone reading the projected columns and converting them to NumPy;
- ``end_to_end``: ``ope evaluate`` (``pipeline.evaluate`` plus the JSON report) from Parquet;
- ``kernel``: the jitted kernel alone on batches already on the device (steady state);
- ``numpy``: the NumPy twin over the same padded host batches;
- ``loop``: the per-episode Python loop baseline, on the first episodes, extrapolated.

Every trial runs ROUNDS times, round-robin, the fastest counting (``time_interleaved``).
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import jax
import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
from jax.sharding import NamedSharding, PartitionSpec

from ope_cli.bench.batches import loop_head_table
from ope_cli.bench.config import GAMMA
from ope_cli.bench.loop import loop_estimates
from ope_cli.bench.twin import numpy_estimates
from ope_cli.config import BatchingConfig, BehaviorConfig, EvaluationConfig, QConfig, RuntimeConfig
from ope_cli.data.episode_stream import EpisodeStream
from ope_cli.data.ids import RESAMPLING_GROUPS
from ope_cli.estimation.kernel import (
    BATCH_AXIS,
    Kernel,
    KernelSettings,
    assemble,
    group_policies,
    split_windows,
    trace_count,
)
from ope_cli.estimation.kernel_cache import clear_caches
from ope_cli.estimation.pipeline import evaluate
from ope_cli.estimation.stats import finalize, from_batch, init, merge
from ope_cli.models.policies import load_policy
from ope_cli.models.qfunctions import load_q
from ope_cli.report import to_json

if TYPE_CHECKING:
    from ope_cli.data.buckets import PaddedBatch


def rate(steps: int, seconds: float) -> float | None:
    """Steps per second, None for a zero time."""
    return steps / seconds if seconds > 0 else None


def ratio(a: float | None, b: float | None) -> float | None:
    """a / b, None where either is missing or b is not positive."""
    return a / b if a is not None and b is not None and b > 0 else None


def timed(function: Callable[[], Any]) -> tuple[float, Any]:
    """(wall seconds, value) of one call."""
    started = time.perf_counter()
    value = function()
    return time.perf_counter() - started, value


@dataclasses.dataclass
class Trial:
    """One measurement, prepared (data read, compiled, warmed) and ready to be timed.

    ``run()`` does the timed unit of work once; ``steps`` is how many real steps it covers;
    ``info`` holds what the preparation learned (first-run time, compiles, estimates).
    """

    run: Callable[[], Any]
    steps: int
    info: dict


def time_interleaved(trials: dict[str, Trial], rounds: int) -> dict[str, dict]:
    """Times every trial ``rounds`` times, round-robin, so that a change in the load of a
    shared machine hits all of them alike; the fastest run of each counts. Each trial runs
    once untimed first: trials prepared later cleared JAX's caches for their first-run
    measurements, and an earlier trial's recompilation must not land in a timed run (with
    ``--rounds 1`` it was the only one)."""
    for trial in trials.values():
        trial.run()
    best = {name: math.inf for name in trials}
    for _ in range(rounds):
        for name, trial in trials.items():
            best[name] = min(best[name], timed(trial.run)[0])
    return {
        name: {
            "seconds": best[name],
            "steps_per_second": rate(trial.steps, best[name]),
            "runs": rounds,
            **trial.info,
        }
        for name, trial in trials.items()
    }


def prepare_io_floor(source: EpisodeStream, batching: BatchingConfig) -> Trial:
    """pyarrow alone: the projected columns in record batches, each column to NumPy."""
    columns = source.schema.read_columns
    dataset = ds.dataset(list(source.data.files), format=source.data.format)

    def read() -> int:
        rows = 0
        for batch in dataset.to_batches(columns=columns, batch_size=batching.read_rows):
            for column in batch.columns:
                if (
                    pa.types.is_list(column.type)
                    or pa.types.is_large_list(column.type)
                    or pa.types.is_fixed_size_list(column.type)
                ):
                    column.flatten().to_numpy().reshape(len(column), -1)
                else:
                    np.asarray(column.to_numpy(zero_copy_only=False))
            rows += batch.num_rows
        return rows

    rows = read()  # the file in the page cache, as for every other measurement
    return Trial(read, rows, {"columns": columns})


def prepare_end_to_end(
    source: str,
    policies: list[str],
    precision: str | None,
    batching: BatchingConfig,
    behavior: str | None = None,
    q: str | None = None,
) -> tuple[Trial, Any]:
    """``ope evaluate`` from Parquet (pipeline.evaluate plus the JSON report), run once from
    a cold jit cache to compile; returns the trial and that first EvaluationResult.
    ``behavior``: ``--behavior`` (a checkpoint, or estimate[:MODEL]), None: the logged
    propensities; ``q``: ``--q`` (dm, dr and wdr too), None: none."""
    config = EvaluationConfig(
        data=source,
        policies=tuple(policies),
        gamma=GAMMA,
        batching=batching,
        runtime=RuntimeConfig(precision=precision),
        behavior=BehaviorConfig(policy=behavior),
        q=QConfig(sources=() if q is None else (q,)),
    )

    def run():
        result = evaluate(config)
        to_json(result)
        return result

    clear_caches()
    first_seconds, first = timed(run)
    return Trial(
        run,
        first.dataset.steps,
        {
            "first_run_seconds": first_seconds,
            "compiles": first.runtime.compiles,
            "policies": len(policies),
        },
    ), first


def device_batches(batches: list[PaddedBatch], widths: list[int], dtype, mesh) -> list[tuple]:
    """Each batch as (its windows on the device(s), its [B, 0] bootstrap counts): floats
    cast to ``dtype``, episodes split over ``mesh``, walked in windows of its width."""
    sharding = NamedSharding(mesh, PartitionSpec(BATCH_AXIS)) if mesh is not None else None
    on_device = []
    for batch, width in zip(batches, widths, strict=True):
        windows = split_windows(batch, width, dtype)
        windows = [(start, jax.device_put(window, sharding)) for start, window in windows]
        on_device.append((windows, np.zeros((batch.shape[0], 0), np.uint8)))
    jax.block_until_ready(on_device)
    return on_device


def prepare_kernel(
    on_device: list[tuple],
    checkpoints: list[str],
    precision: str,
    mesh,
    real_steps: int,
    max_length: int,
    cold: bool,
    q: str | None = None,
) -> Trial:
    """The jitted kernel alone over windows already on the device. One first pass compiles
    (from a cold jit cache when ``cold``); its statistics give the first policy's estimates,
    to compare precisions. ``q``: a Q checkpoint for every policy (dm, dr and wdr too)."""
    dtype = np.float64 if precision == "float64" else np.float32
    policies = [load_policy(path) for path in checkpoints]
    qs = None if q is None else [load_q(q)] * len(policies)
    (group,) = group_policies(policies, qs)
    lanes = max(windows[0][1].step_mask.shape[0] for windows, _ in on_device)
    settings = KernelSettings(GAMMA, RESAMPLING_GROUPS, dtype, mesh)
    kernel = Kernel(group, settings, carry_lanes=lanes)

    def one_pass():
        return jax.block_until_ready([kernel.walk(*batch) for batch in on_device])

    if cold:
        clear_caches()
    traces = trace_count()
    first_seconds, outputs = timed(one_pass)
    compiles = trace_count() - traces

    acc = init(RESAMPLING_GROUPS, estimators=kernel.estimators)
    for output in jax.device_get(outputs):
        statistics = assemble(output)  # [D, P, ...]
        for device in range(statistics.log_weight_histogram.shape[0]):
            one = jax.tree.map(lambda value: value[device, 0], statistics)  # noqa: B023
            acc = merge(acc, from_batch(one))
    estimates, _ = finalize(acc, GAMMA, max_length, 0.95)
    padded_steps = sum(w.step_mask.size for windows, _ in on_device for _, w in windows)
    return Trial(
        one_pass,
        real_steps,
        {
            "first_run_seconds": first_seconds,
            "compiles": compiles,
            "precision": precision,
            "policies": len(checkpoints),
            "padded_steps": padded_steps,
            "estimates": {name: e.value for name, e in estimates.items()},
        },
    )


def prepare_numpy(
    batches: list[PaddedBatch], checkpoint: str, real_steps: int, max_length: int
) -> Trial:
    """The NumPy twin over the same padded (host) batches, merged and finalized."""
    with np.load(checkpoint, allow_pickle=False) as archive:
        params = {k: archive[k] for k in archive.files if k != "kind"}

    def run():
        return numpy_estimates(batches, params, GAMMA, max_length)

    return Trial(run, real_steps, {"precision": "float64", "estimates": run()})


def measure_loop(
    source: EpisodeStream,
    checkpoint: str,
    episodes: int,
    batching: BatchingConfig,
    total_steps: int,
    longest: int = 0,
) -> dict:
    """The packaged loop baseline (``bench.loop.loop_estimates``) on the first ``episodes``
    episodes (columns renamed to the loop's defaults), its steps/s extrapolated to
    ``total_steps``. Its WPDIS walks every episode to the whole data's ``longest`` episode
    (the steps after an episode's end hold its weight), as the run on every episode does:
    to the first episodes' longest only, that part of the loop shrank with them, and the
    extrapolated loop came out 20-28% faster than it is."""
    table = loop_head_table(source, episodes, batching.read_rows)
    if table is None:
        return {"steps_per_second": None, "note": "the loop needs step and behavior_prob columns"}
    ids = np.asarray(table.column("episode_id").to_numpy())
    ran = int(np.count_nonzero(ids[1:] != ids[:-1])) + (ids.size > 0)
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        seconds, _ = timed(lambda: loop_estimates(table, checkpoint, GAMMA, longest))
    steps_per_second = rate(table.num_rows, seconds)
    extrapolated = table.num_rows < total_steps
    return {
        "seconds": seconds,
        "steps": table.num_rows,
        "episodes": ran,
        "wpdis_horizon": longest or None,
        "steps_per_second": steps_per_second,
        "extrapolated": extrapolated,
        "extrapolated_seconds": total_steps / steps_per_second
        if steps_per_second and extrapolated
        else None,
        "note": f"run on the first {ran} episodes "
        f"({table.num_rows:,} steps), extrapolated to all {total_steps:,} steps"
        if extrapolated
        else "run on every episode",
    }
