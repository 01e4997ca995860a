"""Doubly robust estimators (ope_cli/estimation/estimators/doubly_robust.py) and Q sources
(ope_cli/models/qfunctions.py) through the Python API ``ope_cli.evaluate``: the kernel
against the plain NumPy reference (tests/reference.py) for every Q kind, Q-hat = 0 against
PDIS/WPDIS, the absorbing convention; bad inputs at the functions that refuse them."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from datasets import (
    perturb_checkpoint,
    random_checkpoint,
    random_episodes,
    save_checkpoint,
    to_reference_input,
    write_episode_layout,
    write_step_layout,
)
from reference import (
    action_log_probs,
    reference_dr_estimates,
    reference_dr_stderr,
    reference_estimates,
)

import ope_cli
from ope_cli.api import evaluation_config
from ope_cli.config import ColumnMapping
from ope_cli.data.episode_stream import DataConfig, open_episodes
from ope_cli.errors import DataError, InvalidValueError, PolicyError, UsageError
from ope_cli.estimation.inputs import open_inputs
from ope_cli.estimation.run_plan import check_config

GAMMA = 0.9
DR = ("dm", "dr", "wdr")
CRITIC = {"q": "q_hat", "v": "v_hat"}


def _close(actual, expected, rtol=1e-6, atol=1e-9):
    assert actual is not None and expected is not None, (actual, expected)
    assert math.isclose(actual, expected, rel_tol=rtol, abs_tol=atol), (actual, expected)


def _result(data, **options):
    """The one PolicyResult of ``ope_cli.evaluate(data, **options)``."""
    (result,) = ope_cli.evaluate(data, **options).results
    return result


def _estimates(data, **options) -> dict:
    """{estimator: Estimate} of the one policy of ``ope_cli.evaluate(data, **options)``."""
    return _result(data, **options).estimates


def _with_q(episodes, ckpt, q_of_episode):
    """Reference input of ``episodes`` under ``ckpt`` with each episode's (q [T], v [T])."""
    out = []
    for reference, episode in zip(to_reference_input(episodes, ckpt), episodes, strict=True):
        q, v = q_of_episode(episode)
        out.append({**reference, "q": q, "v": v})
    return out


def _check_against_reference(estimates: dict, reference_input, stderr=True):
    expected = reference_dr_estimates(reference_input, GAMMA)
    for name in DR:
        _close(estimates[name].value, expected[name])
    if stderr:
        expected_se = reference_dr_stderr(reference_input, GAMMA)
        for name in ("dm", "dr"):
            _close(estimates[name].stderr, expected_se[name])


@pytest.fixture(scope="module")
def softmax_data(tmp_path_factory):
    """Skewed variable-length episodes of a linear_softmax behavior policy, a perturbed
    target checkpoint, and random critic columns q_hat and v_hat."""
    rng = np.random.default_rng(13)
    behavior = random_checkpoint("linear_softmax", rng, obs_dim=3, n_actions=4)
    episodes = random_episodes(
        rng, 80, behavior=behavior, length_dist="skewed", median_length=6, max_length=40
    )
    for episode in episodes:
        t = len(episode["reward"])
        episode["q"], episode["v"] = rng.normal(size=t), rng.normal(size=t)
    target = perturb_checkpoint(behavior, rng, 0.4)
    root = tmp_path_factory.mktemp("dr")
    data = write_step_layout(
        episodes, root / "logs.parquet", extra_columns=("q", "v"), column_names=CRITIC
    )
    return episodes, target, save_checkpoint(root / "target.npz", target), data, root


def test_critic_columns_match_the_reference(softmax_data):
    episodes, target, target_path, data, _ = softmax_data
    critic = {"policies": target_path, "q_col": "q_hat", "v_col": "v_hat", "gamma": GAMMA}
    result = _result(data, **critic, ci="normal", batch_steps=64, read_rows=50)
    estimates = result.estimates
    _check_against_reference(estimates, _with_q(episodes, target, lambda e: (e["q"], e["v"])))
    # the four importance estimators are still reported, and match their reference
    four = reference_estimates(to_reference_input(episodes, target), GAMMA)
    for name in ("is", "wis", "pdis", "wpdis"):
        _close(estimates[name].value, four[name])
    assert result.q.source == "columns" and "q_hat" in result.q.name
    # the episode layout: list columns of the critic's values, the same estimates
    by_episode = write_episode_layout(
        episodes,
        data.parent / "episodes.parquet",
        extra_columns=("q", "v"),
        column_names=CRITIC,
    )
    again = _estimates(by_episode, **critic, ci="normal")
    for name in DR:
        _close(again[name].value, estimates[name].value, rtol=1e-12)


def _linear_q(rng, obs_dim, n_actions):
    return {
        "kind": "linear_q",
        "weight": rng.normal(size=(obs_dim, n_actions)),
        "bias": rng.normal(size=n_actions),
    }


def _mlp_q(rng, obs_dim, n_actions, hidden=5):
    return {
        "kind": "mlp_q",
        "weight_0": rng.normal(size=(obs_dim, hidden)),
        "bias_0": rng.normal(size=hidden),
        "weight_1": rng.normal(size=(hidden, n_actions)),
        "bias_1": rng.normal(size=n_actions),
        "activation": "relu",
    }


def _q_all(q_ckpt, obs):
    """[T, A] Q-hat(s, .) of a discrete Q checkpoint, in plain NumPy."""
    kind = str(q_ckpt["kind"])
    if kind == "tabular_q":
        return q_ckpt["q"][obs]
    if kind == "linear_q":
        return obs @ q_ckpt["weight"] + q_ckpt["bias"]
    hidden = np.maximum(obs @ q_ckpt["weight_0"] + q_ckpt["bias_0"], 0.0)
    return hidden @ q_ckpt["weight_1"] + q_ckpt["bias_1"]


def _q_and_v(q_ckpt, policy):
    def of_episode(episode):
        q_all = _q_all(q_ckpt, episode["observation"])
        pi = np.exp(action_log_probs(policy, episode["observation"]))
        t = np.arange(len(q_all))
        return q_all[t, episode["action"]], np.sum(pi * q_all, axis=1)

    return of_episode


@pytest.mark.parametrize("kind", ["linear_q", "mlp_q"])
def test_q_checkpoints_match_the_reference(kind, softmax_data):
    episodes, target, target_path, data, root = softmax_data
    rng = np.random.default_rng(5)
    q_ckpt = _linear_q(rng, 3, 4) if kind == "linear_q" else _mlp_q(rng, 3, 4)
    q_path = save_checkpoint(root / f"{kind}.npz", q_ckpt)
    estimates = _estimates(data, policies=target_path, q=q_path, gamma=GAMMA)
    _check_against_reference(estimates, _with_q(episodes, target, _q_and_v(q_ckpt, target)))


def test_tabular_q_matches_the_reference(tmp_path):
    rng = np.random.default_rng(8)
    behavior = random_checkpoint("tabular", rng, n_states=6, n_actions=3)
    episodes = random_episodes(rng, 50, behavior=behavior, median_length=5, max_length=30)
    target = perturb_checkpoint(behavior, rng, 0.5)
    q_ckpt = {"kind": "tabular_q", "q": rng.normal(size=(6, 3))}
    data = write_step_layout(episodes, tmp_path / "logs.parquet")
    estimates = _estimates(
        data,
        policies=save_checkpoint(tmp_path / "t.npz", target),
        q=save_checkpoint(tmp_path / "q.npz", q_ckpt),
        gamma=GAMMA,
    )
    _check_against_reference(estimates, _with_q(episodes, target, _q_and_v(q_ckpt, target)))


def test_float32_warns_of_a_q_checkpoint_it_cannot_hold(tmp_path):
    """A Q checkpoint of 1e6 + N(0, 1): float32 put dr 2.3% and wdr 6.7% off (1e7: wdr 15
    standard errors) with no float32_range warning, which read the data's critic columns
    only. The kernel's largest |Q-hat| now counts as the critic's; float64 and a Q-hat of
    ordinary size say nothing."""
    from ope_cli.report.warnings import FLOAT32_RANGE, run_warnings

    rng = np.random.default_rng(8)
    behavior = random_checkpoint("tabular", rng, n_states=6, n_actions=3)
    episodes = random_episodes(rng, 200, behavior=behavior, median_length=5, max_length=30)
    target = save_checkpoint(tmp_path / "t.npz", perturb_checkpoint(behavior, rng, 0.5))
    data = write_step_layout(episodes, tmp_path / "logs.parquet")
    q = rng.normal(size=(6, 3))

    def warned(offset, precision):
        checkpoint = {"kind": "tabular_q", "q": q + offset}
        q_path = save_checkpoint(tmp_path / f"q{offset}.npz", checkpoint)
        evaluation = ope_cli.evaluate(
            data, policies=target, q=q_path, gamma=GAMMA, precision=precision
        )
        return [w.message for w in run_warnings(evaluation) if w.code == FLOAT32_RANGE]

    (message,) = warned(1e6, "float32")
    assert "the critic's Q-hat or V-hat values reach 1e6" in message
    assert warned(1e6, "float64") == [] and warned(0.0, "float32") == []


def test_zero_q_gives_pdis_and_wpdis(softmax_data):
    _, _, target_path, data, root = softmax_data
    zeros = {"kind": "linear_q", "weight": np.zeros((3, 4)), "bias": np.zeros(4)}
    estimates = _estimates(
        data, policies=target_path, q=save_checkpoint(root / "zeros.npz", zeros), gamma=GAMMA
    )
    assert estimates["dm"].value == 0.0
    _close(estimates["dr"].value, estimates["pdis"].value, rtol=1e-12)
    _close(estimates["dr"].stderr, estimates["pdis"].stderr, rtol=1e-9)
    _close(estimates["wdr"].value, estimates["wpdis"].value, rtol=1e-12)
    _close(estimates["wdr"].stderr, estimates["wpdis"].stderr, rtol=1e-9)


def test_a_q_beyond_float64_is_null_with_its_reason(softmax_data, recwarn):
    """Q-hat of 1.7e308 with ordinary weights and rewards: dr's note names Q-hat (it named
    the weights or the rewards only), and no NumPy warning reaches stderr."""
    _, _, target_path, data, root = softmax_data
    huge = {"kind": "linear_q", "weight": np.zeros((3, 4)), "bias": np.full(4, 1.7e308)}
    estimates = _estimates(
        data, policies=target_path, q=save_checkpoint(root / "huge.npz", huge), gamma=GAMMA
    )
    assert estimates["dr"].value is None
    assert estimates["dr"].note == "the per-decision weights, the rewards or Q-hat overflow float64"
    assert estimates["pdis"].value is not None
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_ended_episodes_stay_in_the_normalisers(tmp_path):
    """Lengths 1 and 2, reward 1 per step, gamma 1, pi_e = pi_b, Q-hat = V-hat = 0: the
    true value is 1.5; padding the ended episode with weight 0 would give 2.0."""
    episodes = [
        {
            "episode_id": i,
            "observation": np.zeros(t, np.int64),
            "action": np.zeros(t, np.int64),
            "reward": np.ones(t),
            "behavior_prob": np.full(t, 0.5),
            "target_prob": np.full(t, 0.5),
            "q": np.zeros(t),
            "v": np.zeros(t),
        }
        for i, t in enumerate((1, 2))
    ]
    data = write_step_layout(
        episodes,
        tmp_path / "logs.parquet",
        extra_columns=("target_prob", "q", "v"),
        column_names=CRITIC,
    )
    estimates = _estimates(data, q_col="q_hat", v_col="v_hat", ci="normal")
    assert estimates["wdr"].value == pytest.approx(1.5, abs=1e-12)
    assert estimates["dr"].value == pytest.approx(1.5, abs=1e-12)


def test_continuous_actions_sample_v_from_the_policy(tmp_path):
    """mlp_q_sa with a linear_gaussian policy. Q-hat(s, a) = c.s + d.a + b is linear in a,
    so V-hat(s) = c.s + d.mean(s) + b up to the Monte Carlo error of v_samples draws;
    with d = 0 it is exact."""
    rng = np.random.default_rng(21)
    behavior = random_checkpoint("linear_gaussian", rng, obs_dim=3, act_dim=2)
    episodes = random_episodes(rng, 60, behavior=behavior, median_length=5, max_length=25)
    target = perturb_checkpoint(behavior, rng, 0.2)
    target_path = save_checkpoint(tmp_path / "t.npz", target)
    data = write_step_layout(episodes, tmp_path / "logs.parquet")
    c, d, b = rng.normal(size=3), rng.normal(size=2), 0.3
    for name, slope in (("exact", np.zeros(2)), ("sampled", d)):
        q_ckpt = {
            "kind": "mlp_q_sa",
            "weight_0": np.concatenate([c, slope])[:, None],
            "bias_0": np.array([b]),
        }
        q_path = save_checkpoint(tmp_path / f"{name}.npz", q_ckpt)
        estimates = _estimates(data, policies=target_path, q=q_path, gamma=GAMMA, v_samples=64)

        def of_episode(episode, slope=slope):
            obs, action = episode["observation"], episode["action"]
            mean = obs @ target["weight"] + target["bias"]
            return obs @ c + action @ slope + b, obs @ c + mean @ slope + b

        expected = reference_dr_estimates(_with_q(episodes, target, of_episode), GAMMA)
        if name == "exact":
            _check_against_reference(estimates, _with_q(episodes, target, of_episode))
        else:  # the mean of 64 draws: V-hat's error has std |d| sigma / 8 per state
            sigma = np.sqrt(np.sum((slope * np.exp(target["log_std"])) ** 2))
            assert abs(estimates["dm"].value - expected["dm"]) < 4 * sigma / 8 / np.sqrt(60)


@pytest.fixture(scope="module")
def gaussian_logs(tmp_path_factory):
    """(logs, target policy path) of a linear_gaussian behavior and target, 60 episodes."""
    root = tmp_path_factory.mktemp("gaussian")
    rng = np.random.default_rng(22)
    behavior = random_checkpoint("linear_gaussian", rng, obs_dim=3, act_dim=2)
    episodes = random_episodes(rng, 60, behavior=behavior, median_length=5, max_length=25)
    target_path = save_checkpoint(root / "t.npz", perturb_checkpoint(behavior, rng, 0.2))
    return write_step_layout(episodes, root / "logs.parquet"), target_path


def test_v_hat_draws_the_same_actions_in_float32_and_float64(gaussian_logs, tmp_path):
    """One key gives the same actions whatever the precision: V-hat's Monte Carlo mean was
    other draws in float32 (dr 0.7% and its standard error 10% from float64's, no word)."""
    data, target_path = gaussian_logs
    rng = np.random.default_rng(23)
    q_ckpt = {"kind": "mlp_q_sa", "weight_0": rng.normal(size=(5, 1)), "bias_0": np.array([0.3])}
    q_path = save_checkpoint(tmp_path / "q.npz", q_ckpt)
    options = {"policies": target_path, "q": q_path, "gamma": GAMMA, "v_samples": 2}
    single = _estimates(data, precision="float32", **options)
    double = _estimates(data, precision="float64", **options)
    for name in ("dm", "dr", "wdr"):
        assert single[name].value == pytest.approx(double[name].value, rel=1e-5), name
        assert single[name].stderr == pytest.approx(double[name].stderr, rel=1e-4), name


@pytest.mark.parametrize("q", ["checkpoint", "fit:mlp"])
def test_a_sample_of_another_shape_is_the_policy_s_error(gaussian_logs, tmp_path, monkeypatch, q):
    """An entry point's sample() of 3 numbers where the logged actions have 2: the fit
    ended in an internal error (numpy's broadcast), and a Q checkpoint's V-hat in Q-hat's
    shape error, which named no sample."""
    data, _ = gaussian_logs
    (tmp_path / "ope_test_bad_sample.py").write_text(
        "import jax.numpy as jnp\n\n\nclass Policy:\n"
        "    def log_prob(self, observation, action):\n"
        "        return -0.5 * jnp.sum(action * action) - jnp.log(2 * jnp.pi)\n\n"
        "    def sample(self, key, observation):\n        return jnp.zeros(3)\n\n\n"
        "policy = Policy()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    rng = np.random.default_rng(23)
    q_ckpt = {"kind": "mlp_q_sa", "weight_0": rng.normal(size=(5, 1)), "bias_0": np.array([0.3])}
    source = str(save_checkpoint(tmp_path / "q.npz", q_ckpt)) if q == "checkpoint" else q
    with pytest.raises(PolicyError, match=r"sample\(key, observation\) must return one action"):
        _estimates(data, policies="ope_test_bad_sample:policy", q=source, gamma=GAMMA)


def test_a_scalar_continuous_action_takes_draws_of_one_number(tmp_path):
    """Logged actions of one number (a scalar column) and a linear_gaussian policy whose
    sample() draws shape (1,): the same action, as fitting reads it, not a shape error."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(5)
    steps = 40
    observation = rng.normal(size=(steps, 3))
    pq.write_table(
        pa.table(
            {
                "episode_id": np.repeat(np.arange(10), 4),
                "step": np.tile(np.arange(4), 10),
                "observation": list(observation),
                "action": rng.normal(size=steps),
                "reward": rng.normal(size=steps),
                "behavior_log_prob": np.full(steps, -1.0),
            }
        ),
        tmp_path / "scalar.parquet",
    )
    policy = save_checkpoint(
        tmp_path / "p.npz",
        {
            "kind": "linear_gaussian",
            "weight": rng.normal(size=(3, 1)),
            "bias": np.zeros(1),
            "log_std": np.zeros(1),
        },
    )
    q = {"kind": "mlp_q_sa", "weight_0": rng.normal(size=(4, 1)), "bias_0": np.array([0.3])}
    q_path = save_checkpoint(tmp_path / "q.npz", q)
    estimates = _estimates(
        tmp_path / "scalar.parquet", policies=policy, q=q_path, gamma=GAMMA, estimators="dm"
    )
    assert math.isfinite(estimates["dm"].value)


@pytest.mark.slow  # an mlp fit
def test_a_fitted_q_draws_v_samples_actions_as_the_kernel_does(gaussian_logs):
    """--q fit's own dm (its diagnostics) is the run's dm: both draw --v-samples actions
    (the fit drew 16 whatever --v-samples said, so the two differed)."""
    data, target_path = gaussian_logs
    result = _result(data, policies=target_path, q="fit:mlp", gamma=GAMMA, v_samples=3)
    fit = result.q.fit
    assert fit["dm"] == pytest.approx(result.estimates["dm"].value, rel=1e-9)


# --- bad inputs: refused before any row is read, by the functions that check them --------------


def _refused(error, code, words, data, **options):
    """``error`` (of exit code ``code``, one line, containing ``words``) from the checks an
    evaluation of ``data`` runs before reading a row: the option values (``check_config``),
    then the data, policies and Q sources (``open_inputs``)."""
    config = evaluation_config(str(data), **options)
    with pytest.raises(error, match=re.escape(words)) as raised:
        check_config(config)
        open_inputs(config)
    assert raised.value.exit_code == code
    assert "\n" not in str(raised.value), str(raised.value)


BAD_Q_CHECKPOINTS = {  # name: (checkpoint, error, exit code, words)
    "width": (
        {"kind": "linear_q", "weight": np.ones((3, 5)), "bias": np.ones(5)},
        PolicyError,
        4,
        "5 action values",
    ),
    "tabular on vectors": (
        {"kind": "tabular_q", "q": np.ones((4, 4))},
        DataError,
        3,
        "integer state",
    ),
    "nan": (
        {"kind": "linear_q", "weight": np.full((3, 4), np.nan), "bias": np.ones(4)},
        PolicyError,
        4,
        "NaN",
    ),
    "not a Q": (
        random_checkpoint("linear_softmax", np.random.default_rng(0), obs_dim=3),
        PolicyError,
        4,
        "not a Q checkpoint",
    ),
}


@pytest.mark.parametrize("name", BAD_Q_CHECKPOINTS)
def test_bad_q_checkpoints_are_refused(name, softmax_data, tmp_path):
    _, _, target_path, data, _ = softmax_data
    checkpoint, error, code, words = BAD_Q_CHECKPOINTS[name]
    path = save_checkpoint(tmp_path / f"{name}.npz", checkpoint)
    _refused(error, code, words, data, policies=target_path, q=path)


BAD_Q_OPTIONS = {  # name: (options, with "TARGET" and "ZEROS" for the files, words)
    "count": (
        {"policies": ["TARGET", "TARGET"], "q": ["ZEROS"] * 3},
        "--q is given 3 times for 2 policies",
    ),
    "q-col alone": ({"policies": "TARGET", "q_col": "q_hat"}, "--q-col and --v-col"),
    "fit model": ({"policies": "TARGET", "q": "fit:foo"}, "unknown Q model"),
    "fit tabular": ({"policies": "TARGET", "q": "fit:tabular"}, "integer state"),
    "dr without q": ({"policies": "TARGET", "estimator": "dr"}, "needs a Q source"),
    "logged target": ({"q": "ZEROS", "target_prob_col": "q_hat"}, "V-hat needs"),
}


@pytest.mark.parametrize("name", BAD_Q_OPTIONS)
def test_bad_q_options_are_usage_errors(name, softmax_data, tmp_path):
    _, _, target_path, data, _ = softmax_data
    zeros = save_checkpoint(
        tmp_path / "z.npz", {"kind": "linear_q", "weight": np.zeros((3, 4)), "bias": np.zeros(4)}
    )
    files = {"TARGET": str(target_path), "ZEROS": str(zeros)}
    options, words = BAD_Q_OPTIONS[name]
    options = {
        key: [files.get(v, v) for v in value]
        if isinstance(value, list)
        else files.get(value, value)
        for key, value in options.items()
    }
    _refused(UsageError, 2, words, data, **options)


def test_nan_in_a_critic_column(tmp_path, softmax_data):
    episodes, _, _, _, _ = softmax_data
    broken = [dict(e) for e in episodes[:5]]
    broken[2]["q"] = np.where(np.arange(len(broken[2]["q"])) == 0, np.nan, broken[2]["q"])
    data = write_step_layout(
        broken, tmp_path / "nan.parquet", extra_columns=("q", "v"), column_names=CRITIC
    )
    critic = ColumnMapping(q_value="q_hat", v_value="v_hat")
    stream = open_episodes(DataConfig(str(data), critic))
    with pytest.raises(InvalidValueError, match="--q-col value is NaN or infinite") as raised:
        list(stream)
    assert raised.value.exit_code == 3 and "\n" not in str(raised.value)


def test_entry_point_q_that_fails_under_jit(tmp_path, softmax_data, monkeypatch):
    _, _, target_path, data, _ = softmax_data
    (tmp_path / "bad_critic.py").write_text(
        "import numpy as np\n"
        "n_actions = 4\n"
        "def q_values(observation):\n"
        "    return np.asarray(observation).repeat(2)[:4] * float(observation[0])\n"
    )
    monkeypatch.chdir(tmp_path)  # entry points import from the working directory
    monkeypatch.syspath_prepend(str(tmp_path))  # (restored after the test)
    with pytest.raises(PolicyError, match=re.escape("jax.jit")) as raised:
        ope_cli.evaluate(data, policies=target_path, q="bad_critic:q_values")
    assert raised.value.exit_code == 4 and "\n" not in str(raised.value)


def test_entry_point_q_giving_nan_on_some_states_is_refused(tmp_path, softmax_data, monkeypatch):
    """A Q entry point that returns NaN on some states printed dr and wdr null, with notes
    blaming overflow (wdr: "a group holds all the weight"), and exit 0; nothing named the
    Q function. It is refused in one line that names it (exit 4)."""
    _, _, target_path, data, _ = softmax_data
    (tmp_path / "nan_critic.py").write_text(
        "import jax.numpy as jnp\n"
        "n_actions = 4\n"
        "def q_values(observation):\n"
        "    q = jnp.arange(4.0) + jnp.sum(observation)\n"
        "    return jnp.where(observation[0] > 0.5, jnp.nan, q)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(PolicyError) as raised:
        ope_cli.evaluate(data, policies=target_path, q="nan_critic:q_values")
    message = str(raised.value)
    assert raised.value.exit_code == 4 and "\n" not in message
    assert message.startswith("Q function nan_critic:q_values gives NaN or infinite values")


def test_entry_point_q_of_another_width_is_refused(tmp_path, softmax_data, monkeypatch):
    """A Q entry point that returns one value where the policy has 3 actions was broadcast
    against pi(.|s) and clamped at Q(s, a): dm -0.11 against 1.55, without a word, also
    with the action count declared. Its width, and a q(s, a) that is not one number, are
    refused in one line (exit 4)."""
    _, _, target_path, data, _ = softmax_data
    (tmp_path / "narrow_critic.py").write_text(
        "import jax.numpy as jnp\n"
        "def q_values(observation):\n"
        "    return jnp.sum(observation)[None]\n"
        "class Declared:\n"
        "    n_actions = 4\n"
        "    def q_values(self, observation):\n"
        "        return jnp.sum(observation)[None]\n"
        "declared = Declared()\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("q_values", "declared"):
        with pytest.raises(PolicyError) as raised:
            ope_cli.evaluate(data, policies=target_path, q=f"narrow_critic:{name}")
        assert raised.value.exit_code == 4 and "\n" not in str(raised.value)
        assert "returns action values of shape (1,) for one observation, but V-hat sums over 4" in (
            str(raised.value)
        )
    import jax
    import jax.numpy as jnp

    from ope_cli.models.qfunctions import QSpec, step_values

    def wide_q(params, observation, action):  # [2] where Q(s, a) is one number
        return observation * action

    def sample(params, key, observation):
        return jnp.zeros(2)

    spec = QSpec("sa", wide_q, None, sample, 2, 1)
    with pytest.raises(PolicyError, match=re.escape("of shape (2,) for one (observation, act")):
        step_values(spec, None, None, None, jnp.ones(2), jnp.ones(2), jax.random.key(0))


def _target_entry_point(tmp_path, target, monkeypatch, module: str, action: str) -> str:
    """``module:log_prob``, the target linear_softmax checkpoint as an entry point that
    declares no n_actions, indexing its log-probabilities with the expression ``action``;
    importable from ``tmp_path`` (the working directory) for this test."""
    np.savez(tmp_path / "target_params.npz", weight=target["weight"], bias=target["bias"])
    (tmp_path / f"{module}.py").write_text(
        "import jax\n"
        "import jax.numpy as jnp\n"
        "import numpy as np\n"
        "_p = np.load('target_params.npz')\n"
        "W, b = jnp.asarray(_p['weight']), jnp.asarray(_p['bias'])\n"
        "def log_prob(observation, action):\n"
        f"    return jax.nn.log_softmax(observation @ W + b)[{action}]\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    return f"{module}:log_prob"


def test_an_entry_point_policy_with_a_wider_q_is_refused(tmp_path, softmax_data, monkeypatch):
    """An entry-point policy of 4 actions that declares none, with a Q checkpoint of 6: V-hat
    summed pi(a|s) Q(s, a) over 6 actions, the policy clamping 4 and 5 to its last (dr 919
    where the truth was 4.5, with only the generic unchecked-actions warning). Its
    probabilities over the Q's actions are summed on the data's first steps: one line,
    exit 4. Over the Q's own 4 actions it is evaluated as before."""
    _, target, _, data, _ = softmax_data
    entry = _target_entry_point(tmp_path, target, monkeypatch, "clamping", "jnp.minimum(action, 3)")
    rng = np.random.default_rng(5)
    wide = save_checkpoint(tmp_path / "wide.npz", _linear_q(rng, 3, 6))
    with pytest.raises(PolicyError, match=r"sum to .* not 1") as raised:
        ope_cli.evaluate(data, policies=entry, q=str(wide), gamma=GAMMA)
    assert raised.value.exit_code == 4 and "\n" not in str(raised.value)
    same = save_checkpoint(tmp_path / "same.npz", _linear_q(rng, 3, 4))
    result = ope_cli.evaluate(data, policies=entry, q=str(same), gamma=GAMMA)
    assert np.isfinite(result.results[0].estimates["dr"].value)


def test_v_samples_over_discrete_actions_is_refused(tmp_path, softmax_data):
    """V-hat over discrete actions sums over every one: --v-samples changed nothing."""
    _, _, target_path, data, _ = softmax_data
    q_path = save_checkpoint(tmp_path / "q.npz", _linear_q(np.random.default_rng(2), 3, 4))
    with pytest.raises(UsageError, match="--v-samples applies to continuous actions") as error:
        ope_cli.evaluate(data, policies=target_path, q=q_path, v_samples=3)
    assert error.value.exit_code == 2


def test_entry_point_q_values(tmp_path, softmax_data, monkeypatch):
    """A JAX entry point scores like the equal linear_q checkpoint."""
    episodes, target, target_path, data, _ = softmax_data
    rng = np.random.default_rng(3)
    q_ckpt = _linear_q(rng, 3, 4)
    np.savez(tmp_path / "critic_params.npz", weight=q_ckpt["weight"], bias=q_ckpt["bias"])
    (tmp_path / "good_critic.py").write_text(
        "import numpy as np\n"
        "import jax.numpy as jnp\n"
        "_p = np.load('critic_params.npz')\n"
        "W, b = jnp.asarray(_p['weight']), jnp.asarray(_p['bias'])\n"
        "def q_values(observation):\n"
        "    return observation @ W + b\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    estimates = _estimates(data, policies=target_path, q="good_critic:q_values", gamma=GAMMA)
    _check_against_reference(estimates, _with_q(episodes, target, _q_and_v(q_ckpt, target)))


# --- against exact ground truth ------------------------------------------------------------


@pytest.mark.slow
def test_chain_with_exact_wrong_and_fitted_q(tmp_path):
    """``ope generate chain`` writes each policy's exact Q. With it, dr is within 4 standard
    errors of the truth and more precise than pdis; with a deliberately wrong Q-hat (exact
    plus N(0, 0.5^2) per cell) dr stays unbiased; with --q fit (tabular, cross-fitted) too.
    One evaluation pass scores the same policy with the three Q sources."""
    from ope_cli.envs.generate import generate

    truth = generate("chain", tmp_path, episodes=3000, gamma=0.95, seed=4)
    entry = truth["policies"][0]
    exact = np.load(tmp_path / entry["q"])
    rng = np.random.default_rng(0)
    wrong = {"kind": "tabular_q", "q": exact["q"] + rng.normal(0.0, 0.5, exact["q"].shape)}
    wrong_path = save_checkpoint(tmp_path / "wrong_q.npz", wrong)
    policy = tmp_path / entry["policy"]
    results = ope_cli.evaluate(
        tmp_path / "logs.parquet",
        policies=[policy] * 3,
        q=[tmp_path / entry["q"], wrong_path, "fit:tabular"],
        gamma=0.95,
        ci="normal",
    ).results
    value = entry["value"]
    for result in results:
        for name in ("dr", "wdr"):
            estimate = result.estimates[name]
            assert abs(estimate.value - value) < 4 * estimate.stderr, (name, result)
    exact_run = results[0].estimates
    assert exact_run["dr"].stderr < 0.9 * exact_run["pdis"].stderr
    assert results[2].q.fit["folds"] == 2


def test_intervals_of_the_doubly_robust_estimators(softmax_data):
    """Percentile and bootstrap-t intervals hold dm, dr and wdr; betting gives them a null
    interval with a note (it bounds only the importance-sampling estimators)."""
    _, _, target_path, data, _ = softmax_data
    base = {"policies": target_path, "q_col": "q_hat", "v_col": "v_hat"}
    for method in ("percentile", "bootstrap-t"):
        estimates = _estimates(data, **base, ci=method, bootstrap_samples=50)
        for name in DR:
            estimate = estimates[name]
            assert estimate.ci_low < estimate.value < estimate.ci_high, (method, name)
    estimates = _estimates(data, **base, ci="betting", reward_range=(-3.0, 3.0), gamma=0.9)
    for name in DR:
        assert estimates[name].ci_low is None and estimates[name].ci_high is None
        assert "betting" in estimates[name].note
    assert estimates["pdis"].ci_low is not None


@pytest.mark.slow
def test_shipped_example_with_fit_q_and_q_fit(tmp_path):
    """The README's workflow on the shipped example: fit-q (``run_fit_q``) writes a
    linear_q checkpoint whose dm ``q=`` reproduces; ``q="fit:linear", cross_fit=1`` fits
    the same Q in the run; dr agrees with pdis within their standard errors."""
    from pathlib import Path

    from ope_cli.models.q_models.command import FitQConfig, run_fit_q

    root = Path(__file__).resolve().parents[1] / "examples"
    logs, policy = root / "data" / "logs.parquet", root / "policies" / "ckpt.npz"
    out = tmp_path / "q.npz"
    fit = run_fit_q(FitQConfig(str(logs), str(policy), str(out), gamma=0.99))
    with_file, in_run = (
        _estimates(logs, policies=policy, gamma=0.99, ci="normal", **q)
        for q in ({"q": out}, {"q": "fit:linear", "cross_fit": 1})
    )
    _close(with_file["dm"].value, fit.dm, rtol=1e-9)
    for name in DR:
        _close(in_run[name].value, with_file[name].value, rtol=1e-9)
    pdis, dr = with_file["pdis"], with_file["dr"]
    assert abs(dr.value - pdis.value) < 3 * pdis.stderr


@pytest.mark.slow
def test_an_entry_point_policy_given_twice_with_two_qs(tmp_path, softmax_data, monkeypatch):
    """The same entry-point policy twice is two evaluations, each with its own Q-hat (a
    policy without parameters is never stacked); ``q="fit"`` counts the logged actions of
    an entry point that declares none."""
    _, target, target_path, data, _ = softmax_data
    entry = _target_entry_point(tmp_path, target, monkeypatch, "same_policy", "action")
    rng = np.random.default_rng(11)
    qs = [save_checkpoint(tmp_path / f"q{i}.npz", _linear_q(rng, 3, 4)) for i in range(2)]
    common = {"gamma": GAMMA, "ci": "normal"}
    both = ope_cli.evaluate(data, policies=[entry, entry], q=qs, **common).results
    for q, result in zip(qs, both, strict=True):
        alone = _estimates(data, policies=target_path, q=q, **common)
        for name in DR:
            _close(result.estimates[name].value, alone[name].value, rtol=1e-9)
    assert len(ope_cli.evaluate(data, policies=[entry, entry], **common).results) == 2
    fitted = _estimates(data, policies=entry, q="fit:linear", **common)
    checkpoint = _estimates(data, policies=target_path, q="fit:linear", **common)
    for name in DR:
        _close(fitted[name].value, checkpoint[name].value, 1e-9)


def test_dm_s_float32_terms_keep_their_rounding_note_about_a_pivot(tmp_path):
    """Centred sums cancel nothing, but float32 terms were each rounded at their own size:
    V-hat of 1e5 + N(0, 1) on 2,000 episodes is still noted (about 8e-5; measured 1.3e-5
    off), 1e6 is still dropped (dm had been 4.7% off), and a spread float32 rounds away
    is a standard error of 0 to float32's precision."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ope_cli.estimation.estimators.importance import NOT_RESOLVED

    n = 2000
    rng = np.random.default_rng(0)
    notes = {}
    for offset, spread in ((1e5, 1.0), (1e6, 1.0), (1e3, 1e-6)):
        v = offset + spread * rng.normal(size=n)
        columns = {"episode_id": np.arange(n), "action": np.zeros(n, np.int64)}
        columns |= {"reward": rng.normal(size=n), "behavior_prob": np.full(n, 0.5)}
        columns |= {"target_prob": np.full(n, 0.5), "q": v, "v": v}
        path = tmp_path / f"v{offset:g}.parquet"
        pq.write_table(pa.table(columns), path)
        options = dict(q_col="q", v_col="v", gamma=GAMMA, estimators="dm", precision="float32")
        dm = _estimates(path, **options)["dm"]
        notes[offset] = dm.note
        if offset == 1e5:
            reference = np.std(v - v[0], ddof=1) / np.sqrt(n)
            assert dm.stderr == pytest.approx(reference, rel=1e-4), dm
    assert notes[1e5].startswith("standard error good to about 8e-05 only from rounding")
    assert notes[1e6].startswith(f"{NOT_RESOLVED} in float32 terms")
    # 1000 + 1e-6 N(0, 1) is one float32 value: the centred sums are 0, and so is the
    # standard error, noted (it printed 0 +- 0 without a word, 1.9 standard errors off)
    assert notes[1e3].startswith("standard error 0 to float32's precision"), notes[1e3]


@pytest.mark.parametrize("offset", [0.0, 1e10, 1e12])
@pytest.mark.parametrize("spread", [0.1, 1.0, 10.0])
def test_dm_s_standard_error_is_read_about_a_pivot(tmp_path, offset, spread):
    """V-hat of 1e12 + N(0, 1): DM's terms and their squares cancelled, and its standard
    error came out 0 (with a warning that the episodes show no spread) or null, where the
    reference is 0.126; a Q checkpoint's constant is no rarer than a reward's. Its moments
    are now taken about one episode's V-hat, so the standard error is the reference's to
    float64 precision, without a note, whatever the constant, and so is the mean."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    n = 64
    rng = np.random.default_rng(3)
    v = offset + spread * rng.normal(size=n)
    pq.write_table(
        pa.table(
            {
                "episode_id": np.arange(n),
                "action": np.zeros(n, np.int64),
                "reward": rng.normal(size=n),
                "behavior_prob": np.full(n, 0.5),
                "target_prob": np.full(n, 0.5),
                "q": v,
                "v": v,
            }
        ),
        tmp_path / "offset.parquet",
    )
    result = _result(
        tmp_path / "offset.parquet", q_col="q", v_col="v", gamma=GAMMA, estimators="dm"
    )
    dm = result.estimates["dm"]
    reference = np.std(v - v[0], ddof=1) / np.sqrt(n)  # exact differences: Sterbenz
    assert dm.stderr == pytest.approx(reference, rel=1e-9) and dm.note is None, dm
    rounding = n * np.finfo(np.float64).eps * spread  # of the deviations' sum
    assert dm.value == pytest.approx(v[0] + np.mean(v - v[0]), rel=1e-15, abs=rounding)
