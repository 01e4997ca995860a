"""How the kernel is compiled and kept on disk beside the persistent compilation cache.

With a warm persistent compilation cache, a new process still pays, per window shape,
tracing the kernel in Python, lowering it to StableHLO (the cache's key is a hash of it)
and looking the executable up. The first process to meet a shape serialises the compiled
executable (``jax.experimental.serialize_executable``) into ``<cache>/kernels/``; later
ones load it by a key computed without tracing, and call it.

Only the package's own module-level functions qualify (the tabular, linear_softmax and
linear_gaussian policy kinds, the registered estimators defined in ``ope_cli``): an entry
point or a plug-in estimator may change without the key noticing, and a closure (an MLP's
activation, a fitted behavior model's floor) is not named by its name, so those kernels
are traced every time. The key includes a digest of the package's source, JAX's version
and this machine's CPU (an executable is native code), so an edited checkout or another
machine sharing the cache never loads a stale or foreign kernel. Multi-process runs do not
use it (an executable is bound to its devices); they trace and hit the persistent cache.
"""

from __future__ import annotations

import functools
import hashlib
import os
import pickle
import platform
import tempfile
import types
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np
from jax.experimental import serialize_executable

from ope_cli import runtime
from ope_cli._version import __version__

PACKAGE = "ope_cli"

# XLA:CPU's newer fusion emitters take a third longer to compile this kernel and run it
# no faster (measured on 2-core machines: compile 2.4 -> 1.6 s per batch shape, a call
# within +-15%); the option is a CPU one, other backends ignore it. Measured and left out:
# xla_backend_optimization_level=0 (compiles in a third of the time, runs 5x slower) and
# =1 (compiles 6-12% faster, a pass over the bench data runs 22% slower: 0.58 -> 0.71 s);
# xla_cpu_parallel_codegen_split_count=1 (one code-generation thread: 15-30% slower to
# compile at this level, 18% faster at level 0, which the test suite uses);
# xla_llvm_disable_expensive_passes, xla_cpu_use_thunk_runtime=false and xla_cpu_max_isa
# (no faster to compile).
COMPILER_OPTIONS = {"xla_cpu_use_fusion_emitters": False}

_compilations = 0  # kernels compiled (or fetched from the persistent cache) by this process


def count_compilation() -> None:
    """Counts one kernel compiled for a batch shape (``compilation_count``)."""
    global _compilations
    _compilations += 1


def compilation_count() -> int:
    return _compilations


def clear_caches() -> None:
    """``jax.clear_caches()``: the next call traces and compiles everything again, as a new
    process would (``ope bench``'s cold runs)."""
    jax.clear_caches()


@functools.cache
def machine_fingerprint() -> str:
    """The CPU this process runs on (architecture, and on Linux the model and feature
    flags): an executable compiled for one CPU may not run on another."""
    parts = [platform.machine(), platform.system()]
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith(("model name", "flags", "Features", "CPU part")):
                    parts.append(line.strip())
                elif not line.strip():
                    break  # the first processor's block is enough
    except OSError:
        pass
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


@functools.cache
def source_digest() -> str:
    """sha256 of every Python file of the package (a few milliseconds, once)."""
    root = Path(__file__).resolve().parents[1]  # ope_cli/, above estimation/
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _own_code(function: Callable | None) -> bool:
    """None, or a module-level function of this package: its module and name identify it.
    A closure (an MLP's activation, a floor) is not identified by its name, so it does not
    qualify."""
    if function is None:
        return True
    return (
        getattr(function, "__module__", "").startswith(PACKAGE + ".")
        and "<locals>" not in getattr(function, "__qualname__", "<locals>")
        and getattr(function, "__closure__", None) is None
    )


def _leaf_signature(leaf: Any) -> str:
    if leaf is None:
        return "None"
    array = leaf if hasattr(leaf, "shape") else np.asarray(leaf)
    sharding = getattr(leaf, "sharding", None)
    spec = getattr(sharding, "spec", None)
    return f"{array.shape}:{array.dtype}:{spec}"


def kernel_key(args: Sequence[Any], static: dict[str, Any], estimator_code: Sequence[Callable]):
    """A hex key naming one compiled kernel, or None when some of its code is not the
    package's own or the run spans processes (``static``: the jit's static arguments,
    functions included)."""
    functions = [*_static_functions(static.values()), *estimator_code]
    if jax.process_count() > 1 or not all(_own_code(function) for function in functions):
        return None
    mesh = static.get("mesh")
    devices = execution_devices(mesh)
    parts = [
        __version__,
        jax.__version__,
        jax.default_backend(),
        machine_fingerprint(),
        os.environ.get("XLA_FLAGS", ""),  # compiler options change the executable
        source_digest(),
        ",".join(f"{d.platform}:{d.id}:{d.device_kind}" for d in devices),
        str(jax.tree.structure(args)),
        *(_leaf_signature(leaf) for leaf in jax.tree.leaves(args)),
        *(
            f"{name}={_static_text(value)}"
            for name, value in sorted(static.items())
            if name != "mesh"
        ),
        "mesh=None" if mesh is None else f"mesh={dict(mesh.shape)}:{mesh.devices.size}",
    ]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


def execution_devices(mesh) -> list:
    """The devices a kernel of ``mesh`` (None: one device) runs on: the first local
    device, or the mesh's."""
    return jax.local_devices()[:1] if mesh is None else list(mesh.devices.flat)


def _static_functions(values) -> list[Callable]:
    """The functions among static arguments, also inside tuples (a Q source's QSpec)."""
    found = []
    for value in values:
        if callable(value) and not isinstance(value, type):
            found.append(value)
        elif isinstance(value, tuple):
            found.extend(_static_functions(value))
    return found


def _static_text(value: Any) -> str:
    if callable(value):
        return f"{value.__module__}.{value.__qualname__}"
    if isinstance(value, tuple):
        inner = ", ".join(_static_text(item) for item in value)
        return f"{type(value).__name__}({inner})"
    return repr(value)


def directory() -> Path | None:
    """``<compilation cache>/kernels``, or None when the compilation cache is off."""
    cache = runtime.cache_directory()
    return None if cache is None else Path(cache) / "kernels"


def load_or_compile(
    compile_named: Callable[[str], Any], key: str, devices: Sequence[Any]
) -> Callable | None:
    """The compiled kernel of ``key``, loaded from disk onto ``devices`` (its
    ``execution_devices``), or compiled by ``compile_named(name)`` (a jax ``Compiled``, its
    module called ``name``) and written there; None when it cannot be (the caller then
    compiles as usual). Loaded without its devices, a kernel is bound to every local device:
    ``--devices 1`` among four then failed at its first call ("expected 4 shards").

    An executable that XLA:CPU loaded from the persistent compilation cache serialises
    incompletely (the copy fails at its first call: "Function ... not found"), so only a
    fresh compilation may be kept. The name, made from ``key``, goes into the lowered
    module, hence into the persistent cache's key, so the first compilation of a kernel key
    is never a cache hit (for example after an upgrade left the same program under an older
    key); a hit that happens anyway (``kernels/`` was deleted) is simply not kept.
    """
    folder = directory()
    if folder is None:
        return None
    path = folder / f"{key}.bin"
    try:
        if path.is_file():
            payload, in_tree, out_tree = pickle.loads(path.read_bytes())
            loaded = serialize_executable.deserialize_and_load(
                payload, in_tree, out_tree, execution_devices=list(devices)
            )
            runtime.count_kernel_load()
            return loaded
        before = runtime.compilation_counts()
        compiled = compile_named(f"ope_kernel_{key[:16]}")
        if (runtime.compilation_counts() - before).cache_hits == 0:
            _write_atomically(path, pickle.dumps(serialize_executable.serialize(compiled)))
        return compiled
    except Exception:  # noqa: BLE001 - an optional cache: whatever fails, compile as usual
        return None


def renamed(function: Callable, name: str) -> Callable:
    """A copy of the plain ``function`` called ``name`` (for ``load_or_compile``)."""
    copy = types.FunctionType(
        function.__code__,
        function.__globals__,
        name,
        function.__defaults__,
        function.__closure__,
    )
    copy.__kwdefaults__ = function.__kwdefaults__
    copy.__qualname__ = name
    return copy


def _write_atomically(path: Path, data: bytes | bytearray) -> None:
    """Writes ``data`` to ``path`` through a temporary file in the same folder, so that
    another process never reads half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as file:
            file.write(data)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise
