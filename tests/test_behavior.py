"""``--behavior CKPT|package.module:name``: the kernel computes log pi_b(a|s) in place of the
logged propensity column (evaluations through the Python API); the source is reported (the
table footer through the command line); bad behavior inputs raise a one-line error."""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from behavior_logs import assert_same_estimates, drop_propensities
from conftest import run_ope, xla_flags
from datasets import random_checkpoint, random_episodes, save_checkpoint, write_step_layout
from rendered import shown

import ope_cli
import ope_cli.envs.generate as gen
from ope_cli.api import evaluation_config
from ope_cli.errors import DataError, PolicyError, UsageError
from ope_cli.estimation import pipeline
from ope_cli.estimation.inputs import open_inputs
from ope_cli.estimation.run_plan import check_config
from ope_cli.models.behavior import (
    BehaviorSource,
    ZeroProbabilitySteps,
    check_behavior_option,
    first_zero_probability,
)


@pytest.fixture(scope="module")
def generated(tmp_path_factory) -> dict[str, Path]:
    """chain (tabular), bandit (linear_softmax) and gaussian (linear_gaussian) logs, each
    with its true behavior.npz, and a copy without the propensity column (nob.parquet)."""
    root = tmp_path_factory.mktemp("behavior")
    out = {}
    for env in ("chain", "bandit", "gaussian"):
        gen.generate(env, root / env, episodes=300, seed=4)
        drop_propensities(root / env / "logs.parquet", root / env / "nob.parquet")
        out[env] = root / env
    return out


@pytest.fixture(scope="module")
def mlp_data(tmp_path_factory) -> Path:
    """Random episodes drawn from an mlp_softmax behavior policy, with and without the
    propensity column, the behavior checkpoint and an evaluation checkpoint."""
    root = tmp_path_factory.mktemp("mlp")
    rng = np.random.default_rng(7)
    behavior = random_checkpoint("mlp_softmax", rng, activation="relu")
    episodes = random_episodes(rng, 200, behavior=behavior, length_dist="fixed")
    write_step_layout(episodes, root / "logs.parquet")
    drop_propensities(root / "logs.parquet", root / "nob.parquet")
    save_checkpoint(root / "behavior.npz", behavior)
    save_checkpoint(root / "eval.npz", random_checkpoint("mlp_softmax", rng))
    (root / "mlp_behavior.py").write_text(
        textwrap.dedent(
            """
            import jax
            import numpy as np

            _params = dict(np.load("behavior.npz"))

            def log_prob(observation, action):
                hidden = jax.nn.relu(observation @ _params["weight_0"] + _params["bias_0"])
                logits = hidden @ _params["weight_1"] + _params["bias_1"]
                return jax.nn.log_softmax(logits)[action]

            log_prob.n_actions = 4
            """
        )
    )
    return root


def _evaluate(data, *policies, **options) -> dict:
    """The ``--format json`` document of ``ope evaluate DATA -p POLICY ...`` with ``options``
    (the Python API: the pipeline without the command line)."""
    return ope_cli.evaluate(str(data), policies=[str(p) for p in policies], **options).to_dict()


@contextlib.contextmanager
def _working_directory(path: Path):
    """``path`` as the working directory (entry points import from it), and the import path
    restored after."""
    cwd, import_path = os.getcwd(), list(sys.path)
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(cwd)
        sys.path[:] = import_path


@pytest.mark.parametrize(
    ("env", "kind"),
    [("chain", "tabular"), ("bandit", "linear_softmax"), ("gaussian", "linear_gaussian")],
)
def test_true_behavior_checkpoint_reproduces_logged_propensities(generated, env, kind):
    out = generated[env]
    policies = [out / "policies" / "eval_0.npz", out / "policies" / "eval_1.npz"]
    logged = _evaluate(out / "logs.parquet", *policies)
    computed = _evaluate(out / "nob.parquet", *policies, behavior=str(out / "behavior.npz"))
    assert_same_estimates(logged, computed)
    assert logged["dataset"]["behavior"] == {
        "source": "column",
        "name": "behavior_prob",
        "kind": None,
    }
    assert computed["dataset"]["behavior"] == {
        "source": "checkpoint",
        "name": str(out / "behavior.npz"),
        "kind": kind,
    }
    # an advance kernel per window shape, and one finish kernel
    assert computed["runtime"]["compiles"] <= len(computed["runtime"]["batch_shapes"]) + 1


def test_behavior_overrides_the_logged_column(generated):
    """With the column present, --behavior wins: a different behavior policy changes the
    estimates, and the true one gives the logged column's."""
    out = generated["chain"]
    data, policy = out / "logs.parquet", str(out / "policies" / "eval_0.npz")
    logged = _evaluate(data, policy)
    true = _evaluate(data, policy, behavior=str(out / "behavior.npz"))
    other = _evaluate(data, policy, behavior=policy)
    assert_same_estimates(logged, true)
    # the evaluation policy as behavior: every weight is 1
    assert other["results"][0]["diagnostics"] != logged["results"][0]["diagnostics"]
    assert other["results"][0]["estimates"]["wis"]["value"] == pytest.approx(
        other["results"][0]["estimates"]["is"]["value"], rel=1e-12
    )
    assert other["dataset"]["behavior"]["source"] == "checkpoint"


def test_mlp_checkpoint_and_entry_point(mlp_data):
    with _working_directory(mlp_data):
        logged = _evaluate("logs.parquet", "eval.npz")
        by_checkpoint = _evaluate("nob.parquet", "eval.npz", behavior="behavior.npz")
        by_entry_point = _evaluate("nob.parquet", "eval.npz", behavior="mlp_behavior:log_prob")
    assert_same_estimates(logged, by_checkpoint)
    assert_same_estimates(logged, by_entry_point)
    assert by_entry_point["dataset"]["behavior"] == {
        "source": "entry_point",
        "name": "mlp_behavior:log_prob",
        "kind": None,
    }


def test_table_footer_says_where_behavior_probabilities_come_from(generated):
    out = generated["chain"]
    policy = str(out / "policies" / "eval_0.npz")
    behavior = str(out / "behavior.npz")
    computed = ope_cli.evaluate(str(out / "nob.parquet"), policies=policy, behavior=behavior)
    text = " ".join(shown(computed, "table").split())
    assert f"behavior probabilities: computed from checkpoint {behavior}" in text
    logged = ope_cli.evaluate(str(out / "logs.parquet"), policies=policy)
    text = " ".join(shown(logged, "table").split())
    assert "behavior probabilities: logged, column 'behavior_prob'" in text


# --- bad inputs: the error (its type is the exit code), one line naming the problem


def _read_before_the_kernel(data, *policies, **options) -> None:
    """What ``ope evaluate`` does before its kernel runs: the options checked, the data
    opened, the policies (and ``--behavior``) loaded or fitted and checked, and every batch
    read (each chunk checked against the behavior policy)."""
    config = evaluation_config(str(data), policies=[str(p) for p in policies], **options)
    check_config(config)
    for _ in pipeline.stream(config):
        pass


def _one_line(error: pytest.ExceptionInfo, *needles: str) -> str:
    message = str(error.value)
    assert "\n" not in message, message
    for needle in needles:
        assert needle in message, message
    return message


def test_no_propensity_column_and_no_behavior_names_behavior(generated):
    out = generated["chain"]
    with pytest.raises(DataError) as error:
        _read_before_the_kernel(out / "nob.parquet", out / "policies" / "eval_0.npz")
    _one_line(error, "--behavior")


@pytest.mark.parametrize(
    ("env", "spec", "needle"),
    [
        ("chain", "estimate:nonsense", "unknown behavior model"),
        ("bandit", "estimate:tabular", "integer state"),  # vector observations
        ("chain", "estimate:linear_gaussian", "continuous actions"),
        ("gaussian", "estimate:linear_softmax", "discrete actions"),
    ],
)
def test_behavior_estimate_with_a_model_that_cannot_fit_is_a_usage_error(
    generated, env, spec, needle
):
    out = generated[env]
    with pytest.raises(UsageError) as error:
        _read_before_the_kernel(out / "nob.parquet", out / "policies" / "eval_0.npz", behavior=spec)
    _one_line(error, needle)


@pytest.mark.parametrize(
    ("env", "behavior", "needle"),
    [
        ("chain", "vector", "observation has size 1"),  # a vector policy on integer states
        ("bandit", "chain", "tabular"),  # a tabular policy on vector observations
        ("chain", "gaussian", "continuous"),  # continuous actions on integer actions
        ("chain", "missing", "no such checkpoint"),
    ],
)
def test_behavior_that_does_not_fit_the_data_is_a_policy_error(
    generated, tmp_path, env, behavior, needle
):
    out = generated[env]
    if behavior == "vector":  # over the policy's 3 actions, on 5 numbers a step
        vector = {"kind": "linear_softmax", "weight": np.zeros((5, 3)), "bias": np.zeros(3)}
        checkpoint = save_checkpoint(tmp_path / "vector.npz", vector)
    else:
        checkpoint = tmp_path / "missing.npz"
        if behavior != "missing":
            checkpoint = generated[behavior] / "behavior.npz"
    with pytest.raises(PolicyError) as error:
        _read_before_the_kernel(
            out / "nob.parquet", out / "policies" / "eval_0.npz", behavior=str(checkpoint)
        )
    _one_line(error, "--behavior", needle)


@pytest.mark.parametrize(("n_states", "n_actions", "needle"), [(4, 3, "state"), (10, 2, "action")])
def test_tabular_behavior_with_too_few_states_or_actions_is_a_policy_error(
    generated, tmp_path, n_states, n_actions, needle
):
    out = generated["chain"]
    small = save_checkpoint(
        tmp_path / "small.npz", {"kind": "tabular", "logits": np.zeros((n_states, n_actions))}
    )
    with pytest.raises(PolicyError) as error:
        _read_before_the_kernel(
            out / "nob.parquet", out / "policies" / "eval_0.npz", behavior=str(small)
        )
    _one_line(error, "--behavior", "episode", "step", needle)


def test_behavior_over_more_actions_than_the_policy_is_a_policy_error(generated, tmp_path):
    """A behavior checkpoint over 4 actions, with a policy over 3 and logs that never show
    the fourth, was read without a word: its fourth action took probability from the
    logged ones, and IS moved from 2.3 to 86. Refused before any row is read; one over
    fewer actions is not (``ope fit-behavior`` sizes its model by the largest logged
    action, and a logged action beyond it is refused where it is read)."""
    out = generated["chain"]

    def behavior_over(n_actions: int) -> str:
        logits = {"kind": "tabular", "logits": np.zeros((10, n_actions))}
        return str(save_checkpoint(tmp_path / f"over_{n_actions}.npz", logits))

    def opened(behavior: str):
        policy = str(out / "policies" / "eval_0.npz")
        return open_inputs(
            evaluation_config(str(out / "nob.parquet"), policies=[policy], behavior=behavior)
        )

    with pytest.raises(PolicyError) as error:
        opened(behavior_over(4))
    _one_line(error, "--behavior", "over 4 actions", "eval_0.npz", "over 3")
    assert opened(behavior_over(2)).behavior.n_actions == 2


def test_zero_behavior_probability_names_the_episode_and_step(generated, tmp_path):
    """An entry point giving probability 0 to action 2 in state 5: a DataError naming an
    episode and step where the logged data has that state and action (the kernel finds it)."""
    out = generated["chain"]
    (tmp_path / "zero_behavior.py").write_text(
        textwrap.dedent(
            """
            import jax.numpy as jnp

            def log_prob(observation, action):
                return jnp.where((observation == 5) & (action == 2), -jnp.inf, jnp.log(1 / 3))
            """
        )
    )
    with _working_directory(tmp_path), pytest.raises(DataError) as error:
        _evaluate(
            out / "nob.parquet", out / "policies" / "eval_0.npz", behavior="zero_behavior:log_prob"
        )
    line = _one_line(error, "probability 0", "zero_behavior:log_prob")
    found = re.search(r"episode (\d+), step (\d+)", line)
    assert found, line
    episode, step = int(found.group(1)), int(found.group(2))
    table = pq.read_table(out / "nob.parquet")
    columns = {name: table.column(name).to_numpy() for name in table.column_names}
    row = (columns["episode_id"] == episode) & (columns["step"] == step)
    assert list(columns["observation"][row]) == [5], line
    assert list(columns["action"][row]) == [2], line


def test_behavior_needs_observations(generated, tmp_path):
    """Logged target probabilities without observations: --behavior cannot be computed."""
    out = generated["chain"]
    table = pq.read_table(out / "nob.parquet")
    table = table.drop(["observation"]).append_column(
        "target_prob", pa.array(np.full(table.num_rows, 0.5))
    )
    pq.write_table(table, tmp_path / "no_obs.parquet")
    with pytest.raises(DataError) as error:
        _read_before_the_kernel(tmp_path / "no_obs.parquet", behavior=str(out / "behavior.npz"))
    _one_line(error, "--obs-col")


# --- the module's host-side helpers


def test_check_behavior_option():
    check_behavior_option(None)
    check_behavior_option("b.npz")
    check_behavior_option("estimates.npz")  # a file name that merely starts with the word
    for spec in ("estimate", "estimate:mlp_softmax", "estimate:tabular"):
        check_behavior_option(spec)
    with pytest.raises(UsageError, match="unknown behavior model 'lstm'"):
        check_behavior_option("estimate:lstm")
    check_behavior_option("estimate", min_propensity=0.05)
    for spec in (None, "b.npz"):  # an option that needs another names both
        with pytest.raises(UsageError, match="--min-propensity applies to --behavior estimate"):
            check_behavior_option(spec, min_propensity=0.05)


def test_first_zero_probability_picks_the_first_flagged_device():
    none = ZeroProbabilitySteps(
        *(np.zeros(2, dtype) for dtype in (np.int32, np.uint32, np.uint32, np.int32, float))
    )
    assert first_zero_probability(none) is None
    found = ZeroProbabilitySteps(
        count=np.array([0, 3], np.int32),
        key_hi=np.array([0, 1], np.uint32),
        key_lo=np.array([0, 2], np.uint32),
        step=np.array([0, 7], np.int32),
        value=np.array([0.0, -np.inf]),
    )
    assert first_zero_probability(found) == ((1 << 32) | 2, 7, -np.inf, 3)


def test_behavior_source_describes_itself():
    assert "column 'p'" in BehaviorSource("column", "p").describe()
    assert (
        "checkpoint b.npz (tabular)" in BehaviorSource("checkpoint", "b.npz", "tabular").describe()
    )
    assert "entry point m:f" in BehaviorSource("entry_point", "m:f").describe()


@pytest.mark.slow
def test_two_emulated_devices_give_the_same_numbers(generated):
    out = generated["bandit"]
    args = [
        "evaluate",
        str(out / "nob.parquet"),
        "-p",
        str(out / "policies" / "eval_0.npz"),
        "--behavior",
        str(out / "behavior.npz"),
        "--batch-steps",
        "64",
        "--format",
        "json",
    ]
    runs = {}
    for devices in (1, 2):
        flags = {"XLA_FLAGS": xla_flags(f"--xla_force_host_platform_device_count={devices}")}
        done = run_ope(args, env=flags)
        assert done.returncode == 0, done
        runs[devices] = json.loads(done.stdout)
    assert runs[2]["runtime"]["devices"] == 2
    assert_same_estimates(runs[1], runs[2], rtol=1e-12)


def test_inspect_says_when_the_data_has_no_propensity_column(generated):
    out = generated["chain"]
    doc = ope_cli.inspect(str(out / "nob.parquet")).to_dict()
    assert doc["dataset"]["behavior"] is None
    assert doc["behavior_prob"] is None
    logged = ope_cli.inspect(str(out / "logs.parquet")).to_dict()
    assert logged["dataset"]["behavior"] == "prob"


def test_inspect_table_says_evaluate_needs_behavior(ope_in_process, generated):
    table = ope_in_process(["inspect", str(generated["chain"] / "nob.parquet"), "-f", "table"])
    assert table.returncode == 0, table
    assert "ope evaluate needs --behavior" in " ".join(table.stdout.split())


FAULTY = """
import jax.numpy as jnp

def nan_in_state_5(observation, action):
    return jnp.where(observation == 5, jnp.nan, jnp.log(1 / 3))

def infinite(observation, action):
    return jnp.inf + 0.0 * observation

def probability_two(observation, action):
    return jnp.log(2.0) + 0.0 * observation
"""


@pytest.mark.parametrize("role", ["policy", "behavior"])
@pytest.mark.parametrize(
    ("function", "value"),
    [("nan_in_state_5", "NaN"), ("infinite", "inf"), ("probability_two", "0.693147")],
)
def test_a_value_that_is_no_log_probability_is_the_policys_fault(
    generated, tmp_path, role, function, value
):
    """NaN, +inf or a probability above 1 for a discrete action: a PolicyError (exit 4)
    naming the episode and step. An evaluation policy's NaN dropped its episodes from the
    sums without a word (WIS 2.23 against 2.37); a behavior policy's was exit 3, invalid
    data, and its probability 2 was accepted."""
    out = generated["chain"]
    (tmp_path / "faulty.py").write_text(textwrap.dedent(FAULTY))
    given = {"policy": "faulty:" + function, "behavior": str(out / "behavior.npz")}
    if role == "behavior":
        given = {"policy": str(out / "policies" / "eval_0.npz"), "behavior": given["policy"]}
    with _working_directory(tmp_path), pytest.raises(PolicyError) as error:
        _evaluate(out / "nob.parquet", given["policy"], behavior=given["behavior"])
    prefix = "behavior policy" if role == "behavior" else "policy"
    line = _one_line(
        error,
        f"{prefix} faulty:{function} gives the logged action a "
        f"log-probability of {value}, which is no log-probability",
    )
    assert re.search(r"nob.parquet: episode \d+, step \d+: ", line), line
