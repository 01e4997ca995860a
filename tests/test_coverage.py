"""Coverage of the confidence intervals against ground truth (studies/coverage.py).

400 independent datasets of 300 `chain` episodes (heavy-tailed weights: ESS ~10-15%) are
generated in one JAX rollout and evaluated as one vmapped computation. The default interval
(betting, since `ope generate` declares the reward range) must cover the true value in at
least 95% - 3 binomial sd = 91.7% of the datasets, for every estimator. Betting intervals are
valid for any sample size, so they may cover more often than 95%; the test also checks they
stay informative, and that the study can tell a method that does not keep its promise (the
normal interval of IS falls below the tolerance on these data).
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import numpy as np
import pytest

import ope_cli

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parent.parent
DATASETS, EPISODES, GAMMA = 400, 300, 0.95


def _coverage_module():
    spec = importlib.util.spec_from_file_location(
        "ope_coverage_study", ROOT / "studies" / "coverage.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def coverage():
    return _coverage_module()


@pytest.fixture(scope="module")
def study(coverage):
    return coverage.measure("chain", DATASETS, EPISODES, GAMMA)


def test_binomial_tolerance(coverage):
    assert coverage.binomial_tolerance(400, 0.95) == pytest.approx(0.95 - 3 * 0.0108972, abs=1e-6)


def test_default_interval_keeps_its_promise_on_every_estimator(study):
    print(json.dumps(study["coverage"], indent=1))
    tolerance = study["tolerance"]
    for estimator, rate in study["coverage"]["betting"].items():
        assert rate >= tolerance, (estimator, rate, tolerance)


def test_betting_intervals_are_informative(study):
    low, high = study["reward_range"]
    a_priori = (high - low) * study["discounted_horizon"]  # what the range alone allows
    for estimator, width in study["mean_width"]["betting"].items():
        assert width < 0.35 * a_priori, (estimator, width, a_priori)


def test_study_detects_an_interval_that_undercovers(study):
    # Without this, a study whose datasets were too easy could pass any method.
    assert study["coverage"]["normal"]["is"] < study["tolerance"]


def test_batched_study_matches_ope_evaluate(coverage, tmp_path):
    """One dataset evaluated by the study's vmapped path and by the evaluation `ope evaluate`
    prints (the API's) gives the same intervals for every method (so the README's table
    describes the CLI's intervals)."""
    from ope_cli.config import EvaluationConfig
    from ope_cli.data.sources import open_dataset
    from ope_cli.envs.generate import generate
    from ope_cli.estimation.estimators.reduction import betting_inputs
    from ope_cli.estimation.run_plan import plan_intervals
    from ope_cli.estimation.stats import finalize, from_batch
    from ope_cli.models.policies import load_checkpoint

    generate("chain", tmp_path, episodes=EPISODES, seed=3, gamma=GAMMA)
    logs, checkpoint = tmp_path / "logs.parquet", tmp_path / "policies" / "eval_0.npz"
    plan = plan_intervals(
        EvaluationConfig(data=str(logs), gamma=GAMMA), open_dataset(str(logs)).declared_bounds()
    )
    assert plan.method == "betting"
    padded = coverage.padded_datasets(logs, 1, EPISODES)
    betting = betting_inputs(plan.betting_range, plan.horizon, GAMMA)
    (batch,) = coverage.dataset_statistics(
        padded, load_checkpoint(str(checkpoint)), GAMMA, 0, 200, betting
    )
    for method in coverage.METHODS:
        document = ope_cli.evaluate(logs, policies=[checkpoint], gamma=GAMMA, ci=method).to_dict()
        assert document["confidence"]["interval"] == method
        if method == "betting":  # the bounds chain declares in its metadata
            assert document["confidence"]["reward_range"] == [0.0, 1.0]
            assert document["confidence"]["horizon"] is None
        cli = document["results"][0]["estimates"]
        estimates, _ = finalize(
            from_batch(batch), GAMMA, padded.reward.shape[-1], 0.95, method, plan.betting_range
        )
        for name, estimate in estimates.items():
            got = [estimate.value, estimate.ci_low, estimate.ci_high]
            want = [cli[name][k] for k in ("value", "ci_low", "ci_high")]
            np.testing.assert_allclose(got, want, rtol=1e-6, err_msg=f"{method} {name}")


def test_paired_intervals_of_pdis_keep_their_promise(coverage):
    """PDIS(eval_0) - PDIS(eval_1) over 200 chain datasets, paired as ``--baseline`` pairs
    them, against the exact difference: the betting interval covers at least 95% - 3
    binomial sd; the normal one is reported (heavy-tailed weights make it undercover, as
    its unpaired interval does)."""
    study = coverage.measure_paired(200, 300, GAMMA)
    print(json.dumps(study, indent=1))
    assert study["coverage"]["betting"] >= study["tolerance"]
    assert 0.5 < study["coverage"]["normal"] <= 1.0
    assert study["mean_width"]["normal"] < study["mean_width"]["betting"]
