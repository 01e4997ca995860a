"""The whole ``ope bench``: one dataset, every measurement, one JSON-ready dict.

On one long-tailed dataset (generated, or ``--data``) it times, on the same episodes, the
Python loop baseline, the NumPy twin, the jitted kernel alone (float32, float64, and K
stacked policies), ``ope evaluate`` end to end and the pyarrow I/O floor; whole
``ope evaluate`` processes (``bench.processes``), also with K policies beside one; with
``--memory`` also the peak RSS of ``ope evaluate`` subprocesses. Steps/s count real (logged) steps.
Absolute times on a shared machine are noise; the ratios between measurements of one run
are what the targets are about.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import jax

from ope_cli import runtime
from ope_cli._version import __version__
from ope_cli.bench.batches import describe_batches, host_batches, open_source
from ope_cli.bench.config import (
    BENCH_SCHEMA_VERSION,
    DEFAULT_EPISODES,
    DEFAULT_MEMORY_STEPS,
    SCRIPT_STEPS,
    BenchConfig,
    Progress,
)
from ope_cli.bench.data import (
    behavior_params,
    generate_data,
    write_behavior_checkpoint,
    write_checkpoints,
    write_q_checkpoint,
)
from ope_cli.bench.measure import (
    device_batches,
    measure_loop,
    prepare_end_to_end,
    prepare_io_floor,
    prepare_kernel,
    prepare_numpy,
    rate,
    time_interleaved,
    timed,
)
from ope_cli.bench.memory import measure_memory
from ope_cli.bench.processes import measure_many_policies, measure_processes
from ope_cli.bench.script import measure_script
from ope_cli.bench.summary import quantiles, summary
from ope_cli.config import BatchingConfig
from ope_cli.data.buckets import Bucketer
from ope_cli.data.episode_stream import EpisodeStream
from ope_cli.envs.generate import check_seed_and_episodes
from ope_cli.errors import OpeError, UsageError
from ope_cli.estimation.kernel import local_mesh


def bench(config: BenchConfig, on_progress: Progress | None = None) -> dict:
    """Runs every measurement on one dataset and returns the JSON-ready result.

    ``on_progress(message)`` is told what is being measured (for a status line on stderr).
    """
    progress = on_progress or (lambda message: None)
    _check(config)
    # Cold compilations, measured the same way every run (and the user's cache untouched).
    with _environment(OPE_CACHE_DIR="off"), _work_directory(config.out) as directory:
        return _bench(config, directory, progress)


def _check(config: BenchConfig) -> None:
    for option, value in (
        ("--episodes", config.episodes),
        ("--policies", config.policies),
        ("--loop-episodes", config.loop_episodes),
        ("--memory-steps", config.memory_steps),
        ("--rounds", config.rounds),
    ):
        if value < 1:  # as evaluate's options say it (BatchingConfig.check)
            raise UsageError(f"{option} must be at least 1, got {value}")
    check_seed_and_episodes(config.seed, config.episodes)  # as generate refuses them
    # sizes of measurements not asked for would change nothing
    if config.memory_steps != DEFAULT_MEMORY_STEPS and not config.memory:
        raise UsageError("--memory-steps applies to --memory only")
    if tuple(config.script_steps) != SCRIPT_STEPS and not config.script:
        raise UsageError("--script-steps applies to --script only")
    if config.episodes != DEFAULT_EPISODES and config.data is not None:
        raise UsageError("--episodes sizes generated data; with --data it changes nothing")
    small, large = config.script_steps
    if not 0 < small < large:
        raise UsageError(f"--script-steps {small} {large}: must be 0 < SMALL < LARGE")
    config.batching.check()
    if config.precision not in (None, "float32", "float64"):
        raise UsageError(f"--precision must be float32 or float64, got {config.precision}")


@contextlib.contextmanager
def _work_directory(out: str | None) -> Iterator[Path]:
    if out == "":  # the working directory, which ``--out .`` names plainly
        raise UsageError("--out needs a directory; an empty path names none")
    if out is not None:
        path = Path(out)
        if path.exists() and not path.is_dir():  # mkdir's FileExistsError was an internal error
            raise UsageError(f"--out {out}: a file, where a directory is wanted")
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as error:  # under a file, or where nothing may be made: not a bug
            raise UsageError(f"--out {out}: cannot make the directory ({error.strerror})") from None
        yield path
    else:
        with tempfile.TemporaryDirectory(prefix="ope-bench-") as name:
            yield Path(name)


@contextlib.contextmanager
def _environment(**values: str) -> Iterator[None]:
    previous = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _load_average() -> float | None:
    """The 1-minute load average (how busy a shared machine was), None where unknown."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _bench(config: BenchConfig, directory: Path, progress: Progress) -> dict:
    started = time.perf_counter()
    load_before = _load_average()
    runtime.configure()  # x64; the cache stays off (OPE_CACHE_DIR=off around the bench)
    backend = jax.default_backend()
    precision = config.precision or ("float64" if backend == "cpu" else "float32")
    mesh = local_mesh(None)
    devices = 1 if mesh is None else mesh.size
    source, dataset, info = _dataset(config, directory, progress)
    progress("padding every batch on the host")
    batches, bucketer, max_length = host_batches(source, config.batching, devices)
    if info is None:  # --data: what bench needs to know, from its padded batches
        info = describe_batches(batches, source.source)
        behavior = behavior_params(config.seed, info["obs_dim"], info["n_actions"])
    else:
        behavior = behavior_params(config.seed)
    obs_dim, n_actions = behavior["weight"].shape
    dataset.update(
        episodes=info["episodes"],
        steps=info["steps"],
        obs_dim=int(obs_dim),
        n_actions=int(n_actions),
        bytes=sum(Path(f).stat().st_size for f in source.data.files),
    )
    checkpoints = write_checkpoints(directory, config.policies, config.seed, behavior)
    checkpoints.append(write_behavior_checkpoint(directory, behavior))  # the last one
    q = write_q_checkpoint(directory, config.seed, int(obs_dim), int(n_actions))
    m, result = _time_trials(
        config,
        source,
        (checkpoints, q),
        (batches, bucketer, max_length),
        precision,
        mesh,
        progress,
    )
    checkpoints.pop()
    batch_count = len(batches)
    del batches

    written, data = (checkpoints, q), (dataset, max_length)
    m.update(_other_measurements(config, directory, source, written, data, progress))
    return {
        "schema_version": BENCH_SCHEMA_VERSION,
        "tool": {"name": "ope", "version": __version__},
        "dataset": {**dataset, "lengths": quantiles(info["lengths"])},
        "runtime": {
            "backend": backend,
            "devices": devices,
            "precision": precision,
            "jax": jax.__version__,
            "cpus": os.cpu_count(),
            "load_average": {"start": load_before, "end": _load_average()},
            "timing": f"each measurement's fastest of {config.rounds} interleaved runs (the "
            "Python loop's: one run)",
            "bench_seconds": time.perf_counter() - started,
        },
        "batching": _batching(config.batching, batch_count, bucketer),
        **summary(config, m, result, bucketer, precision),
    }


def _other_measurements(
    config: BenchConfig,
    directory: Path,
    source,
    written: tuple[list[str], str],
    data: tuple[dict, int],
    progress: Progress,
) -> dict:
    """The python loop's, the processes', the memory and the NumPy script measurements (None
    where not asked for), on the bench's policy checkpoints and Q checkpoint (``written``),
    of the dataset (``data``: its summary and its longest episode)."""
    checkpoints, q = written
    dataset, longest = data
    steps = dataset["steps"]
    progress(f"python loop: the first {config.loop_episodes} episodes")
    m = {
        "loop": measure_loop(
            source,
            checkpoints[0],
            config.loop_episodes,
            config.batching,
            steps,
            longest,
        )
    }
    m["processes"] = None
    if config.processes:
        m["processes"] = measure_processes(
            directory,
            source.source,
            list(source.schema.read_columns),
            (checkpoints[0], q),
            config,
            progress,
        )
    m["many_processes"] = None
    if config.processes and config.policies > 1:
        m["many_processes"] = measure_many_policies(
            directory, source.source, checkpoints, config, progress
        )
    m["memory"] = None
    if config.memory:
        m["memory"] = measure_memory(
            directory, config.memory_steps, config.seed, config.batching, progress
        )
    m["script"] = measure_script(directory, config, progress) if config.script else None
    return m


def _batching(batching: BatchingConfig, batches: int, bucketer: Bucketer) -> dict:
    """The result's batching block: the settings, the number of padded batches and the
    [lanes, width] window shapes they were walked in."""
    return {
        "read_rows": batching.read_rows,
        "batch_steps": batching.batch_steps,
        "min_bucket": batching.min_bucket,
        "batches": batches,
        "shapes": [list(shape) for shape in sorted(bucketer.shapes)],
    }


def _time_trials(
    config: BenchConfig,
    source: EpisodeStream,
    checkpoints_and_q: tuple[list[str], str],
    padded: tuple,
    precision: str,
    mesh,
    progress: Progress,
) -> tuple[dict, object]:
    """Prepares every trial (first runs compile), times them ``config.rounds`` times interleaved;
    returns (measurements by name, the first ``ope evaluate`` result)."""
    batches, bucketer, max_length = padded
    checkpoints, q = checkpoints_and_q
    other = "float32" if precision == "float64" else "float64"
    *many, behavior = checkpoints
    one, path = many[:1], source.source
    progress("end to end: a first ope evaluate (compiles)")
    trials = {"io_floor": prepare_io_floor(source, config.batching)}
    trials["end_to_end"], result = prepare_end_to_end(path, one, precision, config.batching)
    progress("end to end with --behavior CKPT and --behavior estimate (compile)")
    for name, option in (("behavior", behavior), ("estimate", "estimate:linear_softmax")):
        trials[f"end_to_end_{name}"], _ = prepare_end_to_end(
            path, one, precision, config.batching, behavior=option
        )
    progress("end to end with --q fit:linear (fits Q, compiles)")
    unmeasured = _q_fit_trial(trials, config, path, one, precision)
    progress("putting the padded batches on the device")
    widths = [bucketer.width_of(batch) for batch in batches]
    on_device = {
        name: device_batches(batches, widths, name, mesh) for name in ("float64", "float32")
    }
    real = bucketer.real_steps
    progress("kernel alone: first passes (compiles)")
    trials["kernel"] = prepare_kernel(
        on_device[precision], one, precision, mesh, real, max_length, cold=True
    )
    trials[f"kernel_{other}"] = prepare_kernel(
        on_device[other], one, other, mesh, real, max_length, cold=False
    )
    trials["kernel_dr"] = prepare_kernel(
        on_device[precision], one, precision, mesh, real, max_length, cold=False, q=q
    )
    if config.policies > 1:
        progress(f"{config.policies} stacked policies: first runs (compile)")
        trials["kernel_many"] = prepare_kernel(
            on_device[precision], many, precision, mesh, real, max_length, cold=False
        )
        trials["end_to_end_many"], _ = prepare_end_to_end(path, many, precision, config.batching)
    trials["numpy"] = prepare_numpy(batches, one[0], real, max_length)
    progress(f"timing everything, {config.rounds} interleaved rounds")
    m = {**time_interleaved(trials, config.rounds), **unmeasured}
    m["kernel"]["padded_steps_per_second"] = rate(
        m["kernel"]["padded_steps"], m["kernel"]["seconds"]
    )
    return m, result


def _q_fit_trial(trials: dict, config: BenchConfig, path: str, one: list, precision) -> dict:
    """Adds the ``--q fit:linear`` end-to-end trial to ``trials``; returns {} or, where
    ``--data`` cannot be fitted (one episode cannot be cross-fitted), its measurement as
    not measured, with the reason: the other measurements go on."""
    try:
        trials["end_to_end_q_fit"], _ = prepare_end_to_end(
            path, one, precision, config.batching, q="fit:linear"
        )
    except OpeError as error:
        if config.data is None:  # the bench's own data: a failure of the tool, not of data
            raise
        note = f"not measured: ope evaluate --q fit:linear cannot fit this data ({error})"
        return {"end_to_end_q_fit": {"seconds": None, "note": note}}
    return {}


def _dataset(config: BenchConfig, directory: Path, progress: Progress):
    """(opened source, its dataset block so far, the generator's info or None for ``--data``)."""
    if config.data is None:
        path = str(directory / "bench.parquet")
        progress(f"generating {config.episodes:,} long-tailed episodes")
        seconds, info = timed(lambda: generate_data(path, config.episodes, config.seed))
        dataset = {"source": path, "generated": True, "generate_seconds": seconds}
    else:
        path, info = config.data, None
        dataset = {"source": path, "generated": False}
    return open_source(path), dataset, info
