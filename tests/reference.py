"""Plain float64 NumPy reference for the estimators and policies of SPEC sections 3, 4 and 9.

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

Episode = Mapping[str, np.ndarray]  # "log_target", "log_behavior", "reward" (+ "q", "v") [T]


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


def _weighted_step_means(log_w: np.ndarray, values: np.ndarray) -> np.ndarray | None:
    """[T_max] sum_i W_it x_it / sum_i W_it over padded [n, T_max] arrays, each step's
    weights shifted by their maximum; None when every weight of some step is zero (0/0)."""
    m_t = log_w.max(axis=0)  # [T_max]
    if np.any(m_t == -np.inf):
        return None
    w_t = np.exp(log_w - m_t)  # [n, T_max]
    with np.errstate(over="ignore", invalid="ignore"):
        return np.sum(w_t * values, axis=0) / np.sum(w_t, axis=0)


def _wpdis(log_w: np.ndarray, reward: np.ndarray, discount: np.ndarray) -> float | None:
    """sum_t gamma^t (sum_i W_it r_it) / (sum_i W_it) over padded [n, T_max] arrays."""
    means = _weighted_step_means(log_w, reward)
    if means is None:
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        total = float(np.sum(discount * means))
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
    size = float(np.max(np.abs(values)))  # taken out first: squares of 1e200 overflow
    if size == 0.0 or not math.isfinite(size):
        return _scaled(float(np.std(values, ddof=1)), log_scale - 0.5 * math.log(n))
    std = float(np.std(values / size, ddof=1))
    return _scaled(std, log_scale + math.log(size) - 0.5 * math.log(n))


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


# ------------------------------------------------------------- doubly robust (SPEC 9)


def _padded_q(episodes: Sequence[Episode]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Episodes with "q" [T_i] (Q-hat of the logged action) and "v" [T_i] (V-hat of the state)
    -> q [n, T_max], v [n, T_max] (0 after the end: the absorbing convention) and
    log W_{t-1} [n, T_max] (log W_{i,-1} = 0, i.e. W_{i,-1} = 1)."""
    log_w, _, _, _ = _padded(episodes, 1.0)
    q = np.zeros(log_w.shape)
    v = np.zeros(log_w.shape)
    for i, ep in enumerate(episodes):
        length = len(ep["reward"])
        if len(ep["q"]) != length or len(ep["v"]) != length:
            raise ValueError("q and v need one value per step")
        q[i, :length] = ep["q"]
        v[i, :length] = ep["v"]
    log_w_prev = np.concatenate([np.zeros((len(episodes), 1)), log_w[:, :-1]], axis=1)
    return q, v, log_w_prev


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def reference_dr_estimates(episodes: Sequence[Episode], gamma: float) -> dict[str, float | None]:
    """DM, DR and WDR of SPEC section 9.

    episodes: one mapping per episode with float64 "log_target", "log_behavior", "reward",
    "q" (Q-hat(s_t, a_t)) and "v" (V-hat(s_t)), each [T_i]. With W_{i,-1} = 1 and, after an
    episode ends, ratio 1, reward 0 and Q-hat = V-hat = 0 (t runs to the longest episode):

        dm  = (1/n) sum_i V(s_i0)
        dr  = (1/n) sum_i sum_t gamma^t [W_it (r_it - Q_it) + W_i,t-1 V_it]
        wdr = sum_t gamma^t [sum_i W_it (r_it - Q_it) / sum_i W_it
                             + sum_i W_i,t-1 V_it / sum_i W_i,t-1]

    DR's two sums (importance-weighted residuals, and baselines) are each shifted by the
    maximum of their own log weights; WDR's per-step sums by the step's maximum. Returns
    {"dm", "dr", "wdr"}; a value that is not a finite float64 (overflow, 0/0) is None.
    """
    log_w, reward, discount, _ = _padded(episodes, gamma)
    q, v, log_w_prev = _padded_q(episodes)
    n = len(episodes)

    m = _shift(log_w)
    residual = float((np.exp(log_w - m) * (reward - q) * discount).sum())
    m_prev = _shift(log_w_prev)
    baseline = float((np.exp(log_w_prev - m_prev) * v * discount).sum())
    residual_mean = _scaled(residual, m - math.log(n))
    baseline_mean = _scaled(baseline, m_prev - math.log(n))
    dr = None
    if residual_mean is not None and baseline_mean is not None:
        dr = _finite(residual_mean + baseline_mean)

    # per step: the weighted mean residual and the W_{t-1}-weighted mean baseline
    residuals = _weighted_step_means(log_w, reward - q)
    baselines = _weighted_step_means(log_w_prev, v)
    wdr = None
    if residuals is not None and baselines is not None:
        with np.errstate(over="ignore", invalid="ignore"):
            wdr = float(np.sum(discount * residuals + discount * baselines))

    return {
        "dm": _finite(float(np.mean(v[:, 0]))),
        "dr": dr,
        "wdr": None if wdr is None else _finite(wdr),
    }


def reference_dr_stderr(episodes: Sequence[Episode], gamma: float) -> dict[str, float | None]:
    """Standard errors {"dm", "dr"}: the sample std (ddof=1) / sqrt(n) of the per-episode
    terms V(s_i0) and sum_t gamma^t [W_it (r_it - Q_it) + W_i,t-1 V_it]; None if n < 2 or
    not finite."""
    log_w, reward, discount, _ = _padded(episodes, gamma)
    q, v, log_w_prev = _padded_q(episodes)
    m = max(_shift(log_w), _shift(log_w_prev))  # one scale for both parts of a term
    terms = (
        np.exp(log_w - m) * (reward - q) * discount + np.exp(log_w_prev - m) * v * discount
    ).sum(axis=1)  # [n] per-episode DR terms / exp(m)
    dm = _scaled_sem(v[:, 0], 0.0)
    return {
        "dm": None if dm is None else _finite(dm),
        "dr": _scaled_sem(terms, m),
    }


# ------------------------------------------------------------- paired differences (SPEC 11)


def reference_terms(episodes: Sequence[Episode], gamma: float) -> dict[str, np.ndarray]:
    """Per-episode terms [n] of the mean-of-terms estimators: IS's W_{T-1} G and PDIS's
    sum_t gamma^t W_t r_t (plain float64: for moderate weights)."""
    log_w, reward, discount, ret = _padded(episodes, gamma)
    w = np.exp(log_w)
    return {"is": w[:, -1] * ret, "pdis": (w * reward) @ discount}


def reference_replicates(
    episodes: Sequence[Episode], gamma: float, counts_in: np.ndarray
) -> dict[str, np.ndarray]:
    """[R] bootstrap replicate estimates of IS, WIS, PDIS, WPDIS with per-episode Poisson
    counts ``counts_in`` [n, R]: every sum over episodes weighted by the counts."""
    log_w, reward, discount, ret = _padded(episodes, gamma)
    w = np.exp(log_w)  # moderate weights only
    c = np.asarray(counts_in, np.float64).T  # [R, n]
    with np.errstate(divide="ignore", invalid="ignore"):
        wpdis = np.sum(discount * (c @ (w * reward)) / (c @ w), axis=1)
        return {
            "is": c @ (w[:, -1] * ret) / c.sum(1),
            "wis": c @ (w[:, -1] * ret) / (c @ w[:, -1]),
            "pdis": c @ ((w * reward) @ discount) / c.sum(1),
            "wpdis": wpdis,
        }


def reference_paired(
    episodes_k: Sequence[Episode],
    episodes_b: Sequence[Episode],
    gamma: float,
    groups: np.ndarray,
) -> dict[str, tuple[float, float]]:
    """(Δ, stderr) of V̂(k) - V̂(b) on the same episodes, per estimator: the per-episode
    differences' mean and sample std / sqrt(n) for IS and PDIS; for WIS and WPDIS the
    difference of the estimates with a delete-a-group jackknife of the difference over the
    non-empty ``groups`` [n]."""
    out = {}
    terms_k, terms_b = reference_terms(episodes_k, gamma), reference_terms(episodes_b, gamma)
    for name in ("is", "pdis"):
        d = terms_k[name] - terms_b[name]
        out[name] = (float(d.mean()), float(d.std(ddof=1) / math.sqrt(d.size)))
    full_k = reference_estimates(episodes_k, gamma)
    full_b = reference_estimates(episodes_b, gamma)
    present = np.unique(groups)
    for name in ("wis", "wpdis"):
        leave_out = []
        for g in present:
            keep = [i for i in range(len(groups)) if groups[i] != g]
            k = reference_estimates([episodes_k[i] for i in keep], gamma)[name]
            b = reference_estimates([episodes_b[i] for i in keep], gamma)[name]
            leave_out.append(k - b)
        d_g = np.array(leave_out)
        spread = np.sum((d_g - d_g.mean()) ** 2)
        stderr = math.sqrt((present.size - 1) / present.size * spread)
        out[name] = (full_k[name] - full_b[name], stderr)
    return out


def discounts(discount_t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(gamma^t, t log gamma) as the kernel's per-episode step takes them, from [T] gamma^t
    (-inf where gamma^t is 0)."""
    discount_t = np.asarray(discount_t, np.float64)
    with np.errstate(divide="ignore"):
        return discount_t, np.log(discount_t)
