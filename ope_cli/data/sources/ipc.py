"""Arrow IPC files (Feather v2) and streams."""

from __future__ import annotations

from ope_cli.data.sources.arrow import ArrowFileDataset, FragmentReader

NAME = "ipc"
FILE_MAGIC = b"ARROW1"
STREAM_CONTINUATION = b"\xff\xff\xff\xff"


def sniff(head: bytes) -> bool:
    return head.startswith(FILE_MAGIC) or head.startswith(STREAM_CONTINUATION)


def open_files(source: str, files: list[str], base_dir: str | None) -> ArrowFileDataset:
    return ArrowFileDataset.open(source, files, NAME, FragmentReader(), base_dir)
