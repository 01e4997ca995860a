"""The one entry to the data (ope_cli/data/episode_stream.py): open_episodes and EpisodeStream."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasets import random_episodes, write_step_layout

from ope_cli.config import ColumnMapping
from ope_cli.data.columns import resolve_schema
from ope_cli.data.episode_stream import DataConfig, open_episodes
from ope_cli.data.episodes import EpisodeAssembler
from ope_cli.data.sources import iter_batches, open_dataset
from ope_cli.data.validate import Check
from ope_cli.errors import DataError


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    """Two files of logged episodes, and a copy without the propensity column."""
    root = tmp_path_factory.mktemp("episode_stream")
    episodes = random_episodes(np.random.default_rng(3), 40, median_length=6, max_length=30)
    path = write_step_layout(episodes, root / "logs", n_files=2)
    table = pq.read_table(path / "part-00000.parquet")
    pq.write_table(table.drop_columns(["behavior_prob"]), root / "no_propensity.parquet")
    return path, root / "no_propensity.parquet"


def test_every_iteration_is_one_pass_of_the_assembled_episodes(logs):
    """Iterating the stream gives what the assembler gives over the record batches, and
    iterating it again reads the data again."""
    path, _ = logs
    stream = open_episodes(DataConfig(str(path), read_rows=7))
    data = open_dataset(str(path))
    schema = resolve_schema(data.schema, ColumnMapping(), logged_target=False)
    expected = list(EpisodeAssembler(schema).chunks(iter_batches(data, schema.read_columns, 7)))
    for _ in range(2):
        chunks = list(stream)
        assert [c.num_episodes for c in chunks] == [c.num_episodes for c in expected]
        for got, want in zip(chunks, expected, strict=True):
            np.testing.assert_array_equal(got.keys, want.keys)
            np.testing.assert_array_equal(got.reward, want.reward)
            np.testing.assert_array_equal(got.log_behavior, want.log_behavior)


def test_restrict_and_checks(logs):
    """A stream over some files reads only those; chunk checks join the validation."""
    path, _ = logs
    stream = open_episodes(DataConfig(str(path), on_invalid="drop"))
    first = stream.restrict(stream.data.files[:1])
    assert {c.file for c in first} == {stream.data.files[0]}
    total = sum(c.num_episodes for c in stream)

    def long_episodes(chunk):
        yield Check("action_out_of_range", "too long", np.repeat(chunk.lengths > 5, chunk.lengths))

    checked = stream.with_checks(long_episodes)
    kept = list(checked)
    assert sum(c.num_episodes for c in kept) < total
    assert all(int(c.lengths.max()) <= 5 for c in kept)


def test_the_propensity_column_as_asked(logs):
    """required: a DataError naming the source without one; if_present and if_usable: read
    when there; unread: never read."""
    path, missing = logs
    with pytest.raises(DataError, match=rf"^{missing}: no behavior probability column"):
        open_episodes(DataConfig(str(missing)))
    for use in ("if_present", "if_usable", "unread"):
        schema = open_episodes(DataConfig(str(missing), behavior_column=use)).schema
        assert not schema.behavior_logged
    for use, logged in (("if_present", True), ("if_usable", True), ("unread", False)):
        schema = open_episodes(DataConfig(str(path), behavior_column=use)).schema
        assert schema.behavior_logged is logged
        assert ("behavior_prob" in schema.columns) is logged


def test_reconfigured_resolves_the_columns_again(logs):
    path, _ = logs
    stream = open_episodes(DataConfig(str(path), behavior_column="unread"))
    assert not stream.schema.behavior_logged
    again = stream.reconfigured(behavior_column="required")
    # the same opened data (its files compared for the roles now read)
    assert again.data.dataset is stream.data.dataset and again.schema.behavior_logged


@pytest.mark.parametrize(
    ("column", "shift", "words"),
    [
        ("action", 0.0, None),
        ("action", 0.9, r"episode .*column 'action' holds \d\.9 where whole numbers"),
        ("episode_id", 0.0, None),
        ("episode_id", 0.25, r"column 'episode_id' holds \d+\.25 where whole numbers"),
    ],
)
def test_a_later_file_of_floats_for_integers_is_read_whole_or_refused(
    logs, tmp_path, column, shift, words
):
    """The dataset's first file holds integer actions and ids; a later file's floats are
    read when each is whole and refused otherwise: actions 0.9 were truncated to 0, and
    ids 2.25 and 2.75 both cast to 2 (one episode of two), without a word."""
    path, _ = logs
    for name in ("part-00000.parquet", "part-00001.parquet"):
        table = pq.read_table(path / name)
        if name.endswith("1.parquet"):
            values = table.column(column).to_numpy().astype(np.float64) + shift
            table = table.set_column(table.schema.get_field_index(column), column, [values])
        pq.write_table(table, tmp_path / name)
    mixed = open_episodes(DataConfig(str(tmp_path)))
    if words is not None:
        with pytest.raises(DataError, match="part-00001.parquet: " + words):
            list(mixed)
        return
    for got, want in zip(mixed, open_episodes(DataConfig(str(path))), strict=True):
        for field in ("action", "keys", "lengths"):
            np.testing.assert_array_equal(getattr(got, field), getattr(want, field))


@pytest.mark.parametrize("read_rows", [1, 2, 3, 1000])
def test_two_string_ids_of_one_key_are_never_one_episode(tmp_path, read_rows):
    """Two adjacent episodes whose string ids share a 64-bit key were assembled as one
    (a wrong estimate, exit 0); now they are two ids, and the second, whose key was seen,
    is refused as a reappearing id rather than merged."""
    from test_ids import colliding_ids

    first, second = colliding_ids()
    table = pa.table(
        {
            "episode_id": [first, first, second, second],
            "observation": [0.0, 1.0, 0.0, 1.0],
            "action": [0, 0, 1, 1],
            "reward": [1.0, 1.0, 0.0, 0.0],
            "behavior_prob": [0.5] * 4,
        }
    )
    pq.write_table(table, tmp_path / "logs.parquet")
    with pytest.raises(DataError, match="appears in more than one place"):
        list(open_episodes(DataConfig(str(tmp_path / "logs.parquet"), read_rows=read_rows)))


def _vector_logs(path, widths: list[int], first_id: int = 0) -> None:
    """One-step episodes whose observations have the given lengths, in order."""
    n = len(widths)
    table = pa.table(
        {
            "episode_id": np.arange(first_id, first_id + n),
            "step": np.zeros(n, np.int64),
            "observation": pa.array([[0.5] * w for w in widths], pa.list_(pa.float64())),
            "action": np.zeros(n, np.int64),
            "reward": np.ones(n),
            "behavior_prob": np.full(n, 0.5),
        }
    )
    pq.write_table(table, path)


def test_vector_widths_are_the_whole_datas_in_every_share_of_its_files(tmp_path):
    """The width observations are judged against is the usual one of the data's first
    rows in file order, not of the first ones a process or a record batch reads: a
    process given only the second file (all of width 2) still judges them by 3, and a few
    odd first rows do not decide it."""
    _vector_logs(tmp_path / "a.parquet", [2] * 5 + [3] * 300)
    _vector_logs(tmp_path / "b.parquet", [2] * 50, first_id=1000)
    stream = open_episodes(DataConfig(str(tmp_path)))
    assert stream.widths == {"observation": 3}
    (second,) = [f for f in stream.data.files if f.endswith("b.parquet")]
    share = stream.restrict((second,))
    assert share.widths == {"observation": 3}
    assert share.assembler().converter.dims["observation"] == 3
    alone = open_episodes(DataConfig(str(tmp_path / "b.parquet")))
    assert alone.widths == {"observation": 2}


def test_vector_widths_are_read_once_and_kept_by_reconfigured(tmp_path, monkeypatch):
    from ope_cli.data import episode_stream

    _vector_logs(tmp_path / "a.parquet", [3] * 30)
    lookups = []
    lookup = episode_stream.vector_widths
    monkeypatch.setattr(episode_stream, "vector_widths", lambda *a: lookups.append(1) or lookup(*a))
    stream = open_episodes(DataConfig(str(tmp_path)))
    checked = stream.with_checks(None)  # a copy for each pass: the widths come along
    stream.assembler(), checked.assembler(), list(stream), list(checked)
    share = checked.restrict(stream.data.files)
    again = stream.reconfigured(read_rows=7)  # the same vector columns: the same widths
    assert share.widths == again.widths == checked.widths == {"observation": 3}
    assert len(lookups) == 1


def test_vector_widths_of_the_episode_layout_count_steps(tmp_path):
    """In the episode layout a row holds an episode's list of step vectors: the usual
    length is over the steps (a first episode of a few odd steps does not decide it)."""
    from datasets import episode_layout_table

    rng = np.random.default_rng(5)
    episodes = random_episodes(rng, 30, median_length=12, max_length=40)
    table = episode_layout_table(episodes)
    index = table.column_names.index("observations")
    observations = table.column("observations").to_pylist()
    observations[0] = [step[:-1] for step in observations[0][:3]] + observations[0][3:]
    table = table.set_column(
        index, "observations", pa.array(observations, pa.list_(pa.list_(pa.float64())))
    )
    pq.write_table(table, tmp_path / "episodes.parquet")
    stream = open_episodes(DataConfig(str(tmp_path / "episodes.parquet")))
    assert stream.schema.layout == "episode"
    width = len(episodes[0]["observation"][0])
    assert stream.widths == {"observation": width}


@pytest.mark.parametrize("suffix", ["parquet", "arrow"])
def test_rows_without_ids_keep_their_global_numbers_in_every_share(tmp_path, suffix):
    """Episode layout without an id column: an episode's id is its row number in the
    whole data. A process given the later files numbered its rows from 0, so two processes
    refused valid data (their ids collided), and a share's episodes would have taken other
    ids (other resampling groups and bootstrap streams) than in one process. Arrow IPC
    files have no cheap row count: their rows are counted by reading one column."""
    from datasets import episode_layout_table
    from pyarrow import feather

    episodes = random_episodes(np.random.default_rng(8), 30, median_length=5, max_length=12)
    table = episode_layout_table(episodes).drop_columns(["episode_id"])
    for index, rows in enumerate(((0, 7), (7, 19), (19, 30))):
        part = table.slice(rows[0], rows[1] - rows[0])
        path = tmp_path / f"part-{index}.{suffix}"
        pq.write_table(part, path) if suffix == "parquet" else feather.write_feather(part, path)
    stream = open_episodes(DataConfig(str(tmp_path)))
    assert "episode" not in stream.schema.columns
    whole = np.concatenate([chunk.ids for chunk in stream])
    np.testing.assert_array_equal(whole, np.arange(30))
    for files, first in ((stream.data.files[1:], 7), (stream.data.files[2:], 19)):
        share = stream.restrict(files)
        ids = np.concatenate([chunk.ids for chunk in share])
        np.testing.assert_array_equal(ids, np.arange(first, 30))


def test_a_share_counts_the_rows_before_it_only_when_it_is_read(tmp_path):
    """inspect re-restricts the files left after a damaged one: counting the rows before
    them there read the damaged file again, and its error escaped the report."""
    from datasets import episode_layout_table

    episodes = random_episodes(np.random.default_rng(9), 12, median_length=4, max_length=8)
    table = episode_layout_table(episodes).drop_columns(["episode_id"])
    for index in range(3):
        pq.write_table(table.slice(4 * index, 4), tmp_path / f"part-{index}.parquet")
    (tmp_path / "part-1.parquet").write_bytes(b"PAR1 not a parquet file PAR1")
    stream = open_episodes(DataConfig(str(tmp_path)))
    share = stream.restrict(stream.data.files[2:])  # no reading here
    with pytest.raises(DataError):
        share.first_row  # noqa: B018 - the damaged file is read when a count is needed


@pytest.mark.parametrize(
    ("extra", "options", "words"),
    [
        # a later file's 'step' went unread: its shuffled rows were taken in file order
        ("step", {}, "part-00001.parquet: its column(s) 'step' could be the step, where the"),
        # a column no role of the run reads, or a role named by its option: read as before
        ("target_prob", {}, None),
        ("rewards", {"columns": ColumnMapping(reward="reward")}, None),
        ("pscore", {"behavior_column": "unread"}, None),
        # a later file's log beside the probability would have been compared, had the first
        # file had it: read without a word, a log of another value passed
        ("behavior_log_prob", {}, "could be the behavior log-probability, where the dataset's"),
    ],
)
def test_every_file_gives_the_roles_read_the_first_file_s_columns(tmp_path, extra, options, words):
    episodes = random_episodes(np.random.default_rng(5), 12, median_length=4, max_length=9)
    path = write_step_layout(episodes, tmp_path / "logs", n_files=2)
    files = sorted(path.glob("*.parquet"))
    first = pq.read_table(files[0])
    if "step" in first.column_names:
        pq.write_table(first.drop_columns(["step"]), files[0])
    later = pq.read_table(files[1])
    if extra not in later.column_names:
        values = later.column("step") if extra == "step" else pa.array(np.full(later.num_rows, 0.5))
        later = later.append_column(extra, values)
    pq.write_table(later.drop_columns(["step"]) if extra != "step" else later, files[1])
    stream = open_episodes(DataConfig(str(path), **options))
    if words is None:
        assert sum(chunk.num_episodes for chunk in stream) == 12
        return
    with pytest.raises(DataError, match=re.escape(words)):
        list(stream)


def test_an_ambiguous_behavior_column_is_said_where_it_is_read_if_usable(tmp_path):
    """fit-behavior reads the logged column where it is usable, to compare with the fit:
    two candidates dropped the comparison without a word; they are refused as elsewhere."""
    episodes = random_episodes(np.random.default_rng(6), 8, median_length=4, max_length=9)
    path = write_step_layout(episodes, tmp_path / "logs.parquet")
    table = pq.read_table(path)
    pq.write_table(table.append_column("pscore", table.column("behavior_prob")), path)
    with pytest.raises(DataError, match="could each be the behavior probability"):
        open_episodes(DataConfig(str(path), behavior_column="if_usable"))
