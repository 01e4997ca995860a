"""D4RL-style HDF5 files as a source (ope_cli/data/sources/d4rl.py): episodes from the terminal
and timeout flags, a trailing truncated episode, behavior log-probabilities from
``infos/action_log_probs``, the same evaluation inputs (so the same estimates) as the same data
in Parquet, bad inputs (the DataError of the function that meets them)."""

from __future__ import annotations

import sys

import h5py
import numpy as np
import pyarrow as pa
import pytest
from datasets import random_checkpoint, save_checkpoint, write_flat_steps
from evaluation_inputs import assert_same_evaluation, data_error, evaluation_inputs, read_episodes

import ope_cli
from ope_cli.config import ColumnMapping
from ope_cli.data.columns import resolve_schema
from ope_cli.data.episode_stream import DataConfig, open_episodes
from ope_cli.data.sources import d4rl, open_dataset, sniff_format
from ope_cli.errors import DataError

OBS_DIM, N_ACTIONS = 3, 4
# (length, how it ends): by a terminal flag, a timeout flag, or not at all (the file's end)
EPISODES = ((5, "terminal"), (1, "timeout"), (7, "timeout"), (4, "terminal"), (3, None))


def d4rl_arrays(episodes=EPISODES, seed: int = 0) -> dict[str, np.ndarray]:
    """Flat per-step arrays of ``episodes`` as a D4RL file holds them, keyed by HDF5 path."""
    rng = np.random.default_rng(seed)
    n = sum(length for length, _ in episodes)
    terminals, timeouts = np.zeros(n, bool), np.zeros(n, bool)
    end = np.cumsum([length for length, _ in episodes]) - 1
    for (_, how), last in zip(episodes, end, strict=True):
        if how == "terminal":
            terminals[last] = True
        elif how == "timeout":
            timeouts[last] = True
    observations = rng.normal(size=(n + 1, OBS_DIM)).astype(np.float32)
    return {
        "observations": observations[:-1],
        "next_observations": observations[1:],
        "actions": rng.integers(0, N_ACTIONS, size=n),
        "rewards": rng.normal(size=n).astype(np.float32),
        "terminals": terminals,
        "timeouts": timeouts,
        "infos/action_log_probs": np.log(rng.uniform(0.1, 1.0, size=n)),
        "infos/qpos": rng.normal(size=(n, 2)),
    }


def continuous(arrays: dict[str, np.ndarray], seed: int = 1) -> dict[str, np.ndarray]:
    """``arrays`` with [N, 2] float32 actions and float32 flags (as some D4RL files have)."""
    rng = np.random.default_rng(seed)
    n = arrays["rewards"].size
    arrays = {**arrays, "actions": rng.normal(size=(n, 2)).astype(np.float32)}
    arrays["terminals"] = arrays["terminals"].astype(np.float32)
    arrays["timeouts"] = arrays["timeouts"].astype(np.float32)
    return arrays


def write_d4rl(path, arrays: dict[str, np.ndarray]):
    with h5py.File(path, "w") as handle:
        for key, values in arrays.items():
            handle.create_dataset(key, data=values)
        handle.create_dataset("metadata/policy/weight", data=np.zeros((3, 3)))
    return path


def write_step_parquet(path, arrays: dict[str, np.ndarray], episodes=EPISODES):
    """The same steps as a step-layout Parquet file with the standard column names."""
    return write_flat_steps(
        path,
        [length for length, _ in episodes],
        arrays["observations"],
        arrays["actions"],
        arrays["rewards"],
        arrays["infos/action_log_probs"],
    )


def read_all(data, columns, rows):
    return list(data.iter_batches(columns, rows))


# ------------------------------------------------------------------------------ reading


def test_episodes_end_at_terminals_and_timeouts_and_the_tail_is_an_episode(tmp_path):
    path = write_d4rl(tmp_path / "d.hdf5", d4rl_arrays())
    data = open_dataset(str(path))
    assert data.format == "d4rl"
    assert data.count_rows() == 20
    batches = read_all(data, ["episode_id", "step", "reward"], rows=3)
    assert [b.row_offset for b in batches] == list(range(0, 20, 3))
    assert [b.last_in_file for b in batches] == [False] * 6 + [True]
    assert {b.file for b in batches} == {str(path)}
    ids = np.concatenate([b.batch.column("episode_id").to_numpy() for b in batches])
    steps = np.concatenate([b.batch.column("step").to_numpy() for b in batches])
    lengths = [length for length, _ in EPISODES]
    np.testing.assert_array_equal(ids, np.repeat(np.arange(5), lengths))
    np.testing.assert_array_equal(steps, np.concatenate([np.arange(t) for t in lengths]))


def test_the_registry_recognises_hdf5_by_its_magic_bytes(tmp_path):
    path = write_d4rl(tmp_path / "logs.data", d4rl_arrays())
    assert sniff_format(str(path)) is d4rl


def test_schema_has_standard_names_and_hdf5_paths(tmp_path):
    arrays = d4rl_arrays()
    data = open_dataset(str(write_d4rl(tmp_path / "d.hdf5", arrays)))
    schema = data.schema
    assert schema.field("observation").type == pa.list_(pa.float32(), OBS_DIM)
    assert schema.field("action").type == pa.int64()
    assert schema.field("reward").type == pa.float32()
    assert schema.field("behavior_log_prob").type == pa.float64()
    assert schema.field("infos/qpos").type == pa.list_(pa.float64(), 2)
    assert schema.field("terminals").type == pa.bool_()
    assert not any(name.startswith("metadata/") for name in schema.names)
    # the datasets the standard columns read are not listed again under their paths (two
    # columns for a role), but infos/action_log_probs is, for its option
    assert {"observations", "actions", "rewards"}.isdisjoint(schema.names)
    assert "infos/action_log_probs" in schema.names
    (batch,) = read_all(data, ["observation", "next_observations", "behavior_log_prob"], 100)
    observed = np.stack(batch.batch.column("observation").to_numpy(zero_copy_only=False))
    np.testing.assert_array_equal(observed, arrays["observations"])
    np.testing.assert_array_equal(
        batch.batch.column("behavior_log_prob").to_numpy(), arrays["infos/action_log_probs"]
    )


def test_without_action_log_probs_there_is_no_behavior_column(tmp_path):
    arrays = d4rl_arrays()
    del arrays["infos/action_log_probs"]
    data = open_dataset(str(write_d4rl(tmp_path / "d.hdf5", arrays)))
    assert "behavior_log_prob" not in data.schema.names


def test_a_propensity_dataset_under_its_own_name_is_found(tmp_path):
    """A top-level action_probs dataset is a column under its path, found as the behavior
    probability (a first cut of the two-candidates rule had dropped it)."""
    arrays = d4rl_arrays()
    del arrays["infos/action_log_probs"]
    arrays["action_probs"] = np.exp(d4rl_arrays()["infos/action_log_probs"])
    schema = resolve_schema(
        open_dataset(str(write_d4rl(tmp_path / "d.hdf5", arrays))).schema,
        ColumnMapping(),
        logged_target=False,
    )
    assert schema.columns["behavior_prob"] == "action_probs"
    # stored [N, 1] it reads as one number per step; wider, it is no column (the file's
    # own infos/action_log_probs serves), where both were refused as a list column
    for shape, found in (((-1, 1), "action_probs"), ((-1, N_ACTIONS), None)):
        wide = {**d4rl_arrays(), "action_probs": np.ones(arrays["rewards"].size * shape[1])}
        wide["action_probs"] = wide["action_probs"].reshape(shape) / shape[1]
        data = open_dataset(str(write_d4rl(tmp_path / f"w{shape[1]}.hdf5", wide)))
        resolved = resolve_schema(data.schema, ColumnMapping(), logged_target=False)
        assert resolved.columns.get("behavior_prob") == found, shape


def test_a_file_ending_on_a_flag_has_no_empty_tail_episode(tmp_path):
    episodes = ((2, "terminal"), (3, "timeout"))
    data = open_dataset(str(write_d4rl(tmp_path / "d.hdf5", d4rl_arrays(episodes))))
    (batch,) = read_all(data, ["episode_id"], 100)
    assert batch.batch.column(0).to_pylist() == [0, 0, 1, 1, 1]


def test_episode_ids_count_on_across_files(tmp_path):
    write_d4rl(tmp_path / "a.hdf5", d4rl_arrays(seed=1))
    write_d4rl(tmp_path / "b.hdf5", d4rl_arrays(((2, "terminal"), (2, None)), seed=2))
    data = open_dataset(str(tmp_path / "*.hdf5"))

    def ids(dataset) -> list[int]:
        return [i for b in read_all(dataset, ["episode_id"], 7) for i in b.batch[0].to_pylist()]

    assert ids(data) == [*np.repeat(np.arange(5), [5, 1, 7, 4, 3]), 5, 5, 6, 6]
    second = data.restrict((str(tmp_path / "b.hdf5"),))  # one process's share
    assert ids(second) == [5, 5, 6, 6]


def test_one_number_per_step_stored_as_a_column_of_one_reads_as_one_number(tmp_path):
    """Rewards, flags, behavior log-probabilities and integer actions of shape [N, 1] (as
    some writers store them) are the same per-step numbers as [N]; float actions [N, 1]
    stay vectors of one (a one-dimensional continuous action)."""
    arrays = d4rl_arrays()
    policy = save_checkpoint(
        tmp_path / "pi.npz",
        random_checkpoint(
            "linear_softmax", np.random.default_rng(3), obs_dim=OBS_DIM, act_dim=N_ACTIONS
        ),
    )
    write_d4rl(tmp_path / "flat.hdf5", arrays)
    columns = {**arrays}
    for key in ("actions", "rewards", "terminals", "timeouts", d4rl.BEHAVIOR_KEY):
        columns[key] = arrays[key][:, None]
    write_d4rl(tmp_path / "columns.hdf5", columns)
    assert_same_evaluation(
        evaluation_inputs(tmp_path / "columns.hdf5", policy, read_rows=4),
        evaluation_inputs(tmp_path / "flat.hdf5", policy, read_rows=4),
    )
    one = continuous(arrays)
    one["actions"] = one["actions"][:, :1]
    data = open_dataset(str(write_d4rl(tmp_path / "one.hdf5", one)))
    assert data.schema.field("action").type == pa.list_(pa.float32(), 1)


def test_a_file_without_rows_ends_in_one_empty_batch(tmp_path):
    arrays = {key: values[:0] for key, values in d4rl_arrays().items()}
    data = open_dataset(str(write_d4rl(tmp_path / "empty.hdf5", arrays)))
    (batch,) = read_all(data, ["episode_id", "reward"], 4)
    assert batch.batch.num_rows == 0 and batch.last_in_file
    policy = save_checkpoint(
        tmp_path / "pi.npz",
        random_checkpoint(
            "linear_softmax", np.random.default_rng(3), obs_dim=OBS_DIM, act_dim=N_ACTIONS
        ),
    )
    message = data_error(ope_cli.evaluate, tmp_path / "empty.hdf5", policies=[policy])
    assert message == f"{tmp_path / 'empty.hdf5'}: no episodes (the data has no rows)"


# ------------------------------------------------------------------------ through ope


@pytest.mark.parametrize(
    ("behavior_key", "kind"),
    [
        ("infos/action_log_probs", "linear_softmax"),
        ("infos/logp", "linear_softmax"),
        ("infos/action_log_probs", "linear_gaussian"),
    ],
)
def test_evaluate_reads_the_same_inputs_as_from_parquet(tmp_path, behavior_key, kind):
    arrays = d4rl_arrays()
    if kind == "linear_gaussian":
        arrays = continuous(arrays)
    policy = save_checkpoint(
        tmp_path / "pi.npz",
        random_checkpoint(kind, np.random.default_rng(3), obs_dim=OBS_DIM, act_dim=2),
    )
    write_step_parquet(tmp_path / "steps.parquet", arrays)
    arrays[behavior_key] = arrays.pop("infos/action_log_probs")
    write_d4rl(tmp_path / "d.hdf5", arrays)
    option = {} if behavior_key == d4rl.BEHAVIOR_KEY else {"behavior_log_prob_col": behavior_key}
    from_hdf5 = evaluation_inputs(tmp_path / "d.hdf5", policy, read_rows=4, **option)
    from_parquet = evaluation_inputs(tmp_path / "steps.parquet", policy, read_rows=4)
    assert_same_evaluation(from_hdf5, from_parquet)


def test_inspect_reads_the_file(tmp_path):
    write_d4rl(tmp_path / "d.hdf5", d4rl_arrays())
    report = ope_cli.inspect(tmp_path / "d.hdf5").to_dict()
    assert report["dataset"]["format"] == "d4rl"
    assert report["dataset"]["columns"]["behavior_log_prob"]["name"] == "behavior_log_prob"
    assert report["counts"]["episodes"] == 5
    assert report["counts"]["steps"] == 20
    assert (report["counts"]["min_length"], report["counts"]["max_length"]) == (1, 7)
    assert report["valid"] is True


# ------------------------------------------------------------------------ bad inputs


def test_truncated_file(tmp_path):
    path = write_d4rl(tmp_path / "d.hdf5", d4rl_arrays())
    raw = path.read_bytes()
    path.write_bytes(raw[: len(raw) // 2])
    message = data_error(open_dataset, str(path))
    assert str(path) in message and "HDF5" in message


def test_corrupt_file(tmp_path):
    path = write_d4rl(tmp_path / "d.hdf5", d4rl_arrays())
    raw = bytearray(path.read_bytes())
    raw[8:400] = bytes(392)  # the superblock and root group, after the magic bytes
    path.write_bytes(bytes(raw))
    assert str(path) in data_error(open_dataset, str(path))


def test_corrupt_data_chunk_names_the_rows(tmp_path):
    path = tmp_path / "d.hdf5"
    arrays = d4rl_arrays()
    with h5py.File(path, "w") as handle:
        for key, values in arrays.items():
            chunks = (8, *values.shape[1:])
            handle.create_dataset(key, data=values, chunks=chunks, compression="gzip")
        info = handle["rewards"].id.get_chunk_info(1)  # rows 8..15
    raw = bytearray(path.read_bytes())
    raw[info.byte_offset : info.byte_offset + info.size] = b"\xff" * info.size
    path.write_bytes(bytes(raw))
    open_dataset(str(path))  # the damage shows only when the rows are read
    message = data_error(read_episodes, path, read_rows=8)
    assert str(path) in message and "cannot read rows 8..15" in message


@pytest.mark.parametrize("key", d4rl.REQUIRED)
def test_missing_key_is_named(tmp_path, key):
    arrays = d4rl_arrays()
    del arrays[key]
    path = write_d4rl(tmp_path / "d.hdf5", arrays)
    message = data_error(open_dataset, str(path))
    assert str(path) in message and repr(key) in message


@pytest.mark.parametrize("key", ["actions", "timeouts", "infos/action_log_probs"])
def test_datasets_of_different_lengths(tmp_path, key):
    arrays = d4rl_arrays()
    arrays[key] = arrays[key][:-1]
    path = write_d4rl(tmp_path / "d.hdf5", arrays)
    message = data_error(open_dataset, str(path))
    assert str(path) in message and "different lengths" in message and repr(key) in message


def test_no_behavior_probabilities_points_to_behavior(tmp_path):
    arrays = d4rl_arrays()
    del arrays["infos/action_log_probs"]
    path = write_d4rl(tmp_path / "d.hdf5", arrays)
    message = data_error(open_episodes, DataConfig(str(path)))  # as with --policy
    assert "behavior probability" in message and "with --behavior" in message


def test_missing_h5py_says_how_to_install_it(tmp_path, monkeypatch):
    path = write_d4rl(tmp_path / "d.hdf5", d4rl_arrays())
    monkeypatch.setitem(sys.modules, "h5py", None)  # import h5py raises ImportError
    with pytest.raises(DataError, match=r"pip install 'ope-cli\[hdf5\]'"):
        open_dataset(str(path))


def test_files_whose_numbers_differ_in_float_width_read_widened(tmp_path):
    """Parquet files that store rewards as float32 in one and float64 in another evaluate
    together; such HDF5 files were refused as "of another kind". Each float dataset now
    reads as the widest any file stores (exact), and the values are each file's own."""
    first = d4rl_arrays(seed=1)  # float32 rewards and observations
    second = d4rl_arrays(((2, "terminal"), (2, None)), seed=2)
    second["rewards"] = second["rewards"].astype(np.float64) + 1e-12
    second["observations"] = second["observations"].astype(np.float64)
    write_d4rl(tmp_path / "a.hdf5", first)
    write_d4rl(tmp_path / "b.hdf5", second)
    data = open_dataset(str(tmp_path / "*.hdf5"))
    assert data.schema.field("reward").type == pa.float64()
    assert data.schema.field("observation").type == pa.list_(pa.float64(), OBS_DIM)
    batches = read_all(data, ["reward", "observation"], 3)
    rewards = np.concatenate([b.batch.column(0).to_numpy() for b in batches])
    np.testing.assert_array_equal(rewards, np.concatenate([first["rewards"], second["rewards"]]))


@pytest.mark.parametrize(
    ("key", "values", "says"),
    [
        ("observations", lambda a: np.zeros((a["rewards"].size, OBS_DIM + 1)), "list<item: float"),
        ("actions", lambda a: a["actions"].astype(np.float64), "int64"),
        # integer observations are state indices, floats features: not widened
        ("observations", lambda a: np.zeros((a["rewards"].size, OBS_DIM), np.int64), "float"),
    ],
)
def test_files_whose_datasets_differ_otherwise_name_the_dataset(tmp_path, key, values, says):
    first = d4rl_arrays(seed=1)
    second = d4rl_arrays(seed=2)
    second[key] = values(second)
    write_d4rl(tmp_path / "a.hdf5", first)
    write_d4rl(tmp_path / "b.hdf5", second)
    message = data_error(open_dataset, str(tmp_path / "*.hdf5"))
    assert message.startswith(f"{tmp_path / 'b.hdf5'}: dataset {key!r} ")
    assert says in message and str(tmp_path / "a.hdf5") in message


def test_files_with_other_datasets_name_one(tmp_path):
    first, second = d4rl_arrays(seed=1), d4rl_arrays(seed=2)
    del second["infos/qpos"]
    write_d4rl(tmp_path / "a.hdf5", first)
    write_d4rl(tmp_path / "b.hdf5", second)
    message = data_error(open_dataset, str(tmp_path / "*.hdf5"))
    assert message == (
        f"{tmp_path / 'b.hdf5'}: it has no dataset 'infos/qpos', which {tmp_path / 'a.hdf5'} "
        "has; read files with the same datasets together"
    )


def test_files_whose_integers_or_numbers_differ_in_width_read_widened(tmp_path):
    """int32 actions in one file and int64 in another, integer rewards in one and float32
    in another: read together as int64 and float64 (Parquet files read so)."""
    first, second = d4rl_arrays(seed=1), d4rl_arrays(((2, "terminal"), (2, None)), seed=2)
    first["actions"] = first["actions"].astype(np.int32)
    first["rewards"] = np.arange(first["rewards"].size, dtype=np.int64)
    write_d4rl(tmp_path / "a.hdf5", first)
    write_d4rl(tmp_path / "b.hdf5", second)
    data = open_dataset(str(tmp_path / "*.hdf5"))
    assert data.schema.field("action").type == pa.int64()
    assert data.schema.field("reward").type == pa.float64()
    batches = read_all(data, ["action", "reward"], 4)
    actions = np.concatenate([b.batch.column(0).to_numpy() for b in batches])
    rewards = np.concatenate([b.batch.column(1).to_numpy() for b in batches])
    np.testing.assert_array_equal(actions, np.concatenate([first["actions"], second["actions"]]))
    np.testing.assert_array_equal(rewards, np.concatenate([first["rewards"], second["rewards"]]))


def test_a_third_file_is_told_the_first_files_own_type(tmp_path):
    """uint8, int8, then float32 actions: the message said "int16 in a.hdf5", the type the
    first two widen to, which no file stores."""
    for name, dtype in (("a", np.uint8), ("b", np.int8), ("c", np.float32)):
        arrays = d4rl_arrays(seed=1)
        arrays["actions"] = arrays["actions"].astype(dtype)
        write_d4rl(tmp_path / f"{name}.hdf5", arrays)
    message = data_error(open_dataset, str(tmp_path / "*.hdf5"))
    assert f"holds float, but uint8 in {tmp_path / 'a.hdf5'}" in message
