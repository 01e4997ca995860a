"""The one loop over the data: files -> record batches -> episodes -> buckets ->
padded batches -> kernel -> batch statistics -> merged accumulators -> result."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import operator
import time
from collections.abc import Callable, Iterator

import numpy as np

from ope_cli.behavior import (
    BehaviorSource,
    check_behavior_against_chunk,
    column_source,
    first_zero_probability,
    is_estimate,
    load_behavior,
    policy_source,
    zero_probability_error,
)
from ope_cli.buckets import RESAMPLING_GROUPS, Bucketer, PaddedBatch
from ope_cli.config import EvaluationConfig
from ope_cli.distributed import (
    DistributedConfig,
    allgather_ragged,
    check_all_succeeded,
    check_disjoint_episodes,
    initialize,
    reduce_accumulators,
    reduce_counters,
    share_files,
)
from ope_cli.episodes import EpisodeAssembler, EpisodeChunk
from ope_cli.errors import DataError, OpeError
from ope_cli.estimators import available as available_estimators
from ope_cli.estimators.base import (
    describe_standard_errors,
)
from ope_cli.estimators.doubly_robust import Q_FIELDS
from ope_cli.plan import (
    IntervalPlan,
    annotate_results,
    check_config,
    plan_intervals,
    reported_estimators,
)
from ope_cli.policies import (
    Policy,
    check_against_schema,
    chunk_checks,
    load_policies,
    logged_policy,
)
from ope_cli.qfunctions import FIT, QFunction, check_q, load_qs, q_source
from ope_cli.qfunctions import chunk_checks as q_chunk_checks
from ope_cli.results import EvaluationResult, PolicyResult
from ope_cli.schema import DataSchema, resolve_schema
from ope_cli.sources import (
    Dataset,
    iter_batches,
    open_dataset,
    prefetched,
)
from ope_cli.stats import (
    Accumulator,
    finalize,
    from_batch,
    init,
    merge,
    profile,
    unstack,
)
from ope_cli.validate import REASONS, Check, dropped_by_reason

MAX_BATCHES_IN_FLIGHT = 2  # dispatch ahead so host work overlaps the kernel, bounded memory


@dataclasses.dataclass
class Counters:
    """Integer tallies of one process's share; summed across processes field by field
    (``max`` where the metadata says so), so a new counter is one new field."""

    episodes: int = 0
    steps: int = 0
    rows_read: int = 0
    padded_steps: int = 0
    max_length: int = dataclasses.field(default=0, metadata={"reduce": "max"})
    dropped: np.ndarray = dataclasses.field(  # [len(REASONS), 2] (episodes, steps) per reason
        default_factory=lambda: np.zeros((len(REASONS), 2), np.int64)
    )


@dataclasses.dataclass
class _LocalPass:
    """What one process learned from its share of the data."""

    accumulators: list[Accumulator]
    counters: Counters = dataclasses.field(default_factory=Counters)
    keys: np.ndarray | None = None
    shapes: set[tuple[int, int]] = dataclasses.field(default_factory=set)  # [B, T] emitted

    def reduce_across_processes(self) -> None:
        """Collective: every process ends with the totals of all of them."""
        check_disjoint_episodes(self.keys)
        self.counters = reduce_counters(self.counters)
        self.accumulators = reduce_accumulators(self.accumulators)
        shapes = allgather_ragged(np.array(sorted(self.shapes), np.int64).reshape(-1, 2))
        self.shapes = {(int(b), int(t)) for b, t in shapes}


class BatchStream:
    """One process's share of the data as padded batches: ``for batch in stream`` reads the
    files once (read ahead on a thread), assembles and validates episodes, and yields the
    [B, T] PaddedBatch of each bucket as it fills, then the partly filled ones.

    What consumers need besides the batches: ``schema``, ``policies``, ``plan`` (interval
    method and bounds), ``data`` (this process's files), ``files`` (all processes' count),
    ``behavior`` (the ``--behavior`` policy or None) and ``behavior_source``, ``qs`` (one
    Q function per policy, or None without a Q source); and, as the
    stream is consumed, ``counters`` (episodes, steps, rows, drops), ``shapes``
    (the [B, T] shapes emitted) and ``seen_keys()``.
    """

    def __init__(  # noqa: PLR0913 - what stream() resolved, handed over once
        self,
        config: EvaluationConfig,
        data: Dataset,
        schema: DataSchema,
        policies: list[Policy],
        plan: IntervalPlan,
        files: int,
        multiple_of: int = 1,
        on_progress: Callable[[int, int | None], None] | None = None,
        behavior: Policy | None = None,
        qs: list[QFunction] | None = None,
    ):
        self.config, self.data, self.schema = config, data, schema
        self.behavior = behavior
        self.qs = qs
        self.behavior_source: BehaviorSource | None = (  # None: estimated (set by fit)
            policy_source(behavior)
            if behavior is not None
            else column_source(schema)
            if schema.behavior_logged
            else None
        )
        self.policies, self.plan, self.files = policies, plan, files
        self.on_progress = on_progress
        self.counters = Counters()
        self.bucketer = Bucketer(config.batching, multiple_of=multiple_of)
        self.assembler = EpisodeAssembler(schema, config.on_invalid, self.chunk_checks_of)

    def chunk_checks_of(self, chunk: EpisodeChunk) -> Iterator[Check]:
        """Action and state ranges and bounds, validated with the data."""
        for policy in self.policies:
            yield from chunk_checks(policy, chunk)
        for q, policy in zip(self.qs or (), self.policies, strict=False):
            yield from q_chunk_checks(q, policy, chunk)
        yield from self.plan.chunk_checks(chunk)

    @property
    def shapes(self) -> set[tuple[int, int]]:
        return self.bucketer.shapes

    def seen_keys(self) -> np.ndarray:
        """[E] sorted uint64 keys of the episodes read so far."""
        return self.assembler.seen_keys()

    def __iter__(self) -> Iterator[PaddedBatch]:
        counts, assembler, bucketer = self.counters, self.assembler, self.bucketer
        total_rows = self.data.count_rows()
        if self.on_progress is not None:
            self.on_progress(0, total_rows)
        reading = prefetched(
            iter_batches(self.data, self.schema.read_columns, self.config.batching.read_rows)
        )
        with contextlib.closing(reading):  # a failure below stops the reading thread at once
            for chunk in assembler.chunks(reading):
                counts.episodes += chunk.num_episodes
                counts.steps += chunk.num_steps
                counts.max_length = max(counts.max_length, int(chunk.lengths.max()))
                if self.behavior is not None:
                    check_behavior_against_chunk(self.behavior, chunk)
                yield from bucketer.add(chunk)
                if self.on_progress is not None:
                    self.on_progress(assembler.rows_read, total_rows)
        yield from bucketer.flush()
        counts.rows_read = assembler.rows_read
        counts.padded_steps = bucketer.padded_steps
        counts.dropped = assembler.validation.dropped_counts()

    def reread_chunks(self) -> Iterator[EpisodeChunk]:
        """This process's episodes read again, on the host only (to locate an episode by
        its key on an error path)."""
        assembler = EpisodeAssembler(self.schema, self.config.on_invalid)
        reading = iter_batches(self.data, self.schema.read_columns, self.config.batching.read_rows)
        yield from assembler.chunks(reading)


def stream(
    config: EvaluationConfig,
    multiple_of: int = 1,
    on_progress: Callable[[int, int | None], None] | None = None,
    process: tuple[int, int] = (0, 1),
    on_status: Callable[[str], None] | None = None,
) -> BatchStream:
    """Opens the data of ``config`` (and its policies) for one pass of padded batches, with
    episodes per batch a multiple of ``multiple_of`` (the devices they are sharded over).
    ``process`` = (process id, number of processes): this process reads its share of the
    files. Raises OpeError subclasses (the data is read as the stream is iterated)."""
    policies: list[Policy] = load_policies(config.policies) or [logged_policy()]
    data = open_dataset(config.data)
    schema = resolve_schema(
        data.schema,
        config.columns,
        logged_target=not config.policies,
        source=config.data,
        logged_behavior=config.behavior is None,
    )
    estimating = is_estimate(config.behavior)
    behavior = None
    if config.behavior is not None and not estimating:
        behavior = load_behavior(config.behavior, schema)
    for policy in policies:
        if policy.kind != "logged":
            check_against_schema(policy, schema)
    columns = config.columns
    critic = None if columns.q_value is None else (columns.q_value, columns.v_value)
    qs = load_qs(config.q, policies, critic)
    for q, policy in zip(qs or [], policies if qs else [], strict=True):
        check_q(q, policy, schema)
    plan = plan_intervals(config, data.declared_bounds())
    config = dataclasses.replace(config, gamma=plan.gamma)  # --gamma, declared, or 1.0
    files = len(data.files)
    process_id, num_processes = process
    if num_processes > 1:
        data = data.restrict(share_files(data.files, process_id, num_processes))
    batches = BatchStream(
        config, data, schema, policies, plan, files, multiple_of, on_progress, behavior, qs
    )
    collectives = (allgather_ragged, check_all_succeeded) if num_processes > 1 else None
    fitting_q = any(q.kind == FIT for q in qs or ())
    passes = 1 + estimating + fitting_q  # over the data: the fits, then the evaluation
    say = on_status or (lambda text: None)
    if estimating:  # a first pass over the data fits pi_b, the stream's behavior policy
        from ope_cli.fit.estimate import estimate_into

        say(f"fitting the behavior policy (pass 1 of {passes}) ...")
        estimate_into(batches, batches.chunk_checks_of, collectives)
    if fitting_q:  # a pass fits Q-hat (fitted Q evaluation)
        from ope_cli.fitted_q import fit_q_into

        say(f"fitting Q-hat (pass {passes - 1} of {passes}) ...")
        fit_q_into(batches, collectives)
    if passes > 1:
        say(f"evaluating (pass {passes} of {passes})")
    return batches


def evaluate(
    config: EvaluationConfig,
    on_progress: Callable[[int, int | None], None] | None = None,
    distributed: DistributedConfig | None = None,
    on_status: Callable[[str], None] | None = None,
) -> EvaluationResult:
    """Streams the data once and estimates every policy. Raises OpeError subclasses.

    ``on_progress(rows_read, total_rows_or_None)`` is called as record batches arrive;
    ``on_status(text)`` before a step that may take a while without progress (compiling
    the kernel for a new batch shape).
    With ``distributed``, this process joins a multi-process run, reads its share of the
    files, and every process returns the same, fully reduced result.
    """
    started = time.perf_counter()
    check_config(config)
    process_id, num_processes, backend, precision, mesh = _join_runtime(config, distributed)
    from ope_cli import runtime
    from ope_cli.kernel import trace_count  # after joining a cluster, as every JAX use

    traces_before, counts_before = trace_count(), runtime.compilation_counts()
    devices = 1 if mesh is None else mesh.size

    error: OpeError | None = None
    try:
        batches = stream(config, devices, on_progress, (process_id, num_processes), on_status)
        local = _local_pass(batches, precision, mesh, on_status)
    except OpeError as failure:
        if num_processes == 1:
            raise
        error = failure
    if num_processes > 1:
        check_all_succeeded(error)
        local.reduce_across_processes()
    compiled = runtime.compilation_counts() - counts_before
    config = batches.config  # with the discount resolved (plan.gamma_source says whence)
    counts = local.counters
    _check_some_episodes(config, counts)
    plan, reported = batches.plan, reported_estimators(config)
    results = annotate_results(
        _policy_results(config, plan, batches, local), batches.policies, plan, config
    )
    behavior = batches.behavior_source
    if behavior is not None and behavior.fit is not None:  # --behavior estimate
        from ope_cli.fit.estimate import compare_with_logged

        behavior = compare_with_logged(config, behavior, results, evaluate)
    return EvaluationResult(
        source=config.data,
        layout=batches.schema.layout,
        schema=batches.schema,
        files=batches.files,
        episodes=counts.episodes,
        steps=counts.steps,
        rows_read=counts.rows_read,
        max_length=counts.max_length,
        gamma=config.gamma,
        gamma_source=plan.gamma_source,
        estimators=reported,
        confidence_level=config.confidence,
        confidence_method=f"{plan.describe(config)}; {describe_standard_errors(reported)}",
        interval=plan.method,
        reward_range=plan.reward_range,
        horizon=plan.horizon,
        results=results,
        behavior=behavior,
        seconds=time.perf_counter() - started,
        backend=backend,
        devices=devices,
        processes=num_processes,
        process_id=process_id,
        precision=precision,
        padded_steps=counts.padded_steps,
        batch_shapes=sorted(local.shapes),
        compiles=trace_count() - traces_before,
        compilations=compiled.compilations,
        compile_seconds=compiled.seconds,
        cache_hits=compiled.cache_hits,
        on_invalid=config.on_invalid,
        episodes_dropped=int(counts.dropped[:, 0].sum()),
        steps_dropped=int(counts.dropped[:, 1].sum()),
        dropped=dropped_by_reason(counts.dropped),
    )


def _join_runtime(config: EvaluationConfig, distributed: DistributedConfig | None):
    """Configures JAX (also without the command line), joins a multi-process run, turns
    the compilation cache on; returns (process id, processes, backend, precision, mesh)."""
    import jax

    from ope_cli import runtime

    runtime.enable_x64()
    process_id, num_processes = 0, 1
    if distributed is not None and distributed.enabled:
        process_id, num_processes = initialize(distributed)
    from ope_cli.kernel import local_mesh

    runtime.enable_compilation_cache()
    backend = jax.default_backend()
    precision = config.precision or ("float64" if backend == "cpu" else "float32")
    return process_id, num_processes, backend, precision, local_mesh(config.devices)


def _check_some_episodes(config: EvaluationConfig, counts: Counters) -> None:
    """A DataError when no episode is left to estimate from."""
    dropped = dropped_by_reason(counts.dropped)
    if counts.episodes == 0 and dropped:
        reasons = ", ".join(f"{reason}: {c['episodes']}" for reason, c in dropped.items())
        raise DataError(
            f"{config.data}: no episodes left: --on-invalid drop dropped every episode "
            f"as invalid ({reasons})"
        )
    if counts.episodes == 0:
        raise DataError(f"{config.data}: no episodes (the data has no rows)")


def _policy_results(
    config: EvaluationConfig, plan: IntervalPlan, batches: BatchStream, local: _LocalPass
) -> list[PolicyResult]:
    """Each policy's estimates, diagnostics and profile from its accumulator."""
    discrete = batches.schema.action_kind == "discrete"
    max_length = local.counters.max_length
    reported = reported_estimators(config)
    qs = batches.qs or [None] * len(batches.policies)
    results = []
    for policy, q, accumulator in zip(batches.policies, qs, local.accumulators, strict=True):
        estimates, diagnostics = finalize(
            accumulator,
            config.gamma,
            max_length,
            config.confidence,
            plan.method,
            plan.betting_range,
            computed_estimators(batches),
        )
        results.append(
            PolicyResult(
                policy=policy.name,
                estimates={name: estimates[name] for name in reported},
                diagnostics=diagnostics,
                profile=profile(accumulator, config.gamma, max_length),
                actions_checked=policy.actions_checked or not discrete,
                q=None if q is None else q_source(q),
            )
        )
    return results


def computed_estimators(batches: BatchStream) -> tuple[str, ...]:
    """Every registered estimator that the stream's inputs allow (with Q-hat: dm, dr, wdr)."""
    return available_estimators(Q_FIELDS if batches.qs is not None else ())


def _check_behavior_support(batches: BatchStream, output) -> None:
    """A DataError when the ``--behavior`` policy gave a logged action of this batch
    probability 0 (``output``: a KernelOutput); its episode is found by a second read."""
    if output.zero_behavior is None:
        return
    import jax

    found = jax.device_get(output.zero_behavior)  # one per window, each [D]
    first = first_zero_probability(jax.tree.map(lambda *x: np.concatenate(x), *found))
    if first is not None:
        raise zero_probability_error(batches.behavior, first, batches.reread_chunks())


def _announce_shape(batches: BatchStream, seen: set, batch, width: int, kernels, on_status):
    """Whether the batch's window shape was not ``seen`` before (then reported to
    ``on_status``: its kernels load, kept on disk, or compile in the next call)."""
    shape = (batch.shape[0], width)
    new = on_status is not None and shape not in seen
    seen.add(shape)
    if new:
        catalogue = len(batches.bucketer.window_shapes)
        which = f"window shape {len(seen)} of at most {catalogue}, [{shape[0]}, {shape[1]}]"
        if all(kernel.is_kept(batch, *shape) for kernel in kernels):
            on_status(f"loading the compiled kernel for {which} ...")
        else:
            on_status(f"compiling the kernel for {which} ...")
    return new


def _kernels(batches: BatchStream, dtype, mesh, replicates: int) -> list:
    """One Kernel per group of stackable policies, every one with the catalogue's largest
    lane count as its carry's (one finish kernel for every window shape)."""
    from ope_cli.kernel import Kernel, group_policies

    config, plan = batches.config, batches.plan
    return [
        Kernel(
            group,
            config.gamma,
            RESAMPLING_GROUPS,
            dtype,
            mesh,
            replicates,
            config.seed,
            plan.betting_range,
            behavior=batches.behavior,
            v_samples=config.v_samples,
            carry_lanes=max(shape.lanes for shape in batches.bucketer.window_shapes),
        )
        for group in group_policies(batches.policies, batches.qs)
    ]


def _local_pass(batches: BatchStream, precision: str, mesh, on_status=None) -> _LocalPass:
    """Consumes this process's stream once and accumulates every policy's statistics.

    Batches are dispatched up to MAX_BATCHES_IN_FLIGHT ahead, so host work overlaps the
    kernel. Per bucket length T, per policy, the batches of that length are merged first:
    merging like with like needs no lengthening to the longest bucket (cheap [K, T]
    arrays); the lengths are merged into the totals once, at the end."""
    import jax

    from ope_cli.kernel import assemble

    config, plan, policies = batches.config, batches.plan, batches.policies
    dtype = np.float64 if precision == "float64" else np.float32
    devices = 1 if mesh is None else mesh.size
    replicates = config.bootstrap_samples if plan.method in ("percentile", "bootstrap-t") else 0
    kernels = _kernels(batches, dtype, mesh, replicates)
    computed = computed_estimators(batches)

    def no_episodes() -> list[Accumulator]:  # one per policy
        betting = plan.betting_range is not None
        return [init(RESAMPLING_GROUPS, replicates, betting, computed) for _ in policies]

    # per bucket length, per kernel: its P policies' statistics stacked ([P, ...] leaves)
    by_length: dict[int, list[Accumulator | None]] = {}
    in_flight: collections.deque = collections.deque()

    def absorb(pending) -> None:
        length, results = pending
        partials = by_length.setdefault(length, [None] * len(kernels))
        _check_behavior_support(batches, results[0][1])
        for position, (_, output) in enumerate(results):
            host = assemble(jax.device_get(output))  # [D, P, ...]: per device, per policy
            partials[position] = _merge_devices(partials[position], host, devices)

    shapes_seen: set[tuple[int, int]] = set()
    last_batch = None
    stream_of_batches = iter(batches)
    with contextlib.closing(stream_of_batches):  # an error below stops the reading at once
        for batch in stream_of_batches:
            width = batches.bucketer.width_of(batch)
            new_shape = _announce_shape(batches, shapes_seen, batch, width, kernels, on_status)
            in_flight.append((batch.shape[1], [(k, k(batch, width)) for k in kernels]))
            last_batch = batch
            if new_shape:
                on_status("evaluating")
            if len(in_flight) > MAX_BATCHES_IN_FLIGHT:
                absorb(in_flight.popleft())
    while in_flight:
        absorb(in_flight.popleft())
    for kernel in kernels if last_batch is not None else ():  # the shapes the next data may
        kernel.compile_catalogue(last_batch, batches.bucketer.window_shapes)  # need, kept
    totals = no_episodes()
    for position, kernel in enumerate(kernels):
        stacked = None
        for length in sorted(by_length):
            stacked = _merged(stacked, by_length[length][position])
        for index, total in zip(kernel.group.indices, _unstacked(stacked), strict=False):
            totals[index] = merge(totals[index], total)
    return _LocalPass(totals, batches.counters, batches.seen_keys(), set(batches.shapes))


MERGE_POLICIES = 16  # stacked policies merged at a time: bounds the merge's temporaries


def _merged(a: Accumulator | None, b: Accumulator) -> Accumulator:
    """``merge`` of stacked accumulators ([P, ...] leaves), None standing for no episodes
    yet; MERGE_POLICIES policies at a time, so that its temporaries (rescaled copies of
    [P, K, T] per-step sums) stay small whatever P."""
    import jax

    if a is None:
        return b
    policies = a.log_weight_histogram.shape[0]
    out = None
    for low in range(0, policies, MERGE_POLICIES):
        rows = operator.itemgetter(slice(low, low + MERGE_POLICIES))
        part = merge(jax.tree.map(rows, a), jax.tree.map(rows, b))
        if low == 0 and policies <= MERGE_POLICIES:
            return part
        if out is None:
            out = jax.tree.map(_rows_for(policies), part)
        jax.tree.map(functools.partial(_put_rows, low=low), out, part)
    return out


def _rows_for(policies: int):
    """An empty array of ``policies`` rows shaped and typed as a row of its argument's."""
    return lambda x: np.empty((policies, *x.shape[1:]), x.dtype)


def _put_rows(whole: np.ndarray, rows: np.ndarray, low: int) -> None:
    """Writes ``rows`` into ``whole`` from row ``low`` on."""
    whole[low : low + rows.shape[0]] = rows


def _merge_devices(partial: Accumulator | None, host, devices: int) -> Accumulator:
    """``partial`` (stacked over a kernel's P policies, or None) merged with a batch's
    host BatchStatistics [D, P, ...], device after device: every policy at once, the
    same arithmetic as one merge per policy."""
    import jax

    for device in range(devices):
        one = jax.tree.map(operator.itemgetter(device), host)
        partial = _merged(partial, from_batch(one))
    return partial


def _unstacked(stacked: Accumulator | None) -> list[Accumulator]:
    """Each policy's accumulator of a stacked one ([] for a kernel that saw no batch)."""
    return [] if stacked is None else unstack(stacked)
