"""Tests of `ope generate` and its environments (`ope_cli.envs`): files, schema, determinism
and the ground truth's correctness.

The truths are checked two ways: against NumPy Monte Carlo runs of the evaluation policy on the
environment's arrays (independent of the JAX simulator), and against the logged data itself
with shift=0, where the evaluation policy is the behavior policy (checks the JAX simulator).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import ope_cli.envs.generate as gen
import ope_cli.envs.rollout as rollout
import ope_cli.envs.writer as writer
from ope_cli.envs.base import policy_scales
from ope_cli.envs.registry import ENVIRONMENTS
from ope_cli.errors import UsageError
from ope_cli.models.policies import load_checkpoint

pytestmark = pytest.mark.usefixtures("small_control_truth")

CONTROL_EPISODES = 4000
POLICY_KEYS = {
    "tabular": {"kind", "logits"},
    "linear_softmax": {"kind", "weight", "bias"},
    "linear_gaussian": {"kind", "weight", "bias", "log_std"},
}


@pytest.fixture(scope="module")
def written(tmp_path_factory, small_control_truth) -> dict[str, tuple[Path, dict]]:
    """Each env generated small (its files and checkpoints, not its statistics): (out dir,
    truth), control's truth on 1,024 episodes (as ``tiny_control_truth``: never read here)."""
    from ope_cli.envs import control

    outputs = {}
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(control, "CONTROL_TRUTH_EPISODES", 1 << 10)
        patch.setattr(control, "CONTROL_TRUTH_CONTINUED", 1 << 7)
        for env in gen.ENVIRONMENTS:
            out = tmp_path_factory.mktemp(f"small-{env}")
            outputs[env] = (out, gen.generate(env, out, episodes=300, seed=3, shift=0.0))
    return outputs


@pytest.fixture(scope="module")
def on_policy(tmp_path_factory, small_control_truth) -> dict[str, tuple[Path, dict]]:
    """Each env generated with shift=0 (so eval_0 is the behavior policy): (out dir, truth)."""
    episodes = {"bandit": 20_000, "chain": 5000, "control": CONTROL_EPISODES, "gaussian": 5000}
    outputs = {}
    for env, n in episodes.items():
        out = tmp_path_factory.mktemp(env)
        outputs[env] = (out, gen.generate(env, out, episodes=n, seed=3, shift=0.0))
    return outputs


def _load_policy(path: Path) -> tuple[str, dict[str, np.ndarray]]:
    with np.load(path, allow_pickle=False) as archive:
        arrays = dict(archive)
    kind = arrays.pop("kind")
    assert kind.shape == () and kind.dtype.kind == "U"
    return str(kind), arrays


def _softmax(logits: np.ndarray) -> np.ndarray:
    z = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def _sample(rng: np.random.Generator, probs: np.ndarray) -> np.ndarray:
    """One index per row of probs [n, k]."""
    return np.minimum(
        (rng.random((len(probs), 1)) > np.cumsum(probs, axis=1)).sum(axis=1), probs.shape[1] - 1
    )


def _behavior_log_prob(
    kind: str, policy: dict[str, np.ndarray], obs: np.ndarray, action: np.ndarray
) -> np.ndarray:
    if kind == "tabular":
        return np.log(_softmax(policy["logits"][obs])[np.arange(len(obs)), action])
    if kind == "linear_softmax":
        return np.log(
            _softmax(obs @ policy["weight"] + policy["bias"])[np.arange(len(obs)), action]
        )
    z = (action - obs @ policy["weight"] - policy["bias"]) * np.exp(-policy["log_std"])
    return np.sum(-0.5 * z**2 - policy["log_std"] - 0.5 * math.log(2 * math.pi), axis=1)


@pytest.mark.parametrize("env", gen.ENVIRONMENTS)
def test_files_schema_and_checkpoints(env, written):
    out, truth = written[env]
    table = pq.read_table(out / "logs.parquet")
    vector = pa.list_(pa.float64())
    assert table.schema.names == [
        "episode_id",
        "step",
        "observation",
        "action",
        "reward",
        "behavior_prob",
    ]
    assert (
        table.schema.field("episode_id").type == pa.int64()
        and table.schema.field("step").type == pa.int64()
    )
    assert table.schema.field("observation").type == (pa.int64() if env == "chain" else vector)
    assert table.schema.field("action").type == (vector if env == "gaussian" else pa.int64())
    assert (
        table.schema.field("reward").type
        == pa.float64()
        == table.schema.field("behavior_prob").type
    )

    episode, step = table["episode_id"].to_numpy(), table["step"].to_numpy()
    starts = np.flatnonzero(np.r_[True, np.diff(episode) != 0])
    assert np.array_equal(
        episode[starts], np.arange(truth["episodes"])
    )  # contiguous, every id once
    assert np.array_equal(
        step, np.arange(len(step)) - np.repeat(starts, np.diff(np.r_[starts, len(step)]))
    )
    assert truth["steps"] == len(step) and truth["max_length"] == step.max() + 1

    kind, behavior = _load_policy(out / "behavior.npz")
    obs = np.asarray(table["observation"].to_pylist())
    action = np.asarray(table["action"].to_pylist())
    log_prob = _behavior_log_prob(kind, behavior, obs, action)
    np.testing.assert_allclose(np.exp(log_prob), table["behavior_prob"].to_numpy(), rtol=1e-9)
    assert np.all(np.isfinite(table["reward"].to_numpy()))
    declared = json.loads(pq.read_schema(out / "logs.parquet").metadata[b"ope"])
    assert declared == {  # the bounds of betting intervals, and the discount of the truth
        "reward_range": truth["reward_range"],
        "horizon": truth["horizon"],
        "gamma": truth["gamma"],
    }
    if declared["reward_range"] is not None:  # bandit, chain: the data keep the promise
        low, high = declared["reward_range"]
        assert low <= table["reward"].to_numpy().min() and table["reward"].to_numpy().max() <= high

    assert [p["policy"] for p in truth["policies"]] == [
        "policies/eval_0.npz",
        "policies/eval_1.npz",
        "policies/eval_2.npz",
    ]
    for entry in [truth["behavior"], *truth["policies"]]:
        entry_kind, arrays = _load_policy(out / entry["policy"])
        assert entry_kind == kind and set(arrays) | {"kind"} == POLICY_KEYS[kind]
        assert all(a.dtype == np.float64 for a in arrays.values())
        assert math.isfinite(entry["value"]) and entry["stderr"] >= 0
    assert json.loads((out / "truth.json").read_text()) == truth
    assert {"env", "gamma", "episodes", "seed", "policies"} <= set(truth) and truth["env"] == env


@pytest.mark.parametrize("env", gen.ENVIRONMENTS)
def test_same_seed_same_bytes(env, tmp_path, tiny_control_truth):
    options = {"episodes": 300, "seed": 11, "horizon": 50 if env == "control" else None}
    first = gen.generate(env, tmp_path / "a", **options)
    second = gen.generate(env, tmp_path / "b", **options)
    other = gen.generate(env, tmp_path / "c", **{**options, "seed": 12})
    assert first == second
    names = ["logs.parquet", "behavior.npz", "truth.json"] + [
        f"policies/eval_{k}.npz" for k in range(3)
    ]
    names += [f"q/eval_{k}.npz" for k in range(3)] if env == "chain" else []
    for name in names:
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert (tmp_path / "a" / "logs.parquet").read_bytes() != (
        tmp_path / "c" / "logs.parquet"
    ).read_bytes()
    assert [p["value"] for p in other["policies"]] == [
        p["value"] for p in first["policies"]
    ]  # seed: data only


def test_files_split_whole_episodes_and_same_data(tmp_path):
    gen.generate("chain", tmp_path / "one", episodes=100, seed=5)
    single = pq.read_table(tmp_path / "one" / "logs.parquet")
    gen.generate("chain", tmp_path / "three", episodes=100, seed=5, files=3)
    parts = sorted((tmp_path / "three" / "logs").glob("*.parquet"))
    assert [p.name for p in parts] == [
        "part-00000.parquet",
        "part-00001.parquet",
        "part-00002.parquet",
    ]
    ids = [set(pq.read_table(p)["episode_id"].to_pylist()) for p in parts]
    assert (
        all(ids) and sum(map(len, ids)) == len(set().union(*ids)) == 100
    )  # no episode spans files
    assert pa.concat_tables(pq.read_table(p) for p in parts).equals(single)


@pytest.mark.parametrize(
    ("env", "episodes", "horizon"), [("gaussian", 3, 700), ("control", 300, 600)]
)
def test_the_long_tail_runs_in_long_scans_with_the_same_data(
    env, episodes, horizon, tmp_path, monkeypatch
):
    """The last few episodes alive ran alone in 1024 lanes, 32 steps a call (a 1M-step
    episode took minutes): they now run in FEW_LANES lanes, LONG_CHUNKS draws a call, and
    every step's data stays what it was (control's rewards, an exp compiled for fewer
    lanes, to rounding)."""
    lengths = []
    run_chunk = rollout._run_chunk

    def recorded(*args):
        lengths.append(args[2])
        return run_chunk(*args)

    monkeypatch.setattr(rollout, "_run_chunk", recorded)
    gen.generate(env, tmp_path / "long", episodes=episodes, seed=2, horizon=horizon)
    long = rollout.CHUNK_STEPS * rollout.LONG_CHUNKS
    assert rollout.CHUNK_STEPS in lengths and long in lengths  # both, in that order
    assert lengths.index(long) > 0 and set(lengths[lengths.index(long) :]) == {long}
    monkeypatch.setattr(rollout, "FEW_LANES", 0)  # never: 32 steps a call throughout
    gen.generate(env, tmp_path / "short", episodes=episodes, seed=2, horizon=horizon)
    logs = [pq.read_table(tmp_path / run / "logs.parquet") for run in ("long", "short")]
    assert logs[0].drop_columns("reward").equals(logs[1].drop_columns("reward"))
    rewards = [log["reward"].to_numpy() for log in logs]
    np.testing.assert_allclose(rewards[0], rewards[1], rtol=1e-14, atol=1e-15)


def test_control_truth_holds_a_running_sum_not_every_chunk(monkeypatch):
    """Every 64-step chunk's rewards past the first were kept until the end: 1.3 GB at a
    horizon of 100,000, and far more at the 10,000,000 the option takes."""
    import weakref

    import jax

    from ope_cli.envs import control

    kept, alive = [], []
    chunk = control._truth_chunk

    def watched(*args):
        obs, rewards = chunk(*args)
        alive.append(sum(ref() is not None for ref in kept))
        kept.append(weakref.ref(rewards))
        return obs, rewards

    monkeypatch.setattr(control, "_truth_chunk", watched)
    with jax.enable_x64(True):
        env, policies = control.build(0.5, 1)
        control.truth(env, policies, 0.9, 40 * control.CONTROL_TRUTH_SPLIT_STEP)
    assert len(alive) > 40 and max(alive) <= 10, alive  # every one: 46


def test_a_horizon_bounds_the_steps_simulated_at_a_time_and_not_the_data(tmp_path, monkeypatch):
    # 300 episodes of a 10M-step horizon were simulated as one block: 24 GB, then more
    gen.generate("gaussian", tmp_path / "whole", episodes=40, seed=3, horizon=20)
    blocks = []
    simulate = writer.simulate

    def recorded(*args):
        blocks.append(args[4])  # n_episodes
        return simulate(*args)

    monkeypatch.setattr(writer, "simulate", recorded)
    monkeypatch.setattr(writer, "BLOCK_STEPS", 100)
    gen.generate("gaussian", tmp_path / "blocks", episodes=40, seed=3, horizon=20)
    assert blocks == [5] * 8
    assert writer.block_episodes(None) == writer.BLOCK_EPISODES
    assert writer.block_episodes(10**7) == 1
    logs = [pq.read_table(tmp_path / run / "logs.parquet") for run in ("whole", "blocks")]
    assert logs[0].num_rows == 800 and logs[1].equals(logs[0])


@pytest.mark.parametrize(
    ("env", "options", "match"),
    [
        ("maze", {}, "unknown environment"),
        ("chain", {"episodes": 0}, "episodes"),
        # episode 2^32's key (fold_in keeps 32 bits of the id) repeated episode 0's data
        ("chain", {"episodes": 2**32 + 1}, "--episodes must be at most 4,294,967,296"),
        ("chain", {"episodes": 10**23}, "--episodes must be at most"),
        ("chain", {"gamma": 1.5}, "gamma"),
        ("chain", {"horizon": 0}, "horizon"),
        ("bandit", {"horizon": 5}, "horizon"),
        ("chain", {"shift": float("nan")}, "shift"),
        ("chain", {"episodes": 3, "files": 4}, "files"),
        ("chain", {"seed": -1}, "seed"),
        # the limit named (2^64 - 1 is a non-negative integer), and a type not called a range
        ("chain", {"seed": 2**64 - 1}, r"--seed must be an integer from 0 to 2\^63 - 1"),
        ("chain", {"gamma": "0.9"}, r"--gamma must be a number in \[0, 1\], got '0.9'"),
        ("chain", {"episode": 10}, "unknown option 'episode'; the options are episodes, "),
        # each was Python's TypeError; overwrite="no" was true
        (["chain"], {}, "unknown environment"),
        ("chain", {"overwrite": "no"}, "overwrite must be True or False"),
        # a NaN true value was written (exit 0); a huge horizon crashed (exit 1) or hung
        (
            "gaussian",
            {"shift": 2500.0, "episodes": 5},
            "--shift 2500 moves gaussian's policies too",
        ),
        ("chain", {"horizon": 10**20}, "--horizon must be a positive integer of at most 10,000"),
        ("gaussian", {"horizon": 10**7 + 1}, "of at most 10,000,000 steps"),
    ],
)
def test_bad_options_are_usage_errors(env, options, match, tmp_path):
    """The Python API's errors are the command line's (OpeError), not Python's."""
    with pytest.raises(UsageError, match=match):
        gen.generate(env, tmp_path, **options)
    assert not (tmp_path / "truth.json").exists()


def test_an_empty_output_folder_is_refused(tmp_path, monkeypatch):
    """generate("chain", "") wrote into the working folder."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError, match="the output folder must be a path, got ''"):
        gen.generate("chain", "", episodes=5)
    assert list(tmp_path.iterdir()) == []


def test_generate_s_api_takes_numpy_numbers_and_refuses_what_is_no_option(tmp_path):
    """An np.int64 --episodes failed in writing truth.json after the logs were written (a
    folder left half written); an np.float32 gamma was "not in [0, 1]"; a folder of None
    and options given by position were Python's TypeErrors."""
    truth = gen.generate(
        "chain", tmp_path / "np", episodes=np.int64(20), seed=np.int64(1), gamma=np.float32(0.5)
    )
    assert (truth["episodes"], truth["gamma"]) == (20, 0.5) and type(truth["episodes"]) is int
    with pytest.raises(UsageError, match="the output folder must be a path"):
        gen.generate("chain", None)
    with pytest.raises(UsageError, match="options must be a GenerateOptions"):
        gen.generate("chain", tmp_path / "positional", 100)


def _chain_monte_carlo(
    env: dict,
    logits: np.ndarray,
    gamma: float,
    horizon: int | None,
    n: int,
    rng: np.random.Generator,
) -> tuple[float, float]:
    """Mean and stderr of the discounted return of n chain episodes (expected rewards)."""
    state = _sample(rng, np.broadcast_to(env["initial"], (n, len(env["initial"]))))
    returns, alive, t = np.zeros(n), np.ones(n, bool), 0
    while alive.any() and t != horizon:
        action = _sample(rng, _softmax(logits[state]))
        returns += alive * gamma**t * env["mean_reward"][state, action]
        alive &= rng.random(n) >= env["terminate"][state, action]
        state = _sample(rng, env["transitions"][state, action])
        t += 1
    return returns.mean(), returns.std(ddof=1) / math.sqrt(n)


@pytest.mark.slow  # statistical: against Monte Carlo
@pytest.mark.parametrize(("gamma", "horizon"), [(1.0, None), (0.9, 8)])
def test_chain_truth_matches_monte_carlo(gamma, horizon, tmp_path):
    truth = gen.generate("chain", tmp_path, episodes=10, gamma=gamma, horizon=horizon)
    env, _ = ENVIRONMENTS["chain"].build(0.5)
    _, policy = _load_policy(tmp_path / "policies" / "eval_0.npz")
    mean, stderr = _chain_monte_carlo(
        env, policy["logits"], gamma, horizon, 30_000, np.random.default_rng(0)
    )
    assert abs(mean - truth["policies"][0]["value"]) < 4 * stderr


@pytest.fixture(scope="module")
def chain_q(tmp_path_factory) -> tuple[Path, dict]:
    """chain at gamma 0.95 without a horizon: (out dir, truth) with the exact Q files."""
    out = tmp_path_factory.mktemp("chain_q")
    return out, gen.generate("chain", out, episodes=10, gamma=0.95)


def test_chain_q_is_exact_and_agrees_with_the_truth(chain_q):
    """V_pi(initial) = initial @ sum_a pi(a|s) Q(s, a) = the truth, and Q solves the Bellman
    equation Q = r + gamma (1 - terminate) P (pi . Q), both to 1e-10."""
    out, truth = chain_q
    env, _ = ENVIRONMENTS["chain"].build(truth["shift"])
    for entry in [truth["behavior"], *truth["policies"]]:
        name = Path(entry["policy"]).name
        assert entry["q"] == f"q/{name}" and (out / entry["q"]).is_file()
        kind, arrays = _load_policy(out / entry["q"])
        # the gamma it is exact for and its policy: ope evaluate refuses another of either;
        # marked exact: dm's interval, which takes Q-hat as exact, is honest with it
        assert kind == "tabular_q"
        assert set(arrays) == {"q", "gamma", "policy_fingerprint", "exact"}
        assert arrays["gamma"] == 0.95 and arrays["exact"].dtype == bool and arrays["exact"]
        own = load_checkpoint(str(out / entry["policy"])).fingerprint()
        assert str(arrays["policy_fingerprint"]) == own
        q = arrays["q"]
        assert q.dtype == np.float64 and q.shape == env["mean_reward"].shape == (10, 3)
        _, policy = _load_policy(out / entry["policy"])
        v = np.sum(_softmax(policy["logits"]) * q, axis=1)  # [S]
        assert env["initial"] @ v == pytest.approx(entry["value"], rel=1e-10, abs=1e-10)
        continuing = 0.95 * (1.0 - env["terminate"]) * (env["transitions"] @ v)  # [S, A]
        np.testing.assert_allclose(q, env["mean_reward"] + continuing, rtol=1e-10, atol=1e-10)
    assert not (out / "policies" / "q").exists()  # 'policies/*.npz' still matches policies only
    assert sorted(p.name for p in (out / "policies").iterdir()) == [
        "eval_0.npz",
        "eval_1.npz",
        "eval_2.npz",
    ]


@pytest.mark.parametrize(("gamma", "code"), [([], 0), (["--gamma", "0.93"], 2)])
def test_the_exact_q_is_refused_under_another_gamma(chain_q, ope_in_process, gamma, code):
    """The declared 0.95 takes it; at 0.93 its dm would estimate the 0.95 value (the QA
    run: dm 2.417 against a true 1.974, 13 of its standard errors off, without a word)."""
    out, _ = chain_q
    args = ["evaluate", out / "logs.parquet", "-p", out / "policies/eval_0.npz"]
    done = ope_in_process([*args, "--q", out / "q/eval_0.npz", "-e", "dm", "-f", "json", *gamma])
    assert done.returncode == code, done
    if code:
        assert done.stdout == "" and "is a Q for gamma 0.95" in done.stderr


def test_exact_qs_given_in_another_order_than_their_policies_are_refused(chain_q, ope_in_process):
    """--q pairs with --policy by position: eval_1's Q beside eval_0 would make eval_0's dm
    eval_1's value without a word."""
    out, _ = chain_q
    policies = ["-p", out / "policies/eval_0.npz", "-p", out / "policies/eval_1.npz"]
    swapped = ["--q", out / "q/eval_1.npz", "--q", out / "q/eval_0.npz"]
    done = ope_in_process(["evaluate", out / "logs.parquet", *policies, *swapped, "-e", "dm"])
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr == (
        f"ope: usage error: --q {out / 'q/eval_1.npz'} is the Q of another policy than "
        f"{out / 'policies/eval_0.npz'}, the --policy it is paired with (it is "
        f"{out / 'policies/eval_1.npz'}'s): give --q once per --policy, in the same order\n"
    )
    # (in order they run: the gamma test above runs eval_0 with its own Q); without dm,
    # any Q serves: dr and wdr stay unbiased with it (a control variate), and every format
    # says it is not the policy's own (it was accepted without a word)
    dr_only = ["-e", "dr", "-e", "wdr", "--gamma", "0.5", "-f", "json"]  # another gamma too
    done = ope_in_process(["evaluate", out / "logs.parquet", *policies, *swapped, *dr_only])
    assert done.returncode == 0, done
    document = json.loads(done.stdout)
    warned = [w for w in document["warnings"] if w["code"] == "q_mismatch"]
    assert [w["policy"] for w in warned] == [str(out / f"policies/eval_{k}.npz") for k in (0, 1)]
    assert "is the Q of another policy than" in warned[0]["message"]
    assert "dr and wdr stay unbiased with any Q-hat" in warned[0]["message"]
    mismatch = document["results"][0]["diagnostics"]["q"]["mismatch"]
    assert mismatch.startswith(f"--q {out / 'q/eval_1.npz'} is the Q of another policy")
    # generate's Q is exact for its own policy and gamma, not for this run's (it said exact)
    assert document["results"][0]["diagnostics"]["q"]["exact"] is False
    own = ["-e", "dr", "--gamma", "0.95", "-f", "json"]  # its own Q, its own gamma: no word
    ordered = ["--q", out / "q/eval_0.npz", "--q", out / "q/eval_1.npz"]
    done = ope_in_process(["evaluate", out / "logs.parquet", *policies, *ordered, *own])
    assert not [w for w in json.loads(done.stdout)["warnings"] if w["code"] == "q_mismatch"]
    assert json.loads(done.stdout)["results"][0]["diagnostics"]["q"]["exact"] is True
    other_gamma = ["-e", "dr", "--gamma", "0.5", "-f", "json"]  # its own Q, for 0.95
    done = ope_in_process(["evaluate", out / "logs.parquet", *policies, *ordered, *other_gamma])
    warned = [w for w in json.loads(done.stdout)["warnings"] if w["code"] == "q_mismatch"]
    assert len(warned) == 2 and "is a Q for gamma 0.95, but this run" in warned[0]["message"]


@pytest.mark.slow  # statistical, on large generated logs
def test_chain_q_matches_the_simulated_transitions(on_policy):
    """On the JAX simulator's logs (shift 0, gamma 1), the TD error r_t + V(s_t+1) - Q(s_t, a_t)
    (V(s_T) = 0 after the last step) has mean 0 for every (state, action) seen 50+ times."""
    out, truth = on_policy["chain"]
    table = pq.read_table(out / "logs.parquet").to_pydict()
    episode, obs, action = (np.asarray(table[k]) for k in ("episode_id", "observation", "action"))
    reward = np.asarray(table["reward"])
    q = _load_policy(out / truth["policies"][0]["q"])[1]["q"]
    _, policy = _load_policy(out / truth["policies"][0]["policy"])
    v = np.sum(_softmax(policy["logits"]) * q, axis=1)
    continues = np.r_[episode[1:] == episode[:-1], False]  # the next row is the same episode
    next_v = np.where(continues, v[np.r_[obs[1:], 0]], 0.0)
    td = reward + next_v - q[obs, action]  # [steps]
    cell = obs * q.shape[1] + action
    counts = np.bincount(cell, minlength=q.size)
    sums, squares = (np.bincount(cell, x, minlength=q.size) for x in (td, td**2))
    seen = counts >= 50
    mean = sums[seen] / counts[seen]
    stderr = np.sqrt((squares[seen] / counts[seen] - mean**2) / counts[seen])
    assert seen.sum() >= 15 and np.all(np.abs(mean) < 4.5 * stderr)


def test_no_q_where_it_is_not_exact(chain_q, tmp_path):
    """A horizon makes chain's Q depend on time, and the other environments have no tabular
    states: "q" is null and no file is written (an earlier run's is removed)."""
    out, _ = chain_q
    capped = gen.generate("chain", tmp_path / "capped", episodes=10, gamma=0.95, horizon=8)
    bandit = gen.generate("bandit", tmp_path / "bandit", episodes=10)
    for truth in (capped, bandit):
        assert all(e["q"] is None for e in [truth["behavior"], *truth["policies"]])
    assert not (tmp_path / "capped" / "q").exists() and not (tmp_path / "bandit" / "q").exists()

    rerun = tmp_path / "rerun"
    gen.generate("chain", rerun, episodes=10)
    assert len(list((rerun / "q").glob("*.npz"))) == 4
    gen.generate("chain", rerun, episodes=10, horizon=8, overwrite=True)
    assert list((rerun / "q").glob("*.npz")) == []
    assert ENVIRONMENTS["control"].q_truth is None and ENVIRONMENTS["gaussian"].q_truth is None


def test_bandit_truth_matches_monte_carlo(tmp_path):
    truth = gen.generate("bandit", tmp_path, episodes=10)
    env, _ = ENVIRONMENTS["bandit"].build(0.5)
    rng, n = np.random.default_rng(1), 100_000
    for entry in truth["policies"]:
        _, policy = _load_policy(tmp_path / entry["policy"])
        x = env["contexts"][rng.integers(len(env["contexts"]), size=n)]
        action = _sample(rng, _softmax(x @ policy["weight"] + policy["bias"]))
        click = 1 / (
            1 + np.exp(-(x @ env["reward_weight"] + env["reward_bias"])[np.arange(n), action])
        )
        reward = (rng.random(n) < click).astype(float)
        assert abs(reward.mean() - entry["value"]) < 4 * reward.std() / math.sqrt(n)


def test_gaussian_truth_matches_monte_carlo(tmp_path):
    truth = gen.generate("gaussian", tmp_path, episodes=10, gamma=0.95)
    env, _ = ENVIRONMENTS["gaussian"].build(0.5)
    rng, n = np.random.default_rng(2), 50_000
    for entry in truth["policies"]:
        _, policy = _load_policy(tmp_path / entry["policy"])
        obs, returns = rng.normal(size=(n, 3)), np.zeros(n)
        for t in range(truth["horizon"]):
            action = (
                obs @ policy["weight"]
                + policy["bias"]
                + np.exp(policy["log_std"]) * rng.normal(size=(n, 2))
            )
            returns -= 0.95**t * np.sum((action - obs @ env["gain"] - env["offset"]) ** 2, axis=1)
            obs = (
                obs @ env["dynamics"]
                + action @ env["control"]
                + env["state_noise"] * rng.normal(size=(n, 3))
            )
        assert abs(returns.mean() - entry["value"]) < 4 * returns.std() / math.sqrt(n)


@pytest.mark.slow  # statistical, on large generated logs
@pytest.mark.parametrize("env", gen.ENVIRONMENTS)
def test_on_policy_mean_return_matches_truth(env, on_policy):
    out, truth = on_policy[env]
    table = pq.read_table(out / "logs.parquet", columns=["episode_id", "reward"])
    returns = np.bincount(table["episode_id"].to_numpy(), table["reward"].to_numpy())  # gamma = 1
    stderr = math.hypot(
        returns.std(ddof=1) / math.sqrt(len(returns)), truth["policies"][0]["stderr"]
    )
    for entry in [
        truth["behavior"],
        *truth["policies"],
    ]:  # shift 0: every policy is the behavior policy
        assert entry["value"] == pytest.approx(truth["behavior"]["value"], rel=1e-12)
    assert abs(returns.mean() - truth["policies"][0]["value"]) < 4 * stderr


@pytest.mark.slow  # statistical, on large generated logs
def test_control_lengths_are_long_tailed(on_policy):
    out, truth = on_policy["control"]
    episode = pq.read_table(out / "logs.parquet", columns=["episode_id"])["episode_id"].to_numpy()
    lengths = np.bincount(episode)
    assert len(lengths) == CONTROL_EPISODES and lengths.min() >= 1
    assert lengths.max() == truth["horizon"] == 1000 == truth["max_length"]
    assert np.median(lengths) <= 20 and np.mean(lengths) < 100
    assert truth["policies"][0]["method"].startswith("monte carlo (")
    assert 0 < truth["policies"][0]["stderr"] < 0.1


def test_truth_ranks_checkpoints(tmp_path):
    """eval_0 (shift) beats eval_1 (shift / 2) beats the behavior policy beats eval_2 (-shift)."""
    for env in ("bandit", "chain", "gaussian"):
        truth = gen.generate(env, tmp_path / env, episodes=10)
        eval_0, eval_1, eval_2 = (p["value"] for p in truth["policies"])
        assert eval_0 > eval_1 > truth["behavior"]["value"] > eval_2


def test_registry_holds_one_record_per_environment():
    assert tuple(ENVIRONMENTS) == gen.ENVIRONMENTS == ("bandit", "chain", "control", "gaussian")
    for name, environment in ENVIRONMENTS.items():
        assert environment.name == name
        assert environment.kind in POLICY_KEYS
        _, policies = environment.build(0.5)
        assert len(policies) == 4  # behavior, eval_0, eval_1, eval_2
        assert set(policies[0]) | {"kind"} == POLICY_KEYS[environment.kind]


# --policies K: many evaluation policies for selection studies


def _fast(env: str) -> dict:
    """Options for a quick run: few episodes, and a short horizon for control (its truth)."""
    return {"episodes": 20, "horizon": 50 if env == "control" else None}


@pytest.fixture
def tiny_control_truth(monkeypatch):
    """control's Monte Carlo truth on 1,024 episodes: enough for tests of the files and of
    the order of the values, which the policies' shared random numbers keep."""
    from ope_cli.envs import control

    monkeypatch.setattr(control, "CONTROL_TRUTH_EPISODES", 1 << 10)
    monkeypatch.setattr(control, "CONTROL_TRUTH_CONTINUED", 1 << 7)


def test_policy_scales_spread_from_worse_to_better():
    assert policy_scales(1) == (1.0,) and policy_scales(2) == (1.0, -1.0)
    assert policy_scales(3) == policy_scales() == (1.0, 0.5, -1.0)  # the default's checkpoints
    scales = np.array(policy_scales(100))
    assert scales[0] == 1.0 and scales[-1] == -1.0 and np.all(np.diff(scales) < 0)
    assert np.sum(scales < 0) == 33  # a third worse than the behavior policy
    assert gen.policy_paths(3) == [f"policies/eval_{k}.npz" for k in range(3)]
    assert gen.policy_paths(10)[-1] == "policies/eval_9.npz"
    assert gen.policy_paths(11)[:2] == ["policies/eval_00.npz", "policies/eval_01.npz"]
    assert gen.policy_paths(1000)[-1] == "policies/eval_999.npz"


@pytest.mark.usefixtures("tiny_control_truth")
@pytest.mark.parametrize("env", gen.ENVIRONMENTS)
def test_k_policies_spread_around_the_behavior_policy(env, tmp_path):
    truth = gen.generate(env, tmp_path, policies=5, **_fast(env))
    names = [f"eval_{k}.npz" for k in range(5)]
    assert [p["policy"] for p in truth["policies"]] == [f"policies/{n}" for n in names]
    assert sorted(p.name for p in (tmp_path / "policies").iterdir()) == names
    values = [p["value"] for p in truth["policies"]]
    assert values == sorted(values, reverse=True)  # eval_0 the best, as the scales fall
    assert min(values) < truth["behavior"]["value"] < max(values)
    assert json.loads((tmp_path / "truth.json").read_text()) == truth
    kind, _ = _load_policy(tmp_path / "behavior.npz")
    for name in names:
        assert _load_policy(tmp_path / "policies" / name)[0] == kind
    if env == "chain":
        assert [p["q"] for p in truth["policies"]] == [f"q/{n}" for n in names]
        assert sorted(p.name for p in (tmp_path / "q").iterdir()) == ["behavior.npz", *names]


@pytest.mark.usefixtures("tiny_control_truth")
@pytest.mark.parametrize(
    "env",
    [  # control's two Monte Carlo truths take a few seconds
        pytest.param(env, marks=pytest.mark.slow) if env == "control" else env
        for env in gen.ENVIRONMENTS
    ],
)
def test_three_policies_are_the_default_byte_for_byte(env, tmp_path):
    default = gen.generate(env, tmp_path / "default", **_fast(env))
    three = gen.generate(env, tmp_path / "three", policies=3, **_fast(env))
    assert three == default
    files = sorted(p.relative_to(tmp_path / "default") for p in (tmp_path / "default").rglob("*"))
    assert files == sorted(
        p.relative_to(tmp_path / "three") for p in (tmp_path / "three").rglob("*")
    )
    for name in files:
        if (tmp_path / "default" / name).is_file():
            assert (tmp_path / "default" / name).read_bytes() == (
                tmp_path / "three" / name
            ).read_bytes(), name


def test_one_policy_is_the_default_best(tmp_path):
    one = gen.generate("chain", tmp_path / "one", episodes=5, policies=1)
    default = gen.generate("chain", tmp_path / "default", episodes=5)
    assert one["policies"] == default["policies"][:1]
    assert sorted(p.name for p in (tmp_path / "one" / "policies").iterdir()) == ["eval_0.npz"]
    assert one["policies"][0]["value"] > one["behavior"]["value"]


def test_a_policy_truth_does_not_depend_on_how_many(tmp_path):
    """The batched exact truths give each policy the bits it has alone: eval_0 (scale 1) and
    the last one (scale -1) of 12 policies are the default's eval_0 and eval_2."""
    for env in ("bandit", "chain", "gaussian"):
        many = gen.generate(env, tmp_path / env, episodes=5, policies=12)
        default = gen.generate(env, tmp_path / f"{env}-default", episodes=5)
        ends = [many["policies"][0]["value"], many["policies"][-1]["value"]]
        assert ends == [default["policies"][0]["value"], default["policies"][2]["value"]]
        assert many["behavior"] == default["behavior"]


def test_fewer_policies_over_more_leave_no_stale_files(tmp_path):
    gen.generate("chain", tmp_path, episodes=5, policies=12)
    assert len(list((tmp_path / "policies").glob("*.npz"))) == 12
    gen.generate("chain", tmp_path, episodes=5, overwrite=True)
    expected = ["eval_0.npz", "eval_1.npz", "eval_2.npz"]
    assert sorted(p.name for p in (tmp_path / "policies").iterdir()) == expected
    assert sorted(p.name for p in (tmp_path / "q").iterdir()) == ["behavior.npz", *expected]


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("files", [1, 3])
def test_an_interrupted_overwrite_leaves_the_earlier_run_as_it_was(files, tmp_path, monkeypatch):
    """Interrupted after the logs were written, an --overwrite left the new logs beside the
    old truth.json and policies (evaluate --truth took them without a word); the new run
    writes into a hidden folder and replaces the earlier files only once it is done."""
    gen.generate("chain", tmp_path, episodes=20, files=files)
    before = _snapshot(tmp_path)

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(gen, "_write_policies", interrupted)
    with pytest.raises(KeyboardInterrupt):
        gen.generate("chain", tmp_path, episodes=30, seed=1, files=files, overwrite=True)
    assert _snapshot(tmp_path) == before
    assert not list(tmp_path.glob(f"{gen.STAGING_PREFIX}*"))


def test_a_commit_that_fails_half_way_leaves_no_truth_beside_mixed_files(tmp_path, monkeypatch):
    """The earlier truth.json goes before any file is replaced and the new one comes last:
    a disk that fills half way through leaves files of two runs but no truth.json to
    score them against, and the error names the file's place, not the hidden folder."""
    gen.generate("chain", tmp_path, episodes=20)
    replace = gen.os.replace

    def full_disk(source, target):
        if Path(source).name == "eval_1.npz":
            raise OSError(28, "No space left on device", str(source))
        return replace(source, target)

    monkeypatch.setattr(gen.os, "replace", full_disk)
    with pytest.raises(UsageError) as raised:
        gen.generate("chain", tmp_path, episodes=30, seed=1, overwrite=True)
    expected = f"{tmp_path / 'policies' / 'eval_1.npz'}: cannot write the output (No space"
    assert str(raised.value).startswith(expected), raised.value
    assert not (tmp_path / "truth.json").exists()
    assert not list(tmp_path.glob(f"{gen.STAGING_PREFIX}*"))


@pytest.mark.parametrize("in_the_way", ["q", "q-dangling", "logs.parquet"])
def test_a_path_in_the_way_stops_an_overwrite_before_it_replaces_anything(tmp_path, in_the_way):
    """A file (or a link to nothing) where a folder goes (OUT/q), or a folder where a file
    goes: the commit met it half way, after the earlier truth.json was gone and the new
    logs in place (exit 2, the earlier run destroyed); it is checked before anything moves."""
    gen.generate("chain", tmp_path, episodes=20)
    target = tmp_path / in_the_way.removesuffix("-dangling")
    if in_the_way == "q":
        shutil.rmtree(target)
        target.touch()
    elif in_the_way == "q-dangling":
        shutil.rmtree(target)
        target.symlink_to(tmp_path / "nowhere")
    else:
        target.unlink()
        target.mkdir()
    before = _snapshot(tmp_path)
    with pytest.raises(UsageError, match=rf"{target.name}: cannot write the output"):
        gen.generate("chain", tmp_path, episodes=30, seed=1, overwrite=True)
    assert _snapshot(tmp_path) == before
    assert not list(tmp_path.glob(f"{gen.STAGING_PREFIX}*"))


def test_a_folder_where_a_file_goes_is_an_error_and_stays_as_it_is(tmp_path):
    """OUT/logs.parquet a folder of the user's: --overwrite said it replaced the logs and
    put them inside it, beside the user's files; it is an error, and the folder stays."""
    (tmp_path / "logs.parquet").mkdir()
    (tmp_path / "logs.parquet" / "mine.txt").write_text("kept")
    with pytest.raises(UsageError, match=r"logs\.parquet: cannot write the output"):
        gen.generate("chain", tmp_path, episodes=5, overwrite=True)
    assert [p.name for p in (tmp_path / "logs.parquet").iterdir()] == ["mine.txt"]
    assert not (tmp_path / "truth.json").exists()


def test_an_interrupted_first_run_leaves_no_folder_to_refuse_the_next(tmp_path, monkeypatch):
    """An interrupted run left OUT and OUT/policies behind, and the same command then
    refused them (they "already exist"); the folder it made goes with it."""

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(gen, "_write_policies", interrupted)
    with pytest.raises(KeyboardInterrupt):
        gen.generate("chain", tmp_path / "out", episodes=5)
    assert not (tmp_path / "out").exists()
    monkeypatch.undo()
    truth = gen.generate("chain", tmp_path / "out", episodes=5)
    assert truth["episodes"] == 5 and (tmp_path / "out" / "truth.json").is_file()
    assert not list((tmp_path / "out").glob(".*"))


def test_chain_truth_of_a_new_policy_matches_monte_carlo(tmp_path):
    """eval_3 of 5 (scale -1/4, not one of the default's) against rollouts of it."""
    truth = gen.generate("chain", tmp_path, episodes=5, gamma=0.95, policies=5)
    env, _ = ENVIRONMENTS["chain"].build(truth["shift"])
    _, policy = _load_policy(tmp_path / "policies" / "eval_3.npz")
    mean, stderr = _chain_monte_carlo(
        env, policy["logits"], 0.95, None, 15_000, np.random.default_rng(4)
    )
    assert abs(mean - truth["policies"][3]["value"]) < 4 * stderr


@pytest.mark.parametrize("policies", [0, -1, 1001, True, 2.5, "3"])
def test_bad_policies_raise_value_error(policies, tmp_path):
    with pytest.raises(UsageError, match="policies must be an integer from 1 to 1000"):
        gen.generate("chain", tmp_path / "out", episodes=5, policies=policies)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("0", "policies must be an integer from 1 to 1000, got 0"),
        ("-1", "policies must be an integer from 1 to 1000, got -1"),
        ("x", "--policies takes a whole number (an integer), got 'x'"),
    ],
)
def test_bad_policies_are_a_usage_error(value, message, tmp_path, ope_in_process):
    run = ope_in_process(
        ["generate", "chain", "out", "--episodes", "5", f"--policies={value}"], cwd=tmp_path
    )
    assert run.returncode == 2, run
    assert run.stdout == "" and run.stderr.count("\n") == 1, run
    assert run.stderr.startswith("ope: usage error: ") and message in run.stderr, run
    assert not (tmp_path / "out").exists()


@pytest.mark.slow  # a process start: imports and JAX
def test_bad_policies_exit_2_from_the_entry_point(tmp_path, ope):
    run = ope(["generate", "chain", "out", "--policies", "0"], cwd=tmp_path)
    assert run.returncode == 2 and run.stdout == "", run
    assert (
        run.stderr.strip()
        == "ope: usage error: --policies must be an integer from 1 to 1000, got 0"
    )


def test_the_cli_defaults_are_the_library_s():
    """cli/generate.py spells them out so that --help need not import JAX."""
    from ope_cli.cli import generate as command
    from ope_cli.envs import base

    assert (command.DEFAULT_POLICIES, command.MAX_POLICIES) == (
        base.DEFAULT_POLICIES,
        base.MAX_POLICIES,
    )


def test_an_output_that_cannot_be_written_is_a_usage_error(tmp_path):
    """Through the API an output under a file raised Python's NotADirectoryError (the
    command line alone turned it into its usage error line)."""
    (tmp_path / "afile").write_text("")
    with pytest.raises(UsageError, match="cannot write the output"):
        gen.generate("chain", tmp_path / "afile" / "sub", episodes=10)


def test_an_abandoned_hidden_folder_goes_with_the_next_run(tmp_path):
    """A run killed outright (or by a signal while JAX imported a module, with no cleaning
    up) left its hidden folder for good; the next run removes the folders of this
    machine's processes that are gone (not a live one's, nor another machine's, whose
    processes it cannot see, nor an odd name's), and an earlier run's emptied logs/ and
    q/ folders (which refused the next run without --overwrite)."""
    import socket

    gen.generate("chain", tmp_path, episodes=5, files=3)
    child = subprocess.Popen(["true"])  # a process that is gone
    child.wait()
    host = socket.gethostname()
    abandoned = tmp_path / f"{gen.STAGING_PREFIX}{child.pid}@{host}@x1y2"
    (abandoned / "policies").mkdir(parents=True)
    kept = [
        tmp_path / f"{gen.STAGING_PREFIX}{os.getpid()}@{host}@x3y4",  # a live process's
        tmp_path / f"{gen.STAGING_PREFIX}{child.pid}@{host}-2@x5y6",  # another machine's
        tmp_path / f"{gen.STAGING_PREFIX}99999999999999999999@{host}@x7",  # no pid
        tmp_path / f"{gen.STAGING_PREFIX}\u00b2@{host}@x8",  # a digit int() refuses
    ]
    for folder in kept:
        folder.mkdir()
    gen.generate("bandit", tmp_path, episodes=5, overwrite=True)
    assert not abandoned.exists() and all(folder.exists() for folder in kept)
    assert not (tmp_path / "logs").exists() and not (tmp_path / "q").exists()


def test_a_discount_of_minus_zero_is_written_as_zero(tmp_path):
    """``--gamma -0`` wrote -0.0 into truth.json and the logs' metadata ("declares -0")."""
    truth = gen.generate("bandit", tmp_path, episodes=20, gamma=-0.0)
    declared = json.loads(pq.read_schema(tmp_path / "logs.parquet").metadata[b"ope"])
    written = json.loads((tmp_path / "truth.json").read_text())
    assert [str(x) for x in (truth["gamma"], declared["gamma"], written["gamma"])] == ["0.0"] * 3


def test_none_for_an_option_that_takes_none_is_its_default(tmp_path):
    """generate(seed=None) was refused ("--seed must be an integer ..., got None") where
    evaluate's keywords read None as the option's default."""
    given = gen.generate("bandit", tmp_path / "a", episodes=20, seed=None, gamma=None)
    default = gen.generate("bandit", tmp_path / "b", episodes=20)
    assert given == default and given["seed"] == gen.GenerateOptions().seed
    with pytest.raises(UsageError, match="episodes"):
        gen.generate("bandit", tmp_path / "c", episodes=0)
