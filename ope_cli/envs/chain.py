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

from ope_cli.envs.base import Environment, Params, State, Truth, sample_index, shifted, softmax_np


def build(shift: float) -> tuple[Params, list[Params]]:
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
    return env, shifted(behavior, direction, shift)


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


def _solve(env: Params, policy: Params, gamma: float, horizon: int | None):
    """V [S] of a policy and, when ``horizon`` is None, its Q [S, A]; both from one solve.

    V = r_pi + gamma P_pi V with P_pi [S, S] the continuing transitions under pi, and
    Q(s, a) = mean_reward(s, a) + gamma (1 - terminate(s, a)) sum_s' P(s' | s, a) V(s').
    A finite horizon makes the value of a capped episode depend on time: Q is then None.
    """
    probs = softmax_np(policy["logits"])
    reward_pi = np.sum(probs * env["mean_reward"], axis=1)
    transition_pi = np.einsum("sa,sat->st", probs * (1.0 - env["terminate"]), env["transitions"])
    if horizon is not None:
        values = np.zeros_like(reward_pi)
        for _ in range(horizon):  # until the horizon or a fixed point in float64
            values, previous = reward_pi + gamma * transition_pi @ values, values
            if np.array_equal(values, previous):
                break
        return values, None
    values = np.linalg.solve(np.eye(len(reward_pi)) - gamma * transition_pi, reward_pi)
    continuing = gamma * (1.0 - env["terminate"])
    q = env["mean_reward"] + continuing * np.einsum("sat,t->sa", env["transitions"], values)
    return values, q


def truth(env: Params, policies: list[Params], gamma: float, horizon: int | None) -> list[Truth]:
    """initial @ V per policy (the Bellman equations; backward induction under a horizon)."""
    return [
        (float(env["initial"] @ _solve(env, policy, gamma, horizon)[0]), 0.0, "bellman")
        for policy in policies
    ]


def q_truth(
    env: Params, policies: list[Params], gamma: float, horizon: int | None
) -> list[np.ndarray | None]:
    """Each policy's exact Q [S, A] (float64), or None under a finite horizon."""
    return [_solve(env, policy, gamma, horizon)[1] for policy in policies]


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
