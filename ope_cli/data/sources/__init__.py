"""Input formats as plug-ins: each module recognises its files by their first bytes and
opens them as a ``Dataset`` (``base``). A new format is one module with ``NAME``,
``sniff(head)`` and ``open_files(source, files, base_dir)``, plus its line in FORMATS;
optionally ``unsupported(head)``: why a file it recognises but cannot read is refused.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from types import ModuleType

from ope_cli.data.sources import d4rl, ipc, minari, parquet
from ope_cli.data.sources.base import (
    METADATA_KEY,
    Dataset,
    DeclaredBounds,
    SourcedBatch,
    is_reward_range,
)
from ope_cli.data.sources.files import read_head, resolve_files
from ope_cli.data.sources.prefetch import prefetched
from ope_cli.data.sources.remote import is_uri, on_disk
from ope_cli.errors import DataError

FORMATS: tuple[ModuleType, ...] = (parquet, ipc, d4rl)  # tried in order on each file's head
# Sources that are not a list of files (a dataset directory, a ``scheme:ID``): modules with
# ``claims(source)`` and ``open_source(source)``, asked before the files are resolved.
DATASET_FORMATS: tuple[ModuleType, ...] = (minari,)

__all__ = [
    "DATASET_FORMATS",
    "FORMATS",
    "METADATA_KEY",
    "Dataset",
    "DeclaredBounds",
    "SourcedBatch",
    "is_reward_range",
    "iter_batches",
    "open_dataset",
    "prefetched",
    "sniff_format",
]


def sniff_format(path: str) -> ModuleType:
    """The format module whose magic bytes start ``path``; raises DataError."""
    head = read_head(path)
    for module in FORMATS:
        if module.sniff(head):
            return module
    for module in FORMATS:  # a format's relative that it recognises but cannot read
        reason = getattr(module, "unsupported", lambda _: None)(head)
        if reason is not None:
            raise DataError(f"{path}: {reason}")
    if not head:
        raise DataError(f"{path}: file is empty (0 bytes), not a Parquet, Arrow or HDF5 file")
    raise DataError(f"{path}: not a Parquet, Arrow IPC/Feather or HDF5 file (unrecognised header)")


# a Minari dataset's own file, in its data folder (Arrow storage: in each episode's too)
MINARI_METADATA = re.compile(r"/data/(?:[^/]+/)?metadata\.json$")


def open_dataset(source: str) -> Dataset:
    """Resolves a file, directory or glob into an ordered dataset; raises DataError."""
    local = on_disk(source)  # a file:// URI's path: a Minari dataset is found there too
    if local is not None and local != source and any(m.claims(local) for m in DATASET_FORMATS):
        source = local
    for module in DATASET_FORMATS:
        if module.claims(source):
            return module.open_source(source)
    files, base_dir = resolve_files(source)
    if is_uri(source) and any(MINARI_METADATA.search(f) for f in files):
        raise DataError(f"{source}: Minari datasets are read from a local disk only; copy it first")
    formats = {sniff_format(f) for f in files}
    if len(formats) > 1:
        names = ", ".join(sorted(m.NAME for m in formats))
        raise DataError(f"{source}: mixes file formats ({names}); use one format")
    (module,) = formats
    if module is d4rl and is_uri(files[0]):
        raise DataError(f"{source}: HDF5 files are read from a local disk only; copy it first")
    return module.open_files(source, files, base_dir)


def iter_batches(data: Dataset, columns: list[str], rows: int) -> Iterator[SourcedBatch]:
    """``data.iter_batches(columns, rows)``: record batches, file by file, in file order."""
    return data.iter_batches(columns, rows)
