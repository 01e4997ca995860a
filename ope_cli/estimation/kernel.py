"""The jitted kernel: a batch of episodes walked in fixed time windows.

Two compiled functions serve each configuration (policy kind, estimators, Q source,
behavior policy, bootstrap replicates, betting): ``_advance_kernel`` vmaps a policy's
per-step log_prob over the [B, C] steps of a window and the stacked policies [P], carries
every episode's state ([P, B] leaves: ``estimators.reduction.EpisodeCarry``) to the next window
and returns the window's per-step sums; ``_finish_kernel`` turns the carries into the
batch's scalar sums, with shapes that depend on B alone. The time axis is never a compiled
dimension: a batch of any length is a sequence of windows of one of a few fixed shapes
(``buckets.window_shapes``). With a ``--behavior`` policy, its log pi_b(a|s) replaces the
window's ``log_behavior`` inside the same call (its params are one more input).
A persistent compilation cache (``runtime.enable_compilation_cache``) and the kept
kernels of ``kernel_cache`` carry compilations across processes.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ope_cli.data.buckets import PaddedBatch, aligned_copy
from ope_cli.data.ids import fold_index
from ope_cli.data.steps import map_arrays
from ope_cli.errors import PolicyError, UsageError, summary
from ope_cli.estimation import kernel_cache
from ope_cli.estimation.bootstrap_counts import replicate_counts
from ope_cli.estimation.estimators import available, get
from ope_cli.estimation.estimators.base import GROUP_STEP_FIELDS, sum_spec
from ope_cli.estimation.estimators.doubly_robust import Q_FIELDS
from ope_cli.estimation.estimators.reduction import (
    BatchStatistics,
    EpisodeCarry,
    ScalarStatistics,
    StepStatistics,
    WeightedWindow,
    advance_window,
    combine,
    episode_terms,
    finish_batch,
    init_carry,
    lagged,
    log_ratios,
)
from ope_cli.estimation.kernel_cache import COMPILER_OPTIONS
from ope_cli.models.behavior import ZeroProbabilitySteps
from ope_cli.models.policies import LogitsFn, LogProbFn, Policy
from ope_cli.models.policies.checks import not_log_probabilities
from ope_cli.models.policies.functions import action_log_probs, logit_probs
from ope_cli.models.qfunctions import QFunction, QSpec, episode_q_fields, q_spec

BATCH_AXIS = "batch"


def trace_count() -> int:
    """How many kernels this process compiled (or fetched from the persistent cache): one
    per window or batch shape of each configuration and function."""
    return kernel_cache.compilation_count()


@dataclasses.dataclass
class PolicyGroup:
    """Policies evaluated by one kernel: one entry point, the logged target, or checkpoints
    of one kind and shapes, stacked (with their Q functions, when a Q source is given:
    ``qs``, one per policy, also of one kind and shapes). ``indices`` are their positions
    on the command line."""

    policies: list[Policy]
    indices: list[int]
    qs: list[QFunction] | None = None

    @property
    def head(self) -> Policy:
        return self.policies[0]

    def stacked_params(self, dtype) -> dict[str, jax.Array] | None:
        """Parameters with a leading policy axis [P, ...], or None without parameters."""
        return _stacked([p.params for p in self.policies], dtype)

    def stacked_q_params(self, dtype) -> dict[str, jax.Array] | None:
        """The Q functions' parameters with a leading policy axis [P, ...], or None."""
        return _stacked([q.params for q in self.qs or ()], dtype)


def _stacked(params: list[dict[str, np.ndarray] | None], dtype) -> dict[str, jax.Array] | None:
    """Equally shaped parameter dicts stacked along a new leading axis, as ``dtype``; None
    when there are none (no records, or records without parameters)."""
    if not params or params[0] is None:
        return None
    return {key: _on_device(np.stack([p[key] for p in params]), dtype) for key in params[0]}


def _on_device(value, dtype) -> jax.Array:
    """``value`` as a ``dtype`` device array, converted by NumPy on the host: a conversion
    on the device is an eager JAX op, compiled (or looked up in the cache) per process."""
    return jax.device_put(np.asarray(value, dtype))


def group_policies(
    policies: Sequence[Policy], qs: Sequence[QFunction] | None = None
) -> list[PolicyGroup]:
    """Groups stackable policies (and Q functions), keeping first-appearance order."""
    groups: dict[tuple, PolicyGroup] = {}
    for index, policy in enumerate(policies):
        q = None if qs is None else qs[index]
        # a policy without parameters (an entry point) is one function: the same one given
        # twice is evaluated twice, never stacked (nothing to stack along)
        own = policy.stack_key if policy.params is not None else (*policy.stack_key, index)
        key = (own, None if q is None else q.stack_key)
        group = groups.setdefault(key, PolicyGroup([], [], None if q is None else []))
        group.policies.append(policy)
        group.indices.append(index)
        if q is not None:
            group.qs.append(q)
    return list(groups.values())


def _every_policy_every_step(one_step, params, *per_step_inputs):
    """[P, B, C, ...] ``one_step(params, *inputs)`` of every policy of a group (P = 1
    without params) at every step of ``per_step_inputs`` ([B, C, ...] each); a tuple of
    such arrays where ``one_step`` returns a tuple.

    The policies are the innermost vmap: each step's features meet the P stacked
    parameters in one product ([B C, d] x [d, P ...]) whose output is already in [B, C, P]
    order, with no [P, B, C, ...] transposition of every policy's intermediate values."""
    over_steps = (None,) + (0,) * len(per_step_inputs)
    if params is None:
        per_step = jax.vmap(jax.vmap(one_step, in_axes=over_steps), in_axes=over_steps)
        return jax.tree.map(lambda x: x[None], per_step(None, *per_step_inputs))
    policies = jax.vmap(one_step, in_axes=(0,) + (None,) * len(per_step_inputs))  # -> [P, ...]
    per_step = jax.vmap(jax.vmap(policies, in_axes=over_steps), in_axes=over_steps)
    # [B, C, P, ...] -> [P, B, C, ...]
    return jax.tree.map(lambda x: jnp.moveaxis(x, 2, 0), per_step(params, *per_step_inputs))


def _policy_log_probs(
    log_prob: LogProbFn | None, params, observation, action, log_target, step_mask, dtype
):
    """[P, B, C] log pi_e(a_t | s_t) of every policy of a group (P = 1 without params)."""
    if log_prob is None:  # logged target probabilities
        return log_target[None]
    log_pi = _every_policy_every_step(log_prob, params, observation, action)
    if log_pi.shape[1:] != step_mask.shape:
        raise PolicyError(f"log_prob must return a scalar per step, got shape {log_pi.shape[3:]}")
    return _real(log_pi).astype(dtype)


def _real(log_p: jax.Array) -> jax.Array:
    """``log_p``, a log_prob's output, when its dtype is a real float: a bool, an integer or a
    complex one was cast without a word (a bool's IS was -7471 against -2.34)."""
    if not jnp.issubdtype(log_p.dtype, jnp.floating):
        raise PolicyError(
            f"log_prob must return a real floating-point log-probability, got dtype {log_p.dtype}"
        )
    return log_p


def _policy_action_log_probs(log_prob: LogProbFn, params, observation, n_actions: int, dtype):
    """[P, B, C, A] log pi_e(a | s_t) of every discrete action a, for every policy of a
    group (P = 1 without params)."""
    one_step = functools.partial(action_log_probs, log_prob, n_actions=n_actions)
    log_pi = _every_policy_every_step(one_step, params, observation)
    if log_pi.ndim != 4:
        raise PolicyError(f"log_prob must return a scalar per step, got shape {log_pi.shape[4:]}")
    return _real(log_pi).astype(dtype)


def _policy_action_probs(static: Static, params, observation, dtype):
    """([P, B, C, A] log pi_e(a | s_t), [P, B, C, A] pi_e(a | s_t)) of every discrete
    action a (A = the Q source's ``n_actions``), for every policy of a group (P = 1
    without params): what a Q source's V-hat needs, and the logged actions'
    log-probabilities are taken from them rather than computed a second time. With the
    policies' logits (softmax checkpoints of A actions) the probabilities share the
    log-probabilities' exponentials; else they are exp of them (A more a step)."""
    n_actions = static.q.n_actions
    one_step = functools.partial(logit_probs, static.logits, n_actions=n_actions)
    shared = _every_policy_every_step(one_step, params, observation)
    if shared is not None:
        return tuple(x.astype(dtype) for x in shared)
    log_pi = _policy_action_log_probs(static.log_prob, params, observation, n_actions, dtype)
    return log_pi, jnp.exp(log_pi)


def behavior_log_probs(
    log_prob: LogProbFn, params, observation, action, dtype, fold=None
) -> jax.Array:
    """[B, C] log pi_b(a_t | s_t) of the behavior policy (one policy, ``params`` unstacked);
    cross-fitted: ``params`` [K, ...] and episode b uses fold ``fold`` [B] of them."""
    if fold is None:
        per_step = jax.vmap(jax.vmap(log_prob, in_axes=(None, 0, 0)), in_axes=(None, 0, 0))
    else:
        params = jax.tree.map(lambda p: p[fold], params)  # [B, ...]
        per_step = jax.vmap(jax.vmap(log_prob, in_axes=(None, 0, 0)), in_axes=(0, 0, 0))
    log_b = per_step(params, observation, action)
    if log_b.shape != action.shape[:2]:
        raise PolicyError(f"log_prob must return a scalar per step, got shape {log_b.shape[2:]}")
    return _real(log_b).astype(dtype)


def zero_probability_steps(log_b: jax.Array, batch: PaddedBatch, start) -> ZeroProbabilitySteps:
    """How many real steps of the window ``batch`` (column 0: step ``start``) have a
    non-finite behavior log-probability ``log_b`` [B, C] (-inf: the logged action has
    probability 0) or, for a discrete action, one above 0 (a probability above 1, as a
    logged column's is refused), and the first one; leaves [1]."""
    discrete = jnp.issubdtype(batch.steps.action.dtype, jnp.integer)
    bad = (not_log_probabilities(log_b, discrete, jnp) | (log_b == -jnp.inf)) & batch.step_mask
    first = jnp.argmax(bad.reshape(-1))
    episode, step = jnp.divmod(first, bad.shape[1])
    return ZeroProbabilitySteps(
        count=jnp.sum(bad, dtype=jnp.int32)[None],
        key_hi=batch.key_hi[episode][None],
        key_lo=batch.key_lo[episode][None],
        step=(step + start).astype(jnp.int32)[None],
        value=log_b.reshape(-1)[first][None],
    )


def faulty_counts(log_pi: jax.Array | None, batch: PaddedBatch) -> jax.Array:
    """[1, P] how many real steps of the window ``batch`` have a policy's log-probability
    ``log_pi`` [P, B, C] that is no log-probability: NaN, +inf, or above 0 for a discrete
    action (-inf, probability 0, is one). Left alone, such a weight drops its episode
    from the sums without a word; the host finds the first one on the error path only
    (``checks.faulty_policy_error``), as locating it here costs every window a tenth of
    its time. None (logged target probabilities, validated as data): [1, 1] zeros."""
    if log_pi is None:
        return jnp.zeros((1, 1), jnp.int32)
    discrete = jnp.issubdtype(batch.steps.action.dtype, jnp.integer)
    bad = not_log_probabilities(log_pi, discrete, jnp) & batch.step_mask[None]
    return jnp.sum(bad, axis=(1, 2), dtype=jnp.int32)[None]


def faulty_q_counts(fields: dict, batch: PaddedBatch) -> jax.Array:
    """[1, P] how many real steps of the window ``batch`` have a Q-hat or V-hat (``fields``
    {"q_t", "v_t": [P, B, C]}, 0 on padding) that is NaN or infinite: left alone, dr and
    wdr came out null with a note blaming overflow, and nothing named the Q function.
    Without a Q source: [1, 1] zeros."""
    if not fields:
        return jnp.zeros((1, 1), jnp.int32)
    finite = jnp.isfinite(fields["q_t"]) & jnp.isfinite(fields["v_t"])
    real = batch.step_mask & batch.episode_mask[:, None]
    return jnp.sum(~finite & real[None], axis=(1, 2), dtype=jnp.int32)[None]


def q_sizes(fields: dict, batch: PaddedBatch) -> jax.Array:
    """[1, P] the largest finite |Q-hat| or |V-hat| (``fields`` {"q_t", "v_t": [P, B, C]})
    of each policy on the window ``batch``'s real steps: a Q checkpoint's or fit's values,
    which the data's magnitudes do not show (float32 lost dr's value to a Q-hat of 1e7
    without a word). Without a Q source: [1, 1] zeros."""
    if not fields:
        return jnp.zeros((1, 1))
    size = jnp.maximum(jnp.abs(fields["q_t"]), jnp.abs(fields["v_t"]))
    real = batch.step_mask & batch.episode_mask[:, None]
    return jnp.max(jnp.where(real[None] & jnp.isfinite(size), size, 0), axis=(1, 2))[None]


def _q_fields(static: Static, params, q_params, batch, start, seed, pi_all=None):
    """{"q_t", "v_t": [P, B, C]} of every policy of a group (``static.dtype``), or {}
    without a Q source; ``pi_all`` [P, B, C, A]: the policies' probabilities of every
    discrete action (``_policy_action_probs``), or None."""
    spec, log_prob = static.q, static.log_prob
    if spec is None:
        return {}

    def one_policy(policy_params, q_params_p, pi_p):
        fields = episode_q_fields(
            spec, log_prob, policy_params, q_params_p, batch, seed, start, pi_p
        )
        return {name: values.astype(static.dtype) for name, values in fields.items()}

    if params is None and q_params is None:
        own = None if pi_all is None else pi_all[0]
        return jax.tree.map(lambda x: x[None], one_policy(None, None, own))
    in_axes = (None if params is None else 0, 0, None if pi_all is None else 0)
    return jax.vmap(one_policy, in_axes=in_axes)(params, q_params, pi_all)


class Static(NamedTuple):
    """The static (compile-time) configuration of a policy group's kernels: a hashable
    record, so that one compiled kernel serves every window of that configuration."""

    log_prob: LogProbFn | None
    behavior_log_prob: LogProbFn | None
    behavior_folds: int
    num_groups: int
    dtype: str
    mesh: Mesh | None
    estimators: tuple[str, ...]
    q: QSpec | None
    betting: bool
    terms: bool = False  # the finish also returns each episode's terms (``episode_terms``)
    # a one-lane window's per-group sums are its group's row alone (``reduction.Groups``):
    # the Kernel's walk without a mesh, whose host code places it (``window_groups``)
    own_rows: bool = False
    logits: LogitsFn | None = None  # the policies' (``Policy.logits``), for V-hat


def _with_behavior(window: PaddedBatch, start, behavior_params, static: Static):
    """(window, ZeroProbabilitySteps or None): the window's log_behavior replaced by the
    ``--behavior`` policy's log-probabilities when there is one."""
    if static.behavior_log_prob is None:
        return window, None
    dtype = static.dtype
    observation, action = window.steps.observation, window.steps.action
    if jnp.issubdtype(observation.dtype, jnp.floating):
        observation = observation.astype(dtype)
    if jnp.issubdtype(action.dtype, jnp.floating):
        action = action.astype(dtype)
    fold = None
    if static.behavior_folds > 1:  # cross-fitted: each episode's fold, from its id key
        fold = fold_index(window.key_hi, window.key_lo, static.behavior_folds, jnp)
    log_b = behavior_log_probs(
        static.behavior_log_prob, behavior_params, observation, action, dtype, fold
    )
    window = window._replace(steps=window.steps._replace(log_behavior=log_b))
    return window, zero_probability_steps(log_b, window, start)


class Faults(NamedTuple):
    """What a window found wrong in user-supplied values, [1, P] steps per policy of the
    group: log-probabilities that are none (``faulty_counts``) and non-finite Q-hat or
    V-hat (``faulty_q_counts``); and the largest |Q-hat| or |V-hat| (``q_sizes``), which
    float32 may not hold."""

    policy: jax.Array
    q: jax.Array
    q_size: jax.Array


class WindowInputs(NamedTuple):
    """The advance kernel's inputs (a pytree: arrays, or None where there are none): the P
    stacked ``params`` of one policy group, the behavior policy's and the Q functions'
    (stacked) params, ``window``: PaddedBatch fields [B, C, ...], column 0 at step
    ``start``; ``carry``: EpisodeCarry of [P, L] leaves, L >= B, its first B lanes the
    window's episodes (a carry of one size serves every window shape, so the finish
    compiles once); ``counts``: [B, R] bootstrap counts; the discount, the bootstrap seed
    and the betting range (a, b, H)."""

    params: dict | None
    behavior_params: dict | None
    q_params: dict | None
    window: PaddedBatch
    start: jax.Array
    carry: EpisodeCarry
    counts: jax.Array
    gamma: jax.Array
    seed: jax.Array
    betting_range: jax.Array


def window_statistics(inputs: WindowInputs, static: Static):
    """(carry, StepStatistics [P, ...], (ZeroProbabilitySteps or None, Faults [1, P])) of
    the next C steps of (this device's share of) a batch (``inputs``) for the P stacked
    ``params`` of one policy group; not jitted."""
    params, q_params, start, seed = inputs.params, inputs.q_params, inputs.start, inputs.seed
    counts, carry = inputs.counts, inputs.carry
    window, zero_behavior = _with_behavior(inputs.window, start, inputs.behavior_params, static)
    dtype = static.dtype
    steps = jax.tree.map(
        lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, window.steps
    )
    log_pi_all = pi_all = None
    if static.log_prob is not None and static.q is not None and static.q.kind == "values":
        log_pi_all, pi_all = _policy_action_probs(static, params, steps.observation, dtype)
        # the logged action's entry; one beyond the range clamps, as log_prob's indexing does
        logged = steps.action[None, ..., None]
        log_pi = jnp.take_along_axis(log_pi_all, logged, axis=-1, mode="clip")[..., 0]
    else:
        log_pi = _policy_log_probs(
            static.log_prob,
            params,
            steps.observation,
            steps.action,
            steps.log_target,
            window.step_mask,
            dtype,
        )
    window = window._replace(steps=steps)
    # a policy's values; logged target probabilities are the data's, validated as read
    faulty = faulty_counts(log_pi if static.log_prob is not None else None, window)
    fields = _q_fields(static, params, q_params, window, start, seed, pi_all)
    faults = Faults(faulty, faulty_q_counts(fields, window), q_sizes(fields, window))
    betting = inputs.betting_range if static.betting else None
    settings = (static.num_groups, static.estimators, betting, static.own_rows)  # the walk's

    def per_policy(carry_b, log_pi_bc, fields_bc):
        weighted = WeightedWindow(
            log_ratios(log_pi_bc, steps.log_behavior, window.step_mask),
            steps.reward,
            window.step_mask,
            window.episode_mask,
            window.group,
            counts,
            start,
            fields_bc,
        )
        return advance_window(carry_b, weighted, inputs.gamma, *settings)

    lanes = window.step_mask.shape[0]
    own = jax.tree.map(lambda x: x[:, :lanes], carry)
    own, statistics = jax.vmap(per_policy)(own, log_pi, fields)
    carry = jax.tree.map(lambda full, part: full.at[:, :lanes].set(part), carry, own)
    return carry, statistics, (zero_behavior, faults)


def finish_statistics(carry: EpisodeCarry, episode_mask, group, counts, betting_range, static):
    """(ScalarStatistics [P, ...], {name: [P, L]} episode terms or None) of (this device's
    share of) a batch whose last window was walked: ``carry`` [P, L] leaves,
    ``episode_mask`` and ``group`` [L] and ``counts`` [L, R] laid out as its lanes
    (``Kernel.carry_layout``); the terms (``episode_terms``) with ``static.terms``; not
    jitted."""
    betting = betting_range if static.betting else None
    scalar = jax.vmap(
        lambda c: finish_batch(
            c, episode_mask, group, counts, static.num_groups, static.estimators, betting
        )
    )(carry)
    if not static.terms:
        return scalar, None
    return scalar, jax.vmap(lambda c: episode_terms(c, static.estimators))(carry)


def host_arrays(tree):
    """``tree`` with its device arrays on the host (other leaves as they are). On the CPU
    each array's buffer is viewed where it is (``np.asarray``, about 2 µs an array against
    ``jax.device_get``'s 10: a batch brings back hundreds); elsewhere ``jax.device_get``,
    which starts every copy before waiting on any."""
    if jax.default_backend() != "cpu":
        return jax.device_get(tree)
    return jax.tree.map(lambda x: np.asarray(x) if isinstance(x, jax.Array) else x, tree)


def _leading_device_axis(tree):
    return jax.tree.map(lambda x: x[None], tree)


def _carry_spec(carry):
    return jax.tree.map(lambda _: PartitionSpec(None, BATCH_AXIS), carry)


@functools.partial(jax.jit, compiler_options=COMPILER_OPTIONS, static_argnames=("static",))
def _advance_kernel(*args, static: Static):
    """(carry [P, B], StepStatistics [D, P, ...], (ZeroProbabilitySteps [D] or None,
    Faults [D, P])) of ``window_statistics`` on ``args`` (a WindowInputs' fields, in
    order): one row per device of ``static.mesh`` (D = 1 without one).

    With a mesh, each device walks its own share of the episodes (every leaf of ``window``,
    ``carry`` and ``counts`` is split along its episode axis) and the per-device partials
    come back to the host to be merged there: no cross-device collective runs inside the
    kernel, so any number of calls can be in flight without deadlocking.
    """
    kernel_cache.count_compilation()

    def run(*args):
        carry, statistics, zero = window_statistics(WindowInputs(*args), static)
        return carry, _leading_device_axis(statistics), zero

    if static.mesh is None:
        return run(*args)
    inputs = WindowInputs(*args)
    by_episode, replicated = PartitionSpec(BATCH_AXIS), PartitionSpec()
    in_specs = WindowInputs(*(replicated,) * len(WindowInputs._fields))._replace(
        window=jax.tree.map(lambda _: by_episode, inputs.window),
        carry=_carry_spec(inputs.carry),
        counts=by_episode,
    )
    out_specs = (_carry_spec(inputs.carry), by_episode, by_episode)
    shard = jax.shard_map(run, mesh=static.mesh, in_specs=tuple(in_specs), out_specs=out_specs)
    return shard(*args)


@functools.partial(jax.jit, compiler_options=COMPILER_OPTIONS, static_argnames=("static",))
def _finish_kernel(carry: EpisodeCarry, episode_mask, group, counts, betting_range, *, static):
    """(ScalarStatistics [D, P, ...], episode terms {name: [P, L]} or None) of a batch whose
    last window was walked."""
    kernel_cache.count_compilation()

    def run(*args):
        scalar, terms = finish_statistics(*args, static)
        return _leading_device_axis(scalar), terms

    args = (carry, episode_mask, group, counts, betting_range)
    if static.mesh is None:
        return run(*args)
    by_episode = PartitionSpec(BATCH_AXIS)
    in_specs = (_carry_spec(carry), by_episode, by_episode, by_episode, PartitionSpec())
    if not static.terms:
        scalar_only = jax.shard_map(
            lambda *a: run(*a)[0], mesh=static.mesh, in_specs=in_specs, out_specs=by_episode
        )
        return scalar_only(*args), None
    out_specs = (by_episode, PartitionSpec(None, BATCH_AXIS))
    return jax.shard_map(run, mesh=static.mesh, in_specs=in_specs, out_specs=out_specs)(*args)


def _signature(args) -> tuple:
    return tuple(None if x is None else (x.shape, x.dtype) for x in jax.tree.leaves(args))


def local_mesh(devices: int | None = None) -> Mesh | None:
    """A 1-D mesh over the first ``devices`` local devices (all by default); None for one."""
    available = jax.local_devices()
    count = len(available) if devices is None else devices
    if count < 1:
        raise UsageError(f"--devices must be at least 1, got {count}")
    if count > len(available):
        raise UsageError(f"--devices {count}: this process has {len(available)} device(s)")
    if count == 1:
        return None
    return Mesh(np.array(available[:count]), (BATCH_AXIS,))


def as_float(dtype: np.dtype, floats) -> np.dtype:
    """``dtype``, or ``floats`` where ``dtype`` is a floating one: what a window holds."""
    return np.dtype(floats) if np.issubdtype(dtype, np.floating) else dtype


def split_windows(batch: PaddedBatch, width: int, floats=None) -> list[tuple[int, PaddedBatch]]:
    """(start, window) of a host ``batch`` [B, T] cut into windows [B, width] (its columns
    start:start + width, floats in ``floats`` when given), in order; T must be a multiple
    of width. Each per-step array is C-contiguous on a 64-byte boundary (``aligned_copy``),
    so the compiled call takes it without copying it again (60% of the windows' arrays
    were copied twice); the per-episode [B] arrays are the batch's own."""
    length = batch.shape[1]
    if length % width:
        raise ValueError(f"a batch of {length} steps is not walked in windows of {width}")
    out = []
    for start in range(0, length, width):

        def columns(x, start=start):
            if x.ndim == 1:
                return x
            dtype = x.dtype if floats is None else as_float(x.dtype, floats)
            return aligned_copy(x[:, start : start + width], dtype)

        out.append((start, map_arrays(columns, batch)))
    return out


class KernelOutput(NamedTuple):
    """What one batch's kernel calls return (device arrays, dispatched asynchronously):
    each window's (start, StepStatistics [D, P, ...]), the ScalarStatistics [D, P, ...],
    each window's ZeroProbabilitySteps [D] with a ``--behavior`` policy (else None) and
    Faults [D, P] (``faults``), the
    batch's length T, with ``terms`` each episode's terms {name: [P, L]} (else None)
    with the carry's lanes (host: episode mask [L], bootstrap counts [L, R]), and how far
    each resampling group's episodes run [K] (host: its longest episode, or T where that
    is past T / 2; None: every group spans T). A window may hold only the per-group rows
    that ``window_groups`` keeps (on the host), and none of its other per-step sums when
    ``joined`` ({field: {name: SideBySide}}) holds them, for the first windows."""

    windows: list[tuple[int, StepStatistics]]
    scalar: ScalarStatistics
    zero_behavior: list[ZeroProbabilitySteps] | None
    length: int
    terms: dict | None = None
    lanes: tuple[np.ndarray, np.ndarray] | None = None
    group_lengths: np.ndarray | None = None
    joined: dict[str, dict[str, SideBySide]] | None = None
    faults: list[Faults] | None = None


def group_lengths(batch: PaddedBatch, num_groups: int) -> np.ndarray:
    """[K] the longest episode of each resampling group in ``batch`` (host; 0: none; a
    group index past K counts in no group, as in the kernel's one-hot sums)."""
    lengths = np.zeros(num_groups, np.int64)
    group = np.asarray(batch.group)
    real = np.asarray(batch.episode_mask) & (group >= 0) & (group < num_groups)
    steps = np.asarray(batch.step_mask).sum(axis=1)
    np.maximum.at(lengths, group[real], steps[real])
    return lengths


def _lane_group_spans(windows: list[tuple[int, PaddedBatch]], num_groups: int) -> np.ndarray:
    """[K] ``group_lengths`` of a one-lane batch walked in ``windows``: its episode's group
    (as ``group_lengths`` finds it in the first window) spans every window."""
    first = windows[0][1]
    return np.where(group_lengths(first, num_groups) > 0, len(windows) * first.shape[1], 0)


def window_groups(group_lengths: np.ndarray, start: int) -> np.ndarray:
    """The groups whose per-step rows the window at step ``start`` extends: those with an
    episode at least ``start`` steps long (the window after a group's longest episode
    still holds a lag-1 sum's last value); after it, ``after_end`` gives every value."""
    return np.flatnonzero((group_lengths > 0) & (group_lengths >= start))


def _lags(field: str, name: str) -> bool:
    """Whether the per-step array ``name`` of StepStatistics ``field`` is a lag-1 sum (its
    column c holds step c - 1); log scales never are."""
    return "log_scales" not in field and bool(sum_spec(name).lag)


class SideBySide:
    """A [..., length] array of (start, [..., C]) windows placed side by side as they come
    (in order), one step earlier with ``lag`` (column c of a window holds step
    start + c - 1): a batch's per-step sums joined while its later windows still run, so
    that the windows need not all be held until the last one."""

    def __init__(self, lag: bool, length: int):
        self.lag, self.length = lag, length
        self.full: np.ndarray | None = None
        self.written = 0

    def add(self, start: int, part) -> None:
        part = np.asarray(part)
        if self.full is None:
            # every column is written but a lag-1 sum's last: no zero-filling pass over
            # arrays that can be [policies, groups, a million steps]
            self.full = np.empty((*part.shape[:-1], self.length), part.dtype)
        if self.lag:
            low = max(start - 1, 0)
            part = part[..., low - (start - 1) :]
        else:
            low = start
        if low != self.written:  # windows in order, side by side: nothing left unwritten
            raise ValueError(f"window at step {start} does not follow step {self.written}")
        self.full[..., low : low + part.shape[-1]] = part
        self.written = low + part.shape[-1]

    def joined(self) -> np.ndarray:
        self.full[..., self.written :] = 0
        return self.full


def _joined(windows: list[tuple[int, Any]], lag: bool, length: int) -> np.ndarray:
    """[..., length] of the (start, [..., C]) ``windows``' arrays side by side, one step
    earlier with ``lag`` (``SideBySide``)."""
    side_by_side = SideBySide(lag, length)
    for start, part in windows:
        side_by_side.add(start, part)
    return side_by_side.joined()


def _group_rows(output: KernelOutput, field: str, name: str) -> list[np.ndarray]:
    """The K per-group rows [..., T_g] of one per-group per-step sum: group g's windows up
    to the one after its longest episode (``window_groups``), side by side. Windows that
    extend the same groups are joined at once (a run); a group's row is its runs' parts."""
    windows = [(start, getattr(s, field)[name]) for start, s in output.windows]
    lengths = output.group_lengths
    if lengths is None:
        full = _joined(windows, _lags(field, name), output.length)
        return [full[..., k, :] for k in range(full.shape[-2])]
    runs: list[tuple[np.ndarray, list]] = []
    for start, part in windows:
        rows = window_groups(lengths, start)
        part = np.asarray(part)
        if part.shape[-2] != rows.size:  # all K groups' rows: keep the window's own
            part = part[..., rows, :]
        if runs and np.array_equal(runs[-1][0], rows):
            runs[-1][1].append((start, part))
        else:
            runs.append((rows, [(start, part)]))
    pieces: list[list[np.ndarray]] = [[] for _ in lengths]
    walked = 0  # steps of the runs before
    for rows, run in runs:
        if run[0][0] != walked:
            raise ValueError(f"window at step {run[0][0]} does not follow step {walked}")
        width = run[-1][0] + run[-1][1].shape[-1] - walked
        block = _joined([(start - walked, part) for start, part in run], False, width)
        walked += width
        for index, group in enumerate(rows):
            pieces[group].append(block[..., index, :])
    lead = np.asarray(windows[0][1]).shape[:-2]
    rows_out = []
    for parts in pieces:
        if len(parts) > 1:
            row = np.concatenate(parts, axis=-1)
        else:  # one run: a view of its block
            row = parts[0] if parts else np.zeros((*lead, 0))
        if _lags(field, name) and row.shape[-1]:
            row = np.concatenate([row[..., 1:], np.zeros((*lead, 1), row.dtype)], axis=-1)
        rows_out.append(row)
    return rows_out


def _few_rows(window: tuple[int, StepStatistics], group_lengths: np.ndarray):
    """A window's (start, StepStatistics) with its per-group sums cut to the rows it
    extends (``window_groups``), on the host, where those are at most a quarter of the
    groups; else as it is (on the device)."""
    start, statistics = window
    rows = window_groups(group_lengths, start)
    if 4 * rows.size > group_lengths.size:
        return window
    host = host_arrays(statistics)
    # copies, as the slices are: a fetched array kept as it is kept more than its cells
    # (a 1.8M-step episode's walk peaked 55 MiB higher)
    few = {
        f: {
            k: v.copy() if v.shape[-2] == rows.size else v[..., rows, :]
            for k, v in getattr(host, f).items()
        }
        for f in GROUP_STEP_FIELDS
    }
    return start, host._replace(**few)


def assemble(output: KernelOutput) -> BatchStatistics:
    """The BatchStatistics [D, P, ...] of a batch (host arrays) from its KernelOutput (host
    arrays): each window's per-step sums side by side, a lag-1 sum one step earlier (after
    the first windows' that ``walk`` already joined); the per-group ones as K rows, each
    as far as its group needs (``_group_rows``)."""
    fields = {}
    joined = output.joined or {}
    for field in StepStatistics._fields:
        if field in GROUP_STEP_FIELDS:
            names = getattr(output.windows[0][1], field)
            fields[field] = {name: _group_rows(output, field, name) for name in names}
            continue
        early = joined.get(field, {})
        fields[field] = {}
        for name in early or getattr(output.windows[0][1], field):
            side_by_side = early.get(name) or SideBySide(_lags(field, name), output.length)
            for start, statistics in output.windows:
                if name in getattr(statistics, field):
                    side_by_side.add(start, getattr(statistics, field)[name])
            fields[field][name] = side_by_side.joined()
    return combine(StepStatistics(**fields), output.scalar)


def _join_early(joined: dict, window: tuple[int, StepStatistics], length: int):
    """``window`` (on the host) with its per-step sums that are not per group moved into
    ``joined`` ({field: {name: SideBySide}}): a very long episode's bootstrap sums
    [R, C] are then placed as each window comes, not held until the batch ends."""
    start, statistics = window
    moved = {}
    for field in StepStatistics._fields:
        if field in GROUP_STEP_FIELDS:
            continue
        for name, part in getattr(statistics, field).items():
            side_by_side = joined.setdefault(field, {}).setdefault(
                name, SideBySide(_lags(field, name), length)
            )
            side_by_side.add(start, part)
        moved[field] = {}
    return start, statistics._replace(**moved)


@dataclasses.dataclass(frozen=True)
class KernelSettings:
    """What a Kernel computes with besides its policies: the discount, the resampling
    groups, the float dtype, the device mesh (None: one device), the bootstrap replicates
    and their seed, the betting intervals' constants (a, b, H, h, log gamma, 1 - gamma) of
    ``estimators.reduction.betting_inputs`` (None: no betting histogram) and the actions
    sampled per V(s) of a Q source over continuous actions."""

    gamma: float
    num_groups: int
    dtype: Any
    mesh: Mesh | None = None
    num_replicates: int = 0
    seed: int = 0
    betting_range: tuple[float, ...] | None = None
    v_samples: int = 16


class Kernel:
    """``(batch, width) -> KernelOutput`` for one policy group: the batch walked in windows
    of ``width`` steps, the episode axis sharded over ``settings.mesh`` when given; with
    ``behavior``, its log-probabilities replace the logged ones."""

    def __init__(
        self,
        group: PolicyGroup,
        settings: KernelSettings,
        *,
        behavior: Policy | None = None,
        carry_lanes: int | None = None,
        terms: bool = False,
    ):
        mesh, betting_range = settings.mesh, settings.betting_range
        self.group = group
        # lanes of the carry, whatever the window's (None: the window's): one finish kernel
        self.carry_lanes = carry_lanes
        self._initial: dict[int, EpisodeCarry] = {}
        self.behavior = behavior
        q = None if group.qs is None else q_spec(group.qs[0], group.head, settings.v_samples)
        self.dtype = np.dtype(settings.dtype)
        self.gamma = _on_device(settings.gamma, np.float64)  # the discounts: float64
        self.seed = _on_device(settings.seed, np.uint32)
        self.num_replicates = settings.num_replicates
        # (a, b, H, h, log gamma, 1 - gamma) of estimators.reduction.betting_inputs
        self.betting_range = _on_device(
            (0.0,) * 6 if betting_range is None else betting_range, self.dtype
        )
        self.mesh = mesh
        self.params = group.stacked_params(self.dtype)
        self.q_params = group.stacked_q_params(self.dtype)
        self.behavior_params = (
            None
            if behavior is None or behavior.params is None
            else {k: _on_device(v, self.dtype) for k, v in behavior.params.items()}
        )
        self.static = Static(
            log_prob=group.head.log_prob,
            behavior_log_prob=None if behavior is None else behavior.log_prob,
            behavior_folds=1 if behavior is None else behavior.folds,
            num_groups=settings.num_groups,
            dtype=self.dtype.name,
            mesh=mesh,
            # every estimator registered when the kernel is made that the inputs allow
            estimators=available(Q_FIELDS if q is not None else ()),
            q=q,
            betting=betting_range is not None,
            terms=terms,
            own_rows=mesh is None,
            logits=group.head.logits,
        )
        self._sharding = (
            NamedSharding(mesh, PartitionSpec(BATCH_AXIS)) if mesh is not None else None
        )
        self._carry_sharding = (
            NamedSharding(mesh, PartitionSpec(None, BATCH_AXIS)) if mesh is not None else None
        )
        self._calls: dict[tuple, Callable] = {}  # (function, signature) -> compiled call

    @property
    def estimators(self) -> tuple[str, ...]:
        return self.static.estimators

    def _estimator_code(self) -> list[Callable]:
        code = []
        for name in self.static.estimators:
            estimator = get(name)
            code += [estimator.init, estimator.advance, estimator.finish]
        return code

    def _call(self, function, args: tuple) -> tuple:
        """``function`` (a jitted kernel) on ``args``: a compiled kernel kept on disk
        (``kernel_cache``) when there is a compilation cache and the code is the package's
        own, else the jitted function (compiled once per shape in this process)."""
        signature = (function.__name__, jax.tree.structure(args), _signature(args))
        call = self._calls.get(signature)
        if call is None:
            static = {"static": self.static}
            named = {"kernel": function.__name__, **self.static._asdict()}
            key = kernel_cache.kernel_key(args, named, self._estimator_code())
            compiled = (
                None
                if key is None
                else kernel_cache.load_or_compile(
                    functools.partial(_compile_named, function, args, static),
                    key,
                    kernel_cache.execution_devices(self.static.mesh),
                )
            )
            call = compiled or functools.partial(function, **static)
            self._calls[signature] = call
        return call(*args)

    def initial_carry(self, lanes: int) -> EpisodeCarry:
        """The carry before a batch's first window: [P, L] leaves on the device(s), made
        once per L (the kernel never writes into its inputs)."""
        if lanes not in self._initial:
            policies = 1 if self.params is None else len(self.group.policies)
            zero = np.zeros((policies, lanes), self.dtype)
            carry = init_carry(zero, self.static.estimators, self.static.betting)
            carry = jax.tree.map(
                lambda x: np.ascontiguousarray(np.broadcast_to(x, zero.shape)), carry
            )
            self._initial[lanes] = jax.device_put(carry, self._carry_sharding)
        return self._initial[lanes]

    def carry_layout(self, x: np.ndarray, lanes: int) -> np.ndarray:
        """A window's per-episode array ``x`` [B, ...] laid out as the carry's ``lanes``
        lanes: on each of D devices, the device's B / D episodes first, then filler."""
        if lanes == x.shape[0]:
            return x
        devices = 1 if self.mesh is None else self.mesh.size
        own, total = x.shape[0] // devices, lanes // devices
        out = np.zeros((lanes, *x.shape[1:]), x.dtype)
        for device in range(devices):
            out[device * total : device * total + own] = x[device * own : (device + 1) * own]
        return out

    def windows(self, batch: PaddedBatch, width: int) -> list[tuple[int, PaddedBatch]]:
        """(start, [B, width] window) of ``batch`` (host arrays), in order, its floats in the
        kernel's dtype: float32 observations (as D4RL and Minari store them) then call the
        kernels float64 ones do, rather than compiling a set of their own."""
        return split_windows(batch, width, self.dtype)

    def device_windows(self, batch: PaddedBatch, width: int) -> list[tuple[int, PaddedBatch]]:
        """``windows`` for the device(s): with a mesh, put there with the episode axis split
        over it; on one device, host arrays, which the compiled call takes as they are
        (``split_windows`` aligns them: on the CPU, XLA copies an unaligned array in, for a
        quarter of what a ``device_put`` per window costs)."""
        windows = self.windows(batch, width)
        if self._sharding is None:
            return windows
        return [(start, jax.device_put(window, self._sharding)) for start, window in windows]

    def counts(self, batch: PaddedBatch) -> np.ndarray:
        """[B, R] bootstrap counts of the batch's episodes (host)."""
        return replicate_counts(batch.key_hi, batch.key_lo, self.seed, self.num_replicates)

    def __call__(self, batch: PaddedBatch, width: int | None = None) -> KernelOutput:
        """Dispatches every window of ``batch`` ([B, T], T a multiple of ``width``; None:
        one window of T) and the finish; returns device arrays."""
        width = batch.shape[1] if width is None else width
        lengths = group_lengths(batch, self.static.num_groups)
        # a group whose episodes run past half the batch keeps every window, as the other
        # groups of a batch of similar lengths do: rows of one length merge without copies
        lengths = np.where(2 * lengths > batch.shape[1], batch.shape[1], lengths)
        return self.walk(self.device_windows(batch, width), self.counts(batch), lengths)

    def _lanes_of_carry(self, lanes: int) -> int:
        """The carry's lanes for windows of ``lanes`` (``carry_lanes`` when it is more)."""
        return max(lanes, self.carry_lanes or 0)

    def _advance_args(self, window: PaddedBatch, start: int, carry, counts) -> tuple:
        """The advance kernel's inputs: a WindowInputs' fields, in order."""
        return tuple(
            WindowInputs(
                self.params,
                self.behavior_params,
                self.q_params,
                window,
                np.int32(start),
                carry,
                counts,
                self.gamma,
                self.seed,
                self.betting_range,
            )
        )

    def walk(
        self,
        windows: list[tuple[int, PaddedBatch]],
        counts: np.ndarray,
        group_lengths: np.ndarray | None = None,
    ) -> KernelOutput:
        """Dispatches the advance kernel on each of a batch's ``windows`` (in order; host
        arrays, or on the device(s)) and the finish kernel, with the batch's [B, R]
        bootstrap ``counts`` (host); returns device arrays. With each resampling group's
        longest episode (``group_lengths`` [K]), a window that extends few groups' rows
        is brought to the host as those rows while later ones run (``_few_rows``): a
        very long episode's windows then hold one row each, not K."""
        lanes, width = windows[0][1].step_mask.shape
        if group_lengths is None and lanes == 1 and self.static.own_rows:
            # its per-group sums are its group's row alone: they need placing
            group_lengths = _lane_group_spans(windows, self.static.num_groups)
        carry_lanes = self._lanes_of_carry(lanes)
        carry = self.initial_carry(carry_lanes)
        window_counts = counts if self._sharding is None else jax.device_put(counts, self._sharding)
        steps, zero_behavior, faults = [], [], []
        length = len(windows) * width
        joined: dict[str, dict[str, SideBySide]] = {}
        early = 0  # the first windows, whose sums not per group are in ``joined``
        with self._user_code_errors():
            for start, window in windows:
                args = self._advance_args(window, start, carry, window_counts)
                carry, statistics, (zero, found) = self._call(_advance_kernel, args)
                steps.append((start, statistics))
                zero_behavior.append(zero)
                faults.append(found)
                if group_lengths is not None and len(steps) > 2:  # two stay in flight
                    on_device = steps[-3]
                    steps[-3] = _few_rows(on_device, group_lengths)
                    if steps[-3] is not on_device and early == len(steps) - 3:
                        steps[-3] = _join_early(joined, steps[-3], length)
                        early += 1
            last = windows[-1][1]
            laid_out = [
                self.carry_layout(np.asarray(x), carry_lanes)
                for x in (last.episode_mask, last.group, counts)
            ]
            lanes = (laid_out[0], laid_out[2])
            if self._sharding is not None:
                laid_out = jax.device_put(laid_out, self._sharding)
            scalar, terms = self._call(_finish_kernel, (carry, *laid_out, self.betting_range))
        zero_behavior = None if self.behavior is None else zero_behavior
        lanes = lanes if self.static.terms else None
        return KernelOutput(
            steps,
            scalar,
            zero_behavior,
            length,
            terms,
            lanes,
            group_lengths,
            joined or None,
            faults,
        )

    def _empty_call(self, template: PaddedBatch, lanes: int, width: int, carry_lanes: int):
        """(args, kernel key or None, its kept file or None) of the advance kernel on an
        empty [lanes, width] window with ``template``'s dtypes."""

        def empty(x):
            size = (lanes, width) if x.ndim > 1 else (lanes,)
            dtype = as_float(x.dtype, self.dtype) if x.ndim > 1 else x.dtype
            return np.zeros((*size, *x.shape[len(size) :]), dtype)

        window = map_arrays(empty, template)
        counts = np.zeros((lanes, self.num_replicates), np.uint8)
        if self._sharding is not None:
            window, counts = jax.device_put((window, counts), self._sharding)
        args = self._advance_args(window, 0, self.initial_carry(carry_lanes), counts)
        named = {"kernel": _advance_kernel.__name__, **self.static._asdict()}
        key = kernel_cache.kernel_key(args, named, self._estimator_code())
        folder = kernel_cache.directory()
        path = None if key is None or folder is None else folder / f"{key}.bin"
        return args, key, path

    def kept_path(self, template: PaddedBatch, lanes: int, width: int) -> Path | None:
        """Where the advance kernel of window shape [lanes, width] is kept on disk
        (``kernel_cache``): a new process loads it from there once it exists; None where it
        cannot be kept (user code, no compilation cache), so it is traced every run."""
        _, _, path = self._empty_call(template, lanes, width, self._lanes_of_carry(lanes))
        return path

    def compile_catalogue(self, template: PaddedBatch, shapes, on_status=None) -> int:
        """Compiles and keeps (``kernel_cache``) the advance kernel of every window shape of
        ``shapes`` (``buckets.WindowShape``) that this configuration has not kept yet, from
        an empty window with ``template``'s dtypes, so that later data of any lengths
        compiles nothing. Only where kernels are kept (the package's own code, a
        compilation cache); returns how many it compiled. ``on_status`` hears of the first
        compilation (a step without rows, after the last batch)."""
        compiled = 0
        carry_lanes = self._lanes_of_carry(max(shape.lanes for shape in shapes))
        for shape in shapes:
            args, key, path = self._empty_call(template, shape.lanes, shape.width, carry_lanes)
            signature = (_advance_kernel.__name__, jax.tree.structure(args), _signature(args))
            if signature in self._calls or path is None or path.is_file():
                continue
            if on_status is not None and compiled == 0:
                on_status("compiling the kernels of the other window shapes, for the next data")
            static = {"static": self.static}
            compile_named = functools.partial(_compile_named, _advance_kernel, args, static)
            devices = kernel_cache.execution_devices(self.static.mesh)
            compiled += kernel_cache.load_or_compile(compile_named, key, devices) is not None
        return compiled

    def _user_code_errors(self):
        """A context that reports an error raised by user code under jit as a PolicyError."""
        head = self.group.head
        user_code = [
            f"policy {p.name}"
            for p in (head, self.behavior)
            if p is not None and p.kind == "entry_point"
        ]
        user_code += [
            f"Q function {q.name}" for q in self.group.qs or () if q.kind == "entry_point"
        ][:1]
        return _UserCode(" / ".join(user_code) if user_code else None)


# what JAX raises where code cannot be traced (Python control flow or NumPy on a tracer)
TRACING_ERRORS = (
    jax.errors.ConcretizationTypeError,
    jax.errors.NonConcreteBooleanIndexError,
    jax.errors.TracerArrayConversionError,
    jax.errors.TracerBoolConversionError,
    jax.errors.TracerIntegerConversionError,
    jax.errors.UnexpectedTracerError,
)


class _UserCode:
    """Turns an exception raised while user code (``names``) is traced into a PolicyError."""

    def __init__(self, names: str | None):
        self.names = names

    def __enter__(self):
        return self

    def __exit__(self, kind, error, traceback) -> bool:
        if error is None or self.names is None or not isinstance(error, Exception):
            return False
        if isinstance(error, PolicyError):
            raise PolicyError(f"{self.names}: {error}") from None
        if isinstance(error, TRACING_ERRORS):
            raise PolicyError(
                f"{self.names} cannot be evaluated under jax.jit/vmap "
                f"(is it JAX-traceable?): {summary(error)}"
            ) from None
        # an error of its own (a ValueError it raises): not a question of tracing
        raise PolicyError(
            f"{self.names} failed while traced under jax.jit/vmap: {summary(error)}"
        ) from None


def _compile_named(function, args: tuple, static: dict, name: str):
    """``function`` (a jitted kernel) compiled for ``args``' shapes as a module called
    ``name`` (``kernel_cache.load_or_compile``)."""
    renamed = jax.jit(
        kernel_cache.renamed(function.__wrapped__, name),
        static_argnames=tuple(static),
        compiler_options=COMPILER_OPTIONS,
    )
    return renamed.lower(*args, **static).compile()


def batch_statistics_of(kernel: Kernel, batch: PaddedBatch, width: int | None = None):
    """The host BatchStatistics [D, P, ...] of ``batch`` through ``kernel`` (tests, bench)."""
    return assemble(host_arrays(kernel(batch, width)))


class GroupSettings(NamedTuple):
    """The static settings of ``policy_group_statistics``: the policies' ``log_prob``, the
    resampling groups, the bootstrap replicates, the float dtype, the registered
    estimators whose sums to compute (None: every one the inputs allow), the Q source's
    QSpec (None: none) and with ``terms`` each episode's terms besides."""

    log_prob: LogProbFn | None
    num_groups: int
    num_replicates: int
    dtype: Any
    estimators: tuple[str, ...] | None = None
    q: QSpec | None = None
    terms: bool = False


def policy_group_statistics(
    params,
    batch: PaddedBatch,
    gamma,
    seed,
    betting_range,
    settings: GroupSettings,
    *,
    q_params=None,
    counts=None,
) -> BatchStatistics | tuple[BatchStatistics, dict]:
    """BatchStatistics [1, P, ...] of a whole padded batch ([B, T, ...] fields) walked as
    one window, for the P stacked ``params`` of one policy group; not jitted (the coverage
    study vmaps it over datasets). ``counts``: [B, R] bootstrap counts, else drawn here
    (``poisson_counts``). With ``settings.terms``: (statistics, each episode's terms
    {name: [P, B]}: ``estimators.reduction.episode_terms``), the paired sums' inputs."""
    from ope_cli.estimation.estimators.reduction import poisson_counts

    log_prob, num_groups, num_replicates, dtype, estimators, q, terms = settings
    static = Static(
        log_prob=log_prob,
        behavior_log_prob=None,
        behavior_folds=1,
        num_groups=num_groups,
        dtype=np.dtype(dtype).name,
        mesh=None,
        estimators=estimators or available(Q_FIELDS if q is not None else ()),
        q=q,
        betting=betting_range is not None,
        terms=terms,
    )
    if counts is None:
        counts = poisson_counts(batch.key_hi, batch.key_lo, seed, num_replicates)
    policies = 1 if params is None else jax.tree.leaves(params)[0].shape[0]
    zero = jnp.zeros((policies, batch.shape[0]), static.dtype)
    carry = init_carry(zero, static.estimators, static.betting)
    betting = jnp.zeros(6, static.dtype) if betting_range is None else betting_range
    inputs = WindowInputs(params, None, q_params, batch, 0, carry, counts, gamma, seed, betting)
    carry, step, _ = window_statistics(inputs, static)
    scalar, own = finish_statistics(carry, batch.episode_mask, batch.group, counts, betting, static)
    statistics = _leading_device_axis(combine(lagged(step), scalar))
    return (statistics, own) if terms else statistics


__all__ = [
    "BATCH_AXIS",
    "Kernel",
    "KernelOutput",
    "KernelSettings",
    "PolicyGroup",
    "assemble",
    "group_policies",
    "local_mesh",
    "split_windows",
    "trace_count",
]
