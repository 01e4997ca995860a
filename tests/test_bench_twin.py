"""The NumPy twin of the kernel: against the plain float64 reference and against ope evaluate."""

from __future__ import annotations

import numpy as np
import pytest
from datasets import (
    perturb_checkpoint,
    random_checkpoint,
    random_episodes,
    save_checkpoint,
    to_reference_input,
    write_step_layout,
)
from reference import reference_estimates

from ope_cli.bench import twin
from ope_cli.bench.batches import host_batches, open_source
from ope_cli.config import BatchingConfig
from ope_cli.data.ids import RESAMPLING_GROUPS

ESTIMATORS = ("is", "wis", "pdis", "wpdis")


@pytest.mark.parametrize("gamma, shift, batch_steps", [(1.0, 0.3, 512), (0.95, 2.0, 256)])
def test_numpy_twin_matches_reference(tmp_path, gamma, shift, batch_steps):
    rng = np.random.default_rng(int(shift * 10))
    behavior = random_checkpoint("linear_softmax", rng, obs_dim=8)
    episodes = random_episodes(rng, 150, behavior=behavior, median_length=30, max_length=300)
    target = perturb_checkpoint(behavior, rng, shift)  # shift 2: weights far beyond e^+-100
    data = write_step_layout(episodes, tmp_path / "logs.parquet")
    batching = BatchingConfig(read_rows=997, batch_steps=batch_steps)
    batches, bucketer, max_length = host_batches(open_source(str(data)), batching, 1)
    assert len({batch.shape for batch in batches}) > 1  # batches of several lengths to merge

    params = {k: v for k, v in target.items() if k != "kind"}
    actual = twin.numpy_estimates(batches, params, gamma, max_length)
    expected = reference_estimates(to_reference_input(episodes, target), gamma)
    for name in ESTIMATORS:
        assert expected[name] is not None
        assert actual[name] == pytest.approx(expected[name], rel=1e-9, abs=1e-12), name


def test_numpy_twin_handles_zero_weights_filler_rows_and_split_batches():
    rng = np.random.default_rng(4)
    lengths = rng.integers(1, 17, 30)
    episodes = [
        {
            "log_target": np.log(rng.uniform(0.05, 1.0, t)),
            "log_behavior": np.log(rng.uniform(0.05, 1.0, t)),
            "reward": rng.normal(size=t),
        }
        for t in lengths
    ]
    episodes[3]["log_target"][0] = -np.inf  # a zero weight
    episodes[7]["log_target"][-1] = -np.inf

    def padded(part, rows):  # [rows, 16] with filler rows after the episodes
        out = {k: np.zeros((rows, 16)) for k in ("log_target", "log_behavior", "reward")}
        step_mask = np.zeros((rows, 16), bool)
        for i, episode in enumerate(part):
            for key in out:
                out[key][i, : len(episode["reward"])] = episode[key]
            step_mask[i, : len(episode["reward"])] = True
        group = rng.integers(0, RESAMPLING_GROUPS, rows)
        return twin.numpy_batch_statistics(
            out["log_target"],
            out["log_behavior"],
            out["reward"],
            step_mask,
            np.arange(rows) < len(part),
            group,
            0.9,
            RESAMPLING_GROUPS,
        )

    merged = twin.twin_init(RESAMPLING_GROUPS)
    for part, rows in ((episodes[:12], 16), (episodes[12:], 20)):
        merged = twin.twin_merge(merged, padded(part, rows))
    actual = twin.twin_estimates(merged, 0.9, int(lengths.max()))
    expected = reference_estimates(episodes, 0.9)
    for name in ESTIMATORS:
        assert actual[name] == pytest.approx(expected[name], rel=1e-9, abs=1e-12), name


def test_numpy_twin_agrees_with_ope_evaluate(tmp_path):
    from ope_cli.config import EvaluationConfig, RuntimeConfig
    from ope_cli.estimation.pipeline import evaluate

    rng = np.random.default_rng(8)
    behavior = random_checkpoint("linear_softmax", rng, obs_dim=8)
    episodes = random_episodes(rng, 100, behavior=behavior, median_length=20, max_length=100)
    target = perturb_checkpoint(behavior, rng, 0.5)
    data = write_step_layout(episodes, tmp_path / "logs.parquet")
    checkpoint = save_checkpoint(tmp_path / "target.npz", target)
    batching = BatchingConfig(batch_steps=4096, min_bucket=128)  # few shapes: few compiles
    batches, _, max_length = host_batches(open_source(str(data)), batching, 1)
    params = {k: v for k, v in target.items() if k != "kind"}
    from_twin = twin.numpy_estimates(batches, params, 0.9, max_length)
    result = evaluate(
        EvaluationConfig(
            data=str(data),
            policies=(str(checkpoint),),
            gamma=0.9,
            batching=batching,
            runtime=RuntimeConfig(precision="float64"),
        )
    )
    evaluated = result.results[0].estimates
    for name in ESTIMATORS:
        assert from_twin[name] == pytest.approx(evaluated[name].value, rel=1e-9), name
