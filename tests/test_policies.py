"""Policies (ope_cli/models/policies/): every checkpoint kind against the NumPy formula of
tests/reference.py, load errors, and the action range an entry point declares."""

from __future__ import annotations

import sys
import types
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from datasets import random_checkpoint, save_checkpoint
from reference import reference_log_prob

from ope_cli.errors import PolicyError
from ope_cli.models.policies import (
    chunk_checks,
    load_checkpoint,
    load_entry_point,
    load_policies,
    logged_policy,
)


def policy_log_probs(policy, observation, action) -> np.ndarray:
    """[T] the policy's per-step log_prob vmapped over steps, as the kernel does."""
    params = None if policy.params is None else jax.tree.map(jnp.asarray, policy.params)
    per_step = jax.vmap(policy.log_prob, in_axes=(None, 0, 0))
    return np.asarray(per_step(params, jnp.asarray(observation), jnp.asarray(action)))


CASES = {
    "tabular": dict(n_states=7, n_actions=3),
    "linear_softmax": dict(obs_dim=3, n_actions=5, temperature=0.7),
    "mlp_softmax": dict(obs_dim=3, n_actions=4, hidden=(6, 5), activation="relu"),
    "linear_gaussian": dict(obs_dim=3, act_dim=2),
}


@pytest.mark.parametrize("kind", list(CASES))
def test_each_checkpoint_kind_matches_the_numpy_formula(kind, tmp_path):
    rng = np.random.default_rng(1)
    ckpt = random_checkpoint(kind, rng, **CASES[kind])
    policy = load_checkpoint(str(save_checkpoint(tmp_path / f"{kind}.npz", ckpt)))
    assert policy.kind == kind and policy.actions_checked
    if kind == "tabular":
        observation, action = rng.integers(0, 7, size=11), rng.integers(0, 3, size=11)
    else:
        observation = rng.normal(size=(11, 3))
        action = rng.normal(size=(11, 2)) if kind == "linear_gaussian" else rng.integers(0, 4, 11)
    np.testing.assert_allclose(
        policy_log_probs(policy, observation, action),
        reference_log_prob(ckpt, observation, action),
        rtol=1e-12,
        atol=1e-12,
    )
    assert policy.discrete is (kind != "linear_gaussian")


@pytest.mark.parametrize("kind", ["tabular", "linear_softmax", "mlp_softmax"])
def test_softmax_checkpoints_share_their_logits(kind, tmp_path):
    """A softmax checkpoint's logits give (``softmax_all``) its log_prob of every action bit
    for bit, and probabilities that are exp of those within rounding: V-hat takes them
    rather than A more exponentials a step."""
    from ope_cli.models.policies.functions import softmax_all

    rng = np.random.default_rng(2)
    ckpt = random_checkpoint(kind, rng, **CASES[kind])
    policy = load_checkpoint(str(save_checkpoint(tmp_path / f"{kind}.npz", ckpt)))
    count = CASES[kind]["n_actions"]
    observation = rng.integers(0, 7, size=9) if kind == "tabular" else rng.normal(size=(9, 3))
    params = jax.tree.map(jnp.asarray, policy.params)
    log_p, p = jax.vmap(lambda o: softmax_all(policy.logits(params, o)))(jnp.asarray(observation))
    for action in range(count):
        actions = jnp.full(9, action)
        np.testing.assert_array_equal(
            log_p[:, action], policy_log_probs(policy, observation, actions)
        )
    np.testing.assert_allclose(p, np.exp(np.asarray(log_p)), rtol=1e-15, atol=0)
    np.testing.assert_allclose(np.sum(p, axis=1), 1.0, rtol=1e-15)


@pytest.mark.parametrize("count", [3, 40])  # action by action, and as one array
def test_softmax_all_of_impossible_and_huge_logits(count):
    """An action of logit -inf has probability 0 and log-probability -inf; logits near the
    float limit are max-shifted, not exponentiated raw."""
    from ope_cli.models.policies.functions import log_softmax_at, softmax_all

    logits = np.random.default_rng(3).normal(size=count) + 700.0
    logits[1] = -np.inf
    log_p, p = softmax_all(jnp.asarray(logits))
    assert float(p[1]) == 0.0 and float(log_p[1]) == -np.inf
    expected = np.exp(logits - logits.max()) / np.sum(np.exp(logits - logits.max()))
    np.testing.assert_allclose(p, expected, rtol=1e-14)
    chosen = [float(log_softmax_at(jnp.asarray(logits), a)) for a in range(count)]
    np.testing.assert_array_equal(log_p, chosen)


def test_mlp_default_activation_is_tanh(tmp_path):
    rng = np.random.default_rng(2)
    ckpt = random_checkpoint("mlp_softmax", rng, obs_dim=2, n_actions=3)
    policy = load_checkpoint(str(save_checkpoint(tmp_path / "m.npz", ckpt)))
    observation, action = rng.normal(size=(5, 2)), rng.integers(0, 3, size=5)
    np.testing.assert_allclose(
        policy_log_probs(policy, observation, action),
        reference_log_prob(ckpt, observation, action),
        rtol=1e-12,
    )


def test_same_kind_and_shapes_stack(tmp_path):
    rng = np.random.default_rng(3)
    paths = [
        str(save_checkpoint(tmp_path / f"p{i}.npz", random_checkpoint("tabular", rng)))
        for i in range(3)
    ]
    other = str(save_checkpoint(tmp_path / "q.npz", random_checkpoint("tabular", rng, n_actions=2)))
    keys = [p.stack_key for p in load_policies([*paths, other])]
    assert keys[0] == keys[1] == keys[2] != keys[3]
    assert [p.name for p in load_policies([str(tmp_path / "p*.npz")])] == paths


@pytest.mark.parametrize(
    "content, message",
    [
        ({"kind": "tabular"}, "has no array 'logits'"),
        ({"kind": "tabular", "logits": np.zeros(3)}, "expected 2 dimension"),
        ({"kind": "tabular", "logits": np.array([[0.0, np.nan]])}, "NaN or infinite"),
        ({"kind": "nonsense", "logits": np.zeros((2, 2))}, "nonsense"),
        (
            {"kind": "linear_softmax", "weight": np.zeros((3, 2)), "bias": np.zeros(4)},
            "'bias' has size 4",
        ),
        # arrays a kind does not read were ignored: the file's policy was not the one evaluated
        (
            {
                "kind": "linear_softmax",
                "weight": np.zeros((3, 2)),
                "bias": np.zeros(2),
                "temprature": np.float64(0.1),
            },
            "a linear_softmax checkpoint holds arrays it does not read: temprature",
        ),
        (
            {
                "kind": "mlp_softmax",
                "weight_0": np.zeros((3, 2)),
                "bias_0": np.zeros(2),
                "temperature": np.float64(0.1),
            },
            "a mlp_softmax checkpoint holds arrays it does not read: temperature",
        ),
        # an activation was exempt for every kind: relu beside a linear policy went unread
        (
            {
                "kind": "linear_softmax",
                "weight": np.zeros((3, 2)),
                "bias": np.zeros(2),
                "activation": np.array("relu"),
            },
            "a linear_softmax checkpoint holds arrays it does not read: activation",
        ),
        (
            {"kind": "tabular", "logits": np.zeros((2, 2)), "activation": np.array("tanh")},
            "a tabular checkpoint holds arrays it does not read: activation",
        ),
    ],
)
def test_checkpoint_load_errors(content, message, tmp_path):
    path = tmp_path / "bad.npz"
    np.savez(path, **content)
    with pytest.raises(PolicyError, match=message):
        load_checkpoint(str(path))


def test_not_a_zip_and_missing_glob(tmp_path):
    path = tmp_path / "text.npz"
    path.write_text("hello")
    with pytest.raises(PolicyError, match="not a zip archive"):
        load_checkpoint(str(path))
    with pytest.raises(PolicyError, match="no checkpoint matches"):
        load_policies([str(tmp_path / "none*.npz")])


@pytest.fixture
def entry_module():
    """A module ``ope_test_policies`` with entry points that do and do not declare n_actions."""
    module = types.ModuleType("ope_test_policies")

    def uniform(observation, action):
        return jnp.log(jnp.asarray(1.0 / 3.0))

    def declared(observation, action):
        return jnp.log(jnp.asarray(1.0 / 3.0))

    declared.n_actions = 3

    class WithMethod:
        n_actions = 2

        def prob(self, observation, action):
            return jnp.asarray(0.5)

    def broken(observation, action):
        return 0.0

    broken.n_actions = 0
    module.uniform, module.declared, module.with_method, module.broken = (
        uniform,
        declared,
        WithMethod(),
        broken,
    )
    sys.modules[module.__name__] = module
    yield module.__name__
    del sys.modules[module.__name__]


class Chunk:
    """The fields chunk_checks reads of an episodes chunk."""

    def __init__(self, action):
        self.action = np.asarray(action)
        self.observation = None
        self.num_steps = self.action.shape[0]


def test_entry_point_declaring_n_actions_has_its_actions_checked(entry_module):
    policy = load_entry_point(f"{entry_module}:declared")
    assert policy.n_actions == 3 and policy.discrete and policy.actions_checked
    (check,) = list(chunk_checks(policy, Chunk([0, 2, 3, 1, 5])))
    reason, message, bad = check.reason, check.message, check.rows
    assert reason == "action_out_of_range" and "3 actions" in message
    np.testing.assert_array_equal(bad, [False, False, True, False, True])
    method = load_entry_point(f"{entry_module}:with_method")
    assert method.n_actions == 2 and method.actions_checked
    np.testing.assert_allclose(policy_log_probs(method, np.zeros(2), np.zeros(2, int)), np.log(0.5))


def test_entry_point_without_n_actions_is_marked_unchecked(entry_module):
    policy = load_entry_point(f"{entry_module}:uniform")
    assert policy.n_actions is None and policy.discrete is None
    assert not policy.actions_checked
    assert list(chunk_checks(policy, Chunk([0, 7]))) == []
    assert logged_policy().actions_checked


def test_entry_point_with_a_bad_n_actions(entry_module):
    with pytest.raises(PolicyError, match="n_actions must be a positive integer"):
        load_entry_point(f"{entry_module}:broken")


def test_entry_point_load_errors(entry_module):
    with pytest.raises(PolicyError, match="expected an .npz checkpoint or an entry point"):
        load_entry_point("no_colon_here")
    with pytest.raises(PolicyError, match="cannot import module"):
        load_entry_point("surely_not_a_module_xyz:f")
    with pytest.raises(PolicyError, match="has no attribute"):
        load_entry_point(f"{entry_module}:missing")


def test_evaluate_says_which_policies_had_their_actions_checked(entry_module):
    from ope_cli.config import EvaluationConfig
    from ope_cli.estimation.pipeline import evaluate

    examples = Path(__file__).resolve().parent.parent / "examples"
    result = evaluate(
        EvaluationConfig(
            data=str(examples / "data" / "logs.parquet"),
            policies=(f"{entry_module}:uniform", str(examples / "policies" / "ckpt.npz")),
        )
    )
    assert [p.actions_checked for p in result.results] == [False, True]


def test_a_behavior_entry_point_without_n_actions_is_warned_of(entry_module, monkeypatch):
    """Its log pi_b of a logged action past its range is its last action's, as an
    evaluation entry point's is: that one was warned of, the --behavior one was not (a
    logged action 7 of a 3-action policy gave is 3.735, nothing said)."""
    from ope_cli.config import BehaviorConfig, EvaluationConfig
    from ope_cli.estimation.pipeline import evaluate
    from ope_cli.report.json_format import to_json_dict
    from ope_cli.report.warnings import run_warnings

    def quarter(observation, action):  # the examples' 4 actions, uniformly
        return jnp.log(jnp.asarray(0.25))

    def declared_quarter(observation, action):
        return jnp.log(jnp.asarray(0.25))

    declared_quarter.n_actions = 4
    monkeypatch.setattr(sys.modules[entry_module], "quarter", quarter, raising=False)
    monkeypatch.setattr(sys.modules[entry_module], "declared", declared_quarter)
    examples = Path(__file__).resolve().parent.parent / "examples"
    codes = {}
    for name in ("quarter", "declared"):
        result = evaluate(
            EvaluationConfig(
                data=str(examples / "data" / "logs.parquet"),
                policies=(str(examples / "policies" / "ckpt.npz"),),
                behavior=BehaviorConfig(f"{entry_module}:{name}"),
            )
        )
        codes[name] = [(w.code, w.policy) for w in run_warnings(result)]
        document = to_json_dict(result)
        in_json = [w for w in document["warnings"] if w["code"] == "actions_unchecked"]
        assert len(in_json) == (name == "quarter")
    assert ("actions_unchecked", None) in codes["quarter"]
    assert "actions_unchecked" not in [code for code, _ in codes["declared"]]


@pytest.mark.parametrize("probability", [0.2, 0.3])
def test_an_entry_point_whose_probabilities_do_not_sum_to_one_is_refused(entry_module, probability):
    """An entry point that declares its 4 actions but gives each a log-probability below 0
    that is not normalised (a log_softmax over some actions, unnormalised logits): every
    value passed the kernel's check, and IS moved by (4 p)^T without a word. Its
    probabilities are summed over the declared actions at each chunk's first steps: one
    line, exit 4. Normalised (p = 1/4), it is evaluated."""
    from ope_cli.config import EvaluationConfig
    from ope_cli.estimation.pipeline import evaluate

    def constant(value):
        def log_prob(observation, action):
            return jnp.log(jnp.asarray(value))

        log_prob.n_actions = 4
        return log_prob

    module = sys.modules[entry_module]
    module.unnormalised, module.normalised = constant(probability), constant(0.25)
    data = str(Path(__file__).resolve().parent.parent / "examples" / "data" / "logs.parquet")
    with pytest.raises(PolicyError, match=rf"4 actions sum to {4 * probability:g} at ep") as error:
        evaluate(EvaluationConfig(data=data, policies=(f"{entry_module}:unnormalised",)))
    assert error.value.exit_code == 4 and "\n" not in str(error.value)
    (result,) = evaluate(
        EvaluationConfig(data=data, policies=(f"{entry_module}:normalised",))
    ).results
    assert np.isfinite(result.estimates["is"].value)


def test_an_unnormalised_behavior_entry_point_is_named_as_the_behavior_policy(entry_module):
    """The sum check of a --behavior entry point said "policy mod:fn's probabilities ...":
    read as one of the --policy values. It is said to be --behavior's, exit 4."""
    from ope_cli.config import BehaviorConfig, EvaluationConfig
    from ope_cli.estimation.pipeline import evaluate

    def log_prob(observation, action):
        return jnp.log(jnp.asarray(0.2))

    log_prob.n_actions = 4
    sys.modules[entry_module].unnormalised_behavior = log_prob
    data = str(Path(__file__).resolve().parent.parent / "examples" / "data" / "logs.parquet")
    checkpoint = str(Path(data).parent.parent / "policies" / "ckpt.npz")
    behavior = BehaviorConfig(policy=f"{entry_module}:unnormalised_behavior")
    config = EvaluationConfig(data=data, policies=(checkpoint,), behavior=behavior)
    refused = rf"^--behavior {entry_module}:unnormalised_behavior's .*4 actions sum to 0.8 at"
    with pytest.raises(PolicyError, match=refused) as error:
        evaluate(config)
    assert error.value.exit_code == 4 and "\n" not in str(error.value)


def test_the_probability_sums_probe_every_state_and_spread_over_the_chunk():
    """A policy unnormalised in a few states only (3% of the steps, none among a chunk's
    first 16, which were all that was summed) moved dr 2.420 to 1.996 without a word: the
    sums now probe the first step of each integer state, or steps spread over the chunk."""
    from ope_cli.models.policies.base import Policy
    from ope_cli.models.policies.checks import (
        PROBE_CALLS,
        PROBED_STEPS,
        check_probability_sums,
        probability_sum_off,
    )

    def log_prob(params, observation, action):  # 3 actions; in states 7 and up they sum to 0.6
        return jnp.log(jnp.where(observation >= 7, 0.2, 1.0 / 3.0))

    policy = Policy("rare", "entry_point", None, (), log_prob, n_actions=3)
    states = np.zeros(2_000, np.int64)
    states[1_500] = 8  # one step of a rare state, far past the first 16
    chunk = types.SimpleNamespace(observation=states, action=np.zeros(2_000, np.int64))
    assert probability_sum_off(policy, chunk, 3) == (1_500, pytest.approx(0.6))
    vectors = np.zeros((2_000, 2))
    vectors[1_000:1_100, 0] = 8.0  # 5% of the steps, in the middle of the chunk

    def on_vectors(params, observation, action):
        return log_prob(params, observation[0], action)

    spread = Policy("rare", "entry_point", None, (), on_vectors, n_actions=3)
    chunk = types.SimpleNamespace(observation=vectors, action=np.zeros(2_000, np.int64))
    row, total = probability_sum_off(spread, chunk, 3)
    assert 1_000 <= row < 1_100 and total == pytest.approx(0.6)
    assert PROBE_CALLS * PROBED_STEPS < 2_000  # a sample: the rare rows are found by spread

    def nan_in_state_8(params, observation, action):  # the kernel names the file and step
        return jnp.where(observation == 8, jnp.nan, jnp.log(1.0 / 3.0))

    faulty = Policy("nan", "entry_point", None, (), nan_in_state_8, n_actions=3)
    chunk = types.SimpleNamespace(
        observation=states,
        action=np.zeros(2_000, np.int64),
        file="f.parquet",
        locate=lambda row: (row // 100, row % 100),
    )
    assert probability_sum_off(faulty, chunk, 3)[0] == 1_500
    # a fault of the policy's code, at its place; not "sums to nan ... normalised" (inspect
    # runs no kernel to say it)
    with pytest.raises(
        PolicyError,
        match=r"^f.parquet: episode 15, step 0: policy nan's probabilities over its 3 actions "
        r"are not finite \(they sum to nan\)",
    ):
        check_probability_sums(faulty, chunk, 3, "its 3 actions", "")
    states[7] = -1  # invalid data, which --on-invalid drop leaves out: no probe
    negative = Policy(
        "neg",
        "entry_point",
        None,
        (),
        lambda p, o, a: jnp.where(o < 0, -9.0, jnp.log(1.0 / 3.0)),
        n_actions=3,
    )
    assert probability_sum_off(negative, chunk, 3) is None


def test_the_probability_sums_of_a_complex_log_prob_warn_nothing():
    """Cast to float64, a complex64 result put NumPy's ComplexWarning on stderr ahead of the
    one error line (the kernel names the dtype)."""
    import warnings

    from ope_cli.models.policies.base import Policy
    from ope_cli.models.policies.checks import probability_sum_off

    def log_prob(params, observation, action):
        return jnp.complex64(jnp.log(1.0 / 3.0)) + 0 * action

    policy = Policy("complex", "entry_point", None, (), log_prob, n_actions=3)
    chunk = types.SimpleNamespace(observation=np.zeros((20, 2)), action=np.zeros(20, np.int64))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert probability_sum_off(policy, chunk, 3) is None
    assert [str(w.message) for w in caught] == []


def test_the_probability_sums_skip_invalid_observations(entry_module, tmp_path):
    """A NaN observation in the first steps made the sum NaN, and the entry point was
    refused (exit 4) where --on-invalid drop left the episode out before the check came."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ope_cli.config import EvaluationConfig
    from ope_cli.estimation.pipeline import evaluate

    def log_prob(observation, action):
        return jnp.log(jnp.asarray(0.25)) + 0.0 * observation[0]

    log_prob.n_actions = 4
    sys.modules[entry_module].quarter = log_prob
    table = pq.read_table(Path(__file__).resolve().parent.parent / "examples/data/logs.parquet")
    observations = table.column("observation").to_pylist()
    observations[1] = [float("nan")] * len(observations[1])  # episode 0, step 1
    column = table.schema.get_field_index("observation")
    data = tmp_path / "nan.parquet"
    pq.write_table(table.set_column(column, "observation", pa.array(observations)), data)
    config = EvaluationConfig(
        data=str(data), policies=(f"{entry_module}:quarter",), on_invalid="drop"
    )
    result = evaluate(config)
    assert result.dataset.episodes_dropped == 1
    assert np.isfinite(result.results[0].estimates["is"].value)


@pytest.mark.parametrize("actions", [1, 4, 16, 17, 40])
def test_log_softmax_at_equals_log_softmax_of_the_action(actions):
    """Action by action (few actions) or as one reduction (many): log softmax(logits)[a]
    within rounding, vmapped over steps, with huge, tiny and -inf logits."""
    from ope_cli.models.policies.functions import log_softmax_at

    rng = np.random.default_rng(actions)
    logits = rng.normal(scale=30.0, size=(64, actions))
    logits[:8] += 700.0
    if actions > 1:
        logits[8:16, 0] = -np.inf
    action = rng.integers(0, actions, 64)
    action[8:16] = actions - 1  # not the -inf entry
    got = jax.jit(jax.vmap(log_softmax_at))(jnp.asarray(logits), jnp.asarray(action))
    want = jax.nn.log_softmax(jnp.asarray(logits), axis=-1)[np.arange(64), action]
    np.testing.assert_allclose(np.asarray(got), np.asarray(want), rtol=1e-13, atol=1e-12)


def test_string_arrays_saved_as_bytes_read_as_text(tmp_path):
    """np.array(b"relu") was read as "b'relu'" and refused as an unknown activation (and a
    kind saved so as an unknown kind, naming the valid one)."""
    path = tmp_path / "bytes.npz"
    np.savez(
        path,
        kind=np.array(b"mlp_softmax"),
        activation=np.array(b"relu"),
        weight_0=np.zeros((3, 2)),
        bias_0=np.zeros(2),
    )
    policy = load_checkpoint(str(path))
    assert (policy.kind, policy.static) == ("mlp_softmax", ("relu",))


def test_an_option_of_one_policy_takes_a_glob_of_one(tmp_path):
    """--behavior 'beh/*.npz' matching one file said 'no such checkpoint file'; matching
    two is the option's misuse (exit 2), as giving it twice is (it was exit 4)."""
    from ope_cli.errors import UsageError
    from ope_cli.models.policies import load_one_policy

    checkpoint = {"kind": "tabular", "logits": np.zeros((2, 2))}
    np.savez(tmp_path / "a.npz", **checkpoint)
    assert load_one_policy(str(tmp_path / "*.npz"), "--behavior").name == str(tmp_path / "a.npz")
    np.savez(tmp_path / "b.npz", **checkpoint)
    with pytest.raises(UsageError, match=r"matches 2 checkpoints, and --behavior takes one"):
        load_one_policy(str(tmp_path / "*.npz"), "--behavior")
    with pytest.raises(PolicyError, match=r"no checkpoint matches this pattern"):
        load_one_policy(str(tmp_path / "none*.npz"), "--behavior")


def test_a_tabular_policy_on_float_states_says_they_are_floats():
    """It said "holds scalar values", which did not say that floats are the problem."""
    from ope_cli.errors import DataError
    from ope_cli.models.policies import checkpoint_policy
    from ope_cli.models.policies.checks import check_against_schema

    policy = checkpoint_policy("t.npz", {"kind": "tabular", "logits": np.zeros((3, 2))})
    schema = types.SimpleNamespace(
        action_kind="discrete",
        observation_kind="scalar",
        observation_dim=None,
        columns={"observation": "state", "action": "action"},
        source=None,
    )
    with pytest.raises(DataError, match="column 'state' holds floating-point numbers"):
        check_against_schema(policy, schema)


def test_a_size_the_column_type_fixes_is_refused_naming_the_data():
    """Observations whose type fixes their size (a fixed-size list, as HDF5 and Minari
    give them) are checked before any row is read; the message named no data, where a
    value-level check names the file, episode and step."""
    import pyarrow as pa

    from ope_cli.config import ColumnMapping
    from ope_cli.data.columns import resolve_schema
    from ope_cli.errors import DataError
    from ope_cli.models.policies import checkpoint_policy
    from ope_cli.models.policies.checks import check_against_schema

    policy = checkpoint_policy(
        "lin5.npz", {"kind": "linear_softmax", "weight": np.zeros((5, 2)), "bias": np.zeros(2)}
    )
    arrow = pa.schema(
        [
            ("episode_id", pa.int64()),
            ("observation", pa.list_(pa.float32(), 4)),
            ("action", pa.int64()),
            ("reward", pa.float64()),
            ("behavior_prob", pa.float64()),
        ]
    )
    schema = resolve_schema(arrow, ColumnMapping(), logged_target=False, source="logs.hdf5")
    with pytest.raises(DataError) as error:
        check_against_schema(policy, schema)
    assert str(error.value) == (
        "logs.hdf5: observations in column 'observation' have size 4 (every step: the "
        "column's type fixes it), but policy lin5.npz expects 5"
    )


def test_every_action_of_many_is_scored_without_an_action_by_action_square():
    """V-hat scores every action (``action_log_probs``): with more than UNROLLED_ACTIONS
    actions each one's log-probability was a one-hot sum, so the vmap over actions made
    an [A, A] array per step (1,000 actions and a Q source asked for 66 GB, an internal
    error). Each is an index now, with the same values."""
    from ope_cli.models.policies.functions import action_log_probs, tabular_log_prob

    count = 1000
    logits = np.random.default_rng(0).normal(size=(3, count))
    params = {"logits": jnp.asarray(logits)}

    def every_action(observation):
        return action_log_probs(tabular_log_prob, params, observation, count)

    shapes = {
        tuple(v.aval.shape)
        for equation in jax.make_jaxpr(every_action)(1).eqns
        for v in equation.outvars
    }
    assert (count, count) not in shapes, shapes
    expected = logits[1] - np.log(np.sum(np.exp(logits[1] - logits[1].max()))) - logits[1].max()
    np.testing.assert_allclose(np.asarray(every_action(1)), expected, rtol=1e-12)


@pytest.mark.parametrize("returned", ["observation.sum() > 0", "jnp.int32(-1)", "-1.0 + 0j"])
def test_a_log_prob_of_no_real_float_dtype_is_refused(tmp_path, monkeypatch, returned):
    """A bool, integer or complex log_prob was cast without a word (a bool's IS came out
    -7471 against -2.34, an integer's rounded, a complex one's imaginary part dropped)."""
    from ope_cli.config import EvaluationConfig
    from ope_cli.estimation.pipeline import evaluate

    module = f"ope_test_dtype_{abs(hash(returned))}"
    (tmp_path / f"{module}.py").write_text(
        f"import jax.numpy as jnp\n\n\ndef log_prob(observation, action):\n    return {returned}\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    data = Path(__file__).resolve().parent.parent / "examples" / "data" / "logs.parquet"
    config = EvaluationConfig(data=str(data), policies=(f"{module}:log_prob",), gamma=0.9)
    with pytest.raises(PolicyError, match="must return a real floating-point log-probability"):
        evaluate(config)
