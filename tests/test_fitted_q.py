"""``--q fit`` in the run (ope_cli/models/fitted_q.py), by what goes in and what comes out: a fit
(``q_models.fitting.QFit``) becomes the Q function the kernel scores with, its summary plain JSON;
an opened stream's ``fit`` Q sources are replaced by the fits of ``fit_q`` on its episodes,
cross-fitted or not, and every other Q source is left as it was."""

from __future__ import annotations

import json
import math

import numpy as np
import pyarrow as pa
import pytest
from datasets import random_checkpoint, random_episodes, save_checkpoint, write_step_layout

from ope_cli.api import evaluation_config
from ope_cli.errors import DataError
from ope_cli.models.fitted_q import fitted_q
from ope_cli.models.q_models.fitting import FitSettings, QFit, fit_q
from ope_cli.models.qfunctions import FIT, linear_q_values, mlp_q_sa, tabular_q_values

GAMMA = 0.9


def _fit(kind: str, arrays: list[dict], diagnostics: dict | None = None) -> QFit:
    model = {"tabular_q": "tabular", "linear_q": "linear"}.get(kind, "mlp")
    return QFit(model, kind, arrays, episodes=12, steps=80, diagnostics=diagnostics or {})


def _linear_arrays(rng: np.random.Generator, obs_dim: int = 3, n_actions: int = 4) -> dict:
    return {
        "kind": "linear_q",
        "weight": rng.normal(size=(obs_dim, n_actions)),
        "bias": rng.normal(size=n_actions),
    }


def test_one_fit_is_its_checkpoints_q_function():
    rng = np.random.default_rng(0)
    arrays = _linear_arrays(rng)
    q = fitted_q("fit:linear", _fit("linear_q", [arrays]), folds=1)
    assert (q.name, q.kind, q.folds) == ("fit:linear", "linear_q", 1)
    assert q.q_values is linear_q_values and (q.obs_dim, q.n_actions) == (3, 4)
    assert set(q.params) == {"weight", "bias"}
    np.testing.assert_array_equal(q.params["weight"], arrays["weight"])
    np.testing.assert_array_equal(q.params["bias"], arrays["bias"])


def test_cross_fitted_params_are_stacked_in_fold_order():
    rng = np.random.default_rng(1)
    per_fold = [{"kind": "tabular_q", "q": rng.normal(size=(5, 3))} for _ in range(3)]
    q = fitted_q("fit", _fit("tabular_q", per_fold), folds=3)
    assert (q.name, q.kind, q.folds, q.n_states, q.n_actions) == ("fit", "tabular_q", 3, 5, 3)
    assert q.q_values is tabular_q_values
    assert q.params["q"].shape == (3, 5, 3)
    for k, arrays in enumerate(per_fold):
        np.testing.assert_array_equal(q.params["q"][k], arrays["q"])
    one = fitted_q("fit", _fit("tabular_q", per_fold[:1]), folds=1)
    assert one.stack_key != q.stack_key  # a cross-fitted Q is never stacked with a plain one


def test_a_continuous_fit_scores_state_action_pairs():
    rng = np.random.default_rng(2)
    arrays = {
        "kind": "mlp_q_sa",
        "weight_0": rng.normal(size=(5, 4)),
        "bias_0": rng.normal(size=4),
        "weight_1": rng.normal(size=(4, 1)),
        "bias_1": rng.normal(size=1),
        "activation": "relu",
    }
    q = fitted_q("fit:mlp", _fit("mlp_q_sa", [arrays, arrays]), folds=2)
    assert q.kind == "mlp_q_sa" and q.q_values is None and q.q_sa is mlp_q_sa("relu")
    assert q.params["weight_0"].shape == (2, 5, 4) and q.folds == 2


def test_the_summary_is_plain_json():
    """The fit's summary: model, kind, folds, episodes, steps and the diagnostics, with NumPy
    scalars as Python numbers and non-finite values as None (also inside lists)."""
    diagnostics = {
        "bellman_rmse": np.float64(0.25),
        "dm": np.float32(1.5),
        "dm_stderr": float("nan"),
        "iterations": [np.int64(3), np.int64(7)],
        "converged": [np.bool_(True), False],
        "heldout_bellman_rmse": [np.float64(np.inf), 0.5],
        "seconds": 0.01,
    }
    arrays = _linear_arrays(np.random.default_rng(3))
    q = fitted_q("fit:linear", _fit("linear_q", [arrays, arrays], diagnostics), folds=2)
    assert q.fit == {
        "model": "linear",
        "kind": "linear_q",
        "folds": 2,
        "episodes": 12,
        "steps": 80,
        "bellman_rmse": 0.25,
        "dm": 1.5,
        "dm_stderr": None,
        "iterations": [3, 7],
        "converged": [True, False],
        "heldout_bellman_rmse": [None, 0.5],
        "seconds": 0.01,
    }
    assert json.loads(json.dumps(q.fit, allow_nan=False)) == q.fit
    assert type(q.fit["dm"]) is float and type(q.fit["iterations"][0]) is int


# --- a stream's Q sources replaced by their fits ---------------------------------------------


@pytest.fixture(scope="module")
def tabular_logs(tmp_path_factory):
    """Tabular episodes (8 states, 3 actions), a target checkpoint, and a Q checkpoint."""
    rng = np.random.default_rng(4)
    root = tmp_path_factory.mktemp("fitted_q")
    behavior = random_checkpoint("tabular", rng, n_states=8, n_actions=3)
    episodes = random_episodes(rng, 60, behavior=behavior, median_length=6, max_length=20)
    target = random_checkpoint("tabular", rng, n_states=8, n_actions=3)
    q_checkpoint = {"kind": "tabular_q", "q": rng.normal(size=(8, 3))}
    return {
        "data": write_step_layout(episodes, root / "logs.parquet"),
        "target": save_checkpoint(root / "target.npz", target),
        "q": save_checkpoint(root / "q.npz", q_checkpoint),
        "q_table": q_checkpoint["q"],
        "largest_action": max(int(e["action"].max()) for e in episodes),
    }


def _stream(logs: dict, policies: list[str], qs: list[str], **config):
    from ope_cli.estimation.pipeline import stream

    evaluation = evaluation_config(
        str(logs["data"]), policies=tuple(policies), q=tuple(qs), gamma=GAMMA, **config
    )
    return stream(evaluation)


def _direct_fit(batches, policy, model: str, folds: int) -> QFit:
    """``fit_q`` on the stream's episodes, read and validated as the stream reads them."""
    return fit_q(
        batches.inputs.checked_episodes(),
        policy,
        FitSettings(
            model,
            GAMMA,
            folds=folds,
            seed=batches.config.intervals.seed,
            n_actions=policy.n_actions,
            discrete=True,
        ),
    )


@pytest.mark.parametrize("folds", [1, 2])
def test_fit_sources_become_the_fits_of_their_policies(tabular_logs, folds):
    target = str(tabular_logs["target"])
    batches = _stream(
        tabular_logs, [target, target], [str(tabular_logs["q"]), "fit"], cross_fit=folds
    )
    checkpoint, fitted = batches.qs
    assert checkpoint.kind == "tabular_q" and checkpoint.fit is None  # left as it was
    np.testing.assert_array_equal(checkpoint.params["q"], tabular_logs["q_table"])
    assert fitted.kind == "tabular_q" and fitted.kind != FIT and fitted.name == "fit"
    assert fitted.folds == folds and fitted.fit["folds"] == folds
    assert fitted.fit["model"] == "tabular" and fitted.fit["episodes"] == 60
    expected = fitted_q("fit", _direct_fit(batches, batches.policies[1], "tabular", folds), folds)
    assert fitted.params["q"].shape == ((8, 3) if folds == 1 else (folds, 8, 3))
    np.testing.assert_allclose(fitted.params["q"], expected.params["q"], rtol=1e-12)
    for key in ("steps", "bellman_rmse", "dm"):
        assert fitted.fit[key] == pytest.approx(expected.fit[key], rel=1e-12), key


def test_an_entry_point_policy_gets_the_logged_action_count(tabular_logs, tmp_path, monkeypatch):
    """A policy that declares no action count: the fit spans 1 + the largest logged action."""
    (tmp_path / "uniform_policy.py").write_text(
        "import jax.numpy as jnp\n"
        "def log_prob(observation, action):\n"
        "    return jnp.log(1.0 / 3.0)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    batches = _stream(tabular_logs, ["uniform_policy:log_prob"], ["fit:tabular"], cross_fit=1)
    (fitted,) = batches.qs
    assert fitted.n_actions == tabular_logs["largest_action"] + 1
    assert fitted.params["q"].shape == (8, fitted.n_actions)
    assert math.isfinite(fitted.fit["dm"])


def test_no_steps_to_fit_on_is_a_data_error(tabular_logs, tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    empty = tmp_path / "empty.parquet"
    table = pq.read_table(tabular_logs["data"])
    pq.write_table(table.slice(0, 0), empty)
    (tmp_path / "uniform_policy_of_no_data.py").write_text(
        "def log_prob(observation, action):\n    return -1.0986122886681098\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(DataError, match="no steps to fit Q on"):
        _stream({"data": empty}, ["uniform_policy_of_no_data:log_prob"], ["fit"], cross_fit=1)


def test_processes_fit_one_q_on_all_their_episodes(tabular_logs, tmp_path, monkeypatch):
    """Two processes (threads exchanging through a gather), each with one file: both get
    the Q one process fits on both files, over the largest action any of them logged."""
    import threading

    import pyarrow.parquet as pq
    from conftest import TwoProcessGather

    from ope_cli.models.fitted_q import fit_q_function

    table = pq.read_table(tabular_logs["data"])
    episode = table.column("episode_id").to_numpy()
    first = episode < np.median(episode)
    shares = tmp_path / "shares"
    shares.mkdir()
    low = table.filter(first)  # process 0 logs actions 0 and 1 only: the count is gathered
    low = low.set_column(
        low.column_names.index("action"),
        "action",
        pa.array(np.minimum(low.column("action").to_numpy(), 1)),
    )
    pq.write_table(low, shares / "part-0.parquet")
    pq.write_table(table.filter(~first), shares / "part-1.parquet")
    (tmp_path / "uniform_policy_of_shares.py").write_text(
        "def log_prob(observation, action):\n    return -1.0986122886681098\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    policy = ["uniform_policy_of_shares:log_prob"]
    (whole,) = _stream({"data": shares}, policy, ["fit:tabular"], cross_fit=2).qs

    def no_failure(error):
        assert error is None

    exchange, fitted = TwoProcessGather(), {}

    def process(rank: int) -> None:
        batches = _stream({"data": shares / f"part-{rank}.parquet"}, policy, [], cross_fit=2)
        fitted[rank] = fit_q_function(
            batches.inputs.checked_episodes(),
            batches.policies[0],
            "fit:tabular",
            gamma=GAMMA,
            folds=2,
            seed=batches.config.intervals.seed,
            collectives=(exchange.for_process(rank), no_failure),
        )

    threads = [threading.Thread(target=process, args=(rank,), daemon=True) for rank in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert sorted(fitted) == [0, 1]
    for q in fitted.values():
        assert q.n_actions == whole.n_actions == tabular_logs["largest_action"] + 1
        np.testing.assert_allclose(q.params["q"], whole.params["q"], rtol=1e-12, atol=1e-12)
        assert q.fit["episodes"] == whole.fit["episodes"] == 60
