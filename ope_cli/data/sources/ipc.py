"""Arrow IPC files (Feather v2). An IPC stream and a Feather v1 file are recognised and
refused with the way to rewrite them as an IPC file (pyarrow's datasets read that format
only)."""

from __future__ import annotations

from ope_cli.data.sources.arrow import ArrowFileDataset, FragmentReader

NAME = "ipc"
FILE_MAGIC = b"ARROW1"
STREAM_CONTINUATION = b"\xff\xff\xff\xff"
FEATHER_V1_MAGIC = b"FEA1"


def sniff(head: bytes) -> bool:
    return head.startswith(FILE_MAGIC)


def unsupported(head: bytes) -> str | None:
    """Why a file of this family that ``sniff`` does not take cannot be read, or None."""
    if head.startswith(STREAM_CONTINUATION):
        return (
            "an Arrow IPC stream, not an Arrow IPC file (Feather v2): rewrite it with "
            "pyarrow.feather.write_feather(pyarrow.ipc.open_stream(PATH).read_all(), OUT)"
        )
    if head.startswith(FEATHER_V1_MAGIC):
        return (
            "a Feather v1 file, which is read whole, not streamed: rewrite it as Feather v2 "
            "with pyarrow.feather.write_feather(pyarrow.feather.read_table(PATH), OUT)"
        )
    return None


def open_files(source: str, files: list[str], base_dir: str | None) -> ArrowFileDataset:
    return ArrowFileDataset.open(source, files, NAME, FragmentReader(), base_dir)
