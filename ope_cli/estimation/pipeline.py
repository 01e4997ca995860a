"""The one loop over the data: files -> record batches -> episodes -> buckets ->
padded batches -> kernel -> batch statistics -> merged accumulators -> result."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import math
import operator
import time
from collections.abc import Callable, Iterator
from typing import NamedTuple

import numpy as np

from ope_cli.choosing import paired
from ope_cli.choosing.comparison import (
    Pairing,
    baseline_name,
    compare_results,
    interval_methods,
    read_run_truth,
    resolve_baseline,
    selection_of,
    truth_keys,
)
from ope_cli.choosing.paired import PairedSums
from ope_cli.choosing.selection import BASELINE_BEHAVIOR, check_truth_horizon
from ope_cli.config import ChoosingConfig, EvaluationConfig
from ope_cli.data.buckets import Bucketer, PaddedBatch
from ope_cli.data.episodes import EpisodeChunk
from ope_cli.data.ids import RESAMPLING_GROUPS, SeenKeys
from ope_cli.data.sources import prefetched
from ope_cli.data.validate import REASONS, dropped_by_reason
from ope_cli.errors import NO_EPISODES, DataError, OpeError
from ope_cli.estimation.distributed import (
    DistributedConfig,
    allgather_ragged,
    check_all_succeeded,
    check_disjoint_episodes,
    check_same_options,
    initialize,
    reduce_accumulators,
    reduce_counters,
    reduce_paired,
)
from ope_cli.estimation.estimators import available as available_estimators
from ope_cli.estimation.estimators import get as get_estimator
from ope_cli.estimation.estimators.base import (
    Context,
    StepSum,
    describe_standard_errors,
    sums_of,
)
from ope_cli.estimation.estimators.doubly_robust import Q_FIELDS
from ope_cli.estimation.inputs import (
    COMPARE_LOGGED,
    EvaluationInputs,
    check_before_jax,
    fit_models,
    open_inputs,
    pass_status,
)
from ope_cli.estimation.intervals import BOOTSTRAP_METHODS
from ope_cli.estimation.replicate_memory import check_replicate_memory
from ope_cli.estimation.run_plan import (
    IntervalPlan,
    annotate_results,
    check_config,
    reported_estimators,
)
from ope_cli.estimation.stats import (
    Accumulator,
    Estimate,
    finalize,
    from_batch,
    init,
    mean_return,
    merge,
    profile,
    unstack,
    weightless,
)
from ope_cli.models.behavior import (
    BehaviorSource,
    check_behavior_against_chunk,
    first_zero_probability,
    zero_probability_error,
)
from ope_cli.models.policies.checks import faulty_policy_error
from ope_cli.models.qfunctions import faulty_q_error, q_source
from ope_cli.results import (
    NO_MAGNITUDE,
    ConfidenceSummary,
    DatasetSummary,
    EvaluationResult,
    PolicyResult,
    RuntimeSummary,
)

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
    # decimal magnitudes (floor log10) of the largest |observation| and |reward|, of 1 / the
    # smallest non-zero |reward|, of the largest critic column value (--q-col, --v-col) and
    # |action|, the digits the rewards', returns' and observations' size stands above their
    # spread, and the rewards' size above the returns' spread: what float32 must hold
    # (``magnitudes``, report.warnings)
    magnitudes: np.ndarray = dataclasses.field(
        default_factory=lambda: np.full(MAGNITUDES, NO_MAGNITUDE, np.int64),
        metadata={"reduce": "max"},
    )


@dataclasses.dataclass
class _LocalPass:
    """What one process learned from its share of the data."""

    accumulators: list[Accumulator]
    counters: Counters = dataclasses.field(default_factory=Counters)
    seen: SeenKeys | None = None  # the episodes read, with their files
    shapes: set[tuple[int, int]] = dataclasses.field(default_factory=set)  # [B, T] emitted
    paired: PairedSums | None = None  # with two or more policies, or a baseline
    baseline: int = 0  # the row the paired sums' replicate differences are taken from
    truth: dict[str, float | None] | None = None  # --truth, read before the pass

    def reduce_across_processes(self) -> None:
        """Collective: every process ends with the totals of all of them."""
        check_disjoint_episodes(self.seen.all_keys(), self.seen.first_file)
        self.counters = reduce_counters(self.counters)
        self.accumulators = reduce_accumulators(self.accumulators)
        if self.paired is not None:
            self.paired = reduce_paired(self.paired, self.baseline)
        shapes = allgather_ragged(np.array(sorted(self.shapes), np.int64).reshape(-1, 2))
        self.shapes = {(int(b), int(t)) for b, t in shapes}


class BatchStream:
    """One process's share of the data as padded batches: ``for batch in stream`` reads the
    episodes once (read ahead on a thread) and yields the [B, T] PaddedBatch of each
    bucket as it fills, then the partly filled ones.

    What consumers need besides the batches is the ``inputs`` (also as ``config``,
    ``schema``, ``policies``, ``plan``, ``files``, ``behavior``, ``behavior_source`` and
    ``qs``); and, as the stream is consumed, ``counters`` (episodes, steps, rows, drops),
    ``shapes`` (the [B, T] shapes emitted) and ``seen_keys()``. ``magnitudes``: whether
    the counters measure what float32 must hold (``Counters.magnitudes``), which only a
    float32 run reads (on a float64 one, measuring it took a tenth of a warm run); else
    only the values' sizes (``value_magnitudes``).
    """

    def __init__(
        self,
        inputs: EvaluationInputs,
        multiple_of: int = 1,
        on_progress: Callable[[int, int | None], None] | None = None,
        magnitudes: bool = True,
    ):
        self.inputs = inputs
        self.magnitudes = magnitudes
        self.config, self.schema = inputs.config, inputs.episodes.schema
        self.policies, self.plan, self.files = inputs.policies, inputs.plan, inputs.files
        self.behavior, self.behavior_source = inputs.behavior, inputs.behavior_source
        self.qs = inputs.qs
        self.on_progress = on_progress
        self.counters = Counters()
        self.bucketer = Bucketer(inputs.config.batching, multiple_of=multiple_of)
        self.assembler = inputs.checked_episodes().assembler()

    @property
    def shapes(self) -> set[tuple[int, int]]:
        return self.bucketer.shapes

    def seen_keys(self) -> np.ndarray:
        """[E] sorted uint64 keys of the episodes read so far."""
        return self.assembler.seen_keys()

    def __iter__(self) -> Iterator[PaddedBatch]:
        counts, assembler, bucketer = self.counters, self.assembler, self.bucketer
        episodes = self.inputs.episodes
        total_rows = episodes.data.count_rows()
        if self.on_progress is not None:
            self.on_progress(0, total_rows)
        reading = prefetched(episodes.record_batches())
        with contextlib.closing(reading):  # a failure below stops the reading thread at once
            for chunk in assembler.chunks(reading):
                counts.episodes += chunk.num_episodes
                counts.steps += chunk.num_steps
                if chunk.lengths.max() > counts.max_length:
                    counts.max_length = int(chunk.lengths.max())
                    self._check_replicate_memory(counts.max_length)
                if self.behavior is not None:
                    check_behavior_against_chunk(self.behavior, chunk)
                measured = magnitudes(chunk) if self.magnitudes else value_magnitudes(chunk)
                np.maximum(counts.magnitudes, measured, out=counts.magnitudes)
                ready = bucketer.add(chunk)
                del chunk  # the pool frees it once its episodes are in batches
                yield from ready
                if self.on_progress is not None:
                    self.on_progress(assembler.rows_read, total_rows)
        yield from bucketer.flush()
        counts.rows_read = assembler.rows_read
        counts.padded_steps = bucketer.padded_steps
        counts.dropped = assembler.validation.dropped_counts()

    def _check_replicate_memory(self, longest: int) -> None:
        """A UsageError when the bootstrap replicates' per-step sums over an episode of
        ``longest`` steps would not fit in this machine's memory (``replicate_memory``)."""
        if self.plan.method not in BOOTSTRAP_METHODS:
            return
        step_sums = sum(isinstance(s, StepSum) for s in sums_of(computed_estimators(self)))
        replicates = self.config.intervals.bootstrap_samples
        check_replicate_memory(self.plan.method, longest, replicates, step_sums, len(self.policies))

    def reread_chunks(self) -> Iterator[EpisodeChunk]:
        """This process's episodes read again, on the host only (to locate an episode by
        its key on an error path)."""
        return iter(self.inputs.episodes)


def stream(
    config: EvaluationConfig,
    multiple_of: int = 1,
    on_progress: Callable[[int, int | None], None] | None = None,
    process: tuple[int, int] = (0, 1),
    on_status: Callable[[str], None] | None = None,
    precision: str = "float32",
    fitted_qs: list | None = None,
) -> BatchStream:
    """Opens the data of ``config`` (and its policies), fits what the run fits first, and
    returns one pass of padded batches, with episodes per batch a multiple of
    ``multiple_of`` (the devices they are sharded over). ``process`` = (process id, number
    of processes): this process reads its share of the files; ``precision``: the kernel's
    (a float32 run measures what float32 must hold); ``fitted_qs``: Q functions an earlier
    pass fitted for these policies, used rather than fitting them again. Raises OpeError
    subclasses (the data is read as the stream is iterated)."""
    collectives = (allgather_ragged, check_all_succeeded) if process[1] > 1 else None
    inputs = open_inputs(config, process)
    if fitted_qs is not None:
        inputs = dataclasses.replace(inputs, qs=fitted_qs)
    inputs = fit_models(inputs, collectives, on_status)
    return BatchStream(inputs, multiple_of, on_progress, magnitudes=precision == "float32")


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
    if distributed is None or not distributed.enabled:  # processes check after joining
        check_before_jax(config)
    process_id, num_processes, backend, precision, mesh = _join_runtime(config, distributed)
    if num_processes > 1:
        check_same_options(config, distributed)
    from ope_cli import runtime
    from ope_cli.estimation.kernel import trace_count  # after joining a cluster, as every JAX use

    traces_before, counts_before = trace_count(), runtime.compilation_counts()
    process = (process_id, num_processes)
    batches, local = _evaluate_share(config, precision, mesh, process, on_progress, on_status)
    compiled = runtime.compilation_counts() - counts_before
    config = batches.config  # with the discount resolved (plan.gamma_source says whence)
    counts = local.counters
    _check_some_episodes(config, counts)
    plan, reported = batches.plan, reported_estimators(config)
    reporters = (on_progress, on_status)
    chosen, behavior = _estimated(config, batches, local, (precision, mesh), reporters)
    return EvaluationResult(
        dataset=_dataset(config, batches, counts),
        gamma=config.gamma,
        gamma_source=plan.gamma_source,
        declared_gamma=plan.declared_gamma,
        estimators=reported,
        confidence=_confidence(config, plan, reported),
        results=chosen.results,
        behavior=behavior,
        runtime=_runtime(
            local,
            (process_id, num_processes, backend, precision, mesh),
            (trace_count() - traces_before, compiled),
            time.perf_counter() - started,
        ),
        baseline=baseline_name(config.choosing.baseline, batches.policies),
        behavior_value=None if local.paired is None else mean_return(local.accumulators[0]),
        truth=local.truth,
        selection=chosen.selection,
        selection_notes=tuple(chosen.selection_notes),
        best_set_notes=tuple(chosen.best_set_notes),
    )


def _estimated(
    config, batches: BatchStream, local: _LocalPass, devices: tuple, reporters=(None, None)
) -> tuple[_Chosen, BehaviorSource | None]:
    """(each policy's result with what choosing between them adds, the reported behavior
    policy) of the pass ``local``; ``devices``: (precision, mesh); ``reporters``:
    (on_progress, on_status)."""
    plan, (precision, _) = batches.plan, devices
    results = annotate_results(
        _policy_results(config, plan, batches, local, precision), batches.policies, plan, config
    )
    chosen = _choosing(config, batches, local, results, precision)
    behavior = _reported_behavior(
        batches, chosen.results, local.counters.episodes, *devices, *reporters
    )
    return chosen, behavior


def _runtime(local: _LocalPass, joined: tuple, compiled: tuple, seconds: float) -> RuntimeSummary:
    """The run's RuntimeSummary: ``joined``: ``_join_runtime``'s (process id, processes,
    backend, precision, mesh); ``compiled``: (kernel traces, the runtime's compilation
    counts) of the run."""
    process_id, num_processes, backend, precision, mesh = joined
    compiles, counts = compiled
    return RuntimeSummary(
        seconds=seconds,
        backend=backend,
        devices=1 if mesh is None else mesh.size,
        processes=num_processes,
        process_id=process_id,
        precision=precision,
        padded_steps=local.counters.padded_steps,
        batch_shapes=sorted(local.shapes),
        compiles=compiles,
        compilations=counts.compilations,
        compile_seconds=counts.seconds,
        cache_hits=counts.cache_hits,
    )


CRITIC_MAGNITUDE = 3  # Counters.magnitudes' entry of the critic's largest |Q-hat| or |V-hat|


def decimal_magnitude(value: float) -> int:
    """floor log10 of ``value`` (> 0, finite), else NO_MAGNITUDE."""
    return int(math.floor(math.log10(value))) if 0 < value < math.inf else NO_MAGNITUDE


MAGNITUDES = 9  # the entries of Counters.magnitudes


FLOAT64_MAGNITUDES = 4  # Counters.magnitudes' entries a float64 run measures too


def _size(values: np.ndarray) -> float:
    """The largest |value|, without an array of them."""
    return float(max(values.max(), -values.min())) if values.size else 0.0


def _largest(values: np.ndarray) -> int:
    return decimal_magnitude(_size(values))


def value_magnitudes(chunk) -> np.ndarray:
    """[MAGNITUDES] Counters.magnitudes of one chunk that a float64 run measures (what
    reaches float64's edges, ``float64_range``): the largest |reward|, 1 / the smallest
    non-zero |reward| and the critic columns' largest |value|; NO_MAGNITUDE elsewhere."""
    reward = chunk.reward
    smallest = np.min(np.abs(reward), where=reward != 0, initial=math.inf)
    columns = (getattr(chunk, name, None) for name in ("q_value", "v_value"))
    critic = [_largest(values) for values in columns if values is not None]
    found = np.full(MAGNITUDES, NO_MAGNITUDE, np.int64)
    found[1:FLOAT64_MAGNITUDES] = (
        _largest(reward),
        -decimal_magnitude(float(smallest)) if smallest < math.inf else NO_MAGNITUDE,
        max(critic, default=NO_MAGNITUDE),
    )
    return found


def magnitudes(chunk) -> np.ndarray:
    """[MAGNITUDES] Counters.magnitudes of one chunk: floor log10 of its largest
    |observation| (float observations only: integers index states) and |reward|, -floor
    log10 of its smallest non-zero |reward|, floor log10 of its largest critic |Q-hat| or
    |V-hat| (columns; the pass adds a Q source's, ``_note_q_sizes``) and of its largest
    |action| (continuous actions only), the digits its rewards', its undiscounted episode
    returns' and its (float) observations' size stands above their spread
    (``lost_digits``), and the digits its rewards' size stands above its returns' spread
    (rewards of +-1000 whose returns cancel to 0.0025 +- 3e-4: float32 rounds each reward
    by 6e-5, and WPDIS came out 2.8% off, without a word)."""

    observation, reward, action = chunk.observation, chunk.reward, chunk.action
    floats = observation is not None and observation.dtype.kind == "f"
    with np.errstate(over="ignore", invalid="ignore"):  # returns past float64: not finite
        returns = np.add.reduceat(reward, chunk.offsets[:-1]) if reward.size else reward
    reward_size = _size(reward)
    values = value_magnitudes(chunk)
    return np.array(
        [
            _largest(observation) if floats else NO_MAGNITUDE,
            *values[1:FLOAT64_MAGNITUDES],
            _largest(action) if action is not None and action.dtype.kind == "f" else NO_MAGNITUDE,
            lost_digits(reward),
            lost_digits(returns),
            lost_digits(observation) if floats else NO_MAGNITUDE,
            lost_digits(returns, reward_size, int(np.diff(chunk.offsets).max())),
        ],
        np.int64,
    )


SPREAD_VALUES = 30  # the fewest values whose standard deviation says their spread
SPREAD_BLOCK = 32768  # values whose float64 copy the spread of [N, d] values takes at a time
SPREAD_ROWS = 16  # and the fewest rows (wide observations: a loop over rows is slow)
# a standard deviation within this many float64 roundings of the values' size is rounding
# (a constant 0.1 column's came out 1e-17, and warned of a spread 1e-13 of its size)
SPREAD_ROUNDINGS = 16


def lost_digits(values: np.ndarray, size: float | None = None, terms: int = 1) -> int:
    """floor log10 of the largest |value| (or of ``size``: that of the at most ``terms``
    terms each value was summed from) over the values' standard deviation: the digits a
    sum must keep before their differences show (a chunk at a time, so that one outlier
    elsewhere does not hide a constant offset); of [N, ...] values, the most of any
    feature's. NO_MAGNITUDE for fewer than SPREAD_VALUES values (two close returns of a
    chunk of two episodes said 1e-6), values all equal to float64's rounding (nothing to
    resolve; of ``terms`` roundings: 10,000 rewards that cancel exactly left returns 1e-14
    of their size apart) or not finite."""
    if values.shape[0] < SPREAD_VALUES:
        return NO_MAGNITUDE
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        largest, spread = _size_and_spread(values.reshape(values.shape[0], -1))
        size = largest if size is None else np.maximum(largest, size)
        ratio = size / spread
    rounding = SPREAD_ROUNDINGS * np.finfo(np.float64).eps * size * terms
    resolved = (spread > rounding) & (spread < math.inf) & (size < math.inf)
    if not resolved.any():
        return NO_MAGNITUDE
    return int(math.floor(math.log10(float(np.max(ratio[resolved])))))


def _size_and_spread(features: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """([d] largest |value|, [d] standard deviation) of each column of [N, d] ``features``,
    in float64, over blocks of SPREAD_BLOCK values, SPREAD_ROWS rows at least (a float64
    copy of a whole chunk of wide float32 observations doubled its memory), shifted by
    the first row so that an offset far above the spread does not cancel it. Each block
    is transposed first: NumPy reduces a row-major [N, 8] array along its rows six times
    slower than its [8, N] copy along the columns (a fifth of a warm run over 5M steps
    went there)."""
    shift = features[0].astype(np.float64)[:, None]
    largest = np.zeros(features.shape[1])
    total = np.zeros(features.shape[1])
    squares = np.zeros(features.shape[1])
    rows = max(SPREAD_ROWS, SPREAD_BLOCK // max(1, features.shape[1]))
    for start in range(0, features.shape[0], rows):
        block_dn = np.ascontiguousarray(features[start : start + rows].T)
        size = np.maximum(block_dn.max(axis=1), -block_dn.min(axis=1)).astype(np.float64)
        np.maximum(largest, size, out=largest)
        shifted = np.subtract(block_dn, shift, dtype=np.float64)
        total += shifted.sum(axis=1)
        squares += np.einsum("ij,ij->i", shifted, shifted)
    mean = total / features.shape[0]
    return largest, np.sqrt(np.maximum(squares / features.shape[0] - mean * mean, 0.0))


def _dataset(config: EvaluationConfig, batches: BatchStream, counts) -> DatasetSummary:
    """What the pass read and dropped (``counts``: its counters)."""
    return DatasetSummary(
        source=config.data,
        layout=batches.schema.layout,
        schema=batches.schema,
        files=batches.files,
        episodes=counts.episodes,
        steps=counts.steps,
        rows_read=counts.rows_read,
        max_length=counts.max_length,
        on_invalid=config.on_invalid,
        episodes_dropped=int(counts.dropped[:, 0].sum()),
        steps_dropped=int(counts.dropped[:, 1].sum()),
        dropped=dropped_by_reason(counts.dropped),
        magnitudes=tuple(int(m) for m in counts.magnitudes),
    )


class _Chosen(NamedTuple):
    """What choosing between the policies adds to their results (``_choosing``)."""

    results: list[PolicyResult]  # with their paired comparisons and could-be-best flags
    selection: dict | None  # the selection metrics against --truth
    selection_notes: list[tuple[str | None, str]]  # (the policy, or None: the run; note)
    best_set_notes: list[str]  # sets that may be too large (``compare_results``)


def _choosing(config, batches: BatchStream, local: _LocalPass, results, precision) -> _Chosen:
    """The policies' results with what choosing between them adds (``precision``: the
    kernel's arithmetic, which the differences are resolved to)."""
    plan, truth = batches.plan, local.truth
    row = resolve_baseline(config.choosing.baseline, batches.policies)
    if local.paired is not None:
        pairing = Pairing(
            local.accumulators,
            results,
            local.paired,
            Context(config.gamma, local.counters.max_length, precision),
            interval_methods(list(results[0].estimates), plan.method, config.intervals.method),
            plan.betting_range,
            row,
            precision,
        )
        results, unresolved = compare_results(results, pairing, config.intervals.confidence)
    else:
        unresolved = []
    if truth is None:
        return _Chosen(results, None, [], unresolved)
    declared = batches.inputs.episodes.data.declared_bounds().horizon
    bounds = ((config.intervals.horizon, True), (declared, False))  # (bound, by option)
    for bound, by_option in [b for b in bounds if b[0] is not None] or [(None, False)]:
        # each: a --horizon looser than the data's declared cut hid that cut
        check_truth_horizon(config.choosing.truth, bound, local.counters.max_length, by_option)
    keys = truth_keys(batches.policies)
    baseline_key = keys[row] if row is not None and row < len(keys) else BASELINE_BEHAVIOR
    selection, notes = selection_of(results, truth, keys, baseline_key, config.choosing.top_k)
    return _Chosen(results, selection, notes, unresolved)


def _evaluate_share(
    config: EvaluationConfig,
    precision: str,
    mesh,
    process: tuple[int, int] = (0, 1),
    on_progress: Callable[[int, int | None], None] | None = None,
    on_status: Callable[[str], None] | None = None,
    fitted_qs: list | None = None,
) -> tuple[BatchStream, _LocalPass]:
    """This process's stream (the data opened, its models fitted, or its Q functions the
    ``fitted_qs`` of an earlier pass) and its one evaluation pass; in a multi-process run
    (``process`` = (id, count)), reduced across every process, where a failure in one
    stops them all."""
    devices = 1 if mesh is None else mesh.size
    error: OpeError | None = None
    try:
        batches = stream(config, devices, on_progress, process, on_status, precision, fitted_qs)
        baseline = resolve_baseline(config.choosing.baseline, batches.policies)
        truth = read_run_truth(
            config.choosing.truth, config.choosing.top_k, batches.policies
        )  # before the pass
        local = _local_pass(batches, precision, mesh, on_status, baseline)
        local.truth = truth
    except OpeError as failure:
        if process[1] == 1:
            raise
        error = failure
    if process[1] > 1:
        check_all_succeeded(error)
        local.reduce_across_processes()
    return batches, local


def _reported_behavior(
    batches: BatchStream,
    results: list[PolicyResult],
    episodes: int,
    precision: str,
    mesh,
    on_progress: Callable[[int, int | None], None] | None = None,
    on_status: Callable[[str], None] | None = None,
) -> BehaviorSource | None:
    """Where pi_b came from; for a model estimated on data that also logs propensities,
    with each policy's mean weight and largest gap between estimates under both
    (``with_logged_comparison``), from a second evaluation composed as the
    first with the data's column as the behavior (in this process, over all the files).
    That comparison needs the run's ``episodes`` (all processes'), no fewer: where the
    column is invalid in some, it is left out with a note (the estimate never reads it)."""
    behavior = batches.behavior_source
    if behavior is None or behavior.fit is None or behavior.fit.logged_column is None:
        return behavior
    from ope_cli.models.behavior_models.fitting import (
        with_logged_comparison,
        without_logged_mean_weights,
    )

    config = batches.config
    logged_config = dataclasses.replace(
        config,
        behavior=dataclasses.replace(config.behavior, policy=None, cross_fit=1),
        choosing=ChoosingConfig(),
        on_invalid="drop",
    )
    if on_status is not None and COMPARE_LOGGED in batches.inputs.passes:  # counted from the start
        on_status(pass_status(batches.inputs.passes, COMPARE_LOGGED))
    try:
        # its rows counted from 0 again (the display showed every row read throughout); the
        # policies' Q-hat as fitted (fitting --q fit again took a silent pass per policy),
        # and its kernels' compilations said as the first pass's are
        logged, local = _evaluate_share(
            logged_config,
            precision,
            mesh,
            on_progress=on_progress,
            on_status=on_status,
            fitted_qs=batches.inputs.qs,
        )
    except DataError as error:
        return without_logged_mean_weights(behavior, f"the logged column cannot be read: {error}")
    left_out = episodes - local.counters.episodes
    if left_out:
        return without_logged_mean_weights(
            behavior,
            f"the logged column {behavior.fit.logged_column!r} is invalid in {left_out:,} of "
            f"the {episodes:,} episodes",
        )
    logged_results = _policy_results(logged.config, logged.plan, logged, local, precision)
    return with_logged_comparison(behavior, results, logged_results)


def _join_runtime(config: EvaluationConfig, distributed: DistributedConfig | None):
    """Configures JAX (also without the command line), joins a multi-process run, turns
    the compilation cache on; returns (process id, processes, backend, precision, mesh)."""
    import jax

    from ope_cli import runtime

    runtime.enable_x64()
    process_id, num_processes = 0, 1
    if distributed is not None and distributed.enabled:
        process_id, num_processes = initialize(distributed)
    from ope_cli.estimation.kernel import local_mesh

    runtime.enable_compilation_cache()
    backend = jax.default_backend()
    precision = config.runtime.precision or ("float64" if backend == "cpu" else "float32")
    return process_id, num_processes, backend, precision, local_mesh(config.runtime.devices)


def _confidence(config: EvaluationConfig, plan, reported: tuple[str, ...]) -> ConfidenceSummary:
    """How the run's intervals were made (the JSON document's "confidence" block)."""
    return ConfidenceSummary(
        level=config.intervals.confidence,
        interval=plan.method,
        method=f"{plan.describe(config)}; {describe_standard_errors(reported)}",
        reward_range=plan.reward_range,
        horizon=plan.horizon,
        replicates=drawn_replicates(config, plan),
    )


def drawn_replicates(config: EvaluationConfig, plan) -> int:
    """The bootstrap replicates a run draws: --bootstrap-samples under a bootstrap interval
    method (BOOTSTRAP_METHODS), else 0."""
    return config.intervals.bootstrap_samples if plan.method in BOOTSTRAP_METHODS else 0


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
        raise DataError(f"{config.data}: {NO_EPISODES}")


def _policy_results(
    config: EvaluationConfig,
    plan: IntervalPlan,
    batches: BatchStream,
    local: _LocalPass,
    precision: str,
) -> list[PolicyResult]:
    """Each policy's estimates, diagnostics and profile from its accumulator (``precision``:
    the kernel's arithmetic, which rounded the per-episode terms)."""
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
            config.intervals.confidence,
            plan.method,
            plan.betting_range,
            computed_estimators(batches),
            precision,
        )
        without_weight = weightless(accumulator, reported)
        results.append(
            PolicyResult(
                policy=policy.name,
                estimates={
                    name: _weightless(estimates[name])
                    if name in without_weight
                    else estimates[name]
                    for name in reported
                },
                diagnostics=diagnostics,
                profile=profile(accumulator, config.gamma, max_length),
                actions_checked=policy.actions_checked or not discrete,
                q=None if q is None else q_source(q),
                weightless=without_weight,
            )
        )
    return results


WEIGHTLESS = (
    "every weight is zero: these logs say nothing about this policy (0 is the formula's "
    "value, not an estimate of the policy's)"
)


def _weightless(estimate: Estimate) -> Estimate:
    """The estimate of an estimator whose every weight is zero (``stats.weightless``): IS's
    0 +- 0 had the interval [0, 0] and no note, a certainty the logs do not hold. Its
    interval is null, and the note says why (a null value, WIS's, has its own note)."""
    if estimate.value is None:
        return estimate
    return dataclasses.replace(estimate, ci_low=None, ci_high=None, note=WEIGHTLESS)


def computed_estimators(batches: BatchStream) -> tuple[str, ...]:
    """Every registered estimator that the stream's inputs allow (with Q-hat: dm, dr, wdr)."""
    return available_estimators(Q_FIELDS if batches.qs is not None else ())


def _check_policy_values(batches: BatchStream, found_faults) -> None:
    """A PolicyError when an evaluation policy gave a logged action of this batch a value
    that is no log-probability, or its Q function a NaN or infinite Q-hat or V-hat
    (``found_faults``: each kernel of the batch with its windows' Faults, on the host)."""
    for kernel, faults in found_faults:
        if (first := _first_fault([found.policy for found in faults])) is not None:
            row, count = first  # the second read only on this error path
            policy = batches.policies[kernel.group.indices[row]]
            raise faulty_policy_error(policy, count, batches.reread_chunks())
        if (first := _first_fault([found.q for found in faults])) is not None:
            row, count = first
            raise faulty_q_error(kernel.group.qs[row], count)


def _read_faults(batches: BatchStream, results) -> None:
    """What a batch's windows found in user-supplied values (``results``: its (kernel,
    KernelOutput) pairs), brought to the host once: an error where the behavior or an
    evaluation policy or a Q function gave a value that is none, else the largest Q-hat
    noted."""
    from ope_cli.estimation.kernel import host_arrays

    _check_behavior_support(batches, results[0][1])
    found_faults = [(kernel, host_arrays(output.faults)) for kernel, output in results]
    _check_policy_values(batches, found_faults)
    _note_q_sizes(batches.counters, found_faults)


def _note_q_sizes(counters: Counters, found_faults) -> None:
    """Adds the largest |Q-hat| or |V-hat| of a batch's windows (``found_faults``: each
    kernel with its windows' Faults, on the host) to the critic's magnitude
    (``Counters.magnitudes``): float32 must hold a Q checkpoint's or fit's values as it
    must hold critic columns."""
    for _, faults in found_faults:
        sizes = [float(np.max(found.q_size)) for found in faults]
        magnitude = decimal_magnitude(max(sizes, default=0.0))
        counters.magnitudes[CRITIC_MAGNITUDE] = max(
            counters.magnitudes[CRITIC_MAGNITUDE], magnitude
        )


def _first_fault(windows: list[np.ndarray]) -> tuple[int, int] | None:
    """(policy row, steps) of the first policy of a group with faulty steps in a batch's
    windows ([1, P] or [D, P] counts each), or None."""
    counts = np.concatenate(windows).sum(axis=0)  # [P]
    if not counts.any():
        return None
    row = int(np.flatnonzero(counts)[0])
    return row, int(counts[row])


def _check_behavior_support(batches: BatchStream, output) -> None:
    """A DataError when the ``--behavior`` policy gave a logged action of this batch
    probability 0 (``output``: a KernelOutput); its episode is found by a second read."""
    if output.zero_behavior is None:
        return
    import jax

    from ope_cli.estimation.kernel import host_arrays

    found = host_arrays(output.zero_behavior)  # one per window, each [D]
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
        paths = [kernel.kept_path(batch, *shape) for kernel in kernels]
        if all(path is not None and path.is_file() for path in paths):
            on_status(f"loading the compiled kernel for {which} ...")
        elif all(path is not None for path in paths):
            on_status(f"compiling the kernel for {which} ...")
        else:  # user code or a fitted model: traced every run, compiled or found cached
            on_status(f"tracing the kernel for {which} (compiled unless cached) ...")
    return new


def _kernels(batches: BatchStream, dtype, mesh, replicates: int, terms: bool) -> list:
    """One Kernel per group of stackable policies, every one with the catalogue's largest
    lane count as its carry's (one finish kernel for every window shape); with ``terms``
    they return each episode's terms for the paired sums."""
    from ope_cli.estimation.estimators.reduction import betting_inputs
    from ope_cli.estimation.kernel import Kernel, KernelSettings, group_policies

    config, plan = batches.config, batches.plan
    settings = KernelSettings(
        config.gamma,
        RESAMPLING_GROUPS,
        dtype,
        mesh,
        replicates,
        config.intervals.seed,
        betting_inputs(plan.betting_range, plan.horizon, config.gamma),
        v_samples=config.q.v_samples,
    )
    return [
        Kernel(
            group,
            settings,
            behavior=batches.behavior,
            carry_lanes=max(shape.lanes for shape in batches.bucketer.window_shapes),
            terms=terms,
        )
        for group in group_policies(batches.policies, batches.qs)
    ]


def _merge_batch(partials: list[Partial | None], results, devices: int) -> None:
    """Merges one batch's (kernel, KernelOutput) pairs into each kernel's partial (its P
    policies in parts, ``Partial``; None before its first batch)."""
    from ope_cli.estimation.kernel import assemble, host_arrays

    for position, (_, output) in enumerate(results):
        host = assemble(host_arrays(output))  # [D, P, ...]: per device, per policy
        partials[position] = _merge_devices(partials[position], host, devices)


def _paired_batch(results, baseline: int) -> PairedSums:
    """The paired sums of one batch from its (kernel, KernelOutput) pairs, every policy's."""
    from ope_cli.estimation.kernel import host_arrays

    groups = [(kernel.group.indices, host_arrays(out.terms)) for kernel, out in results]
    policies = sum(len(indices) for indices, _ in groups)
    mask, counts = results[0][1].lanes
    return paired.from_terms(paired.rows_of(groups, policies), mask, counts, baseline)


def _local_pass(
    batches: BatchStream, precision: str, mesh, on_status=None, baseline: int | None = None
) -> _LocalPass:
    """Consumes this process's stream once and accumulates every policy's statistics, and
    with two or more policies or a ``baseline`` row the paired sums (``paired``).

    Batches are dispatched up to MAX_BATCHES_IN_FLIGHT ahead, so host work overlaps the
    kernel. Per bucket length T, per policy, the batches of that length are merged first:
    merging like with like needs no lengthening to the longest bucket (cheap [K, T]
    arrays); the lengths are merged into the totals once, at the end."""
    config, plan, policies = batches.config, batches.plan, batches.policies
    dtype = np.float64 if precision == "float64" else np.float32
    devices = 1 if mesh is None else mesh.size
    replicates = drawn_replicates(config, plan)
    pairing = len(policies) > 1 or baseline is not None
    kernels = _kernels(batches, dtype, mesh, replicates, pairing)
    computed = computed_estimators(batches)
    terms = tuple(name for name in computed if get_estimator(name).term is not None)
    baseline_row = paired.differences_from(baseline)
    pairs = [paired.init(terms, len(policies), replicates)] if pairing else []

    def no_episodes() -> list[Accumulator]:  # one per policy
        betting = plan.betting_range is not None
        return [init(RESAMPLING_GROUPS, replicates, betting, computed) for _ in policies]

    # per bucket length, per kernel: its P policies' statistics, in parts (Partial)
    by_length: dict[int, list[Partial | None]] = {}
    in_flight: collections.deque = collections.deque()

    def absorb(pending) -> None:
        length, results = pending
        partials = by_length.setdefault(length, [None] * len(kernels))
        _read_faults(batches, results)
        _merge_batch(partials, results, devices)
        if pairs:
            pairs[0] = paired.merge(pairs[0], _paired_batch(results, baseline_row), baseline_row)

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
        kernel.compile_catalogue(last_batch, batches.bucketer.window_shapes, on_status)  # need
    totals = _totals(kernels, by_length, no_episodes())
    local = _LocalPass(totals, batches.counters, batches.assembler.seen, set(batches.shapes))
    if pairs:
        local.paired, local.baseline = pairs[0], baseline_row
    return local


def _totals(kernels, by_length: dict, totals: list[Accumulator]) -> list[Accumulator]:
    """Each policy's accumulator: its kernel's partials merged over the bucket lengths
    (shortest first), then split per policy into ``totals`` (init's, one each)."""
    for position, kernel in enumerate(kernels):
        partial = None
        for length in sorted(by_length):
            partial = _merged(partial, by_length[length][position])
        for index, total in zip(kernel.group.indices, _unstacked(partial), strict=False):
            totals[index] = merge(totals[index], total)
    return totals


MERGE_POLICIES = 16  # stacked policies merged at a time: bounds the merge's temporaries

# A kernel's partial: its P policies' accumulators stacked MERGE_POLICIES at a time (a list
# of accumulators with [<= MERGE_POLICIES, ...] leaves), so that a merge's temporaries
# (rescaled copies of [P, K, T] per-step sums) stay small whatever P, and no merge copies
# its parts back into one [P, ...] array (with 100 policies that copy took a tenth of a run).
Partial = list[Accumulator]


def _merged(a: Partial | None, b: Partial) -> Partial:
    """``merge`` of two partials, part by part; None stands for no episodes yet."""
    return b if a is None else [merge(x, y) for x, y in zip(a, b, strict=True)]


def _parts(stacked: Accumulator) -> Partial:
    """A stacked accumulator ([P, ...] leaves) as a partial: views of MERGE_POLICIES rows
    at a time."""
    import jax

    policies = stacked.log_weight_histogram.shape[0]
    return [
        jax.tree.map(operator.itemgetter(slice(low, low + MERGE_POLICIES)), stacked)
        for low in range(0, policies, MERGE_POLICIES)
    ]


def _merge_devices(partial: Partial | None, host, devices: int) -> Partial:
    """``partial`` (a kernel's P policies, or None) merged with a batch's host
    BatchStatistics [D, P, ...], device after device: every policy at once, the same
    arithmetic as one merge per policy."""
    import jax

    for device in range(devices):
        one = jax.tree.map(operator.itemgetter(device), host)
        partial = _merged(partial, _parts(from_batch(one)))
    return partial


def _unstacked(partial: Partial | None) -> list[Accumulator]:
    """Each policy's accumulator of a partial ([] for a kernel that saw no batch)."""
    return [] if partial is None else [one for part in partial for one in unstack(part)]
