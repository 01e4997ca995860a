"""Outputs a command writes are never replaced silently (SPEC 12): an existing one is a
usage error unless ``--overwrite`` is given, checked before any work; a checkpoint is
written whole or not at all (``write_checkpoint_file``)."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np

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


def write_checkpoint_file(path: str, arrays: dict[str, np.ndarray]) -> None:
    """``np.savez`` of ``arrays`` at ``path`` (a command's ``--out``) with Ctrl-C held
    (``interrupts.held``): an interrupt, one lost on the way included, comes before the file
    is opened or once it is whole, never halfway; a file the run created is then removed.
    Written in place (through a symlink, in a folder that only lets the file be written);
    a UsageError naming ``--out`` where it cannot be."""
    existed = os.path.lexists(path)
    try:
        with interrupts.held(), open(path, "wb") as handle:
            np.savez(handle, **arrays)
    except OSError as error:
        raise UsageError(f"--out {path}: cannot write the checkpoint ({error.strerror})") from None
    except KeyboardInterrupt:
        if not existed:
            with contextlib.suppress(OSError):
                os.remove(path)
        raise
