"""The estimator record, its registry, and the vocabulary both sides of it share.

An estimator is written for ONE episode (the rlax habit) in the optax pattern: ``init``
makes its carry, ``advance(carry, window)`` walks the episode's next C steps (a ``Window``
of [C] arrays) and returns the new carry with per-step values, and ``finish(carry,
trajectory)`` turns the carry into per-episode values once the last window is walked. The
kernel vmaps them over the episodes of a batch and walks the time axis in fixed windows,
so no compiled shape depends on how long episodes are.

Each value is declared once, with its log-scaling kind: a ``Sum`` (a scalar per episode from
``finish``, summed per resampling group and bootstrap replicate) or a ``StepSum`` (a [C] row
from ``advance``, summed per group and step). Weights live in log space: a Sum's value is
relative to exp(power * s), s the episode's own log scale of its kind (``Scale``), and the
reducer rescales it to the batch's largest; a StepSum's value is relative to the episode's
own per-step weight (the kernel scales it per group and step). ``stats`` keeps each kind's
sums relative to the largest log scale seen so far (log-sum-exp), so products that over- or
underflow as plain numbers still combine exactly. ``finalize`` reads the merged sums by
name. This module imports no JAX: the registry is cheap to import.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Mapping
from typing import Any, Literal, NamedTuple

import numpy as np

Array = Any  # a JAX array under trace (per-episode side), a NumPy array (finalize side)


def jnp():
    """jax.numpy for ``advance`` and ``finish``, imported when a kernel traces them (importing the
    registry, e.g. for ``--help``, does not start JAX)."""
    import jax.numpy

    return jax.numpy


# Histogram of log10 trajectory weights: HISTOGRAM_BINS equal bins over HISTOGRAM_LOG10_RANGE,
# plus one bin below and one above; zero weights are counted in ``zero_count`` instead.
HISTOGRAM_LOG10_RANGE = (-10.0, 10.0)
HISTOGRAM_BINS = 80

# Betting intervals (``stats.betting_lower_bound``) need the law of four non-negative per-episode
# variables, normalised so that their means lie in [0, 1]; a histogram of their natural logs
# is a mergeable summary of it. Rows: BETTING_VARIABLES; column 0 counts values below the
# range (and zeros), column k >= 1 values in [exp(low + (k-1) width), exp(low + k width)), the
# last one also everything above. ``stats`` reads each bin as its lower edge, which never
# overstates a value, so the intervals stay valid.
BETTING_VARIABLES = ("trajectory_low", "trajectory_high", "decision_low", "decision_high")
BETTING_LOG_RANGE = (-32.0, 48.0)
BETTING_BIN_WIDTH = 1.0 / 128
BETTING_BINS = round((BETTING_LOG_RANGE[1] - BETTING_LOG_RANGE[0]) / BETTING_BIN_WIDTH)


class Trajectory(NamedTuple):
    """What the kernel carries for every episode from one window to the next, and what
    ``Estimator.finish`` and the scalar ``Scale``s read once the last window is walked.

    Attributes:
      log_w: [] log W of the last step walked (after the end: the final weight).
      log_peak: [] max_t log W_t over the steps walked (-inf before the first).
      return_: [] the discounted return sum_t gamma^t r_t of the steps walked.
      log_discounted_peak: [] max_t log(gamma^t W_t) over the steps walked (-inf before the
        first): the size of the per-decision terms, which W_t alone can exceed by far
        (W_t = 2^t with gamma = 1/2 overflows float64 while every gamma^t W_t is 1).
      steps: [] the number of steps walked, padding included.
    """

    log_w: Array
    log_peak: Array
    return_: Array
    log_discounted_peak: Array
    steps: Array


class Window(NamedTuple):
    """One episode's next C steps as an estimator's ``advance`` sees them (the kernel vmaps
    over episodes). Padding is absorbing: after the episode ends the log-ratio is 0 (log W_t
    stays at the final weight) and the reward is 0.

    Attributes:
      log_w_t: [C] cumulative log importance weights log W_t.
      log_w_prev_t: [C] log W_{t-1} (log W_{-1} = 0).
      reward_t: [C] rewards, 0 after the end.
      discount_t: [C] gamma^t, t counted from the episode's first step.
      log_discount_t: [C] t log(gamma) (0 at t = 0): finite where gamma^t underflows.
      step_mask_t: [C] True on the episode's own steps.
      first_t: [C] True at the episode's step 0.
      fields: per-step inputs beyond these ([C, ...]), by name (e.g. Q-hat and V-hat).
      before: the Trajectory before this window; after: the one after it.
    """

    log_w_t: Array
    log_w_prev_t: Array
    reward_t: Array
    discount_t: Array
    log_discount_t: Array
    step_mask_t: Array
    first_t: Array
    fields: Mapping[str, Array]
    before: Trajectory
    after: Trajectory


def safe_log_scale(log_scale: Array) -> Array:
    """The log scale to subtract: 0 where it is -inf (no weight yet), so exp never sees NaN."""
    np_ = jnp()
    return np_.where(np_.isfinite(log_scale), log_scale, 0.0)


def relative(log_x: Array, log_scale: Array) -> Array:
    """exp(log_x - log_scale): a weight relative to a scale (0 for a zero weight)."""
    return jnp().exp(log_x - safe_log_scale(log_scale))


def rescaled(value: Array, old_log_scale: Array, new_log_scale: Array) -> Array:
    """``value`` relative to exp(old) re-expressed relative to exp(new) (new >= old)."""
    np_ = jnp()
    factor = relative(old_log_scale, new_log_scale)
    return np_.where(old_log_scale == new_log_scale, value, value * factor)


@dataclasses.dataclass(frozen=True)
class Scale:
    """A log-scaling kind: the log of the weight that a family of values is relative to.

    ``log_scale`` reads a Trajectory and gives [] (a scalar kind: an episode's own scale;
    the reducer rescales every episode to the batch's largest, the running max), or, when
    ``per_step``, reads a Window and gives [C] (a scale per resampling group and step). A
    scalar kind may have a ``pivot(trajectory) -> []``, or name the ``finish()`` value that
    is an episode's pivot: the pivot of a batch is that of the episode with the largest log
    scale, and ``Sum.moments`` are centred on it.

    A scalar kind may instead be an estimator's own: ``own`` names the ``finish()`` value
    that is an episode's log scale (``log_scale`` None), one that its carry keeps.

    A scalar kind for one estimator's terms may name its ``magnitude``: the ``finish()``
    value t of the term itself, whose Sums on the kind are t (power 1) and t^2 (power 2).
    An episode's scale is then log_scale + log|t| (-inf for t = 0) and those values are
    sign(t) and 1: the batch's largest is that of its largest term, not of its largest
    weight. An episode of enormous weight and a zero term (no reward, say) set it
    otherwise, and every other term underflowed to 0 against it: IS printed 0.0 +- 0.0.
    """

    name: str
    log_scale: Callable[[Any], Array] | None
    per_step: bool = False
    pivot: Callable[[Trajectory], Array] | str | None = None
    magnitude: str | None = None
    own: str | None = None  # the finish() value that is an episode's log scale, if not read


def _final_log_weight(trajectory: Trajectory) -> Array:
    return trajectory.log_w


def _peak_log_weight(trajectory: Trajectory) -> Array:
    return trajectory.log_peak


def _step_log_weight(window: Window) -> Array:
    return window.log_w_t


def _return(trajectory: Trajectory) -> Array:
    return trajectory.return_


# The trajectory weight W_{T-1} (pivot: the return), an episode's largest per-decision weight
# max_t W_t, and the per-step weight W_t.
TRAJECTORY = Scale("trajectory", _final_log_weight, pivot=_return)
DECISION = Scale("decision", _peak_log_weight)
STEP = Scale("step", _step_log_weight, per_step=True)


@dataclasses.dataclass(frozen=True)
class Sum:
    """A mergeable scalar sum over episodes of ``finish()[name]``.

    The per-episode value v is relative to exp(power * s), s the episode's own log scale of
    ``scale`` (None: not scaled, e.g. counts); the reducer multiplies it by exp(power *
    (s - M)), M the batch's largest. E.g. for TRAJECTORY the per-episode value of W G is G.
    With ``moments = m`` the kernel sums v (x - c)^k for k = 0..m, where x is the scale's
    pivot of the episode and c the batch's pivot (shape [..., m + 1]): accumulating around a
    pivot keeps centred second moments accurate when one episode holds nearly all the weight;
    ``stats`` shifts the pivot when it merges.
    """

    name: str
    scale: Scale | None = None
    power: Literal[1, 2] = 1
    moments: int | None = None


@dataclasses.dataclass(frozen=True)
class StepSum:
    """A mergeable per-step sum over episodes of ``advance()[1][name]`` ([C] per window).

    Values are relative to exp(log_scale_t) of the per-step ``scale``. ``after_end`` says
    what the sum is at steps past the longest episode of a batch: "hold" repeats the last
    step (a weight relative to W_t, which stays at the final weight), "zero" (a reward).
    ``lag = 1``: the value that ``advance`` gives at step t belongs to step t - 1 and is
    relative to W_{t-1} (a term that looks one step ahead, such as gamma v_{t+1} W_t,
    emitted when step t + 1 is walked, so that no window needs the next one's inputs).
    """

    name: str
    scale: Scale = STEP
    after_end: Literal["hold", "zero"] = "hold"
    lag: Literal[0, 1] = 0

    def __post_init__(self):
        # a lag-1 value of an episode's last step looks past its end, where there is nothing
        # (``kernel.assemble`` leaves it 0 where no later window is kept)
        if self.lag and self.after_end != "zero":
            raise ValueError(f"step sum {self.name!r}: a lag-1 sum is 0 after the end")


class Point(NamedTuple):
    """A finalised value and standard error (None where undefined), with a note."""

    value: float | None
    stderr: float | None
    note: str | None = None


@dataclasses.dataclass(frozen=True)
class Context:
    """What finalisation knows beyond the sums."""

    gamma: float
    max_length: int  # longest episode; per-step sums are extended to it
    precision: str = "float64"  # the kernel's arithmetic, which rounded the terms

    @property
    def discount_t(self) -> np.ndarray:
        """[L] gamma^t (read-only), computed once per run: every leave-one-group-out value
        of the jackknife reads it (33 powers of a 1.8M-step episode's steps took 4.2 s),
        and so does each policy's and comparison's finalisation (each of its Contexts
        made its own: 1.4 s of a run over a 10M-step episode)."""
        return discounts(self.gamma, self.max_length)


@functools.lru_cache(maxsize=1)
def discounts(gamma: float, length: int) -> np.ndarray:
    """[length] gamma^t, read-only: ``Context.discount_t``, kept for the next Context."""
    discount_t = gamma ** np.arange(length, dtype=np.float64)
    discount_t.flags.writeable = False
    return discount_t


STEP_BLOCK_CELLS = 1 << 22  # cells of the temporaries of a block of per-step arithmetic


def sum_over_steps(
    terms: Callable[[Mapping[str, np.ndarray], np.ndarray], np.ndarray],
    step_sums: Mapping[str, np.ndarray],
    discount_t: np.ndarray,
) -> np.ndarray:
    """[...] the sum over steps of ``terms(step_sums, discount_t)`` ([..., L]), a block of
    steps at a time, so that its temporaries stay within STEP_BLOCK_CELLS cells: the
    bootstrap replicates' [R, L] arithmetic over a very long episode's steps."""
    first = next(iter(step_sums.values()))
    length = first.shape[-1]
    per_block = max(1, STEP_BLOCK_CELLS // max(1, int(np.prod(first.shape[:-1]))))
    if length <= per_block:
        return np.sum(terms(step_sums, discount_t), axis=-1)
    total = 0.0
    for start in range(0, length, per_block):
        block = {name: x[..., start : start + per_block] for name, x in step_sums.items()}
        total = total + np.sum(terms(block, discount_t[start : start + per_block]), axis=-1)
    return total


@dataclasses.dataclass(frozen=True)
class Sums:
    """Merged sums of a set of episodes, as ``finalize`` reads them (NumPy float64).

    Leading axes: none for the totals, [R] for the bootstrap replicates, [K] for groups.

    Attributes:
      sums: name -> [...] (or [..., m + 1] with moments), relative to
        exp(power * log_scales[scale.name]).
      log_scales: scalar scale name -> [] running max log scale.
      pivots: scalar scale name -> [] the pivot the moments are centred on.
      step_sums: name -> [..., L] relative to exp(step_log_scales[scale.name]).
      step_log_scales: per-step scale name -> [..., L] (broadcasts against step_sums).
    """

    sums: Mapping[str, np.ndarray]
    log_scales: Mapping[str, float]
    pivots: Mapping[str, float]
    step_sums: Mapping[str, np.ndarray]
    step_log_scales: Mapping[str, np.ndarray]


@dataclasses.dataclass(frozen=True)
class Grouped:
    """Merged sums of every episode, and per resampling group for estimators that resample
    groups (jackknife): ``groups`` are the non-empty groups, ``select(groups)`` combines
    some of them into Sums, and ``leave_one_out()`` gives Sums with a leading [G] axis,
    each row every group but one (None: select them one by one)."""

    totals: Sums
    groups: np.ndarray
    select: Callable[[np.ndarray], Sums]
    leave_one_out: Callable[[], Sums] | None = None


def no_carry(zero: Array) -> dict:
    """``init`` of an estimator that carries nothing between windows."""
    return {}


def no_step_values(carry: Any, window: Window) -> tuple[Any, dict]:
    """``advance`` of an estimator without per-step sums or a carry."""
    return carry, {}


def no_values(carry: Any, trajectory: Trajectory) -> dict:
    """``finish`` of an estimator without per-episode sums."""
    return {}


@dataclasses.dataclass(frozen=True)
class Estimator:
    """One estimator: what the kernel carries and sums per episode, and how the sums
    become estimates.

    Attributes:
      name: the ``--estimator`` value and JSON key.
      title: how tables and plots show it.
      stderr_method: the report's words for its standard error.
      sums: the mergeable sums it reads (``Sum`` or ``StepSum``), with their scaling kinds.
      finalize: ``finalize(grouped, context) -> Point``: the value and standard error.
      init: ``init(zero) -> carry``, a pytree of [] arrays made from ``zero`` (a [] of the
        kernel's dtype); written with arithmetic only (it also runs on NumPy scalars).
      advance: ``advance(carry, window) -> (carry, {StepSum name: [C]})`` for ONE episode,
        written with jax.numpy; vmapped by the kernel, called once per window.
      finish: ``finish(carry, trajectory) -> {Sum name: []}`` for ONE episode, each value
        relative to the episode's own log scale of its Sum's kind.
      replicates: ``replicates(sums, context) -> (values [R], stderrs [R] or None)`` of the
        bootstrap replicates (sums with a leading [R] axis); None: no bootstrap intervals.
      studentized: whether ``replicates`` gives standard errors, so that ``bootstrap-t`` is
        studentized (else it falls back to the percentile interval).
      betting: which betting variables bound it ("trajectory" or "decision"); None: none.
      needs: the ``Window.fields`` it reads (e.g. Q-hat and V-hat): it is computed and
        reported only in runs that provide them (``available``).
      term: the Sum whose per-episode value is this estimator's term when the estimate is
        their mean (is, pdis, dm, dr): paired differences between two policies are then the
        mean of per-episode differences (``paired``). None: a self-normalised ratio, whose
        paired differences are resampled by the grouped jackknife.
      tie_share: differences of two policies' estimates below this share of their size
        are float64 rounding, ties (ranks, ``--baseline``); None: the default, which
        allows for terms that round over every step of an episode (``choosing``).
    """

    name: str
    title: str
    stderr_method: str
    sums: tuple[Sum | StepSum, ...]
    finalize: Callable[[Grouped, Context], Point]
    init: Callable[[Array], Any] = no_carry
    advance: Callable[[Any, Window], tuple[Any, dict[str, Array]]] = no_step_values
    finish: Callable[[Any, Trajectory], dict[str, Array]] = no_values
    replicates: Callable[[Sums, Context], tuple[np.ndarray, np.ndarray | None]] | None = None
    studentized: bool = False
    betting: Literal["trajectory", "decision"] | None = None
    needs: tuple[str, ...] = ()
    term: str | None = None
    tie_share: float | None = None


# --- registry ------------------------------------------------------------------------------

_REGISTRY: dict[str, Estimator] = {}
_SUMS: dict[str, Sum | StepSum] = {}


def core_step_values(window: Window) -> dict[str, Array]:
    """Per-step weights (relative to W_t: 1) and rewards, for the diagnostics, the report's
    per-step profile and the weighted per-decision estimators."""
    return {"w_t": jnp().ones_like(window.reward_t), "wr_t": window.reward_t}


def core_values(trajectory: Trajectory) -> dict[str, Array]:
    """1 per episode, 1 for an episode whose trajectory weight is exactly 0, the trajectory
    weight W and W^2 (relative to itself: 1) for the diagnostics, and the discounted return
    G (the logging policy's own value is the mean of it: ``--baseline behavior``)."""
    np_ = jnp()
    one = np_.ones_like(trajectory.return_)
    zero = np_.where(trajectory.log_w == -np_.inf, 1.0, 0.0).astype(one.dtype)
    return {
        "count": one,
        "zero_count": zero,
        "sum_w": one,
        "sum_w2": one,
        "return_sum": trajectory.return_,
    }


# Sums every run needs (diagnostics, the report's per-step profile), whatever it estimates.
CORE_SUMS: tuple[Sum | StepSum, ...] = (
    Sum("count"),
    Sum("zero_count"),
    Sum("sum_w", TRAJECTORY),
    Sum("sum_w2", TRAJECTORY, power=2),
    Sum("return_sum"),
    StepSum("wr_t", STEP, after_end="zero"),
    StepSum("w_t", STEP, after_end="hold"),
)


def _declare(spec: Sum | StepSum) -> None:
    known = _SUMS.get(spec.name)
    if known is not None and known != spec:
        raise ValueError(f"sum {spec.name!r} is already declared differently: {known}")
    _SUMS[spec.name] = spec


for _spec in CORE_SUMS:
    _declare(_spec)


def register(estimator: Estimator) -> Estimator:
    """Adds an estimator (a new name, or a replacement of the same name); returns it."""
    for spec in estimator.sums:
        _declare(spec)
    _REGISTRY[estimator.name] = estimator
    return estimator


def unregister(name: str) -> None:
    """Removes an estimator (its declared sums stay known); for tests and plug-in reloads."""
    _REGISTRY.pop(name, None)


def get(name: str) -> Estimator:
    """The registered estimator called ``name``; KeyError if there is none."""
    return _REGISTRY[name]


def names() -> tuple[str, ...]:
    """Registered estimator names, in registration order."""
    return tuple(_REGISTRY)


def available(fields: tuple[str, ...] | frozenset[str] = ()) -> tuple[str, ...]:
    """Registered estimators whose ``needs`` are among ``fields`` (the per-step inputs a
    run provides), in registration order: what a run computes and, by default, reports."""
    return tuple(name for name in _REGISTRY if set(_REGISTRY[name].needs) <= set(fields))


def title(name: str) -> str:
    """How tables and plots show an estimator (its name when it is not registered)."""
    return _REGISTRY[name].title if name in _REGISTRY else name


def and_list(items: list[str]) -> str:
    """'a', 'a and b', 'a, b and c'."""
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def describe_standard_errors(estimators: tuple[str, ...]) -> str:
    """The report's standard-error line: each method with the estimators that use it."""
    by_method: dict[str, list[str]] = {}
    for name in estimators:
        by_method.setdefault(get(name).stderr_method, []).append(name)
    return "standard errors: " + ", ".join(
        f"{method} ({', '.join(members)})" for method, members in by_method.items()
    )


def describe_betting(estimators: tuple[str, ...]) -> str:
    """Which weights bound each estimator's betting interval, for the method line."""
    kinds = {"trajectory": "trajectory weights", "decision": "per-decision weights"}
    parts = []
    for kind, words in kinds.items():
        members = [name for name in estimators if get(name).betting == kind]
        if members:
            parts.append(f"{words} for {and_list(members)}")
    return ", ".join(parts)


def describe_bootstrap_t(estimators: tuple[str, ...]) -> str:
    """Which estimators get a studentized bootstrap interval and which a percentile one."""
    studentized = [name for name in estimators if get(name).studentized]
    percentile = [name for name in estimators if not get(name).studentized]
    parts = []
    if studentized:
        parts.append(f"studentized (bootstrap-t) interval for {', '.join(studentized)}")
    if percentile:
        parts.append(f"percentile for {and_list(percentile)}")
    return " and ".join(parts)


def sum_spec(name: str) -> Sum | StepSum:
    """The declaration of a sum (core or of some registered estimator)."""
    return _SUMS[name]


def sums_of(estimators: tuple[str, ...]) -> tuple[Sum | StepSum, ...]:
    """CORE_SUMS and those of ``estimators``, each once, in declaration order."""
    specs = {spec.name: spec for spec in CORE_SUMS}
    for name in estimators:
        specs.update((spec.name, spec) for spec in get(name).sums)
    return tuple(specs.values())


# The fields of BatchStatistics whose per-step sums are kept per resampling group: on the
# host, a list of K rows, each as long as its group's episodes need.
GROUP_STEP_FIELDS = ("step_log_scales", "step_sums")


class BatchStatistics(NamedTuple):
    """Sufficient statistics of a set of episodes for one policy: one batch's, as the
    kernel returns them (device arrays), or every batch's so far, merged in float64 on the
    host (``stats.Accumulator`` is this record: ``stats.from_batch``, ``stats.merge``).

    Every sum is kept per resampling group, so later resampling (jackknife over groups)
    needs no second pass. Dicts are keyed by sum (or scale) name; a pytree. The per-step
    arrays span T steps: a batch's windows side by side, or on the host the longest
    bucket seen (for t >= T every episode has ended; ``stats.extend`` lengthens them by
    each StepSum's ``after_end``). On the host the per-group per-step sums are ragged: a
    list of K rows [T_g], group g's as far as its own longest episode needs (after it,
    ``after_end`` gives every value), so one very long episode costs one row of its
    length, not K. On the host a scalar log scale or pivot is a float, and P stacked
    policies' statistics have a leading [P] axis on every leaf (rows [P, T_g]).
    """

    log_scales: dict[str, Array]  # scalar scale -> [] max over episodes of its log scale
    pivots: dict[str, Array]  # scalar scale with a pivot -> [] the batch's pivot
    sums: dict[str, Array]  # Sum -> [K] (or [K, m + 1] with moments)
    replicate_sums: dict[str, Array]  # Sum -> [R] (or [R, m + 1]) bootstrap-weighted
    step_log_scales: dict[str, Any]  # per-step scale -> [K, T] max over a group (host: rows)
    step_sums: dict[str, Any]  # StepSum -> [K, T] (host: K rows [T_g])
    replicate_step_log_scales: dict[str, Array]  # per-step scale -> [T] max over the batch
    replicate_step_sums: dict[str, Array]  # StepSum -> [R, T]
    log_weight_histogram: Array  # [HISTOGRAM_BINS + 2] episodes per log10-weight bin
    betting_histogram: Array  # [4, BETTING_BINS + 1] episodes per log bin ([4, 0] if off)

    def total(self, name: str) -> float:
        """A scalar sum over every group (moment 0 of a centred one); host arrays."""
        value = group_total(self.sums[name])
        return float(value if value.ndim == 0 else value[0])

    @property
    def length(self) -> int:
        """T, the length of the longest per-step array (a group's row, or the replicates')."""
        arrays = list(self.replicate_step_log_scales.values())
        for x in self.step_log_scales.values():
            arrays += x if isinstance(x, list) else [x]
        return max((x.shape[-1] for x in arrays), default=0)


def group_total(x_k):
    """Sum over groups (axis 0) of host arrays, row after row."""
    return x_k[:, None].sum(axis=0)[0] if x_k.ndim == 1 else x_k.sum(axis=0)
