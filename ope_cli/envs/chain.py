"""``chain``: 10 states in a line, actions left/stay/right that slip.

Mean rewards grow to the right, Bernoulli rewards in {0, 1}, a termination probability per
(state, action) of 5-15%; ``tabular`` policies. Truth: the Bellman equations (a linear solve;
backward induction when ``horizon`` caps the episodes); ``q_truth``: the exact action values
Q [S, A] from the same solve (none under a horizon, where they depend on time).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from ope_cli.envs.base import (
    DEFAULT_POLICIES,
    Environment,
    Params,
    State,
    Truth,
    sample_index,
    shifted,
    softmax_np,
)


def build(shift: float, count: int = DEFAULT_POLICIES) -> tuple[Params, list[Params]]:
    """Transitions [S, A, S], mean rewards and termination probabilities [S, A], initial law [S]."""
    rng = np.random.default_rng(202)
    n_states, n_actions, slip = 10, 3, 0.2
    transitions = np.zeros((n_states, n_actions, n_states))
    for s in range(n_states):
        for a, intended in enumerate((-1, 0, 1)):
            for move in (-1, 0, 1):
                target = min(max(s + move, 0), n_states - 1)
                transitions[s, a, target] += (1 - slip) * (move == intended) + slip / 3
    env = {
        "transitions": transitions,
        "mean_reward": np.clip(
            np.linspace(0.0, 1.0, n_states)[:, None]
            + rng.normal(scale=0.1, size=(n_states, n_actions)),
            0.0,
            1.0,
        ),
        "terminate": rng.uniform(0.05, 0.15, size=(n_states, n_actions)),
        "initial": np.array([0.5, 0.3, 0.2] + [0.0] * (n_states - 3)),
    }
    behavior = {"logits": rng.normal(scale=0.5, size=(n_states, n_actions))}
    direction = {"logits": np.tile([-1.0, 0.0, 1.0], (n_states, 1))}  # go right
    return env, shifted(behavior, direction, shift, count)


def reset(params: Params, uniform: jax.Array, normal: jax.Array) -> State:
    return {"obs": sample_index(uniform[0], params["initial"])}


def step(params: Params, state: State, uniform: jax.Array, normal: jax.Array, t: jax.Array):
    s = state["obs"]
    probs = jax.nn.softmax(params["behavior"]["logits"][s])
    action = sample_index(uniform[0], probs)
    reward = (uniform[3] < params["mean_reward"][s, action]).astype(jnp.float64)  # Bernoulli
    terminated = uniform[1] < params["terminate"][s, action]
    next_s = sample_index(uniform[2], params["transitions"][s, action])
    record = {"observation": s, "action": action, "reward": reward, "behavior_prob": probs[action]}
    return {"obs": next_s}, record, terminated


def _solve(env: Params, policies: list[Params], gamma: float, horizon: int | None):
    """V [P, S] of every policy and, when ``horizon`` is None, their Q [P, S, A]: one batched
    solve (or one backward induction) for all P policies.

    V = r_pi + gamma P_pi V with P_pi [S, S] the continuing transitions under pi, and
    Q(s, a) = mean_reward(s, a) + gamma (1 - terminate(s, a)) sum_s' P(s' | s, a) V(s').
    A finite horizon makes the value of a capped episode depend on time: Q is then None.
    """
    probs = softmax_np(np.stack([policy["logits"] for policy in policies]))  # [P, S, A]
    reward_pi = np.sum(probs * env["mean_reward"], axis=2)  # [P, S]
    transition_pi = np.einsum(
        "psa,sat->pst", probs * (1.0 - env["terminate"]), env["transitions"]
    )  # [P, S, S]
    if horizon is not None:
        values, discounted = np.zeros_like(reward_pi), gamma * transition_pi
        for _ in range(horizon):  # until the horizon or a fixed point in float64
            values, previous = reward_pi + _apply(discounted, values), values
            if np.array_equal(values, previous):
                break
        return values, None
    identity = np.eye(reward_pi.shape[1])
    values = np.linalg.solve(identity - gamma * transition_pi, reward_pi[..., None])[..., 0]
    continuing = gamma * (1.0 - env["terminate"])
    q = env["mean_reward"] + continuing * np.einsum("sat,pt->psa", env["transitions"], values)
    return values, q


def _apply(matrices: np.ndarray, vectors: np.ndarray) -> np.ndarray:
    """matrices [P, S, S] @ vectors [P, S] -> [P, S]."""
    return (matrices @ vectors[..., None])[..., 0]


def truth(env: Params, policies: list[Params], gamma: float, horizon: int | None) -> list[Truth]:
    """initial @ V per policy (the Bellman equations; backward induction under a horizon)."""
    values, _ = _solve(env, policies, gamma, horizon)
    # one dot per policy: a batched product's summation order would move the last bit
    return [(float(env["initial"] @ v), 0.0, "bellman") for v in values]


def q_truth(
    env: Params, policies: list[Params], gamma: float, horizon: int | None
) -> list[np.ndarray | None]:
    """Each policy's exact Q [S, A] (float64), or None under a finite horizon."""
    _, q = _solve(env, policies, gamma, horizon)
    return [None] * len(policies) if q is None else list(q)


ENVIRONMENT = Environment(
    name="chain",
    build=build,
    reset=reset,
    step=step,
    truth=truth,
    q_truth=q_truth,
    noise=(4, 0),
    kind="tabular",
    default_horizon=None,
    reward_range=(0.0, 1.0),
)
