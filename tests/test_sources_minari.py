"""Minari datasets as a source (ope_cli/data/sources/minari.py), built by the ``minari`` library
itself in both storage formats: ragged episodes, a Dict observation space flattened as
gymnasium flattens it, an episode stored with only N observations, infos paired with the
step that returned them, the same evaluation inputs (so the same estimates) as the same steps
in Parquet, bad inputs."""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import warnings

import gymnasium as gym
import h5py
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasets import assert_one_line_exit_3, random_checkpoint, save_checkpoint, write_flat_steps
from evaluation_inputs import assert_same_evaluation, data_error, evaluation_inputs, read_episodes

import ope_cli
from ope_cli.data.sources import minari, open_dataset
from ope_cli.errors import DataError

pytest.importorskip("minari")
from minari.data_collector import EpisodeBuffer  # noqa: E402

N_ACTIONS = 4
LENGTHS = (5, 1, 7, 4, 3, 6, 2, 5, 3, 8, 1, 4)  # ragged, 49 steps
SHORT = 3  # this episode stores only N observations (and N infos)
DICT_SPACE = gym.spaces.Dict(
    {"pos": gym.spaces.Box(-5, 5, (2,), np.float32), "mode": gym.spaces.Discrete(3, start=1)}
)
OBS_DIM = 5  # gymnasium.spaces.flatten: one-hot mode (3), then pos (2): keys sorted
BOX_SPACE = gym.spaces.Box(-5, 5, (3,), np.float64)


def make_buffers(obs_space: gym.Space, action_space: gym.Space, seed: int = 0):
    """Episode buffers as Minari's recorder fills them: N + 1 observations and infos (the
    reset's first; it has no action_log_probs, so it holds a dummy 0), N actions."""
    rng = np.random.default_rng(seed)
    obs_space.seed(seed)
    action_space.seed(seed + 1)
    buffers = []
    for i, n in enumerate(LENGTHS):
        k = n if i == SHORT else n + 1
        observations = [obs_space.sample() for _ in range(k)]
        if isinstance(obs_space, gym.spaces.Dict):
            observations = {
                key: np.stack([o[key] for o in observations]) for key in obs_space.spaces
            }
        else:
            observations = np.stack(observations)
        log_probs = np.log(rng.uniform(0.1, 1.0, size=k))
        if k == n + 1:
            log_probs[0] = 0.0
        buffers.append(
            EpisodeBuffer(
                id=i,
                observations=observations,
                actions=[action_space.sample() for _ in range(n)],
                rewards=list(rng.normal(size=n)),
                terminations=[False] * (n - 1) + [i % 2 == 0],
                truncations=[False] * (n - 1) + [i % 2 == 1],
                infos={
                    "action_log_probs": list(log_probs),
                    "extra": {"speed": list(rng.normal(size=(k, 2)))},
                },
            )
        )
    return buffers


def create(root, dataset_id, buffers, obs_space, action_space, data_format):
    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        patch.setenv("MINARI_DATASETS_PATH", str(root))
        import minari as library

        library.create_dataset_from_buffers(
            dataset_id,
            buffers,
            observation_space=obs_space,
            action_space=action_space,
            data_format=data_format,
            algorithm_name="test",
        )
    return root / dataset_id


def reference_parquet(path, buffers, obs_space):
    """The same steps as step-layout Parquet: observations flattened by gymnasium itself,
    behavior log-probability from the info returned by the step (row t + 1 of N + 1)."""
    rows = {k: [] for k in ("observation", "action", "reward", "blp")}
    for buffer in buffers:
        n = len(buffer.rewards)
        shift = len(buffer.infos["action_log_probs"]) - n
        for t in range(n):
            if isinstance(obs_space, gym.spaces.Dict):
                obs = {key: buffer.observations[key][t] for key in obs_space.spaces}
            else:
                obs = buffer.observations[t]
            rows["observation"].append(gym.spaces.flatten(obs_space, obs).astype(np.float64))
            rows["action"].append(buffer.actions[t])
            rows["reward"].append(buffer.rewards[t])
            rows["blp"].append(buffer.infos["action_log_probs"][t + shift])
    lengths = [len(buffer.rewards) for buffer in buffers]
    observation, action = np.stack(rows["observation"]), np.asarray(rows["action"])
    return write_flat_steps(path, lengths, observation, action, rows["reward"], rows["blp"])


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """{name: dataset directory} of the datasets the tests read, their reference Parquet
    files, and the root they live under."""
    root = tmp_path_factory.mktemp("minari-root")
    discrete = gym.spaces.Discrete(N_ACTIONS)
    box_actions = gym.spaces.Box(-1, 1, (2,), np.float32)
    dict_buffers = make_buffers(DICT_SPACE, discrete)
    box_buffers = make_buffers(BOX_SPACE, box_actions, seed=5)
    out = {"root": root}
    for fmt in ("hdf5", "arrow"):
        out[fmt] = create(root, f"test/dict-{fmt}-v0", dict_buffers, DICT_SPACE, discrete, fmt)
    out["box"] = create(root, "test/box-v1", box_buffers, BOX_SPACE, box_actions, "hdf5")
    out["dict.parquet"] = reference_parquet(root / "dict.parquet", dict_buffers, DICT_SPACE)
    out["box.parquet"] = reference_parquet(root / "box.parquet", box_buffers, BOX_SPACE)
    out["dict_buffers"] = dict_buffers
    return out


def column(data, name):
    batches = [b.batch.column(0) for b in data.iter_batches([name], 6)]
    return pa.chunked_array(batches).to_pylist()


# ------------------------------------------------------------------------------ reading


@pytest.mark.parametrize("fmt", ["hdf5", "arrow"])
def test_reads_steps_in_the_standard_columns(made, fmt):
    data = open_dataset(str(made[fmt]))
    assert data.format == "minari"
    assert data.count_rows() == sum(LENGTHS)
    reference = pq.read_table(made["dict.parquet"])
    for name in ("episode_id", "step", "action", "behavior_log_prob"):
        assert column(data, name) == reference.column(name).to_pylist(), name
    np.testing.assert_allclose(
        column(data, "observation"), reference.column("observation").to_pylist(), rtol=0
    )
    assert data.schema.field("observation").type == pa.list_(pa.float64(), OBS_DIM)
    assert data.schema.field("infos/extra/speed").type == pa.list_(pa.float64(), 2)
    assert data.schema.field("observations/pos").type == pa.list_(pa.float32(), 2)
    flags = [(i % 2 == 0, i % 2 == 1) for i, n in enumerate(LENGTHS) for t in range(n)]
    last = np.cumsum(LENGTHS) - 1
    got = list(zip(column(data, "terminations"), column(data, "truncations"), strict=True))
    assert [got[r] for r in last] == [flags[r] for r in last]
    assert sum(map(any, got)) == len(LENGTHS)


@pytest.mark.parametrize("fmt", ["hdf5", "arrow"])
def test_the_last_observation_is_the_final_state(made, fmt):
    data = open_dataset(str(made[fmt]))
    observation, following = column(data, "observation"), column(data, "next_observation")
    starts = np.cumsum((0, *LENGTHS))
    first, stop = starts[0], starts[1]
    np.testing.assert_array_equal(following[first : stop - 1], observation[first + 1 : stop])
    buffer = made["dict_buffers"][0]
    final = {key: buffer.observations[key][-1] for key in DICT_SPACE.spaces}
    np.testing.assert_allclose(following[stop - 1], gym.spaces.flatten(DICT_SPACE, final))
    assert following[starts[SHORT + 1] - 1] is None  # only N observations: no final state


@pytest.mark.parametrize("fmt", ["hdf5", "arrow"])
def test_tuple_observations_flatten_as_gymnasium_does(tmp_path, fmt):
    space = gym.spaces.Tuple(
        (
            gym.spaces.Box(-1, 1, (2,), np.float32),
            gym.spaces.Discrete(3, start=-1),
            gym.spaces.MultiDiscrete([2, 3]),
        )
    )
    space.seed(1)
    buffers, expected = [], []
    for i, n in enumerate((3, 2)):
        values = [space.sample() for _ in range(n + 1)]
        expected += [gym.spaces.flatten(space, v) for v in values[:n]]
        buffers.append(
            EpisodeBuffer(
                id=i,
                observations=tuple(np.stack([v[j] for v in values]) for j in range(3)),
                actions=[0] * n,
                rewards=[0.0] * n,
                terminations=[False] * n,
                truncations=[False] * n,
            )
        )
    path = create(tmp_path, f"test/tuple-{fmt}-v0", buffers, space, gym.spaces.Discrete(2), fmt)
    data = open_dataset(str(path))
    assert data.schema.field("observation").type == pa.list_(pa.float64(), 2 + 3 + 5)
    np.testing.assert_allclose(column(data, "observation"), expected, rtol=0)


@pytest.mark.parametrize("fmt", ["hdf5", "arrow"])
def test_discrete_spaces_that_start_elsewhere_than_0_read_from_0(tmp_path, fmt):
    """Discrete(4, start=1) actions and Discrete(5, start=-2) states are stored as 1..4 and
    -2..2; a tabular policy indexes 0..3 and 0..4. Only a Dict or Tuple member's start was
    taken away: a top-level space's values were read as stored, so a policy with more
    entries read the wrong ones without a word."""
    states, actions = gym.spaces.Discrete(5, start=-2), gym.spaces.Discrete(4, start=1)
    states.seed(2)
    actions.seed(3)
    buffers, expected_states, expected_actions = [], [], []
    for i, n in enumerate((3, 4)):
        observed = [int(states.sample()) for _ in range(n + 1)]
        taken = [int(actions.sample()) for _ in range(n)]
        expected_states += [o + 2 for o in observed[:n]]
        expected_actions += [a - 1 for a in taken]
        buffers.append(
            EpisodeBuffer(
                id=i,
                observations=np.asarray(observed),
                actions=taken,
                rewards=[0.0] * n,
                terminations=[False] * (n - 1) + [True],
                truncations=[False] * n,
            )
        )
    path = create(tmp_path, f"test/start-{fmt}-v0", buffers, states, actions, fmt)
    data = open_dataset(str(path))
    assert column(data, "observation") == expected_states
    assert column(data, "action") == expected_actions
    assert min(expected_states) == 0 and min(expected_actions) == 0


def test_rewards_stored_one_per_row_in_a_column_read_as_numbers(made, tmp_path):
    """Rewards (and flags) stored [N, 1] read as [N], as D4RL files' do: they read as lists
    of one number, and the data was refused as the episode layout with a message about
    another column."""
    copy = tmp_path / "copy"
    shutil.copytree(made["hdf5"], copy)
    with h5py.File(copy / "data" / "main_data.hdf5", "r+") as file:
        for episode in file.values():
            for key in ("rewards", "terminations"):
                values = episode[key][()]
                del episode[key]
                episode[key] = values[:, None]
    assert open_dataset(str(copy)).schema.field("reward").type == pa.float64()
    assert column(open_dataset(str(copy)), "reward") == column(
        open_dataset(str(made["hdf5"])), "reward"
    )


def test_infos_stored_one_per_row_in_arrow_read_as_numbers(made, tmp_path, policies):
    """Minari's Arrow storage keeps an info given as an array as [N + 1, 1] (a list of
    one number per row): --behavior-log-prob-col infos/action_log_probs was refused as
    "fixed_size_list<item: double>[1], expected numbers". It reads as numbers now, the same
    as the info given as a list; wider infos stay vectors."""
    buffers = [
        dataclasses.replace(
            buffer,
            infos={
                **buffer.infos,
                "action_log_probs": np.asarray(buffer.infos["action_log_probs"]),
            },
        )
        for buffer in made["dict_buffers"]
    ]
    discrete = gym.spaces.Discrete(N_ACTIONS)
    arrays = create(tmp_path, "test/arrays-arrow-v0", buffers, DICT_SPACE, discrete, "arrow")
    data = open_dataset(str(arrays))
    assert data.schema.field("infos/action_log_probs").type == pa.float64()
    assert data.schema.field("infos/extra/speed").type == pa.list_(pa.float64(), 2)
    as_lists = open_dataset(str(made["arrow"]))
    for name in ("behavior_log_prob", "infos/action_log_probs"):
        assert column(data, name) == column(as_lists, name), name
    option = {"behavior_log_prob_col": "infos/action_log_probs"}
    assert_same_evaluation(
        evaluation_inputs(arrays, policies["dict"], **option),
        evaluation_inputs(made["arrow"], policies["dict"], **option),
    )


LAYOUTS = (  # how rewrite() stores a dataset: h5py create_dataset keywords
    {},  # contiguous
    {"chunks": True, "maxshape": (None,)},  # as Minari writes (maxshape fixed below)
    {"compression": "gzip", "shuffle": True},
    {"chunks": (2,), "maxshape": (None,)},  # several chunks, the last one partly used
)


def rewrite(source, target, libver="earliest"):
    """A copy of a Minari HDF5 file whose datasets use every layout in turn."""
    with h5py.File(source, "r") as old, h5py.File(target, "w", libver=libver) as new:
        names = []
        old.visit(names.append)
        datasets = [name for name in names if isinstance(old[name], h5py.Dataset)]
        for i, name in enumerate(datasets):
            values = old[name][()]
            options = dict(LAYOUTS[i % len(LAYOUTS)])
            if values.ndim == 0 or values.shape[0] == 0:
                options = {}
            if "maxshape" in options:
                options["maxshape"] = (None, *values.shape[1:])
            if "chunks" in options and options["chunks"] is not True:
                options["chunks"] = (2, *values.shape[1:])
            new.create_dataset(name, data=values, **options)


@pytest.mark.parametrize("libver", ["earliest", "latest"])
def test_every_hdf5_layout_reads_the_same_steps(made, tmp_path, monkeypatch, libver):
    import shutil

    path = shutil.copytree(made["hdf5"], tmp_path / "copy")
    data_file = path / "data" / "main_data.hdf5"
    rewrite(made["hdf5"] / "data" / "main_data.hdf5", data_file, libver)
    monkeypatch.setattr(minari, "FIRST_GROUP", 2)  # several groups of episodes
    names = ["episode_id", "step", "observation", "next_observation", "action", "reward"]
    names += ["behavior_log_prob", "terminations", "truncations", "infos/extra/speed"]
    original, copy = open_dataset(str(made["hdf5"])), open_dataset(str(path))
    for name in names:
        assert column(copy, name) == column(original, name), name


def test_infos_with_n_plus_1_rows_pair_row_t_plus_1_with_action_t(made):
    data = open_dataset(str(made["hdf5"]))
    log_probs = column(data, "infos/action_log_probs")
    buffers = made["dict_buffers"]
    assert log_probs[:5] == list(buffers[0].infos["action_log_probs"][1:])
    start = sum(LENGTHS[:SHORT])
    assert log_probs[start : start + LENGTHS[SHORT]] == list(
        buffers[SHORT].infos["action_log_probs"]
    )


def test_arrow_storage_has_a_file_per_episode_and_restricts_to_some(made):
    data = open_dataset(str(made["arrow"]))
    assert len(data.files) == len(LENGTHS)
    share = data.restrict(data.files[3:5])
    assert sorted(set(column(share, "episode_id"))) == [3, 4]
    (hdf5,) = open_dataset(str(made["hdf5"])).files
    assert hdf5.endswith("main_data.hdf5")


@pytest.mark.parametrize("fmt", ["hdf5", "arrow"])
@pytest.mark.parametrize("rows", [1, sum(LENGTHS), 1000])
def test_batches_cover_every_step_once_and_end_with_the_last(made, fmt, rows):
    """Whether or not the steps are a multiple of ``rows`` (the end of the data then has
    nothing left over, and its marker is an empty batch)."""
    batches = list(open_dataset(str(made[fmt])).iter_batches(["reward"], rows))
    assert sum(b.batch.num_rows for b in batches) == sum(LENGTHS)
    assert all(b.batch.num_rows <= rows for b in batches)
    assert batches[-1].last_in_file


def test_dataset_ids_resolve_under_the_minari_root(made, monkeypatch, tmp_path):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(made["root"]))
    assert minari.resolve("minari:test/dict-arrow-v0") == made["arrow"] / "data"
    assert minari.resolve("minari:test/box") == made["box"] / "data"  # the latest version
    assert minari.resolve(str(made["box"] / "data")) == made["box"] / "data"
    monkeypatch.delenv("MINARI_DATASETS_PATH")
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / ".minari").mkdir()
    linked = tmp_path / ".minari" / "datasets"
    linked.symlink_to(made["root"], target_is_directory=True)
    assert minari.resolve("minari:test/box-v1") == linked / "test" / "box-v1" / "data"


def test_file_uris_name_local_datasets_and_roots(made, monkeypatch):
    """file:// is a local path everywhere else; a Minari dataset (or root) given so was
    refused as if it were in object storage."""
    from ope_cli.data.sources import open_dataset

    uri = f"file://{made['box']}"
    assert open_dataset(uri).count_rows() == open_dataset(str(made["box"])).count_rows()
    monkeypatch.setenv("MINARI_DATASETS_PATH", f"file://{made['root']}")
    assert minari.resolve("minari:test/box-v1") == made["root"] / "test" / "box-v1" / "data"


# ------------------------------------------------------------------------ through ope


@pytest.fixture(scope="module")
def policies(tmp_path_factory):
    folder = tmp_path_factory.mktemp("minari-policies")
    rng = np.random.default_rng(3)
    return {
        "dict": save_checkpoint(
            folder / "softmax.npz", random_checkpoint("linear_softmax", rng, obs_dim=OBS_DIM)
        ),
        "box": save_checkpoint(
            folder / "gauss.npz", random_checkpoint("linear_gaussian", rng, obs_dim=3, act_dim=2)
        ),
    }


@pytest.mark.parametrize("source", ["hdf5", "arrow", "minari:test/dict-arrow-v0"])
def test_evaluate_reads_the_same_inputs_as_from_parquet(made, policies, monkeypatch, source):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(made["root"]))
    option = {"behavior_log_prob_col": "infos/action_log_probs"}
    data = made.get(source, source)
    from_minari = evaluation_inputs(data, policies["dict"], read_rows=8, **option)
    from_parquet = evaluation_inputs(made["dict.parquet"], policies["dict"], read_rows=8)
    assert_same_evaluation(from_minari, from_parquet)


def test_box_observations_and_continuous_actions(made, policies):
    from_minari = evaluation_inputs(made["box"], policies["box"])
    from_parquet = evaluation_inputs(made["box.parquet"], policies["box"])
    assert_same_evaluation(from_minari, from_parquet)


@pytest.mark.parametrize("fmt", ["hdf5", "arrow"])
def test_inspect_reads_the_dataset(made, fmt):
    report = ope_cli.inspect(made[fmt]).to_dict()
    assert report["dataset"]["format"] == "minari"
    assert report["counts"]["episodes"] == len(LENGTHS)
    assert report["counts"]["steps"] == sum(LENGTHS)
    assert report["valid"] is True


# ------------------------------------------------------------------------ bad inputs


@pytest.fixture
def copy_of(made, tmp_path):
    import shutil

    def copy(name):
        return shutil.copytree(made[name], tmp_path / name)

    return copy


def test_observation_count_neither_n_nor_n_plus_1(copy_of):
    path = copy_of("hdf5")
    with h5py.File(path / "data" / "main_data.hdf5", "a") as handle:
        group = handle["episode_2/observations"]
        pos = group["pos"][()]
        del group["pos"]
        group.create_dataset("pos", data=np.concatenate([pos, pos[:2]]))
        del group["mode"]
        group.create_dataset("mode", data=np.ones(len(pos) + 2, np.int64))
    message = data_error(read_episodes, path)
    for part in ("episode 2", "10 observations for 7 actions", "7 or 8"):
        assert part in message, message


def test_inspect_reports_a_bad_arrow_episode_and_reads_on(copy_of):
    path = copy_of("arrow")
    (path / "data" / "2" / "metadata.json").write_text(json.dumps({"id": 2, "total_steps": 3}))
    inspection = ope_cli.inspect(path)
    assert not inspection.ok  # ope inspect exits 3
    report = inspection.to_dict()
    (problem,) = report["problems"]
    assert "8 observations for 3 actions" in json.dumps(problem)
    assert report["counts"]["episodes"] == len(LENGTHS) - 1  # the others are read


def test_unknown_storage_format(copy_of, ope_in_process):
    path = copy_of("arrow")
    metadata_path = path / "data" / "metadata.json"
    metadata = json.loads(metadata_path.read_text())
    metadata["data_format"] = "zarr"
    metadata_path.write_text(json.dumps(metadata))
    run = ope_in_process(["evaluate", path])  # exit code, one line, no stdout
    assert_one_line_exit_3(run, "unknown Minari storage format 'zarr'")
    assert run.stdout == ""


@pytest.mark.parametrize("key", ["rewards", "actions", "observations/pos"])
def test_missing_key_is_named(copy_of, key):
    path = copy_of("hdf5")
    with h5py.File(path / "data" / "main_data.hdf5", "a") as handle:
        del handle[f"episode_0/{key}"]
    message = data_error(open_dataset, str(path))
    assert "episode 0" in message and repr(key) in message, message


def test_missing_key_in_a_later_episode(copy_of):
    path = copy_of("hdf5")
    with h5py.File(path / "data" / "main_data.hdf5", "a") as handle:
        del handle["episode_4/rewards"]
    assert "episode 4 has no 'rewards'" in data_error(read_episodes, path)


def test_unknown_dataset_id(made, monkeypatch):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(made["root"]))
    message = data_error(open_dataset, "minari:test/nothing-v0")
    assert "no Minari dataset 'test/nothing-v0'" in message and "MINARI_DATASETS_PATH" in message


def test_truncated_hdf5_file(copy_of):
    path = copy_of("hdf5")
    data = path / "data" / "main_data.hdf5"
    data.write_bytes(data.read_bytes()[:2000])
    message = data_error(open_dataset, str(path))
    assert str(data) in message and "truncated or corrupt" in message, message


def test_missing_h5py_says_how_to_install_it(made, monkeypatch):
    monkeypatch.setitem(sys.modules, "h5py", None)  # import h5py raises ImportError
    with pytest.raises(DataError, match=r"pip install 'ope-cli\[minari\]'"):
        open_dataset(str(made["hdf5"]))
    assert open_dataset(str(made["arrow"])).format == "minari"  # Arrow needs no h5py
