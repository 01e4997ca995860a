"""The one place that writes ``jax.config``: 64-bit types, the persistent compilation
cache, and the collectives backend of multi-process CPU runs.

Who calls it: ``tests/conftest.py`` and ``ope bench`` call ``configure``; the public
``ope_cli.evaluate`` (``pipeline.evaluate``, also behind ``ope evaluate``) configures the
runtime itself, so the library works without the command line: ``enable_x64`` first, then,
after joining a multi-process run, ``enable_compilation_cache``. Every function is
idempotent. JAX is imported inside the functions: importing this module stays instant
(``ope --help``).
"""

from __future__ import annotations

import dataclasses
import os
import threading
from pathlib import Path

CACHE_ENV = "OPE_CACHE_DIR"
CACHE_OFF = ("0", "off", "none", "false")


def configure() -> str | None:
    """Turns on 64-bit types (float64 kernels on CPU, int64 ids) and the persistent
    compilation cache. Returns the cache directory used, or None (see ``cache_directory``).

    Call it before creating JAX arrays: arrays made earlier keep 32-bit types.
    """
    enable_x64()
    return enable_compilation_cache()


def enable_x64() -> None:
    """64-bit types: float64 kernels on CPU, int64 ids. Before creating JAX arrays."""
    import jax

    jax.config.update("jax_enable_x64", True)


def cache_directory() -> str | None:
    """``OPE_CACHE_DIR``, else ``$XDG_CACHE_HOME/ope/xla`` or ``~/.cache/ope/xla``; None
    when ``OPE_CACHE_DIR`` is 0/off/none/false."""
    setting = os.environ.get(CACHE_ENV)
    if setting and setting.lower() in CACHE_OFF:
        return None
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return setting or os.path.join(base, "ope", "xla")


def enable_compilation_cache() -> str | None:
    """Turns on JAX's persistent compilation cache in ``cache_directory()`` (read from the
    environment at each call), so compilations carry across processes. Returns the
    directory used, or None when disabled or not creatable (a read-only home must not
    stop an evaluation)."""
    directory = cache_directory()
    if directory is None:
        return None
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    persist_compilations(directory)
    return directory


def persist_compilations(directory: str) -> None:
    """Keeps every XLA compilation, however quick, in JAX's persistent compilation cache
    in ``directory`` (which exists). The kernels ``kernel_cache`` keeps follow
    ``cache_directory()`` alone."""
    import jax

    use_compilation_cache_directory(directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)


def compilation_cache_directory() -> str | None:
    """The directory JAX's persistent compilation cache uses now (None: none)."""
    import jax

    return jax.config.jax_compilation_cache_dir


def use_compilation_cache_directory(directory: str | None) -> None:
    """Points JAX's persistent compilation cache at ``directory`` as it is, None included
    (``enable_compilation_cache`` reads the environment instead; tests restore a setting)."""
    import jax

    jax.config.update("jax_compilation_cache_dir", directory)


def enable_cpu_collectives() -> None:
    """CPU devices need a collectives backend to talk across processes (GPUs use NCCL);
    must be set before anything initialises a JAX backend."""
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")


@dataclasses.dataclass(frozen=True)
class CompilationCounts:
    """Executables this process needed: ``requests`` of them (each compiled by XLA or
    loaded from a cache: ``cache_hits``, JAX's persistent compilation cache or the kernels
    kept by ``kernel_cache``), taking ``seconds`` in all (XLA's compilations and
    persistent-cache loads). Differences of two snapshots count what happened in between."""

    requests: int = 0
    seconds: float = 0.0
    cache_hits: int = 0

    @property
    def compilations(self) -> int:
        """Executables XLA compiled (not found in the persistent cache)."""
        return self.requests - self.cache_hits

    def __sub__(self, other: CompilationCounts) -> CompilationCounts:
        return CompilationCounts(
            self.requests - other.requests,
            self.seconds - other.seconds,
            self.cache_hits - other.cache_hits,
        )


_BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"
_CACHE_HIT_EVENT = "/jax/compilation_cache/cache_hits"
_counts = CompilationCounts()
_counts_lock = threading.Lock()
_listening = False


def _on_duration(event: str, duration: float, **_) -> None:
    global _counts
    if event == _BACKEND_COMPILE_EVENT:
        with _counts_lock:
            _counts = dataclasses.replace(
                _counts,
                requests=_counts.requests + 1,
                seconds=_counts.seconds + duration,
            )


def _on_event(event: str, **_) -> None:
    global _counts
    if event == _CACHE_HIT_EVENT:
        with _counts_lock:
            _counts = dataclasses.replace(_counts, cache_hits=_counts.cache_hits + 1)


def count_kernel_load() -> None:
    """Counts an executable loaded from ``kernel_cache`` (a cache hit without XLA)."""
    global _counts
    with _counts_lock:
        _counts = dataclasses.replace(
            _counts, requests=_counts.requests + 1, cache_hits=_counts.cache_hits + 1
        )


def compilation_counts() -> CompilationCounts:
    """This process's counts so far; the first call starts counting (JAX's monitoring
    events: a backend compilation, a persistent-cache hit)."""
    global _listening
    if not _listening:
        import jax

        jax.monitoring.register_event_duration_secs_listener(_on_duration)
        jax.monitoring.register_event_listener(_on_event)
        _listening = True
    return _counts
