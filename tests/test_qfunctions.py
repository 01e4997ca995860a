"""Q sources (ope_cli/models/qfunctions.py) called directly: the per-step Q functions against plain
NumPy, checkpoints and entry points, ``--q`` values paired with policies, the checks
against the data, and (Q-hat, V-hat) per step and per padded window, with and without jit."""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from datasets import random_checkpoint, save_checkpoint
from reference import action_log_probs

from ope_cli.data.ids import fold_index
from ope_cli.data.steps import Steps
from ope_cli.errors import DataError, PolicyError, UsageError
from ope_cli.models import qfunctions as qf
from ope_cli.models.policies import (
    Policy,
    checkpoint_policy,
    load_checkpoint,
    logged_policy,
    tabular_log_prob,
)
from ope_cli.models.q_models.base import check_q_model_fits


def _linear_q(rng: np.random.Generator, obs_dim: int = 3, n_actions: int = 4) -> dict:
    return {
        "kind": "linear_q",
        "weight": rng.normal(size=(obs_dim, n_actions)),
        "bias": rng.normal(size=n_actions),
    }


def _mlp(kind: str, rng: np.random.Generator, sizes: tuple[int, ...], activation: str) -> dict:
    checkpoint: dict = {"kind": kind, "activation": activation}
    for k, (d_in, d_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        checkpoint[f"weight_{k}"] = rng.normal(size=(d_in, d_out))
        checkpoint[f"bias_{k}"] = rng.normal(size=d_out)
    return checkpoint


def _mlp_numpy(checkpoint: dict, inputs: np.ndarray) -> np.ndarray:
    """The MLP of a checkpoint on [d] inputs, in NumPy."""
    act = np.tanh if checkpoint["activation"] == "tanh" else (lambda x: np.maximum(x, 0.0))
    layers = sum(1 for key in checkpoint if key.startswith("weight_"))
    hidden = inputs
    for i in range(layers):
        hidden = hidden @ checkpoint[f"weight_{i}"] + checkpoint[f"bias_{i}"]
        if i < layers - 1:
            hidden = act(hidden)
    return hidden


def _schema(action_kind: str = "discrete", observation_kind: str = "vector", obs_dim=3):
    """The fields of a data schema that the Q checks read."""
    return types.SimpleNamespace(
        columns={"observation": "obs", "action": "act"},
        action_kind=action_kind,
        observation_kind=observation_kind,
        observation_dim=obs_dim,
    )


# --- per-step Q functions ------------------------------------------------------------------


def test_discrete_q_functions_equal_their_formulas():
    rng = np.random.default_rng(0)
    table = rng.normal(size=(6, 3))
    assert np.allclose(qf.tabular_q_values({"q": table}, 4), table[4])
    linear = _linear_q(rng)
    observation = rng.normal(size=3)
    expected = observation @ linear["weight"] + linear["bias"]
    assert np.allclose(qf.linear_q_values(linear, observation), expected, rtol=1e-12)
    scalar = {"weight": rng.normal(size=(1, 2)), "bias": rng.normal(size=2)}  # a scalar state
    assert np.allclose(qf.linear_q_values(scalar, 0.5), 0.5 * scalar["weight"][0] + scalar["bias"])
    for activation in ("tanh", "relu"):
        mlp = _mlp("mlp_q", rng, (3, 5, 4), activation)
        params = {k: v for k, v in mlp.items() if k.startswith(("weight_", "bias_"))}
        got = qf.mlp_q_values(activation)(params, observation)
        assert np.allclose(got, _mlp_numpy(mlp, observation), rtol=1e-12)


def test_continuous_q_scores_the_concatenated_state_and_action():
    rng = np.random.default_rng(1)
    for activation in ("tanh", "relu"):
        mlp = _mlp("mlp_q_sa", rng, (5, 4, 1), activation)
        params = {k: v for k, v in mlp.items() if k.startswith(("weight_", "bias_"))}
        observation, action = rng.normal(size=3), rng.normal(size=2)
        got = qf.mlp_q_sa(activation)(params, observation, action)
        expected = _mlp_numpy(mlp, np.concatenate([observation, action]))[0]
        assert np.ndim(got) == 0 and float(got) == pytest.approx(expected, rel=1e-12)


def test_one_function_object_per_activation():
    """The jit cache recognises a function by identity: the same activation, the same one."""
    assert qf.mlp_q_values("relu") is qf.mlp_q_values("relu")
    assert qf.mlp_q_values("relu") is not qf.mlp_q_values("tanh")
    assert qf.mlp_q_sa("tanh") is qf.mlp_q_sa("tanh")


# --- checkpoints ---------------------------------------------------------------------------


def test_q_checkpoints_give_their_kind_and_sizes():
    rng = np.random.default_rng(2)
    tabular = qf.q_checkpoint("t.npz", {"kind": "tabular_q", "q": np.zeros((6, 3))})
    assert (tabular.kind, tabular.n_states, tabular.n_actions) == ("tabular_q", 6, 3)
    assert tabular.q_values is qf.tabular_q_values and tabular.q_sa is None
    linear = qf.q_checkpoint("l.npz", _linear_q(rng, 3, 4))
    assert (linear.kind, linear.obs_dim, linear.n_actions) == ("linear_q", 3, 4)
    mlp = qf.q_checkpoint("m.npz", _mlp("mlp_q", rng, (3, 5, 4), "relu"))
    assert (mlp.kind, mlp.static, mlp.obs_dim, mlp.n_actions) == ("mlp_q", ("relu",), 3, 4)
    assert mlp.q_values is qf.mlp_q_values("relu")
    sa = qf.q_checkpoint("s.npz", _mlp("mlp_q_sa", rng, (5, 4, 1), "tanh"))
    assert sa.kind == "mlp_q_sa" and sa.q_values is None and sa.q_sa is qf.mlp_q_sa("tanh")
    for q in (tabular, linear, mlp, sa):
        assert q.folds == 1 and q.fit is None and q.gamma is None
    fitted = qf.q_checkpoint("f.npz", {"kind": "tabular_q", "q": np.zeros((6, 3)), "gamma": 0.9})
    assert fitted.gamma == 0.9 and fitted.params.keys() == {"q"}


def test_bad_q_checkpoints_are_policy_errors():
    rng = np.random.default_rng(3)
    cases = {
        "no kind": ({"q": np.zeros((2, 2))}, "no 'kind' array"),
        "policy": (random_checkpoint("linear_softmax", rng), "kind 'linear_softmax'"),
        "bias": (
            {"kind": "linear_q", "weight": np.zeros((3, 4)), "bias": np.zeros(5)},
            "bias must match weight's columns",
        ),
        "wide sa": (_mlp("mlp_q_sa", rng, (5, 2), "tanh"), "must output one value, got 2"),
        "tabular 1-d": ({"kind": "tabular_q", "q": np.zeros(4)}, "expected 2 dimension(s)"),
        "nan": (
            {"kind": "linear_q", "weight": np.full((3, 4), np.nan), "bias": np.zeros(4)},
            "holds NaN or infinite values",
        ),
        "gamma above 1": (
            {"kind": "tabular_q", "q": np.zeros((2, 2)), "gamma": np.float64(1.5)},
            "must be one number in [0, 1] (the discount the Q was fitted for), got 1.5",
        ),
        "gamma per action": (
            {"kind": "tabular_q", "q": np.zeros((2, 2)), "gamma": np.full(2, 0.9)},
            "array 'gamma' must be one number",
        ),
        "gamma as text": (
            {"kind": "tabular_q", "q": np.zeros((2, 2)), "gamma": np.array("0.9")},
            "array 'gamma' must be one number",
        ),
        "fingerprint not hex": (
            {"kind": "tabular_q", "q": np.zeros((2, 2)), "policy_fingerprint": np.array("x" * 64)},
            "array 'policy_fingerprint' must be the sha256 (64 hex digits)",
        ),
        "fingerprint a number": (
            {"kind": "tabular_q", "q": np.zeros((2, 2)), "policy_fingerprint": np.float64(1.0)},
            "array 'policy_fingerprint' must be the sha256 (64 hex digits)",
        ),
        "exact a number": (  # a 1.0 is no claim: only a boolean marks a Q exact
            {"kind": "tabular_q", "q": np.zeros((2, 2)), "exact": np.float64(1.0)},
            "array 'exact' must be one boolean (whether the Q is its policy's exact Q), got 1.0",
        ),
    }
    for name, (arrays, words) in cases.items():
        with pytest.raises(PolicyError, match="^bad.npz: ") as error:
            qf.q_checkpoint("bad.npz", arrays)
        assert words in str(error.value), (name, str(error.value))
    assert qf.Q_KINDS == ("tabular_q", "linear_q", "mlp_q", "mlp_q_sa")


def test_stack_keys_group_equal_shapes_only():
    rng = np.random.default_rng(4)
    one, two = (qf.q_checkpoint(f"{i}.npz", _linear_q(rng, 3, 4)) for i in range(2))
    wider = qf.q_checkpoint("w.npz", _linear_q(rng, 3, 5))
    assert one.stack_key == two.stack_key != wider.stack_key
    relu, tanh = (
        qf.q_checkpoint("m.npz", _mlp("mlp_q", np.random.default_rng(5), (3, 4), a))
        for a in ("relu", "tanh")
    )
    assert relu.stack_key != tanh.stack_key  # the activation selects the function
    fit, columns = qf.QFunction("fit", qf.FIT), qf.QFunction("'q' and 'v'", qf.COLUMNS)
    assert fit.stack_key == (qf.FIT, "fit") and columns.stack_key == (qf.COLUMNS, "'q' and 'v'")


# --- entry points (targets below, imported by name) ----------------------------------------


def doubled_q_values(observation):
    """An entry point: [2] Q-values of a scalar state."""
    return jnp.stack([observation, 2.0 * observation])


class ContinuousCritic:
    n_actions = None

    def q(self, observation, action):
        return jnp.sum(observation) * jnp.sum(action)


class DiscreteCritic:
    n_actions = 2

    def q_values(self, observation):
        return doubled_q_values(observation)


CONTINUOUS_CRITIC, DISCRETE_CRITIC = ContinuousCritic(), DiscreteCritic()
NOT_CALLABLE = 3


def test_entry_points_become_q_functions():
    function = qf.load_q_entry_point("test_qfunctions:doubled_q_values")
    assert function.kind == "entry_point" and function.q_sa is None and function.n_actions is None
    assert np.allclose(function.q_values(None, 1.5), [1.5, 3.0])
    method = qf.load_q_entry_point("test_qfunctions:DISCRETE_CRITIC")
    assert method.n_actions == 2 and np.allclose(method.q_values(None, 2.0), [2.0, 4.0])
    continuous = qf.load_q_entry_point("test_qfunctions:CONTINUOUS_CRITIC")
    assert continuous.q_values is None
    assert float(continuous.q_sa(None, jnp.ones(2), jnp.full(3, 0.5))) == pytest.approx(3.0)
    with pytest.raises(PolicyError, match="not callable, and has no q or q_values method"):
        qf.load_q_entry_point("test_qfunctions:NOT_CALLABLE")


def test_an_entry_point_named_twice_keeps_one_wrapper():
    """The same object gives the same per-step function (the jit reuses its compilation),
    under each name it is given."""
    first = qf.load_q_entry_point("test_qfunctions:DISCRETE_CRITIC")
    again = qf.load_q("test_qfunctions:DISCRETE_CRITIC")
    assert again.q_values is first.q_values and again.name == "test_qfunctions:DISCRETE_CRITIC"


# --- --q values ----------------------------------------------------------------------------


def test_load_q_tells_fit_checkpoints_and_entry_points_apart(tmp_path):
    rng = np.random.default_rng(6)
    for spec in ("fit", "fit:linear", "fit:mlp"):
        q = qf.load_q(spec)
        assert (q.kind, q.name, q.params) == (qf.FIT, spec, None)
    path = save_checkpoint(tmp_path / "q.npz", _linear_q(rng))
    checkpoint = qf.load_q(str(path))
    assert checkpoint.kind == "linear_q" and checkpoint.name == str(path)
    assert qf.load_q("test_qfunctions:doubled_q_values").kind == "entry_point"
    with pytest.raises(PolicyError):
        qf.load_q(str(tmp_path / "missing.npz"))


def test_expand_qs_expands_globs_sorted_and_keeps_the_rest(tmp_path, monkeypatch):
    rng = np.random.default_rng(7)
    for name in ("q_b.npz", "q_a.npz", "q_c.npz"):
        save_checkpoint(tmp_path / name, _linear_q(rng))
    monkeypatch.chdir(tmp_path)
    specs = ["fit:linear", "q_*.npz", "module:q_values", "q_a.npz"]
    expected = ["fit:linear", "q_a.npz", "q_b.npz", "q_c.npz", "module:q_values", "q_a.npz"]
    assert qf.expand_qs(specs) == expected
    with pytest.raises(PolicyError):
        qf.expand_qs(["none_*.npz"])


def test_pair_qs_gives_one_q_per_policy():
    assert qf.pair_qs(["q.npz"], 1) == ["q.npz"]
    assert qf.pair_qs(["fit"], 3) == ["fit", "fit", "fit"]
    assert qf.pair_qs(["fit:mlp"], 2) == ["fit:mlp", "fit:mlp"]
    assert qf.pair_qs(["a.npz", "b.npz"], 2) == ["a.npz", "b.npz"]
    with pytest.raises(UsageError, match="--q q.npz is one Q-hat for 2 policies"):
        qf.pair_qs(["q.npz"], 2)
    with pytest.raises(UsageError, match=r"--q is given 3 times \(globs\) for 2 policies"):
        qf.pair_qs(["a", "b", "c"], 2, " (globs)")


def test_load_qs_pairs_columns_and_specs_with_policies(tmp_path):
    rng = np.random.default_rng(8)
    policy = checkpoint_policy("p.npz", random_checkpoint("linear_softmax", rng, obs_dim=3))
    assert qf.load_qs([], [policy]) is None
    (columns,) = qf.load_qs([], [policy], ("q_hat", "v_hat"))
    assert columns.kind == qf.COLUMNS and "q_hat" in columns.name and "v_hat" in columns.name
    with pytest.raises(UsageError, match="two Q sources"):
        qf.load_qs(["fit"], [policy], ("q_hat", "v_hat"))
    with pytest.raises(UsageError, match="score the log for one policy, but 2 are given"):
        qf.load_qs([], [policy, policy], ("q_hat", "v_hat"))
    fits = qf.load_qs(["fit"], [policy, policy])
    assert [q.kind for q in fits] == [qf.FIT, qf.FIT]
    for name in ("q1.npz", "q2.npz"):
        save_checkpoint(tmp_path / name, _linear_q(rng))
    paired = qf.load_qs([str(tmp_path / "q*.npz")], [policy, policy])
    assert [q.name for q in paired] == [str(tmp_path / "q1.npz"), str(tmp_path / "q2.npz")]
    with pytest.raises(UsageError, match=r"2 times \(globs expanded from 1: .*\) for 3 policies"):
        qf.load_qs([str(tmp_path / "q*.npz")], [policy] * 3)


def test_fit_model_of_defaults_by_the_data_and_checks_the_choice():
    assert qf.fit_model_of("fit", "index", "discrete") == "tabular"
    assert qf.fit_model_of("fit", "vector", "discrete") == "linear"
    assert qf.fit_model_of("fit", "vector", "continuous") == "mlp"
    assert qf.fit_model_of("fit:mlp", "vector", "discrete") == "mlp"
    with pytest.raises(UsageError, match="--q fit:MODEL: unknown Q model 'forest'"):
        qf.fit_model_of("fit:forest", "vector", "discrete")
    # the way out is named as evaluate takes it (it said "use --model mlp", fit-q's option)
    with pytest.raises(UsageError, match="tabular needs integer state") as error:
        qf.fit_model_of("fit:tabular", "vector", "discrete")
    assert "use --q fit:linear or --q fit:mlp" in str(error.value)
    with pytest.raises(UsageError, match="linear is over discrete actions") as error:
        qf.fit_model_of("fit:linear", "vector", "continuous")
    assert str(error.value).startswith("--q fit:linear is over") and "use --q fit:mlp" in str(
        error.value
    )
    with pytest.raises(UsageError, match="use --model mlp"):
        check_q_model_fits("linear", "vector", "continuous")


# --- checks against the data and the policy ------------------------------------------------


def test_check_q_accepts_what_fits():
    rng = np.random.default_rng(9)
    softmax = checkpoint_policy("p.npz", random_checkpoint("linear_softmax", rng, obs_dim=3))
    gaussian = checkpoint_policy("g.npz", random_checkpoint("linear_gaussian", rng, obs_dim=3))
    qf.check_q(qf.q_checkpoint("q.npz", _linear_q(rng, 3, 4)), softmax, _schema())
    qf.check_q(qf.QFunction("fit", qf.FIT), softmax, _schema())
    qf.check_q(qf.QFunction("c", qf.COLUMNS), softmax, types.SimpleNamespace(columns={}))
    sa = qf.q_checkpoint("s.npz", _mlp("mlp_q_sa", rng, (5, 1), "tanh"))
    qf.check_q(sa, gaussian, _schema("continuous"))
    tabular = qf.q_checkpoint("t.npz", {"kind": "tabular_q", "q": np.zeros((10, 4))})
    table_policy = checkpoint_policy("t.npz", random_checkpoint("tabular", rng, n_actions=4))
    qf.check_q(tabular, table_policy, _schema(observation_kind="index", obs_dim=None))


def _entry_point_policy(n_actions: int | None) -> Policy:
    """An entry-point policy ``ep`` that declares ``n_actions`` (or not) and cannot sample."""
    return Policy("ep", "entry_point", None, (), None, n_actions=n_actions)


def test_check_q_refuses_what_does_not_fit():
    rng = np.random.default_rng(10)
    softmax = checkpoint_policy("p.npz", random_checkpoint("linear_softmax", rng, obs_dim=3))
    gaussian = checkpoint_policy("g.npz", random_checkpoint("linear_gaussian", rng, obs_dim=3))
    logged = Policy("logged", "logged", None, (), None)
    linear = qf.q_checkpoint("q.npz", _linear_q(rng, 3, 4))
    sa = qf.q_checkpoint("s.npz", _mlp("mlp_q_sa", rng, (5, 1), "tanh"))
    tabular = qf.q_checkpoint("t.npz", {"kind": "tabular_q", "q": np.zeros((10, 4))})
    no_observation = types.SimpleNamespace(columns={"action": "act"})
    cases = [
        (linear, softmax, no_observation, DataError, "no observation column was found"),
        (linear, logged, _schema(), UsageError, "V-hat needs the evaluation policy"),
        (qf.QFunction("fit:forest", qf.FIT), softmax, _schema(), UsageError, "unknown Q model"),
        (sa, softmax, _schema(), DataError, "actions in column 'act' are integers"),
        (linear, gaussian, _schema("continuous"), DataError, "'act' are continuous"),
        (tabular, softmax, _schema(), DataError, "'obs' holds vectors"),
        (linear, softmax, _schema(obs_dim=5), DataError, "size 3, but column 'obs' has size 5"),
        (
            qf.q_checkpoint("w.npz", _linear_q(rng, 3, 5)),
            softmax,
            _schema(),
            PolicyError,
            "has 5 action values, but policy p.npz has 4 actions",
        ),
        (
            qf.load_q_entry_point("test_qfunctions:doubled_q_values"),
            _entry_point_policy(None),
            _schema(),
            PolicyError,
            "neither it nor policy ep declares n_actions",
        ),
        (sa, _entry_point_policy(None), _schema("continuous"), PolicyError, "cannot sample"),
        (  # another state space: it was a data error, whose --on-invalid drop dropped 199/200
            qf.q_checkpoint("t3.npz", {"kind": "tabular_q", "q": np.zeros((3, 4))}),
            checkpoint_policy("t.npz", random_checkpoint("tabular", rng, n_actions=4)),
            _schema(observation_kind="index", obs_dim=None),
            PolicyError,
            "Q function t3.npz has 3 states, but policy t.npz has 10 states",
        ),
    ]
    for q, policy, schema, error, words in cases:
        with pytest.raises(error) as raised:
            qf.check_q(q, policy, schema)
        assert words in str(raised.value), (q.name, str(raised.value))
    # a Q of unknown width is fine when the policy declares its actions, and vice versa
    qf.check_q(qf.load_q_entry_point("test_qfunctions:doubled_q_values"), softmax, _schema())
    qf.check_q(linear, _entry_point_policy(None), _schema())


def test_chunk_checks_flag_rows_outside_the_q_function():
    rng = np.random.default_rng(11)
    chunk = types.SimpleNamespace(
        action=np.array([0, 3, 4, 1]), observation=np.array([0, 9, 2, 12])
    )
    tabular = qf.q_checkpoint("t.npz", {"kind": "tabular_q", "q": np.zeros((10, 4))})
    undeclared = _entry_point_policy(None)
    checks = {check.reason: check for check in qf.chunk_checks(tabular, undeclared, chunk)}
    assert set(checks) == {"action_out_of_range", "state_out_of_range"}
    np.testing.assert_array_equal(checks["action_out_of_range"].rows, [False, False, True, False])
    np.testing.assert_array_equal(checks["state_out_of_range"].rows, [False, False, False, True])
    assert "4 actions (0..3)" in checks["action_out_of_range"].message
    assert "10 states (0..9)" in checks["state_out_of_range"].message
    declared = checkpoint_policy("p.npz", random_checkpoint("tabular", rng, n_actions=4))
    reasons = [check.reason for check in qf.chunk_checks(tabular, declared, chunk)]
    assert reasons == ["state_out_of_range"]  # the policy's own checks bound the actions
    linear = qf.q_checkpoint("q.npz", _linear_q(rng, 3, 4))
    vectors = types.SimpleNamespace(action=chunk.action, observation=rng.normal(size=(4, 3)))
    reasons = [check.reason for check in qf.chunk_checks(linear, undeclared, vectors)]
    assert reasons == ["action_out_of_range"]


# --- in the kernel -------------------------------------------------------------------------


def test_q_spec_describes_the_kernels_static_part():
    rng = np.random.default_rng(12)
    softmax = checkpoint_policy("p.npz", random_checkpoint("linear_softmax", rng, obs_dim=3))
    gaussian = checkpoint_policy("g.npz", random_checkpoint("linear_gaussian", rng, obs_dim=3))
    columns = qf.q_spec(qf.QFunction("c", qf.COLUMNS), softmax, 16)
    assert columns == qf.QSpec(qf.COLUMNS, None, None, None, 0, 1)
    entry = qf.load_q_entry_point("test_qfunctions:doubled_q_values")
    assert qf.q_spec(entry, softmax, 16) == qf.QSpec("values", entry.q_values, 4, None, 0, 1)
    sa = qf.q_checkpoint("s.npz", _mlp("mlp_q_sa", rng, (5, 1), "tanh"))
    spec = qf.q_spec(sa, gaussian, 8)
    assert spec == qf.QSpec("sa", sa.q_sa, None, gaussian.sample, 8, 1)


@pytest.mark.parametrize("jit", [False, True])
def test_discrete_step_values_are_the_logged_q_and_the_policy_mean(jit):
    """Q-hat(s, a) and V-hat(s) = sum_a pi(a|s) Q-hat(s, a); an action of probability 0
    adds nothing, even where Q-hat is infinite."""
    rng = np.random.default_rng(13)
    checkpoint = random_checkpoint("linear_softmax", rng, obs_dim=3, n_actions=4)
    policy = checkpoint_policy("p.npz", checkpoint)
    q = qf.q_checkpoint("q.npz", _linear_q(rng, 3, 4))
    spec = qf.q_spec(q, policy, 0)

    def values(observation, action):
        key = jax.random.key(0)
        return qf.step_values(
            spec, policy.log_prob, policy.params, q.params, observation, action, key
        )

    step = jax.jit(values) if jit else values
    observation = rng.normal(size=3)
    q_sa, v = step(jnp.asarray(observation), 2)
    q_all = observation @ q.params["weight"] + q.params["bias"]
    pi = np.exp(action_log_probs(checkpoint, observation[None])[0])
    assert float(q_sa) == pytest.approx(q_all[2], rel=1e-12)
    assert float(v) == pytest.approx(pi @ q_all, rel=1e-12)
    # pi = (1, 0): the infinite Q-hat of the impossible action is left out
    table = {"logits": jnp.asarray([[0.0, -jnp.inf]])}
    infinite = {"q": jnp.asarray([[3.0, jnp.inf]])}
    tab_spec = qf.QSpec("values", qf.tabular_q_values, 2, None, 0, 1)
    _, v = qf.step_values(tab_spec, tabular_log_prob, table, infinite, 0, 0, jax.random.key(0))
    assert float(v) == 3.0


@pytest.mark.parametrize("jit", [False, True])
def test_continuous_v_is_the_mean_of_q_over_sampled_actions(jit):
    """With Q-hat linear in the action, V-hat is Q-hat at the policy's mean up to the draws'
    error; the draws are the policy's sampler's, keyed by ``key``."""
    rng = np.random.default_rng(14)
    checkpoint = random_checkpoint("linear_gaussian", rng, obs_dim=3, act_dim=2)
    policy = checkpoint_policy("g.npz", checkpoint)
    c, d = rng.normal(size=3), rng.normal(size=2)
    q = qf.q_checkpoint(
        "s.npz", {"kind": "mlp_q_sa", "weight_0": np.r_[c, d][:, None], "bias_0": np.ones(1)}
    )
    spec = qf.q_spec(q, policy, 4096)
    observation, action = rng.normal(size=3), rng.normal(size=2)

    def values(key):
        return qf.step_values(
            spec, policy.log_prob, policy.params, q.params, observation, action, key
        )

    step = jax.jit(values) if jit else values
    q_sa, v = step(jax.random.key(1))
    assert float(q_sa) == pytest.approx(c @ observation + d @ action + 1.0, rel=1e-12)
    mean = observation @ checkpoint["weight"] + checkpoint["bias"]
    spread = np.sqrt(np.sum((d * np.exp(checkpoint["log_std"])) ** 2)) / np.sqrt(4096)
    assert abs(float(v) - (c @ observation + d @ mean + 1.0)) < 5 * spread
    assert float(step(jax.random.key(1))[1]) == float(v)  # the same key, the same draws
    assert float(step(jax.random.key(2))[1]) != float(v)


def _window(rng: np.random.Generator, lengths: list[int], width: int, obs_dim: int = 3):
    """A padded window: [B, C] masks, observations, actions, critic columns and id keys."""
    b = len(lengths) + 1  # one padded episode row
    step_mask = np.arange(width)[None, :] < np.array([*lengths, 0])[:, None]
    return types.SimpleNamespace(
        step_mask=step_mask,
        episode_mask=np.arange(b) < len(lengths),
        steps=Steps(
            observation=rng.normal(size=(b, width, obs_dim)),
            action=rng.integers(0, 4, size=(b, width)),
            reward=np.zeros((b, width)),
            log_behavior=None,
            log_target=None,
            q_value=rng.normal(size=(b, width)),
            v_value=rng.normal(size=(b, width)),
        ),
        key_hi=rng.integers(0, 1 << 32, size=b, dtype=np.uint32),
        key_lo=rng.integers(0, 1 << 32, size=b, dtype=np.uint32),
    )


def _fields(spec, policy, q_params, window, jit: bool) -> dict[str, np.ndarray]:
    def fields(q_params, steps, step_mask, episode_mask, key_hi, key_lo):
        batch = types.SimpleNamespace(
            steps=steps,
            step_mask=step_mask,
            episode_mask=episode_mask,
            key_hi=key_hi,
            key_lo=key_lo,
        )
        return qf.episode_q_fields(spec, policy.log_prob, policy.params, q_params, batch, 0)

    run = jax.jit(fields) if jit else fields
    arrays = (window.steps, window.step_mask, window.episode_mask, window.key_hi, window.key_lo)
    return {k: np.asarray(v) for k, v in run(q_params, *arrays).items()}


@pytest.mark.parametrize("jit", [False, True])
def test_episode_fields_score_real_steps_and_zero_the_padding(jit):
    rng = np.random.default_rng(15)
    checkpoint = random_checkpoint("linear_softmax", rng, obs_dim=3, n_actions=4)
    policy = checkpoint_policy("p.npz", checkpoint)
    window = _window(rng, [3, 5, 1], width=5)
    real = window.step_mask & window.episode_mask[:, None]
    columns = _fields(
        qf.q_spec(qf.QFunction("c", qf.COLUMNS), policy, 0), policy, None, window, jit
    )
    np.testing.assert_array_equal(columns["q_t"], np.where(real, window.steps.q_value, 0.0))
    np.testing.assert_array_equal(columns["v_t"], np.where(real, window.steps.v_value, 0.0))
    q = qf.q_checkpoint("q.npz", _linear_q(rng, 3, 4))
    got = _fields(qf.q_spec(q, policy, 0), policy, q.params, window, jit)
    q_all = window.steps.observation @ q.params["weight"] + q.params["bias"]  # [B, C, A]
    logged = np.take_along_axis(q_all, window.steps.action[..., None], -1)[..., 0]
    pi = np.exp(action_log_probs(checkpoint, window.steps.observation.reshape(-1, 3)))
    v = np.sum(pi.reshape(q_all.shape) * q_all, -1)
    np.testing.assert_allclose(got["q_t"], np.where(real, logged, 0.0), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(got["v_t"], np.where(real, v, 0.0), rtol=1e-12, atol=1e-15)


def test_fields_from_the_kernels_action_probabilities_are_the_same():
    """The kernel hands over the probabilities of every action it already computed
    ([B, C, A]); V-hat from exp of the log-probabilities equals V-hat computed here, to
    the last bit."""
    from ope_cli.models.policies.functions import action_log_probs as all_actions

    rng = np.random.default_rng(18)
    policy = checkpoint_policy(
        "p.npz", random_checkpoint("linear_softmax", rng, obs_dim=3, n_actions=4)
    )
    window = _window(rng, [3, 5, 1], width=5)
    q = qf.q_checkpoint("q.npz", _linear_q(rng, 3, 4))
    spec = qf.q_spec(q, policy, 0)
    log_pi_all = jax.vmap(jax.vmap(lambda o: all_actions(policy.log_prob, policy.params, o, 4)))(
        window.steps.observation
    )
    batch = window
    given = qf.episode_q_fields(
        spec, policy.log_prob, policy.params, q.params, batch, 0, 0, jnp.exp(log_pi_all)
    )
    computed = _fields(spec, policy, q.params, window, jit=False)
    for name in ("q_t", "v_t"):
        np.testing.assert_array_equal(np.asarray(given[name]), computed[name])


def test_cross_fitted_q_uses_each_episodes_fold():
    """Params stacked over K folds: each episode is scored by the Q of its id's fold (jitted
    only: the eager path is the same code, checked above)."""
    jit = True
    rng = np.random.default_rng(16)
    policy = checkpoint_policy(
        "p.npz", random_checkpoint("linear_softmax", rng, obs_dim=3, n_actions=4)
    )
    window = _window(rng, [2, 4, 4, 1, 3, 2, 4], width=4)
    folds = [qf.q_checkpoint(f"{k}.npz", _linear_q(rng, 3, 4)) for k in range(3)]
    stacked = {key: np.stack([q.params[key] for q in folds]) for key in folds[0].params}
    q = qf.QFunction("fit", "linear_q", stacked, (), qf.linear_q_values, n_actions=4, folds=3)
    got = _fields(qf.q_spec(q, policy, 0), policy, stacked, window, jit)
    by_fold = [_fields(qf.q_spec(q, policy, 0), policy, q.params, window, jit) for q in folds]
    fold = fold_index(window.key_hi, window.key_lo, 3)
    assert len(set(fold[:-1].tolist())) > 1  # the window spans several folds
    for e, k in enumerate(fold):
        for name in ("q_t", "v_t"):
            np.testing.assert_allclose(got[name][e], by_fold[k][name][e], rtol=1e-12, atol=0)


def test_q_source_records_where_q_hat_comes_from():
    from ope_cli.results import QSource

    assert qf.q_source(qf.QFunction("'q' and 'v'", qf.COLUMNS)) == QSource("columns", "'q' and 'v'")
    linear = qf.q_checkpoint("q.npz", _linear_q(np.random.default_rng(17)))
    assert qf.q_source(linear) == QSource("checkpoint", "q.npz", "linear_q")
    entry = qf.load_q_entry_point("test_qfunctions:doubled_q_values")
    assert qf.q_source(entry) == QSource(
        "entry_point", "test_qfunctions:doubled_q_values", "entry_point"
    )
    summary = {"model": "linear", "kind": "linear_q", "folds": 2}
    fitted = qf.QFunction("fit", "linear_q", linear.params, fit=summary)
    assert qf.q_source(fitted) == QSource("fit", qf.FIT, "linear_q", summary)


@pytest.mark.parametrize(
    ("arrays", "observation", "action", "words"),
    [
        (
            {"kind": "linear_q", "weight": np.ones((5, 3)), "bias": np.zeros(3)},
            np.zeros((4, 4)),
            np.zeros(4, np.int64),
            "observation has size 4, but Q function q.npz expects 5",
        ),
        (
            {"kind": "linear_q", "weight": np.ones((3, 3)), "bias": np.zeros(3)},
            np.zeros(4, np.int64),  # integer states: one number each
            np.zeros(4, np.int64),
            "observation has size 1, but Q function q.npz expects 3",
        ),
        (
            {
                "kind": "mlp_q_sa",
                "weight_0": np.ones((7, 4)),
                "bias_0": np.zeros(4),
                "weight_1": np.ones((4, 1)),
                "bias_1": np.zeros(1),
            },
            np.zeros((4, 3)),
            np.zeros((4, 2)),
            "observation and action have sizes 3 + 2, but Q function q.npz takes 7 inputs",
        ),
    ],
)
def test_a_network_of_another_input_size_is_refused_on_every_row(
    arrays, observation, action, words
):
    """It was an internal error (a dot_general shape error in the kernel), where the same
    mismatch in a policy is a one-line data error."""
    q = qf.q_checkpoint("q.npz", arrays)
    chunk = types.SimpleNamespace(observation=observation, action=action, num_steps=4)
    policy = types.SimpleNamespace(n_actions=3)
    (check,) = [c for c in qf.chunk_checks(q, policy, chunk) if c.reason == "observation_size"]
    assert check.message == words and check.rows.all()


def test_a_q_checkpoint_with_arrays_it_does_not_read_is_refused():
    arrays = {"kind": "tabular_q", "q": np.zeros((3, 2)), "scale": np.float64(2.0)}
    with pytest.raises(PolicyError, match="a tabular_q checkpoint holds arrays it does not read"):
        qf.q_checkpoint("q.npz", arrays)


def test_a_float32_gamma_is_the_number_it_was_written_as():
    """float32's 0.95 is 0.949999988 in float64: read at its own precision it is 0.95, the
    run's gamma (it was refused with 'a Q for gamma 0.95, but this run discounts by gamma
    0.95'); a gamma that differs beyond that precision is still another one."""
    arrays = {"kind": "tabular_q", "q": np.zeros((3, 2))}
    for stored in (np.float32(0.95), np.float16(0.95), np.float64(0.95)):
        q = qf.q_checkpoint("q.npz", {**arrays, "gamma": stored})
        assert q.gamma == 0.95
        qf.check_q_gamma([q], 0.95, "--gamma")
    q = qf.q_checkpoint("q.npz", {**arrays, "gamma": np.float32(0.9501)})
    with pytest.raises(UsageError, match=r"is a Q for gamma 0.9501, but .* gamma 0.95 \("):
        qf.check_q_gamma([q], 0.95, "--gamma")


def test_check_q_gamma_refuses_only_a_q_fitted_for_another_discount():
    arrays = {"kind": "tabular_q", "q": np.zeros((3, 2))}
    unknown = qf.q_checkpoint("plain.npz", arrays)
    fitted = qf.q_checkpoint("q.npz", {**arrays, "gamma": np.float64(0.99)})
    qf.check_q_gamma(None, 1.0, "the default")
    qf.check_q_gamma([unknown, fitted], 0.99, "--gamma")
    with pytest.raises(UsageError) as error:
        qf.check_q_gamma([unknown, fitted], 1.0, "the default")
    assert str(error.value) == (
        "--q q.npz is a Q for gamma 0.99, but this run discounts by gamma 1 (the default): "
        "evaluate with --gamma 0.99, or refit it with --gamma 1 (or --q fit)"
    )


def test_check_q_policies_refuses_a_q_paired_with_another_policy():
    rng = np.random.default_rng(5)
    first = checkpoint_policy("a.npz", random_checkpoint("linear_softmax", rng))
    second = checkpoint_policy("b.npz", random_checkpoint("linear_softmax", rng))
    arrays = {"kind": "tabular_q", "q": np.zeros((3, 2))}

    def q_of(policy, name):
        return qf.q_checkpoint(name, {**arrays, "policy_fingerprint": policy.fingerprint()})

    unknown = qf.q_checkpoint("plain.npz", arrays)
    qf.check_q_policies(None, [first])
    qf.check_q_policies([q_of(first, "qa.npz"), unknown], [first, second])
    qf.check_q_policies([unknown], [logged_policy()])
    with pytest.raises(UsageError) as error:
        qf.check_q_policies([q_of(second, "qb.npz"), q_of(first, "qa.npz")], [first, second])
    assert str(error.value) == (
        "--q qb.npz is the Q of another policy than a.npz, the --policy it is paired with "
        "(it is b.npz's): give --q once per --policy, in the same order"
    )
    with pytest.raises(UsageError) as error:
        qf.check_q_policies([q_of(second, "qb.npz")], [first])
    assert str(error.value) == (
        "--q qb.npz is the Q of another policy than a.npz, the --policy it is paired with "
        "(another checkpoint's): give this policy's own Q, or --q fit"
    )


def test_a_policy_fingerprint_is_its_arrays_not_its_file(tmp_path):
    """Saved twice (np.savez records the time), the same arrays have one fingerprint;
    another value another (a float32 copy, its values rounded); without params, none."""
    rng = np.random.default_rng(6)
    arrays = random_checkpoint("linear_softmax", rng)
    for name in ("one.npz", "two.npz"):
        np.savez(tmp_path / name, **arrays)
    one, two = (load_checkpoint(str(tmp_path / n)) for n in ("one.npz", "two.npz"))
    assert one.fingerprint() == two.fingerprint() and len(one.fingerprint()) == 64
    changed = {**arrays, "bias": arrays["bias"] + 1e-12}
    assert checkpoint_policy("c", changed).fingerprint() != one.fingerprint()
    as_float32 = {**arrays, "weight": arrays["weight"].astype(np.float32)}
    assert checkpoint_policy("d", as_float32).fingerprint() != one.fingerprint()
    assert logged_policy().fingerprint() is None
