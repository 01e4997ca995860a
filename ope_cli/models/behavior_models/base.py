"""What every behavior model shares: the model registry, the default model of a dataset,
and the interface a model implements (episode folds by id hash are in ``ope_cli.data.ids``).

A model collects sufficient statistics (counts, normal equations) or, for the iterative
ones, the needed columns, *per fold* of episodes, streaming over EpisodeChunks; it is then
fitted on all folds, or on all but one (cross-fitting, held-out log-likelihood), without
reading the data again. Host-side NumPy except where a model says otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Protocol

import numpy as np

from ope_cli.errors import UsageError

# model name -> the checkpoint kind (SPEC section 3) it writes
MODELS: dict[str, str] = {
    "tabular": "tabular",
    "linear_softmax": "linear_softmax",
    "mlp_softmax": "mlp_softmax",
    "linear_gaussian": "linear_gaussian",
}
DISCRETE_MODELS = ("tabular", "linear_softmax", "mlp_softmax")
MIN_PROPENSITY = 1e-3


Gather = Callable[[np.ndarray], np.ndarray]  # [n_p, ...] per process -> [sum n_p, ...]


def summed(gather: Gather, array: np.ndarray) -> np.ndarray:
    """``array`` (the same shape in every process) summed over the processes."""
    return gather(np.asarray(array)[None]).sum(axis=0)


def largest(gather: Gather, values: tuple[int, ...]) -> tuple[int, ...]:
    """Elementwise maximum over the processes of a tuple of ints."""
    return tuple(int(v) for v in gather(np.asarray(values, np.int64)[None]).max(axis=0))


class BehaviorModel(Protocol):
    """A behavior model's statistics over folds of episodes.

    ``add`` streams steps in; ``fit(exclude)`` returns checkpoint arrays (without ``kind``)
    fitted on every fold but ``exclude`` (None: all); ``log_likelihood(arrays, fold)``
    is (sum of log pi(a|s), steps) over one fold's steps (None: all); ``floored(arrays,
    fold, floor)`` counts that fold's steps whose fitted probability is below ``floor``.
    """

    name: str
    # the largest gradient norm of a fit stopped by its step cap, not at its tolerance
    # (iterative models); None where every fit converged or the model is closed-form
    stopped_short: float | None

    def add(self, observation: np.ndarray, action: np.ndarray, fold: np.ndarray) -> None: ...

    def fit(self, exclude: int | None = None) -> dict[str, np.ndarray]: ...

    def log_likelihood(
        self, arrays: dict[str, np.ndarray], fold: int | None = None
    ) -> tuple[float, int]: ...

    def floored(self, arrays: dict[str, np.ndarray], fold: int | None, floor: float) -> int: ...

    def gather_processes(self, gather: Gather) -> None: ...


def default_model(observation_kind: str | None, action_kind: str) -> str:
    """SPEC section 8: tabular for integer states and discrete actions, linear_softmax for
    other observations and discrete actions, linear_gaussian for continuous actions."""
    if action_kind != "discrete":
        return "linear_gaussian"
    return "tabular" if observation_kind == "index" else "linear_softmax"


def parse_model(spec: str, option: str = "--behavior") -> str | None:
    """The model of ``estimate[:MODEL]`` (None: the default); UsageError for an unknown one."""
    _, _, model = spec.partition(":")
    if not model:
        return None
    check_model_name(model, f"{option} {spec}")
    return model


def check_model_name(model: str, option: str = "--model") -> None:
    """A UsageError naming ``option`` for a model that is not one of MODELS."""
    if model not in MODELS:
        raise UsageError(
            f"{option}: unknown behavior model {model!r} (choose from {', '.join(MODELS)})"
        )


def check_model_fits(
    model: str, observation_kind: str | None, action_kind: str, option: str
) -> None:
    """A UsageError when ``model`` cannot describe the data's observations and actions
    (the actions first: the models it suggests for the observations are discrete ones)."""
    if model in DISCRETE_MODELS and action_kind != "discrete":
        raise UsageError(
            f"{option}: the {model} model is over discrete actions, but the data's actions "
            "are continuous; use linear_gaussian"
        )
    if model == "tabular" and observation_kind != "index":
        raise UsageError(
            f"{option}: the tabular model needs integer state observations, but the data's "
            f"observations are {observation_kind} values; use linear_softmax or mlp_softmax"
        )
    if model == "linear_gaussian" and action_kind == "discrete":
        raise UsageError(
            f"{option}: the linear_gaussian model is over continuous actions, but the data's "
            "actions are integers; use tabular, linear_softmax or mlp_softmax"
        )


# A fitted behavior model stopped by its step cap short of the optimum (evaluate and
# fit-behavior alike)
BEHAVIOR_FIT_NOT_CONVERGED = "behavior_fit_not_converged"


def check_floor_applies(model: str, min_propensity: float) -> None:
    """A UsageError for a ``--min-propensity`` given with a model of continuous actions: it
    estimates densities, which are not probabilities and are not floored."""
    if model not in DISCRETE_MODELS and min_propensity != MIN_PROPENSITY:
        raise UsageError(
            f"--min-propensity floors estimated probabilities of discrete actions; the {model} "
            "model estimates densities of continuous ones, which are not floored: drop it"
        )


def check_min_propensity(value: float) -> None:
    if not (math.isfinite(value) and 0.0 <= value < 1.0):
        raise UsageError(f"--min-propensity must be in [0, 1), got {value}")


def features(observation: np.ndarray) -> np.ndarray:
    """[N, d] float64 features of [N] (index or scalar) or [N, d] observations."""
    values = np.asarray(observation, np.float64)
    return values[:, None] if values.ndim == 1 else values


def usable_spread(spread, center, xp=np):
    """Each feature's spread where it is its own, else 1 (a constant feature): a spread
    within rounding of the feature's size is rounding (3.3 repeated gives 4e-15), and
    dividing by it made weights of 1e12 that cancel in float64 only. NumPy, or ``xp``."""
    return xp.where(spread > 1e-12 * xp.maximum(xp.abs(center), 1.0), spread, 1.0)


def standardizer(x: np.ndarray, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """([d] mean, [d] usable spread) of the features ``x`` [N, d] over the steps fitted on
    (``weights`` [N]): the fitted models see (x - mean) / spread. On raw features a feature
    of 10,000 +- 50 (an altitude in metres) left L-BFGS 500 steps short of the optimum and
    the estimates 56% off, without a word."""
    total = max(float(weights.sum()), 1.0)
    center = (weights @ x) / total
    spread = np.sqrt((weights @ (x - center) ** 2) / total)
    return center, usable_spread(spread, center)


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """log softmax over the last axis, float64."""
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
