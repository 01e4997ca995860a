"""Behavior models fitted to the logged actions (``ope_cli.models.behavior_models``),
``ope fit-behavior`` and ``ope evaluate --behavior estimate[:MODEL]``: closed-form model
checks, recovery of the true pi_b of ``ope generate`` data, invariance to batching, the report,
bad inputs; slow: the iterative models, two devices, the shipped example and an MSE study of
regression IS."""

from __future__ import annotations

import io
import json
import math
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from behavior_logs import assert_same_estimates, drop_propensities
from conftest import gather_in_two_processes, run_ope, xla_flags
from datasets import random_checkpoint, random_episodes, write_step_layout
from rendered import shown
from rich.console import Console

import ope_cli
import ope_cli.envs.generate as gen
from ope_cli.api import evaluation_config
from ope_cli.data.ids import episode_folds, id_keys
from ope_cli.errors import DataError, UsageError
from ope_cli.estimation.run_plan import check_config
from ope_cli.models.behavior_models.base import (
    check_model_fits,
    default_model,
    parse_model,
)
from ope_cli.models.behavior_models.command import (
    FitBehaviorConfig,
    FitBehaviorResult,
    run_fit_behavior,
)
from ope_cli.models.behavior_models.fitting import estimated_policy
from ope_cli.models.behavior_models.gaussian import LinearGaussianModel
from ope_cli.models.behavior_models.tabular import SMOOTHING, TabularModel
from ope_cli.report.fit import render_table as render_fit_table
from ope_cli.report.warnings import (
    BEHAVIOR_GAP_STANDARD_ERRORS,
    BETTING_FITTED_BEHAVIOR,
    ESTIMATED_BEHAVIOR_OFF,
)

ROOT = Path(__file__).resolve().parent.parent
# one bucket for every chain episode: every run of this module compiles a handful of shapes
ONE_BUCKET = {"min_bucket": 256}
CROSS_FIT = {"behavior_cross_fit": 3}


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> dict[str, Path]:
    """chain and gaussian logs of ``ope generate`` (true pi_b in behavior.npz), each also
    without the propensity column (nob.parquet)."""
    root = tmp_path_factory.mktemp("fit")
    out = {}
    for env, episodes in (("chain", 400), ("gaussian", 400)):
        gen.generate(env, root / env, episodes=episodes, seed=3)
        drop_propensities(root / env / "logs.parquet", root / env / "nob.parquet")
        out[env] = root / env
    return out


def _policies(out: Path) -> list:
    return [out / "policies" / "eval_0.npz", out / "policies" / "eval_2.npz"]


def _fit(data: Path, out: Path, model: str | None = None) -> FitBehaviorResult:
    """What ``ope fit-behavior DATA --out OUT [--model MODEL]`` fits, writes and reports."""
    return run_fit_behavior(FitBehaviorConfig(str(data), str(out), model))


def _evaluation(data: Path, policies: list, **options) -> ope_cli.Evaluation:
    """``ope evaluate DATA -p ... [options]`` in one bucket (the Python API: the pipeline
    without the command line)."""
    policies = [str(p) for p in policies]
    return ope_cli.evaluate(str(data), policies=policies, **ONE_BUCKET, **options)


def _evaluate(data: Path, policies: list, **options) -> dict:
    """The ``--format json`` document of ``_evaluation``."""
    return _evaluation(data, policies, **options).to_dict()


# --- models, closed form


def test_tabular_counts_past_the_memory_budget_are_refused(monkeypatch):
    """Counts up to the largest state id: a sparse id of 2e9 asked for 224 GiB and ended in
    a MemoryError, reported as a bug; past OPE_FIT_MEMORY_GB it is one usage line."""
    monkeypatch.setenv("OPE_FIT_MEMORY_GB", "0.001")  # 1 MiB: 100,000 states x 3 x 5 folds
    model = TabularModel(folds=5)
    with pytest.raises(UsageError, match="largest state, 100,000: .*OPE_FIT_MEMORY_GB") as error:
        model.add(np.array([0, 100_000]), np.array([0, 2]), np.array([0, 1]))
    assert "\n" not in str(error.value)
    # fit-behavior has no fold option: the message says what its five folds are
    assert "5 table(s), one per fold of episodes (fit-behavior's five" in str(error.value)


def test_tabular_counts_with_additive_smoothing():
    model = TabularModel(folds=2)
    model.add(np.array([0, 0, 0, 2]), np.array([1, 1, 0, 2]), np.array([0, 0, 1, 1]))
    model.add(np.array([0]), np.array([1]), np.array([1]))  # grows nothing
    probs = np.exp(model.fit()["logits"])
    a = SMOOTHING
    assert probs[0] == pytest.approx(np.array([1 + a, 3 + a, a]) / (4 + 3 * a))
    assert probs[1] == pytest.approx(np.full(3, 1 / 3))  # never visited: uniform
    held_out = np.exp(model.fit(exclude=1)["logits"])  # fold 0 only: state 0 -> action 1 twice
    assert held_out[0] == pytest.approx(np.array([a, 2 + a, a]) / (2 + 3 * a))
    total, steps = model.log_likelihood(model.fit())
    assert steps == 5
    assert total == pytest.approx(
        np.log(probs[0, 0]) + 3 * np.log(probs[0, 1]) + np.log(probs[2, 2])
    )
    assert model.floored(model.fit(), None, 0.3) == 1  # state 0, action 0: (1 + a) / (4 + 3a)
    assert model.floored(model.fit(), None, 0.01) == 0


@pytest.mark.parametrize("offset", [0.0, 1e5])
def test_linear_gaussian_normal_equations_and_log_likelihood(offset):
    """The least-squares fit, also of observations with a large common offset (positions,
    prices): the guard ridge on uncentred sums shrank the bias 462 to 1e-6 at 1e5."""
    rng = np.random.default_rng(0)
    x = offset + rng.normal(size=(5000, 3))
    weight, bias, std = rng.normal(size=(3, 2)), np.array([0.5, -1.0]), np.array([0.3, 1.5])
    y = x @ weight + bias + std * rng.normal(size=(5000, 2))
    model = LinearGaussianModel(folds=3)
    fold = rng.integers(0, 3, 5000)
    for part in np.array_split(np.arange(5000), 7):  # streaming in pieces
        model.add(x[part], y[part], fold[part])
    fitted = model.fit()
    centred = x - x.mean(axis=0)
    weight_ls = np.linalg.lstsq(centred, y - y.mean(axis=0), rcond=None)[0]
    bias_ls = y.mean(axis=0) - x.mean(axis=0) @ weight_ls
    assert fitted["weight"] == pytest.approx(weight_ls, abs=1e-9)
    assert fitted["bias"] == pytest.approx(bias_ls, rel=1e-9, abs=1e-9)
    residual = y - x @ fitted["weight"] - fitted["bias"]
    assert np.exp(fitted["log_std"]) == pytest.approx(np.sqrt(np.mean(residual**2, 0)), rel=1e-9)
    assert np.exp(fitted["log_std"]) == pytest.approx(std, rel=0.05)
    z = residual / np.exp(fitted["log_std"])
    direct = np.sum(-0.5 * z**2 - fitted["log_std"] - 0.5 * math.log(2 * math.pi))
    assert model.log_likelihood(fitted)[0] == pytest.approx(direct, rel=1e-9)
    rows = fold == 2
    assert model.log_likelihood(fitted, 2)[0] == pytest.approx(
        np.sum((-0.5 * z**2 - fitted["log_std"] - 0.5 * math.log(2 * math.pi))[rows]), rel=1e-9
    )
    assert model.floored(fitted, None, 0.5) == 0  # densities are not floored


@pytest.mark.parametrize("processes", [1, 2])
def test_linear_gaussian_spread_of_actions_that_follow_the_observations_closely(processes):
    """Actions 1e6 times the observations plus noise of 1e-3: the sums of squares are of
    residuals about a pilot line, so the noise is not lost to cancellation (it came out
    as the 1e-12 variance floor, then 3 times too wide at a scale of 1e5)."""
    rng = np.random.default_rng(3)
    n = 2000
    x = 5.0 + rng.normal(size=(n, 2))
    y = 1e6 * (x[:, :1] - 0.5 * x[:, 1:]) + 7.0 + 1e-3 * rng.normal(size=(n, 1))
    fold = rng.integers(0, 2, n)
    shares = [(x[:700], y[:700], fold[:700]), (x[700:], y[700:], fold[700:])]
    if processes == 1:
        model = LinearGaussianModel(folds=2)
        for part in np.array_split(np.arange(n), 5):
            model.add(x[part], y[part], fold[part])
    else:
        model = _gathered_in_two_processes(lambda: LinearGaussianModel(folds=2), shares)[1]
    fitted = model.fit()
    features = np.concatenate([x, np.ones((n, 1))], axis=1)
    solution = np.linalg.lstsq(features, y, rcond=None)[0]
    residual = y - features @ solution
    std = np.sqrt(np.mean(residual**2, axis=0))
    assert np.exp(fitted["log_std"]) == pytest.approx(std, rel=1e-6)
    z = (y - x @ fitted["weight"] - fitted["bias"]) / np.exp(fitted["log_std"])
    per_step = -0.5 * z**2 - fitted["log_std"] - 0.5 * math.log(2 * math.pi)
    assert model.log_likelihood(fitted)[0] == pytest.approx(per_step.sum(), rel=1e-6)
    held_out = model.fit(exclude=1)  # fitted on fold 0, scored on fold 1
    z = (y - x @ held_out["weight"] - held_out["bias"]) / np.exp(held_out["log_std"])
    per_step = -0.5 * z**2 - held_out["log_std"] - 0.5 * math.log(2 * math.pi)
    expected = per_step[fold == 1].sum()
    assert model.log_likelihood(held_out, 1)[0] == pytest.approx(expected, rel=1e-6)


def test_linear_gaussian_refuses_a_size_change_among_its_first_steps_at_once():
    """The first steps wait for the pilot; a change of size among them is refused where it
    comes (in a process's pass), not at the gather, where the other processes wait."""
    model = LinearGaussianModel(folds=1)
    model.add(np.zeros((10, 3)), np.zeros((10, 1)), np.zeros(10, int))
    with pytest.raises(DataError, match="change size"):
        model.add(np.zeros((10, 2)), np.zeros((10, 1)), np.zeros(10, int))


@pytest.mark.parametrize("case", ["still_first_block", "tiny_first_block"])
def test_linear_gaussian_pilot_of_an_unrepresentative_first_block(case):
    """A first block whose feature 0 hardly moves (1e-9 a step) on ordinary data gave the
    pilot a slope of ~1e8 there, which later steps turned into residuals 1e8 times the
    noise (std 1.3 times too wide): such a slope, far below its standard error, is not
    kept. A first block of 4 steps for 4 parameters piloted nothing: the pilot waits."""
    rng = np.random.default_rng(2)
    n = 3000
    x = rng.normal(size=(n, 3))
    if case == "still_first_block":
        x[:50, 0] = 1.0 + 1e-9 * np.arange(50)
        y = x @ np.array([[1.0], [2.0], [-1.0]]) + rng.normal(size=(n, 1))
        first = 50
    else:
        y = 1e5 * x @ rng.normal(size=(3, 1)) + 1e-3 * rng.normal(size=(n, 1))
        first = 4
    model = LinearGaussianModel(folds=1)
    model.add(x[:first], y[:first], np.zeros(first, int))
    model.add(x[first:], y[first:], np.zeros(n - first, int))
    fitted = model.fit()
    features = np.concatenate([x, np.ones((n, 1))], axis=1)
    residual = y - features @ np.linalg.lstsq(features, y, rcond=None)[0]
    assert np.exp(fitted["log_std"]) == pytest.approx(np.sqrt(np.mean(residual**2, 0)), rel=1e-6)


@pytest.mark.slow  # a property of fits under offsets and units
@pytest.mark.parametrize("name", ["linear_softmax", "mlp_softmax"])
def test_softmax_fits_do_not_depend_on_feature_offsets_and_scales(name):
    """A feature of 10,000 +- 50 (an altitude in metres): fitted on raw features, L-BFGS
    stopped 500 steps short of the optimum (mean log-likelihood -1.126 against -1.054) and
    --behavior estimate's IS was 56% off without a word. Fitted on standardised features,
    an offset or a unit changes nothing but rounding."""
    from ope_cli.models.behavior_models.softmax import SoftmaxModel, logits_of

    rng = np.random.default_rng(3)
    x = rng.normal(size=(1500, 3))
    true_logits = x @ rng.normal(size=(3, 4))
    action = (true_logits + rng.gumbel(size=(1500, 4))).argmax(axis=1)
    fold = np.zeros(1500, np.int64)
    log_probs = []
    for shift, unit in ((0.0, 1.0), (1e4, 50.0), (-300.0, 1e-3)):
        moved = x.copy()
        moved[:, 0] = shift + unit * x[:, 0]
        model = SoftmaxModel(name)
        model.add(moved, action, fold)
        fitted = model.fit()
        log_probs.append(logits_of(fitted, moved)[np.arange(1500), action])
    for other in log_probs[1:]:
        np.testing.assert_allclose(other, log_probs[0], atol=1e-5)


def test_in_memory_models_refuse_past_their_budget():
    from ope_cli.models.behavior_models.softmax import SoftmaxModel

    model = SoftmaxModel("linear_softmax", budget=10_000)
    model.add(np.zeros((100, 4)), np.zeros(100, np.int64), np.zeros(100, np.int64))
    with pytest.raises(UsageError, match="OPE_FIT_MEMORY_GB") as error:
        model.add(np.zeros((200, 4)), np.zeros(200, np.int64), np.zeros(200, np.int64))
    assert "ope fit-behavior" in str(error.value) and "\n" not in str(error.value)
    assert str(error.value).startswith("the linear_softmax behavior model holds")  # any command


@pytest.mark.parametrize("value", ["abc", "nan", "0", "-1", "inf"])
def test_a_memory_budget_that_is_not_a_positive_size_is_a_usage_error(value, monkeypatch):
    """abc and nan were internal errors (exit 1), 0 and -1 budgets of "-1 GiB"."""
    from ope_cli.models.behavior_models.softmax import memory_budget

    monkeypatch.setenv("OPE_FIT_MEMORY_GB", value)
    with pytest.raises(UsageError, match=f"OPE_FIT_MEMORY_GB='{value}': give the memory budget"):
        memory_budget()
    monkeypatch.setenv("OPE_FIT_MEMORY_GB", "0.5")
    assert memory_budget() == 2**29


def test_fold_index_is_the_same_in_numpy_and_jax():
    import jax.numpy as jnp

    from ope_cli.data.ids import fold_index

    rng = np.random.default_rng(1)
    hi, lo = (rng.integers(0, 2**32, 1000, dtype=np.uint64).astype(np.uint32) for _ in "hl")
    with np.errstate(over="ignore"):
        host = fold_index(hi, lo, 7)
    device = fold_index(jnp.asarray(hi), jnp.asarray(lo), 7, jnp)
    assert np.array_equal(host, np.asarray(device))


def test_episode_folds_are_a_fixed_hash_of_the_key():
    keys = np.arange(10_000, dtype=np.uint64) * np.uint64(7919)
    folds = episode_folds(keys, 5)
    assert folds.min() == 0 and folds.max() == 4
    assert np.all(np.abs(np.bincount(folds) / 10_000 - 0.2) < 0.02)
    assert np.array_equal(episode_folds(keys[::-1], 5), folds[::-1])  # per key, not position
    assert not episode_folds(keys, 1).any()


def test_default_model_and_model_checks():
    assert default_model("index", "discrete") == "tabular"
    assert default_model("vector", "discrete") == "linear_softmax"
    assert default_model("scalar", "discrete") == "linear_softmax"
    assert default_model("vector", "continuous") == "linear_gaussian"
    assert parse_model("estimate") is None
    assert parse_model("estimate:mlp_softmax") == "mlp_softmax"
    with pytest.raises(UsageError, match="unknown behavior model 'knn'"):
        parse_model("estimate:knn")
    with pytest.raises(UsageError, match="integer state"):
        check_model_fits("tabular", "vector", "discrete", "--behavior estimate:tabular")
    with pytest.raises(UsageError, match="continuous"):
        check_model_fits("linear_softmax", "vector", "continuous", "--model linear_softmax")
    # tabular on vector observations and continuous actions: the model that fits them
    # (the discrete ones it would suggest for the observations are refused next)
    with pytest.raises(UsageError, match="continuous; use linear_gaussian$"):
        check_model_fits("tabular", "vector", "continuous", "--behavior estimate:tabular")


def test_estimated_policy_is_floored_at_min_propensity():
    import jax

    logits = np.log(np.array([[0.0005, 0.4995, 0.5]]))
    policy = estimated_policy("tabular", {"logits": logits}, 1e-3)
    log_p = jax.vmap(lambda a: policy.log_prob(policy.params, 0, a))(np.arange(3))
    assert np.exp(np.asarray(log_p)) == pytest.approx([1e-3, 0.4995, 0.5])
    unfloored = estimated_policy("tabular", {"logits": logits}, 0.0)
    assert float(np.exp(unfloored.log_prob(unfloored.params, 0, 0))) == pytest.approx(0.0005)
    # floored, log_prob is no log-softmax of the logits: a softmax of them would not be it
    assert policy.logits is None and unfloored.logits is None


# --- ope fit-behavior on ope generate data


def test_tabular_recovers_the_true_behavior_policy(generated, tmp_path):
    out = generated["chain"]
    report = _fit(out / "logs.parquet", tmp_path / "b.npz")
    assert report.model == "tabular" and report.episodes == 400
    assert 0 < report.heldout_episodes < 400
    assert report.heldout_mean_log_likelihood < 0
    fitted = np.exp(np.load(tmp_path / "b.npz")["logits"])
    true = np.exp(np.load(out / "behavior.npz")["logits"])
    true = true / true.sum(1, keepdims=True)
    table = pq.read_table(out / "logs.parquet")
    visits = np.bincount(table.column("observation").to_numpy(), minlength=10)
    for state in np.flatnonzero(visits >= 30):
        n = visits[state]
        tolerance = 4 * np.sqrt(true[state] * (1 - true[state]) / n) + 2 * SMOOTHING / n
        assert np.all(np.abs(fitted[state] - true[state]) < tolerance), state
    logged = report.logged  # the data also logs the true propensities
    assert logged.column == "behavior_prob" and logged.steps == report.steps
    assert logged.mean_abs_log_ratio < 0.1
    assert abs(logged.mean_log_ratio) < 0.02
    assert sum(row.steps for row in logged.calibration) == report.steps
    for row in logged.calibration:
        if row.steps >= 100:
            assert row.mean_logged == pytest.approx(row.mean_estimated, abs=0.05)
    assert report.warnings == ()  # the right model: nothing to say


def test_fit_behavior_warns_of_a_model_far_from_the_logged_column(ope_in_process, tmp_path):
    """A linear softmax in x fitted to a behavior set by |x|: 0.45 nats of log-weight per
    episode from the logged propensities, in its JSON, its table and on stderr (it printed
    the log ratios and said nothing)."""
    data = _hidden_feature_logs(tmp_path / "hidden.parquet")
    report = _fit(data, tmp_path / "b.npz")
    (warning,) = report.warnings
    assert warning["code"] == ESTIMATED_BEHAVIOR_OFF and warning["policy"] is None
    assert warning["message"].startswith("the estimated model is 0.45 nats of log-weight")
    console = Console(file=io.StringIO(), width=120)
    render_fit_table(report, console)
    assert "warning: the estimated model is 0.45 nats" in console.file.getvalue()
    args = ["fit-behavior", data, "--out", tmp_path / "c.npz", "-f", "json"]
    run = ope_in_process(args)
    assert run.returncode == 0, run
    (said,) = json.loads(run.stdout)["warnings"]
    assert run.stderr.splitlines() == [f"warning: {said['message']}"]
    quiet = ope_in_process([*args, "-q", "--overwrite"])
    assert quiet.returncode == 0 and quiet.stderr == "", quiet


def test_linear_gaussian_recovers_mean_and_spread(generated, tmp_path):
    out = generated["gaussian"]
    report = _fit(out / "nob.parquet", tmp_path / "g.npz")
    assert report.model == "linear_gaussian" and report.logged is None
    fitted, true = dict(np.load(tmp_path / "g.npz")), dict(np.load(out / "behavior.npz"))
    assert str(fitted["kind"]) == "linear_gaussian"
    steps = report.steps  # 2,000 steps, std 0.5: standard errors about 0.01
    assert fitted["weight"] == pytest.approx(true["weight"], abs=0.06)
    assert fitted["bias"] == pytest.approx(true["bias"], abs=0.06)
    assert fitted["log_std"] == pytest.approx(true["log_std"], abs=4 / np.sqrt(2 * steps))
    assert report.heldout_mean_log_likelihood == pytest.approx(report.mean_log_likelihood, abs=0.1)


def test_fit_behavior_bad_options_exit_2_with_one_line(ope_in_process, generated, tmp_path):
    out = generated["chain"]
    cases = [
        (["--out", tmp_path / "b.txt"], ".npz"),
        (["--out", tmp_path / "missing" / "b.npz"], "no such directory"),
        # a URI said "no such directory"
        (["--out", "s3://models/b.npz"], "checkpoints are written to a local path"),
        (["--out", tmp_path / "b.npz", "--model", "forest"], "unknown behavior model"),
    ]
    for extra, needle in cases:
        done = ope_in_process(["fit-behavior", out / "logs.parquet", *extra])
        assert done.returncode == 2, done
        assert done.stdout == "" and len(done.stderr.strip().splitlines()) == 1, done
        assert needle in done.stderr, done


def test_fit_behavior_refuses_a_model_that_does_not_fit_the_actions(generated, tmp_path):
    out = generated["chain"]
    with pytest.raises(UsageError, match="continuous actions") as error:
        _fit(out / "logs.parquet", tmp_path / "b.npz", "linear_gaussian")
    assert "\n" not in str(error.value)
    assert not (tmp_path / "b.npz").exists()


# --- ope evaluate --behavior estimate


@pytest.fixture(scope="module")
def chain_runs(generated, tmp_path_factory) -> dict[str, dict]:
    """evaluate --behavior estimate on chain data without the column, also cross-fitted;
    with the fitted checkpoint; and on the data with the column (mean weights under both).
    The same runs in other batchings: ``chain_batchings`` (slow)."""
    out = generated["chain"]
    checkpoint = tmp_path_factory.mktemp("ckpt") / "b.npz"
    _fit(out / "nob.parquet", checkpoint)
    policy = _policies(out)
    nob = out / "nob.parquet"
    both = _evaluation(out / "logs.parquet", policy, behavior="estimate")
    return {
        "estimate": _evaluate(nob, policy, behavior="estimate"),
        "checkpoint": _evaluate(nob, policy, behavior=str(checkpoint)),
        "cross_fit": _evaluate(nob, policy, behavior="estimate", **CROSS_FIT),
        "both": both.to_dict(),
        "both_table": shown(both, "table"),
        "true": _evaluate(out / "logs.parquet", policy),
    }


@pytest.fixture(scope="module")
def chain_batchings(generated) -> dict[str, dict]:
    """``chain_runs``' estimate and cross-fitted runs in other batchings."""
    out = generated["chain"]
    policy, nob = _policies(out), out / "nob.parquet"
    return {
        "small_batches": _evaluate(
            nob,
            policy,
            behavior="estimate:tabular",
            # one-lane windows (64 made 16-step short windows: 2.7 s against 1.3 s)
            batch_steps=128,
            read_rows=300,
        ),
        # four lanes a window: another batching, without small_batches' 400 one-lane calls
        "cross_fit_small_batches": _evaluate(
            nob, policy, behavior="estimate", **CROSS_FIT, batch_steps=1024
        ),
    }


@pytest.mark.slow  # a property: the same estimates in other batchings
def test_estimate_is_the_same_across_batchings(chain_runs, chain_batchings):
    smaller = chain_batchings["small_batches"]
    assert_same_estimates(chain_runs["estimate"], smaller, rtol=1e-12)
    assert smaller["runtime"]["batch_shapes"] != (chain_runs["estimate"]["runtime"]["batch_shapes"])
    cross_fit, cross_fit_smaller = (
        chain_runs["cross_fit"],
        chain_batchings["cross_fit_small_batches"],
    )
    assert_same_estimates(cross_fit, cross_fit_smaller, rtol=1e-12)
    assert cross_fit_smaller["runtime"]["batch_shapes"] != cross_fit["runtime"]["batch_shapes"]


def _cross_fitted_reference(out: Path, folds: int, floor: float = 1e-3) -> dict:
    """IS of each evaluation policy and the out-of-fold mean log-likelihood, in plain NumPy:
    episode e's steps use the tabular model counted on the episodes of the other folds."""
    from ope_cli.data.ids import id_keys

    table = pq.read_table(out / "nob.parquet")
    ids, states, actions, rewards = (
        table.column(c).to_numpy() for c in ("episode_id", "observation", "action", "reward")
    )
    episodes, episode_of_step = np.unique(ids, return_inverse=True)
    fold = episode_folds(id_keys(episodes), folds)[episode_of_step]
    log_b = np.zeros(len(states))
    for k in range(folds):
        counts = np.zeros((int(states.max()) + 1, 3))
        np.add.at(counts, (states[fold != k], actions[fold != k]), 1)
        probs = (counts + SMOOTHING) / (counts + SMOOTHING).sum(1, keepdims=True)
        log_b[fold == k] = np.log(probs[states, actions])[fold == k]
    reference = {"mean_log_likelihood": log_b.mean()}
    returns = np.bincount(episode_of_step, rewards)
    for name in ("eval_0.npz", "eval_2.npz"):
        logits = np.load(out / "policies" / name)["logits"]
        log_e = logits - np.log(np.exp(logits).sum(1, keepdims=True))
        ratio = log_e[states, actions] - np.maximum(log_b, np.log(floor))
        weights = np.exp(np.bincount(episode_of_step, ratio))
        reference[name] = float(np.mean(weights * returns))
    return reference


def test_cross_fitting_matches_a_numpy_reference(generated, chain_runs):
    reference = _cross_fitted_reference(generated["chain"], 3)
    run = chain_runs["cross_fit"]
    fit = run["dataset"]["behavior"]["fit"]
    assert fit["cross_fit"] == 3
    assert fit["mean_log_likelihood"] == pytest.approx(reference["mean_log_likelihood"], rel=1e-12)
    assert (
        fit["mean_log_likelihood"]
        < chain_runs["estimate"]["dataset"]["behavior"]["fit"]["mean_log_likelihood"]
    )  # out-of-fold scores below in-sample
    for result in run["results"]:
        value = result["estimates"]["is"]["value"]
        assert value == pytest.approx(reference[Path(result["policy"]).name], rel=1e-9)
    assert "out-of-fold: 3 folds" in _describe(run)


def _describe(run: dict) -> str:
    from ope_cli.models.behavior import BehaviorFit, BehaviorSource

    behavior = run["dataset"]["behavior"]
    return BehaviorSource(
        behavior["source"], behavior["name"], behavior["kind"], BehaviorFit(**behavior["fit"])
    ).describe()


def test_estimate_equals_the_fitted_checkpoint(chain_runs):
    """--behavior estimate (nothing floored here) and --behavior of ope fit-behavior's
    checkpoint of the same data: the same estimates."""
    assert chain_runs["estimate"]["dataset"]["behavior"]["fit"]["floored"] == 0
    assert_same_estimates(chain_runs["estimate"], chain_runs["checkpoint"], rtol=1e-9)


def test_estimate_report(chain_runs):
    behavior = chain_runs["estimate"]["dataset"]["behavior"]
    assert behavior["source"] == "estimated" and behavior["name"] == "tabular"
    assert behavior["kind"] == "tabular"
    fit = behavior["fit"]
    assert fit["episodes"] == 400 and fit["steps"] == chain_runs["estimate"]["dataset"]["steps"]
    assert -math.log(3) < fit["mean_log_likelihood"] < 0  # better than uniform over 3 actions
    assert fit["min_propensity"] == 1e-3
    assert fit["logged_column"] is None and fit["mean_weight"] is None
    both = chain_runs["both"]["dataset"]["behavior"]["fit"]
    assert both["logged_column"] == "behavior_prob"
    for result, truth in zip(
        chain_runs["both"]["results"], chain_runs["true"]["results"], strict=True
    ):
        weights = both["mean_weight"][result["policy"]]
        assert weights["estimated"] == pytest.approx(result["diagnostics"]["mean_weight"])
        assert weights["logged"] == pytest.approx(truth["diagnostics"]["mean_weight"])
        # the right model: its estimates stay within their standard errors of the logged
        # column's, and nothing is said
        gap = both["logged_gap"][result["policy"]]
        name = gap["estimator"]
        assert gap["estimated"]["value"] == result["estimates"][name]["value"]
        assert gap["logged"]["stderr"] == truth["estimates"][name]["stderr"]
        assert gap["standard_errors"] < BEHAVIOR_GAP_STANDARD_ERRORS
    assert both["mean_weight_note"] is None
    assert ESTIMATED_BEHAVIOR_OFF not in {w["code"] for w in chain_runs["both"]["warnings"]}


def _hidden_feature_logs(path: Path, episodes: int = 3000) -> Path:
    """One-step episodes whose behavior takes action 1 with probability 0.95 where |x| > 1
    and 0.05 elsewhere, logged with the true propensities: a linear softmax in x cannot
    represent it."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=episodes)
    p_one = np.where(np.abs(x) > 1, 0.95, 0.05)
    action = (rng.random(episodes) < p_one).astype(np.int64)
    reward = np.where((action == 1) == (np.abs(x) <= 1), 1.0, 0.0)
    table = {
        "episode_id": np.arange(episodes),
        "step": np.zeros(episodes, np.int64),
        "observation": x,
        "action": action,
        "reward": reward + rng.normal(size=episodes) * 0.1,
        "behavior_prob": np.where(action == 1, p_one, 1 - p_one),
    }
    pq.write_table(pa.table(table), path)
    return path


def test_an_estimate_far_from_the_logged_columns_is_warned_of(tmp_path):
    """A behavior model that cannot see what the behavior depends on: its IS and WIS sat
    20 standard errors from the logged column's (and the truth, 0.5) with tight intervals,
    the mean weight 1.00 under both, and nothing said in any format."""
    data = _hidden_feature_logs(tmp_path / "hidden.parquet")
    uniform = tmp_path / "uniform.npz"
    np.savez(uniform, kind="linear_softmax", weight=np.zeros((1, 2)), bias=np.zeros(2))
    run = _evaluation(data, [uniform], behavior="estimate")
    document = run.to_dict()
    gap = document["dataset"]["behavior"]["fit"]["logged_gap"][str(uniform)]
    assert gap["standard_errors"] > 10
    assert abs(gap["logged"]["value"] - 0.5) < 4 * gap["logged"]["stderr"]
    (warning,) = [w for w in document["warnings"] if w["code"] == ESTIMATED_BEHAVIOR_OFF]
    assert warning["policy"] == str(uniform)
    assert "with the logged column 'behavior_prob'" in warning["message"]
    assert "standard errors apart" in " ".join(shown(run, "table").split())


def _with_invalid_propensities(data: Path, bad: Path) -> Path:
    """``data`` written to ``bad`` with its behavior_prob 0 at the first episode's last step
    and NaN at episode 7's first: the column is invalid in 2 episodes."""
    table = pq.read_table(data)
    ids = table.column("episode_id").to_numpy()
    column = table.schema.get_field_index("behavior_prob")
    propensities = table.column(column).to_numpy().copy()
    propensities[np.flatnonzero(ids == ids[0])[-1]] = 0.0
    propensities[np.flatnonzero(ids == 7)[0]] = np.nan
    pq.write_table(table.set_column(column, "behavior_prob", pa.array(propensities)), bad)
    return bad


@pytest.mark.parametrize("on_invalid", ["error", "drop"])
def test_a_logged_column_invalid_in_some_episodes_is_not_compared(generated, tmp_path, on_invalid):
    """The mean weights under the logged column need it on every episode the estimate
    covers: where it is 0 or NaN in two of them, the comparison is left out with a note
    (it was over the other 398 episodes without a word, or stopped a run that never reads
    the column), and the estimates are those of the data with a valid column."""
    from ope_cli.config import BehaviorConfig, EvaluationConfig
    from ope_cli.estimation.pipeline import evaluate

    out = generated["chain"]
    bad = _with_invalid_propensities(out / "logs.parquet", tmp_path / "bad.parquet")

    def run(data):
        config = EvaluationConfig(
            data=str(data),
            policies=(str(out / "policies" / "eval_0.npz"),),
            behavior=BehaviorConfig(policy="estimate"),
            on_invalid=on_invalid,
        )
        return evaluate(config)

    result, clean = run(bad), run(out / "logs.parquet")
    fit = result.behavior.fit
    assert fit.mean_weight is None and clean.behavior.fit.mean_weight is not None
    assert fit.mean_weight_note == (
        "no mean weights under the logged propensities: the logged column 'behavior_prob' is "
        "invalid in 2 of the 400 episodes"
    )
    assert fit.mean_weight_note in result.behavior.describe()  # the table's lines, as JSON's
    assert result.dataset.episodes == 400 and not result.dataset.dropped
    for mine, theirs in zip(result.results, clean.results, strict=True):
        assert mine.estimates["is"].value == pytest.approx(theirs.estimates["is"].value, rel=1e-12)


def test_fit_behavior_fits_where_the_logged_column_is_invalid(generated, tmp_path):
    """fit-behavior never reads the propensities for its fit: a logged column that is 0 or
    NaN in two episodes (a reason to fit a behavior model) no longer stops it (exit 3); the
    checkpoint is the one fitted on the clean data, and the comparison with the column is
    left out with a note rather than made over the other 398 episodes."""
    out = generated["chain"]
    bad = _with_invalid_propensities(out / "logs.parquet", tmp_path / "bad.parquet")

    report = _fit(bad, tmp_path / "bad.npz")
    clean = _fit(out / "logs.parquet", tmp_path / "clean.npz")
    assert report.logged is None and clean.logged is not None and clean.logged_note is None
    assert report.logged_note == (
        "the logged column 'behavior_prob' is invalid in 2 of the 400 episodes: not compared"
    )
    assert (report.episodes, report.steps) == (clean.episodes, clean.steps)
    with np.load(tmp_path / "bad.npz") as fitted, np.load(tmp_path / "clean.npz") as expected:
        np.testing.assert_array_equal(fitted["logits"], expected["logits"])
    shown = io.StringIO()
    render_fit_table(report, Console(file=shown, width=120))
    assert "invalid in 2 of the 400 episodes: not compared" in shown.getvalue()


def test_fit_behavior_fits_where_the_logged_column_is_invalid_everywhere(generated, tmp_path):
    """A behavior_prob column that is NaN in every episode (the commonest reason to fit a
    behavior model) ended fit-behavior with an internal error (a division by no steps),
    after writing the checkpoint. The fit is reported, and the comparison left out."""
    out = generated["chain"]
    table = pq.read_table(out / "logs.parquet")
    column = table.schema.get_field_index("behavior_prob")
    missing = pa.array(np.full(table.num_rows, np.nan))
    pq.write_table(table.set_column(column, "behavior_prob", missing), tmp_path / "nan.parquet")
    report = _fit(tmp_path / "nan.parquet", tmp_path / "nan.npz")
    clean = _fit(out / "logs.parquet", tmp_path / "clean.npz")
    assert report.logged is None and clean.logged is not None
    assert (report.episodes, report.steps) == (clean.episodes, clean.steps)
    assert report.logged_note == (
        "the logged column 'behavior_prob' is invalid in 400 of the 400 episodes: not compared"
    )
    with np.load(tmp_path / "nan.npz") as fitted, np.load(tmp_path / "clean.npz") as expected:
        np.testing.assert_array_equal(fitted["logits"], expected["logits"])


def test_fit_behavior_reads_no_rewards(generated, tmp_path):
    """The fit is to the logged actions: a log without rewards was refused ("name it with
    --reward-col", an option fit-behavior does not have), and a NaN reward stopped it
    (exit 3). Without rewards, in either layout, and with a NaN reward, the fit is the one
    of the whole logs."""
    out = generated["chain"]
    logs = pq.read_table(out / "logs.parquet")
    without = logs.drop_columns(["reward"])
    pq.write_table(without, tmp_path / "actions.parquet")
    rewards = logs.column("reward").to_numpy().copy()
    rewards[5] = np.nan
    index = logs.schema.get_field_index("reward")
    pq.write_table(logs.set_column(index, "reward", pa.array(rewards)), tmp_path / "nan.parquet")
    by_episode = without.group_by("episode_id", use_threads=False).aggregate(
        [(name, "list") for name in ("step", "observation", "action", "behavior_prob")]
    )
    lists = by_episode.rename_columns([n.removesuffix("_list") for n in by_episode.column_names])
    pq.write_table(lists, tmp_path / "episodes.parquet")
    expected = _fit(out / "logs.parquet", tmp_path / "logs.npz")
    with np.load(tmp_path / "logs.npz") as fitted:
        logits = fitted["logits"]
    for name in ("actions", "nan", "episodes"):
        report = _fit(tmp_path / f"{name}.parquet", tmp_path / f"{name}.npz")
        assert (report.episodes, report.steps) == (expected.episodes, expected.steps), name
        assert report.logged is not None, name
        with np.load(tmp_path / f"{name}.npz") as fitted:
            np.testing.assert_allclose(fitted["logits"], logits, rtol=1e-12, err_msg=name)


def test_a_log_of_vector_actions_alone_has_no_telling_layout(tmp_path):
    """Lists of numbers in the action column, without a reward, step or probability column:
    vector actions a step, or an episode's actions a row. Refused in one line, not
    guessed."""
    table = pa.table(
        {
            "episode_id": np.arange(4),
            "observation": np.zeros(4),
            "action": pa.array([[0.1, 0.2]] * 4, pa.list_(pa.float64())),
        }
    )
    pq.write_table(table, tmp_path / "ambiguous.parquet")
    with pytest.raises(DataError, match="without a reward, step or probability column"):
        _fit(tmp_path / "ambiguous.parquet", tmp_path / "b.npz")


def test_estimate_table_footer(chain_runs):
    text = " ".join(chain_runs["both_table"].split())
    assert "behavior probabilities: estimated (tabular)" in text
    assert "mean log-likelihood" in text
    assert "raised to it" in text
    assert "mean trajectory weight of" in text and "with the logged column 'behavior_prob'" in text
    # the policy as the tables call it (its label), not its path
    shown = chain_runs["both"]["results"][0]["label"]
    assert f"mean trajectory weight of {shown}:" in text, text


def test_betting_on_an_estimated_behavior_says_so_in_every_format(generated):
    """Betting intervals on fitted behavior probabilities hold only as far as the fit
    does: the table's intervals line said so, while JSON had it only in
    confidence.method and CSV nowhere (normal intervals are warned of in every format).
    It is a warning of the run now, once in the table (its intervals line)."""
    out = generated["chain"]
    run = _evaluation(
        out / "nob.parquet", _policies(out), behavior="estimate", ci="betting", gamma=0.9
    )
    (warning,) = [w for w in run.to_dict()["warnings"] if w["code"] == BETTING_FITTED_BEHAVIOR]
    assert warning["message"].startswith(
        "betting intervals: their finite-sample guarantee assumes the true behavior "
        "probabilities; --behavior estimate fitted them (tabular)"
    )
    assert f"{BETTING_FITTED_BEHAVIOR}: betting intervals: their finite" in shown(run, "csv")
    assert " ".join(shown(run, "table").split()).count("holds only as far as the fit") == 1


def test_min_propensity_floors_and_counts(generated, chain_runs):
    out = generated["chain"]
    floored = _evaluate(
        out / "nob.parquet", _policies(out), behavior="estimate", min_propensity=0.3
    )
    fit = floored["dataset"]["behavior"]["fit"]
    table = pq.read_table(out / "nob.parquet")
    states, actions = (table.column(c).to_numpy() for c in ("observation", "action"))
    counts = np.zeros((10, 3))
    np.add.at(counts, (states, actions), 1)
    probs = (counts + SMOOTHING) / (counts + SMOOTHING).sum(1, keepdims=True)
    assert fit["floored"] == int(np.sum(probs[states, actions] < 0.3)) > 0
    assert floored["results"][0]["estimates"]["is"]["value"] != pytest.approx(
        chain_runs["estimate"]["results"][0]["estimates"]["is"]["value"], rel=1e-9
    )


def test_densities_are_not_floored_and_say_so(generated):
    """linear_gaussian estimates densities: the report's floor and count are null (they
    said 0.05 and 0 steps floored, where 193 densities were below 0.05), and an explicit
    --min-propensity is refused, one line."""
    out = generated["gaussian"]
    fit = _evaluate(out / "nob.parquet", _policies(out), behavior="estimate")
    fit = fit["dataset"]["behavior"]["fit"]
    assert fit["model"] == "linear_gaussian"
    assert fit["min_propensity"] is None and fit["floored"] is None
    with pytest.raises(UsageError, match="densities of continuous ones") as error:
        _evaluate(out / "nob.parquet", _policies(out), behavior="estimate", min_propensity=0.05)
    assert "\n" not in str(error.value)


@pytest.mark.parametrize(
    ("behavior", "options", "needle"),
    [
        ("estimate", {"behavior_cross_fit": 0}, "at least 1"),
        (None, {"behavior_cross_fit": 2}, "applies to --behavior estimate"),
        ("estimate", {"min_propensity": 1.5}, "--min-propensity"),
    ],
)
def test_behavior_estimate_options_are_checked(generated, behavior, options, needle):
    """Values no data can make valid: a UsageError before the data is read."""
    out = generated["chain"]
    policies = [str(p) for p in _policies(out)]
    config = evaluation_config(
        str(out / "logs.parquet"), policies=policies, behavior=behavior, **options
    )
    with pytest.raises(UsageError, match=needle) as error:
        check_config(config)
    assert "\n" not in str(error.value)


# --- slow: the iterative models, devices, the shipped example, an MSE study


@pytest.fixture(scope="module")
def bandit(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("bandit")
    gen.generate("bandit", root, episodes=4000, seed=5)
    drop_propensities(root / "logs.parquet", root / "nob.parquet")
    return root


@pytest.mark.slow
def test_linear_softmax_recovers_the_logits_up_to_a_constant(bandit, tmp_path):
    started = time.perf_counter()
    report = _fit(bandit / "logs.parquet", tmp_path / "b.npz")
    seconds = time.perf_counter() - started
    assert report.model == "linear_softmax"
    fitted, true = dict(np.load(tmp_path / "b.npz")), dict(np.load(bandit / "behavior.npz"))
    contexts = np.stack(
        pq.read_table(bandit / "logs.parquet").column("observation").to_numpy(zero_copy_only=False)
    )

    def centred(params):
        logits = contexts @ params["weight"] + params["bias"]
        return logits - logits.mean(axis=1, keepdims=True)  # the per-state constant removed

    error = np.abs(centred(fitted) - centred(true))
    print(
        f"linear_softmax fit: {seconds:.1f} s, centred logit error mean {error.mean():.3f} "
        f"max {error.max():.3f}, held-out LL {report.heldout_mean_log_likelihood:.4f}"
    )
    assert error.mean() < 0.15
    assert error.max() < 0.8
    assert report.logged.mean_abs_log_ratio < 0.15


@pytest.mark.slow
def test_mlp_softmax_fits_and_evaluates(bandit, tmp_path):
    linear = _fit(bandit / "nob.parquet", tmp_path / "l.npz")
    mlp = _fit(bandit / "nob.parquet", tmp_path / "m.npz", "mlp_softmax")
    assert str(np.load(tmp_path / "m.npz")["kind"]) == "mlp_softmax"
    assert mlp.mean_log_likelihood > linear.mean_log_likelihood - 0.05
    assert mlp.heldout_mean_log_likelihood > -math.log(10)  # better than uniform
    policy = [bandit / "policies" / "eval_0.npz"]
    by_estimate = _evaluate(bandit / "nob.parquet", policy, behavior="estimate:mlp_softmax")
    by_checkpoint = _evaluate(bandit / "nob.parquet", policy, behavior=str(tmp_path / "m.npz"))
    assert_same_estimates(by_estimate, by_checkpoint, rtol=1e-6)
    # evaluate scores its in-sample mlp fit on the same held-out fifth as fit-behavior
    fit = by_estimate["dataset"]["behavior"]["fit"]
    assert fit["heldout_mean_log_likelihood"] == mlp.heldout_mean_log_likelihood
    assert fit["mean_log_likelihood"] == pytest.approx(mlp.mean_log_likelihood, rel=1e-12)
    linear_fit = _evaluate(bandit / "nob.parquet", policy, behavior="estimate")
    assert linear_fit["dataset"]["behavior"]["fit"]["heldout_mean_log_likelihood"] is None


@pytest.mark.slow
def test_two_emulated_devices_give_the_same_estimate(generated):
    out = generated["chain"]
    args = [
        "evaluate",
        out / "nob.parquet",
        *(arg for policy in _policies(out) for arg in ("-p", policy)),
        "-b",
        "estimate",
        *("--behavior-cross-fit", "3"),  # each episode's fold is found on its device
        "--batch-steps",
        "512",
        *("--min-bucket", "256"),
        "-f",
        "json",
    ]
    runs = {}
    for devices in (1, 2):
        flags = xla_flags(f"--xla_force_host_platform_device_count={devices}")
        done = run_ope(args, env={"XLA_FLAGS": flags})
        assert done.returncode == 0, done
        runs[devices] = json.loads(done.stdout)
    assert runs[2]["runtime"]["devices"] == 2
    assert_same_estimates(runs[1], runs[2], rtol=1e-12)
    for run in runs.values():
        run["dataset"]["behavior"]["fit"].pop("seconds")
    assert runs[1]["dataset"]["behavior"] == runs[2]["dataset"]["behavior"]


@pytest.mark.slow
def test_shipped_example_without_propensities(tmp_path):
    """The README's example: the shipped logs with the propensity column dropped,
    --behavior estimate (linear_softmax on the 4-d observations)."""
    logs = ROOT / "examples" / "data" / "logs.parquet"
    nob = drop_propensities(logs, tmp_path / "logs_without_propensities.parquet")
    policy = [ROOT / "examples" / "policies" / "ckpt.npz"]
    logged = _evaluate(logs, policy)
    estimated = _evaluate(nob, policy, behavior="estimate")
    fit = estimated["dataset"]["behavior"]["fit"]
    assert fit["model"] == "linear_softmax"
    for name in ("wis", "wpdis"):
        ours, theirs = (r["results"][0]["estimates"][name] for r in (estimated, logged))
        print(
            f"example {name}: estimated pi_b {ours['value']:.4f} +- {ours['stderr']:.4f}, "
            f"logged {theirs['value']:.4f} +- {theirs['stderr']:.4f}"
        )
        assert abs(ours["value"] - theirs["value"]) < 3 * theirs["stderr"]


STUDY_VARIANTS = (  # label, --behavior, --behavior-cross-fit
    ("true", None, 1),
    ("estimated", "estimate:tabular", 1),
    ("cross-fitted", "estimate:tabular", 5),
)


def _chain_study(root: Path, datasets: int, episodes: int) -> dict[str, dict[str, float]]:
    """Squared errors of IS and PDIS against the truth over ``datasets`` independent chain
    datasets, with the true (logged) pi_b and with the estimated tabular pi_b. The datasets
    are consecutive slices of ``episodes`` episodes of one generated log (its episodes are
    independent, and chain's truth does not depend on the seed): one rollout, not one per
    dataset."""
    from ope_cli.config import BatchingConfig, BehaviorConfig, EvaluationConfig, IntervalConfig
    from ope_cli.estimation import pipeline

    out = root / "chain"
    truth = gen.generate("chain", out, episodes=datasets * episodes, seed=1000)
    values = {t["policy"]: t["value"] for t in truth["policies"]}
    logs = pq.read_table(out / "logs.parquet")
    first = logs["episode_id"].to_numpy() // episodes  # [N] the dataset of each step
    errors: dict[str, list[float]] = {}
    for index in range(datasets):
        data = root / f"chain_{index}.parquet"
        pq.write_table(logs.filter(first == index), data)
        assert pq.read_schema(data).metadata == logs.schema.metadata  # the declared gamma
        for label, behavior, folds in STUDY_VARIANTS:
            config = EvaluationConfig(
                data=str(data),
                policies=(str(out / "policies/eval_0.npz"), str(out / "policies/eval_1.npz")),
                estimators=("is", "pdis"),
                batching=BatchingConfig(min_bucket=64, batch_steps=128 * 64),
                behavior=BehaviorConfig(policy=behavior, cross_fit=folds),
                intervals=IntervalConfig(method="normal"),
            )
            for result in pipeline.evaluate(config).results:
                name = Path(result.policy).name
                for estimator, estimate in result.estimates.items():
                    key = f"{name} {estimator} {label}"
                    value = values[f"policies/{name}"]
                    errors.setdefault(key, []).append((estimate.value - value) ** 2)
    return {
        key: {
            "mse": float(np.mean(v)),
            "se": float(np.std(v) / np.sqrt(len(v))),
            "median": float(np.median(v)),
        }
        for key, v in errors.items()
    }


@pytest.mark.slow
def test_mse_of_is_and_pdis_with_estimated_and_true_behavior(tmp_path):
    """Regression importance sampling on many small chain datasets: report the MSE of IS and
    PDIS with the estimated tabular pi_b next to the true pi_b; assert only that both are
    finite and the estimate is not catastrophically worse."""
    started = time.perf_counter()
    study = _chain_study(tmp_path, datasets=100, episodes=100)
    print(
        f"\nMSE study, 100 chain datasets x 100 episodes ({time.perf_counter() - started:.0f} s):"
    )
    for key in sorted(study):
        print(
            f"  {key}: MSE {study[key]['mse']:.4g} +- {study[key]['se']:.2g}, "
            f"median squared error {study[key]['median']:.3g}"
        )
    for policy in ("eval_0.npz", "eval_1.npz"):
        for estimator in ("is", "pdis"):
            true = study[f"{policy} {estimator} true"]["mse"]
            estimated = study[f"{policy} {estimator} estimated"]["mse"]
            cross_fitted = study[f"{policy} {estimator} cross-fitted"]["mse"]
            assert math.isfinite(true) and math.isfinite(estimated) and math.isfinite(cross_fitted)
            assert estimated < 2 * true


def _gathered_in_two_processes(make, shares):
    """Two models fed one share each, then gathered: what each ends with."""
    models = [make(), make()]
    for model, (observation, action, fold) in zip(models, shares, strict=True):
        if observation is not None:
            model.add(observation, action, fold)
    gather_in_two_processes(models)
    return models


@pytest.mark.slow  # a property: invariance to the split over processes
@pytest.mark.parametrize("empty_second", [False, True])
@pytest.mark.parametrize("name", ["tabular", "linear_gaussian", "linear_softmax"])
def test_models_gathered_across_processes_equal_one_model(name, empty_second):
    """Each process's statistics, gathered, are those of one process reading every file in
    process order, also when a process had no files."""
    from ope_cli.models.behavior_models.fitting import make_model

    rng = np.random.default_rng(4)
    n = 400
    if name == "tabular":
        observation = rng.integers(0, 5 if empty_second else 6, n)
    else:  # an offset: each process's sums are about its own pivots until gathered
        observation = 1e4 + rng.normal(size=(n, 3))
    if name == "linear_gaussian":
        action = observation @ rng.normal(size=(3, 2)) + rng.normal(size=(n, 2))
    else:
        action = rng.integers(0, 4, n)
    fold = rng.integers(0, 2, n)
    cut = n if empty_second else 150
    shares = [(observation[:cut], action[:cut], fold[:cut])]
    shares.append(
        (None, None, None) if empty_second else (observation[cut:], action[cut:], fold[cut:])
    )
    one = make_model(name, 2)
    one.add(observation, action, fold)
    for model in _gathered_in_two_processes(lambda: make_model(name, 2), shares):
        for exclude in (None, 1):
            expected, actual = one.fit(exclude), model.fit(exclude)
            for key in expected:
                np.testing.assert_allclose(actual[key], expected[key], rtol=1e-12, atol=1e-12)
        assert model.log_likelihood(one.fit(), 0) == pytest.approx(one.log_likelihood(one.fit(), 0))


@pytest.mark.slow
@pytest.mark.parametrize("env, model", [("chain", "tabular"), ("gaussian", "linear_gaussian")])
def test_streaming_estimates_add_one_pass_over_the_data(generated, monkeypatch, env, model):
    """estimate:tabular and estimate:linear_gaussian read the data twice in all: one fitting
    pass (flat memory), then the evaluation; rows are counted as the sources yield them."""
    from ope_cli.data import episode_stream
    from ope_cli.data.sources import iter_batches

    rows = []

    def counted(*args, **kwargs):
        for batch in iter_batches(*args, **kwargs):
            rows.append(batch.batch.num_rows)
            yield batch

    monkeypatch.setattr(episode_stream, "iter_batches", counted)  # every pass reads there
    out = generated[env]
    logged = _evaluate(out / "logs.parquet", _policies(out))
    read_once = sum(rows)
    assert read_once == logged["dataset"]["rows_read"]
    rows.clear()
    data = out / "nob.parquet"
    _evaluate(data, _policies(out), behavior=f"estimate:{model}")
    assert sum(rows) == 2 * read_once


def test_linear_gaussian_refuses_fewer_steps_than_parameters():
    """Two steps for four parameters fit exactly: a spread of 0, floored to 1e-12, and
    importance weights of 1e-13 with only generic warnings."""
    model = LinearGaussianModel()
    model.add(np.array([[0.0, 1.0, 2.0], [1.0, 0.0, 2.0]]), np.array([0.5, -0.5]), np.zeros(2, int))
    with pytest.raises(DataError, match="2 step.s. for 4 parameters per action dimension"):
        model.fit()


@pytest.mark.parametrize(
    "name", ["linear_softmax", pytest.param("mlp_softmax", marks=pytest.mark.slow)]
)
def test_a_constant_feature_gets_no_weight_from_rounding(name):
    """3.3 repeated has a computed spread of 4e-15, not 0: dividing by it wrote weights of
    1e12 that cancel in float64 only (a float32 run then gave IS -14.9 against 0.25)."""
    from ope_cli.models.behavior_models.softmax import SoftmaxModel

    rng = np.random.default_rng(0)
    x = np.stack([rng.normal(size=3000), np.full(3000, 3.3)], axis=1)
    action = (np.stack([np.zeros(3000), 1.5 * x[:, 0]], 1) + rng.gumbel(size=(3000, 2))).argmax(1)
    model = SoftmaxModel(name)
    model.add(x, action, np.zeros(3000, np.int64))
    fitted = model.fit()
    first = "weight" if name == "linear_softmax" else "weight_0"
    bias = "bias" if name == "linear_softmax" else "bias_0"
    assert np.abs(fitted[first]).max() < 100 and np.abs(fitted[bias]).max() < 100


def test_fit_behavior_writes_its_fit_when_the_logged_columns_disagree(tmp_path):
    """A probability column and its log that disagree: the checkpoint was written, then
    the run ended with exit 3 and no report; the comparison with the logged column is the
    report's, so it says why it is missing."""
    from ope_cli.models.behavior_models.command import FitBehaviorConfig, run_fit_behavior

    rng = np.random.default_rng(4)
    n = 200
    prob = np.full(n, 0.5)
    log = np.log(prob)
    log[7] = np.log(0.9)
    table = {
        "episode_id": np.arange(n) // 4,
        "step": np.arange(n) % 4,
        "observation": rng.normal(size=n),
        "action": rng.integers(0, 2, n),
        "reward": rng.normal(size=n),
        "behavior_prob": prob,
        "behavior_log_prob": log,
    }
    pq.write_table(pa.table(table), tmp_path / "logs.parquet")
    out = tmp_path / "b.npz"
    result = run_fit_behavior(FitBehaviorConfig(str(tmp_path / "logs.parquet"), str(out)))
    assert out.exists() and result.logged is None
    assert "could not be read" in result.logged_note and "disagree" in result.logged_note


@pytest.mark.slow  # iterative fits, as the others of this module
def test_a_linear_softmax_fit_stopped_by_its_cap_is_warned_of(tmp_path):
    """Forty observation features correlated at 0.999: L-BFGS stops at its cap of steps,
    its gradient norm far above its tolerance. fit-behavior said nothing (a case 1.8e-5
    above the optimum's objective, each probability up to 1.7% off); it and
    --behavior estimate now warn (behavior_fit_not_converged). Ordinary features do not."""
    from ope_cli.models.behavior_models.base import BEHAVIOR_FIT_NOT_CONVERGED
    from ope_cli.models.behavior_models.command import FitBehaviorConfig, run_fit_behavior

    rng = np.random.default_rng(0)
    n, d = 200, 40
    common = rng.normal(size=(n, 1))
    collinear = np.sqrt(0.999) * common + np.sqrt(0.001) * rng.normal(size=(n, d))
    cases = {"collinear": collinear, "ordinary": rng.normal(size=(n, 3))}
    for name, observation in cases.items():
        table = {
            "episode_id": np.arange(n),
            "step": np.zeros(n, np.int64),
            "observation": pa.FixedSizeListArray.from_arrays(
                pa.array(observation.ravel()), observation.shape[1]
            ),
            "action": rng.integers(0, 5, n),
            "reward": rng.normal(size=n),
        }
        pq.write_table(pa.table(table), tmp_path / f"{name}.parquet")
        out = tmp_path / f"{name}.npz"
        config = FitBehaviorConfig(str(tmp_path / f"{name}.parquet"), str(out), "linear_softmax")
        codes = [w["code"] for w in run_fit_behavior(config).warnings]
        assert (BEHAVIOR_FIT_NOT_CONVERGED in codes) is (name == "collinear"), codes
    policy = str(tmp_path / "collinear.npz")
    document = _evaluate(tmp_path / "collinear.parquet", [policy], behavior="estimate")
    assert document["dataset"]["behavior"]["fit"]["stopped_short"] > 1e-9
    warned = [w for w in document["warnings"] if w["code"] == BEHAVIOR_FIT_NOT_CONVERGED]
    assert len(warned) == 1 and "cap of 500 steps" in warned[0]["message"], warned


def test_a_model_that_scores_far_worse_on_held_out_episodes_is_called_overfitted():
    """mlp_softmax on a 300-episode bandit log: -1.22 nats per step in sample, -3.49 held
    out (below a uniform guess over its 10 actions, -2.30), and fit-behavior said nothing.
    linear_softmax on the same log lost 0.17."""
    from ope_cli.models.behavior_models.command import BEHAVIOR_FIT_OVERFITS, overfit_warnings

    (warning,) = overfit_warnings("mlp_softmax", -1.2206, -3.4920, 300, 60)
    assert warning["code"] == BEHAVIOR_FIT_OVERFITS and warning["policy"] is None
    assert "scores -3.49 nats per step on the held-out fifth" in warning["message"]
    assert overfit_warnings("mlp_softmax", -2.1213, -2.2957, 300, 60) == ()


@pytest.mark.parametrize("held_out", [False, True])
def test_fit_behavior_on_one_episode_says_nothing_scored_it(tmp_path, held_out):
    """The whole command on one episode: the held-out score is null (no episode in the
    held-out fifth, or none left to fit on there), and said to be (it said nothing)."""
    from ope_cli.models.behavior_models.command import BEHAVIOR_FIT_UNCHECKED

    rng = np.random.default_rng(0)
    behavior = random_checkpoint("linear_softmax", rng, obs_dim=2, n_actions=3)
    (episode,) = random_episodes(rng, 1, behavior=behavior, median_length=30, max_length=30)
    ids = np.arange(20)  # an id in the held-out fold or outside it
    episode["episode_id"] = int(ids[(episode_folds(id_keys(ids), 5) == 0) == held_out][0])
    data = write_step_layout([episode], tmp_path / "one.parquet")
    report = run_fit_behavior(FitBehaviorConfig(str(data), str(tmp_path / "b.npz")))
    assert report.heldout_mean_log_likelihood is None
    assert report.heldout_episodes == int(held_out)
    (warning,) = report.warnings
    assert warning["code"] == BEHAVIOR_FIT_UNCHECKED
    fell = "every one" if held_out else "none"
    assert warning["message"].startswith(f"{fell} of the 1 episode(s) fell in the held-out")
