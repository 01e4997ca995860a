"""Outputs a command writes are never replaced silently (SPEC 12): an existing one is a
usage error unless ``--overwrite`` is given, checked before any work."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import BinaryIO

from ope_cli import interrupts
from ope_cli.errors import UsageError


def refuse_existing(paths: Iterable[str | Path], overwrite: bool) -> None:
    """A UsageError naming the first of ``paths`` that exists, unless ``overwrite``."""
    if overwrite:
        return
    for path in paths:
        found = Path(path)
        if found.exists() or found.is_symlink():
            kind = " (a directory)" if found.is_dir() else ""
            raise UsageError(f"{path}: already exists{kind} (pass --overwrite to replace it)")


def check_checkpoint_out(out: str, overwrite: bool) -> None:
    """UsageErrors for a checkpoint ``--out``: an ``.npz`` file in an existing local
    directory (a URI was "no such directory"), not already there unless ``overwrite``."""
    if not out.endswith(".npz"):
        raise UsageError(f"--out must name an .npz file, got {out!r}")
    if out.lower().startswith("file://"):
        raise UsageError(f"--out {out}: give the local path itself (without file://)")
    if "://" in out:
        raise UsageError(
            f"--out {out}: checkpoints are written to a local path (copy it to object "
            "storage after)"
        )
    if not Path(out).resolve().parent.is_dir():
        raise UsageError(f"--out {out}: no such directory")
    refuse_existing([out], overwrite)


def write_whole(path: str | Path, write: Callable[[BinaryIO], None]) -> None:
    """Writes ``path`` through ``write`` into a file beside it, renamed into place with
    Ctrl-C held (``interrupts.held``): an interrupt (one lost on the way included) or an
    error leaves the earlier file, or none, never half of one. OSError as ``open`` raises
    it."""
    partial = f"{path}.{os.getpid()}.partial"
    try:
        with open(partial, "wb") as handle:
            write(handle)
        with interrupts.held():
            os.replace(partial, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.remove(partial)
