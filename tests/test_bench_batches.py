"""Bench's view of the data: opened once, padded as ``ope evaluate`` pads it, described from its
padded batches, and the loop baseline's first episodes."""

from __future__ import annotations

import numpy as np
import pytest
from datasets import random_checkpoint, random_episodes, write_episode_layout, write_step_layout

from ope_cli.bench import batches
from ope_cli.config import BatchingConfig
from ope_cli.errors import UsageError


@pytest.fixture
def logged(tmp_path):
    rng = np.random.default_rng(3)
    behavior = random_checkpoint("linear_softmax", rng, obs_dim=5, n_actions=3)
    episodes = random_episodes(
        rng, 60, behavior=behavior, obs_dim=5, n_actions=3, median_length=10, max_length=80
    )
    return episodes, write_step_layout(episodes, tmp_path / "logs.parquet", n_files=3)


def test_host_batches_hold_every_episode(logged):
    episodes, path = logged
    source = batches.open_source(str(path))
    padded, bucketer, max_length = batches.host_batches(source, BatchingConfig(batch_steps=256), 1)
    lengths = np.array([len(ep["reward"]) for ep in episodes])
    assert bucketer.real_steps == lengths.sum() and max_length == lengths.max()
    info = batches.describe_batches(padded, str(path))
    assert info["episodes"] == len(episodes) and info["steps"] == lengths.sum()
    assert sorted(info["lengths"]) == sorted(lengths)
    assert info["obs_dim"] == 5
    assert info["n_actions"] == 1 + max(int(ep["action"].max()) for ep in episodes)


def test_loop_head_table_takes_the_first_episodes(logged):
    episodes, path = logged
    source = batches.open_source(str(path))
    table = batches.loop_head_table(source, 7, read_rows=13)
    assert table.column_names == list(batches.LOOP_COLUMNS.values())
    assert table.num_rows == sum(len(ep["reward"]) for ep in episodes[:7])
    assert np.unique(table.column("episode_id").to_numpy()).size == 7


def test_open_source_rejects_what_bench_cannot_measure(tmp_path):
    rng = np.random.default_rng(4)
    episodes = random_episodes(rng, 5, kind="linear_softmax")
    path = write_episode_layout(episodes, tmp_path / "episodes.parquet")
    with pytest.raises(UsageError, match="step-layout"):
        batches.open_source(str(path))


def test_open_source_points_to_convert_for_other_column_names(logged, tmp_path):
    """The fix a missing column's error names (--reward-col) is no bench option."""
    import pyarrow.parquet as pq

    from ope_cli.errors import DataError

    _, path = logged
    table = pq.read_table(path)
    renamed = tmp_path / "renamed.parquet"
    pq.write_table(
        table.rename_columns(["r" if c == "reward" else c for c in table.column_names]), renamed
    )
    with pytest.raises(
        DataError, match=r"--reward-col \(ope bench takes no column options: `ope convert"
    ):
        batches.open_source(str(renamed))


def test_open_source_adds_no_convert_hint_where_no_column_option_is_named(tmp_path):
    from ope_cli.errors import DataError

    with pytest.raises(DataError) as raised:
        batches.open_source(str(tmp_path / "missing.parquet"))
    assert "ope convert" not in str(raised.value)
