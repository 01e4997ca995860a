"""``gaussian``: a 3-d linear-Gaussian state with 2-d continuous actions.

Reward ``-|a - target(s)|^2``, ``horizon`` steps (default 5); ``linear_gaussian`` policies.
Truth: closed form from the Gaussian state moments.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from ope_cli.envs.base import DEFAULT_POLICIES, Environment, Params, State, Truth, shifted


def build(shift: float, count: int = DEFAULT_POLICIES) -> tuple[Params, list[Params]]:
    """s' = s @ dynamics [3, 3] + a @ control [2, 3] + noise; target(s) = s @ gain [3, 2] + c."""
    rng = np.random.default_rng(404)
    obs_dim, act_dim = 3, 2
    env = {
        "dynamics": 0.6 * np.eye(obs_dim) + rng.normal(scale=0.05, size=(obs_dim, obs_dim)),
        "control": rng.normal(scale=0.15, size=(act_dim, obs_dim)),
        "state_noise": np.float64(0.3),
        "gain": rng.normal(scale=0.5, size=(obs_dim, act_dim)),
        "offset": rng.normal(scale=0.5, size=act_dim),
    }
    behavior = {
        "weight": env["gain"] + rng.normal(scale=0.3, size=(obs_dim, act_dim)),
        "bias": env["offset"] + rng.normal(scale=0.3, size=act_dim),
        "log_std": np.full(act_dim, math.log(0.5)),
    }
    # towards the target (reached at shift 2) with narrower actions
    direction = {
        "weight": 0.5 * (env["gain"] - behavior["weight"]),
        "bias": 0.5 * (env["offset"] - behavior["bias"]),
        "log_std": np.full(act_dim, -0.15),
    }
    return env, shifted(behavior, direction, shift, count)


def reset(params: Params, uniform: jax.Array, normal: jax.Array) -> State:
    return {"obs": normal[: params["dynamics"].shape[0]]}


def step(params: Params, state: State, uniform: jax.Array, normal: jax.Array, t: jax.Array):
    obs, behavior = state["obs"], params["behavior"]
    act_dim = behavior["bias"].shape[0]
    z = normal[:act_dim]
    action = obs @ behavior["weight"] + behavior["bias"] + jnp.exp(behavior["log_std"]) * z
    log_density = jnp.sum(-0.5 * z**2 - behavior["log_std"] - 0.5 * math.log(2 * math.pi))
    reward = -jnp.sum((action - obs @ params["gain"] - params["offset"]) ** 2)
    next_obs = (
        obs @ params["dynamics"]
        + action @ params["control"]
        + params["state_noise"] * normal[act_dim:]
    )
    record = {
        "observation": obs,
        "action": action,
        "reward": reward,
        "behavior_prob": jnp.exp(log_density),
    }
    return {"obs": next_obs}, record, jnp.bool_(False)


def truth(env: Params, policies: list[Params], gamma: float, horizon: int) -> list[Truth]:
    """sum_t gamma^t E[r_t], propagating the state's mean [P, d] and covariance [P, d, d]
    exactly, for all P policies at once.

    With a = s W + b + std z: E[r | s] = -|s (W - K) + (b - c)|^2 - sum(std^2), and
    s' = s (A + W B) + b B + (std z) B + noise stays Gaussian.
    """
    dynamics, control, dim = env["dynamics"], env["control"], len(env["dynamics"])
    weight, bias, log_std = (
        np.stack([p[k] for p in policies]) for k in ("weight", "bias", "log_std")
    )
    variance = np.exp(2 * log_std)  # [P, a]
    gap_weight, gap_bias = weight - env["gain"], bias - env["offset"]  # [P, d, a], [P, a]
    closed_loop = dynamics + weight @ control  # [P, d, d]
    added_cov = (control.T * variance[:, None, :]) @ control + env["state_noise"] ** 2 * np.eye(dim)
    mean, cov = np.zeros((len(policies), dim)), np.broadcast_to(np.eye(dim), closed_loop.shape)
    value = np.zeros(len(policies))
    for t in range(horizon):
        gap_mean = _row_times(mean, gap_weight) + gap_bias  # [P, a]
        spread = np.trace(_transpose(gap_weight) @ cov @ gap_weight, axis1=1, axis2=2)
        value -= gamma**t * (spread + np.sum(gap_mean * gap_mean, axis=1) + variance.sum(axis=1))
        mean, cov = (
            _row_times(mean, closed_loop) + _row_times(bias, control),
            _transpose(closed_loop) @ cov @ closed_loop + added_cov,
        )
    return [(float(v), 0.0, "closed form") for v in value]


def _row_times(rows: np.ndarray, matrices: np.ndarray) -> np.ndarray:
    """rows [P, n] @ matrices [P, n, m] (or one [n, m]) -> [P, m], row by row: the bits of
    each row's own vector-matrix product (a [P, n] @ [n, m] product can round otherwise)."""
    return (rows[:, None, :] @ matrices)[:, 0]


def _transpose(matrices: np.ndarray) -> np.ndarray:
    return np.swapaxes(matrices, -1, -2)


ENVIRONMENT = Environment(
    name="gaussian",
    build=build,
    reset=reset,
    step=step,
    truth=truth,
    noise=(0, 5),
    kind="linear_gaussian",
    default_horizon=5,
    reward_range=None,
)
