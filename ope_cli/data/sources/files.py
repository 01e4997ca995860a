"""A source string (file, directory or glob, a local path or a URI) -> its data files in
read order; their first bytes and sizes, wherever they are."""

from __future__ import annotations

import glob
import os
from pathlib import Path

import ope_cli.data.sources.remote as remote
from ope_cli.errors import DataError


def data_files_in(directory: Path) -> list[str]:
    """Every data file under ``directory``, sorted; hidden and underscore-prefixed entries
    are metadata (_SUCCESS, .crc), as in pyarrow."""
    files = []
    for root, dirs, names in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith((".", "_")))
        files.extend(os.path.join(root, n) for n in names if not n.startswith((".", "_")))
    return sorted(files)


def resolve_files(source: str) -> tuple[list[str], str | None]:
    """(sorted data files, the directory hive partitions are relative to or None) of a
    file, a directory or a glob; raises DataError (UsageError for an unknown URI scheme).
    Files in object storage are URIs (``s3://bucket/key``); ``file://`` URIs are local."""
    local = remote.on_disk(source)
    if local is None:
        return remote.resolve(source)
    if not local:  # Path("") is the working directory: "" read ./LICENSE as a data file
        raise DataError('the data path is empty (the working directory is ".")')
    source = local  # a file:// URI's path
    path = Path(source)
    if path.is_dir():
        files = data_files_in(path)
        if not files:
            raise DataError(f"{source}: directory holds no data files")
        return files, str(path)
    if path.is_file():
        return [str(path)], None
    if glob.has_magic(source):
        files = sorted(f for f in glob.glob(source, recursive=True) if os.path.isfile(f))
        if not files:
            raise DataError(f"{source}: no files match this pattern")
        return files, None
    raise DataError(f"{source}: no such file or directory")


def read_head(path: str, size: int = 8) -> bytes:
    """The first ``size`` bytes of a file (its magic number); raises DataError."""
    if remote.is_uri(path):
        return remote.read_head(path, size)
    try:
        with open(path, "rb") as handle:
            return handle.read(size)
    except OSError as error:
        raise DataError(f"{path}: cannot read file ({error.strerror or error})") from None


def file_sizes(files: tuple[str, ...] | list[str]) -> list[int]:
    """Bytes of each data file (local paths or URIs of one filesystem); raises DataError."""
    if files and remote.is_uri(files[0]):
        return remote.sizes(files)
    try:
        return [os.path.getsize(f) for f in files]
    except OSError as error:
        raise DataError(f"cannot read file sizes: {error}") from None
