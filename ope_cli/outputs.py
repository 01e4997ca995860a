"""Outputs a command writes are never replaced silently (SPEC 12): an existing one is a
usage error unless ``--overwrite`` is given, checked before any work."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

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
