"""The reference implementation (tests/reference.py) against closed-form and exact cases."""

from __future__ import annotations

import math
from decimal import Decimal, localcontext
from fractions import Fraction

import numpy as np
import pyarrow.parquet as pq
import pytest
from datasets import (
    KINDS,
    load_checkpoint,
    random_checkpoint,
    random_episodes,
    save_checkpoint,
    to_reference_input,
    write_episode_layout,
    write_step_layout,
)
from reference import (
    reference_dr_estimates,
    reference_dr_stderr,
    reference_estimates,
    reference_log_prob,
    reference_stderr,
)


def episode(target_probs, behavior_probs, rewards) -> dict[str, np.ndarray]:
    """An episode from per-step probabilities (0 allowed for the target)."""
    with np.errstate(divide="ignore"):
        return {
            "log_target": np.log(np.asarray(target_probs, dtype=np.float64)),
            "log_behavior": np.log(np.asarray(behavior_probs, dtype=np.float64)),
            "reward": np.asarray(rewards, dtype=np.float64),
        }


# Episode A: ratios (2, 0.5) -> W = (2, 1), rewards (1, 2).
# Episode B: ratio 0.5 -> W = (0.5,), reward 3.
HAND = [episode([0.5, 0.25], [0.25, 0.5], [1.0, 2.0]), episode([0.25], [0.5], [3.0])]


def prefixed(episodes, log_ratio: float, steps: int = 2000):
    """Prepend ``steps`` zero-reward steps of log ratio ``log_ratio`` to every episode:
    every weight is multiplied by exp(steps * log_ratio), which over/underflows float64."""
    out = []
    for ep in episodes:
        log_b = np.full(steps, math.log(0.5))
        out.append(
            {
                "log_target": np.concatenate([log_b + log_ratio, ep["log_target"]]),
                "log_behavior": np.concatenate([log_b, ep["log_behavior"]]),
                "reward": np.concatenate([np.zeros(steps), ep["reward"]]),
            }
        )
    return out


def test_hand_example_gamma_09():
    g = Fraction(9, 10)
    ret_a, ret_b = 1 + g * 2, Fraction(3)  # 2.8, 3
    expected = {
        "is": (1 * ret_a + Fraction(1, 2) * ret_b) / 2,  # 2.15
        "wis": (1 * ret_a + Fraction(1, 2) * ret_b) / Fraction(3, 2),  # 43/15
        "pdis": ((2 * 1 + g * 1 * 2) + Fraction(1, 2) * 3) / 2,  # 2.65
        # t=0: weights (2, 0.5); t=1: weights (1, 0.5 absorbed) and B's reward is 0
        "wpdis": Fraction(2 * 1 + Fraction(1, 2) * 3, Fraction(5, 2))
        + g * Fraction(1 * 2, Fraction(3, 2)),  # 2.6
        "ess": Fraction(9, 4) / Fraction(5, 4),
        "ess_fraction": Fraction(9, 10),
        "mean_weight": Fraction(3, 4),
        "max_weight": 1,
        "max_weight_share": Fraction(2, 3),
        "zero_weight_fraction": 0,
    }
    got = reference_estimates(HAND, 0.9)
    assert got == pytest.approx({k: float(v) for k, v in expected.items()}, rel=1e-12)

    wis = expected["wis"]
    wis_var = 1 * (ret_a - wis) ** 2 + Fraction(1, 4) * (ret_b - wis) ** 2
    stderr = reference_stderr(HAND, 0.9)
    assert stderr == pytest.approx(
        {"is": 0.65, "pdis": 1.15, "wis": math.sqrt(wis_var) / 1.5}, rel=1e-12
    )


def test_on_policy_all_estimators_are_the_mean_return():
    rng = np.random.default_rng(1)
    episodes = []
    for length in (1, 3, 7, 2):
        log_p = np.log(rng.uniform(0.1, 1.0, size=length))
        episodes.append(
            {"log_target": log_p, "log_behavior": log_p.copy(), "reward": rng.normal(size=length)}
        )
    gamma = 0.95
    mean_return = np.mean([ep["reward"] @ gamma ** np.arange(len(ep["reward"])) for ep in episodes])
    got = reference_estimates(episodes, gamma)
    for name in ("is", "wis", "pdis", "wpdis"):
        assert got[name] == pytest.approx(mean_return, rel=1e-12)
    assert got["ess"] == pytest.approx(4.0)
    assert got["mean_weight"] == got["max_weight"] == 1.0
    assert got["max_weight_share"] == pytest.approx(0.25)


def test_on_policy_random_checkpoint_episodes():
    rng = np.random.default_rng(2)
    behavior = random_checkpoint("mlp_softmax", rng, activation="relu")
    episodes = random_episodes(rng, 30, behavior=behavior, max_length=50)
    ref = to_reference_input(episodes, behavior)
    mean_return = np.mean([ep["reward"].sum() for ep in episodes])
    got = reference_estimates(ref, 1.0)
    for name in ("is", "wis", "pdis", "wpdis"):
        assert got[name] == pytest.approx(mean_return, rel=1e-12)


def test_single_episode_weighted_estimators_give_its_return():
    ep = episode([0.9, 0.1, 0.3], [0.2, 0.6, 0.5], [1.0, -2.0, 0.5])
    got = reference_estimates([ep], 0.8)
    ret = 1.0 - 0.8 * 2.0 + 0.64 * 0.5
    assert got["wis"] == pytest.approx(ret, rel=1e-12)
    assert got["wpdis"] == pytest.approx(ret, rel=1e-12)
    assert got["ess"] == pytest.approx(1.0)
    assert reference_stderr([ep], 0.8)["is"] is None  # ddof=1 needs two episodes


@pytest.mark.parametrize("log_ratio", [0.5, -0.5])
def test_scaled_hand_example_over_and_underflow(log_ratio):
    """2000 extra steps multiply every weight by exp(+-1000): WIS/WPDIS are unchanged."""
    small = reference_estimates(HAND, 1.0)
    big = reference_estimates(prefixed(HAND, log_ratio), 1.0)
    for name in ("wis", "wpdis", "ess", "ess_fraction", "max_weight_share"):
        assert big[name] == pytest.approx(small[name], rel=1e-9), name
    assert big["wis"] == pytest.approx(3.0, rel=1e-9)  # gamma=1: both returns are 3
    assert big["wpdis"] == pytest.approx(3.5 / 2.5 + 2.0 / 1.5, rel=1e-9)
    assert reference_stderr(prefixed(HAND, log_ratio), 1.0)["wis"] == pytest.approx(
        reference_stderr(HAND, 1.0)["wis"], rel=1e-9, abs=1e-12
    )
    if log_ratio > 0:  # exp(1000) is not a float64
        for name in ("is", "pdis", "mean_weight", "max_weight"):
            assert big[name] is None, name
    else:  # exp(-1000) rounds to 0.0
        for name in ("is", "pdis", "mean_weight", "max_weight"):
            assert big[name] == 0.0, name
        assert big["zero_weight_fraction"] == 0.0  # underflow is not a zero weight


def decimal_estimates(episodes, gamma: float) -> dict[str, float]:
    """WIS, WPDIS, ESS and max-weight share computed in 60-digit decimal arithmetic."""
    with localcontext() as ctx:
        ctx.prec = 60
        g = Decimal(gamma)
        weights, rewards = [], []  # per episode, per step
        for ep in episodes:
            log_w, w = Decimal(0), []
            for lt, lb in zip(ep["log_target"], ep["log_behavior"], strict=True):
                log_w += Decimal(float(lt)) - Decimal(float(lb))
                w.append(log_w.exp())
            weights.append(w)
            rewards.append([Decimal(float(r)) for r in ep["reward"]])
        final = [w[-1] for w in weights]
        returns = [sum(r * g**t for t, r in enumerate(rs)) for rs in rewards]
        wpdis = Decimal(0)
        for t in range(max(len(w) for w in weights)):
            w_t = [w[min(t, len(w) - 1)] for w in weights]  # absorbing
            r_t = [rs[t] if t < len(rs) else Decimal(0) for rs in rewards]
            wpdis += g**t * sum(a * b for a, b in zip(w_t, r_t, strict=True)) / sum(w_t)
        return {
            "wis": float(sum(w * r for w, r in zip(final, returns, strict=True)) / sum(final)),
            "wpdis": float(wpdis),
            "ess": float(sum(final) ** 2 / sum(w * w for w in final)),
            "max_weight_share": float(max(final) / sum(final)),
        }


@pytest.mark.parametrize("drift", [0.5, -0.5])
def test_long_episodes_match_exact_decimal(drift):
    """~2000 steps of log ratio ~ +-0.5: naive products overflow/underflow float64."""
    rng = np.random.default_rng(3)
    episodes = []
    for length in (2000, 1990, 1998, 2000):
        log_b = np.log(rng.uniform(0.05, 1.0, size=length))
        log_ratio = drift + 0.05 * rng.normal(size=length)
        episodes.append(
            {
                "log_target": log_b + log_ratio,
                "log_behavior": log_b,
                "reward": rng.normal(1.0, 1.0, size=length),
            }
        )
    gamma = 0.999
    with np.errstate(over="ignore", under="ignore"):
        naive = [np.prod(np.exp(ep["log_target"] - ep["log_behavior"])) for ep in episodes]
    # inf, or stuck at the smallest subnormal (5e-324 * 0.6 rounds back to 5e-324)
    assert all(not np.finfo(np.float64).tiny < w < np.inf for w in naive)

    got = reference_estimates(episodes, gamma)
    expected = decimal_estimates(episodes, gamma)
    assert {k: got[k] for k in expected} == pytest.approx(expected, rel=1e-8)
    assert (got["is"] is None) == (drift > 0)


def test_zero_weights():
    alive = episode([0.5, 0.5], [0.5, 0.25], [1.0, 1.0])  # W = (1, 2), G = 2
    dead = episode([0.5, 0.0], [0.5, 0.5], [5.0, 5.0])  # W = (1, 0), G = 10
    got = reference_estimates([alive, dead], 1.0)
    assert got["zero_weight_fraction"] == 0.5
    assert got["wis"] == pytest.approx(2.0)
    assert got["is"] == pytest.approx(2.0)
    assert got["pdis"] == pytest.approx((1 + 2 + 5) / 2)
    assert got["wpdis"] == pytest.approx((1 + 5) / 2 + 2 / 2)
    assert got["ess"] == pytest.approx(1.0)

    all_dead = reference_estimates([dead, dead], 1.0)
    assert all_dead["is"] == 0.0
    for name in ("wis", "wpdis", "ess", "ess_fraction", "max_weight_share"):
        assert all_dead[name] is None, name
    assert all_dead["zero_weight_fraction"] == 1.0
    assert reference_stderr([dead, dead], 1.0)["wis"] is None


# ------------------------------------------------------------------------ log-probs


def softmax_prob(logits: list[float], a: int) -> float:
    return math.exp(logits[a]) / sum(math.exp(x) for x in logits)


def test_tabular_log_prob():
    ckpt = {"kind": "tabular", "logits": np.log(np.array([[1.0, 3.0], [2.0, 1.0]]))}
    got = reference_log_prob(ckpt, np.array([0, 1, 0]), np.array([1, 0, 0]))
    np.testing.assert_allclose(np.exp(got), [3 / 4, 2 / 3, 1 / 4], rtol=1e-12)


def test_log_softmax_is_stable():
    ckpt = {"kind": "tabular", "logits": np.array([[1000.0, 0.0, -1000.0]])}
    got = reference_log_prob(ckpt, np.array([0, 0, 0]), np.array([0, 1, 2]))
    np.testing.assert_allclose(got, [0.0, -1000.0, -2000.0], atol=1e-9)


def test_linear_softmax_log_prob_with_temperature():
    rng = np.random.default_rng(4)
    ckpt = random_checkpoint("linear_softmax", rng, obs_dim=3, n_actions=5, temperature=2.5)
    obs, action = rng.normal(size=(6, 3)), rng.integers(0, 5, size=6)
    w, b = ckpt["weight"], ckpt["bias"]
    for t in range(6):
        logits = [(sum(obs[t, d] * w[d, j] for d in range(3)) + b[j]) / 2.5 for j in range(5)]
        expected = math.log(softmax_prob(logits, action[t]))
        assert reference_log_prob(ckpt, obs[t : t + 1], action[t : t + 1])[0] == pytest.approx(
            expected, rel=1e-12
        )


@pytest.mark.parametrize("activation", ["tanh", "relu", None])
def test_mlp_softmax_log_prob(activation):
    rng = np.random.default_rng(5)
    ckpt = random_checkpoint(
        "mlp_softmax", rng, obs_dim=3, n_actions=4, hidden=(5, 6), activation=activation
    )
    act = {"relu": lambda x: max(x, 0.0)}.get(activation, math.tanh)
    obs, action = rng.normal(size=(4, 3)), rng.integers(0, 4, size=4)
    got = reference_log_prob(ckpt, obs, action)
    for t in range(4):
        h = list(obs[t])
        for k in range(3):
            w, b = ckpt[f"weight_{k}"], ckpt[f"bias_{k}"]
            h = [sum(h[i] * w[i, j] for i in range(len(h))) + b[j] for j in range(w.shape[1])]
            if k < 2:
                h = [act(x) for x in h]
        assert got[t] == pytest.approx(math.log(softmax_prob(h, action[t])), rel=1e-12)


def test_linear_gaussian_log_prob():
    ckpt = {
        "kind": "linear_gaussian",
        "weight": np.array([[1.0, 0.0], [0.5, -1.0]]),
        "bias": np.array([0.1, -0.2]),
        "log_std": np.log(np.array([0.5, 2.0])),
    }
    obs, action = np.array([[1.0, 2.0]]), np.array([[2.0, -3.0]])
    mean, std = [1.0 + 1.0 + 0.1, -2.0 - 0.2], [0.5, 2.0]
    density = 1.0
    for j in range(2):
        density *= math.exp(-0.5 * ((action[0, j] - mean[j]) / std[j]) ** 2) / (
            std[j] * math.sqrt(2 * math.pi)
        )
    assert reference_log_prob(ckpt, obs, action)[0] == pytest.approx(math.log(density), rel=1e-12)


# ------------------------------------------------------------------------- datasets


@pytest.mark.parametrize("kind", KINDS)
def test_checkpoint_roundtrip_and_layouts(kind, tmp_path):
    rng = np.random.default_rng(6)
    ckpt = random_checkpoint(kind, rng, activation="relu" if kind == "mlp_softmax" else None)
    loaded = load_checkpoint(save_checkpoint(tmp_path / "p.npz", ckpt))
    assert loaded.keys() == ckpt.keys() and loaded["kind"] == kind
    with np.load(tmp_path / "p.npz", allow_pickle=False) as raw:
        assert raw["kind"].shape == () and str(raw["kind"]) == kind

    episodes = random_episodes(rng, 40, kind=kind, max_length=30)
    for ep in episodes:
        assert np.all(np.isfinite(ep["behavior_log_prob"]))
        if kind != "linear_gaussian":
            assert np.all((ep["behavior_prob"] > 0) & (ep["behavior_prob"] <= 1))
    a = reference_estimates(to_reference_input(episodes, loaded), 0.9)
    b = reference_estimates(to_reference_input(episodes, ckpt), 0.9)
    assert a == b

    out = write_step_layout(
        episodes,
        tmp_path / "steps",
        n_files=3,
        id_type=str,
        shuffle_steps_within_episode=True,
        obs_type="fixed_size_list",
    )
    seen: set[str] = set()
    for f in sorted(out.iterdir()):
        ids = set(pq.read_table(f, columns=["episode_id"]).column(0).to_pylist())
        assert not ids & seen  # no episode spans two files
        seen |= ids
    table = pq.read_table(out)
    assert table.num_rows == sum(len(ep["reward"]) for ep in episodes)
    first = table.filter(table["episode_id"].to_numpy(zero_copy_only=False) == "ep-000000")
    order = np.argsort(first["step"].to_numpy())
    np.testing.assert_array_equal(first["reward"].to_numpy()[order], episodes[0]["reward"])

    ep_table = pq.read_table(write_episode_layout(episodes, tmp_path / "episodes.parquet"))
    assert ep_table.column_names == [
        "episode_id",
        "observations",
        "actions",
        "rewards",
        "action_probs",
    ]
    np.testing.assert_array_equal(ep_table["rewards"][1].values.to_numpy(), episodes[1]["reward"])


# ------------------------------------------------------------- doubly robust (SPEC 9)


def with_q(episodes, q=None, v=None) -> list[dict[str, np.ndarray]]:
    """Copies of the episodes with "q" and "v" [T_i] (zeros where not given)."""
    out = []
    for k, ep in enumerate(episodes):
        length = len(ep["reward"])
        out.append(
            {
                **ep,
                "q": np.zeros(length) if q is None else np.asarray(q[k], dtype=np.float64),
                "v": np.zeros(length) if v is None else np.asarray(v[k], dtype=np.float64),
            }
        )
    return out


def zero_q_cases():
    """Episode sets for Q-hat = V-hat = 0: hand, random skewed, over/underflowing, zero weights."""
    rng = np.random.default_rng(7)
    behavior = random_checkpoint("linear_softmax", rng)
    target = random_checkpoint("linear_softmax", rng)
    random_eps = to_reference_input(random_episodes(rng, 40, behavior=behavior), target)
    alive = episode([0.5, 0.5], [0.5, 0.25], [1.0, 1.0])
    dead = episode([0.5, 0.0, 0.2], [0.5, 0.5, 0.5], [5.0, 5.0, 1.0])
    return {
        "hand": HAND,
        "random": random_eps,
        "overflow": prefixed(HAND, 0.5),
        "underflow": prefixed(HAND, -0.5),
        "zero_weight": [alive, dead],
        "all_dead": [dead, dead],
    }


@pytest.mark.parametrize("gamma", [1.0, 0.9])
@pytest.mark.parametrize("case", list(zero_q_cases()))
def test_zero_q_gives_pdis_and_wpdis_exactly(case, gamma):
    episodes = zero_q_cases()[case]
    base = reference_estimates(episodes, gamma)
    got = reference_dr_estimates(with_q(episodes), gamma)
    assert got["dr"] == base["pdis"] and got["wdr"] == base["wpdis"]  # None == None included
    assert got["dm"] == 0.0
    assert reference_dr_stderr(with_q(episodes), gamma)["dm"] == 0.0


def test_hand_example_with_q():
    """HAND with Q-hat, V-hat by hand. W = (2, 1) and (0.5,), so W_{t-1} = (1, 2) and (1, 0.5
    absorbed at t = 1); after B ends its reward, Q-hat and V-hat are 0."""
    g = Fraction(9, 10)
    q = [[Fraction(3, 2), Fraction(1)], [Fraction(2)]]
    v = [[Fraction(2), Fraction(1, 2)], [Fraction(5, 2)]]
    term_a = 2 * (1 - q[0][0]) + 1 * v[0][0] + g * (1 * (2 - q[0][1]) + 2 * v[0][1])  # 2.8
    term_b = Fraction(1, 2) * (3 - q[1][0]) + 1 * v[1][0]  # 3
    wdr = (2 * (1 - q[0][0]) + Fraction(1, 2) * (3 - q[1][0])) / Fraction(5, 2)  # t = 0
    wdr += (v[0][0] + v[1][0]) / 2
    wdr += g * (1 * (2 - q[0][1]) + Fraction(1, 2) * 0) / Fraction(3, 2)  # t = 1
    wdr += g * (2 * v[0][1] + Fraction(1, 2) * 0) / Fraction(5, 2)  # B stays at 0.5
    expected = {"dm": Fraction(9, 4), "dr": (term_a + term_b) / 2, "wdr": wdr}
    assert {k: float(x) for k, x in expected.items()} == pytest.approx(
        {"dm": 2.25, "dr": 2.9, "wdr": 3.01}, rel=1e-15
    )
    episodes = with_q(
        HAND, [[float(x) for x in row] for row in q], [[float(x) for x in row] for row in v]
    )
    got = reference_dr_estimates(episodes, 0.9)
    assert got == pytest.approx({k: float(x) for k, x in expected.items()}, rel=1e-12)
    stderr = reference_dr_stderr(episodes, 0.9)
    assert stderr == pytest.approx({"dm": 0.25, "dr": 0.1}, rel=1e-12)  # |a - b| / 2


def test_on_policy_lengths_one_and_two():
    """Two episodes of lengths 1 and 2, reward 1 per step, gamma 1, pi_e = pi_b: the truth is
    1.5. Padding the ended episode with weight 0 would give WDR = 1 + 1/1 = 2.0 with Q = 0."""
    episodes = [episode([0.5], [0.5], [1.0]), episode([0.5, 0.5], [0.5, 0.5], [1.0, 1.0])]
    exact = [[1.0], [2.0, 1.0]]  # the return still to come: Q of the logged action = V
    got = reference_dr_estimates(with_q(episodes, exact, exact), 1.0)
    assert got == pytest.approx({"dm": 1.5, "dr": 1.5, "wdr": 1.5}, rel=1e-15)
    stderr = reference_dr_stderr(with_q(episodes, exact, exact), 1.0)
    assert stderr == pytest.approx({"dm": 0.5, "dr": 0.5}, rel=1e-12)  # terms 1 and 2: |1-2|/2

    zero = reference_dr_estimates(with_q(episodes), 1.0)
    assert zero == pytest.approx({"dm": 0.0, "dr": 1.5, "wdr": 1.5}, rel=1e-15)  # not 2.0

    rng = np.random.default_rng(11)  # on-policy with Q-hat = V-hat: the sums telescope
    for _ in range(5):
        guess = [rng.normal(size=1), rng.normal(size=2)]
        got = reference_dr_estimates(with_q(episodes, guess, guess), 1.0)
        assert got["dr"] == pytest.approx(1.5, rel=1e-12)
        assert got["wdr"] == pytest.approx(1.5, rel=1e-12)
        assert got["dm"] == pytest.approx((guess[0][0] + guess[1][0]) / 2, rel=1e-12)


def test_dm_is_the_mean_initial_v():
    rng = np.random.default_rng(12)
    episodes = [episode([0.3] * n, [0.6] * n, rng.normal(size=n)) for n in (3, 1, 5)]
    q = [rng.normal(size=len(ep["reward"])) for ep in episodes]
    v = [rng.normal(size=len(ep["reward"])) for ep in episodes]
    v0 = np.array([row[0] for row in v])
    got = reference_dr_estimates(with_q(episodes, q, v), 0.9)
    assert got["dm"] == pytest.approx(v0.mean(), rel=1e-15)
    assert reference_dr_stderr(with_q(episodes, q, v), 0.9)["dm"] == pytest.approx(
        v0.std(ddof=1) / math.sqrt(3), rel=1e-12
    )
    assert reference_dr_stderr(with_q(episodes[:1], q[:1], v[:1]), 0.9) == {
        "dm": None,
        "dr": None,
    }


def decimal_dr(episodes, gamma: float) -> dict[str, float]:
    """DR and WDR of SPEC 9 in 60-digit decimal arithmetic, the absorbing convention by hand."""
    with localcontext() as ctx:
        ctx.prec = 60
        g, n = Decimal(gamma), len(episodes)
        t_max = max(len(ep["reward"]) for ep in episodes)
        weights = []  # per episode: W_{-1}, W_0, ..., W_{t_max - 1} (absorbing)
        for ep in episodes:
            log_w, w = Decimal(0), [Decimal(1)]
            for t in range(t_max):
                if t < len(ep["reward"]):
                    log_w += Decimal(float(ep["log_target"][t])) - Decimal(
                        float(ep["log_behavior"][t])
                    )
                w.append(log_w.exp())
            weights.append(w)

        def at(ep, key, t):
            return Decimal(float(ep[key][t])) if t < len(ep["reward"]) else Decimal(0)

        dr, wdr = Decimal(0), Decimal(0)
        for t in range(t_max):
            w_t = [w[t + 1] for w in weights]
            w_prev = [w[t] for w in weights]
            res = [at(ep, "reward", t) - at(ep, "q", t) for ep in episodes]
            v_t = [at(ep, "v", t) for ep in episodes]
            weighted_res = sum(a * b for a, b in zip(w_t, res, strict=True))
            weighted_v = sum(a * b for a, b in zip(w_prev, v_t, strict=True))
            dr += g**t * (weighted_res + weighted_v) / n
            wdr += g**t * (weighted_res / sum(w_t) + weighted_v / sum(w_prev))
        return {"dr": float(dr), "wdr": float(wdr)}


@pytest.mark.parametrize("drift", [0.5, -0.5])
def test_long_episodes_dr_match_exact_decimal(drift):
    """~1000 steps of log ratio ~ +-0.5 (weights exp(+-500)), with Q-hat and V-hat."""
    rng = np.random.default_rng(13)
    episodes = []
    for length in (1000, 990, 400, 1000):
        log_b = np.log(rng.uniform(0.05, 1.0, size=length))
        episodes.append(
            {
                "log_target": log_b + drift + 0.05 * rng.normal(size=length),
                "log_behavior": log_b,
                "reward": rng.normal(1.0, 1.0, size=length),
                "q": rng.normal(1.0, 0.5, size=length),
                "v": rng.normal(1.0, 0.5, size=length),
            }
        )
    got = reference_dr_estimates(episodes, 0.999)
    expected = decimal_dr(episodes, 0.999)
    assert got["wdr"] == pytest.approx(expected["wdr"], rel=1e-8)
    assert got["dr"] == pytest.approx(expected["dr"], rel=1e-8)


def test_dr_over_and_underflow():
    """2000 zero-reward prefix steps (Q-hat = V-hat = 0 there) scale every weight after them by
    exp(+-1000): WDR is unchanged, DR is not a float64 or rounds to 0."""
    q, v = [[0.5, 1.0], [2.0]], [[1.0, 0.5], [2.5]]
    small = reference_dr_estimates(with_q(HAND, q, v), 1.0)
    pad = np.zeros(2000)
    for log_ratio in (0.5, -0.5):
        big_q = [np.concatenate([pad, row]) for row in q]
        big_v = [np.concatenate([pad, row]) for row in v]
        big = reference_dr_estimates(with_q(prefixed(HAND, log_ratio), big_q, big_v), 1.0)
        assert big["wdr"] == pytest.approx(small["wdr"], rel=1e-9)
        assert big["dm"] == 0.0
        assert big["dr"] is None if log_ratio > 0 else big["dr"] == 0.0
