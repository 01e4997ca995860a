"""Record batches -> whole validated episodes (ope_cli/data/episodes.py)."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasets import (
    random_episodes,
    step_layout_table,
    write_episode_layout,
    write_step_layout,
    write_table,
)

from ope_cli.config import ColumnMapping
from ope_cli.data.columns import resolve_schema
from ope_cli.data.episodes import EpisodeAssembler, EpisodeChunk
from ope_cli.data.ids import hash_strings, id_keys, mix64
from ope_cli.data.sources import iter_batches, open_dataset
from ope_cli.errors import DataError

READ_ROWS = [1, 2, 3, 7, 1_000_000]


def read_chunks(
    path, rows: int = 1_000_000, logged_target: bool = False, **mapping
) -> list[EpisodeChunk]:
    data = open_dataset(str(path))
    schema = resolve_schema(data.schema, ColumnMapping(**mapping), logged_target=logged_target)
    assembler = EpisodeAssembler(schema)
    return list(assembler.chunks(iter_batches(data, schema.read_columns, rows)))


FIELDS = ("ids", "keys", "lengths", "observation", "action", "reward", "log_behavior", "log_target")


def flat(chunks: list[EpisodeChunk]) -> dict[str, np.ndarray | None]:
    """All chunks' arrays, concatenated field by field."""
    out = {}
    for name in FIELDS:
        parts = [getattr(c, name) for c in chunks]
        out[name] = None if parts[0] is None else np.concatenate(parts)
    return out


def assert_same(a: dict, b: dict) -> None:
    for name in FIELDS:
        if a[name] is None or b[name] is None:
            assert a[name] is None and b[name] is None, name
        else:
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def expected_from(episodes, ids=None) -> dict[str, np.ndarray]:
    return {
        "ids": np.array([ep["episode_id"] for ep in episodes] if ids is None else ids),
        "lengths": np.array([len(ep["reward"]) for ep in episodes]),
        "observation": np.concatenate([ep["observation"] for ep in episodes]),
        "action": np.concatenate([ep["action"] for ep in episodes]),
        "reward": np.concatenate([ep["reward"] for ep in episodes]),
        "log_behavior": np.concatenate([ep["behavior_log_prob"] for ep in episodes]),
    }


def check_against(got: dict, episodes, ids=None) -> None:
    expected = expected_from(episodes, ids)
    np.testing.assert_array_equal(got["ids"], expected["ids"])
    np.testing.assert_array_equal(got["lengths"], expected["lengths"])
    np.testing.assert_array_equal(got["observation"], expected["observation"])
    np.testing.assert_array_equal(got["action"], expected["action"])
    np.testing.assert_array_equal(got["reward"], expected["reward"])
    np.testing.assert_allclose(got["log_behavior"], expected["log_behavior"], rtol=0, atol=1e-12)


@pytest.fixture(scope="module")
def episodes():
    rng = np.random.default_rng(7)
    return random_episodes(rng, 30, median_length=4, max_length=12)


# ------------------------------------------------------------------ batch boundaries


@pytest.mark.parametrize("rows", READ_ROWS)
def test_batch_cuts_give_identical_episodes(tmp_path, episodes, rows):
    path = write_step_layout(episodes, tmp_path / "logs.parquet", row_group_size=5)
    chunks = read_chunks(path, rows)
    got = flat(chunks)
    check_against(got, episodes)
    assert all(c.file == str(path) for c in chunks)
    assert all(c.num_steps == int(c.lengths.sum()) for c in chunks)
    reference = flat(read_chunks(path, 1_000_000))
    assert_same(got, reference)


@pytest.mark.parametrize("rows", READ_ROWS)
def test_batch_cuts_over_several_files(tmp_path, episodes, rows):
    path = write_step_layout(episodes, tmp_path / "logs", n_files=4, row_group_size=3)
    chunks = read_chunks(path, rows)
    check_against(flat(chunks), episodes)
    # a chunk never mixes files, and episodes of a file stay in that file's chunks
    files = sorted({c.file for c in chunks})
    assert len(files) == 4


@pytest.mark.parametrize("rows", READ_ROWS)
def test_batch_cuts_in_feather(tmp_path, episodes, rows):
    path = write_step_layout(
        episodes, tmp_path / "logs", n_files=2, file_format="feather", row_group_size=4
    )
    check_against(flat(read_chunks(path, rows)), episodes)


def test_one_long_episode_spanning_many_batches(tmp_path):
    rng = np.random.default_rng(1)
    eps = random_episodes(rng, 3, length_dist="fixed", median_length=50, max_length=50)
    path = write_step_layout(eps, tmp_path / "logs.parquet", row_group_size=7)
    chunks = read_chunks(path, 3)
    check_against(flat(chunks), eps)


def test_a_long_episode_is_joined_once_not_once_per_batch(tmp_path, monkeypatch):
    """An episode spanning many record batches is carried in parts, each in arrays of its
    own (not views of the batch), and joined once when it ends: linear in its length."""
    from ope_cli.data import episodes as module

    rng = np.random.default_rng(2)
    eps = random_episodes(rng, 2, length_dist="fixed", median_length=60, max_length=60)
    path = write_step_layout(eps, tmp_path / "logs.parquet", row_group_size=1000)
    joined, concat = [], module._Rows.concat

    def counted(*parts):
        assert all(a.base is None for part in parts[:-1] for a in part.steps if a is not None)
        joined.append(len(parts))
        return concat(*parts)

    monkeypatch.setattr(module._Rows, "concat", staticmethod(counted))
    check_against(flat(read_chunks(path, 4)), eps)  # 30 record batches of 4 rows
    assert len(joined) <= 2 and max(joined) >= 15  # one join per episode end, of many parts


@pytest.mark.parametrize("rows", READ_ROWS)
def test_steps_shuffled_within_episodes_are_sorted(tmp_path, episodes, rows):
    path = write_step_layout(
        episodes, tmp_path / "logs.parquet", shuffle_steps_within_episode=True, seed=3
    )
    check_against(flat(read_chunks(path, rows)), episodes)


@pytest.mark.parametrize("rows", [1, 3, 1_000_000])
def test_without_step_column_row_order_is_kept(tmp_path, episodes, rows):
    path = write_step_layout(episodes, tmp_path / "logs.parquet", include_step=False)
    check_against(flat(read_chunks(path, rows)), episodes)


@pytest.mark.parametrize("rows", READ_ROWS)
def test_string_episode_ids(tmp_path, episodes, rows):
    path = write_step_layout(episodes, tmp_path / "logs.parquet", id_type=str)
    got = flat(read_chunks(path, rows))
    ids = [f"ep-{ep['episode_id']:06d}" for ep in episodes]
    check_against(got, episodes, ids=ids)
    np.testing.assert_array_equal(got["keys"], hash_strings(pa.array(ids)))


@pytest.mark.parametrize("file_format", ["parquet", "feather"])
def test_string_view_episode_ids(tmp_path, episodes, file_format):
    """Ids stored as string_view (Polars' default string type in Arrow IPC) read like strings."""
    table = step_layout_table(episodes, id_type=str)
    as_view = table.set_column(0, "episode_id", table.column(0).cast(pa.string_view()))
    path = write_table(as_view, tmp_path / f"logs.{file_format}", file_format=file_format)
    got = flat(read_chunks(path, 7))
    ids = [f"ep-{ep['episode_id']:06d}" for ep in episodes]
    check_against(got, episodes, ids=ids)
    np.testing.assert_array_equal(got["keys"], hash_strings(pa.array(ids)))


def test_fixed_size_list_observations(tmp_path, episodes):
    path = write_step_layout(episodes, tmp_path / "logs.parquet", obs_type="fixed_size_list")
    got = flat(read_chunks(path, 5))
    check_against(got, episodes)
    assert got["observation"].shape == (sum(len(ep["reward"]) for ep in episodes), 4)


def test_tabular_index_observations(tmp_path):
    rng = np.random.default_rng(2)
    eps = random_episodes(rng, 10, kind="tabular", median_length=5, max_length=10)
    path = write_step_layout(eps, tmp_path / "logs.parquet")
    got = flat(read_chunks(path, 4))
    check_against(got, eps)
    assert got["observation"].dtype == np.int64
    assert got["action"].dtype == np.int64


def test_continuous_vector_actions(tmp_path):
    rng = np.random.default_rng(3)
    eps = random_episodes(rng, 10, kind="linear_gaussian", median_length=5, max_length=10)
    path = write_step_layout(eps, tmp_path / "logs.parquet", prob_column="behavior_log_prob")
    got = flat(read_chunks(path, 4))
    check_against(got, eps)
    assert got["action"].shape == (int(got["lengths"].sum()), 2)
    assert got["action"].dtype == np.float64


# ---------------------------------------------------------------- log conversion


def test_probabilities_are_converted_to_logs(tmp_path, episodes):
    prob = write_step_layout(episodes, tmp_path / "p.parquet", prob_column="behavior_prob")
    log = write_step_layout(episodes, tmp_path / "l.parquet", prob_column="behavior_log_prob")
    from_prob = flat(read_chunks(prob))["log_behavior"]
    from_log = flat(read_chunks(log))["log_behavior"]
    expected = np.concatenate([ep["behavior_log_prob"] for ep in episodes])
    np.testing.assert_array_equal(from_log, expected)  # already logs: passed through
    np.testing.assert_allclose(from_prob, expected, rtol=0, atol=1e-12)
    np.testing.assert_array_equal(
        from_prob, np.log(np.concatenate([ep["behavior_prob"] for ep in episodes]))
    )


@pytest.mark.parametrize("column", ["target_prob", "target_log_prob"])
def test_logged_target_probabilities(tmp_path, column):
    rows = {
        "episode_id": [0, 0, 1],
        "observation": [0.5, 0.1, -0.3],
        "action": [0, 1, 2],
        "reward": [1.0, 0.0, 2.0],
        "behavior_prob": [0.5, 0.25, 1.0],
    }
    target = np.array([0.25, 1.0, 0.5])
    rows[column] = target if column == "target_prob" else np.log(target)
    path = tmp_path / "logs.parquet"
    pq.write_table(pa.table(rows), path)
    got = flat(read_chunks(path, logged_target=True))
    np.testing.assert_allclose(got["log_target"], np.log(target), rtol=1e-15)
    np.testing.assert_allclose(got["log_behavior"], np.log([0.5, 0.25, 1.0]), rtol=1e-15)


def test_target_not_read_without_logged_target(tmp_path, episodes):
    from datasets import add_target_probs, random_checkpoint

    ckpt = random_checkpoint("linear_softmax", np.random.default_rng(0))
    path = write_step_layout(
        add_target_probs(episodes, ckpt), tmp_path / "logs.parquet", extra_columns=["target_prob"]
    )
    assert flat(read_chunks(path))["log_target"] is None


# ------------------------------------------------------------------ episode layout


@pytest.mark.parametrize("rows", [1, 2, 3, 7, 1_000_000])
@pytest.mark.parametrize("obs_type", ["list", "fixed_size_list"])
def test_episode_layout_matches_step_layout(tmp_path, episodes, rows, obs_type):
    step = write_step_layout(episodes, tmp_path / "step.parquet", obs_type=obs_type)
    episode = write_episode_layout(
        episodes, tmp_path / "episode.parquet", obs_type=obs_type, row_group_size=4
    )
    from_step = flat(read_chunks(step, 1_000_000))
    from_episode = flat(read_chunks(episode, rows))
    assert_same(from_episode, from_step)
    check_against(from_episode, episodes)


def test_episode_layout_without_ids_numbers_rows(tmp_path, episodes):
    path = write_episode_layout(episodes, tmp_path / "logs", n_files=3, id_type=None)
    got = flat(read_chunks(path, 4))
    check_against(got, episodes, ids=np.arange(len(episodes)))
    assert np.unique(got["keys"]).size == len(episodes)


def test_episode_layout_string_ids(tmp_path, episodes):
    step = write_step_layout(episodes, tmp_path / "step.parquet", id_type=str)
    episode = write_episode_layout(episodes, tmp_path / "episode.parquet", id_type=str)
    assert_same(flat(read_chunks(episode, 3)), flat(read_chunks(step)))


def test_a_final_observation_in_every_episode_is_named_as_such(tmp_path):
    """Observations that list one entry more than each episode's steps (a final
    observation, as Minari stores one): the error said only that the lengths disagree and
    offered --on-invalid drop, which leaves out every episode; it says what the extra entry
    looks like and what to do. One episode longer by one among others is not that."""
    path = tmp_path / "logs.parquet"
    columns = {
        "episode_id": [10, 11],
        "observations": [[0.1, 0.2, 0.9], [0.3, 0.4, 0.5, 0.9]],
        "actions": [[0, 1], [1, 0, 1]],
        "rewards": [[1.0, 2.0], [1.0, 2.0, 3.0]],
        "action_probs": [[0.5, 0.5], [0.5, 0.5, 0.5]],
    }
    pq.write_table(pa.table(columns), path)
    with pytest.raises(DataError, match=r"one entry more than its steps.*drop the last entry"):
        read_chunks(path)
    columns["observations"][0] = [0.1, 0.2]  # episode 10 as its steps: one odd episode
    pq.write_table(pa.table(columns), path)
    with pytest.raises(DataError) as info:
        read_chunks(path)
    assert "episode 11" in str(info.value) and "one entry more" not in str(info.value)


def test_episode_layout_list_length_mismatch(tmp_path):
    path = tmp_path / "logs.parquet"
    pq.write_table(
        pa.table(
            {
                "episode_id": [10, 11],
                "observations": [[0.1, 0.2], [0.3, 0.4, 0.5]],
                "actions": [[0, 1], [1, 0]],  # episode 11: 2 actions for 3 rewards
                "rewards": [[1.0, 2.0], [1.0, 2.0, 3.0]],
                "action_probs": [[0.5, 0.5], [0.5, 0.5, 0.5]],
            }
        ),
        path,
    )
    with pytest.raises(DataError) as info:
        read_chunks(path)
    message = str(info.value)
    assert str(path) in message
    assert "episode 11" in message
    assert "'actions'" in message


def test_episode_layout_empty_episode(tmp_path):
    path = tmp_path / "logs.parquet"
    pq.write_table(
        pa.table(
            {
                "episode_id": [3, 4],
                "observations": [[0.1], []],
                "actions": [[0], []],
                "rewards": [[1.0], []],
                "action_probs": [[0.5], []],
            }
        ),
        path,
    )
    with pytest.raises(DataError, match="episode 4"):
        read_chunks(path)


# ------------------------------------------------------------- structural errors


def write_rows(path, episode_id, step=None, **columns):
    n = len(episode_id)
    data = {"episode_id": episode_id}
    if step is not None:
        data["step"] = step
    data.update(
        {
            "observation": np.zeros(n),
            "action": np.zeros(n, np.int64),
            "reward": np.ones(n),
            "behavior_prob": np.full(n, 0.5),
        }
    )
    data.update(columns)
    pq.write_table(pa.table({k: v for k, v in data.items() if v is not None}), path)
    return path


@pytest.mark.parametrize("rows", [1, 2, 3, 1_000_000])
def test_duplicate_step(tmp_path, rows):
    path = write_rows(tmp_path / "logs.parquet", [1, 1, 2, 2, 2, 2, 3], [0, 1, 0, 2, 1, 2, 0])
    with pytest.raises(DataError) as info:
        read_chunks(path, rows)
    message = str(info.value)
    assert "episode 2" in message
    assert "more than once" in message
    assert str(path) in message


@pytest.mark.parametrize("rows", [1, 2, 3, 1_000_000])
def test_missing_step(tmp_path, rows):
    path = write_rows(tmp_path / "logs.parquet", [1, 1, 2, 2, 2, 3], [0, 1, 0, 3, 1, 0])
    with pytest.raises(DataError) as info:
        read_chunks(path, rows)
    message = str(info.value)
    assert "episode 2" in message
    assert "step 2 is missing" in message


@pytest.mark.parametrize("rows", [1, 2, 3, 1_000_000])
def test_an_episode_that_starts_past_step_0_is_said_to_have_its_first_rows_elsewhere(
    tmp_path, rows
):
    """An episode's later rows in the file of another process (its first rows in a file
    the other process read) said "step 0 is missing", and a multi-process run pointed at
    --on-invalid drop, which could not help."""
    path = write_rows(tmp_path / "logs.parquet", [1, 1, 2, 2, 2], [0, 1, 3, 4, 5])
    with pytest.raises(DataError) as info:
        read_chunks(path, rows)
    message = str(info.value)
    assert "episode 2: step 0 is missing: its first step is 3" in message
    assert "an episode's rows must all be in one file" in message


@pytest.mark.parametrize("rows", [1, 2, 3, 1_000_000])
def test_a_negative_step_is_named(tmp_path, rows):
    """Steps -1, 0, 1: the message said "step 0 is missing", where step 0 is there."""
    path = write_rows(tmp_path / "logs.parquet", [1, 1, 7, 7, 7], [0, 1, 1, -1, 0])
    with pytest.raises(DataError) as info:
        read_chunks(path, rows)
    message = str(info.value)
    assert "episode 7" in message
    assert "step -1 is out of range" in message


@pytest.mark.parametrize("rows", [1, 2, 3, 1_000_000])
def test_non_contiguous_episode_id(tmp_path, rows):
    path = write_rows(tmp_path / "logs.parquet", [5, 5, 6, 6, 5], [0, 1, 0, 1, 2])
    with pytest.raises(DataError) as info:
        read_chunks(path, rows)
    assert "episode 5" in str(info.value)


@pytest.mark.parametrize("rows", [1, 2, 3, 1_000_000])
@pytest.mark.parametrize(
    ("ids", "steps"),
    [
        ([5, 5, 6, 6, 5, 5], [0, 1, 0, 1, 0, 1]),  # the id is reused from step 0
        ([5, 5, 6, 6, 5], None),  # no step column
        ([5, 5, 6, 6, 5], [0, 1, 0, 1, 2]),  # the episode's rows are split in two stretches
    ],
)
def test_non_contiguous_episode_id_is_diagnosed_as_such(tmp_path, rows, ids, steps):
    """The message says what is wrong (rows not contiguous), not a consequence such as a
    'missing' step 0 that the file does hold."""
    path = write_rows(tmp_path / "logs.parquet", ids, steps)
    with pytest.raises(DataError) as info:
        read_chunks(path, rows)
    message = str(info.value)
    assert "episode 5" in message
    assert "more than one place" in message
    assert "missing" not in message


def test_episode_split_over_files_is_diagnosed_as_such(tmp_path):
    write_rows(tmp_path / "part-0.parquet", [1, 1, 2], [0, 1, 0])
    write_rows(tmp_path / "part-1.parquet", [2, 3], [1, 0])
    with pytest.raises(DataError) as info:
        read_chunks(tmp_path, 1_000_000)
    assert "episode 2" in str(info.value)
    assert "more than one place" in str(info.value)


@pytest.mark.parametrize("rows", [1, 2, 1_000_000])
def test_non_contiguous_string_episode_id(tmp_path, rows):
    path = write_rows(tmp_path / "logs.parquet", ["a", "b", "a"])
    with pytest.raises(DataError) as info:
        read_chunks(path, rows)
    assert "episode 'a'" in str(info.value)


def test_episode_split_over_files(tmp_path):
    write_rows(tmp_path / "part-0.parquet", [1, 1, 2], [0, 1, 0])
    write_rows(tmp_path / "part-1.parquet", [2, 3], [1, 0])
    with pytest.raises(DataError, match="episode 2"):
        read_chunks(tmp_path, 2)


def test_repeated_id_far_apart_is_detected(tmp_path):
    """Many episodes between the two occurrences, so the id has left any recent buffer."""
    ids = np.concatenate([np.repeat(np.arange(20_000), 2), [17]])
    path = write_rows(tmp_path / "logs.parquet", ids)
    with pytest.raises(DataError, match="episode 17"):
        read_chunks(path, 1000)


def test_null_reward_is_a_data_error(tmp_path):
    path = write_rows(tmp_path / "logs.parquet", [0, 0], reward=pa.array([1.0, None]))
    with pytest.raises(DataError, match="'reward'"):
        read_chunks(path)


# ----------------------------------------------------------------- value checks


def location_of(message: str) -> tuple[str, str]:
    match = re.search(r"episode (\S+), step (\d+)", message)
    assert match, message
    return match.group(1), match.group(2)


@pytest.mark.parametrize(
    ("column", "value", "words"),
    [
        ("reward", np.nan, "reward"),
        ("reward", np.inf, "reward"),
        ("behavior_prob", 0.0, "behavior probability"),
        ("behavior_prob", -0.5, "behavior probability"),
        ("behavior_prob", 1.5, "> 1"),
        ("behavior_prob", np.nan, "behavior probability"),
        ("observation", np.nan, "observation"),
        ("action", -1, "action is negative"),
        # read as int64, 2^64 - 1 is -1: it was called "negative" alone
        ("action", np.uint64(2**64 - 1), "action is negative (or an unsigned one past 2^63 - 1)"),
    ],
)
@pytest.mark.parametrize("rows", [2, 1_000_000])
def test_bad_values_name_file_episode_and_step(tmp_path, column, value, words, rows):
    ids = [0, 0, 0, 7, 7, 7, 7, 9]
    steps = [0, 1, 2, 3, 0, 2, 1, 0]  # episode 7 shuffled: row 5 is step 2
    n = len(ids)
    values = {
        "observation": np.zeros(n),
        "action": np.zeros(n, np.int64),
        "reward": np.ones(n),
        "behavior_prob": np.full(n, 0.5),
    }
    values[column] = values[column].astype(np.asarray(value).dtype)
    values[column][5] = value
    path = write_rows(tmp_path / "logs.parquet", ids, steps, **values)
    with pytest.raises(DataError) as info:
        read_chunks(path, rows)
    message = str(info.value)
    assert str(path) in message
    assert words in message
    assert location_of(message) == ("7", "2")


def test_nan_in_vector_observation(tmp_path, episodes):
    bad = [dict(ep) for ep in episodes]
    obs = bad[4]["observation"].copy()
    obs[min(1, len(obs) - 1), 2] = np.nan
    bad[4]["observation"] = obs
    path = write_step_layout(bad, tmp_path / "logs.parquet")
    with pytest.raises(DataError) as info:
        read_chunks(path, 3)
    assert location_of(str(info.value)) == ("4", str(min(1, len(obs) - 1)))
    assert "observation" in str(info.value)


def test_bad_value_in_episode_layout(tmp_path, episodes):
    bad = [dict(ep) for ep in episodes]
    reward = bad[6]["reward"].copy()
    reward[-1] = np.nan
    bad[6]["reward"] = reward
    path = write_episode_layout(bad, tmp_path / "logs.parquet")
    with pytest.raises(DataError) as info:
        read_chunks(path, 5)
    assert location_of(str(info.value)) == ("6", str(len(reward) - 1))
    assert str(path) in str(info.value)


@pytest.mark.parametrize(
    ("value", "ok"), [(0.0, True), (1e-9, True), (0.5, False), (np.nan, False), (-np.inf, False)]
)
def test_behavior_log_prob_checks(tmp_path, value, ok):
    path = tmp_path / "logs.parquet"
    write_rows(path, [0, 0], behavior_prob=None, behavior_log_prob=np.array([-0.5, value]))
    if ok:
        got = flat(read_chunks(path))
        np.testing.assert_array_equal(got["log_behavior"], [-0.5, value])
    else:
        with pytest.raises(DataError) as info:
            read_chunks(path)
        assert location_of(str(info.value)) == ("0", "1")


def test_behavior_prob_of_one_within_tolerance(tmp_path):
    path = write_rows(
        tmp_path / "logs.parquet",
        [0, 0],
        behavior_prob=np.array([1.0, np.float32(1.0) + np.float32(1e-7)]),
    )
    got = flat(read_chunks(path))
    assert np.all(np.abs(got["log_behavior"]) < 1e-6)


def test_continuous_density_above_one_is_allowed(tmp_path):
    path = write_rows(
        tmp_path / "logs.parquet",
        [0, 0],
        action=np.array([0.5, -1.0]),
        behavior_prob=np.array([2.5, 0.1]),
    )
    got = flat(read_chunks(path))
    np.testing.assert_allclose(got["log_behavior"], np.log([2.5, 0.1]))


# ------------------------------------------------------------------------ hashing


def test_mix64_known_value_and_determinism():
    # splitmix64 seeded with 0 outputs 0xE220A8397B1DCDAF first
    assert mix64(np.array([0], np.uint64))[0] == np.uint64(0xE220A8397B1DCDAF)
    rng = np.random.default_rng(0)
    values = rng.integers(0, 2**63, size=1000, dtype=np.int64).view(np.uint64)
    np.testing.assert_array_equal(mix64(values), mix64(values.copy()))
    assert mix64(values).dtype == np.uint64


def test_mix64_has_no_collisions_on_samples():
    rng = np.random.default_rng(1)
    random = rng.integers(0, 2**64 - 1, size=200_000, dtype=np.uint64, endpoint=True)
    random = np.unique(random)
    assert np.unique(mix64(random)).size == random.size
    sequential = np.arange(-100_000, 100_000, dtype=np.int64).view(np.uint64)
    assert np.unique(mix64(sequential)).size == sequential.size


def test_hash_strings_equal_strings_equal_hashes():
    words = ["", "a", "ep-000001", "ünïcode", "ep-000001", "a", "", "x" * 1000]
    hashes = hash_strings(pa.array(words))
    assert hashes.dtype == np.uint64
    assert hashes[0] == hashes[6]
    assert hashes[1] == hashes[5]
    assert hashes[2] == hashes[4]
    # string and large_string give the same hashes; and again on a second call
    np.testing.assert_array_equal(hashes, hash_strings(pa.array(words, pa.large_string())))
    np.testing.assert_array_equal(hashes, hash_strings(pa.array(words)))
    assert len(set(hashes.tolist())) == 5


def test_hash_strings_random_sample_has_no_collisions():
    rng = np.random.default_rng(5)
    lengths = rng.integers(0, 24, size=100_000)
    alphabet = np.frombuffer(
        b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_", np.uint8
    )
    data = alphabet[rng.integers(0, alphabet.size, size=int(lengths.sum()))]
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    array = pa.StringArray.from_buffers(
        len(lengths), pa.py_buffer(offsets), pa.py_buffer(data.tobytes())
    )
    strings = array.to_pylist()
    unique = sorted(set(strings))
    hashes = hash_strings(pa.array(unique))
    assert np.unique(hashes).size == len(unique)


def test_hash_strings_structured_ids_have_no_collisions():
    ids = [f"ep-{i:06d}" for i in range(100_000)] + [
        f"run{i % 7}/episode_{i}" for i in range(50_000)
    ]
    hashes = hash_strings(pa.array(ids))
    assert np.unique(hashes).size == len(ids)


def test_hash_strings_of_slices_match_the_whole():
    strings = [f"id-{i}-{'z' * (i % 5)}" for i in range(50)]
    for dtype in (pa.string(), pa.large_string()):
        array = pa.array(strings, dtype)
        whole = hash_strings(array)
        for start, stop in [(0, 50), (3, 17), (17, 18), (49, 50), (10, 10)]:
            np.testing.assert_array_equal(
                hash_strings(array.slice(start, stop - start)), whole[start:stop]
            )


def test_id_keys_agree_between_integer_types():
    ints = np.array([0, 1, 2, -5, 2**31 - 1], np.int64)
    np.testing.assert_array_equal(id_keys(ints), id_keys(pa.array(ints)))
    np.testing.assert_array_equal(id_keys(ints), id_keys(pa.array(ints.astype(np.int32))))
    np.testing.assert_array_equal(id_keys(pa.array(["a", "b"])), hash_strings(pa.array(["a", "b"])))


# -------------------------------------------------- a probability and its log, both found


@pytest.mark.parametrize("layout", ["step", "episode"])
@pytest.mark.parametrize("role", ["behavior", "target"])
def test_a_probability_and_its_log_that_disagree_are_refused(tmp_path, layout, role):
    """Both found, neither named: the probability column was read and the log one ignored,
    so a run gave the estimate of whichever column was wrong without a word."""
    prob = np.array([0.5, 0.25, 1.0, 0.2])
    log = np.log(prob)
    log[2] = np.log(0.3)  # episode 1, step 0
    columns = {f"{role}_prob": prob, f"{role}_log_prob": log}
    if role == "target":
        columns["behavior_prob"] = np.full(4, 0.5)
    path = write_rows(tmp_path / "logs.parquet", [0, 0, 1, 1], [0, 1, 0, 1], **columns)
    if layout == "episode":  # one row per episode, list columns
        table = pq.read_table(path)
        names = [name for name in table.column_names if name != "episode_id"]
        grouped = table.group_by("episode_id", use_threads=False).aggregate(
            [(name, "list") for name in names]
        )
        columns = [name.removesuffix("_list") for name in grouped.column_names]
        pq.write_table(grouped.rename_columns(columns), path)
    with pytest.raises(DataError) as info:
        read_chunks(path, logged_target=role == "target")
    message = str(info.value)
    assert f"columns '{role}_prob' and '{role}_log_prob' disagree" in message
    assert "probability 1 against 0.3" in message and "episode 1" in message
    assert f"--{role}-log-prob-col" in message and f"--{role}-prob-col" in message


def test_a_probability_and_its_log_that_agree_are_read_as_before(tmp_path):
    prob = np.array([0.5, 0.25, 1.0, 1e-30])
    path = write_rows(
        tmp_path / "logs.parquet",
        [0, 0, 1, 1],
        [0, 1, 0, 1],
        behavior_prob=prob,
        behavior_log_prob=np.log(prob.astype(np.float32)).astype(np.float64),  # float32 logs
    )
    got = flat(read_chunks(path))["log_behavior"]
    np.testing.assert_array_equal(got, np.log(prob))  # the probability column's


def test_a_twin_column_that_cannot_be_compared_is_left_alone(tmp_path):
    """Episode layout, a twin (log-probability) list null or of another length: it stopped
    every command with "column is null" that --on-invalid drop could not drop; it is now
    not compared in that batch. Step layout, values that are no probability (-0.1 beside
    NaN) are the used column's validation's, not a disagreement."""
    prob = [[0.5, 0.25], [1.0, 0.2]]
    table = pa.table(
        {
            "episode_id": [0, 1],
            "observation": [[0.0, 0.0], [0.0, 0.0]],
            "action": [[0, 1], [0, 1]],
            "reward": [[1.0, 1.0], [1.0, 1.0]],
            "behavior_prob": prob,
            "behavior_log_prob": [None, list(np.log(prob[1]))],
        }
    )
    pq.write_table(table, tmp_path / "null.parquet")
    got = flat(read_chunks(tmp_path / "null.parquet"))["log_behavior"]
    np.testing.assert_array_equal(got, np.log(np.concatenate(prob)))
    shorter = table.set_column(5, "behavior_log_prob", pa.array([[-0.7], list(np.log(prob[1]))]))
    pq.write_table(shorter, tmp_path / "shorter.parquet")
    assert len(read_chunks(tmp_path / "shorter.parquet")) == 1
    # the other episodes of the batch are still compared: a null list left them all
    # uncompared, and a disagreement in episode 1 unseen (``ope convert`` refused it)
    disagree = table.set_column(5, "behavior_log_prob", pa.array([None, [-0.7, -1.6]]))
    pq.write_table(disagree, tmp_path / "disagree.parquet")
    with pytest.raises(DataError, match="episode 1, step 0: columns 'behavior_prob' and"):
        read_chunks(tmp_path / "disagree.parquet")
    rows = {
        "behavior_prob": np.array([0.5, -0.1]),
        "behavior_log_prob": np.array([np.log(0.5), np.nan]),
    }
    path = write_rows(tmp_path / "invalid.parquet", [0, 0], [0, 1], **rows)
    with pytest.raises(DataError) as info:
        read_chunks(path)
    assert "negative" in str(info.value) and "disagree" not in str(info.value)
