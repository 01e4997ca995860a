"""Traced kernels kept on disk beside the persistent compilation cache.

With a warm compilation cache, what a new process still pays per batch shape is tracing
the kernel in Python and lowering it to StableHLO (about as long as reading a small
dataset). The first process to meet a shape exports the traced kernel (``jax.export``)
into ``<cache>/traced/``; later ones deserialize it and call it, and its compilation comes
from the persistent cache as before.

Only the package's own module-level functions qualify (the tabular, linear_softmax and
linear_gaussian policy kinds, the registered estimators defined in ``ope_cli``): an entry
point or a plug-in estimator may change without the key noticing, and a closure (an MLP's
activation, a fitted behavior model's floor) is not named by its name, so those kernels
are traced every time. The key includes a digest of the
package's source, so an edited checkout never reads a stale kernel.
"""

from __future__ import annotations

import functools
import hashlib
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import jax
import numpy as np

from ope_cli import runtime
from ope_cli._version import __version__

PACKAGE = "ope_cli"
_registered = False


@functools.cache
def source_digest() -> str:
    """sha256 of every Python file of the package (a few milliseconds, once)."""
    root = Path(__file__).resolve().parent
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
    """A hex key naming one traced kernel, or None when some of its code is not the
    package's own (``static``: the jit's static arguments, functions included)."""
    functions = [*_static_functions(static.values()), *estimator_code]
    if not all(_own_code(function) for function in functions):
        return None
    mesh = static.get("mesh")
    parts = [
        __version__,
        jax.__version__,
        jax.default_backend(),
        source_digest(),
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


def _register_pytrees(types: Sequence[type]) -> None:
    """NamedTuple pytrees must be registered for (de)serialization, once per process."""
    global _registered
    if _registered:
        return
    for cls in types:
        jax.export.register_namedtuple_serialization(cls, serialized_name=f"ope.{cls.__name__}")
    _registered = True


def directory() -> Path | None:
    """``<compilation cache>/traced``, or None when the compilation cache is off."""
    cache = runtime.cache_directory()
    return None if cache is None else Path(cache) / "traced"


def load_or_export(
    jitted: Callable, args: Sequence[Any], static: dict[str, Any], key: str, types: Sequence[type]
) -> Callable | None:
    """The traced kernel's ``call`` (taking ``args``), read from disk or exported and
    written there; None when it cannot be (the caller then runs ``jitted`` itself)."""
    folder = directory()
    if folder is None:
        return None
    _register_pytrees(types)
    path = folder / f"{key}.bin"
    try:
        if path.is_file():
            return jax.export.deserialize(bytearray(path.read_bytes())).call
        exported = jax.export.export(jitted)(*args, **static)
        _write_atomically(path, exported.serialize())
        return exported.call
    except Exception:  # noqa: BLE001 - an optional cache: whatever fails, trace as usual
        return None


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
