"""``ope bench``: the generated data, the NumPy twin of the kernel (against the plain float64
reference and against the JAX statistics), and a tiny bench run's JSON document.

Timings are never asserted: on a shared machine only their presence and sign are checked.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import typer
from datasets import (
    perturb_checkpoint,
    random_checkpoint,
    random_episodes,
    save_checkpoint,
    to_reference_input,
    write_step_layout,
)
from reference import action_log_probs, reference_estimates
from typer.testing import CliRunner

from ope_cli import bench
from ope_cli.buckets import RESAMPLING_GROUPS
from ope_cli.config import BatchingConfig

ESTIMATORS = ("is", "wis", "pdis", "wpdis")


def test_generated_data_is_long_tailed_step_layout(tmp_path):
    path = tmp_path / "bench.parquet"
    info = bench.generate_data(path, 3000, seed=1)
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
    behavior = {"kind": "linear_softmax", **bench.behavior_params(1)}
    action = table.column("action").to_numpy()
    expected = np.exp(action_log_probs(behavior, obs)[np.arange(len(action)), action])
    assert np.allclose(table.column("behavior_prob").to_numpy(), expected, rtol=1e-6)
    assert set(np.unique(action)) <= set(range(bench.N_ACTIONS))


@pytest.mark.parametrize("gamma, shift, batch_steps", [(1.0, 0.3, 4096), (0.95, 2.0, 512)])
def test_numpy_twin_matches_reference(tmp_path, gamma, shift, batch_steps):
    rng = np.random.default_rng(int(shift * 10))
    behavior = random_checkpoint("linear_softmax", rng, obs_dim=8)
    episodes = random_episodes(rng, 150, behavior=behavior, median_length=30, max_length=300)
    target = perturb_checkpoint(behavior, rng, shift)  # shift 2: weights far beyond e^+-100
    data = write_step_layout(episodes, tmp_path / "logs.parquet")
    batching = BatchingConfig(read_rows=997, batch_steps=batch_steps)
    batches, bucketer, max_length = bench.host_batches(str(data), batching, 1)
    assert len(bucketer.shapes) > 1

    params = {k: v for k, v in target.items() if k != "kind"}
    actual = bench.numpy_estimates(batches, params, gamma, max_length)
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
        return bench.numpy_batch_statistics(
            out["log_target"],
            out["log_behavior"],
            out["reward"],
            step_mask,
            np.arange(rows) < len(part),
            group,
            0.9,
            RESAMPLING_GROUPS,
        )

    merged = bench.twin_init(RESAMPLING_GROUPS)
    for part, rows in ((episodes[:12], 16), (episodes[12:], 20)):
        merged = bench.twin_merge(merged, padded(part, rows))
    actual = bench.twin_estimates(merged, 0.9, int(lengths.max()))
    expected = reference_estimates(episodes, 0.9)
    for name in ESTIMATORS:
        assert actual[name] == pytest.approx(expected[name], rel=1e-9, abs=1e-12), name


def test_numpy_twin_agrees_with_ope_evaluate(tmp_path):
    from ope_cli.config import EvaluationConfig
    from ope_cli.pipeline import evaluate

    rng = np.random.default_rng(8)
    behavior = random_checkpoint("linear_softmax", rng, obs_dim=8)
    episodes = random_episodes(rng, 100, behavior=behavior, median_length=20, max_length=100)
    target = perturb_checkpoint(behavior, rng, 0.5)
    data = write_step_layout(episodes, tmp_path / "logs.parquet")
    checkpoint = save_checkpoint(tmp_path / "target.npz", target)
    batching = BatchingConfig(batch_steps=4096, min_bucket=128)  # few shapes: few compiles
    batches, _, max_length = bench.host_batches(str(data), batching, 1)
    params = {k: v for k, v in target.items() if k != "kind"}
    twin = bench.numpy_estimates(batches, params, 0.9, max_length)
    result = evaluate(
        EvaluationConfig(
            data=str(data),
            policies=(str(checkpoint),),
            gamma=0.9,
            precision="float64",
            batching=batching,
        )
    )
    for name in ESTIMATORS:
        assert twin[name] == pytest.approx(result.results[0].estimates[name].value, rel=1e-9), name


def _all_numbers(value):
    if isinstance(value, dict):
        for v in value.values():
            yield from _all_numbers(v)
    elif isinstance(value, list):
        for v in value:
            yield from _all_numbers(v)
    elif isinstance(value, float):
        yield value


@pytest.fixture(scope="module")
def tiny_bench(tmp_path_factory):
    """One tiny ``ope bench --format json`` through the typer command (a few thousand steps;
    few buckets so that the handful of compiles stays short)."""
    app = typer.Typer()

    @app.callback()
    def _main() -> None:
        """ope"""

    bench.register(app)
    out = tmp_path_factory.mktemp("bench")
    result = CliRunner().invoke(
        app,
        [
            "bench",
            "--episodes",
            "40",
            "--loop-episodes",
            "10",
            "--policies",
            "2",
            "--format",
            "json",
            "--min-bucket",
            "256",
            "--batch-steps",
            "4096",
            "--out",
            str(out),
            "--quiet",
        ],
    )
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_bench_json_has_every_measurement(tiny_bench):
    result = tiny_bench
    for name in ("loop", "numpy", "kernel", "end_to_end", "io_floor"):
        entry = result["measurements"][name]
        assert entry["steps_per_second"] > 0, name
        assert entry["seconds"] > 0, name
    assert result["measurements"]["loop"]["extrapolated"] is True
    assert result["dataset"]["episodes"] == 40
    assert result["dataset"]["steps"] == result["padding"]["real_steps"]
    for name in ("kernel_over_numpy", "kernel_over_loop", "end_to_end_over_io_floor"):
        assert result["ratios"][name] > 0, name
    assert result["padding"]["ratio"] >= 1
    assert result["compiles"]["end_to_end"] >= 1
    assert result["compiles"]["end_to_end"] <= result["compiles"]["bucket_shapes"]
    assert result["batching"]["batch_steps"] == 4096
    assert result["runtime"]["backend"] and result["runtime"]["devices"] >= 1
    assert result["policies"]["k"] == 2 and result["policies"]["cost_ratio"] > 0
    assert all(math.isfinite(x) for x in _all_numbers(result))


def test_bench_targets_and_precision(tiny_bench):
    targets = tiny_bench["targets"]
    assert set(targets) == {
        "kernel_faster_than_numpy",
        "kernel_vs_loop",
        "end_to_end_vs_io_floor",
        "padding_waste",
        "compiles_per_shape",
        "memory_growth",
    }
    for name, target in targets.items():
        if name == "memory_growth":
            assert target["met"] is None and tiny_bench["memory"] is None
        else:
            assert isinstance(target["met"], bool), name
    precision = tiny_bench["precision"]
    assert precision["float32"]["steps_per_second"] > 0
    assert precision["float64"]["steps_per_second"] > 0
    assert 0 <= precision["max_relative_difference"] < 1e-3
    assert precision["numpy_vs_kernel_max_relative_difference"] < 1e-9


def test_render_bench_prints_tables(tiny_bench):
    from rich.console import Console

    console = Console(record=True, width=160)
    bench.render_bench(tiny_bench, console)
    text = console.export_text()
    for expected in (
        "python loop",
        "numpy twin",
        "jitted kernel",
        "end to end",
        "I/O floor",
        "padding waste",
        "extrapolated",
    ):
        assert expected in text


@pytest.mark.slow
def test_memory_mode_reports_peak_rss_of_both_runs(tmp_path):
    checkpoint = bench.write_checkpoints(tmp_path, 1, 0, bench.behavior_params(0))[0]
    one_bucket = BatchingConfig(min_bucket=4096)  # one shape: one compile per run
    memory = bench.measure_memory(tmp_path, 2000, 0, checkpoint, one_bucket, lambda m: None)
    assert memory["1x"]["peak_rss_bytes"] > 0 and memory["10x"]["peak_rss_bytes"] > 0
    assert memory["10x"]["steps"] > 5 * memory["1x"]["steps"]
    assert memory["growth"] > 0
