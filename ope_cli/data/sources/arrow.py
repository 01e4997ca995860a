"""Files pyarrow's dataset API reads (Parquet, Arrow IPC): one dataset over an ordered list
of files, hive partitions for directories, projected record batches file by file. Each
format module supplies a ``FragmentReader`` for what differs (row counts, a faster reader).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterator
from pathlib import PurePosixPath

import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

import ope_cli.data.sources.remote as remote
from ope_cli.data.columns import OPTION_FOR_ROLE, role_candidates, role_words
from ope_cli.data.sources.base import (
    METADATA_KEY,
    DeclaredBounds,
    SourcedBatch,
    declared_bounds,
)
from ope_cli.errors import DataError, first_line


class FragmentReader:
    """How one file format's files are counted and read; the defaults suit any format."""

    def count_rows(self, fragment: ds.Fragment) -> int | None:
        """Rows of one file from its metadata, or None when that needs a full read."""
        return None

    def batches(
        self, data: ArrowFileDataset, fragment: ds.Fragment, columns: list[str], rows: int
    ) -> Iterator[pa.RecordBatch]:
        """Each column as this file holds it (cast to the first file's type, a later file's
        fractions beside its integers stopped the read), hive partition keys as the
        dataset has them."""
        physical = fragment.physical_schema
        own = [
            physical.field(name) if physical.get_field_index(name) >= 0 else field
            for name, field in zip(data.schema.names, data.schema, strict=True)
        ]
        return fragment.to_batches(schema=pa.schema(own), columns=columns, batch_size=rows)


@dataclasses.dataclass(frozen=True)
class ArrowFileDataset:
    """An ordered list of data files read as one dataset (the ``sources.Dataset`` protocol).

    Attributes:
      source: what the user passed (file, directory or glob).
      files: data files in read order (sorted paths).
      format: the registry name (``parquet`` or ``ipc``, also pyarrow's format name).
      dataset: the pyarrow dataset over ``files`` (hive partitions for directories).
      reader: the format's FragmentReader.
      partition_base_dir: the directory hive partitions are relative to, if any.
      filesystem: the filesystem of URIs (object storage), None for local paths.
      prefix: what precedes a fragment's path in its URI (``s3://``), "" for local paths.
    """

    source: str
    files: tuple[str, ...]
    format: str
    dataset: ds.Dataset
    reader: FragmentReader
    partition_base_dir: str | None = None
    filesystem: pafs.FileSystem | None = None
    prefix: str = ""
    # roles every file must find alike by name (``comparing``; () until columns resolve)
    compared_roles: tuple[str, ...] = ()
    # the file the schema (and its declared bounds) comes from: the whole dataset's first,
    # also in a process's share of it (``restrict``), whose first file may be another
    schema_file: str | None = None

    def comparing(self, roles: tuple[str, ...]) -> ArrowFileDataset:
        """This dataset, each file's columns checked to give ``roles`` the columns the
        first file gives them (roles are found in the first file's schema)."""
        if tuple(roles) == self.compared_roles:
            return self
        return dataclasses.replace(self, compared_roles=tuple(roles))

    @classmethod
    def open(
        cls, source: str, files: list[str], file_format: str, reader: FragmentReader, base_dir
    ) -> ArrowFileDataset:
        filesystem, prefix, paths = None, "", list(files)
        if files and remote.is_uri(files[0]):
            filesystem, prefix, paths = remote.split(files)
            base_dir = base_dir[len(prefix) :] if base_dir else None
        dataset, first = _opened(source, files, paths, file_format, filesystem, base_dir)
        try:  # a damaged footer can decode into names that are not text
            for field in dataset.schema:
                field.name, str(field.type)
        except (UnicodeDecodeError, pa.ArrowException) as error:
            raise DataError(
                f"{source}: cannot read the schema (column names or types are damaged: "
                f"{first_line(error)})"
            ) from None
        return cls(
            source,
            tuple(files),
            file_format,
            dataset,
            reader,
            base_dir,
            filesystem,
            prefix,
            schema_file=first,
        )

    @property
    def schema(self) -> pa.Schema:
        return self.dataset.schema

    def declared_bounds(self) -> DeclaredBounds:
        return declared_bounds(self.schema, self.source)

    def restrict(self, files: tuple[str, ...]) -> ArrowFileDataset:
        """The same dataset (schema, partitioning) over a subset of its files."""
        dataset = ds.dataset(
            [f[len(self.prefix) :] for f in files],
            schema=self.schema,
            format=self.format,
            partitioning="hive" if self.partition_base_dir else None,
            partition_base_dir=self.partition_base_dir,
            filesystem=self.filesystem,
        )
        return dataclasses.replace(self, files=tuple(files), dataset=dataset)

    def count_rows(self) -> int | None:
        """Total rows from file metadata when the format has it cheaply, else None."""
        try:
            counts = [self.reader.count_rows(f) for f in self.dataset.get_fragments()]
        except (OSError, pa.ArrowException):
            return None
        return None if any(count is None for count in counts) else sum(counts)

    def iter_batches(self, columns: list[str], rows: int) -> Iterator[SourcedBatch]:
        """Streams record batches of at most ``rows`` rows, file by file, in file order."""
        for fragment in self.dataset.get_fragments():
            offset, previous, file = 0, None, self.prefix + fragment.path
            try:
                _check_file_schema(self, fragment, columns)
                for batch in self.reader.batches(self, fragment, columns, rows):
                    if previous is not None:
                        yield SourcedBatch(file, previous, False, offset)
                        offset += previous.num_rows
                    previous = batch
            except (OSError, pa.ArrowException, UnicodeDecodeError) as error:
                raise DataError(f"{file}: cannot read: {first_line(error)}") from None
            if previous is None:  # a file with no rows still ends the file's episodes
                previous = pa.RecordBatch.from_pylist(
                    [], schema=pa.schema([self.schema.field(c) for c in columns])
                )
            yield SourcedBatch(file, previous, True, offset)


def _family(dtype: pa.DataType) -> str:
    """What a column holds, ignoring widths and encodings that read the same (int32 and
    int64, float and int, string and large_string, dictionaries, list flavours)."""
    if pa.types.is_dictionary(dtype):
        dtype = dtype.value_type
    if pa.types.is_integer(dtype) or pa.types.is_floating(dtype):
        return "number"
    if (
        pa.types.is_string(dtype)
        or pa.types.is_large_string(dtype)
        or pa.types.is_string_view(dtype)
    ):
        return "string"
    if isinstance(dtype, (pa.ListType, pa.LargeListType, pa.FixedSizeListType)) or (
        pa.types.is_list_view(dtype) or pa.types.is_large_list_view(dtype)
    ):
        return f"list<{_family(dtype.value_type)}>"
    return str(dtype)


def _in_hive_folder(path: str, name: str, base_dir: str | None) -> bool:
    """Whether a folder of the file ``path`` below ``base_dir`` (the folder partitions are
    relative to; None: no partitions) is named ``name=...``: a hive partition key, a column
    that lives in the path rather than the file, as pyarrow reads them."""
    if base_dir is None:
        return False
    parts, base = PurePosixPath(path).parts[:-1], PurePosixPath(base_dir).parts
    below = parts[len(base) :] if parts[: len(base)] == base else ()
    return any(folder.startswith(f"{name}=") for folder in below)


def _folder_key_clash(name: str, held: str) -> str:
    """A hive folder key ``name`` that also names a column the files hold (``held``)."""
    return (
        f"the folders' names ({name}=...) make a column {name!r} that {held}: rename the "
        "folders, or name the files (a glob) rather than their directory"
    )


def _opened(source: str, files: list[str], paths: list[str], file_format, filesystem, base_dir):
    """(pyarrow dataset of ``paths``, the file its schema comes from): the first file's, or,
    where that one cannot be read (truncated, damaged), the first readable file's; reading
    a damaged file then fails naming it (``iter_batches``), as a damaged later file does.
    Raises DataError where no file can be read or the files disagree."""
    options = dict(
        format=file_format,
        partitioning="hive" if base_dir else None,
        partition_base_dir=base_dir,
        filesystem=filesystem,
    )
    try:
        return ds.dataset(paths, **options), (files[0] if files else None)
    except (OSError, pa.ArrowException) as error:
        readable, why = _first_readable(paths, file_format, filesystem)
        if readable is None:
            raise DataError(f"{files[0]}: cannot read: {why}") from None
        if readable == 0:  # the files disagree (e.g. a hive key that is also a column)
            raise DataError(f"{source}: {_why_not_opened(error, paths, base_dir)}") from None
    try:
        # the partition keys typed from every readable file's folders, not one of them
        schema = ds.dataset(paths[readable:], **options).schema
        return ds.dataset(paths, schema=schema, **options), files[readable]
    except (OSError, pa.ArrowException) as error:
        raise DataError(f"{source}: {_why_not_opened(error, paths, base_dir)}") from None


def _first_readable(paths: list[str], file_format: str, filesystem) -> tuple[int | None, str]:
    """(the index of the first of ``paths`` whose own schema can be read, None if none can;
    the first line of what stopped the first file)."""
    why, local = "", filesystem or pafs.LocalFileSystem()
    reader = ds.ParquetFileFormat() if file_format == "parquet" else ds.IpcFileFormat()
    for index, path in enumerate(paths):
        try:
            reader.inspect(path, filesystem=local)
        except (OSError, pa.ArrowException) as error:
            why = why or first_line(error)
            continue
        return index, why
    return None, why


def _why_not_opened(error: Exception, paths: list[str], base_dir: str | None) -> str:
    """What stopped pyarrow opening the files: in words where a hive folder name (key=value,
    below ``base_dir``) also names a column of the files, else pyarrow's first line."""
    found = re.search(r"Field (\S+) has incompatible types", str(error))
    if found and any(_in_hive_folder(path, found.group(1), base_dir) for path in paths):
        return _folder_key_clash(found.group(1), "the files also hold, with another type")
    return f"cannot open dataset: {first_line(error)}"


def _check_file_schema(data: ArrowFileDataset, fragment, columns: list[str]) -> None:
    """A file whose columns differ from the dataset's (its first file's) would otherwise be
    cast silently (numeric strings to numbers) or read as nulls; name the file and column."""
    physical, file = fragment.physical_schema, data.prefix + fragment.path
    first_file = f"the dataset's first file ({data.schema_file or data.files[0]})"

    def partition_key(name: str) -> bool:
        return _in_hive_folder(fragment.path, name, data.partition_base_dir)

    for name in columns:
        index = physical.get_field_index(name)
        if index < 0:
            if not partition_key(name):  # a hive partition's lives there
                raise DataError(
                    f"{file}: has no column {name!r}, which {first_file} has "
                    f"(this file's columns: {', '.join(physical.names)}): every file of a "
                    "dataset names its columns alike"
                )
            continue
        if partition_key(name):
            # pyarrow reads the file's values or the folder's, by which other columns are read
            raise DataError(f"{file}: {_folder_key_clash(name, 'the file also holds')}")
        actual, expected = physical.field(index).type, data.schema.field(name).type
        if _family(actual) != _family(expected):
            raise DataError(
                f"{file}: column {name!r} has type {actual} in this file but "
                f"{expected} in {first_file}"
            )
    for role in data.compared_roles:  # found in the first file: a later 'step' went unread
        first = role_candidates(role, data.schema.names)
        own = role_candidates(role, physical.names)
        own += [name for name in first if partition_key(name)]
        if sorted(own) != sorted(first):
            way_out = (
                f"name the one to read with {OPTION_FOR_ROLE[role]}, or rename or drop the other"
                if first
                else "rename or drop the column, or give it in every file"
            )
            raise DataError(
                f"{file}: its column(s) {', '.join(map(repr, own)) or 'none'} could be the "
                f"{role_words(role)}, where {first_file} has "
                f"{', '.join(map(repr, first)) or 'none'}: every file of a dataset names its "
                f"columns alike ({way_out})"
            )
    _check_declared(file, declared_bounds(physical, file), data.declared_bounds(), first_file)


def _check_declared(file: str, own: DeclaredBounds, first: DeclaredBounds, first_file: str) -> None:
    """The dataset's declarations are its first file's (pyarrow's dataset schema): a file
    that declares another reward range, horizon or gamma (or none) would otherwise be
    evaluated under the first file's without a word."""
    differ = [
        f.name
        for f in dataclasses.fields(DeclaredBounds)
        if getattr(own, f.name) != getattr(first, f.name)
    ]
    if differ:

        def said(bounds: DeclaredBounds) -> str:
            return ", ".join(_declared(name, getattr(bounds, name)) for name in differ)

        raise DataError(
            f"{file}: declares {said(own)} in its {METADATA_KEY!r} metadata, but "
            f"{first_file} declares {said(first)}: the files of one dataset must "
            "declare the same (rewrite the metadata, or evaluate the files apart)"
        )


def _declared(name: str, value: object) -> str:
    """What a file declares of ``name``, as the message says it: "gamma 0.99", "no gamma"."""
    if value is None:
        return f"no {name}"
    if isinstance(value, tuple):
        return f"{name} [" + ", ".join(_shortest(x) for x in value) + "]"
    return f"{name} {_shortest(value)}"


def _shortest(value: float) -> str:
    """``value`` in few digits, all it takes to tell it from another (0.95000000001)."""
    short = f"{value:g}"
    return short if float(short) == value else repr(float(value))
