"""Parquet files (a file, a directory with hive partitions, or a glob)."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from ope_cli.data.sources.arrow import ArrowFileDataset, FragmentReader

NAME = "parquet"
MAGIC = b"PAR1"


def sniff(head: bytes) -> bool:
    return head.startswith(MAGIC)


class ParquetReader(FragmentReader):
    def count_rows(self, fragment: ds.Fragment) -> int | None:
        return fragment.metadata.num_rows  # from the footer: no data is read

    def batches(
        self, data: ArrowFileDataset, fragment: ds.Fragment, columns: list[str], rows: int
    ) -> Iterator[pa.RecordBatch]:
        """A plain ParquetFile reader: the dataset scanner decodes far ahead of its consumer
        (hundreds of MiB on large files), while this holds about one row group, so memory
        does not grow with the data. Columns that only exist in hive partition paths need the
        dataset scanner."""
        physical = fragment.physical_schema
        if all(physical.get_field_index(c) >= 0 for c in columns):
            if data.filesystem is None:
                parquet = pq.ParquetFile(fragment.path, pre_buffer=False)
            else:  # object storage: one ranged request per row group's columns
                source = data.filesystem.open_input_file(fragment.path)
                parquet = pq.ParquetFile(source, pre_buffer=True)
            return parquet.iter_batches(batch_size=rows, columns=columns)
        return super().batches(data, fragment, columns, rows)


def open_files(source: str, files: list[str], base_dir: str | None) -> ArrowFileDataset:
    return ArrowFileDataset.open(source, files, NAME, ParquetReader(), base_dir)
