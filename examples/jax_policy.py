"""A policy written in plain JAX, evaluated by ``ope`` as a Python entry point.

``ope`` needs one JAX-traceable function of a single step,
``log_prob(observation, action) -> scalar`` (log pi(action | observation)); it vmaps it
over steps and episodes and jits it, so this file never loops over data. From the
repository root (the current directory is importable):

    ope evaluate examples/data/logs.parquet --policy examples.jax_policy:log_prob

The model is a small MLP in pure ``jax.numpy`` whose parameters live in a module-level
pytree (a dict of arrays), ``PARAMS``. In a real project you would load trained
parameters here instead of drawing them, e.g. with ``numpy.load``, orbax or pickle.

The same pattern fits any JAX library; only the body of ``log_prob`` changes:

- Flax (linen or nnx):    ``logits = model.apply(params, observation)``
  with ``model = MyModule(...)`` and ``params`` restored from your checkpoint at import;
- Equinox:                ``logits = model(observation)``
  where ``model`` is the trained ``eqx.Module`` (loaded with ``eqx.tree_deserialise_leaves``);
- Haiku:                  ``logits = forward.apply(params, None, observation)``.

The observation arrives as a [obs_dim] array and the action as a scalar integer (or a
[act_dim] array for continuous actions, where you would return a Gaussian log-density).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

OBS_DIM, HIDDEN, N_ACTIONS = 4, 16, 4  # the shapes of examples/data/logs.parquet


def init_params(seed: int = 0, scale: float = 0.5) -> dict[str, jax.Array]:
    """A two-layer MLP's parameters as a pytree; deterministic for a seed."""
    rng = np.random.default_rng(seed)
    sizes = [(OBS_DIM, HIDDEN), (HIDDEN, N_ACTIONS)]
    params = {}
    for i, (fan_in, fan_out) in enumerate(sizes):
        weight = scale * rng.normal(size=(fan_in, fan_out)) / np.sqrt(fan_in)
        # float32, as trained parameters usually are; the same values with or without x64.
        params[f"weight_{i}"] = jnp.asarray(weight, jnp.float32)
        params[f"bias_{i}"] = jnp.zeros(fan_out, jnp.float32)
    return params


PARAMS = init_params()  # replace with your trained parameters


def mlp(params: dict[str, jax.Array], observation: jax.Array) -> jax.Array:
    """[obs_dim] -> [n_actions] logits: tanh hidden layer, linear output."""
    hidden = jnp.tanh(observation @ params["weight_0"] + params["bias_0"])
    return hidden @ params["weight_1"] + params["bias_1"]


def log_prob(observation: jax.Array, action: jax.Array) -> jax.Array:
    """log pi(action | observation) for one step: the entry point ``ope`` calls."""
    logits = mlp(PARAMS, jnp.asarray(observation))
    return jax.nn.log_softmax(logits)[action]


# its actions, declared: ope then checks each logged action is one of them and that the
# probabilities sum to 1 over them (without it: an actions_unchecked warning)
log_prob.n_actions = N_ACTIONS


def save_checkpoint(path: str) -> None:
    """The same network as an ``mlp_softmax`` checkpoint (.npz), to cross-check the entry
    point against ``ope``'s built-in MLP: both must give the same estimates."""
    arrays = {name: np.asarray(value) for name, value in PARAMS.items()}
    np.savez(path, kind=np.array("mlp_softmax"), activation=np.array("tanh"), **arrays)


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 2:
        sys.exit(
            "usage: python examples/jax_policy.py OUT.npz  (writes the mlp_softmax checkpoint)"
        )
    save_checkpoint(sys.argv[1])
