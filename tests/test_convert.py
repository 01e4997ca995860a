"""``ope convert`` (ope_cli/data/convert.py): Minari datasets, D4RL-style files, the episode layout
and renamed columns written as step-layout Parquet with the standard names and ``ope``
metadata, streamed batch by batch; ``ope evaluate`` reads the same inputs from the converted
file as from its source (so identical estimates). The command itself: what it prints, and
--overwrite."""

from __future__ import annotations

import json

import gymnasium as gym
import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
import pytest
from datasets import (
    random_checkpoint,
    random_episodes,
    save_checkpoint,
    write_episode_layout,
    write_step_layout,
)
from evaluation_inputs import assert_same_evaluation, evaluation_inputs
from test_sources_d4rl import d4rl_arrays, write_d4rl
from test_sources_minari import DICT_SPACE, N_ACTIONS, OBS_DIM, create, make_buffers

import ope_cli
from ope_cli.config import ColumnMapping
from ope_cli.data.convert import ConvertConfig, convert
from ope_cli.data.sources import METADATA_KEY
from ope_cli.errors import DataError, UsageError


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """{name: source}: Minari datasets in both storages, a D4RL-style file, the episode
    layout, and step-layout Parquet with renamed columns and a declared reward range."""
    folder = tmp_path_factory.mktemp("convert")
    discrete = gym.spaces.Discrete(N_ACTIONS)
    buffers = make_buffers(DICT_SPACE, discrete, seed=7)
    out = {
        fmt: create(folder / "minari", f"test/conv-{fmt}-v0", buffers, DICT_SPACE, discrete, fmt)
        for fmt in ("hdf5", "arrow")
    }
    out["d4rl"] = write_d4rl(folder / "d.hdf5", d4rl_arrays())
    episodes = random_episodes(np.random.default_rng(2), 30, median_length=4, max_length=8)
    out["episodes"] = write_episode_layout(episodes, folder / "episodes.parquet")
    renamed = write_step_layout(episodes, folder / "renamed.parquet")
    table = pq.read_table(renamed).rename_columns(
        {"episode_id": "ep", "reward": "r", "action": "act"}
    )
    pq.write_table(
        table.replace_schema_metadata({METADATA_KEY: json.dumps({"reward_range": [-9, 9]})}),
        renamed,
    )
    out["renamed"] = renamed
    return out


@pytest.fixture(scope="module")
def policies(tmp_path_factory):
    folder = tmp_path_factory.mktemp("convert-policies")
    rng = np.random.default_rng(4)
    return {
        dim: save_checkpoint(
            folder / f"pi{dim}.npz", random_checkpoint("linear_softmax", rng, obs_dim=dim)
        )
        for dim in (3, 4, OBS_DIM)
    }


def assert_identical(source, converted, policy, **options):
    """``ope evaluate`` of ``converted`` estimates from what it estimates from ``source``
    (with ``options``): the same episodes, discount and bounds."""
    first = evaluation_inputs(source, policy, read_rows=16, **options)
    second = evaluation_inputs(converted, policy, read_rows=16)
    assert_same_evaluation(first, second)


def ope_metadata(path) -> dict:
    return json.loads(pq.read_schema(path).metadata[METADATA_KEY.encode()])


MINARI_BEHAVIOR = ColumnMapping(behavior_log_prob="infos/action_log_probs")


@pytest.mark.parametrize("fmt", ["hdf5", "arrow"])
def test_minari_converts_with_identical_estimates(sources, policies, tmp_path, fmt):
    out = tmp_path / "out.parquet"
    result = convert(ConvertConfig(str(sources[fmt]), str(out), MINARI_BEHAVIOR, read_rows=8))
    assert result.format == "minari"
    assert result.columns["behavior_log_prob"] == "infos/action_log_probs"
    schema = pq.read_schema(out)
    assert schema.names[:5] == ["episode_id", "step", "observation", "action", "reward"]
    assert {"terminations", "truncations", "next_observation", "infos/extra/speed"} <= set(
        schema.names
    )
    metadata = ope_metadata(out)
    assert metadata["layout"] == "step"
    assert metadata["provenance"]["format"] == "minari"
    assert metadata["provenance"]["source"] == str(sources[fmt])
    assert pq.ParquetFile(out).num_row_groups > 1  # written batch by batch
    behavior = {"behavior_log_prob_col": "infos/action_log_probs"}
    assert_identical(sources[fmt], out, policies[OBS_DIM], **behavior)


def test_convert_prints_what_it_wrote(sources, ope_in_process, tmp_path):
    """The command: its options reach the conversion, and off a terminal it prints the
    result as JSON."""
    out = tmp_path / "out.parquet"
    option = ["--behavior-log-prob-col", "infos/action_log_probs"]
    run = ope_in_process(["convert", sources["hdf5"], out, "--read-rows", "8", *option])
    assert run.returncode == 0, run
    printed = json.loads(run.stdout)
    assert printed["format"] == "minari"
    assert printed["columns"]["behavior_log_prob"] == "infos/action_log_probs"
    assert (printed["out"], printed["steps"]) == (str(out), pq.read_metadata(out).num_rows)
    assert printed["metadata"] == ope_metadata(out)
    assert pq.ParquetFile(out).num_row_groups > 1  # --read-rows 8


def test_d4rl_converts_with_identical_estimates(sources, policies, tmp_path):
    out = tmp_path / "d4rl.parquet"
    convert(ConvertConfig(str(sources["d4rl"]), str(out)))
    names = pq.read_schema(out).names
    assert "behavior_log_prob" in names and "rewards" not in names  # an alias, left out
    assert ope_metadata(out)["provenance"]["format"] == "d4rl"
    assert_identical(sources["d4rl"], out, policies[3])


def test_episode_layout_becomes_steps(sources, policies, tmp_path):
    out = tmp_path / "steps.parquet"
    result = convert(ConvertConfig(str(sources["episodes"]), str(out), read_rows=7))
    assert result.source_layout == "episode"
    table = pq.read_table(out)
    lengths = pq.read_table(sources["episodes"]).column("rewards")
    assert result.steps == table.num_rows == sum(len(x) for x in lengths.to_pylist())
    steps = table.column("step").to_numpy()
    assert steps[0] == 0 and (np.diff(steps)[np.diff(steps) != 1] <= 0).all()
    assert_identical(sources["episodes"], out, policies[4])


def test_episode_layout_of_list_views_becomes_steps(sources, policies, tmp_path):
    """List views (an Arrow IPC file may hold them) are episode lists like any other: each
    row's values become its steps (they were copied whole onto every step row)."""
    table = pq.read_table(sources["episodes"])

    def view(column: pa.ChunkedArray) -> pa.Array:
        lists = column.combine_chunks()
        if not pa.types.is_list(lists.type):
            return lists
        offsets = lists.offsets.to_numpy()
        return pa.ListViewArray.from_arrays(offsets[:-1], np.diff(offsets), lists.values)

    views = pa.table([view(c) for c in table.columns], names=table.column_names)
    feather.write_feather(views, tmp_path / "views.arrow", compression="uncompressed")
    out = tmp_path / "steps.parquet"
    result = convert(ConvertConfig(str(tmp_path / "views.arrow"), str(out), read_rows=7))
    assert result.steps == pq.read_metadata(out).num_rows == sum(map(len, table["rewards"]))
    assert_identical(sources["episodes"], out, policies[4])


def test_column_options_become_standard_names(sources, policies, tmp_path):
    out = tmp_path / "standard.parquet"
    renamed = ColumnMapping(episode="ep", reward="r", action="act")
    convert(ConvertConfig(str(sources["renamed"]), str(out), renamed))
    schema = pq.read_schema(out)
    assert {"episode_id", "reward", "action"} <= set(schema.names)
    assert not {"ep", "r", "act"} & set(schema.names)
    assert ope_metadata(out)["reward_range"] == [-9, 9]  # declared by the source
    options = {"episode_col": "ep", "reward_col": "r", "action_col": "act"}
    assert_identical(sources["renamed"], out, policies[4], **options)


def test_inspect_reads_the_converted_file(sources, tmp_path):
    out = tmp_path / "c.parquet"
    convert(ConvertConfig(str(sources["d4rl"]), str(out)))
    inspection = ope_cli.inspect(out)
    assert inspection.ok  # ope inspect exits 0
    assert inspection.to_dict()["counts"]["episodes"] == 5


def test_existing_output_needs_overwrite(sources, ope_in_process, tmp_path):
    out = tmp_path / "c.parquet"
    out.write_bytes(b"keep")
    run = ope_in_process(["convert", sources["d4rl"], out])
    assert run.returncode == 2, run
    assert "--overwrite" in run.stderr and out.read_bytes() == b"keep"
    assert ope_in_process(["convert", sources["d4rl"], out, "--overwrite"]).returncode == 0
    assert pq.read_table(out).num_rows == 20


def test_an_unquoted_glob_of_two_files_is_told_to_quote_it(sources, tmp_path):
    """`ope convert logs/*.parquet` (OUT forgotten): the shell makes the second file OUT,
    and "pass --overwrite" would replace it with a copy of the first."""
    for name in ("part-0.parquet", "part-1.parquet"):
        pq.write_table(pq.read_table(sources["episodes"]), tmp_path / name)
    with pytest.raises(UsageError) as error:
        convert(ConvertConfig(str(tmp_path / "part-0.parquet"), str(tmp_path / "part-1.parquet")))
    message = str(error.value)
    assert "if the shell expanded an unquoted glob into both, quote it" in message
    assert f"('{tmp_path}/*.parquet')" in message
    assert message.index("quote it") < message.index("--overwrite")
    with pytest.raises(UsageError) as error:  # OUT is DATA: no glob gives a name twice
        convert(ConvertConfig(str(tmp_path / "part-0.parquet"), str(tmp_path / "part-0.parquet")))
    assert "quote it" not in str(error.value) and "--overwrite" in str(error.value)


def test_a_failed_conversion_leaves_no_file(sources, tmp_path):
    bad = tmp_path / "bad.parquet"
    table = pq.read_table(sources["episodes"])
    rewards = table.column("rewards").to_pylist()
    rewards[3] = rewards[3] + [0.0]  # one reward more than the episode's actions
    table = table.set_column(table.schema.get_field_index("rewards"), "rewards", pa.array(rewards))
    ids = pa.compute.add(table.column("episode_id"), 100)
    pq.write_table(
        table.set_column(table.schema.get_field_index("episode_id"), "episode_id", ids), bad
    )
    out = tmp_path / "out.parquet"
    # the episode's id, in evaluate's words (it said "episode row 3", its row in the file)
    with pytest.raises(
        DataError, match=r"episode 103: list column '\w+' has \d+ entries but 'rewards'"
    ):
        convert(ConvertConfig(str(bad), str(out), read_rows=2))
    assert list(tmp_path.glob("out.parquet*")) == []


def test_an_unread_list_column_of_other_lengths_says_what_to_do(sources, tmp_path):
    """A list column no role reads, one entry longer than each episode (a Minari-style
    next observation): evaluate ignores it, and convert, which writes every column, stopped
    with "has 54 entries but 'rewards' has 53" and no way out."""
    table = pq.read_table(sources["episodes"])
    longer = [r + [0.0] for r in table.column("rewards").to_pylist()]
    pq.write_table(table.append_column("extra", pa.array(longer)), tmp_path / "extra.parquet")
    with pytest.raises(DataError, match=r"does not read 'extra'.*drop_columns\(\['extra'\]\)"):
        convert(ConvertConfig(str(tmp_path / "extra.parquet"), str(tmp_path / "out.parquet")))
    assert list(tmp_path.glob("out.parquet*")) == []


def test_data_without_rows_is_refused_and_leaves_no_file(sources, tmp_path):
    """Data without rows is refused as evaluate refuses it (it wrote an empty file, which
    evaluate then refused)."""
    empty = tmp_path / "empty.parquet"
    pq.write_table(pq.read_table(sources["episodes"]).slice(0, 0), empty)
    out = tmp_path / "out.parquet"
    with pytest.raises(DataError, match=r"empty\.parquet: no episodes \(the data has no rows\)"):
        convert(ConvertConfig(str(empty), str(out)))
    assert list(tmp_path.glob("out.parquet*")) == []


def test_the_declared_discount_is_kept(tmp_path):
    """SPEC 12: ``ope convert`` keeps the gamma the source declares, beside its bounds."""
    episodes = random_episodes(np.random.default_rng(5), 10, median_length=3, max_length=5)
    source = write_step_layout(episodes, tmp_path / "declared.parquet")
    declared = {"reward_range": [-9, 9], "gamma": 0.97}
    table = pq.read_table(source)
    pq.write_table(table.replace_schema_metadata({METADATA_KEY: json.dumps(declared)}), source)
    out = tmp_path / "out.parquet"
    convert(ConvertConfig(str(source), str(out)))
    metadata = ope_metadata(out)
    assert (metadata["gamma"], metadata["reward_range"]) == (0.97, [-9, 9])


def _steps(ids: list[int], **extra) -> pa.Table:
    n = len(ids)
    steps = [sum(1 for j in ids[:i] if j == ids[i]) for i in range(n)]
    return pa.table(
        {
            "episode_id": ids,
            "step": steps,
            "observation": [0] * n,
            "action": [1] * n,
            "reward": [1.0] * n,
            "behavior_prob": [0.5] * n,
            **extra,
        }
    )


def test_episodes_that_are_not_contiguous_rows_of_one_file_are_refused(tmp_path):
    """Written one after the other, an episode split over two files (or over rows of one)
    would be joined into one episode without a word; ope evaluate refuses such data, and so
    does ope convert, with its message and no file left. Episodes that only span record
    batches of one file are fine."""
    (tmp_path / "split").mkdir()
    pq.write_table(_steps([0, 0, 1, 1]), tmp_path / "split" / "a.parquet")
    pq.write_table(_steps([1, 1, 2]), tmp_path / "split" / "b.parquet")
    pq.write_table(_steps([0, 0, 1, 1, 1, 2, 0]), tmp_path / "again.parquet")
    for source, file in (("split", "b.parquet"), ("again.parquet", "again.parquet")):
        out = tmp_path / "out.parquet"
        with pytest.raises(DataError) as error:
            convert(ConvertConfig(str(tmp_path / source), str(out), read_rows=2))
        message = str(error.value)
        assert message.endswith(
            "episode 1: episode id appears in more than one place (its rows must be "
            f"contiguous within one file); seen first in {tmp_path / 'split' / 'a.parquet'}"
            if source == "split"
            else "episode 0: episode id appears in more than one place "
            "(its rows must be contiguous within one file); seen earlier in this file"
        ), message
        assert file in message and not list(tmp_path.glob("out.parquet*"))
    good = tmp_path / "good.parquet"
    pq.write_table(_steps([0, 0, 0, 0, 0, 1, 1, 2]), good)
    result = convert(ConvertConfig(str(good), str(tmp_path / "out.parquet"), read_rows=2))
    assert result.steps == 8


@pytest.mark.parametrize("twin", [1, 3])
def test_two_episode_rows_of_one_id_are_refused(tmp_path, twin):
    """In the episode layout each row is an episode: two rows of one id (next to each
    other, or apart and in another record batch) were written one after the other, as one
    episode of that id whose steps restart, and convert exited 0 where ope evaluate
    refuses the source (and --on-invalid drop then counted one episode dropped for two).
    A row without an id was written too."""
    ids = [5, 6, 7, 8]
    ids[twin] = 5  # [5, 5, 7, 8] or [5, 6, 7, 5]
    lists = [[0, 1], [1], [0, 0, 1], [1, 0]]

    def refused(ids) -> str:
        source = tmp_path / "episodes.parquet"
        table = pa.table(
            {
                "episode_id": pa.array(ids, pa.int64()),
                "observations": lists,
                "actions": lists,
                "rewards": [[1.0] * len(x) for x in lists],
                "action_probs": [[0.5] * len(x) for x in lists],
            }
        )
        pq.write_table(table, source)
        with pytest.raises(DataError) as error:
            convert(ConvertConfig(str(source), str(tmp_path / "out.parquet"), read_rows=2))
        assert not list(tmp_path.glob("out.parquet*"))
        return str(error.value).removeprefix(f"{source}: ")

    assert refused(ids) == (
        "episode 5: episode id appears in more than one place (its rows "
        "must be contiguous within one file); seen earlier in this file"
    )
    assert refused([5, None, 7, 8]).startswith("column 'episode_id' is null")


@pytest.mark.parametrize(("rewards", "words"), [([], "episode has no steps"), (None, "is null")])
def test_an_episode_without_steps_is_refused(tmp_path, rewards, words):
    """The episode layout's empty (or null) episode has no step to write: dropping it would
    give a file that evaluates where its source is refused."""
    empty = [] if rewards == [] else None
    source = tmp_path / "episodes.parquet"
    pq.write_table(
        pa.table(
            {
                "episode_id": [7, 8, 9],
                "observations": [[0, 1], empty, [1]],
                "actions": [[0, 1], empty, [0]],
                "rewards": pa.array([[1.0, 0.0], rewards, [1.0]], pa.list_(pa.float64())),
                "action_probs": [[0.5, 0.5], empty, [0.5]],
            }
        ),
        source,
    )
    with pytest.raises(DataError) as error:
        convert(ConvertConfig(str(source), str(tmp_path / "out.parquet")))
    assert str(error.value).startswith(f"{source}: episode 8: ") and words in str(error.value)
    assert not list(tmp_path.glob("out.parquet*"))


def test_columns_read_only_when_named_are_kept(tmp_path):
    """q_value and v_value (read with --q-col/--v-col) are data: kept under their names."""
    source = tmp_path / "critic.parquet"
    pq.write_table(_steps([0, 0, 1], q_value=[0.3, 0.2, 0.1], v_value=[0.5, 0.4, 0.6]), source)
    out = tmp_path / "out.parquet"
    convert(ConvertConfig(str(source), str(out)))
    written = pq.read_table(out)
    assert written.column("q_value").to_pylist() == [0.3, 0.2, 0.1]
    assert written.column("v_value").to_pylist() == [0.5, 0.4, 0.6]


def test_an_output_not_named_as_parquet_is_refused(sources, tmp_path):
    """``ope convert X out.csv`` wrote Parquet into a .csv file without a word."""
    for name in ("out.csv", "out"):
        with pytest.raises(UsageError, match=r"name a Parquet file \(\.parquet, \.parq, \.pq\)"):
            convert(ConvertConfig(str(sources["episodes"]), str(tmp_path / name)))
        assert not (tmp_path / name).exists()
    convert(ConvertConfig(str(sources["episodes"]), str(tmp_path / "out.PQ")))
    assert pq.read_table(tmp_path / "out.PQ").num_rows > 0


@pytest.mark.parametrize("hive", [False, True])
def test_a_column_of_integers_in_one_file_and_fractions_in_the_next_is_widened(tmp_path, hive):
    """Integer rewards in the first file, fractions in the second: cast to the first file's
    int64, 0.25 stopped convert with an internal error, while evaluate reads both. Written
    as float64, every value is kept, and the estimates are evaluate's on the files. In hive
    partitions (whose keys convert reads and writes), the read cast the second file to
    the first's int64 and refused it (exit 3)."""
    folder = tmp_path / "mixed"
    first, second = (
        (folder / "part=a" / "a.parquet", folder / "part=b" / "b.parquet")
        if hive
        else (folder / "a.parquet", folder / "b.parquet")
    )
    for file in (first, second):
        file.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(_steps([0, 0, 1], reward=[1, 0, 2]), first)
    pq.write_table(_steps([2, 2], reward=[0.25, -1.5]), second)
    out = tmp_path / "steps.parquet"
    convert(ConvertConfig(str(folder), str(out)))
    table = pq.read_table(out)
    assert table.schema.field("reward").type == pa.float64()
    assert table.column("reward").to_pylist() == [1.0, 0.0, 2.0, 0.25, -1.5]
    policy = tmp_path / "pi.npz"
    np.savez(policy, kind="tabular", logits=np.zeros((1, 2)))
    assert_identical(folder, out, policy)


def test_ids_steps_and_actions_keep_the_first_files_type(tmp_path):
    """Only real-valued columns are widened: episode ids (and steps, actions, observations)
    read as float64 were no longer ids, and evaluate refused the converted file; a later
    file's value that does not fit the first file's type is a DataError naming the file
    (it was an internal error)."""
    folder = tmp_path / "ids"
    folder.mkdir()
    pq.write_table(_steps([2**53 + 1, 2**53 + 1, 2]), folder / "a.parquet")
    pq.write_table(_steps([5.0, 5.0], action=[1.0, 1.0]), folder / "b.parquet")
    out = tmp_path / "steps.parquet"
    convert(ConvertConfig(str(folder), str(out)))
    table = pq.read_table(out)
    assert table.schema.field("episode_id").type == pa.int64()
    assert table.schema.field("action").type == pa.int64()
    assert table.column("episode_id").to_pylist() == [2**53 + 1, 2**53 + 1, 2, 5, 5]
    policy = tmp_path / "pi.npz"
    np.savez(policy, kind="tabular", logits=np.zeros((1, 2)))
    assert_identical(folder, out, policy)
    pq.write_table(_steps([5.5, 5.5]), folder / "c.parquet")
    with pytest.raises(DataError, match=r"c\.parquet: column 'episode_id'"):
        convert(ConvertConfig(str(folder), str(tmp_path / "refused.parquet")))


def test_floats_wider_in_a_later_file_are_written_as_wide(tmp_path):
    """float32 rewards, probabilities and observations in the first file, float64 in the
    next: written as float32, a reward of 16777217 became 16777216 and 0.1 0.10000000149
    (IS 4194304.775 against evaluate's 4194305.025 on the files), without a word. Written
    as float64 (lists alike), every value is kept and the estimates are evaluate's."""
    folder = tmp_path / "widths"
    folder.mkdir()
    for name, floats, rewards in (
        ("a.parquet", pa.float32(), [1.0, 0.5, 2.0]),
        ("b.parquet", pa.float64(), [16777217.0, 0.1]),
    ):
        ids = [0, 0, 1] if name == "a.parquet" else [2, 2]
        steps = _steps(ids).drop_columns(["observation", "reward", "behavior_prob"])
        n = len(ids)
        observation = pa.array([[0.25 * i, 0.1] for i in range(n)], pa.list_(floats))
        steps = steps.append_column("observation", observation)
        steps = steps.append_column("reward", pa.array(rewards, floats))
        steps = steps.append_column("behavior_prob", pa.array([0.5] * n, floats))
        pq.write_table(steps, folder / name)
    out = tmp_path / "steps.parquet"
    convert(ConvertConfig(str(folder), str(out)))
    table = pq.read_table(out)
    assert table.schema.field("reward").type == pa.float64()
    assert table.schema.field("behavior_prob").type == pa.float64()
    assert table.schema.field("observation").type == pa.list_(pa.float64())
    assert table.column("reward").to_pylist() == [1.0, 0.5, 2.0, 16777217.0, 0.1]
    assert table.column("observation").to_pylist()[-1] == [0.25, 0.1]
    policy = tmp_path / "pi.npz"
    np.savez(policy, kind="linear_softmax", weight=np.ones((2, 2)), bias=np.zeros(2))
    assert_identical(folder, out, policy)


def _with_log_twin(table: pa.Table, column: str, twin: str, factor: float) -> pa.Table:
    """``table`` with ``twin``, the log of ``column`` times ``factor`` (lists alike)."""
    values = table.column(column).combine_chunks()
    if pa.types.is_list(values.type):
        flat = np.log(values.flatten().to_numpy()) * factor
        logs = pa.ListArray.from_arrays(values.offsets, pa.array(flat))
    else:
        logs = pa.array(np.log(values.to_numpy()) * factor)
    return table.append_column(twin, logs)


@pytest.mark.parametrize("layout", ["step", "episode"])
def test_a_probability_and_its_log_that_disagree_are_refused(layout, tmp_path):
    """A probability column beside its log, neither named: evaluate compares them and
    refuses a disagreement (exit 3), but convert wrote the probability, dropped the log
    without a word, and the converted file evaluated to a number. It compares them as
    evaluate does and leaves no file; columns that agree convert, the log reported as not
    written."""
    episodes = random_episodes(np.random.default_rng(5), 12, median_length=4, max_length=6)
    write = write_step_layout if layout == "step" else write_episode_layout
    source = write(episodes, tmp_path / "source.parquet")
    table = pq.read_table(source)
    column = "behavior_prob" if layout == "step" else "action_probs"
    for factor, name in ((1.0, "agree"), (1.1, "disagree")):
        pq.write_table(
            _with_log_twin(table, column, "behavior_log_prob", factor), tmp_path / f"{name}.parquet"
        )
    out = tmp_path / "out.parquet"
    with pytest.raises(DataError, match="disagree") as raised:
        convert(ConvertConfig(str(tmp_path / "disagree.parquet"), str(out)))
    message = str(raised.value)
    assert f"{column!r} and 'behavior_log_prob' disagree" in message and "\n" not in message
    assert "episode 0, step 0: " in message
    assert raised.value.exit_code == 3 and not out.exists()
    assert list(tmp_path.glob("out.parquet*")) == []
    with pytest.raises(DataError, match="disagree"):
        ope_cli.evaluate(str(tmp_path / "disagree.parquet"), policies=[], gamma=0.9)
    result = convert(ConvertConfig(str(tmp_path / "agree.parquet"), str(out)))
    assert result.dropped == {
        "behavior_log_prob": "compared with the column used, which is written"
    }
    assert "behavior_log_prob" not in pq.read_schema(out).names


def test_a_column_whose_name_a_mapped_column_takes_is_reported(sources, tmp_path):
    """``--obs-col state`` beside a column named ``observation``: the output's observation
    is ``state``, and the source's ``observation`` was dropped without a word. It is
    reported as not written; the output's observation is ``state``'s."""
    episodes = random_episodes(np.random.default_rng(6), 5, median_length=3, max_length=4)
    source = write_step_layout(episodes, tmp_path / "source.parquet")
    table = pq.read_table(source)
    table = table.append_column("state", table.column("observation"))
    reversed_rows = pa.array(np.arange(table.num_rows)[::-1])
    table = table.set_column(
        table.schema.get_field_index("observation"),
        "observation",
        table.column("observation").take(reversed_rows),
    )
    pq.write_table(table, tmp_path / "collide.parquet")
    out = tmp_path / "out.parquet"
    mapping = ColumnMapping(observation="state")
    result = convert(ConvertConfig(str(tmp_path / "collide.parquet"), str(out), mapping))
    assert result.columns["observation"] == "state"
    assert result.dropped == {"observation": "the output's 'observation' is 'state'"}
    assert pq.read_table(out).column("observation").equals(table.column("state"))


def test_an_id_and_its_64_bit_twin_are_said_to_be_one_in_convert_too(tmp_path):
    """convert checked ids as the strings it shows, so -1 (int64) and 2**64 - 1 (uint64)
    were refused as one episode in two places without the reason evaluate gives."""
    for name, ids, kind in (("a", [-1, 5], pa.int64()), ("b", [2**64 - 1], pa.uint64())):
        steps = [i for i in ids for _ in range(2)]
        table = {
            "episode_id": pa.array(steps, kind),
            "step": [0, 1] * len(ids),
            "observation": [0.0] * len(steps),
            "action": [0] * len(steps),
            "reward": [1.0] * len(steps),
            "behavior_prob": [0.5] * len(steps),
        }
        pq.write_table(pa.table(table), tmp_path / f"{name}.parquet")
    twin = r"seen first in .*a.parquet \(ids are compared as 64-bit integers: 1844\d+ and -1 are"
    with pytest.raises(DataError, match=twin):
        convert(ConvertConfig(str(tmp_path / "*.parquet"), str(tmp_path / "out.parquet")))
