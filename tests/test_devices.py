"""Sharding over several (emulated) devices gives the single-device estimates."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import run_ope, xla_flags
from datasets import (
    perturb_checkpoint,
    random_checkpoint,
    random_episodes,
    save_checkpoint,
    write_step_layout,
)

from ope_cli.config import BatchingConfig, EvaluationConfig, IntervalConfig
from ope_cli.estimation.pipeline import evaluate

pytestmark = pytest.mark.slow


def close_to(value):
    """A number to a relative 1e-9; anything else (a method's name, a note, a source) equal."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    return pytest.approx(value, rel=1e-9)


def ope_json(args, device_count, cwd):
    flags = {"XLA_FLAGS": xla_flags(f"--xla_force_host_platform_device_count={device_count}")}
    done = run_ope(["evaluate", *args, "--format", "json"], cwd=cwd, env=flags)
    assert done.returncode == 0, done
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("devices")
    rng = np.random.default_rng(21)
    behavior = random_checkpoint("linear_softmax", rng)
    # lengths up to 100: ten buckets, each compiled per device count (300 made fourteen)
    episodes = random_episodes(rng, 500, behavior=behavior, max_length=100)
    data = write_step_layout(episodes, tmp / "split", n_files=3)
    policies = [
        save_checkpoint(tmp / f"p{i}.npz", perturb_checkpoint(behavior, rng, 0.4 * (i + 1)))
        for i in range(2)
    ]
    args = [
        str(data),
        *(f"--policy={p}" for p in policies),
        "--baseline",
        "behavior",
        "--gamma",
        "0.97",
        "--batch-steps",
        "2048",
        "--ci",
        "bootstrap-t",
        "--bootstrap-samples",
        "40",
    ]
    return tmp, args, ope_json(args, 1, tmp)


@pytest.mark.parametrize("device_count", [4, 3])
def test_sharded_over_devices_equals_one_device(case, device_count):
    tmp, args, single = case
    sharded = ope_json(args, device_count, tmp)
    assert sharded["runtime"]["devices"] == device_count
    assert single["runtime"]["devices"] == 1
    for one, many in zip(single["results"], sharded["results"], strict=True):
        for name, estimate in one["estimates"].items():
            for field, value in estimate.items():
                assert many["estimates"][name][field] == close_to(value), (
                    name,
                    field,
                )
        for field, value in one["diagnostics"].items():
            assert many["diagnostics"][field] == close_to(value), field
        assert many["could_be_best"] == one["could_be_best"]
        for name, comparison in one["comparison"].items():  # --baseline behavior
            for field, value in comparison.items():
                assert many["comparison"][name][field] == close_to(value), (name, field)
    for batch, _ in sharded["runtime"]["batch_shapes"]:
        assert batch % device_count == 0


def test_doubly_robust_sharded_equals_one_device(case):
    """dm, dr and wdr (a linear_q Q-hat for both policies) on 3 devices equal 1 device."""
    tmp, args, _ = case
    rng = np.random.default_rng(2)
    q = save_checkpoint(
        tmp / "q.npz",
        {"kind": "linear_q", "weight": rng.normal(size=(4, 4)), "bias": rng.normal(size=4)},
    )
    with_q = [*args, "--q", str(q), "--q", str(q)]  # one --q per --policy
    single, sharded = ope_json(with_q, 1, tmp), ope_json(with_q, 3, tmp)
    assert sharded["runtime"]["devices"] == 3
    for one, many in zip(single["results"], sharded["results"], strict=True):
        assert {"dm", "dr", "wdr"} <= set(one["estimates"])
        for name, estimate in one["estimates"].items():
            for field, value in estimate.items():
                assert many["estimates"][name][field] == close_to(value), (
                    name,
                    field,
                )


def test_betting_intervals_sharded_equal_one_device(case):
    tmp, args, _ = case
    betting = [*args[:-4], "--reward-range", "-3", "3"]
    sharded = ope_json(betting, 4, tmp)
    assert sharded["confidence"]["interval"] == "betting"
    # this test process has one CPU device: the single-device run happens in-process
    data, *policies = (a.removeprefix("--policy=") for a in args[:3])
    single = evaluate(
        EvaluationConfig(
            data=data,
            policies=tuple(policies),
            gamma=0.97,
            batching=BatchingConfig(batch_steps=2048),
            intervals=IntervalConfig(reward_range=(-3.0, 3.0)),
        )
    )
    assert single.runtime.devices == 1 and single.confidence.interval == "betting"
    for one, many in zip(single.results, sharded["results"], strict=True):
        for name, estimate in one.estimates.items():
            for field in ("ci_low", "ci_high"):
                assert many["estimates"][name][field] == pytest.approx(
                    getattr(estimate, field), rel=1e-9
                )


def test_devices_option_limits_the_mesh(case):
    tmp, args, _ = case
    limited = ope_json([*args, "--devices", "2"], 4, tmp)
    assert limited["runtime"]["devices"] == 2


def test_one_device_of_several_loads_its_kept_kernels(case, tmp_path):
    """``--devices 1`` on a machine of four: the second run loaded the first one's kept
    kernels bound to all four devices and failed at their first call ("expected 4
    shards"), exit 1, whatever the data."""
    tmp, args, single = case
    flags = {
        "XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=4"),
        "OPE_CACHE_DIR": str(tmp_path / "cache"),
    }
    for run in range(2):
        done = run_ope(["evaluate", *args, "--devices", "1", "--format", "json"], tmp, flags)
        assert done.returncode == 0, (run, done)
        document = json.loads(done.stdout)
        assert document["runtime"]["devices"] == 1
        assert document["results"][0]["estimates"] == single["results"][0]["estimates"]
    assert document["runtime"]["compiles"] == 0  # the kept kernels, loaded
