"""A policy against the data: type-level before any row is read (``check_against_schema``),
value-level per chunk as validation checks (``chunk_checks``)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple

import numpy as np

from ope_cli.data.ids import locate_key
from ope_cli.data.validate import Check
from ope_cli.errors import DataError, PolicyError
from ope_cli.models.policies.base import Policy


def check_against_schema(policy: Policy, schema) -> None:
    """Type-level compatibility of a policy and the data (before any row is read)."""
    if policy.discrete is True and schema.action_kind != "discrete":
        raise DataError(
            f"actions in column {schema.columns['action']!r} are not integers, but policy "
            f"{policy.name} ({policy.kind}) is over discrete actions"
        )
    if policy.discrete is False and schema.action_kind == "discrete":
        raise DataError(
            f"actions in column {schema.columns['action']!r} are integers, but policy "
            f"{policy.name} ({policy.kind}) is over continuous actions"
        )
    if policy.kind == "tabular" and schema.observation_kind != "index":
        raise DataError(
            f"policy {policy.name} is tabular and needs integer state observations, but "
            f"column {schema.columns['observation']!r} holds {schema.observation_kind} values"
        )
    if policy.obs_dim is not None and schema.observation_dim not in (None, policy.obs_dim):
        raise DataError(
            f"observations in column {schema.columns['observation']!r} have size "
            f"{schema.observation_dim}, but policy {policy.name} expects {policy.obs_dim}"
        )


def chunk_checks(policy: Policy, chunk) -> Iterator[Check]:
    """Value-level compatibility of one chunk with the policy, as validate.value_checks does
    it: yields Check(reason, problem, [N] bool rows). Action and state ranges can be dropped
    (``--on-invalid drop``); a size mismatch concerns every row and never is."""
    if policy.n_actions is not None:
        yield Check(
            "action_out_of_range",
            f"action is outside policy {policy.name}'s {policy.n_actions} actions "
            f"(0..{policy.n_actions - 1})",
            chunk.action >= policy.n_actions,
        )
    if policy.n_states is not None and chunk.observation is not None:
        yield Check(
            "state_out_of_range",
            f"state index is outside policy {policy.name}'s {policy.n_states} states "
            f"(0..{policy.n_states - 1})",
            chunk.observation >= policy.n_states,
        )
    if policy.obs_dim is not None and chunk.observation is not None:
        size = 1 if chunk.observation.ndim == 1 else chunk.observation.shape[1]
        if size != policy.obs_dim:
            yield Check(
                "observation_size",
                f"observation has size {size}, but policy {policy.name} expects {policy.obs_dim}",
                np.ones(chunk.num_steps, bool),
            )
    if policy.act_dim is not None:
        size = 1 if chunk.action.ndim == 1 else chunk.action.shape[1]
        if size != policy.act_dim:
            yield Check(
                "action_size",
                f"action has size {size}, but policy {policy.name} expects {policy.act_dim}",
                np.ones(chunk.num_steps, bool),
            )


class FaultySteps(NamedTuple):
    """The kernel's count of real steps where an evaluation policy's log-probability of the
    logged action is no log-probability (NaN, +inf, or above 0 for a discrete action:
    a probability above 1), and the first one, per device: leaves [D] ([1] per shard).

      count: int32 steps so affected, over the group's policies.
      key_hi, key_lo: uint32 halves of the first such step's episode key.
      step: int32 its step in the episode; value: its log-probability.
      policy: int32 the policy's row in its kernel's group.
    """

    count: np.ndarray
    key_hi: np.ndarray
    key_lo: np.ndarray
    step: np.ndarray
    value: np.ndarray
    policy: np.ndarray


def faulty_policy_error(policies: list[Policy], found: FaultySteps, chunks: Iterable):
    """The PolicyError (exit 4) for the first flagged step of ``found`` (host arrays [N],
    the windows' devices concatenated; some step flagged); the episode is found by key
    among ``chunks`` (a second read of the data, on this error path only)."""
    counts = np.asarray(found.count)
    i = int(np.flatnonzero(counts)[0])
    key = (int(found.key_hi[i]) << 32) | int(found.key_lo[i])
    step, value = int(found.step[i]), float(found.value[i])
    policy = policies[int(found.policy[i])]
    what = "NaN" if np.isnan(value) else f"{value:g}"
    return PolicyError(
        f"{locate_key(key, step, chunks)}policy {policy.name} gives the logged action a "
        f"log-probability of {what}, which is no log-probability (a fault of its code or "
        f"parameters; {int(counts.sum())} step(s) so affected in the batch)"
    )
