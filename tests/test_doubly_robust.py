"""Doubly robust estimators (ope_cli/estimation/estimators/doubly_robust.py) and Q sources
(ope_cli/models/qfunctions.py) through ``ope evaluate``: the kernel against the plain NumPy
reference (tests/reference.py) for every Q kind, Q-hat = 0 against PDIS/WPDIS, the
absorbing convention, and bad inputs."""

from __future__ import annotations

import json
import math

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

GAMMA = 0.9
DR = ("dm", "dr", "wdr")
CRITIC = {"q": "q_hat", "v": "v_hat"}


def _close(actual, expected, rtol=1e-6, atol=1e-9):
    assert actual is not None and expected is not None, (actual, expected)
    assert math.isclose(actual, expected, rel_tol=rtol, abs_tol=atol), (actual, expected)


def _estimates(run) -> dict:
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout)["results"][0]["estimates"]


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
        _close(estimates[name]["value"], expected[name])
    if stderr:
        expected_se = reference_dr_stderr(reference_input, GAMMA)
        for name in ("dm", "dr"):
            _close(estimates[name]["stderr"], expected_se[name])


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


def test_critic_columns_match_the_reference(softmax_data, ope_in_process):
    episodes, target, target_path, data, _ = softmax_data
    run = ope_in_process(
        [
            "evaluate",
            data,
            "-p",
            target_path,
            "--q-col",
            "q_hat",
            "--v-col",
            "v_hat",
            "--gamma",
            GAMMA,
            "--ci",
            "normal",
            "--batch-steps",
            "64",
            "--read-rows",
            "50",
        ]
    )
    estimates = _estimates(run)
    _check_against_reference(estimates, _with_q(episodes, target, lambda e: (e["q"], e["v"])))
    # the four importance estimators are still reported, and match their reference
    four = reference_estimates(to_reference_input(episodes, target), GAMMA)
    for name in ("is", "wis", "pdis", "wpdis"):
        _close(estimates[name]["value"], four[name])
    q = json.loads(run.stdout)["results"][0]["diagnostics"]["q"]
    assert q["source"] == "columns" and "q_hat" in q["name"]
    # the episode layout: list columns of the critic's values, the same estimates
    by_episode = write_episode_layout(
        episodes,
        data.parent / "episodes.parquet",
        extra_columns=("q", "v"),
        column_names=CRITIC,
    )
    again = _estimates(
        ope_in_process(
            [
                "evaluate",
                by_episode,
                "-p",
                target_path,
                "--q-col",
                "q_hat",
                "--v-col",
                "v_hat",
                "--gamma",
                GAMMA,
                "--ci",
                "normal",
            ]
        )
    )
    for name in DR:
        _close(again[name]["value"], estimates[name]["value"], rtol=1e-12)


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
def test_q_checkpoints_match_the_reference(kind, softmax_data, ope_in_process):
    episodes, target, target_path, data, root = softmax_data
    rng = np.random.default_rng(5)
    q_ckpt = _linear_q(rng, 3, 4) if kind == "linear_q" else _mlp_q(rng, 3, 4)
    q_path = save_checkpoint(root / f"{kind}.npz", q_ckpt)
    run = ope_in_process(["evaluate", data, "-p", target_path, "--q", q_path, "--gamma", GAMMA])
    _check_against_reference(_estimates(run), _with_q(episodes, target, _q_and_v(q_ckpt, target)))


def test_tabular_q_matches_the_reference(tmp_path, ope_in_process):
    rng = np.random.default_rng(8)
    behavior = random_checkpoint("tabular", rng, n_states=6, n_actions=3)
    episodes = random_episodes(rng, 50, behavior=behavior, median_length=5, max_length=30)
    target = perturb_checkpoint(behavior, rng, 0.5)
    q_ckpt = {"kind": "tabular_q", "q": rng.normal(size=(6, 3))}
    data = write_step_layout(episodes, tmp_path / "logs.parquet")
    run = ope_in_process(
        [
            "evaluate",
            data,
            "-p",
            save_checkpoint(tmp_path / "t.npz", target),
            "--q",
            save_checkpoint(tmp_path / "q.npz", q_ckpt),
            "--gamma",
            GAMMA,
        ]
    )
    _check_against_reference(_estimates(run), _with_q(episodes, target, _q_and_v(q_ckpt, target)))


def test_zero_q_gives_pdis_and_wpdis(softmax_data, ope_in_process):
    _, _, target_path, data, root = softmax_data
    zeros = {"kind": "linear_q", "weight": np.zeros((3, 4)), "bias": np.zeros(4)}
    run = ope_in_process(
        [
            "evaluate",
            data,
            "-p",
            target_path,
            "--q",
            save_checkpoint(root / "zeros.npz", zeros),
            "--gamma",
            GAMMA,
        ]
    )
    estimates = _estimates(run)
    assert estimates["dm"]["value"] == 0.0
    _close(estimates["dr"]["value"], estimates["pdis"]["value"], rtol=1e-12)
    _close(estimates["dr"]["stderr"], estimates["pdis"]["stderr"], rtol=1e-9)
    _close(estimates["wdr"]["value"], estimates["wpdis"]["value"], rtol=1e-12)
    _close(estimates["wdr"]["stderr"], estimates["wpdis"]["stderr"], rtol=1e-9)


def test_ended_episodes_stay_in_the_normalisers(tmp_path, ope_in_process):
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
    estimates = _estimates(
        ope_in_process(["evaluate", data, "--q-col", "q_hat", "--v-col", "v_hat", "--ci", "normal"])
    )
    assert estimates["wdr"]["value"] == pytest.approx(1.5, abs=1e-12)
    assert estimates["dr"]["value"] == pytest.approx(1.5, abs=1e-12)


def test_continuous_actions_sample_v_from_the_policy(tmp_path, ope_in_process):
    """mlp_q_sa with a linear_gaussian policy. Q-hat(s, a) = c.s + d.a + b is linear in a,
    so V-hat(s) = c.s + d.mean(s) + b up to the Monte Carlo error of --v-samples draws;
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
        run = ope_in_process(
            [
                "evaluate",
                data,
                "-p",
                target_path,
                "--q",
                save_checkpoint(tmp_path / f"{name}.npz", q_ckpt),
                "--gamma",
                GAMMA,
                "--v-samples",
                "64",
            ]
        )

        def of_episode(episode, slope=slope):
            obs, action = episode["observation"], episode["action"]
            mean = obs @ target["weight"] + target["bias"]
            return obs @ c + action @ slope + b, obs @ c + mean @ slope + b

        expected = reference_dr_estimates(_with_q(episodes, target, of_episode), GAMMA)
        estimates = _estimates(run)
        if name == "exact":
            _check_against_reference(estimates, _with_q(episodes, target, of_episode))
        else:  # the mean of 64 draws: V-hat's error has std |d| sigma / 8 per state
            sigma = np.sqrt(np.sum((slope * np.exp(target["log_std"])) ** 2))
            assert abs(estimates["dm"]["value"] - expected["dm"]) < 4 * sigma / 8 / np.sqrt(60)


# --- bad inputs ------------------------------------------------------------------------------


def _first_line(run) -> str:
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1, run.stderr
    assert run.stdout == ""
    return lines[0]


def test_bad_q_inputs(softmax_data, tmp_path, ope_in_process):
    _, _, target_path, data, _ = softmax_data
    rng = np.random.default_rng(0)
    cases = {
        "width": (
            4,
            {"kind": "linear_q", "weight": np.ones((3, 5)), "bias": np.ones(5)},
            "5 action values",
        ),
        "tabular on vectors": (3, {"kind": "tabular_q", "q": np.ones((4, 4))}, "integer state"),
        "nan": (
            4,
            {"kind": "linear_q", "weight": np.full((3, 4), np.nan), "bias": np.ones(4)},
            "NaN",
        ),
        "not a Q": (4, random_checkpoint("linear_softmax", rng, obs_dim=3), "not a Q checkpoint"),
    }
    for name, (code, ckpt, words) in cases.items():
        path = save_checkpoint(tmp_path / f"{name}.npz", ckpt)
        run = ope_in_process(["evaluate", data, "-p", target_path, "--q", path])
        assert run.returncode == code, (name, run.stderr)
        assert words in _first_line(run), (name, run.stderr)
    zeros = save_checkpoint(
        tmp_path / "z.npz", {"kind": "linear_q", "weight": np.zeros((3, 4)), "bias": np.zeros(4)}
    )
    usage = {
        "count": (
            [data, "-p", target_path, "-p", target_path, "--q", zeros, "--q", zeros, "--q", zeros],
            "--q is given 3 times for 2 policies",
        ),
        "q-col alone": ([data, "-p", target_path, "--q-col", "q_hat"], "--q-col and --v-col"),
        "fit model": ([data, "-p", target_path, "--q", "fit:foo"], "unknown Q model"),
        "fit tabular": ([data, "-p", target_path, "--q", "fit:tabular"], "integer state"),
        "dr without q": ([data, "-p", target_path, "-e", "dr"], "needs a Q source"),
        "logged target": ([data, "--q", zeros, "--target-prob-col", "q_hat"], "V-hat needs"),
    }
    for name, (args, words) in usage.items():
        run = ope_in_process(["evaluate", *args])
        assert run.returncode == 2, (name, run.stderr)
        assert words in _first_line(run), (name, run.stderr)


def test_nan_in_a_critic_column(tmp_path, softmax_data, ope_in_process):
    episodes, _, target_path, _, _ = softmax_data
    broken = [dict(e) for e in episodes[:5]]
    broken[2]["q"] = np.where(np.arange(len(broken[2]["q"])) == 0, np.nan, broken[2]["q"])
    data = write_step_layout(
        broken, tmp_path / "nan.parquet", extra_columns=("q", "v"), column_names=CRITIC
    )
    run = ope_in_process(
        ["evaluate", data, "-p", target_path, "--q-col", "q_hat", "--v-col", "v_hat"]
    )
    assert run.returncode == 3
    assert "--q-col value is NaN or infinite" in _first_line(run)


def test_entry_point_q_that_fails_under_jit(tmp_path, softmax_data, ope_in_process):
    _, _, target_path, data, _ = softmax_data
    (tmp_path / "bad_critic.py").write_text(
        "import numpy as np\n"
        "n_actions = 4\n"
        "def q_values(observation):\n"
        "    return np.asarray(observation).repeat(2)[:4] * float(observation[0])\n"
    )
    run = ope_in_process(
        ["evaluate", data, "-p", target_path, "--q", "bad_critic:q_values"], cwd=tmp_path
    )
    assert run.returncode == 4, run.stderr
    assert "jax.jit" in _first_line(run)


def test_entry_point_q_values(tmp_path, softmax_data, ope_in_process):
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
    run = ope_in_process(
        ["evaluate", data, "-p", target_path, "--q", "good_critic:q_values", "--gamma", GAMMA],
        cwd=tmp_path,
    )
    _check_against_reference(_estimates(run), _with_q(episodes, target, _q_and_v(q_ckpt, target)))


# --- against exact ground truth ------------------------------------------------------------


@pytest.mark.slow
def test_chain_with_exact_wrong_and_fitted_q(tmp_path, ope_in_process):
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
    run = ope_in_process(
        ["evaluate", tmp_path / "logs.parquet", "--gamma", 0.95, "--ci", "normal"]
        + ["-p", policy] * 3
        + ["--q", tmp_path / entry["q"], "--q", wrong_path, "--q", "fit:tabular"]
    )
    assert run.returncode == 0, run.stderr
    results = json.loads(run.stdout)["results"]
    value = entry["value"]
    for result in results:
        for name in ("dr", "wdr"):
            estimate = result["estimates"][name]
            assert abs(estimate["value"] - value) < 4 * estimate["stderr"], (name, result)
    exact_run = results[0]["estimates"]
    assert exact_run["dr"]["stderr"] < 0.9 * exact_run["pdis"]["stderr"]
    assert results[2]["diagnostics"]["q"]["fit"]["folds"] == 2


def test_intervals_of_the_doubly_robust_estimators(softmax_data, ope_in_process):
    """Percentile and bootstrap-t intervals hold dm, dr and wdr; betting gives them a null
    interval with a note (it bounds only the importance-sampling estimators)."""
    _, _, target_path, data, _ = softmax_data
    base = ["evaluate", data, "-p", target_path, "--q-col", "q_hat", "--v-col", "v_hat"]
    for method in ("percentile", "bootstrap-t"):
        estimates = _estimates(ope_in_process([*base, "--ci", method, "--bootstrap-samples", "50"]))
        for name in DR:
            estimate = estimates[name]
            assert estimate["ci_low"] < estimate["value"] < estimate["ci_high"], (method, name)
    estimates = _estimates(
        ope_in_process([*base, "--ci", "betting", "--reward-range", "-3", "3", "--gamma", "0.9"])
    )
    for name in DR:
        assert estimates[name]["ci_low"] is None and estimates[name]["ci_high"] is None
        assert "betting" in estimates[name]["note"]
    assert estimates["pdis"]["ci_low"] is not None


@pytest.mark.slow
def test_shipped_example_with_fit_q_and_q_fit(tmp_path, ope_in_process):
    """The README's commands on the shipped example: ope fit-q writes a linear_q checkpoint
    whose dm ``--q`` reproduces; ``--q fit:linear --cross-fit 1`` fits the same Q in the
    run; dr agrees with pdis within their standard errors."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "examples"
    logs, policy = root / "data" / "logs.parquet", root / "policies" / "ckpt.npz"
    out = tmp_path / "q.npz"
    fitted = ope_in_process(
        ["fit-q", logs, "--policy", policy, "--gamma", 0.99, "--out", out, "-f", "json"]
    )
    assert fitted.returncode == 0, fitted.stderr
    fit = json.loads(fitted.stdout)
    with_file, in_run = (
        _estimates(
            ope_in_process(["evaluate", logs, "-p", policy, "--gamma", 0.99, "--ci", "normal", *q])
        )
        for q in (["--q", out], ["--q", "fit:linear", "--cross-fit", "1"])
    )
    dm = next(value for key, value in _flatten(fit) if key == "dm")
    _close(with_file["dm"]["value"], dm, rtol=1e-9)
    for name in DR:
        _close(in_run[name]["value"], with_file[name]["value"], rtol=1e-9)
    pdis, dr = with_file["pdis"], with_file["dr"]
    assert abs(dr["value"] - pdis["value"]) < 3 * pdis["stderr"]


def _flatten(document, prefix=""):
    """(key, value) of every leaf of a JSON document."""
    if isinstance(document, dict):
        for key, value in document.items():
            yield from _flatten(value, key)
    elif isinstance(document, list):
        for value in document:
            yield from _flatten(value, prefix)
    else:
        yield prefix, document


@pytest.mark.slow
def test_an_entry_point_policy_given_twice_with_two_qs(tmp_path, softmax_data, ope_in_process):
    """The same entry-point policy twice is two evaluations, each with its own Q-hat (a
    policy without parameters is never stacked); ``--q fit`` counts the logged actions of
    an entry point that declares none."""
    _, target, target_path, data, root = softmax_data
    np.savez(tmp_path / "target_params.npz", weight=target["weight"], bias=target["bias"])
    (tmp_path / "same_policy.py").write_text(
        "import jax\n"
        "import jax.numpy as jnp\n"
        "import numpy as np\n"
        "_p = np.load('target_params.npz')\n"
        "W, b = jnp.asarray(_p['weight']), jnp.asarray(_p['bias'])\n"
        "def log_prob(observation, action):\n"
        "    return jax.nn.log_softmax(observation @ W + b)[action]\n"
    )
    rng = np.random.default_rng(11)
    qs = [save_checkpoint(tmp_path / f"q{i}.npz", _linear_q(rng, 3, 4)) for i in range(2)]
    common = ["evaluate", data, "--gamma", GAMMA, "--ci", "normal"]
    both = ope_in_process(
        [
            *common,
            "-p",
            "same_policy:log_prob",
            "-p",
            "same_policy:log_prob",
            "--q",
            qs[0],
            "--q",
            qs[1],
        ],
        cwd=tmp_path,
    )
    assert both.returncode == 0, both.stderr
    results = json.loads(both.stdout)["results"]
    for q, result in zip(qs, results, strict=True):
        alone = _estimates(ope_in_process([*common, "-p", target_path, "--q", q]))
        for name in DR:
            _close(result["estimates"][name]["value"], alone[name]["value"], rtol=1e-9)
    twice = ope_in_process(
        [*common, "-p", "same_policy:log_prob", "-p", "same_policy:log_prob"], cwd=tmp_path
    )
    assert twice.returncode == 0, twice.stderr
    fitted = ope_in_process(
        [*common, "-p", "same_policy:log_prob", "--q", "fit:linear"], cwd=tmp_path
    )
    checkpoint = ope_in_process([*common, "-p", target_path, "--q", "fit:linear"])
    for name in DR:
        _close(_estimates(fitted)[name]["value"], _estimates(checkpoint)[name]["value"], 1e-9)
