"""Per-step log-probabilities of the checkpoint kinds (pure JAX), written for one step:
``log_prob(params, observation, action) -> []``; the kernel vmaps them over steps, episodes
and (stacked checkpoints) policies. JAX is imported inside, so loading a checkpoint does not
import it."""

from __future__ import annotations

import functools
import math

from ope_cli.models.policies.base import LogProbFn


def _jnp():
    import jax.numpy as jnp

    return jnp


def _vector(observation):
    jnp = _jnp()
    return jnp.atleast_1d(observation)


def log_softmax_at(logits, action):
    """log softmax(logits)[action], as ``jax.nn.log_softmax`` computes it (the same
    operations, so the same numbers) but for the one action: vmapped over many steps and
    policies, no [..., A] array of every action's log-probability is written."""
    import jax

    jnp = _jnp()
    shifted = logits - jax.lax.stop_gradient(jnp.max(logits, initial=-jnp.inf))
    # the action's entry by a mask, not an index: vmapped, an index is a gather per step
    # and policy, which cost XLA on CPU more than the rest of the kernel together (x + 0 is
    # exact, so the number is the same; the data's actions are checked to be in range)
    chosen = jnp.sum(jnp.where(jnp.arange(shifted.shape[-1]) == action, shifted, 0.0))
    return chosen - jnp.log(jnp.sum(jnp.exp(shifted)))


def tabular_log_prob(params, observation, action):
    """log softmax(logits[s])[a]; observation is an integer state."""
    return log_softmax_at(params["logits"][observation], action)


def linear_softmax_log_prob(params, observation, action):
    """log softmax((s @ W + b) / temperature)[a]."""
    logits = (_vector(observation) @ params["weight"] + params["bias"]) / params["temperature"]
    return log_softmax_at(logits, action)


def mlp_forward(params, inputs, activation: str):
    """[width] the MLP of ``weight_i``/``bias_i`` layers on [d] ``inputs``, ``activation``
    (tanh or relu) between layers and none after the last."""
    import jax

    act = {"tanh": _jnp().tanh, "relu": jax.nn.relu}[activation]
    hidden = inputs
    layers = len([key for key in params if key.startswith("weight_")])
    for i in range(layers):
        hidden = hidden @ params[f"weight_{i}"] + params[f"bias_{i}"]
        if i < layers - 1:
            hidden = act(hidden)
    return hidden


@functools.cache  # one function object per activation, so the jit cache recognises it
def _mlp_log_prob(activation: str) -> LogProbFn:
    def mlp_softmax_log_prob(params, observation, action):
        """log softmax(MLP(s))[a] with ``activation`` between layers."""

        return log_softmax_at(mlp_forward(params, _vector(observation), activation), action)

    return mlp_softmax_log_prob


def linear_gaussian_log_prob(params, observation, action):
    """Diagonal Gaussian log-density of the action vector, mean s @ W + b, std exp(log_std)."""
    jnp = _jnp()
    mean = _vector(observation) @ params["weight"] + params["bias"]
    log_std = params["log_std"]
    z = (jnp.atleast_1d(action) - mean) * jnp.exp(-log_std)
    return jnp.sum(-0.5 * z * z - log_std - 0.5 * math.log(2 * math.pi))


def linear_gaussian_sample(params, key, observation):
    """[act_dim] one action from the diagonal Gaussian of ``linear_gaussian_log_prob``."""
    import jax

    mean = _vector(observation) @ params["weight"] + params["bias"]
    return mean + _jnp().exp(params["log_std"]) * jax.random.normal(key, mean.shape, mean.dtype)


def action_log_probs(log_prob: LogProbFn, params, observation, n_actions: int):
    """[n_actions] log pi(a|s) of every discrete action a of one step (``log_prob`` vmapped
    over the actions 0 .. n_actions - 1), e.g. for V(s) = sum_a pi(a|s) Q(s, a)."""
    import jax

    actions = _jnp().arange(n_actions)
    return jax.vmap(log_prob, in_axes=(None, None, 0))(params, observation, actions)
