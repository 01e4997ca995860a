"""The one jitted kernel per policy group: vmap the policy over steps, episodes and
stacked policies, then reduce a padded [B, T] batch to BatchStatistics with a leading
policy axis [P, ...]."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import numpy as np

from ope_cli.buckets import PaddedBatch
from ope_cli.errors import OpeError, PolicyError
from ope_cli.estimators import BatchStatistics, batch_statistics, log_weights
from ope_cli.policies import Policy


@dataclasses.dataclass
class PolicyGroup:
    """Policies evaluated by one kernel: one entry point, the logged target, or checkpoints
    of one kind and shapes, stacked. ``indices`` are their positions on the command line."""

    policies: list[Policy]
    indices: list[int]

    @property
    def head(self) -> Policy:
        return self.policies[0]

    def stacked_params(self, dtype) -> dict[str, jax.Array] | None:
        """Parameters with a leading policy axis [P, ...], or None without parameters."""
        if self.head.params is None:
            return None
        return {
            key: jnp.asarray(np.stack([p.params[key] for p in self.policies]), dtype)
            for key in self.head.params
        }


def group_policies(policies: Sequence[Policy]) -> list[PolicyGroup]:
    """Groups stackable policies, keeping first-appearance order."""
    groups: dict[tuple, PolicyGroup] = {}
    for index, policy in enumerate(policies):
        group = groups.setdefault(policy.stack_key, PolicyGroup([], []))
        group.policies.append(policy)
        group.indices.append(index)
    return list(groups.values())


class Kernel:
    """A jitted ``(params, batch arrays) -> BatchStatistics [P, ...]`` for one policy group.

    ``traces`` counts compilations (one per distinct batch shape) for tests and reports.
    """

    def __init__(self, group: PolicyGroup, gamma: float, num_groups: int, dtype):
        self.group = group
        self.dtype = dtype
        self.traces = 0
        self.params = group.stacked_params(dtype)
        self._jitted = jax.jit(functools.partial(self._statistics, gamma=gamma, num_groups=num_groups))

    def _policy_log_probs(self, params, observation, action, log_target, step_mask):
        """[P, B, T] log pi_e(a_t | s_t) of every policy in the group."""
        head = self.group.head
        if head.log_prob is None:  # logged target probabilities
            return log_target[None]
        per_step = jax.vmap(jax.vmap(head.log_prob, in_axes=(None, 0, 0)), in_axes=(None, 0, 0))
        if params is None:
            log_pi = per_step(None, observation, action)[None]
        else:
            log_pi = jax.vmap(per_step, in_axes=(0, None, None))(params, observation, action)
        expected = (len(self.group.policies), *step_mask.shape)
        if log_pi.shape != expected:
            raise PolicyError(f"policy {head.name}: log_prob must return a scalar per step, got "
                              f"shape {log_pi.shape[3:]}")
        return log_pi.astype(self.dtype)

    def _statistics(self, params, observation, action, reward, log_behavior, log_target,
                    step_mask, episode_mask, group, *, gamma, num_groups) -> BatchStatistics:
        self.traces += 1
        log_pi = self._policy_log_probs(params, observation, action, log_target, step_mask)
        log_w = log_weights(log_pi, log_behavior, step_mask)
        per_policy = functools.partial(batch_statistics, gamma=gamma, num_groups=num_groups)
        return jax.vmap(per_policy, in_axes=(0, None, None, None, None))(
            log_w, reward, step_mask, episode_mask, group
        )

    def __call__(self, batch: PaddedBatch) -> BatchStatistics:
        """Dispatches the kernel asynchronously; the result holds device arrays."""
        def real(x):
            if x is None:
                return None
            return jnp.asarray(x, self.dtype) if np.issubdtype(x.dtype, np.floating) else jnp.asarray(x)

        args = (self.params, real(batch.observation), real(batch.action), real(batch.reward),
                real(batch.log_behavior), real(batch.log_target), batch.step_mask,
                batch.episode_mask, batch.group)
        if self.group.head.kind != "entry_point":
            return self._jitted(*args)
        try:
            return self._jitted(*args)
        except OpeError:
            raise
        except Exception as error:  # noqa: BLE001 - user code failing under jit is a policy error
            message = str(error).strip().splitlines()[0] if str(error).strip() else ""
            raise PolicyError(f"policy {self.group.head.name} cannot be evaluated under jax.jit/vmap "
                              f"(is it JAX-traceable?): {type(error).__name__}: {message}") from None
