"""The one entry to the data: ``open_episodes(DataConfig(...))`` opens any source, resolves
which column plays which role, and gives an ``EpisodeStream``; iterating it reads the
data once and yields validated, whole episodes (``EpisodeChunk``), a new pass each time.

Every command reads its data through here: ``evaluate`` (whose ``pipeline.stream`` pads
the episodes into batches), ``inspect``, ``convert``, ``fit-behavior``, ``fit-q`` and
``bench``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ope_cli.config import BatchingConfig, ColumnMapping
from ope_cli.data.columns import (
    ALIASES,
    AmbiguousColumns,
    DataSchema,
    compared_roles,
    resolve_schema,
)
from ope_cli.data.decode import list_lengths, plain
from ope_cli.data.episodes import ChunkChecks, EpisodeAssembler, EpisodeChunk
from ope_cli.data.sources import Dataset, SourcedBatch, iter_batches, open_dataset
from ope_cli.errors import DataError, OpeError

# Whether a probability column (logged target or behavior probabilities) is read:
# required (a DataError without one), if_present (read when the data has a column of that
# role, by option or alias), if_usable (behavior only: read when it resolves, else left
# out), or unread.
ColumnUse = Literal["required", "if_present", "if_usable", "unread"]
PROBABILITY_ROLES = {
    "target": ("target_prob", "target_log_prob"),
    "behavior": ("behavior_prob", "behavior_log_prob"),
}


@dataclasses.dataclass(frozen=True)
class DataConfig:
    """What to read and how.

    Attributes:
      source: a file, directory, glob, URI or dataset (anything ``open_dataset`` takes).
      columns: the column options (``None`` fields: detected from names and aliases).
      read_rows: rows per Arrow record batch read.
      on_invalid: ``validate.ON_INVALID``: error, drop or collect.
      target_column, behavior_column: whether the logged target (evaluation policy) and
        behavior probabilities are read (``ColumnUse``).
      reward_column: "unread" for a fit to the logged actions (``ope fit-behavior``): no
        reward column is needed, and the chunks' rewards are None.
    """

    source: str
    columns: ColumnMapping = ColumnMapping()
    read_rows: int = BatchingConfig.read_rows
    on_invalid: str = "error"
    target_column: ColumnUse = "unread"
    behavior_column: ColumnUse = "required"
    reward_column: ColumnUse = "required"  # "unread": a fit to the logged actions only


@dataclasses.dataclass(frozen=True)
class EpisodeStream:
    """An opened source's validated episodes: ``for chunk in stream`` reads the data once,
    in file order, with ``chunk_checks`` (policy ranges, bounds) added to the validation.

    ``data`` (the Dataset: files, schema, declared bounds) and ``schema`` (the roles) are
    known before any row is read; ``widths`` (``vector_widths``) from the data's first
    vectors, when episodes are first read.
    """

    config: DataConfig
    data: Dataset
    schema: DataSchema
    chunk_checks: ChunkChecks | None = None
    # the files before this stream's share of them (a process's): their rows number an
    # episode-layout row's id where the data has no id column, counted when an assembler
    # needs them (``first_row``), so that the id does not depend on the share
    files_before: tuple[str, ...] = ()
    # holds "widths" once read: one dict shared by every stream made from this one (other
    # checks, a process's share), so the data's start is read once, and every process and
    # every --read-rows judges the same rows ragged
    _cache: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    @property
    def widths(self) -> dict[str, int | None]:
        """{role: length} every vector of that role must have (``vector_widths``: read from
        the data's start the first time any stream sharing this one's needs it)."""
        if "widths" not in self._cache:
            self._cache["widths"] = vector_widths(self.data, self.schema)
        return self._cache["widths"]

    @property
    def source(self) -> str:
        """What the user passed."""
        return self.config.source

    def __iter__(self) -> Iterator[EpisodeChunk]:
        return self.assembler().chunks(self.record_batches())

    def assembler(self) -> EpisodeAssembler:
        """A fresh assembler of this stream's episodes (its counts, drops and seen ids
        cover the record batches given to its ``chunks``)."""
        return EpisodeAssembler(
            self.schema, self.config.on_invalid, self.chunk_checks, self.widths, self.first_row
        )

    @property
    def first_row(self) -> int:
        """The global row number of this stream's first row (0 but for a share of the files
        of episode-layout data without ids): from the files' metadata where the format keeps
        it, else counted by reading one column; once per share."""
        if not self.files_before:
            return 0
        key = ("rows", self.files_before)
        if key not in self._cache:
            data = self.data.restrict(self.files_before)
            counted = data.count_rows()
            if counted is None:
                column = [self.schema.columns.get("reward") or self.schema.columns["action"]]
                counted = sum(part.batch.num_rows for part in data.iter_batches(column, 1 << 16))
            self._cache[key] = counted
        return self._cache[key]

    def record_batches(self) -> Iterator[SourcedBatch]:
        """The record batches of one pass, file by file, with the role columns only."""
        return iter_batches(self.data, self.schema.read_columns, self.config.read_rows)

    def with_checks(self, chunk_checks: ChunkChecks | None) -> EpisodeStream:
        """The same episodes validated with ``chunk_checks`` instead."""
        return dataclasses.replace(self, chunk_checks=chunk_checks)

    def restrict(self, files: tuple[str, ...]) -> EpisodeStream:
        """The same stream over a subset of the files (a process's share, the files left),
        with the whole data's vector widths (read here if not yet)."""
        _ = self.widths  # read from the whole data before the share, which keeps them
        before = self.files_before
        if files and self.schema.layout == "episode" and "episode" not in self.schema.columns:
            before += self.data.files[: self.data.files.index(files[0])]
        return dataclasses.replace(self, data=self.data.restrict(files), files_before=before)

    def reconfigured(self, **changes) -> EpisodeStream:
        """The same opened data read with other ``DataConfig`` fields (columns re-resolved;
        the vector widths shared while the vector columns are the same, else read again
        from this stream's files: reconfigure before ``restrict``); raises DataError as
        ``open_episodes``."""
        config = dataclasses.replace(self.config, **changes)
        schema = resolve_columns(self.data, config)
        same = (schema.layout, _vector_columns(schema)) == (
            self.schema.layout,
            _vector_columns(self.schema),
        )
        cache = self._cache if same else {}
        data = _comparing(self.data, schema, config)
        return dataclasses.replace(self, config=config, data=data, schema=schema, _cache=cache)


def open_episodes(config: DataConfig) -> EpisodeStream:
    """Opens ``config.source`` and resolves its columns; no row is read yet. Raises
    DataError (no such data, unreadable, a required column missing or of the wrong type);
    UsageError for a ``read_rows`` out of its range (every command reads through here)."""
    BatchingConfig(read_rows=config.read_rows).check()
    data = open_dataset(config.source)
    schema = resolve_columns(data, config)
    return EpisodeStream(config, _comparing(data, schema, config), schema)


def _comparing(data: Dataset, schema: DataSchema, config: DataConfig) -> Dataset:
    """``data``, each file checked to give the roles ``schema`` found by name the same
    columns as the first file (``columns.compared_roles``), where its format has files
    that can differ."""
    if not hasattr(data, "comparing"):
        return data
    return data.comparing(compared_roles(schema, config.columns))


# the data's first non-null vectors (in file order) whose usual length is every vector's
PEEK_VECTORS = 256


def vector_widths(data: Dataset, schema: DataSchema) -> dict[str, int | None]:
    """{role: length} of the variable-length vector roles (observation, vector actions):
    the most common length among the data's first PEEK_VECTORS non-null vectors of that
    role in file order (the shortest where two are as common; None: none found). Decided
    once, from rows that do not depend on --read-rows or on a process's share of the files,
    and robust to a few odd first rows. Reads those columns only, in one pass from the
    start until each has PEEK_VECTORS; a file that cannot be read is skipped (the pass over
    the data reports it)."""
    columns = _vector_columns(schema)
    lengths: dict[str, list[np.ndarray]] = {role: [] for role in columns}

    def found(role: str) -> int:
        return sum(part.size for part in lengths[role])

    for file in data.files:
        if all(found(role) >= PEEK_VECTORS for role in columns):
            break
        try:
            # the Dataset's own reader: a look at a few columns, not a pass over the data
            for sourced in data.restrict((file,)).iter_batches(
                list(columns.values()), PEEK_VECTORS
            ):
                for role, column in columns.items():
                    array = plain(sourced.batch.column(column))
                    if schema.layout == "episode":  # one list of steps per row
                        array = plain(pc.list_flatten(array))
                    lengths[role].append(list_lengths(array.filter(pc.is_valid(array))))
                if all(found(role) >= PEEK_VECTORS for role in columns):
                    break
        except (OpeError, OSError, pa.ArrowException):
            continue
    return {
        role: int(np.bincount(np.concatenate(parts)[:PEEK_VECTORS]).argmax())
        if found(role)
        else None
        for role, parts in lengths.items()
    }


def _vector_columns(schema: DataSchema) -> dict[str, str]:
    """{role: column} of the roles held as variable-length vectors (a fixed-size list's
    observation has its size in the schema)."""
    vector = {
        "observation": schema.observation_kind == "vector" and not schema.observation_dim,
        "action": schema.action_is_vector,
    }
    return {
        role: schema.columns[role]
        for role, is_vector in vector.items()
        if is_vector and role in schema.columns
    }


def resolve_columns(data: Dataset, config: DataConfig) -> DataSchema:
    """The roles of ``data``'s columns as ``config`` asks; DataErrors name the source, and
    in a dataset of several files, the file whose columns they are (a missing target
    column said "the data has none" where a later file had one)."""
    try:
        return _resolve_columns(data, config)
    except AmbiguousColumns:
        raise
    except DataError as error:
        if len(data.files) < 2:
            raise
        first = getattr(data, "schema_file", None) or data.files[0]
        raise type(error)(
            f"{error} (the columns of a dataset of several files are its first file's: "
            f"{first}; every file names them alike)"
        ) from None


def _resolve_columns(data: Dataset, config: DataConfig) -> DataSchema:
    target = _reads(data, config, "target", config.target_column)
    behavior = _reads(data, config, "behavior", config.behavior_column)

    def resolve(logged_behavior: bool) -> DataSchema:
        return resolve_schema(
            data.schema,
            config.columns,
            logged_target=target,
            source=config.source,
            logged_behavior=logged_behavior,
            reads_reward=config.reward_column != "unread",
        )

    if config.behavior_column != "if_usable":
        return resolve(behavior)
    try:
        return resolve(True)
    except AmbiguousColumns:  # usable once an option names one: said, not dropped
        raise
    except DataError:
        return resolve(False)


def _reads(data: Dataset, config: DataConfig, what: str, use: ColumnUse) -> bool:
    """Whether the ``what`` probability column is asked for (``if_usable``: tried first)."""
    if use == "if_present":
        return _has_column(list(data.schema.names), config.columns, PROBABILITY_ROLES[what])
    return use != "unread"


def _has_column(names: list[str], mapping: ColumnMapping, roles: tuple[str, ...]) -> bool:
    """Whether the data has a column of one of ``roles`` (by option or alias)."""
    if any(getattr(mapping, role) is not None for role in roles):
        return True
    lower = {name.lower() for name in names}
    return any(alias in lower for role in roles for alias in ALIASES[role])
