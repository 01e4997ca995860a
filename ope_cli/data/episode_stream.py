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

from ope_cli.config import BatchingConfig, ColumnMapping
from ope_cli.data.columns import ALIASES, DataSchema, resolve_schema
from ope_cli.data.episodes import ChunkChecks, EpisodeAssembler, EpisodeChunk
from ope_cli.data.sources import Dataset, SourcedBatch, iter_batches, open_dataset
from ope_cli.errors import DataError

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
    """

    source: str
    columns: ColumnMapping = ColumnMapping()
    read_rows: int = BatchingConfig.read_rows
    on_invalid: str = "error"
    target_column: ColumnUse = "unread"
    behavior_column: ColumnUse = "required"


@dataclasses.dataclass(frozen=True)
class EpisodeStream:
    """An opened source's validated episodes: ``for chunk in stream`` reads the data once,
    in file order, with ``chunk_checks`` (policy ranges, bounds) added to the validation.

    ``data`` (the Dataset: files, schema, declared bounds) and ``schema`` (the roles) are
    known before any row is read.
    """

    config: DataConfig
    data: Dataset
    schema: DataSchema
    chunk_checks: ChunkChecks | None = None

    @property
    def source(self) -> str:
        """What the user passed."""
        return self.config.source

    def __iter__(self) -> Iterator[EpisodeChunk]:
        return self.assembler().chunks(self.record_batches())

    def assembler(self) -> EpisodeAssembler:
        """A fresh assembler of this stream's episodes (its counts, drops and seen ids
        cover the record batches given to its ``chunks``)."""
        return EpisodeAssembler(self.schema, self.config.on_invalid, self.chunk_checks)

    def record_batches(self) -> Iterator[SourcedBatch]:
        """The record batches of one pass, file by file, with the role columns only."""
        return iter_batches(self.data, self.schema.read_columns, self.config.read_rows)

    def with_checks(self, chunk_checks: ChunkChecks | None) -> EpisodeStream:
        """The same episodes validated with ``chunk_checks`` instead."""
        return dataclasses.replace(self, chunk_checks=chunk_checks)

    def restrict(self, files: tuple[str, ...]) -> EpisodeStream:
        """The same stream over a subset of the files (a process's share, the files left)."""
        return dataclasses.replace(self, data=self.data.restrict(files))

    def reconfigured(self, **changes) -> EpisodeStream:
        """The same opened data read with other ``DataConfig`` fields (columns re-resolved);
        raises DataError as ``open_episodes``."""
        config = dataclasses.replace(self.config, **changes)
        return dataclasses.replace(self, config=config, schema=resolve_columns(self.data, config))


def open_episodes(config: DataConfig) -> EpisodeStream:
    """Opens ``config.source`` and resolves its columns; no row is read yet. Raises
    DataError (no such data, unreadable, a required column missing or of the wrong type)."""
    data = open_dataset(config.source)
    return EpisodeStream(config, data, resolve_columns(data, config))


def resolve_columns(data: Dataset, config: DataConfig) -> DataSchema:
    """The roles of ``data``'s columns as ``config`` asks; DataErrors name the source."""
    target = _reads(data, config, "target", config.target_column)
    behavior = _reads(data, config, "behavior", config.behavior_column)

    def resolve(logged_behavior: bool) -> DataSchema:
        return resolve_schema(
            data.schema,
            config.columns,
            logged_target=target,
            source=config.source,
            logged_behavior=logged_behavior,
        )

    if config.behavior_column != "if_usable":
        return resolve(behavior)
    try:
        return resolve(True)
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
