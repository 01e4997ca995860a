"""``bandit``: a contextual bandit, one step per episode.

5-d contexts drawn uniformly from a fixed set of 100, 10 actions, Bernoulli rewards (a
logistic click model); ``linear_softmax`` policies. Truth: exact enumeration over contexts
and actions.
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
    linear_softmax,
    sample_index,
    shifted,
    softmax_np,
)


def build(shift: float, count: int = DEFAULT_POLICIES) -> tuple[Params, list[Params]]:
    """Contexts [100, 5], click-model weights [5, 10] and biases [10]."""
    rng = np.random.default_rng(101)
    n_contexts, dim, n_actions = 100, 5, 10
    env = {
        "contexts": rng.normal(size=(n_contexts, dim)),
        "reward_weight": rng.normal(scale=0.6, size=(dim, n_actions)),
        "reward_bias": rng.normal(loc=-1.0, scale=0.5, size=n_actions),
    }
    behavior = {"weight": rng.normal(scale=0.2, size=(dim, n_actions)), "bias": np.zeros(n_actions)}
    direction = {"weight": 2.0 * env["reward_weight"], "bias": 2.0 * env["reward_bias"]}
    return env, shifted(behavior, direction, shift, count)


def reset(params: Params, uniform: jax.Array, normal: jax.Array) -> State:
    n_contexts = params["contexts"].shape[0]
    return {
        "obs": params["contexts"][
            jnp.minimum(jnp.floor(uniform[0] * n_contexts), n_contexts - 1).astype(int)
        ]
    }


def step(params: Params, state: State, uniform: jax.Array, normal: jax.Array, t: jax.Array):
    obs = state["obs"]
    probs = linear_softmax(params["behavior"], obs)
    action = sample_index(uniform[0], probs)
    click_prob = jax.nn.sigmoid(obs @ params["reward_weight"] + params["reward_bias"])[action]
    reward = (uniform[1] < click_prob).astype(jnp.float64)
    record = {
        "observation": obs,
        "action": action,
        "reward": reward,
        "behavior_prob": probs[action],
    }
    return state, record, jnp.bool_(True)


def truth(env: Params, policies: list[Params], gamma: float, horizon: int | None) -> list[Truth]:
    """Mean over the contexts of sum_a pi(a|x) P(click | x, a), for all policies at once."""
    x = env["contexts"]  # [C, d]
    click = 1.0 / (1.0 + np.exp(-(x @ env["reward_weight"] + env["reward_bias"])))  # [C, A]
    weight, bias = (np.stack([p[k] for p in policies]) for k in ("weight", "bias"))
    probs = softmax_np(x @ weight + bias[:, None, :])  # [P, C, A]
    values = np.mean(np.sum(probs * click, axis=2), axis=1)  # [P]
    return [(float(v), 0.0, "exact enumeration") for v in values]


ENVIRONMENT = Environment(
    name="bandit",
    build=build,
    reset=reset,
    step=step,
    truth=truth,
    noise=(2, 0),
    kind="linear_softmax",
    default_horizon=1,
    reward_range=(0.0, 1.0),
)
