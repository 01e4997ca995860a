"""Files, directories and globs -> ordered, projected record batches (ope_cli/data/sources)."""

from __future__ import annotations

import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest

from ope_cli.data.sources import iter_batches, open_dataset, prefetched
from ope_cli.errors import DataError


def table(start: int, stop: int) -> pa.Table:
    ids = np.arange(start, stop, dtype=np.int64)
    return pa.table({"episode_id": ids, "reward": ids.astype(np.float64) / 10, "extra": ids * 2})


def read_ids(data, rows: int = 1000) -> list[int]:
    return [
        i for b in iter_batches(data, ["episode_id"], rows) for i in b.batch.column(0).to_pylist()
    ]


# ------------------------------------------------------------------------------ sources


def test_single_parquet_file(tmp_path):
    path = tmp_path / "logs.parquet"
    pq.write_table(table(0, 25), path)
    data = open_dataset(str(path))
    assert data.format == "parquet"
    assert data.files == (str(path),)
    assert data.schema.names == ["episode_id", "reward", "extra"]
    assert data.count_rows() == 25
    assert read_ids(data) == list(range(25))


def test_feather_file(tmp_path):
    path = tmp_path / "logs.feather"
    feather.write_feather(table(0, 25), path, chunksize=10)
    data = open_dataset(str(path))
    assert data.format == "ipc"
    assert read_ids(data, rows=4) == list(range(25))


def test_arrow_ipc_file_with_other_suffix(tmp_path):
    path = tmp_path / "logs.arrow"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table(0, 5).schema) as writer:
        writer.write_table(table(0, 5))
    data = open_dataset(str(path))
    assert data.format == "ipc"
    assert read_ids(data) == list(range(5))


def test_directory_reads_files_in_sorted_order_and_skips_metadata(tmp_path):
    # written out of order, so that creation order differs from name order
    pq.write_table(table(20, 30), tmp_path / "part-2.parquet")
    pq.write_table(table(0, 10), tmp_path / "part-0.parquet")
    pq.write_table(table(10, 20), tmp_path / "part-1.parquet")
    pq.write_table(table(100, 110), tmp_path / ".hidden.parquet")
    pq.write_table(table(200, 210), tmp_path / "_temporary.parquet")
    (tmp_path / "_SUCCESS").write_bytes(b"")
    (tmp_path / ".part-0.parquet.crc").write_bytes(b"not parquet")
    hidden_dir = tmp_path / "_logs"
    hidden_dir.mkdir()
    pq.write_table(table(300, 310), hidden_dir / "x.parquet")
    data = open_dataset(str(tmp_path))
    assert [os.path.basename(f) for f in data.files] == [
        "part-0.parquet",
        "part-1.parquet",
        "part-2.parquet",
    ]
    assert read_ids(data, rows=3) == list(range(30))
    assert data.count_rows() == 30
    assert [b.file for b in iter_batches(data, ["episode_id"], 100)] == list(data.files)


def test_nested_directories_are_sorted_by_full_path(tmp_path):
    for name, (lo, hi) in {
        "b/x.parquet": (10, 20),
        "a/y.parquet": (0, 10),
        "c.parquet": (20, 25),
    }.items():
        (tmp_path / name).parent.mkdir(exist_ok=True)
        pq.write_table(table(lo, hi), tmp_path / name)
    data = open_dataset(str(tmp_path))
    assert read_ids(data) == list(range(25))


def test_hive_partitioned_directory(tmp_path):
    for day, (lo, hi) in {"2024-01-02": (10, 30), "2024-01-01": (0, 10)}.items():
        part = tmp_path / f"day={day}"
        part.mkdir()
        pq.write_table(table(lo, hi), part / "data.parquet")
    data = open_dataset(str(tmp_path))
    assert "day" in data.schema.names
    assert read_ids(data, rows=7) == list(range(30))
    days = [
        d
        for b in iter_batches(data, ["episode_id", "day"], 7)
        for d in b.batch.column(1).to_pylist()
    ]
    assert days == ["2024-01-01"] * 10 + ["2024-01-02"] * 20


def test_a_file_of_a_directory_without_a_column_of_the_first_is_named(tmp_path):
    """A directory (read with hive partitioning in mind) whose second file names its
    columns otherwise: each of its rows was read with nulls for the first file's names,
    and the run refused "column 'episode_id' is null" and suggested --on-invalid drop."""
    pq.write_table(table(0, 5), tmp_path / "a.parquet")
    pq.write_table(
        table(5, 9).rename_columns(["id", *table(5, 9).column_names[1:]]), tmp_path / "b.parquet"
    )
    data = open_dataset(str(tmp_path))
    with pytest.raises(DataError) as info:
        list(iter_batches(data, ["episode_id"], 100))
    message = str(info.value)
    first = tmp_path / "a.parquet"
    assert (
        f"b.parquet: has no column 'episode_id', which the dataset's first file ({first}) has"
        in message
    )
    assert "(this file's columns: id," in message


def test_a_column_missing_from_the_first_of_several_files_names_that_file(tmp_path):
    """Only the second file has target_prob: the run, without --policy, said "the data has
    no target_prob or target_log_prob column", of data that has one. The refusal now names
    the first file, whose columns the dataset's are."""
    from ope_cli.data.episode_stream import DataConfig, resolve_columns

    logged = {"action": np.zeros(4, np.int64), "behavior_prob": np.full(4, 0.5)}
    pq.write_table(pa.table({**table(0, 4).to_pydict(), **logged}), tmp_path / "a.parquet")
    later = {**table(4, 8).to_pydict(), **logged, "target_prob": np.full(4, 0.5)}
    pq.write_table(pa.table(later), tmp_path / "b.parquet")
    config = DataConfig(str(tmp_path), target_column="required")
    with pytest.raises(DataError) as info:
        resolve_columns(open_dataset(str(tmp_path)), config)
    assert "has no target_prob or target_log_prob column" in str(info.value)
    assert str(info.value).endswith(
        f"(the columns of a dataset of several files are its first file's: "
        f"{tmp_path / 'a.parquet'}; every file names them alike)"
    )
    with pytest.raises(DataError) as one:  # one file: as it was
        resolve_columns(open_dataset(str(tmp_path / "a.parquet")), config)
    assert "first file" not in str(one.value)


def test_a_later_file_whose_columns_give_a_role_otherwise_is_named(tmp_path):
    """Roles are found in the first file: a later file's 'step' column (its rows shuffled
    within episodes, which 'step' sorts) was never read, and PDIS came out -1.21 for
    -1.56 without a word. A later file whose columns would give a compared role other
    columns than the first file's is refused; roles not compared, and other extra
    columns, pass."""
    pq.write_table(table(0, 5), tmp_path / "a.parquet")
    step = pa.array(np.zeros(4, np.int64))
    pq.write_table(table(5, 9).append_column("Step", step), tmp_path / "b.parquet")
    pq.write_table(table(9, 12).append_column("note", pa.array(["x"] * 3)), tmp_path / "c.parquet")
    with pytest.raises(DataError) as info:
        list(iter_batches(open_dataset(str(tmp_path)).comparing(("step",)), ["episode_id"], 100))
    message = str(info.value)
    assert "b.parquet: its column(s) 'Step' could be the step, where the dataset's first" in message
    assert "\n" not in message
    # the run reads no step (named otherwise, say): not compared, read as before
    assert read_ids(open_dataset(str(tmp_path)).comparing(("reward",))) == list(range(12))


def test_hive_folders_named_after_a_column_of_the_files_are_said_in_words(tmp_path):
    """pyarrow's own "Unable to merge: Field episode_id has incompatible types" was all the
    message said."""
    for key, (lo, hi) in {"1": (0, 5), "2": (5, 9)}.items():
        (tmp_path / f"episode_id={key}").mkdir()
        pq.write_table(table(lo, hi), tmp_path / f"episode_id={key}" / "x.parquet")
    with pytest.raises(DataError) as info:
        open_dataset(str(tmp_path))
    assert "the folders' names (episode_id=...) make a column 'episode_id'" in str(info.value)
    assert "Unable to merge" not in str(info.value)


def test_hive_folders_named_after_a_column_of_the_files_of_its_type_are_refused(tmp_path):
    """A folder key that names a column the files hold, of the same type: pyarrow read the
    folder's value or the file's by which other columns were read (a file's episode ids 5,
    5, 6 under episode_id=0/ came back as 0, 0, 0 beside a column only the folders hold)."""
    for key, (lo, hi) in {"a": (0, 5), "b": (5, 9)}.items():
        (tmp_path / f"tag={key}").mkdir()
        files = table(lo, hi).append_column("tag", pa.array([f"own{i}" for i in range(lo, hi)]))
        pq.write_table(files, tmp_path / f"tag={key}" / "x.parquet")
    data = open_dataset(str(tmp_path))
    with pytest.raises(DataError) as info:
        list(iter_batches(data, ["episode_id", "tag"], 100))
    message = str(info.value)
    assert "x.parquet: the folders' names (tag=...) make a column 'tag' that the file also" in (
        message
    )
    assert read_ids(data) == list(range(9))  # a run that does not read it is not refused


def test_folders_above_the_dataset_are_not_partition_keys(tmp_path):
    """Only the folders below the dataset's directory are hive keys: a file under
    ``extra=old/`` (above it) with a column 'extra' was refused as a key and a column at
    once, whether named as the file, its folder or a glob."""
    above = tmp_path / "extra=old"
    above.mkdir()
    pq.write_table(table(0, 6), above / "logs.parquet")
    for source in (above / "logs.parquet", above, above / "*.parquet"):
        data = open_dataset(str(source))
        extras = [
            x for b in iter_batches(data, ["extra"], 4) for x in b.batch.column(0).to_pylist()
        ]
        assert extras == [2 * i for i in range(6)], source


def test_glob(tmp_path):
    pq.write_table(table(5, 10), tmp_path / "b.parquet")
    pq.write_table(table(0, 5), tmp_path / "a.parquet")
    (tmp_path / "notes.txt").write_text("not data")
    data = open_dataset(str(tmp_path / "*.parquet"))
    assert [os.path.basename(f) for f in data.files] == ["a.parquet", "b.parquet"]
    assert read_ids(data) == list(range(10))


def test_glob_matching_nothing(tmp_path):
    with pytest.raises(DataError, match="no files match"):
        open_dataset(str(tmp_path / "*.parquet"))


def test_nonexistent_path(tmp_path):
    missing = str(tmp_path / "missing.parquet")
    with pytest.raises(DataError) as info:
        open_dataset(missing)
    assert missing in str(info.value)
    assert "no such file" in str(info.value)


def test_an_empty_path_is_refused_rather_than_read_as_the_working_directory(monkeypatch, tmp_path):
    """Path("") is "."; an empty DATA (an unset shell variable) read the working folder's
    files, and failed on the first that was not data (./LICENSE: not a Parquet file)."""
    (tmp_path / "LICENSE").write_text("not data")
    monkeypatch.chdir(tmp_path)
    for empty in ("", "file://"):
        with pytest.raises(
            DataError, match=r'^the data path is empty \(the working directory is "\."\)$'
        ):
            open_dataset(empty)


def test_empty_directory(tmp_path):
    with pytest.raises(DataError, match="no data files"):
        open_dataset(str(tmp_path))


def test_directory_with_only_metadata_files(tmp_path):
    (tmp_path / "_SUCCESS").write_bytes(b"")
    with pytest.raises(DataError, match="no data files"):
        open_dataset(str(tmp_path))


def test_not_a_parquet_file(tmp_path):
    path = tmp_path / "logs.parquet"
    path.write_text("episode_id,reward\n1,2.0\n")
    with pytest.raises(DataError) as info:
        open_dataset(str(path))
    assert str(path) in str(info.value)
    assert "not a Parquet, Arrow IPC/Feather or HDF5" in str(info.value)


def test_empty_file(tmp_path):
    path = tmp_path / "logs.parquet"
    path.write_bytes(b"")
    with pytest.raises(DataError) as info:
        open_dataset(str(path))
    assert str(path) in str(info.value)
    assert "empty" in str(info.value)


def test_truncated_parquet_file(tmp_path):
    path = tmp_path / "logs.parquet"
    pq.write_table(table(0, 100), path)
    path.write_bytes(path.read_bytes()[:60])
    with pytest.raises(DataError) as info:
        data = open_dataset(str(path))
        list(iter_batches(data, ["episode_id"], 10))
    assert str(path) in str(info.value)


def test_mixed_formats_in_directory(tmp_path):
    pq.write_table(table(0, 5), tmp_path / "a.parquet")
    feather.write_feather(table(5, 10), tmp_path / "b.feather")
    with pytest.raises(DataError, match="mixes"):
        open_dataset(str(tmp_path))


# ------------------------------------------------------------------------------ batches


@pytest.mark.parametrize("file_format", ["parquet", "feather"])
@pytest.mark.parametrize("rows", [1, 2, 3, 7, 10, 1000])
def test_iter_batches_sizes_and_last_in_file(tmp_path, file_format, rows):
    sizes = [10, 0, 1, 23]
    start = 0
    for k, size in enumerate(sizes):
        path = tmp_path / f"part-{k}.{file_format}"
        if file_format == "parquet":
            pq.write_table(table(start, start + size), path, row_group_size=4)
        else:
            feather.write_feather(table(start, start + size), path, chunksize=4)
        start += size
    data = open_dataset(str(tmp_path))
    batches = list(iter_batches(data, ["reward", "episode_id"], rows))

    for b in batches:
        assert b.batch.num_rows <= rows
        assert b.batch.schema.names == ["reward", "episode_id"]  # projected, in the order asked
    # batches come file by file; exactly each file's final batch is marked
    files = [b.file for b in batches]
    assert files == sorted(files)
    assert sorted(set(files)) == list(data.files)
    for file, size in zip(data.files, sizes, strict=True):
        mine = [b for b in batches if b.file == file]
        assert [b.last_in_file for b in mine] == [False] * (len(mine) - 1) + [True]
        assert sum(b.batch.num_rows for b in mine) == size
    ids = [i for b in batches for i in b.batch.column("episode_id").to_pylist()]
    assert ids == list(range(sum(sizes)))


def test_zero_row_file_still_yields_its_end(tmp_path):
    path = tmp_path / "empty.parquet"
    pq.write_table(table(0, 0), path)
    data = open_dataset(str(path))
    batches = list(iter_batches(data, ["episode_id", "reward"], 5))
    assert len(batches) == 1
    (only,) = batches
    assert only.last_in_file is True
    assert only.batch.num_rows == 0
    assert only.batch.schema.names == ["episode_id", "reward"]
    assert only.file == str(path)


def test_count_rows(tmp_path):
    pq.write_table(table(0, 12), tmp_path / "a.parquet", row_group_size=5)
    pq.write_table(table(12, 13), tmp_path / "b.parquet")
    pq.write_table(table(0, 0), tmp_path / "c.parquet")
    assert open_dataset(str(tmp_path)).count_rows() == 13
    feather.write_feather(table(0, 3), tmp_path / "x.feather")
    assert open_dataset(str(tmp_path / "x.feather")).count_rows() is None


def test_prefetched_keeps_order_and_reraises_in_place():
    assert list(prefetched(iter(range(100)), depth=3)) == list(range(100))

    def failing():
        yield 1
        yield 2
        raise DataError("broken file")

    seen = []
    with pytest.raises(DataError, match="broken file"):
        for item in prefetched(failing()):
            seen.append(item)
    assert seen == [1, 2]


def test_prefetched_stops_its_thread_when_the_consumer_stops():
    import threading

    produced, closed = [], []

    def endless():
        i = 0
        try:
            while True:
                produced.append(i)
                yield i
                i += 1
        finally:
            closed.append(threading.current_thread().name)

    reading = prefetched(endless(), depth=2)
    assert [next(reading) for _ in range(5)] == [0, 1, 2, 3, 4]
    reading.close()
    assert not any(t.name == "ope-prefetch" and t.is_alive() for t in threading.enumerate())
    assert len(produced) <= 5 + 2 + 1  # at most depth items (and the one being put) ahead
    assert closed == ["ope-prefetch"]  # the source's cleanup ran, on the reading thread


# ------------------------------------------------------------------- provenance, registry


@pytest.mark.parametrize("file_format", ["parquet", "feather"])
def test_each_batch_knows_its_row_offset_in_its_file(tmp_path, file_format):
    for k, (start, stop) in enumerate([(0, 10), (10, 17)]):
        path = tmp_path / f"part-{k}.{file_format}"
        if file_format == "parquet":
            pq.write_table(table(start, stop), path, row_group_size=4)
        else:
            feather.write_feather(table(start, stop), path, chunksize=4)
    data = open_dataset(str(tmp_path))
    for file in data.files:
        mine = [b for b in iter_batches(data, ["episode_id"], 3) if b.file == file]
        offsets = [b.row_offset for b in mine]
        sizes = [b.batch.num_rows for b in mine]
        assert offsets == list(np.cumsum([0, *sizes[:-1]]))
        first_id = mine[0].batch.column(0)[0].as_py()
        for b in mine:  # the row of the file each batch starts at
            if b.batch.num_rows:
                assert b.batch.column(0)[0].as_py() == first_id + b.row_offset


def test_the_registry_picks_the_format_by_magic_bytes(tmp_path):
    from ope_cli.data.sources import FORMATS, d4rl, ipc, parquet, sniff_format

    assert FORMATS == (parquet, ipc, d4rl)
    pq.write_table(table(0, 2), tmp_path / "a.data")
    feather.write_feather(table(0, 2), tmp_path / "b.data")
    assert sniff_format(str(tmp_path / "a.data")) is parquet
    assert sniff_format(str(tmp_path / "b.data")) is ipc


def test_restrict_keeps_the_schema_and_reads_only_its_files(tmp_path):
    for k, (start, stop) in enumerate([(0, 4), (4, 9), (9, 12)]):
        pq.write_table(table(start, stop), tmp_path / f"part-{k}.parquet")
    data = open_dataset(str(tmp_path))
    share = data.restrict(data.files[1:])
    assert share.files == data.files[1:]
    assert share.schema == data.schema
    assert share.count_rows() == 8
    assert read_ids(share) == list(range(4, 12))


def test_prefetched_hands_a_failing_cleanup_to_the_consumer():
    class Closing:
        """An iterator whose close() fails once it is exhausted."""

        def __init__(self):
            self.items = iter([1, 2])

        def __iter__(self):
            return self

        def __next__(self):
            return next(self.items)

        def close(self):
            raise DataError("cleanup failed")

    seen = []
    with pytest.raises(DataError, match="cleanup failed"):  # not a hang, not a lost error
        for item in prefetched(Closing()):
            seen.append(item)
    assert seen == [1, 2]


@pytest.mark.parametrize(
    ("declared", "words"),
    [
        ([{"gamma": 0.9}, {"gamma": 0.9}, {"gamma": 0.5}], "declares gamma 0.5 in its 'ope'"),
        ([{"gamma": 0.9}, {}, {}], "declares no gamma in its"),
        ([{}, {"horizon": 50}, {}], "declares horizon 50 in its"),
        (
            [{"reward_range": [0, 1], "gamma": 0.9}, {"reward_range": [0, 2], "gamma": 0.9}, {}],
            "declares reward_range [0, 2] in its 'ope' metadata, but the dataset's first "
            "file (p0.parquet) declares reward_range [0, 1]",
        ),
        # the values in full: "gamma 0.95 ..., but ... declares gamma 0.95" said nothing
        (
            [{"gamma": 0.95}, {"gamma": 0.95000000001}],
            "declares gamma 0.95000000001 in its 'ope' metadata, but the dataset's first file "
            "(p0.parquet) declares gamma 0.95:",
        ),
    ],
)
def test_files_that_declare_other_bounds_are_refused(tmp_path, declared, words):
    """The dataset's declarations are its first file's: a later file that declares another
    gamma, horizon or reward range (or none) is a DataError naming it, not a silent
    evaluation under the first file's."""
    for k, own in enumerate(declared):
        metadata = {"ope": json.dumps(own)} if own else None
        pq.write_table(
            table(10 * k, 10 * k + 10).replace_schema_metadata(metadata), tmp_path / f"p{k}.parquet"
        )
    data = open_dataset(str(tmp_path))
    bad = next(k for k, own in enumerate(declared) if own != declared[0])
    with pytest.raises(DataError) as error:
        list(iter_batches(data, ["episode_id"], 100))
    (line,) = str(error.value).splitlines()
    words = words.replace("(p0.parquet)", f"({tmp_path / 'p0.parquet'})")
    assert line.startswith(f"{tmp_path / f'p{bad}.parquet'}: {words}"), line
    assert line.endswith("declare the same (rewrite the metadata, or evaluate the files apart)")


def test_a_share_of_the_files_names_the_dataset_s_first_file(tmp_path):
    """A process's share (``restrict``) reads the dataset's declarations (its first
    file's) but named its own first file: "p2 declares gamma 0.5 ..., but the dataset's
    first file (p2) declares gamma 0.95", one file with two discounts."""
    for k, gamma in enumerate((0.95, 0.95, 0.5, 0.5)):
        metadata = {"ope": json.dumps({"gamma": gamma})}
        pq.write_table(
            table(10 * k, 10 * k + 10).replace_schema_metadata(metadata), tmp_path / f"p{k}.parquet"
        )
    data = open_dataset(str(tmp_path))
    share = data.restrict(data.files[2:])
    with pytest.raises(DataError) as error:
        list(iter_batches(share, ["episode_id"], 100))
    line = str(error.value)
    assert line.startswith(f"{tmp_path / 'p2.parquet'}: declares gamma 0.5"), line
    assert f"the dataset's first file ({tmp_path / 'p0.parquet'}) declares gamma 0.95" in line


def test_files_that_declare_the_same_bounds_are_read(tmp_path):
    for k in range(3):
        metadata = {"ope": json.dumps({"gamma": 0.9, "horizon": 50})}
        pq.write_table(
            table(10 * k, 10 * k + 10).replace_schema_metadata(metadata), tmp_path / f"p{k}.parquet"
        )
    assert read_ids(open_dataset(str(tmp_path))) == list(range(30))


@pytest.mark.filterwarnings("ignore:Feather V1:DeprecationWarning")
def test_a_feather_v1_file_is_refused_with_the_way_to_rewrite_it(tmp_path):
    path = tmp_path / "logs.feather"
    feather.write_feather(table(0, 5), str(path), version=1)
    with pytest.raises(DataError) as error:
        open_dataset(str(path))
    (line,) = str(error.value).splitlines()
    assert line.startswith(f"{path}: a Feather v1 file"), line
    rewritten = tmp_path / "logs.arrow"
    feather.write_feather(feather.read_table(str(path)), str(rewritten))
    assert read_ids(open_dataset(str(rewritten))) == list(range(5))  # as the message says


@pytest.mark.parametrize(
    ("declared", "said"),
    [
        # Python's json writes inf as Infinity: it was an internal error (OverflowError)
        ('{"horizon": Infinity}', "horizon Infinity, where it takes a whole number of steps"),
        ('{"horizon": 1e999}', "horizon Infinity, where it takes a whole number of steps"),
        ('{"horizon": 0}', "horizon 0, where it takes a whole number of steps, at least 1"),
        ('{"horizon": 2.5}', "horizon 2.5, where it takes a whole number of steps"),
        ('{"horizon": "10"}', 'horizon "10", where it takes a whole number of steps'),
        # an integer beyond float64 was an internal error (OverflowError)
        ('{"horizon": 1' + "0" * 400 + "}", "horizon 1000"),
        ('{"gamma": 1' + "0" * 400 + "}", "gamma 1000"),
        ('{"reward_range": [0, 1' + "0" * 400 + "]}", "reward_range [0, 1000"),
        # a JSON object said to be no JSON object: the key and the reason were not named
        ('{"gamma": 1.5}', "gamma 1.5, where it takes a number in [0, 1]"),
        ('{"gamma": "0.9"}', 'gamma "0.9", where it takes a number in [0, 1]'),
        ('{"gamma": true}', "gamma true, where it takes a number in [0, 1]"),
        ('{"gamma": NaN}', "gamma NaN, where it takes a number in [0, 1]"),
        ('{"reward_range": [1, 0]}', "reward_range [1, 0], where it takes [low, high]: finite"),
        ('{"reward_range": ["0", 1]}', 'reward_range ["0", 1], where it takes [low, high]'),
        # json keeps the last of two keys: {"gamma": 0.9, "gamma": 0.5} declared 0.5
        ('{"gamma": 0.9, "gamma": 0.5}', "'gamma' twice (json would keep the last silently)"),
    ],
)
def test_a_declared_value_a_key_does_not_take_is_named(tmp_path, declared, said):
    path = tmp_path / "logs.parquet"
    pq.write_table(table(0, 5).replace_schema_metadata({b"ope": declared.encode()}), path)
    with pytest.raises(DataError) as error:
        open_dataset(str(path)).declared_bounds()
    (line,) = str(error.value).splitlines()
    assert line.startswith(f"{path}: schema metadata 'ope' declares {said}"), line


@pytest.mark.parametrize("declared", ["[0.9]", "{gamma: 0.9}", '"gamma"'])
def test_metadata_that_is_no_json_object_is_refused_as_it_reads(tmp_path, declared):
    path = tmp_path / "logs.parquet"
    pq.write_table(table(0, 5).replace_schema_metadata({b"ope": declared.encode()}), path)
    with pytest.raises(DataError) as error:
        open_dataset(str(path)).declared_bounds()
    (line,) = str(error.value).splitlines()
    assert "schema metadata 'ope' must be a JSON object like" in line, line
    assert line.endswith(f", got {declared}"), line  # as written, not a bytes repr (b'...')


def test_an_arrow_ipc_stream_is_refused_with_the_way_to_rewrite_it(tmp_path):
    path = tmp_path / "logs.arrows"
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table(0, 5).schema) as writer:
        writer.write_table(table(0, 5))
    with pytest.raises(DataError) as error:
        open_dataset(str(path))
    (line,) = str(error.value).splitlines()
    assert line.startswith(f"{path}: an Arrow IPC stream, not an Arrow IPC file"), line
    rewritten = tmp_path / "logs.arrow"
    feather.write_feather(pa.ipc.open_stream(str(path)).read_all(), str(rewritten))
    assert read_ids(open_dataset(str(rewritten))) == list(range(5))  # as the message says


def test_a_declared_discount_of_minus_zero_is_zero(tmp_path):
    """Metadata gamma -0.0 (``ope generate --gamma -0`` wrote it) printed "declares -0"."""
    metadata = {"ope": json.dumps({"gamma": -0.0})}
    pq.write_table(table(0, 10).replace_schema_metadata(metadata), tmp_path / "p.parquet")
    assert str(open_dataset(str(tmp_path)).declared_bounds().gamma) == "0.0"


def test_truncated_first_file_is_named_and_the_others_open(tmp_path):
    """The dataset's schema comes from its first file: a truncated first file stopped the
    open with pyarrow's "Error creating dataset" and no file name of its own. The dataset
    now opens on the first readable file's schema, and reading the damaged one fails
    naming it, as a damaged later file does."""
    pq.write_table(table(0, 10), tmp_path / "a.parquet")
    pq.write_table(table(10, 20), tmp_path / "b.parquet")
    damaged = tmp_path / "a.parquet"
    damaged.write_bytes(damaged.read_bytes()[:60])
    data = open_dataset(str(tmp_path))
    assert data.schema_file == str(tmp_path / "b.parquet")
    with pytest.raises(DataError) as info:
        list(iter_batches(data, ["episode_id"], 10))
    assert str(info.value).startswith(f"{damaged}: cannot read: ")
    assert "Error creating dataset" not in str(info.value)


def test_no_readable_file_names_the_first(tmp_path):
    for name in ("a.parquet", "b.parquet"):
        pq.write_table(table(0, 10), tmp_path / name)
        (tmp_path / name).write_bytes((tmp_path / name).read_bytes()[:60])
    with pytest.raises(DataError) as info:
        open_dataset(str(tmp_path))
    assert str(info.value).startswith(f"{tmp_path / 'a.parquet'}: cannot read: ")
    assert "Error creating dataset" not in str(info.value)


def test_a_damaged_first_file_in_hive_folders_types_the_keys_from_every_other_folder(tmp_path):
    """The partition key's type came from the first readable file's folder alone (int32 for
    seed=2), and seed=99999999999 then stopped the open with "error parsing ... int32"."""
    for seed, (lo, hi) in {"1": (0, 5), "2": (5, 9), "99999999999": (9, 12)}.items():
        (tmp_path / f"seed={seed}").mkdir()
        pq.write_table(table(lo, hi), tmp_path / f"seed={seed}" / "x.parquet")
    whole = open_dataset(str(tmp_path)).schema.field("seed").type
    damaged = tmp_path / "seed=1" / "x.parquet"
    damaged.write_bytes(damaged.read_bytes()[:60])
    data = open_dataset(str(tmp_path))
    assert data.schema.field("seed").type == whole
    with pytest.raises(DataError, match="cannot read"):
        list(iter_batches(data, ["episode_id"], 10))
