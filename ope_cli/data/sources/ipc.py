"""Arrow IPC files (Feather v2). An IPC stream is recognised and refused with the way to
rewrite it as a file (pyarrow's datasets read the file format only)."""

from __future__ import annotations

from ope_cli.data.sources.arrow import ArrowFileDataset, FragmentReader

NAME = "ipc"
FILE_MAGIC = b"ARROW1"
STREAM_CONTINUATION = b"\xff\xff\xff\xff"


def sniff(head: bytes) -> bool:
    return head.startswith(FILE_MAGIC)


def unsupported(head: bytes) -> str | None:
    """Why a file of this family that ``sniff`` does not take cannot be read, or None."""
    if head.startswith(STREAM_CONTINUATION):
        return (
            "an Arrow IPC stream, not an Arrow IPC file (Feather v2): rewrite it with "
            "pyarrow.feather.write_feather(pyarrow.ipc.open_stream(PATH).read_all(), OUT)"
        )
    return None


def open_files(source: str, files: list[str], base_dir: str | None) -> ArrowFileDataset:
    return ArrowFileDataset.open(source, files, NAME, FragmentReader(), base_dir)
