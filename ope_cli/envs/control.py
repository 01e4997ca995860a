"""``control``: a 4-d linear-Gaussian state with long-tailed episode lengths.

Actions noop/push+/push-, reward ``exp(-|s|^2 / 8)`` minus an action cost plus noise,
episode lengths from a discrete Pareto law (median 10, mean ~46) capped at ``horizon``
(default 1000) and independent of the actions; ``linear_softmax`` policies. Truth: Monte
Carlo with the exact length law and expected rewards (see ``truth``), standard error recorded.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from ope_cli.envs.base import (
    DEFAULT_POLICIES,
    Environment,
    Params,
    State,
    Truth,
    draw,
    linear_softmax,
    sample_index,
    shifted,
)

CONTROL_TRUTH_EPISODES = 1 << 16  # Monte Carlo episodes for the control truth ...
CONTROL_TRUTH_CONTINUED = 1 << 13  # ... of which this many run past CONTROL_TRUTH_SPLIT_STEP
CONTROL_TRUTH_SPLIT_STEP = 64
# The cost is linear in the policies: up to this many get the full run; more share it, each
# getting 1/2, 1/4, ... of the episodes (at least 1/CONTROL_TRUTH_MAX_SPLIT), so the time
# grows slowly with them and their standard errors, recorded, by up to sqrt(MAX_SPLIT)
CONTROL_TRUTH_POLICIES = 4
CONTROL_TRUTH_MAX_SPLIT = 32


def build(shift: float, count: int = DEFAULT_POLICIES) -> tuple[Params, list[Params]]:
    """s' = s @ dynamics [d, d] + pushes[a] [A, d] + noise; lengths 1 + floor(10 (U^-1 - 1))."""
    rng = np.random.default_rng(303)
    dim = 4

    def rotation(angle: float) -> np.ndarray:
        return np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])

    dynamics = np.zeros((dim, dim))
    dynamics[:2, :2], dynamics[2:, 2:] = 0.9 * rotation(0.3), 0.9 * rotation(-0.5)
    push = rng.normal(size=dim)
    # noop, push+, push-
    pushes = np.stack([np.zeros(dim), push, -push]) * 0.6 / np.linalg.norm(push)
    env = {
        "dynamics": dynamics,
        "pushes": pushes,
        "action_cost": np.array([0.0, 0.1, 0.1]),
        "state_noise": np.float64(0.3),
        "reward_noise": np.float64(0.1),
        "length_scale": np.float64(10.0),
        "length_index": np.float64(1.0),
    }
    behavior = {"weight": rng.normal(scale=0.3, size=(dim, 3)), "bias": np.zeros(3)}
    # logits -|s @ dynamics + push_a|^2 / 5: prefer the push that brings the next state nearest 0,
    # gently, as the log-ratios add up over up to `horizon` steps
    direction = {"weight": -0.4 * dynamics @ pushes.T, "bias": -0.2 * np.sum(pushes**2, axis=1)}
    return env, shifted(behavior, direction, shift, count)


def expected_reward(params: Params, obs: jax.Array) -> jax.Array:
    """Expected reward of each action, obs [..., d] -> [..., A]."""
    closeness = jnp.exp(-jnp.sum(obs**2, axis=-1, keepdims=True) / (2 * obs.shape[-1]))
    return closeness - params["action_cost"]


def reset(params: Params, uniform: jax.Array, normal: jax.Array) -> State:
    dim = params["dynamics"].shape[0]
    pareto = params["length_scale"] * (uniform[0] ** (-1.0 / params["length_index"]) - 1.0)
    return {
        "obs": normal[:dim],
        "length": 1 + jnp.floor(jnp.minimum(pareto, 2.0**62)).astype(jnp.int64),
    }


def step(params: Params, state: State, uniform: jax.Array, normal: jax.Array, t: jax.Array):
    obs = state["obs"]
    probs = linear_softmax(params["behavior"], obs)
    action = sample_index(uniform[0], probs)
    reward = expected_reward(params, obs)[action] + params["reward_noise"] * normal[-1]
    next_obs = (
        obs @ params["dynamics"] + params["pushes"][action] + params["state_noise"] * normal[:-1]
    )
    record = {
        "observation": obs,
        "action": action,
        "reward": reward,
        "behavior_prob": probs[action],
    }
    return {"obs": next_obs, "length": state["length"]}, record, t + 1 >= state["length"]


@jax.jit
def _truth_chunk(
    params: Params,
    policies: Params,
    obs: jax.Array,
    key: jax.Array,
    times: jax.Array,
    discounts: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """Steps `times` [T] of every policy from obs [P, d, n].

    Returns the next obs [P, d, n] and sum_t discounts[t] E_pi[r_t] [P, n].

    Batched by hand with the episodes last, which XLA on CPU runs ~4x faster than a vmap over
    episodes; the policies [P, ...] share the episodes' random numbers.
    """
    dim, n_lanes = obs.shape[1], obs.shape[2]

    def step(obs, inputs):
        t, discount = inputs
        uniform, normal = draw(jax.random.fold_in(key, t), n_lanes, (1, dim))  # [n, 1], [n, d]
        logits = jnp.einsum("pdn,pda->pan", obs, policies["weight"]) + policies["bias"][:, :, None]
        probs = jax.nn.softmax(logits, axis=1)  # [P, A, n]
        mean_reward = jnp.moveaxis(
            expected_reward(params, jnp.moveaxis(obs, 1, 2)), 2, 1
        )  # [P, A, n]
        actions = jnp.sum(uniform[:, 0] > jnp.cumsum(probs, axis=1)[:, :-1], axis=1)  # [P, n]
        pushes = jnp.einsum(
            "pan,ad->pdn", jax.nn.one_hot(actions, probs.shape[1], axis=1), params["pushes"]
        )
        next_obs = (
            jnp.einsum("pdn,de->pen", obs, params["dynamics"])
            + pushes
            + params["state_noise"] * normal.T
        )
        return next_obs, discount * jnp.sum(probs * mean_reward, axis=1)

    obs, rewards = jax.lax.scan(step, obs, (times, discounts))
    return obs, jnp.sum(rewards, axis=0)


def _truth_split(n_policies: int) -> int:
    """By how much each policy's Monte Carlo episodes are divided: the least power of two
    that keeps n_policies / split within CONTROL_TRUTH_POLICIES, at most MAX_SPLIT."""
    split = 1
    while n_policies > split * CONTROL_TRUTH_POLICIES and split < CONTROL_TRUTH_MAX_SPLIT:
        split *= 2
    return split


def truth(env: Params, policies: list[Params], gamma: float, horizon: int) -> list[Truth]:
    """value = sum_{t < horizon} gamma^t P(L > t) E_pi[r(s_t, a_t)], by Monte Carlo over states.

    The length L is independent of the states and actions, so its law enters exactly, and each
    step contributes its expected reward sum_a pi(a|s) r(s, a): no length or reward noise.
    CONTROL_TRUTH_EPISODES episodes run the first CONTROL_TRUTH_SPLIT_STEP steps and the first
    CONTROL_TRUTH_CONTINUED of them the rest, where the survival weights are small and so is the
    variance. The stderr accounts for both parts and their correlation. All runs are chunks of
    CONTROL_TRUTH_SPLIT_STEP steps of CONTROL_TRUTH_CONTINUED episodes: one compiled kernel.
    More than CONTROL_TRUTH_POLICIES policies share those episodes' cost (``_truth_split``).
    """
    split = _truth_split(len(policies))
    n_all, n_group = CONTROL_TRUTH_EPISODES // split, CONTROL_TRUTH_CONTINUED // split
    chunk = CONTROL_TRUTH_SPLIT_STEP
    params = jax.tree.map(jnp.asarray, env)
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *policies)
    n_chunks = -(-horizon // chunk)
    times = np.arange(n_chunks * chunk)
    survival = (1.0 + times / env["length_scale"]) ** (-env["length_index"])
    discounts = np.where(times < horizon, gamma**times * survival, 0.0)  # zero past the horizon
    start_key, steps_key = jax.random.split(jax.random.key(303))
    dim = env["dynamics"].shape[0]
    start = jax.random.normal(start_key, (n_all // n_group, 1, dim, n_group))  # [groups, 1, d, n]
    early_chunks = []  # jax arrays, read once every chunk is dispatched
    late = None  # [P, n_group] the first group's rewards past ``chunk``, summed as they come
    # (a list of every chunk's took 9 KB a step of the horizon: 1.3 GB at 100,000)
    for group in range(n_all // n_group):
        group_key = jax.random.fold_in(steps_key, group)
        obs = jnp.broadcast_to(start[group], (len(policies), dim, n_group))
        obs, rewards = _truth_chunk(
            params, stacked, obs, group_key, times[:chunk], discounts[:chunk]
        )
        early_chunks.append(rewards)
        for k in range(1, n_chunks if group == 0 else 1):
            window = slice(k * chunk, (k + 1) * chunk)
            obs, rewards = _truth_chunk(
                params, stacked, obs, group_key, times[window], discounts[window]
            )
            late = rewards if late is None else late + rewards
    early = np.concatenate(early_chunks, axis=1)  # [P, n_all]
    # [P, n_group]: the rest of the first group's episodes (none when horizon <= chunk)
    late = np.zeros((len(policies), n_group)) if late is None else np.asarray(late)
    mean = early.mean(axis=1) + late.mean(axis=1)
    # a sum of independent per-episode terms, in two groups of identically distributed ones
    both = early[:, :n_group] / n_all + late / n_group
    only_early = early[:, n_group:] / n_all
    variance = n_group * both.var(axis=1, ddof=1) + (n_all - n_group) * only_early.var(
        axis=1, ddof=1
    )
    method = f"monte carlo ({n_all} episodes)"
    if n_chunks > 1:
        method = f"monte carlo ({n_all} episodes, {n_group} of them past step {chunk})"
    return [(float(m), float(math.sqrt(v)), method) for m, v in zip(mean, variance, strict=True)]


ENVIRONMENT = Environment(
    name="control",
    build=build,
    reset=reset,
    step=step,
    truth=truth,
    noise=(1, 5),
    kind="linear_softmax",
    default_horizon=1000,
    reward_range=None,
)
