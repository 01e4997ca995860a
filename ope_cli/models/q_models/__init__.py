"""Fitted Q evaluation of an evaluation policy pi_e (``ope fit-q``, ``--q fit``): one module
per model, each writing a Q checkpoint of SPEC section 9.

- ``tabular``: the empirical MDP from streamed counts, solved exactly (flat memory);
- ``linear``: the LSTDQ fixed point in closed form from streamed sums (flat memory);
- ``mlp``: frozen-target iterations in JAX with optax, on the transitions held in memory up
  to a budget, early-stopped on the Bellman error of held-out episodes.

Every model collects its statistics per fold of episodes (by id hash, as the behavior
models do), so cross-fitting (``fit(exclude=k)``) needs no second pass over the data.
"""
