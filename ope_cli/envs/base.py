"""The environment record of ``ope generate`` and what every environment shares.

An environment is one record (``Environment``): its name, its defaults (horizon, declared
reward range, the checkpoint kind of its policies), four functions and an optional fifth:

- ``build(shift, count) -> (env arrays, [behavior, eval_0, ..., eval_{count-1}] policy arrays)``,
  the evaluation policies at ``policy_scales(count)`` (default 3: eval_0, eval_1, eval_2);
- ``reset(params, uniform [U], normal [N]) -> per-episode state with "obs"``;
- ``step(params, state, uniform [U], normal [N], t) -> (next state, record, terminated)``, the
  record holding "observation", "action", "reward", "behavior_prob" under params["behavior"];
- ``truth(env arrays, policies, gamma, horizon) -> [(value, stderr, method)]`` per policy, the
  exact (or Monte Carlo, with its standard error) value of each policy;
- optionally ``q_truth(env arrays, policies, gamma, horizon) -> [Q [n_states, n_actions] or
  None]`` per policy, the exact action values where the states are tabular (``tabular_q``
  checkpoints); None for an environment without them, or a policy entry None where they
  are not exact (a finite horizon makes Q depend on time).

``reset`` and ``step`` are written for one episode; the rollout engine vmaps and scans them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

DEFAULT_POLICIES = 3  # evaluation policies eval_0, eval_1, eval_2: scales (1, 1/2, -1)
MAX_POLICIES = 1000

Params = dict[str, Any]
State = dict[str, jax.Array]
Record = dict[str, jax.Array]
Truth = tuple[float, float, str]  # value, stderr, method
QTruth = Callable[[Params, list[Params], float, int | None], list[np.ndarray | None]]


@dataclasses.dataclass(frozen=True)
class Environment:
    """One environment of ``ope generate``: its name, defaults, rollout and exact truth."""

    name: str
    build: Callable[[float, int], tuple[Params, list[Params]]]
    reset: Callable[..., State]
    step: Callable[..., tuple[State, Record, jax.Array]]
    truth: Callable[[Params, list[Params], float, int | None], list[Truth]]
    noise: tuple[int, int]  # uniforms and normals a reset or a step draws
    kind: str  # the policies' checkpoint kind
    default_horizon: int | None
    reward_range: tuple[float, float] | None  # declared in the logs' metadata when bounded
    q_truth: QTruth | None = None  # exact tabular Q per policy, where the states are tabular


def draw(key: jax.Array, steps: int, noise: tuple[int, int]) -> tuple[jax.Array, jax.Array]:
    """One random call: uniforms in (0, 1) [steps, U] and standard normals [steps, N]."""
    n_uniform, n_normal = noise
    raw = jax.random.uniform(key, (steps, n_uniform + n_normal), minval=np.nextafter(-1.0, 0.0))
    uniform = (raw[:, :n_uniform] + 1.0) / 2.0
    normal = math.sqrt(2.0) * jax.scipy.special.erfinv(raw[:, n_uniform:])
    return uniform, normal


def sample_index(uniform: jax.Array, probs: jax.Array) -> jax.Array:
    """Inverse-CDF draw of an index from probs [n] with one uniform []; returns int []."""
    return jnp.sum(uniform > jnp.cumsum(probs)[:-1])


def linear_softmax(policy: Params, obs: jax.Array) -> jax.Array:
    """softmax(obs [d] @ weight [d, A] + bias [A]) -> probs [A]."""
    return jax.nn.softmax(obs @ policy["weight"] + policy["bias"])


def softmax_np(logits: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, float64 NumPy."""
    z = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def policy_scales(count: int = DEFAULT_POLICIES) -> tuple[float, ...]:
    """The scales of `count` evaluation policies, best first: min(1 - x, 2 - 3x) at x = k / (K - 1),
    from 1 down to 1/2 over the first half of them, then three times as fast on down to -1
    (K = 1: (1,); K = 2: (1, -1); K = 3: (1, 1/2, -1), the default's checkpoints).

    The directions improve on the behavior policy, so a third of the policies are worse than
    it (scale < 0) and the rest better, denser near the best, like the checkpoints of a run
    that improves; the extremes are the default's, so the importance weights are no wilder.
    """
    x = np.arange(count) / max(count - 1, 1)
    return tuple(float(s) for s in np.minimum(1.0 - x, 2.0 - 3.0 * x))


def shifted(
    behavior: Params, direction: Params, shift: float, count: int = DEFAULT_POLICIES
) -> list[Params]:
    """[behavior, eval_0, ..., eval_{count-1}]: eval_k = behavior + scale_k * shift * direction,
    scale_k from ``policy_scales(count)``."""
    evals = [
        {k: v + scale * shift * direction[k] for k, v in behavior.items()}
        for scale in policy_scales(count)
    ]
    return [behavior, *evals]
