"""Plain float64 NumPy reference for the estimators and policies of SPEC sections 3 and 4.

Readability beats speed here: the tool under test is compared against these functions.
Weights are kept in log space and shifted by their maximum (as in log-sum-exp), so
products of ratios that over- or underflow float64 still give the right weighted
estimates. A value that cannot be a finite float64 is returned as ``None``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np

ESTIMATORS = ("is", "wis", "pdis", "wpdis")
DIAGNOSTICS = (
    "ess",
    "ess_fraction",
    "mean_weight",
    "max_weight",
    "max_weight_share",
    "zero_weight_fraction",
)

Episode = Mapping[str, np.ndarray]  # "log_target" [T], "log_behavior" [T], "reward" [T]


# --------------------------------------------------------------------------- policies


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Stable log-softmax over the last axis: [..., A] -> [..., A]."""
    logits = np.asarray(logits, dtype=np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _kind(ckpt: Mapping[str, np.ndarray | str]) -> str:
    return str(ckpt["kind"])  # a str, or the 0-d string array read from an .npz


def _n_layers(ckpt: Mapping[str, np.ndarray | str]) -> int:
    return sum(1 for key in ckpt if key.startswith("weight_"))


def action_log_probs(ckpt: Mapping[str, np.ndarray | str], obs: np.ndarray) -> np.ndarray:
    """log pi(. | s) of a discrete policy: obs [T] (tabular) or [T, obs_dim] -> [T, n_actions]."""
    kind = _kind(ckpt)
    if kind == "tabular":
        logits = np.asarray(ckpt["logits"], dtype=np.float64)[np.asarray(obs, dtype=np.int64)]
    elif kind == "linear_softmax":
        temperature = float(ckpt["temperature"]) if "temperature" in ckpt else 1.0
        obs = np.asarray(obs, dtype=np.float64)
        logits = (obs @ np.asarray(ckpt["weight"]) + np.asarray(ckpt["bias"])) / temperature
    elif kind == "mlp_softmax":
        activation = str(ckpt["activation"]) if "activation" in ckpt else "tanh"
        act = {"tanh": np.tanh, "relu": lambda x: np.maximum(x, 0.0)}[activation]
        h = np.asarray(obs, dtype=np.float64)
        n = _n_layers(ckpt)
        for k in range(n):
            h = h @ np.asarray(ckpt[f"weight_{k}"]) + np.asarray(ckpt[f"bias_{k}"])
            if k < n - 1:
                h = act(h)
        logits = h
    else:
        raise ValueError(f"not a discrete policy kind: {kind!r}")
    return log_softmax(logits)


def gaussian_mean(ckpt: Mapping[str, np.ndarray | str], obs: np.ndarray) -> np.ndarray:
    """Mean action of a ``linear_gaussian`` policy: obs [T, obs_dim] -> [T, act_dim]."""
    obs = np.asarray(obs, dtype=np.float64)
    return obs @ np.asarray(ckpt["weight"]) + np.asarray(ckpt["bias"])


def reference_log_prob(
    ckpt: Mapping[str, np.ndarray | str], obs: np.ndarray, action: np.ndarray
) -> np.ndarray:
    """log pi(a_t | s_t) for every step.

    obs: [T] integer states (tabular) or [T, obs_dim]; action: [T] integers (discrete)
    or [T, act_dim] (linear_gaussian). Returns [T] float64.
    """
    if _kind(ckpt) == "linear_gaussian":
        mean = gaussian_mean(ckpt, obs)
        log_std = np.asarray(ckpt["log_std"], dtype=np.float64)
        z = (np.asarray(action, dtype=np.float64) - mean) / np.exp(log_std)
        return (-0.5 * z**2 - log_std - 0.5 * math.log(2.0 * math.pi)).sum(axis=-1)
    log_probs = action_log_probs(ckpt, obs)
    action = np.asarray(action, dtype=np.int64)
    return log_probs[np.arange(len(action)), action]


# ------------------------------------------------------------------------- estimators


def _padded(episodes: Sequence[Episode], gamma: float):
    """Episodes -> log W [n, T_max] (absorbing after the end), reward [n, T_max] (0 after
    the end), discount gamma^t [T_max], return G [n]."""
    lengths = [len(ep["reward"]) for ep in episodes]
    if not episodes or min(lengths) < 1:
        raise ValueError("need at least one episode, each with at least one step")
    t_max = max(lengths)
    log_w = np.empty((len(episodes), t_max))
    reward = np.zeros((len(episodes), t_max))
    for i, ep in enumerate(episodes):
        log_ratio = np.asarray(ep["log_target"], np.float64) - np.asarray(
            ep["log_behavior"], np.float64
        )
        cum = np.cumsum(log_ratio)
        log_w[i, : len(cum)] = cum
        log_w[i, len(cum) :] = cum[-1]
        reward[i, : len(cum)] = ep["reward"]
    discount = float(gamma) ** np.arange(t_max, dtype=np.float64)
    return log_w, reward, discount, reward @ discount


def _shift(log_w: np.ndarray) -> float:
    """Max of the log weights, or 0 when every weight is zero (all -inf)."""
    m = float(np.max(log_w))
    return m if m > -np.inf else 0.0


def _scaled(value: float, log_scale: float) -> float | None:
    """value * exp(log_scale) without overflowing on the way; None if not finite."""
    if value == 0.0:
        return 0.0
    with np.errstate(over="ignore"):
        out = math.copysign(float(np.exp(math.log(abs(value)) + log_scale)), value)
    return out if math.isfinite(out) else None


def _ratio(num: float, den: float) -> float | None:
    return num / den if den > 0.0 else None


def _wpdis(log_w: np.ndarray, reward: np.ndarray, discount: np.ndarray) -> float | None:
    """sum_t gamma^t (sum_i W_it r_it) / (sum_i W_it) over padded [n, T_max] arrays."""
    total = 0.0
    for t in range(log_w.shape[1]):
        m_t = float(log_w[:, t].max())
        if m_t == -np.inf:  # every weight is zero from here on: 0/0
            return None
        w_t = np.exp(log_w[:, t] - m_t)
        total += float(discount[t]) * float(w_t @ reward[:, t]) / float(w_t.sum())
    return total if math.isfinite(total) else None


def reference_estimates(episodes: Sequence[Episode], gamma: float) -> dict[str, float | None]:
    """IS, WIS, PDIS, WPDIS and the weight diagnostics of SPEC section 4.

    episodes: one mapping per episode with float64 "log_target", "log_behavior",
    "reward", each [T_i]. Returns {"is", "wis", "pdis", "wpdis", "ess", "ess_fraction",
    "mean_weight", "max_weight", "max_weight_share", "zero_weight_fraction"}; a value
    that is not a finite float64 (overflow, 0/0) is None. A weight counts as zero when
    its log is -inf (a target probability of exactly 0), not when it merely underflows.
    """
    log_w, reward, discount, ret = _padded(episodes, gamma)
    n = len(ret)
    log_final = log_w[:, -1]  # [n] log W_{i, T_i - 1}, thanks to the absorbing padding

    m = _shift(log_final)
    w = np.exp(log_final - m)  # [n] trajectory weights / exp(m)
    w_sum = float(w.sum())
    out: dict[str, float | None] = {
        "is": _scaled(float(w @ ret), m - math.log(n)),
        "wis": _ratio(float(w @ ret), w_sum),
    }

    m_all = _shift(log_w)
    per_step = np.exp(log_w - m_all) * reward * discount  # [n, T_max]
    out["pdis"] = _scaled(float(per_step.sum()), m_all - math.log(n))

    out["wpdis"] = _wpdis(log_w, reward, discount)

    ess = _ratio(w_sum**2, float(w @ w))
    out["ess"] = ess
    out["ess_fraction"] = None if ess is None else ess / n
    out["mean_weight"] = _scaled(w_sum, m - math.log(n))
    out["max_weight"] = _scaled(float(w.max()), m)
    out["max_weight_share"] = _ratio(float(w.max()), w_sum)
    out["zero_weight_fraction"] = float(np.mean(log_final == -np.inf))
    return out


def _scaled_sem(values: np.ndarray, log_scale: float) -> float | None:
    """Standard error of the mean of values * exp(log_scale), ddof=1; None if n < 2."""
    n = len(values)
    if n < 2:
        return None
    std = float(np.std(values, ddof=1))
    return _scaled(std, log_scale - 0.5 * math.log(n))


def reference_stderr(episodes: Sequence[Episode], gamma: float) -> dict[str, float | None]:
    """Standard errors {"is", "pdis", "wis"}.

    IS and PDIS: sample std (ddof=1) of the per-episode terms / sqrt(n).
    WIS (delta method): sqrt(sum_i w_i^2 (G_i - WIS)^2) / sum_i w_i.
    """
    log_w, reward, discount, ret = _padded(episodes, gamma)
    log_final = log_w[:, -1]
    m = _shift(log_final)
    w = np.exp(log_final - m)
    m_all = _shift(log_w)
    pdis_terms = (np.exp(log_w - m_all) * reward * discount).sum(axis=1)  # [n]

    out: dict[str, float | None] = {
        "is": _scaled_sem(w * ret, m),
        "pdis": _scaled_sem(pdis_terms, m_all),
        "wis": None,
    }
    if w.sum() > 0.0:
        wis = float(w @ ret) / float(w.sum())
        out["wis"] = math.sqrt(float(np.sum(w**2 * (ret - wis) ** 2))) / float(w.sum())
    return out
