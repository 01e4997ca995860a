"""``ope convert``: any source ``ope`` reads, written as one step-layout Parquet file with
the spec's standard column names (after the column options), streamed record batch by
record batch (memory stays flat), with ``ope`` metadata in the Parquet schema: the layout,
where the data came from, and the reward range and horizon when the source declares them.

Columns that play no role keep their names (``terminations``, ``infos/...``), except those
that would read as a role's alias (``rewards`` beside ``reward``), which are reported as not
written. A probability column found beside its log is compared with it as ``ope evaluate``
compares them. The episode layout is
exploded into steps with Arrow's list kernels: list columns are flattened, per-episode
values repeated, and ``episode_id`` (the row number when absent) and ``step`` added.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
from collections.abc import Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq

import ope_cli.data.sources.remote as remote
from ope_cli import interrupts
from ope_cli._version import __version__
from ope_cli.config import BatchingConfig, ColumnMapping
from ope_cli.data.columns import ALIASES, NAMED_ONLY, DataSchema, is_list
from ope_cli.data.decode import (
    Where,
    check_twin,
    episode_ids,
    list_lengths,
    other_role,
    plain,
)
from ope_cli.data.episode_stream import DataConfig, open_episodes
from ope_cli.data.episodes import EPISODE_ROLES, twin_steps
from ope_cli.data.ids import SeenKeys, display_id, id_keys, run_starts
from ope_cli.data.sources import METADATA_KEY, Dataset
from ope_cli.errors import NO_EPISODES, DataError, UsageError, first_line, where

STANDARD = {role: names[0] for role, names in ALIASES.items()}  # role -> standard name


@dataclasses.dataclass(frozen=True)
class ConvertConfig:
    """What ``ope convert`` reads and writes.

    Attributes:
      data: the source (anything ``ope evaluate`` reads).
      out: the Parquet file to write (a local path or a URI).
      columns: the column options.
      read_rows: rows per record batch read (and per batch written, in the step layout).
      overwrite: replace ``out`` when it exists.
    """

    data: str
    out: str
    columns: ColumnMapping = ColumnMapping()
    read_rows: int = BatchingConfig.read_rows
    overwrite: bool = False


@dataclasses.dataclass(frozen=True)
class ConvertResult:
    """What was written: the source's format and layout, steps written,
    {output column: source column}, and {source column not written: why}."""

    source: str
    out: str
    format: str
    source_layout: str
    files: int
    steps: int
    columns: dict[str, str]
    metadata: dict
    dropped: dict[str, str] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _columns(data: Dataset, schema: DataSchema) -> tuple[dict[str, str], dict[str, str]]:
    """({output name: source column}, {source column not written: why}): the roles under
    their standard names, then every other column that does not read as a role's alias (a
    column read only when named, such as ``q_value``, keeps its name: it is data, whether
    or not this conversion names it). The others are reported, not dropped without a word
    (``--obs-col state`` beside a column ``observation`` lost that column silently)."""
    chosen = {STANDARD[role]: name for role, name in schema.columns.items()}
    aliases = {
        alias for role, names in ALIASES.items() if role not in NAMED_ONLY for alias in names
    }
    used = set(chosen.values())
    checked = set(schema.cross_checked.values())
    dropped = {}
    for name in data.schema.names:
        if name in used:
            continue
        if name in chosen:
            dropped[name] = f"the output's {name!r} is {chosen[name]!r}"
        elif name in checked:
            dropped[name] = "compared with the column used, which is written"
        elif name.lower() in aliases:
            dropped[name] = "its name would read as a role's column"
        else:
            chosen[name] = name
    return chosen, dropped


# The roles whose values are real numbers: a file of integers among files of fractions is
# widened to float64 there. Ids, steps, actions and observations keep the first file's
# kind (an integer column read as float64 is no longer an id, a step or a discrete value);
# floats of any column are written as wide as any file holds them
WIDENED = tuple(
    STANDARD[role]
    for role in EPISODE_ROLES
    if role not in ("action", "observation", "step") and role in STANDARD
)


def _widest_types(data: Dataset) -> pa.Schema:
    """The dataset's schema with each column as wide as any of its files holds it: a column
    of integers in one file and fractions in the next is written as float64 (cast to the
    first file's int64, 0.25 stopped convert with an internal error; evaluate reads both).
    Files whose types do not unify keep the first file's, and the read names them."""
    fragments = getattr(getattr(data, "dataset", None), "get_fragments", None)
    if fragments is None:  # one schema for every file (Minari, HDF5)
        return data.schema
    try:
        schemas = [fragment.physical_schema for fragment in fragments()]
        widest = pa.unify_schemas([data.schema, *schemas], promote_options="permissive")
    except (pa.ArrowException, OSError):
        return data.schema
    return pa.schema([widest.field(name) for name in data.schema.names])


def _value_type(dtype: pa.DataType) -> pa.DataType:
    """A list column's values' type, else the column's."""
    return dtype.value_type if is_list(dtype) else dtype


def _integers_to_floats(first: pa.DataType, widest: pa.DataType) -> bool:
    """Whether ``widest`` only turns ``first``'s integers into floats (lists alike)."""
    first, widest = _value_type(first), _value_type(widest)
    return pa.types.is_integer(first) and pa.types.is_floating(widest)


def _wider_floats(first: pa.DataType, widest: pa.DataType) -> bool:
    """Whether ``widest`` holds ``first``'s floats wider (float32 in the first file, float64
    in a later one; lists alike): written as the first file's, the later values were
    rounded without a word (a reward of 16777217 became 16777216)."""
    first, widest = _value_type(first), _value_type(widest)
    return (
        pa.types.is_floating(first)
        and pa.types.is_floating(widest)
        and widest.bit_width > first.bit_width
    )


def _with_values_of(first: pa.DataType, widest: pa.DataType) -> pa.DataType:
    """``first`` with ``widest``'s value type: a list column stays the kind of list it is."""
    if not is_list(first):
        return _value_type(widest)
    values = _value_type(widest)
    if pa.types.is_fixed_size_list(first):
        return pa.list_(values, first.list_size)
    return pa.large_list(values) if pa.types.is_large_list(first) else pa.list_(values)


def _output_schema(data: Dataset, columns: dict[str, str], layout: str) -> pa.Schema:
    fields = []
    types = _widest_types(data)
    if layout == "episode":
        if "episode_id" not in columns:
            fields.append(pa.field("episode_id", pa.int64()))
        if "step" not in columns:
            fields.append(pa.field("step", pa.int64()))
    for out, name in columns.items():
        dtype, widest = data.schema.field(name).type, types.field(name).type
        if _wider_floats(dtype, widest) or (out in WIDENED and _integers_to_floats(dtype, widest)):
            dtype = _with_values_of(dtype, widest)
        if layout == "episode" and is_list(dtype):
            dtype = dtype.value_type
        fields.append(pa.field(out, dtype))
    return pa.schema(fields)


def _metadata(config: ConvertConfig, data: Dataset, schema: DataSchema, columns) -> dict:
    declared = data.declared_bounds()
    metadata: dict = {
        "layout": "step",
        "provenance": {
            "source": config.data,
            "format": data.format,
            "layout": schema.layout,
            "files": len(data.files),
            "columns": columns,
            "written_by": f"ope {__version__}",
        },
    }
    if declared.reward_range is not None:
        metadata["reward_range"] = list(declared.reward_range)
    if declared.horizon is not None:
        metadata["horizon"] = declared.horizon
    if declared.gamma is not None:
        metadata["gamma"] = declared.gamma
    return metadata


def _explode(
    batch: pa.RecordBatch, schema: DataSchema, out_schema: pa.Schema, columns, first_row: int
) -> pa.RecordBatch:
    """One record batch of episodes (list columns) -> its steps, in ``out_schema``."""
    reward = batch.column(schema.columns["reward"])
    lengths = pc.fill_null(pc.list_value_length(reward), 0).to_numpy().astype(np.int64)
    if (lengths == 0).any():  # no steps to write: a silent drop, where evaluate refuses it
        row = int(np.flatnonzero(lengths == 0)[0])
        null = not reward.is_valid()[row].as_py() if reward.null_count else False
        episode = _episode_of_row(_ids(batch, columns), first_row, row)
        problem = (
            f"column {schema.columns['reward']!r} is null; every step needs a value"
            if null
            else "episode has no steps"
        )
        raise DataError(f"{where(None, episode)}{problem} (ope evaluate refuses it too)")
    parent = np.repeat(np.arange(batch.num_rows, dtype=np.int64), lengths)
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    arrays = {}
    if "episode_id" not in columns:
        arrays["episode_id"] = pa.array(first_row + parent)
    if "step" not in columns:
        arrays["step"] = pa.array(np.arange(parent.size, dtype=np.int64) - starts)
    for out, name in columns.items():
        values = batch.column(name)
        if is_list(values.type):
            own = pc.fill_null(pc.list_value_length(values), 0).to_numpy()
            if not np.array_equal(own, lengths):
                row = int(np.flatnonzero(own != lengths)[0])
                episode = _episode_of_row(_ids(batch, columns), first_row, row)
                unread = "" if name in schema.columns.values() else _unread_list(name)
                raise DataError(  # in evaluate's words
                    f"{where(None, episode)}list column {name!r} has {own[row]} entries but "
                    f"{schema.columns['reward']!r} has {lengths[row]}{unread}"
                )
            arrays[out] = pc.list_flatten(values)
        else:
            arrays[out] = values.take(pa.array(parent))
    return pa.RecordBatch.from_arrays(
        [_cast(arrays[f.name], columns.get(f.name, f.name), f.type) for f in out_schema],
        schema=out_schema,
    )


def _unread_list(name: str) -> str:
    """Why a list column that no role reads stops a conversion (evaluate ignores it), and
    what to do: a column of a final observation, say, has no value for every step."""
    return (
        f" (ope evaluate does not read {name!r}, but a step-layout file holds one value of "
        f"each column per step: write the data without it, e.g. pyarrow's "
        f"table.drop_columns([{name!r}]))"
    )


def _ids(batch: pa.RecordBatch, columns) -> pa.Array | None:
    return batch.column(columns["episode_id"]) if "episode_id" in columns else None


def _episode_of_row(ids: pa.Array | None, first_row: int, row: int) -> object:
    """How messages name the episode of ``row`` of an episode-layout batch whose first row
    is the file's ``first_row``: its id, or without ``ids`` its number in the file, as the
    converted file numbers it."""
    return first_row + row if ids is None else display_id(ids[row].as_py())


def _twin_values(
    batch: pa.RecordBatch, names: tuple[str, str], place: tuple, first_row: int
) -> tuple[pa.Array, pa.Array, Callable[[int], tuple]]:
    """(used, cross-checked) values of the columns ``names`` of one record batch as steps,
    and ``locate(step) -> (episode, step)`` for messages (``place``: the batch's episode
    ids and steps, None where it has none). In the episode layout the cross-checked
    values are null where ``ope evaluate`` does not compare them (``twin_steps``)."""
    used, twin = (plain(batch.column(name)) for name in names)
    if not is_list(used.type):

        def locate_step(row: int) -> tuple:
            return tuple(None if x is None else display_id(x[row].as_py()) for x in place)

        return used, twin, locate_step
    lengths = list_lengths(used)
    parent = np.repeat(np.arange(lengths.size), lengths)
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    episode = place[0]

    def locate_in_list(step: int) -> tuple:
        row = int(parent[step])
        return _episode_of_row(episode, first_row, row), step - int(starts[step])

    return pc.list_flatten(used), twin_steps(twin, lengths), locate_in_list


def _check_twins(sourced, schema: DataSchema, columns: dict[str, str], first_row: int) -> None:
    """``ope evaluate``'s comparison of a probability column with its log found beside it
    (neither named by its option), on one record batch: a DataError where they disagree.
    Without it the used one was written and the other dropped without a word, and the
    converted data evaluated to a number that the source's refusal had stood for."""
    batch = sourced.batch
    place = tuple(
        None if columns.get(name) is None else plain(batch.column(columns[name]))
        for name in ("episode_id", "step")
    )
    for role, twin_column in schema.cross_checked.items():
        used_role = other_role(role)
        used_column = schema.columns[used_role]
        names = (used_column, twin_column)
        used, twin, locate = _twin_values(batch, names, place, first_row)
        logged = np.asarray(pc.fill_null(used, 0).to_numpy(zero_copy_only=False), np.float64)
        roles = ((used_role, used_column), (role, twin_column))
        check_twin(logged, (used, twin), roles, Where(sourced.file, locate))


def _step_batches(
    data: Dataset, schema: DataSchema, out_schema: pa.Schema, columns, rows: int
) -> Iterator[pa.RecordBatch]:
    read = list(dict.fromkeys([*columns.values(), *schema.cross_checked.values()]))
    first_row = 0
    episode_layout = schema.layout == "episode"
    column = schema.columns.get("episode")  # episode rows without ids are numbered: unique
    unique = None if column is None else _UniqueEpisodes(column, every_row=episode_layout)
    for sourced in data.iter_batches(read, rows):
        batch = sourced.batch
        _check_twins(sourced, schema, columns, first_row)
        if unique is not None:
            unique.check(sourced.file, batch)
        if episode_layout:
            try:
                exploded = _explode(batch, schema, out_schema, columns, first_row)
            except DataError as error:
                raise DataError(f"{sourced.file}: {error}") from None
            first_row += batch.num_rows
            yield exploded
        else:
            try:
                arrays = [
                    _cast(batch.column(columns[f.name]), columns[f.name], f.type)
                    for f in out_schema
                ]
            except DataError as error:
                raise DataError(f"{sourced.file}: {error}") from None
            yield pa.RecordBatch.from_arrays(arrays, schema=out_schema)


def _cast(values: pa.Array, name: str, dtype: pa.DataType) -> pa.Array:
    """``values`` of source column ``name`` as the output's ``dtype``; a DataError where they do not
    fit it (fractions in a column of integer ids stopped convert with an internal error)."""
    try:
        return values.cast(dtype)
    except pa.ArrowInvalid as error:
        raise DataError(
            f"column {name!r} does not fit the output's {dtype} (the type of the first file "
            f"that holds it): {first_line(error)}"
        ) from None


class _UniqueEpisodes:
    """Each episode id must name one episode (as ``ope evaluate`` requires): the step
    layout's episodes are contiguous rows of one file, and in the episode layout
    (``every_row``: each row is an episode) no two rows share an id. Written one after the
    other, an episode split over files or rows, or two rows of one id, would be joined
    into one without a word. A DataError (evaluate's) names the first that is not."""

    def __init__(self, column: str, every_row: bool = False):
        self.column = column
        self.every_row = every_row
        self.seen = SeenKeys()
        self.last: tuple | None = None  # (file, key, id) the previous batch ended in

    def check(self, file: str, batch: pa.RecordBatch) -> None:
        ids = episode_ids(plain(batch.column(self.column)), self.column, file)
        if not len(ids):
            return
        keys, values = id_keys(ids), ids.to_numpy(zero_copy_only=False)
        if self.every_row:
            starts = np.arange(len(ids))
        else:
            starts = run_starts(keys, values)
            if self.last == (file, keys[0], values[0]):  # the last batch's last episode goes on
                starts = starts[1:]
        if values.dtype.kind in "iu":  # as they are: their type tells -1 from 2**64 - 1
            shown = values[starts]
        else:
            shown = np.array([display_id(x) for x in ids.take(pa.array(starts)).to_pylist()])
        self.seen.add(file, keys[starts], shown)
        self.last = (file, int(keys[-1]), values[-1])


PARQUET_SUFFIXES = (".parquet", ".parq", ".pq")


def _exists(out: str, data: str) -> str:
    """The refusal of an existing local ``out``; where DATA is a file beside it of the
    same suffix, as an unquoted glob of two files gives (the shell makes the second OUT,
    which --overwrite would replace with a copy of the first), the glob comes first."""
    beside = os.path.isfile(data) and os.path.dirname(os.path.abspath(data)) == (
        os.path.dirname(os.path.abspath(out))
    )
    suffix = os.path.splitext(out)[1]
    if beside and os.path.splitext(data)[1] == suffix and not os.path.samefile(data, out):
        pattern = shlex.quote(f"{os.path.dirname(data) or '.'}/*{suffix}")
        return (
            f"{out}: already exists, beside DATA {data}: if the shell expanded an unquoted "
            f"glob into both, quote it ({pattern}) and name OUT after it; to replace this "
            "file, pass --overwrite"
        )
    return f"{out}: already exists (pass --overwrite to replace it)"


class _Target:
    """Where the Parquet file is written: a temporary name beside a local ``out``, renamed
    when complete, or the object at a URI itself (a multipart upload: any size, where a
    move is one copy of at most 5 GiB on S3), deleted when the conversion fails. Either
    way a failed conversion leaves no partial file (at an s3:// URI it left a truncated,
    valid one), and an existing one needs --overwrite (at a URI it was replaced)."""

    def __init__(self, out: str, overwrite: bool, data: str = ""):
        self.out = out
        self.filesystem = None
        if not out.lower().endswith(PARQUET_SUFFIXES):  # out.csv held Parquet, without a word
            raise UsageError(f"{out}: name a Parquet file ({', '.join(PARQUET_SUFFIXES)})")
        local = remote.on_disk(out)
        if local is None:
            location = remote.locate(out, UsageError)
            self.filesystem, self.path = location.filesystem, location.path
            try:
                found = self.filesystem.get_file_info(self.path).type
            except (OSError, pa.ArrowException) as error:
                raise UsageError(f"{out}: cannot write: {first_line(error)}") from None
            if found == pafs.FileType.Directory:
                raise UsageError(f"{out}: is a directory; name the Parquet file to write")
            if found == pafs.FileType.File and not overwrite:
                raise UsageError(f"{out}: already exists (pass --overwrite to replace it)")
        else:
            out = local
            self.final = out
            self.path = f"{out}.partial-{os.getpid()}"
            if os.path.isdir(out):
                raise UsageError(f"{out}: is a directory; name the Parquet file to write")
            parent = os.path.dirname(os.path.abspath(out))
            if not os.path.isdir(parent):
                raise UsageError(f"{out}: cannot write: directory {parent} does not exist")
            if os.path.exists(out) and not overwrite:
                raise UsageError(_exists(out, data))

    def writer(self, schema: pa.Schema) -> pq.ParquetWriter:
        try:
            return pq.ParquetWriter(
                self.path, schema, filesystem=self.filesystem, compression="zstd"
            )
        except (OSError, pa.ArrowException) as error:
            raise UsageError(f"{self.out}: cannot write: {first_line(error)}") from None

    def commit(self) -> None:
        if self.filesystem is None:
            os.replace(self.path, self.final)

    def abandon(self) -> None:
        if self.filesystem is None:
            if os.path.exists(self.path):
                os.remove(self.path)
            return
        with contextlib.suppress(OSError, pa.ArrowException):  # none, if none was written
            self.filesystem.delete_file(self.path)


def convert(config: ConvertConfig) -> ConvertResult:
    """Writes ``config.data`` as step-layout Parquet at ``config.out``; raises DataError
    (unreadable or invalid source) or UsageError (bad options, unwritable output)."""
    episodes = open_episodes(
        DataConfig(
            config.data,
            config.columns,
            config.read_rows,
            target_column="if_present",
            behavior_column="if_present",
        )
    )
    data, schema = episodes.data, episodes.schema
    columns, dropped = _columns(data, schema)
    metadata = _metadata(config, data, schema, columns)
    out_schema = _output_schema(data, columns, schema.layout).with_metadata(
        {METADATA_KEY: json.dumps(metadata)}
    )
    target = _Target(config.out, config.overwrite, config.data)
    steps = 0
    writer = target.writer(out_schema)
    try:
        for batch in _step_batches(data, schema, out_schema, columns, config.read_rows):
            writer.write_batch(batch)
            steps += batch.num_rows
        if steps == 0:  # as evaluate refuses it, rather than an empty file that it refuses
            raise DataError(f"{config.data}: {NO_EPISODES}")
        writer.close()
        with interrupts.held():  # a rename, whole or not at all; an interrupt lost before it
            target.commit()
    except BaseException:
        writer.close()
        target.abandon()
        raise
    return ConvertResult(
        source=config.data,
        out=config.out,
        format=data.format,
        source_layout=schema.layout,
        files=len(data.files),
        steps=steps,
        columns=columns,
        metadata=metadata,
        dropped=dropped,
    )
