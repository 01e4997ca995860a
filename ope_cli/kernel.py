"""The jitted kernel: vmap a policy's per-step log_prob over steps, episodes and stacked
policies, then reduce a padded [B, T] batch to BatchStatistics with a leading policy
axis [P, ...]. With a ``--behavior`` policy, its log pi_b(a|s) replaces the batch's
``log_behavior`` inside the same jitted call (its params are one more input).
One module-level jit serves every run in the process, so each (policy function,
behavior function, batch shape, dtype) compiles once; a persistent compilation cache
(``runtime.enable_compilation_cache``) carries compilations across processes.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from ope_cli import kernel_cache
from ope_cli.behavior import ZeroProbabilitySteps
from ope_cli.bootstrap_counts import replicate_counts
from ope_cli.buckets import PaddedBatch
from ope_cli.errors import PolicyError, UsageError, summary
from ope_cli.estimators import available, get
from ope_cli.estimators.batch import (
    BatchStatistics,
    WeightedBatch,
    batch_statistics,
    log_weights,
    poisson_counts,
)
from ope_cli.estimators.doubly_robust import Q_FIELDS
from ope_cli.fit.base import fold_index
from ope_cli.kernel_cache import COMPILER_OPTIONS
from ope_cli.policies import LogProbFn, Policy
from ope_cli.qfunctions import QFunction, QSpec, episode_q_fields, q_spec

BATCH_AXIS = "batch"


def trace_count() -> int:
    """How many kernels this process compiled (or fetched from the persistent cache): one
    per batch shape of each configuration, traced at it or compiled from its export."""
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


def _policy_log_probs(
    log_prob: LogProbFn | None, params, observation, action, log_target, step_mask, dtype
):
    """[P, B, T] log pi_e(a_t | s_t) of every policy of a group (P = 1 without params)."""
    if log_prob is None:  # logged target probabilities
        return log_target[None]
    per_step = jax.vmap(jax.vmap(log_prob, in_axes=(None, 0, 0)), in_axes=(None, 0, 0))
    if params is None:
        log_pi = per_step(None, observation, action)[None]
    else:
        log_pi = jax.vmap(per_step, in_axes=(0, None, None))(params, observation, action)
    if log_pi.shape[1:] != step_mask.shape:
        raise PolicyError(f"log_prob must return a scalar per step, got shape {log_pi.shape[3:]}")
    return log_pi.astype(dtype)


def behavior_log_probs(
    log_prob: LogProbFn, params, observation, action, dtype, fold=None
) -> jax.Array:
    """[B, T] log pi_b(a_t | s_t) of the behavior policy (one policy, ``params`` unstacked);
    cross-fitted: ``params`` [K, ...] and episode b uses fold ``fold`` [B] of them."""
    if fold is None:
        per_step = jax.vmap(jax.vmap(log_prob, in_axes=(None, 0, 0)), in_axes=(None, 0, 0))
    else:
        params = jax.tree.map(lambda p: p[fold], params)  # [B, ...]
        per_step = jax.vmap(jax.vmap(log_prob, in_axes=(None, 0, 0)), in_axes=(0, 0, 0))
    log_b = per_step(params, observation, action)
    if log_b.shape != action.shape[:2]:
        raise PolicyError(f"log_prob must return a scalar per step, got shape {log_b.shape[2:]}")
    return log_b.astype(dtype)


def zero_probability_steps(log_b: jax.Array, batch: PaddedBatch) -> ZeroProbabilitySteps:
    """How many real steps of ``batch`` have a non-finite behavior log-probability ``log_b``
    [B, T] (-inf: the logged action has probability 0), and the first one; leaves [1]."""
    bad = batch.step_mask & ~jnp.isfinite(log_b)
    first = jnp.argmax(bad.reshape(-1))
    episode, step = jnp.divmod(first, bad.shape[1])
    return ZeroProbabilitySteps(
        count=jnp.sum(bad, dtype=jnp.int32)[None],
        key_hi=batch.key_hi[episode][None],
        key_lo=batch.key_lo[episode][None],
        step=step.astype(jnp.int32)[None],
        value=log_b.reshape(-1)[first][None],
    )


class KernelOutput(NamedTuple):
    """What one kernel call returns: BatchStatistics [D, P, ...], and with a ``--behavior``
    policy its ZeroProbabilitySteps [D] (else None)."""

    statistics: BatchStatistics
    zero_behavior: ZeroProbabilitySteps | None


def _q_fields(spec: QSpec | None, log_prob, params, q_params, batch: PaddedBatch, seed, dtype):
    """{"q_t", "v_t": [P, B, T]} of every policy of a group, or {} without a Q source."""
    if spec is None:
        return {}

    def one_policy(policy_params, q_params_p):
        return episode_q_fields(spec, log_prob, policy_params, q_params_p, batch, seed, dtype)

    if params is None and q_params is None:
        return jax.tree.map(lambda x: x[None], one_policy(None, None))
    return jax.vmap(one_policy, in_axes=(None if params is None else 0, 0))(params, q_params)


def policy_group_statistics(  # noqa: PLR0913 - statics are keyword-only
    params,
    batch: PaddedBatch,
    gamma,
    seed,
    betting_range,
    *,
    log_prob,
    num_groups,
    num_replicates,
    dtype,
    estimators=None,
    q=None,
    q_params=None,
    counts=None,
) -> BatchStatistics:
    """BatchStatistics [1, P, ...] of (this device's share of) a padded batch (PaddedBatch
    fields [B, T, ...]) for the P stacked ``params`` of one policy group; not jitted.
    ``estimators``: the registered estimators whose sums to compute (None: all);
    ``q``: the group's QSpec and ``q_params`` its stacked parameters [P, ...] (None without
    a Q source); ``counts``: [B, R] bootstrap counts (``replicate_counts``), else drawn
    here (``poisson_counts``)."""
    steps = jax.tree.map(
        lambda x: x.astype(dtype) if jnp.issubdtype(x.dtype, jnp.floating) else x, batch.steps
    )
    log_pi = _policy_log_probs(
        log_prob, params, steps.observation, steps.action, steps.log_target, batch.step_mask, dtype
    )
    log_w = log_weights(log_pi, steps.log_behavior, batch.step_mask)
    if counts is None:
        counts = poisson_counts(batch.key_hi, batch.key_lo, seed, num_replicates)
    fields = _q_fields(q, log_prob, params, q_params, batch._replace(steps=steps), seed, dtype)

    def per_policy(log_w_bt, fields_bt):
        weighted = WeightedBatch(
            log_w_bt,
            steps.reward,
            batch.step_mask,
            batch.episode_mask,
            batch.group,
            counts,
            fields_bt,
        )
        return batch_statistics(weighted, gamma, num_groups, betting_range, estimators)

    statistics = jax.vmap(per_policy)(log_w, fields)
    return jax.tree.map(lambda x: x[None], statistics)


def _with_behavior(statistics, behavior_log_prob, dtype, behavior_folds=1):
    """``statistics`` (params, batch, ...) -> KernelOutput, the batch's log_behavior first
    replaced by the behavior policy's log-probabilities when there is one."""

    def run(params, behavior_params, q_params, batch: PaddedBatch, counts, *rest) -> KernelOutput:
        statistics_of = functools.partial(statistics, q_params=q_params, counts=counts)
        if behavior_log_prob is None:
            return KernelOutput(statistics_of(params, batch, *rest), None)
        observation = batch.steps.observation
        if jnp.issubdtype(observation.dtype, jnp.floating):
            observation = observation.astype(dtype)
        action = batch.steps.action
        if jnp.issubdtype(action.dtype, jnp.floating):
            action = action.astype(dtype)
        fold = None
        if behavior_folds > 1:  # cross-fitted: each episode's fold, from its id key
            fold = fold_index(batch.key_hi, batch.key_lo, behavior_folds, jnp)
        log_b = behavior_log_probs(
            behavior_log_prob, behavior_params, observation, action, dtype, fold
        )
        batch = batch._replace(steps=batch.steps._replace(log_behavior=log_b))
        return KernelOutput(
            statistics_of(params, batch, *rest), zero_probability_steps(log_b, batch)
        )

    return run


@functools.partial(
    jax.jit,
    compiler_options=COMPILER_OPTIONS,
    static_argnames=(
        "log_prob",
        "behavior_log_prob",
        "behavior_folds",
        "num_groups",
        "num_replicates",
        "dtype",
        "mesh",
        "estimators",
        "q",
    ),
)
def _kernel(  # noqa: PLR0913 - statics are keyword-only
    params,
    behavior_params,
    q_params,
    batch: PaddedBatch,
    counts,
    gamma,
    seed,
    betting_range,
    *,
    log_prob,
    behavior_log_prob,
    num_groups,
    num_replicates,
    dtype,
    mesh,
    estimators=None,
    behavior_folds=1,
    q=None,
) -> KernelOutput:
    """KernelOutput of BatchStatistics [D, P, ...]: one row per device of ``mesh`` (D = 1
    without one), and the behavior policy's zero-probability steps [D] (None without one).
    ``counts``: the batch's [B, R] bootstrap counts (``replicate_counts``).

    With a mesh, each device reduces its own share of the episodes (every leaf of ``batch``
    is split along its episode axis) and the per-device partials come back to the host to be
    merged there: no cross-device collective runs inside the kernel, so any number of calls
    can be in flight without deadlocking.
    """
    if all(isinstance(size, int) for size in batch.step_mask.shape):
        kernel_cache.count_compilation()  # not the one symbolic trace of an export
    statistics = functools.partial(
        policy_group_statistics,
        log_prob=log_prob,
        num_groups=num_groups,
        num_replicates=num_replicates,
        dtype=dtype,
        estimators=estimators,
        q=q,
    )
    run = _with_behavior(statistics, behavior_log_prob, dtype, behavior_folds)
    args = (params, behavior_params, q_params, batch, counts, gamma, seed, betting_range)
    if mesh is None:
        return run(*args)
    by_episode = PartitionSpec(BATCH_AXIS)
    replicated = PartitionSpec()
    batch_specs = jax.tree.map(lambda _: by_episode, batch)
    in_specs = (
        *(replicated,) * 3,
        batch_specs,
        by_episode,
        *(replicated,) * 3,
    )
    return jax.shard_map(run, mesh=mesh, in_specs=in_specs, out_specs=by_episode)(*args)


def _signature(args) -> tuple:
    return tuple(None if x is None else (x.shape, x.dtype) for x in jax.tree.leaves(args))


def _symbolic_specs(args: tuple) -> tuple:
    """ShapeDtypeStructs of the kernel's ``args`` with the batch's episode axis B and step
    axis T symbolic (``counts`` [B, R] too); parameters and scalars keep their shapes."""
    episodes, steps = jax.export.symbolic_shape("B, T")

    def spec(x, leading):  # tree.map never passes a None field
        return jax.ShapeDtypeStruct((*leading, *x.shape[len(leading) :]), x.dtype)

    params, behavior_params, q_params, batch, counts, *scalars = args
    batch_specs = jax.tree.map(
        lambda x: spec(x, (episodes, steps) if x.ndim >= 2 else (episodes,)), batch
    )
    fixed = jax.tree.map(lambda x: spec(x, ()), (params, behavior_params, q_params, scalars))
    return (*fixed[:3], batch_specs, spec(counts, (episodes,)), *fixed[3])


def _exported(args: tuple, static: dict) -> Callable | None:
    """``kernel_cache.exported`` of the kernel for ``args``; None with a mesh: a sharded
    kernel is traced per shape (jaxlib 0.10.2 on CPU crashed, SIGSEGV, calling an exported
    shard_map kernel whose episode axis was 2 * b)."""
    if static["mesh"] is not None:
        return None
    return kernel_cache.exported(_kernel.__wrapped__, static, _symbolic_specs(args))


def _compile_named(args: tuple, static: dict, name: str):
    """The kernel compiled for ``args``' shapes as a module called ``name``
    (``kernel_cache.load_or_compile``), from the exported kernel where there is one."""
    exported = _exported(args, static)
    if exported is not None:
        renamed = kernel_cache.renamed(exported, name)
        return jax.jit(renamed, compiler_options=COMPILER_OPTIONS).lower(*args).compile()
    renamed = jax.jit(
        kernel_cache.renamed(_kernel.__wrapped__, name),
        static_argnames=tuple(static),
        compiler_options=COMPILER_OPTIONS,
    )
    return renamed.lower(*args, **static).compile()


def local_mesh(devices: int | None = None) -> Mesh | None:
    """A 1-D mesh over the first ``devices`` local devices (all by default); None for one."""
    available = jax.local_devices()
    count = len(available) if devices is None else devices
    if not 1 <= count <= len(available):
        raise UsageError(f"--devices {count}: this process has {len(available)} device(s)")
    if count == 1:
        return None
    return Mesh(np.array(available[:count]), (BATCH_AXIS,))


class Kernel:
    """``batch -> KernelOutput`` (BatchStatistics [D, P, ...], device arrays, dispatched
    asynchronously) for one policy group, the episode axis sharded over ``mesh`` when
    given; with ``behavior``, its log-probabilities replace the logged ones."""

    def __init__(  # noqa: PLR0913 - the behavior policy is keyword-only
        self,
        group: PolicyGroup,
        gamma: float,
        num_groups: int,
        dtype,
        mesh: Mesh | None,
        num_replicates: int = 0,
        seed: int = 0,
        betting_range: tuple[float, float, float] | None = None,
        *,
        behavior: Policy | None = None,
        v_samples: int = 16,
    ):
        self.group = group
        self.behavior = behavior
        self.q = None if group.qs is None else q_spec(group.qs[0], group.head, v_samples)
        # every estimator registered when the kernel is made that the inputs allow
        self.estimators = available(Q_FIELDS if self.q is not None else ())
        self.dtype = np.dtype(dtype)
        self.gamma = _on_device(gamma, self.dtype)
        self.seed = _on_device(seed, np.uint32)
        self.num_groups = num_groups
        self.num_replicates = num_replicates
        # (a, b, H) of estimators.betting_variables; None: no betting histogram
        self.betting_range = (
            None if betting_range is None else _on_device(betting_range, self.dtype)
        )
        self.mesh = mesh
        self.params = group.stacked_params(self.dtype)
        self.q_params = group.stacked_q_params(self.dtype)
        self.behavior_params = (
            None
            if behavior is None or behavior.params is None
            else {k: _on_device(v, self.dtype) for k, v in behavior.params.items()}
        )
        self._sharding = (
            NamedSharding(mesh, PartitionSpec(BATCH_AXIS)) if mesh is not None else None
        )
        self._calls: dict[tuple, Callable] = {}  # batch signature -> compiled kernel's call

    def _call(self, args: tuple, static: dict) -> KernelOutput:
        """The kernel on ``args``: a compiled kernel kept on disk (``kernel_cache``) when
        there is a compilation cache and the code is the package's own, else the kernel
        exported at symbolic shapes, else the jitted function."""
        signature = (jax.tree.structure(args), _signature(args))
        call = self._calls.get(signature)
        if call is None:
            estimator_code = [get(name).terms for name in self.estimators]
            key = kernel_cache.kernel_key(args, static, estimator_code)
            compiled = (
                None
                if key is None
                else kernel_cache.load_or_compile(
                    functools.partial(_compile_named, args, static), key
                )
            )
            call = compiled or self._jitted(args, static)
            self._calls[signature] = call
        return call(*args)

    @staticmethod
    def _jitted(args: tuple, static: dict) -> Callable:
        """The kernel compiled in this process only: from its export, else traced per shape.
        (Never asked for when a kept kernel was loaded: exporting traces the kernel.)"""
        exported = _exported(args, static)
        if exported is None:
            return functools.partial(_kernel, **static)
        return kernel_cache.jitted(exported)

    def _narrow(self, x: np.ndarray) -> np.ndarray:
        """Floats wider than the kernel's dtype are narrowed on the host (less to transfer);
        narrower ones are widened on the device."""
        if np.issubdtype(x.dtype, np.floating) and x.dtype.itemsize > self.dtype.itemsize:
            return x.astype(self.dtype)
        return x

    def arguments(self, batch: PaddedBatch) -> tuple[tuple, dict]:
        """(args, static) of ``_kernel`` for ``batch``: its arrays on the device(s), with
        the bootstrap counts drawn for its episodes."""
        head = self.group.head
        narrowed = jax.tree.map(self._narrow, batch)  # None fields stay None
        counts = replicate_counts(batch.key_hi, batch.key_lo, self.seed, self.num_replicates)
        # one call for the whole batch
        on_device, counts = jax.device_put((narrowed, counts), self._sharding)
        args = (
            self.params,
            self.behavior_params,
            self.q_params,
            on_device,
            counts,
            self.gamma,
            self.seed,
            self.betting_range,
        )
        static = dict(
            log_prob=head.log_prob,
            behavior_log_prob=None if self.behavior is None else self.behavior.log_prob,
            behavior_folds=1 if self.behavior is None else self.behavior.folds,
            num_groups=self.num_groups,
            num_replicates=self.num_replicates,
            dtype=self.dtype.name,
            mesh=self.mesh,
            estimators=self.estimators,
            q=self.q,
        )
        return args, static

    def __call__(self, batch: PaddedBatch) -> KernelOutput:
        head = self.group.head
        args, static = self.arguments(batch)
        user_code = [
            f"policy {p.name}"
            for p in (head, self.behavior)
            if p is not None and p.kind == "entry_point"
        ]
        user_code += [
            f"Q function {q.name}" for q in self.group.qs or () if q.kind == "entry_point"
        ][:1]
        if not user_code:
            return self._call(args, static)
        names = " / ".join(user_code)
        try:
            return self._call(args, static)
        except PolicyError as error:
            raise PolicyError(f"{names}: {error}") from None
        except Exception as error:  # noqa: BLE001 - user code failing under jit is a policy error
            raise PolicyError(
                f"{names} cannot be evaluated under jax.jit/vmap "
                f"(is it JAX-traceable?): {summary(error)}"
            ) from None
