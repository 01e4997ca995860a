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

import os
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
    import jax

    directory = cache_directory()
    if directory is None:
        return None
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    jax.config.update("jax_compilation_cache_dir", directory)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    return directory


def enable_cpu_collectives() -> None:
    """CPU devices need a collectives backend to talk across processes (GPUs use NCCL);
    must be set before anything initialises a JAX backend."""
    import jax

    jax.config.update("jax_cpu_collectives_implementation", "gloo")
