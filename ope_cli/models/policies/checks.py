"""A policy against the data: type-level before any row is read (``check_against_schema``),
value-level per chunk as validation checks (``chunk_checks``)."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterable, Iterator

import numpy as np

from ope_cli.data.columns import observations_held
from ope_cli.data.validate import LOG_PROBABILITY_TOLERANCE, Check
from ope_cli.errors import DataError, PolicyError, where
from ope_cli.models.policies.base import Policy
from ope_cli.models.policies.functions import action_log_probs

PROBED_STEPS = 16  # steps whose policy probabilities one call sums (one compiled shape)
PROBE_CALLS = 4  # calls per chunk at most: PROBE_CALLS * PROBED_STEPS steps probed
PROBABILITY_SUM_TOLERANCE = 1e-3  # float32 policies sum to 1 far closer than this


def check_against_schema(policy: Policy, schema) -> None:
    """Type-level compatibility of a policy and the data (before any row is read); the
    message names the data (``schema.source``), as a value-level one names its file."""
    try:
        _check_types(policy, schema)
    except DataError as error:
        if schema.source is None:
            raise
        raise DataError(f"{schema.source}: {error}") from None


def _check_types(policy: Policy, schema) -> None:
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
            f"column {schema.columns['observation']!r} holds "
            f"{observations_held(schema.observation_kind)}"
        )
    if policy.obs_dim is not None and schema.observation_dim not in (None, policy.obs_dim):
        raise DataError(
            f"observations in column {schema.columns['observation']!r} have size "
            f"{schema.observation_dim} (every step: the column's type fixes it), but policy "
            f"{policy.name} expects {policy.obs_dim}"
        )


def chunk_checks(policy: Policy, chunk, who: str | None = None) -> Iterator[Check]:
    """Value-level compatibility of one chunk with the policy, as validate.value_checks does
    it: yields Check(reason, problem, [N] bool rows). Action and state ranges can be dropped
    (``--on-invalid drop``); a size mismatch concerns every row and never is. An entry
    point that declares ``n_actions`` has its probabilities summed over them at the
    chunk's first steps (``probability_sum_off``): a PolicyError where they are not 1,
    naming the policy as ``who`` says (default "policy NAME")."""
    if policy.n_actions is not None:
        if policy.kind == "entry_point" and chunk.action.ndim == 1:
            _check_normalised(policy, chunk, who)
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


def not_log_probabilities(log_pi, discrete: bool, xp=np):
    """Where ``log_pi`` (any shape; ``xp`` numpy or jax.numpy) is no log-probability of a
    logged action: NaN, +inf, or, for a discrete action, above 0 (a probability above 1);
    -inf (probability 0) is one. One comparison each: NaN compares false, so "not within
    the bound" flags it too."""
    if discrete:
        return ~(log_pi <= LOG_PROBABILITY_TOLERANCE)
    return ~(log_pi < xp.inf)


def returns_probabilities(policy: Policy) -> bool:
    """Whether the policy's code returns probabilities (an entry point object with a
    ``prob`` method, whose log ``log_prob`` takes), not log-probabilities."""
    return getattr(policy.log_prob, "returns", None) == "prob"


def no_log_probability(
    who: str, value: float, count: int, probabilities: bool = False
) -> PolicyError:
    """The PolicyError of a policy (``who``: where, and which) giving a logged action
    ``value``, which is no log-probability, on ``count`` steps of a batch; in the words of
    probabilities where its code returns those (``probabilities``)."""
    if probabilities:
        what = "below 0 or NaN" if np.isnan(value) else f"of {np.exp(value):g}, above 1"
        return PolicyError(
            f"{who} gives the logged action a probability {what}, which is no probability "
            f"(a fault of its prob method or parameters; {count} step(s) so affected in a "
            "batch)"
        )
    what = "NaN" if np.isnan(value) else f"{value:g}"
    return PolicyError(
        f"{who} gives the logged action a log-probability of {what}, which is no "
        f"log-probability (a fault of its code or parameters; {count} step(s) so affected "
        "in a batch)"
    )


def faulty_policy_error(policy: Policy, count: int, chunks: Iterable) -> PolicyError:
    """The PolicyError (exit 4) for a policy whose log-probabilities the kernel flagged
    (``count`` steps of a batch: NaN, +inf, or above 0 for a discrete action), naming the
    first such step of the data: found by computing the policy on ``chunks`` (a second
    read, on this error path only)."""
    import jax
    import jax.numpy as jnp

    per_step = jax.jit(jax.vmap(policy.log_prob, in_axes=(None, 0, 0)))
    for chunk in chunks:
        observation = np.asarray(chunk.observation)
        if observation.dtype.kind == "f":
            observation = observation.astype(np.float64)
        log_pi = np.asarray(per_step(policy.params, jnp.asarray(observation), chunk.action))
        bad = np.flatnonzero(not_log_probabilities(log_pi, chunk.action.dtype.kind in "iu"))
        if bad.size:
            location = where(chunk.file, *chunk.locate(int(bad[0])))
            return no_log_probability(
                f"{location}policy {policy.name}",
                float(log_pi[bad[0]]),
                count,
                returns_probabilities(policy),
            )
    return PolicyError(
        f"policy {policy.name} gives {count} logged action(s) a value that is no "
        "log-probability (NaN, +inf, or a probability above 1)"
    )


def _check_normalised(policy: Policy, chunk, who: str | None) -> None:
    """A PolicyError where an entry point's probabilities over its declared actions do not
    sum to 1 at the chunk's first steps: a log_prob of unnormalised logits (or of a
    softmax over some of the actions) gives weights without a word where every value is
    a log-probability below 0 (checkpoints are normalised by construction)."""
    check_probability_sums(
        policy,
        chunk,
        policy.n_actions,
        f"its {policy.n_actions} actions",
        "prob must return normalised probabilities (jax.nn.softmax of the logits, over every "
        "action)"
        if returns_probabilities(policy)
        else "log_prob must return normalised log-probabilities (jax.nn.log_softmax of the "
        "logits, over every action)",
        who,
    )


def check_probability_sums(
    policy: Policy, chunk, n_actions: int, over: str, why: str, who: str | None = None
) -> None:
    """A PolicyError, saying ``why``, where the policy's probabilities over actions
    0..n_actions-1 (``over``, in words) do not sum to 1 (``probability_sum_off``);
    ``who``: the policy in words (default "policy NAME"; "--behavior NAME")."""
    who = f"policy {policy.name}" if who is None else who
    off = probability_sum_off(policy, chunk, n_actions)
    if off is None:
        return
    (episode, step), total = chunk.locate(off[0]), off[1]
    if not math.isfinite(total):  # no unnormalised policy: a fault
        raise PolicyError(
            f"{where(chunk.file, episode, step)}{who}'s probabilities over "
            f"{over} are not finite (they sum to {total:g}): log_prob gives NaN or +inf, a "
            "fault of its code or parameters"
        )
    raise PolicyError(
        f"{who}'s probabilities over {over} sum to {total:.6g} at episode "
        f"{episode}, step {step}, not 1: {why}"
    )


def probability_sum_off(policy: Policy, chunk, n_actions: int) -> tuple[int, float] | None:
    """(step row, sum) of the first of the chunk's probed steps (``_probed_rows``) where the
    sum over actions 0..n_actions-1 of pi(a|s) (as V-hat takes them, ``action_log_probs``)
    is not 1 within PROBABILITY_SUM_TOLERANCE (NaN included); None where every one is, where
    the chunk has no observations, or where the policy's code fails here (the kernel reports
    its errors)."""
    rows = _probed_rows(chunk)
    if rows.size == 0:
        return None
    try:
        try:
            probe = _probability_sums(policy.log_prob, n_actions)
        except TypeError:  # an entry point that is no hashable function: compiled here
            probe = _probability_sums.__wrapped__(policy.log_prob, n_actions)
        for start in range(0, rows.size, PROBED_STEPS):
            block = rows[start : start + PROBED_STEPS]
            # always PROBED_STEPS rows, whatever is left out: one compilation
            padded = np.concatenate([block, np.repeat(block[:1], PROBED_STEPS - block.size)])
            totals = np.asarray(probe(policy.params, chunk.observation[padded]))
            if totals.dtype.kind != "f":  # complex, say: the kernel names the dtype
                return None
            totals = totals[: block.size].astype(np.float64)
            off = np.flatnonzero(~(np.abs(totals - 1.0) <= PROBABILITY_SUM_TOLERANCE))
            if off.size:
                return int(block[off[0]]), float(totals[off[0]])
    except Exception:  # noqa: BLE001 - the kernel says what is wrong with the policy's code
        return None
    return None


def _probed_rows(chunk) -> np.ndarray:
    """[<= PROBE_CALLS * PROBED_STEPS] rows (increasing) whose probabilities are summed:
    with integer states the first step of each state, else steps spread over the chunk,
    evenly where there are more than that (its first 16 steps, one episode's, missed a
    policy unnormalised in 3% of the states). Rows with finite observations only (a NaN
    observation is invalid data, which --on-invalid drop leaves out and inspect lists: its
    probabilities' sum of NaN refused the policy instead); none without observations."""
    observation = chunk.observation
    if observation is None or chunk.action.shape[0] == 0:
        return np.zeros(0, np.int64)
    finite = np.ones(observation.shape[0], bool)
    if observation.dtype.kind == "f":
        finite = np.isfinite(observation.reshape(observation.shape[0], -1)).all(axis=1)
    rows = np.flatnonzero(finite)
    if observation.ndim == 1 and observation.dtype.kind in "iu":  # a state per step
        rows = rows[observation[rows] >= 0]  # a negative state is invalid data, not a probe
        rows = np.sort(rows[np.unique(observation[rows], return_index=True)[1]])
    most = PROBE_CALLS * PROBED_STEPS
    if rows.size > most:
        rows = rows[np.linspace(0, rows.size - 1, most).astype(np.int64)]
    return rows


@functools.cache  # compiled once per policy function and width, not at every chunk
def _probability_sums(log_prob, n_actions: int) -> Callable:
    """(params, observations [N, ...]) -> [N] sum of pi(a|s) over actions 0..n_actions-1."""
    import jax
    import jax.numpy as jnp

    def sums(params, observation):
        every = jax.vmap(lambda o: action_log_probs(log_prob, params, o, n_actions))
        return jnp.sum(jnp.exp(every(observation)), axis=1)

    return jax.jit(sums)
