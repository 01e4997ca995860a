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
    """``np.savez`` of ``arrays`` at ``path`` (a command's ``--out``), whole or not at all:
    into a file beside the target (through a symlink, its file's), renamed into place with
    Ctrl-C held (``interrupts.held``), so an error (a full disk) keeps the earlier file; in
    place where the folder lets only the file be written. After an interrupt, one lost on
    the way included, a file the run created is removed. A UsageError naming ``--out``
    where it cannot be written."""
    existed = os.path.lexists(path)
    target = os.path.realpath(path)
    partial = f"{target}.{os.getpid()}.partial"
    try:
        with interrupts.held():
            try:
                handle = open(partial, "wb")
            except PermissionError:  # a folder that lets only the file itself be written
                handle, partial = open(target, "wb"), None
            with handle:
                np.savez(handle, **arrays)
            if partial is not None:
                os.replace(partial, target)
    except BaseException as error:
        if not existed or partial is None and not isinstance(error, KeyboardInterrupt):
            with contextlib.suppress(OSError):  # no half a checkpoint where there was none
                os.remove(target)
        if isinstance(error, OSError):
            reason = error.strerror or error
            raise UsageError(f"--out {path}: cannot write the checkpoint ({reason})") from None
        raise
    finally:
        if partial is not None:
            with contextlib.suppress(OSError):
                os.remove(partial)
