"""``ope bench``'s generated data: long-tailed step-layout episodes and their behavior policy."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from reference import action_log_probs

from ope_cli.bench import data


def test_generated_data_is_long_tailed_step_layout(tmp_path):
    path = tmp_path / "bench.parquet"
    info = data.generate_data(path, 3000, seed=1)
    table = pq.read_table(path)
    assert table.num_rows == info["steps"] == int(info["lengths"].sum())
    assert table.column_names == [
        "episode_id",
        "step",
        "observation",
        "action",
        "reward",
        "behavior_prob",
    ]
    observation_type = table.schema.field("observation").type
    assert pa.types.is_list(observation_type) and observation_type.value_type == pa.float32()
    lengths = info["lengths"]
    assert 40 <= np.median(lengths) <= 60 and lengths.max() >= 500 and lengths.min() >= 1
    ids = table.column("episode_id").to_numpy()
    assert np.array_equal(np.unique(ids), np.arange(3000))
    # behavior_prob is the behavior policy's probability of the logged action
    obs = np.stack(table.column("observation").to_numpy(zero_copy_only=False))
    behavior = {"kind": "linear_softmax", **data.behavior_params(1)}
    action = table.column("action").to_numpy()
    expected = np.exp(action_log_probs(behavior, obs)[np.arange(len(action)), action])
    assert np.allclose(table.column("behavior_prob").to_numpy(), expected, rtol=1e-6)
    assert set(np.unique(action)) <= set(range(data.N_ACTIONS))


def test_checkpoints_are_near_the_behavior_policy(tmp_path):
    behavior = data.behavior_params(2, obs_dim=3, n_actions=5)
    assert behavior["weight"].shape == (3, 5) and behavior["bias"].shape == (5,)
    paths = data.write_checkpoints(tmp_path, 2, 2, behavior)
    assert [p.rsplit("/", 1)[-1] for p in paths] == ["eval_0.npz", "eval_1.npz"]
    with np.load(paths[0]) as ckpt:
        assert str(ckpt["kind"]) == "linear_softmax"
        shift = ckpt["weight"] - behavior["weight"]
    assert 0 < np.abs(shift).max() < 10 * data.POLICY_SHIFT


def test_episodes_for_steps_matches_the_mean_length():
    lengths = data.episode_lengths(np.random.default_rng(0), 20_000)
    episodes = data.episodes_for_steps(1_000_000)
    assert abs(episodes * lengths.mean() - 1_000_000) < 0.05 * 1_000_000
