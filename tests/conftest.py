"""Shared fixtures: run ``ope`` in this process (``ope_cli.cli.run``) or as the real
entry point in a subprocess; configure the JAX runtime once for in-process tests."""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import io
import os
import re
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np
import pytest

from ope_cli import runtime

_SUBPROCESS_CACHE: str | None = None  # the session's cache for ``ope`` subprocesses

# The suite's datasets are tiny, so compiling kernels, not running them, is most of its
# time: XLA's backend optimisation level 0 compiles a kernel about twice as fast (and runs
# it about five times slower), and at that level one code-generation thread instead of
# XLA's parallel split compiles another ~18% faster on two cores (at the shipped level the
# split is faster, so the product keeps it). Both are set before JAX starts, here and in
# every ``ope`` subprocess (they inherit the environment); ``test_shipped_optimisation_level``
# runs the shipped settings against the reference, as does CI's example run.
TEST_XLA_FLAGS = ("--xla_backend_optimization_level=0", "--xla_cpu_parallel_codegen_split_count=1")
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = " ".join([os.environ.get("XLA_FLAGS", ""), *TEST_XLA_FLAGS]).strip()
_TEST_FLAG_NAMES = {flag.split("=")[0] for flag in TEST_XLA_FLAGS}
_SUITE_FLAGS = [f for f in os.environ["XLA_FLAGS"].split() if f.split("=")[0] in _TEST_FLAG_NAMES]

# A module whose every test is slow says so in one line; the quick loop does not import it.
ALL_SLOW = re.compile(r"^pytestmark = pytest\.mark\.slow$", re.MULTILINE)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """The quick loop (``-m "not slow"``) skips the modules whose every test is slow
    (``pytestmark = pytest.mark.slow``) before importing them: each worker imported them
    (hypothesis, assertion rewriting) to deselect every test they hold."""
    if config.getoption("markexpr") != "not slow" or not collection_path.name.startswith("test_"):
        return None
    if collection_path.suffix != ".py" or not ALL_SLOW.search(collection_path.read_text()):
        return None
    return True


# 64-bit types before any test module is imported (some build JAX arrays at import time);
# ``ope_cli.runtime`` is the one writer of jax.config, for the tests too.
runtime.enable_x64()


def xla_flags(*flags: str) -> str:
    """XLA_FLAGS for an ``ope`` subprocess that needs ``flags`` (e.g. a device count):
    those, and the suite's compiler settings."""
    return " ".join((*flags, *_SUITE_FLAGS))


@dataclasses.dataclass(frozen=True, repr=False)
class OpeRun:
    """One finished ``ope`` process."""

    args: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    seconds: float = 0.0  # wall time of the process

    def __repr__(self) -> str:  # shown in assertion messages
        return (
            f"ope {' '.join(self.args)} -> exit {self.returncode}\n"
            f"--- stdout ---\n{self.stdout[-3000:]}\n--- stderr ---\n{self.stderr[-3000:]}"
        )


def interruptible(command: list[str]) -> list[str]:
    """``command`` started with SIGINT and SIGTERM at their defaults, as a terminal's
    process has them: a suite started in the background (``cmd &`` in a script) ignores
    SIGINT, every process it starts inherits that, and Ctrl-C tests then wait out their
    timeouts (an ignored SIGTERM likewise)."""
    reset = (
        "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
        "signal.signal(signal.SIGTERM, signal.SIG_DFL); os.execv(sys.argv[1], sys.argv[1:])"
    )
    return [sys.executable, "-c", reset, *command]


def wait_until_started(child, timeout: float = 30.0) -> None:
    """Waits until an ``interruptible`` command has replaced its wrapper (so SIGINT is at
    its default): under load a Ctrl-C sent a fixed time after the start can reach the
    wrapper while it still ignores SIGINT, as a background suite's processes do, and the
    command then runs on."""
    deadline = time.monotonic() + timeout
    cmdline = Path(f"/proc/{child.pid}/cmdline")
    while time.monotonic() < deadline and child.poll() is None:
        try:
            if b"signal.SIG_DFL" not in cmdline.read_bytes():
                return
        except OSError:  # no /proc: as before, a fixed wait
            return
        time.sleep(0.01)


def ope_command() -> list[str]:
    """The installed console script next to this interpreter, else ``python -m ope_cli``."""
    script = Path(sys.executable).with_name("ope")
    if script.is_file() and os.access(script, os.X_OK):
        return [str(script)]
    return [sys.executable, "-m", "ope_cli"]


def subprocess_env(env: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment of a subprocess that runs ``ope`` or JAX: this one's, with ``env``
    on top; JAX pinned to the CPU unless ``env`` or this environment says otherwise; the
    session's compilation cache unless ``env`` names one (processes of the suite share it,
    so a kernel compiled by one is loaded by the next); COLUMNS and LINES dropped, so that
    output meant for a pipe looks the same wherever the tests run (``env`` may set them)."""
    inherited = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    full_env = {**inherited, **(env or {})}
    full_env.setdefault("JAX_PLATFORMS", "cpu")
    if _SUBPROCESS_CACHE is not None and (env or {}).get("OPE_CACHE_DIR") is None:
        full_env["OPE_CACHE_DIR"] = _SUBPROCESS_CACHE
    return full_env


def run_ope(
    args: Sequence[str | os.PathLike],
    cwd: str | os.PathLike | None = None,
    env: Mapping[str, str] | None = None,
    timeout: float = 300,
) -> OpeRun:
    """Runs ``ope ARGS`` with stdout and stderr captured (so neither is a terminal), in
    ``subprocess_env(env)``."""
    full_env = subprocess_env(env)
    args = tuple(str(a) for a in args)
    started = time.perf_counter()
    done = subprocess.run(
        [*ope_command(), *args],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
    return OpeRun(args, done.returncode, done.stdout, done.stderr, time.perf_counter() - started)


def run_ope_many(calls: Mapping[str, Mapping], workers: int | None = None) -> dict[str, OpeRun]:
    """Runs several ``run_ope(**kwargs)`` concurrently; {name: kwargs} -> {name: OpeRun}.

    Each ``ope`` process spends most of its time importing and compiling, so running
    them side by side keeps a test module that needs dozens of them fast.
    """
    workers = workers or max(2, os.cpu_count() or 2)
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        futures = {name: pool.submit(run_ope, **kwargs) for name, kwargs in calls.items()}
        return {name: future.result() for name, future in futures.items()}


@contextlib.contextmanager
def _process_state(cwd: str | os.PathLike | None, env: Mapping[str, str] | None):
    """The working directory, environment and import path of one in-process run, restored
    after it; COLUMNS and LINES are dropped as for a subprocess."""
    previous_cwd, previous_env, previous_path = os.getcwd(), dict(os.environ), list(sys.path)
    try:
        for name in ("COLUMNS", "LINES"):
            os.environ.pop(name, None)
        os.environ.update(env or {})
        if cwd is not None:
            os.chdir(cwd)
        yield
    finally:
        os.chdir(previous_cwd)
        os.environ.clear()
        os.environ.update(previous_env)
        sys.path[:] = previous_path


def run_ope_in_process(
    args: Sequence[str | os.PathLike],
    cwd: str | os.PathLike | None = None,
    env: Mapping[str, str] | None = None,
) -> OpeRun:
    """Runs ``ope ARGS`` through ``ope_cli.cli.run`` in this process, with stdout and
    stderr captured (neither is a terminal): the same exit code and output as the real
    command, without its start-up (about a second of imports and compilation)."""
    from ope_cli.cli import run

    args = tuple(str(a) for a in args)
    stdout, stderr = io.StringIO(), io.StringIO()
    started = time.perf_counter()
    with (
        _process_state(cwd, env),
        contextlib.redirect_stdout(stdout),
        contextlib.redirect_stderr(stderr),
    ):
        code = run(list(args))
    seconds = time.perf_counter() - started
    return OpeRun(args, code, stdout.getvalue(), stderr.getvalue(), seconds)


def run_ope_many_in_process(calls: Mapping[str, Mapping]) -> dict[str, OpeRun]:
    """``run_ope_in_process(**kwargs)`` for each of {name: kwargs}, one after the other."""
    return {name: run_ope_in_process(**kwargs) for name, kwargs in calls.items()}


@pytest.fixture(scope="session")
def ope_in_process():
    """``ope_in_process(args, cwd=None, env=None) -> OpeRun`` through ``ope_cli.cli.run``."""
    return run_ope_in_process


@pytest.fixture(scope="session")
def ope_many_in_process():
    """``ope_many_in_process({name: {"args": [...], "cwd": ...}}) -> {name: OpeRun}``."""
    return run_ope_many_in_process


@pytest.fixture(scope="session")
def ope():
    """``ope(args, cwd=None, env=None) -> OpeRun`` running the real entry point."""
    return run_ope


@pytest.fixture(scope="session")
def ope_many():
    """``ope_many({name: {"args": [...], "cwd": ...}}) -> {name: OpeRun}``, run concurrently."""
    return run_ope_many


@pytest.fixture(scope="session", autouse=True)
def _private_compilation_cache(tmp_path_factory):
    """The ``ope`` subprocesses of this session share one persistent compilation cache,
    outside the user's home cache (``run_ope`` hands it to them). In the test process
    ``OPE_CACHE_DIR`` is off, so no kernel is kept (``kernel_cache``) and no catalogue of
    window shapes is compiled ahead; its XLA compilations are kept across runs of the suite
    by ``_jax_runtime``."""
    global _SUBPROCESS_CACHE
    previous = os.environ.get("OPE_CACHE_DIR")
    _SUBPROCESS_CACHE = str(tmp_path_factory.mktemp("xla-cache"))
    os.environ["OPE_CACHE_DIR"] = "off"
    yield
    _SUBPROCESS_CACHE = None
    if previous is None:
        os.environ.pop("OPE_CACHE_DIR", None)
    else:
        os.environ["OPE_CACHE_DIR"] = previous


@pytest.fixture(scope="session", autouse=True)
def _jax_runtime(_private_compilation_cache, pytestconfig):
    """x64 for every in-process test, as the ``ope`` commands set it (``ope_cli.runtime``
    is the one place that writes jax.config), and JAX's persistent compilation cache in
    pytest's cache folder (``in_process_cache``)."""
    from ope_cli import runtime

    runtime.configure()
    folder = in_process_cache(pytestconfig)
    if folder is not None:
        runtime.persist_compilations(folder)


IN_PROCESS_CACHE_ENV = "OPE_TEST_XLA_CACHE"  # "off": the test process compiles everything


def in_process_cache(config: pytest.Config) -> str | None:
    """``.pytest_cache/d/ope-xla``: the test processes' XLA compilations, kept across runs
    of the suite (most of the quick loop's time is compiling), keyed by JAX on each program
    and the XLA flags, so an edit recompiles what it changed only; about 30 MiB a state of
    the code, emptied by ``pytest --cache-clear``. None with ``OPE_TEST_XLA_CACHE=off`` or
    ``-p no:cacheprovider``. An earlier segfault while serialising an executable came with
    thousands of executables in one process (``_release_compiled_executables``)."""
    if os.environ.get(IN_PROCESS_CACHE_ENV, "").lower() in runtime.CACHE_OFF:
        return None
    if getattr(config, "cache", None) is None:
        return None
    return str(config.cache.mkdir("ope-xla"))


@pytest.fixture(scope="module")
def small_control_truth():
    """A smaller Monte Carlo truth for ``control`` (8,192 episodes instead of 65,536): a
    quarter of the time, and a truth stderr still far below any estimate's on the suite's
    datasets (0.015 against 0.23-0.42 on 3,000 episodes), which tolerances include anyway."""
    from ope_cli.envs import control

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(control, "CONTROL_TRUTH_EPISODES", 1 << 13)
        patch.setattr(control, "CONTROL_TRUTH_CONTINUED", 1 << 10)
        yield


def _memory_mappings() -> int:
    """How many memory mappings this process holds (0 where /proc is not available)."""
    try:
        with open("/proc/self/maps", "rb") as maps:
            return sum(1 for _ in maps)
    except OSError:
        return 0


@pytest.fixture(autouse=True)
def _release_compiled_executables():
    """Drops every compiled executable after a test once the process holds many
    memory mappings. On CPU each executable holds a few dozen; a whole suite in one process
    compiles thousands, and past the kernel's ``vm.max_map_count`` (65,530 by default) XLA
    segfaults on a failed mmap. Below the threshold, later tests reuse the compilations.
    Counted after every tenth test (the kernel writes the whole map out each time: a second
    and a half per worker in the quick loop, where ten tests add far fewer than the
    35,000 mappings between the threshold and the limit)."""
    yield
    _tests_since_count[0] += 1
    if _tests_since_count[0] < 10:
        return
    _tests_since_count[0] = 0
    if _memory_mappings() > 30_000:
        import jax

        jax.clear_caches()


_tests_since_count = [0]  # tests since the mappings were last counted


def gather_in_two_processes(models) -> None:
    """Each of two models' ``gather_processes``, run in its own thread as the two processes
    of a run would (``TwoProcessGather``)."""
    exchange = TwoProcessGather()
    threads = [
        threading.Thread(target=model.gather_processes, args=(exchange.for_process(rank),))
        for rank, model in enumerate(models)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


class TwoProcessGather:
    """An all-gather between two threads standing for two processes: each passes its
    [n_p, ...] array and both get the concatenation in process order."""

    def __init__(self):
        self.slots = [None, None]
        self.barrier = threading.Barrier(2)

    def for_process(self, rank: int):
        def gather(array):
            self.slots[rank] = np.asarray(array)
            self.barrier.wait()
            both = np.concatenate(self.slots)
            self.barrier.wait()
            return both

        return gather
