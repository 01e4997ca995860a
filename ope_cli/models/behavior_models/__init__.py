"""Behavior models fitted to the logged actions (``--behavior estimate``, ``ope
fit-behavior``): one module per model, each writing a policy checkpoint of SPEC section 3.

- ``tabular``: counts per integer state, additive smoothing (streaming, flat memory);
- ``linear_gaussian``: normal equations for the mean, residual spread (streaming);
- ``linear_softmax`` / ``mlp_softmax``: maximum likelihood in JAX with optax, on the
  needed columns held in memory up to a budget.

JAX and optax are imported only when an iterative model is fitted.
"""
