"""``ope inspect DATA``: what the data holds and every validation problem in it, in one pass.

The schema as detected (layout, which column plays which role), episode and step counts,
the length histogram, a behavior-probability summary, action counts (discrete actions),
per-step reward statistics, the distribution of the discounted return (gamma: --gamma,
else the data's declared one, else 1) with the logging policy's value (the mean return)
and its standard error, and every problem the validation of ``episodes.py`` finds, with
counts and the first place each occurs. The same checks as ``ope evaluate`` run here
(``EpisodeAssembler`` in ``collect`` mode), so ``inspect`` reports exactly what
``evaluate`` would stop at or, with ``--on-invalid drop``, leave out. Memory is bounded
like ``evaluate``'s: per record batch, plus fixed-size histograms and 32 bytes per episode
(its id, reward sums and return).
"""

from __future__ import annotations

import dataclasses
import heapq
import math

import numpy as np

from ope_cli.config import BatchingConfig, ColumnMapping
from ope_cli.data.columns import DataSchema
from ope_cli.data.episode_stream import DataConfig, EpisodeStream, open_episodes
from ope_cli.data.episodes import EpisodeChunk
from ope_cli.data.sources import DeclaredBounds
from ope_cli.data.validate import REASON_INDEX, Check, Problem, bounds_checks
from ope_cli.errors import DataError
from ope_cli.estimation.run_plan import resolve_gamma
from ope_cli.models.policies import check_against_schema, chunk_checks, load_policies

MAX_DISTINCT_ACTIONS = 1000  # the smallest are counted one by one; the rest as "other"
_LOG10_MIN, _LOG10_MAX, _BINS_PER_DECADE = -40.0, 10.0, 1000  # median to ~0.12% relative
LENGTH_BINS = 64  # episode lengths 1, 2-3, 4-7, ... (powers of two)


@dataclasses.dataclass(frozen=True)
class InspectConfig:
    """What ``ope inspect`` reads: the data, column overrides, and optional policies whose
    action and state ranges the data is checked against."""

    data: str
    columns: ColumnMapping = ColumnMapping()
    read_rows: int = BatchingConfig.read_rows
    policies: tuple[str, ...] = ()
    gamma: float | None = None  # None: the data's declared gamma, else 1.0


RETURN_QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)


@dataclasses.dataclass
class RewardSummary:
    """Per-step rewards and per-episode discounted returns of the valid episodes. Each
    episode's sums are kept (three floats per episode) and added up at the end, in episode
    order, so the report does not depend on how the data was batched. The reward sums are
    of r - ``pivot`` (the first reward): raw sums of r^2 lost the spread of rewards on a
    large offset (1e8 + N(0, 1) reported std 0)."""

    steps: int = 0
    reward_min: float | None = None
    reward_max: float | None = None
    pivot: float | None = None
    sums: list[np.ndarray] = dataclasses.field(default_factory=list)  # [E, 2] r - p, (r - p)^2
    returns: list[np.ndarray] = dataclasses.field(default_factory=list)  # [E]

    def add(self, reward: np.ndarray, lengths: np.ndarray, gamma: float) -> None:
        """[N] rewards of episodes of [E] ``lengths``, steps in order."""
        self.steps += reward.size
        low, high = float(reward.min()), float(reward.max())
        self.reward_min = low if self.reward_min is None else min(self.reward_min, low)
        self.reward_max = high if self.reward_max is None else max(self.reward_max, high)
        self.pivot = float(reward[0]) if self.pivot is None else self.pivot
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        t = np.arange(reward.size) - np.repeat(starts, lengths)  # [N] step in its episode
        shifted = reward - self.pivot
        both = np.stack([shifted, np.square(shifted)], axis=1)  # [N, 2]
        self.sums.append(np.add.reduceat(both, starts, axis=0))
        self.returns.append(np.add.reduceat(reward * np.power(gamma, t), starts))

    def reward_stats(self) -> dict[str, float | None]:
        """mean, std (population) and range of the per-step rewards."""
        if not self.steps:
            return {"mean": None, "std": None, "min": None, "max": None}
        total, total_sq = np.concatenate(self.sums).sum(axis=0)
        shift = float(total) / self.steps
        variance = max(float(total_sq) / self.steps - shift * shift, 0.0)
        return {
            "mean": self.pivot + shift,
            "std": math.sqrt(variance),
            "min": self.reward_min,
            "max": self.reward_max,
        }

    def return_stats(self) -> dict[str, float | None]:
        """The discounted return's mean (the logging policy's value), its standard error,
        standard deviation, range and quantiles."""
        returns = np.concatenate(self.returns) if self.returns else np.zeros(0)
        if not returns.size:
            return {
                "value": None,
                "stderr": None,
                "std": None,
                "min": None,
                "max": None,
                "quantiles": {},
            }
        std = float(returns.std(ddof=1)) if returns.size > 1 else None
        quantiles = np.quantile(returns, RETURN_QUANTILES)
        return {
            "value": float(returns.mean()),
            "stderr": std / math.sqrt(returns.size) if std is not None else None,
            "std": std,
            "min": float(returns.min()),
            "max": float(returns.max()),
            "quantiles": {
                f"p{round(q * 100)}": float(v)
                for q, v in zip(RETURN_QUANTILES, quantiles, strict=True)
            },
        }


@dataclasses.dataclass
class InspectReport:
    """The result of ``inspect``; summaries cover the valid episodes (the ones ``evaluate``
    uses), counts of the invalid ones are in ``invalid_*`` and ``problems``."""

    source: str
    format: str
    files: int
    schema: DataSchema
    column_types: dict[str, str]
    rows_read: int = 0
    episodes: int = 0  # valid episodes
    steps: int = 0
    invalid_episodes: int = 0
    invalid_steps: int = 0
    min_length: int | None = None
    max_length: int | None = None
    length_counts: np.ndarray = dataclasses.field(
        default_factory=lambda: np.zeros(LENGTH_BINS, np.int64)
    )
    # the smallest behavior probability's natural log: kept as a log, since a log column's
    # e^-801 underflows float64 (``behavior_min`` is its exp)
    behavior_log_min: float | None = None
    behavior_max: float | None = None
    behavior_log10_counts: np.ndarray = dataclasses.field(
        default_factory=lambda: np.zeros(
            int((_LOG10_MAX - _LOG10_MIN) * _BINS_PER_DECADE), np.int64
        )
    )
    action_counts: dict[int, int] | None = None
    other_actions: int = 0
    # the counted actions, negated: a heap whose top is the largest (evicted for a smaller)
    _counted: list[int] = dataclasses.field(default_factory=list, repr=False)
    declared: DeclaredBounds = DeclaredBounds()  # bounds in the schema metadata (checked)
    problems: list[Problem] = dataclasses.field(default_factory=list)
    gamma: float = 1.0  # the discount of the returns, from ``gamma_source``
    gamma_source: str = "default"  # option (--gamma), data (declared) or default
    rewards: RewardSummary = dataclasses.field(default_factory=RewardSummary)
    # the observations' length: the type's, else the one the data's lists have (None: none)
    observation_dim: int | None = None

    @property
    def ok(self) -> bool:
        """No validation problem and some episode to evaluate (evaluate refuses data
        without rows, so inspect does not pass it)."""
        return not self.problems and self.episodes > 0

    @property
    def behavior_min(self) -> float | None:
        """The smallest behavior probability (or density); 0.0 where it underflows."""
        return None if self.behavior_log_min is None else math.exp(self.behavior_log_min)

    @property
    def behavior_median(self) -> float | None:
        """Median behavior probability (or density), from a log-spaced histogram: the
        middle value's bin, or the mean of the middle two's for an even count."""
        total = int(self.behavior_log10_counts.sum())
        if total == 0:
            return None
        middle = [(total + 1) // 2, total // 2 + 1]  # 1-based ranks: twice the same if odd
        index = np.searchsorted(np.cumsum(self.behavior_log10_counts), middle)
        values = np.clip(
            10 ** (_LOG10_MIN + (index + 0.5) / _BINS_PER_DECADE),
            self.behavior_min,
            self.behavior_max,
        )
        return float(values.mean())

    def length_histogram(self) -> list[tuple[int, int, int]]:
        """(shortest, longest, episodes) per power-of-two bin, up to the longest episode."""
        if not self.episodes:
            return []
        last = int(self.max_length).bit_length()
        return [(1 << k, (1 << (k + 1)) - 1, int(self.length_counts[k])) for k in range(last)]

    def add(self, chunk: EpisodeChunk) -> None:
        """Adds one chunk of valid episodes to the summaries."""
        lengths = chunk.lengths
        self.episodes += chunk.num_episodes
        self.steps += chunk.num_steps
        longest = int(lengths.max())
        self.max_length = longest if self.max_length is None else max(self.max_length, longest)
        shortest = int(lengths.min())
        self.min_length = shortest if self.min_length is None else min(self.min_length, shortest)
        bins = np.minimum(np.floor(np.log2(lengths)).astype(np.int64), LENGTH_BINS - 1)
        self.length_counts += np.bincount(bins, minlength=LENGTH_BINS)
        if chunk.log_behavior is not None:  # None: no propensity column (--behavior)
            self._add_behavior(chunk.log_behavior)
        if self.schema.action_kind == "discrete":
            self._add_actions(chunk.action)
        self.rewards.add(chunk.reward, lengths, self.gamma)

    def _add_behavior(self, log_behavior: np.ndarray) -> None:
        """The behavior-probability summary of [N] logged log-probabilities."""
        log10 = log_behavior / math.log(10)
        log_low, high = float(log_behavior.min()), float(np.exp(log_behavior.max()))
        self.behavior_log_min = (
            log_low if self.behavior_log_min is None else min(self.behavior_log_min, log_low)
        )
        self.behavior_max = high if self.behavior_max is None else max(self.behavior_max, high)
        index = np.clip(
            ((log10 - _LOG10_MIN) * _BINS_PER_DECADE).astype(np.int64),
            0,
            self.behavior_log10_counts.size - 1,
        )
        self.behavior_log10_counts += np.bincount(index, minlength=self.behavior_log10_counts.size)

    def _add_actions(self, action: np.ndarray) -> None:
        """Counts of [N] discrete actions: the MAX_DISTINCT_ACTIONS smallest distinct ones of
        all the data, whatever its batches (the first ones met depended on them), the rest
        in ``other_actions``."""
        counts = self.action_counts if self.action_counts is not None else {}
        for value, count in zip(*np.unique(action, return_counts=True), strict=True):
            value, count = int(value), int(count)
            if value in counts:
                counts[value] += count
            elif len(counts) < MAX_DISTINCT_ACTIONS:
                counts[value] = count
                heapq.heappush(self._counted, -value)
            elif value < -self._counted[0]:  # it displaces the largest counted one
                largest = -heapq.heapreplace(self._counted, -value)
                self.other_actions += counts.pop(largest)
                counts[value] = count
            else:
                self.other_actions += count
        self.action_counts = counts


def inspect(config: InspectConfig) -> InspectReport:
    """Reads the data once. Raises DataError (or PolicyError) only when it cannot be read
    at all (no such path, no usable schema); every other problem is in the report, and a
    file whose reading fails is reported and skipped."""
    policies = load_policies(config.policies)
    episodes = open_episodes(
        DataConfig(
            config.data,
            config.columns,
            config.read_rows,
            on_invalid="collect",
            target_column="unread" if policies else "if_present",
            # without a propensity column, the report says that evaluate needs --behavior
            behavior_column="if_present",
        )
    )
    data, schema = episodes.data, episodes.schema
    for policy in policies:
        check_against_schema(policy, schema)

    declared = data.declared_bounds()
    if config.gamma is not None and not 0.0 <= config.gamma <= 1.0:
        from ope_cli.errors import UsageError

        raise UsageError(f"--gamma must be in [0, 1], got {config.gamma}")
    gamma, gamma_source = resolve_gamma(config.gamma, declared)

    def policy_checks(chunk):
        for policy in policies:
            yield from chunk_checks(policy, chunk)
        yield from bounds_checks(
            chunk.steps,
            chunk.lengths,
            declared.reward_range,
            declared.horizon,
            ("declared by the data", "declared by the data"),
        )

    report = InspectReport(
        source=config.data,
        format=data.format,
        files=len(data.files),
        schema=schema,
        column_types={
            role: str(data.schema.field(name).type) for role, name in schema.columns.items()
        },
        declared=declared,
        gamma=gamma,
        gamma_source=gamma_source,
    )
    _read_every_file(episodes.with_checks(policy_checks), report)
    # a list column's length is the one its vectors are read with (episode_stream.widths)
    report.observation_dim = schema.observation_dim or episodes.widths.get("observation")
    return report


def _read_every_file(episodes: EpisodeStream, report: InspectReport) -> None:
    """Adds every valid episode of ``episodes`` to ``report``, and what the validation
    found; a file whose reading fails is one problem, and the reading goes on with the
    next file."""
    assembler = episodes.assembler()
    remaining = list(episodes.data.files)
    while remaining:
        part = episodes.restrict(tuple(remaining))
        current = remaining[0]
        try:
            for chunk in assembler.chunks(part.record_batches()):
                current = chunk.file
                report.add(chunk)
            remaining = []
        except DataError as error:  # this file cannot be read on: report it, go on with the next
            failed = _failed_file(str(error), remaining) or current
            message = str(error).removeprefix(f"{failed}: ")
            problem = f"{message} (the rest of this file was not read)"
            assembler.validation.found(
                Check("file_error", problem, np.zeros(0, bool)), failed, (None, None), (0, 0)
            )
            assembler.abandon_file()
            # a source may name its parts otherwise than its files (an HDF5 group, a
            # Minari episode): where the failed one is not among them, nothing is left
            # that can be read on from
            remaining = remaining[remaining.index(failed) + 1 :] if failed in remaining else []
    validation = assembler.validation
    report.rows_read = assembler.rows_read
    report.invalid_episodes = validation.episodes_dropped
    report.invalid_steps = validation.steps_dropped
    # in the order of the checks, not of their discovery, which follows the batch cuts
    # (--read-rows 3 listed the same four problems in another order than the default)
    report.problems = sorted(validation.problems.values(), key=lambda p: REASON_INDEX[p.reason])


def _failed_file(message: str, files: list[str]) -> str | None:
    """The file a DataError's message starts with (errors name their file first)."""
    for file in files:
        if message.startswith(f"{file}: "):
            return file
    return None
