"""Per-step log-probabilities of the checkpoint kinds (pure JAX), written for one step:
``log_prob(params, observation, action) -> []``; the kernel vmaps them over steps, episodes
and (stacked checkpoints) policies. JAX is imported inside, so loading a checkpoint does not
import it."""

from __future__ import annotations

import functools
import math

from ope_cli.models.policies.base import LogitsFn, LogProbFn


def _jnp():
    import jax.numpy as jnp

    return jnp


def _vector(observation):
    jnp = _jnp()
    return jnp.atleast_1d(observation)


UNROLLED_ACTIONS = 16  # up to this many actions, the softmax works action by action


def _columns(logits):
    """([A] columns of ONE step's logits, their max, the sum of exp(column - max)): the
    softmax's parts, max-shifted as ``jax.nn.log_softmax`` is. With few actions they are
    written action by action: vmapped, a reduction over a minor axis of 4 ran about 3x
    slower on XLA's CPU backend than the same arithmetic on [steps, policies] slabs."""
    import jax

    jnp = _jnp()
    columns = [logits[i] for i in range(logits.shape[-1])]
    top = jax.lax.stop_gradient(functools.reduce(jnp.maximum, columns))
    exps = [jnp.exp(column - top) for column in columns]
    return columns, top, exps, functools.reduce(jnp.add, exps)


def log_softmax_at(logits, action):
    """log softmax(logits)[action] for ONE step ([A] logits, an int action), equal to
    ``jax.nn.log_softmax`` within rounding, but for the one action: vmapped over many steps
    and policies, no [..., A] array of every action's log-probability is written. With
    few actions, the action's entry is chosen action by action: an index
    (``shifted[action]``) is a gather per step and policy, slower than the rest of the
    kernel together. The data's actions are checked to be in range before the kernel."""
    import jax

    jnp = _jnp()
    if logits.shape[-1] > UNROLLED_ACTIONS:
        # an index, not a one-hot sum: vmapped over every action (``action_log_probs``, V-hat)
        # a one-hot of each made [steps, A, A] (1,000 actions asked for 66 GB)
        shifted = logits - jax.lax.stop_gradient(jnp.max(logits, initial=-jnp.inf))
        return shifted[action] - jnp.log(jnp.sum(jnp.exp(shifted)))
    columns, top, _, total = _columns(logits)
    chosen = columns[0] - top
    for i, column in enumerate(columns[1:], start=1):
        chosen = jnp.where(action == i, column - top, chosen)
    return chosen - jnp.log(total)


def softmax_all(logits):
    """([A] log softmax, [A] softmax) of ONE step's [A] logits, sharing their exponentials:
    pi(a|s) of every action (V-hat's) at the cost of log_softmax alone, where exp of each
    log-probability costs A more exponentials a step. The log-probabilities are
    ``log_softmax_at``'s, bit for bit."""
    import jax

    jnp = _jnp()
    if logits.shape[-1] > UNROLLED_ACTIONS:
        shifted = logits - jax.lax.stop_gradient(jnp.max(logits, initial=-jnp.inf))
        exps = jnp.exp(shifted)
        total = jnp.sum(exps)
        return shifted - jnp.log(total), exps / total
    columns, top, exps, total = _columns(logits)
    log_total = jnp.log(total)
    log_p = jnp.stack([column - top - log_total for column in columns])
    return log_p, jnp.stack([e / total for e in exps])


def logit_probs(logits: LogitsFn | None, params, observation, n_actions: int):
    """``softmax_all`` of ONE step's logits (a softmax policy's ``Policy.logits``) where the
    policy has them for ``n_actions`` actions, else None: the caller then takes exp of
    ``action_log_probs``."""
    if logits is None:
        return None
    values = logits(params, observation)
    return softmax_all(values) if values.shape == (n_actions,) else None


def tabular_logits(params, observation):
    """[A] logits of integer state ``observation``."""
    return params["logits"][observation]


def tabular_log_prob(params, observation, action):
    """log softmax(logits[s])[a]; observation is an integer state."""
    return log_softmax_at(tabular_logits(params, observation), action)


def linear_softmax_logits(params, observation):
    """[A] (s @ W + b) / temperature."""
    return (_vector(observation) @ params["weight"] + params["bias"]) / params["temperature"]


def linear_softmax_log_prob(params, observation, action):
    """log softmax((s @ W + b) / temperature)[a]."""
    return log_softmax_at(linear_softmax_logits(params, observation), action)


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
def _mlp_logits(activation: str) -> LogitsFn:
    def mlp_softmax_logits(params, observation):
        """[A] MLP(s) with ``activation`` between layers."""
        return mlp_forward(params, _vector(observation), activation)

    return mlp_softmax_logits


@functools.cache
def _mlp_log_prob(activation: str) -> LogProbFn:
    logits = _mlp_logits(activation)

    def mlp_softmax_log_prob(params, observation, action):
        """log softmax(MLP(s))[a] with ``activation`` between layers."""

        return log_softmax_at(logits(params, observation), action)

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
    # drawn in float32 whatever the kernel's precision: one key gives the same actions in
    # float32 and float64 (a float64 draw is other numbers, so V-hat's Monte Carlo mean,
    # hence dr and wdr, changed with --precision by their sampling noise)
    noise = jax.random.normal(key, mean.shape, _jnp().float32).astype(mean.dtype)
    return mean + _jnp().exp(params["log_std"]) * noise


def action_log_probs(log_prob: LogProbFn, params, observation, n_actions: int):
    """[n_actions] log pi(a|s) of every discrete action a of one step (``log_prob`` vmapped
    over the actions 0 .. n_actions - 1), e.g. for V(s) = sum_a pi(a|s) Q(s, a)."""
    import jax

    actions = _jnp().arange(n_actions)
    return jax.vmap(log_prob, in_axes=(None, None, 0))(params, observation, actions)
