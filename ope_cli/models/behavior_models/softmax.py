"""``linear_softmax`` and ``mlp_softmax``: maximum likelihood of the logged discrete
actions, fitted in JAX with optax on the full batch held in memory.

The observations ([N, d] float64), actions and fold of every step are kept in memory, up to
a budget (``memory_budget``: ``OPE_FIT_MEMORY_GB``, default 2 GiB); past it the model
refuses with one line. Both are fitted on standardised features (``standardizer``) and
written for raw ones. ``linear_softmax`` minimises the mean negative log-likelihood plus
``L2 / 2 * |W|^2`` (bias unpenalised; W of the standardised features) with L-BFGS
(convex: one optimum, reached to a tolerance); ``mlp_softmax`` (one tanh hidden layer of
``HIDDEN`` units, fixed seed) with Adam for ``MLP_STEPS`` full-batch steps. Cross-fitting
refits with the held-out fold's weights set to 0, so every fold's fit runs the same
compiled program.
"""

from __future__ import annotations

import functools
import math
import os

import numpy as np

from ope_cli.errors import DataError, UsageError
from ope_cli.models.behavior_models.base import (
    Gather,
    features,
    largest,
    log_softmax,
    standardizer,
    summed,
)

L2 = 1e-4
LBFGS_STEPS, LBFGS_TOLERANCE = 500, 1e-9
HIDDEN, MLP_STEPS, MLP_LEARNING_RATE, MLP_SEED, MLP_L2 = 32, 500, 1e-2, 0, 1e-3
MEMORY_ENV = "OPE_FIT_MEMORY_GB"


def stopped_short_message(model: str, gradient: float) -> str:
    """The warning (``base.BEHAVIOR_FIT_NOT_CONVERGED``) of a ``model`` fit that L-BFGS ended
    at its cap of LBFGS_STEPS with a gradient norm of ``gradient``, above LBFGS_TOLERANCE."""
    return (
        f"the {model} behavior fit stopped at its cap of {LBFGS_STEPS} steps with a gradient "
        f"norm of {gradient:.2g} (its tolerance is {LBFGS_TOLERANCE:g}): its probabilities, "
        "and the weights made with them, are not at the maximum-likelihood optimum (nearly "
        "collinear observation features slow it down: drop or combine them)."
    )


def memory_budget() -> int:
    """Bytes the in-memory models may hold (``OPE_FIT_MEMORY_GB``, default 2); a
    UsageError naming the variable for a value that is not a positive number of GiB (abc
    and nan were internal errors, 0 and -1 budgets of "-1 GiB")."""
    text = os.environ.get(MEMORY_ENV, "2")
    try:
        gib = float(text)
    except ValueError:
        gib = math.nan
    if not (math.isfinite(gib) and gib > 0):
        raise UsageError(
            f"{MEMORY_ENV}={text!r}: give the memory budget as a positive number of GiB"
        )
    return int(gib * 2**30)


def _optax():
    """optax (a dependency), imported when an iterative model is fitted."""
    import optax

    return optax


class SoftmaxModel:
    """The columns a softmax model is fitted on, per step: x [N, d], a [N], fold [N]."""

    def __init__(self, name: str, folds: int = 1, budget: int | None = None):
        self.name = name
        self.folds = folds
        self.budget = memory_budget() if budget is None else budget
        self._x: list[np.ndarray] = []
        self._a: list[np.ndarray] = []
        self._fold: list[np.ndarray] = []
        self.bytes = 0
        self._data = None
        self.stopped_short: float | None = None  # BehaviorModel.stopped_short

    def add(self, observation: np.ndarray, action: np.ndarray, fold: np.ndarray) -> None:
        x = features(observation)
        self.bytes += x.nbytes + 16 * x.shape[0]
        if self.bytes > self.budget:
            raise self._over_budget()
        self._x.append(x)
        self._a.append(np.asarray(action, np.int64))
        self._fold.append(np.asarray(fold, np.int64))

    def data(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(x [N, d], a [N], fold [N]), concatenated in reading order once."""
        if self._data is None:
            if not self._x:
                raise DataError(f"no steps to fit the {self.name} behavior model on")
            self._data = tuple(np.concatenate(p) for p in (self._x, self._a, self._fold))
            self._x, self._a, self._fold = [], [], []
        return self._data

    def gather_processes(self, gather: Gather) -> None:
        """Every process's steps, in process order (the files' order, as one process would
        read them), within the memory budget; every process then fits the same data."""
        (d,) = largest(gather, (self._x[0].shape[1] if self._x else 0,))
        total = int(summed(gather, np.asarray(self.bytes)))
        if total > self.budget:
            raise self._over_budget()
        mine = self.data() if self._x or self._data is not None else None
        if mine is None:
            mine = (np.zeros((0, d)), np.zeros(0, np.int64), np.zeros(0, np.int64))
        self._data = tuple(gather(part) for part in mine)
        self.bytes = total

    def _over_budget(self) -> UsageError:
        return UsageError(
            f"the {self.name} behavior model holds the observations in memory and needs "
            f"more than {self.budget / 2**30:.3g} GiB for this data ({MEMORY_ENV} raises "
            "the budget); fit it on a sample of the episodes (ope fit-behavior) and pass "
            "--behavior B.npz"
        )

    def fit(self, exclude: int | None = None) -> dict[str, np.ndarray]:
        import jax.numpy as jnp

        x, a, fold = self.data()
        n_actions = int(a.max()) + 1
        weights = np.ones(x.shape[0]) if exclude is None else (fold != exclude).astype(float)
        center, scale = standardizer(x, weights)
        args = (jnp.asarray((x - center) / scale), jnp.asarray(a), jnp.asarray(weights))
        if self.name == "linear_softmax":
            params, gradient = _jitted(_fit_linear_program)(*args, n_actions=n_actions)
            if float(gradient) > LBFGS_TOLERANCE:  # stopped by LBFGS_STEPS
                self.stopped_short = max(self.stopped_short or 0.0, float(gradient))
        else:
            params = _jitted(_fit_mlp_program)(*args, n_actions=n_actions)
        params = {key: np.asarray(value, np.float64) for key, value in params.items()}
        first = "weight" if "weight" in params else "weight_0"
        return raw_coordinates(params, first, center, scale)

    def step_log_probs(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        """[N] log pi(a|s) of every step held, NumPy."""
        x, a, _ = self.data()
        return np.take_along_axis(logits_of(arrays, x), a[:, None], axis=1)[:, 0]

    def _select(self, arrays, fold: int | None) -> np.ndarray:
        log_pi = self.step_log_probs(arrays)
        return log_pi if fold is None else log_pi[self.data()[2] == fold]

    def log_likelihood(
        self, arrays: dict[str, np.ndarray], fold: int | None = None
    ) -> tuple[float, int]:
        log_pi = self._select(arrays, fold)
        return float(log_pi.sum()), int(log_pi.size)

    def floored(self, arrays: dict[str, np.ndarray], fold: int | None, floor: float) -> int:
        return int(np.sum(self._select(arrays, fold) < np.log(floor))) if floor > 0 else 0


def raw_coordinates(
    params: dict[str, np.ndarray], first: str, center: np.ndarray, scale: np.ndarray
) -> dict[str, np.ndarray]:
    """The checkpoint arrays of ``params`` fitted on (x - center) / scale, for raw x: the
    first layer's weight ``first`` [d, h] and its bias, z @ W + b = x @ (W / scale) + (b -
    (center / scale) @ W)."""
    bias = "bias" if first == "weight" else "bias_0"
    weight = params[first]
    return {
        **params,
        first: weight / scale[:, None],
        bias: params[bias] - (center / scale) @ weight,
    }


def logits_of(arrays: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """[N, A] log-probabilities of a linear_softmax or mlp_softmax checkpoint's arrays."""
    if "weight" in arrays:
        return log_softmax((x @ arrays["weight"] + arrays["bias"]) / arrays.get("temperature", 1))
    layers = sum(1 for key in arrays if key.startswith("weight_"))
    hidden = x
    for i in range(layers):
        hidden = hidden @ arrays[f"weight_{i}"] + arrays[f"bias_{i}"]
        if i < layers - 1:
            hidden = (
                np.tanh(hidden)
                if str(arrays.get("activation", "tanh")) == "tanh"
                else (np.maximum(hidden, 0.0))
            )
    return log_softmax(hidden)


@functools.cache  # one jitted function per program, so its compilations are reused
def _jitted(program):
    import jax

    return jax.jit(program, static_argnames=("n_actions",))


def _mean_nll(logits, a, weights):
    import jax

    log_pi = jax.numpy.take_along_axis(jax.nn.log_softmax(logits), a[:, None], axis=1)[:, 0]
    return -(weights @ log_pi) / weights.sum()


def _fit_linear_program(x, a, weights, *, n_actions):
    """L-BFGS on the L2-penalised mean NLL; returns {"weight" [d, A], "bias" [A]}."""
    import jax
    import jax.numpy as jnp

    optax = _optax()
    otu = optax.tree_utils

    def loss(params):
        logits = x @ params["weight"] + params["bias"]
        return _mean_nll(logits, a, weights) + 0.5 * L2 * jnp.sum(params["weight"] ** 2)

    params = {"weight": jnp.zeros((x.shape[1], n_actions)), "bias": jnp.zeros(n_actions)}
    solver = optax.lbfgs()
    value_and_grad = optax.value_and_grad_from_state(loss)

    def step(carry):
        params, state = carry
        value, grad = value_and_grad(params, state=state)
        updates, state = solver.update(grad, state, params, value=value, grad=grad, value_fn=loss)
        return optax.apply_updates(params, updates), state

    def going(carry):
        _, state = carry
        count = otu.tree_get(state, "count")
        grad = otu.tree_get(state, "grad")
        return (count == 0) | ((count < LBFGS_STEPS) & (otu.tree_norm(grad) > LBFGS_TOLERANCE))

    params, state = jax.lax.while_loop(going, step, (params, solver.init(params)))
    return params, otu.tree_norm(otu.tree_get(state, "grad"))


def _fit_mlp_program(x, a, weights, *, n_actions):
    """Adam on the L2-penalised mean NLL of a one-hidden-layer tanh MLP."""
    import jax
    import jax.numpy as jnp

    optax = _optax()
    k0, k1 = jax.random.split(jax.random.key(MLP_SEED))
    d = x.shape[1]
    params = {
        "weight_0": jax.random.normal(k0, (d, HIDDEN)) / jnp.sqrt(d),
        "bias_0": jnp.zeros(HIDDEN),
        "weight_1": jax.random.normal(k1, (HIDDEN, n_actions)) / jnp.sqrt(HIDDEN),
        "bias_1": jnp.zeros(n_actions),
    }

    def loss(p):
        logits = jnp.tanh(x @ p["weight_0"] + p["bias_0"]) @ p["weight_1"] + p["bias_1"]
        penalty = jnp.sum(p["weight_0"] ** 2) + jnp.sum(p["weight_1"] ** 2)
        return _mean_nll(logits, a, weights) + 0.5 * MLP_L2 * penalty

    solver = optax.adam(MLP_LEARNING_RATE)

    def step(_, carry):
        p, state = carry
        updates, state = solver.update(jax.grad(loss)(p), state, p)
        return optax.apply_updates(p, updates), state

    params, _ = jax.lax.fori_loop(0, MLP_STEPS, step, (params, solver.init(params)))
    return params
