"""Frozen settings that flow from the command line into the core."""

from __future__ import annotations

import dataclasses
from numbers import Real
from typing import Any, Literal

from ope_cli.errors import UsageError
from ope_cli.estimation.estimators import available
from ope_cli.models.behavior_models.base import MIN_PROPENSITY

# The estimators every run computes (is, wis, pdis, wpdis); those that need more inputs
# (dm, dr, wdr: a Q source) are computed when a run has them. Any estimator registered
# later (``ope_cli.estimation.estimators.register``) is accepted by name too.
ESTIMATORS: tuple[str, ...] = available()
Precision = Literal["float32", "float64"]


@dataclasses.dataclass(frozen=True)
class ColumnMapping:
    """User overrides of column names; ``None`` means detect from defaults and aliases."""

    episode: str | None = None
    step: str | None = None
    observation: str | None = None
    action: str | None = None
    reward: str | None = None
    behavior_prob: str | None = None
    behavior_log_prob: str | None = None
    target_prob: str | None = None
    target_log_prob: str | None = None
    q_value: str | None = None
    v_value: str | None = None

    def check(self) -> None:
        """UsageError for a probability and its log both named: one of the two options was
        dropped without a word."""
        for kind in ("behavior", "target"):
            named = (getattr(self, f"{kind}_prob"), getattr(self, f"{kind}_log_prob"))
            if None not in named:
                raise UsageError(
                    f"--{kind}-prob-col and --{kind}-log-prob-col name two columns of one "
                    "probability; give one of them"
                )


def python_numbers(value: Any) -> Any:
    """A NumPy number as the Python number it holds, also in a tuple or list (the JSON
    document and the checks take Python numbers); anything else as it is."""
    if isinstance(value, tuple | list):
        return type(value)(python_numbers(item) for item in value)
    if isinstance(value, Real) and not isinstance(value, int | float) and hasattr(value, "item"):
        return value.item()
    return value


def estimator_names(given) -> tuple[str, ...] | None:
    """``--estimator``'s values as a run reads them: lower case, each once, in order (None:
    none given). The command line and the Python API both read them so ("WIS" was unknown
    to the API, and a repeated name stayed)."""
    if not given:
        return None
    return tuple(dict.fromkeys(name.lower() if isinstance(name, str) else name for name in given))


@dataclasses.dataclass(frozen=True)
class BatchingConfig:
    """How rows are read and episodes are padded into batches walked in windows.

    Attributes:
      read_rows: rows per Arrow record batch read from disk.
      batch_steps: N, the [lanes, width] cells of a kernel window: the window shapes are
        [N / s, 1] (one-step episodes), [N / s, s], [N / s^2, s^2] and [1, N / 8]
        (``buckets.window_shapes``).
      min_bucket: s, the short window's width (at least 2).
    """

    read_rows: int = 65_536
    batch_steps: int = 8_192
    min_bucket: int = 8

    def check(self) -> None:
        """UsageError (one line, the option named) for a setting out of its range."""
        for option, value, least in (
            ("--read-rows", self.read_rows, 1),
            ("--batch-steps", self.batch_steps, 1),
            ("--min-bucket", self.min_bucket, 2),
        ):
            if value < least:
                raise UsageError(f"{option} must be at least {least}, got {value}")
        allocated = "allocated whatever the data"
        for option, value, most, why in (
            ("--read-rows", self.read_rows, MAX_READ_ROWS, "each record batch is read whole"),
            ("--batch-steps", self.batch_steps, MAX_BATCH_STEPS, f"window cells are {allocated}"),
            ("--min-bucket", self.min_bucket, MAX_MIN_BUCKET, f"short windows are {allocated}"),
        ):
            if value > most:
                raise UsageError(f"{option} must be at most {most:,}, got {value:,}: {why}")


# A window's cells are allocated (and padded) whatever the data: 1e8 cells took 6 GB and 72 s
# for 1,804 steps, and a short window of 1e8 steps asked for petabytes (a MemoryError).
# Past these, a longer episode is walked alone in one-lane windows anyway.
MAX_BATCH_STEPS = 1 << 22
MAX_MIN_BUCKET = 4096
# pyarrow takes a batch size below 2**63 (above: an OverflowError, exit 1); a batch of 2**31
# rows is already tens of GB
MAX_READ_ROWS = 1 << 31


@dataclasses.dataclass(frozen=True)
class BehaviorConfig:
    """The behavior policy that replaces a logged propensity column (``--behavior``).

    Attributes:
      policy: a checkpoint, entry point or estimate[:MODEL]; None: the data's
        behavior_prob / behavior_log_prob column.
      min_propensity: --behavior estimate: estimated probabilities below it are raised to
        it (discrete models).
      cross_fit: --behavior estimate: K folds of episodes (by id hash), each evaluated with
        the model fitted on the other K - 1 (1: fitted on every episode, in-sample).
    """

    policy: str | None = None
    min_propensity: float = MIN_PROPENSITY
    cross_fit: int = 1


@dataclasses.dataclass(frozen=True)
class QConfig:
    """The Q sources of the doubly robust estimators (``--q``).

    Attributes:
      sources: one for every policy or one per policy; checkpoint, entry point or "fit"
        (fitted Q evaluation in the run, cross-fitted over ``cross_fit`` folds; "fit:MODEL"
        names the fit-q model, else the data's default).
      cross_fit: the folds of a fitted Q.
      v_samples: continuous actions: draws from pi_e per V-hat(s).
    """

    sources: tuple[str, ...] = ()
    cross_fit: int = 2
    v_samples: int = 16


def check_v_samples(v_samples: int) -> None:
    """UsageError for a ``--v-samples`` (ope evaluate's and ope fit-q's) out of range."""
    if v_samples < 1:
        raise UsageError(f"--v-samples must be a positive number, got {v_samples}")


def check_v_samples_apply(v_samples: int, action_kind: str) -> None:
    """UsageError for --v-samples (other than its default) over discrete actions, where
    V-hat sums over every action and the option changes nothing."""
    if v_samples != QConfig.v_samples and action_kind == "discrete":
        raise UsageError(
            "--v-samples applies to continuous actions; over discrete ones V-hat sums "
            "pi(a|s) Q(s, a) over every action"
        )


@dataclasses.dataclass(frozen=True)
class IntervalConfig:
    """How the intervals are made (``--confidence``, ``--ci`` ... ``--seed``).

    Attributes:
      confidence: the intervals' confidence level.
      method: auto (betting when the rewards are known to be bounded: reward_range, or
        declared by the data; else normal), or one of stats.INTERVALS: betting, normal,
        percentile, bootstrap-t.
      reward_range: every reward lies in [low, high].
      horizon: no episode is longer (needed for betting when gamma = 1).
      bootstrap_samples: the bootstrap's replicates.
      seed: the bootstrap's (and a fitted Q's) seed.
    """

    confidence: float = 0.95
    method: str = "auto"
    reward_range: tuple[float, float] | None = None
    horizon: int | None = None
    bootstrap_samples: int = 200
    seed: int = 0


@dataclasses.dataclass(frozen=True)
class RuntimeConfig:
    """Where the kernel runs: ``precision`` (None: float64 on CPU, float32 on
    accelerators) and the local ``devices`` to shard over (None: all)."""

    precision: Precision | None = None
    devices: int | None = None


@dataclasses.dataclass(frozen=True)
class ChoosingConfig:
    """Choosing between policies.

    Attributes:
      baseline: --baseline: a --policy value (or its NAME) or "behavior"; the others are
        compared to it.
      truth: --truth: truth.json of ope generate, or a JSON object {policy: value}.
      top_k: --top-k's k (None: 1 and 3, those at most the number of policies).
    """

    baseline: str | None = None
    truth: str | None = None
    top_k: tuple[int, ...] | None = None


@dataclasses.dataclass(frozen=True)
class EvaluationConfig:
    """Everything ``ope evaluate`` needs, independent of the terminal: the data, the
    policies, the discount and estimators, and the records of each group of options."""

    data: str
    policies: tuple[str, ...] = ()
    # the discount: None takes the one the data declares (schema metadata), else 1.0
    gamma: float | None = None
    # None: every estimator the run's inputs allow (with a Q source: also dm, dr, wdr)
    estimators: tuple[str, ...] | None = None
    behavior: BehaviorConfig = BehaviorConfig()
    q: QConfig = QConfig()
    intervals: IntervalConfig = IntervalConfig()
    columns: ColumnMapping = ColumnMapping()
    batching: BatchingConfig = BatchingConfig()
    runtime: RuntimeConfig = RuntimeConfig()
    on_invalid: str = (
        "error"  # error: stop at the first bad value; drop: leave out invalid episodes
    )
    choosing: ChoosingConfig = ChoosingConfig()
