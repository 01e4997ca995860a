"""Option groups, declared once: a command names a group as one parameter (``option_groups``
in ``cli/options.py``) and receives one object in place of the group's options.

``BATCHING`` (evaluate, bench) -> BatchingConfig; ``TABLE_OR_JSON`` / ``EVALUATE_OUTPUT``
(every command that writes a result) -> the chosen format, ``WRITTEN`` (inspect, fit-q) ->
``Written`` (the format and --quiet, for their warnings); and for ``ope evaluate``:
``POLICY_SOURCES`` -> EvaluationConfig keyword arguments (the policies, a BehaviorConfig and
a QConfig), ``INTERVALS`` -> IntervalConfig, ``CHOOSING`` -> ChoosingConfig, ``RUNTIME`` ->
RuntimeConfig, ``CLUSTER`` -> DistributedConfig.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple

import typer

from ope_cli.cli.console import say_warnings
from ope_cli.cli.helpmap import one_of
from ope_cli.cli.options import (
    BatchSteps,
    Behavior,
    BehaviorCrossFit,
    Coordinator,
    CrossFit,
    Devices,
    Distributed,
    EvaluateFormat,
    InspectFormat,
    InspectFormatOption,
    MinBucket,
    MinPropensity,
    NumProcesses,
    OptionGroup,
    OutputFormat,
    Precision,
    PrecisionOption,
    ProcessId,
    QOption,
    Quiet,
    ReadRows,
    Timeout,
    VSamples,
)
from ope_cli.config import (
    BatchingConfig,
    BehaviorConfig,
    ChoosingConfig,
    IntervalConfig,
    QConfig,
    RuntimeConfig,
)
from ope_cli.estimation.intervals import INTERVALS

if TYPE_CHECKING:  # the distributed runtime loads with the run
    from ope_cli.estimation.distributed import DistributedConfig

ConfigFields = dict[str, Any]  # EvaluationConfig keyword arguments


# --- batching (evaluate, bench)
BATCHING = OptionGroup(
    (
        ("read_rows", ReadRows, BatchingConfig.read_rows),
        ("batch_steps", BatchSteps, BatchingConfig.batch_steps),
        ("min_bucket", MinBucket, BatchingConfig.min_bucket),
    ),
    BatchingConfig,
)


# --- output format: the option's value, or table on a terminal and json otherwise
def _output(option: Any, formats: type[InspectFormat] | type[OutputFormat]) -> OptionGroup:
    def chosen(output_format: Any) -> Any:
        return output_format or (formats.table if sys.stdout.isatty() else formats.json)

    return OptionGroup((("output_format", option, None),), chosen)


TABLE_OR_JSON = _output(InspectFormatOption, InspectFormat)  # -> InspectFormat


def quietly(group: OptionGroup, keep: Callable | None = None) -> OptionGroup:
    """``group`` with ``--quiet`` beside it, accepted as every command accepts it (SPEC 1):
    ``keep(built, quiet)`` is what the command receives (without it, the group's object
    alone, for a command that writes nothing to quiet)."""

    def build(quiet: bool, **values: Any) -> Any:
        built = group.build(**values)
        return built if keep is None else keep(built, quiet)

    return OptionGroup((*group.options, ("quiet", Quiet, False)), build)


# convert and fit-behavior: --format table|json, and --quiet
TABLE_OR_JSON_QUIET = quietly(TABLE_OR_JSON)


class Written(NamedTuple):
    """How inspect and fit-q write their result: the format, and whether --quiet leaves
    the warnings of a JSON result to the document (else they are said on stderr too)."""

    format: InspectFormat
    quiet: bool

    def say_warnings(self, messages) -> None:
        """The JSON result's warnings on stderr, unless --quiet (``console.say_warnings``)."""
        if not self.quiet:
            say_warnings(messages)


# inspect and fit-q: --format table|json, and --quiet (for their warnings too)
WRITTEN = quietly(TABLE_OR_JSON, Written)
EVALUATE_OUTPUT = _output(EvaluateFormat, OutputFormat)  # -> OutputFormat (table, json, csv)


# --- what ope evaluate evaluates: policies, behavior policy, Q-hat
PolicyOption = Annotated[
    list[str] | None,
    typer.Option(
        "--policy",
        "-p",
        metavar=one_of("[NAME=]CKPT", "package.module:name"),
        help="Checkpoint .npz or entry point package.module:name; repeat for several "
        "policies (one pass), or give a quoted glob ('ckpts/*.npz'). NAME=CKPT names the "
        "policy in the output; otherwise the shortest distinct end of its path labels it. "
        "Omit to use target probabilities logged in the data.",
    ),
]


def _sources(
    policy: list[str] | None,
    behavior: str | None,
    min_propensity: float,
    behavior_cross_fit: int,
    q: list[str] | None,
    cross_fit: int,
    v_samples: int,
) -> ConfigFields:
    return dict(
        policies=tuple(policy or ()),
        behavior=BehaviorConfig(behavior, min_propensity, behavior_cross_fit),
        q=QConfig(tuple(q or ()), cross_fit, v_samples=v_samples),
    )


POLICY_SOURCES = OptionGroup(
    (
        ("policy", PolicyOption, None),
        ("behavior", Behavior, None),
        ("min_propensity", MinPropensity, BehaviorConfig.min_propensity),
        ("behavior_cross_fit", BehaviorCrossFit, BehaviorConfig.cross_fit),
        ("q", QOption, None),
        ("cross_fit", CrossFit, QConfig.cross_fit),
        ("v_samples", VSamples, QConfig.v_samples),
    ),
    _sources,
)


# --- intervals (evaluate)
Confidence = Annotated[float, typer.Option(help="Confidence level of the intervals.")]
IntervalMethod = Annotated[
    str,
    typer.Option(
        "--ci",
        metavar=one_of("auto", *INTERVALS),
        help="Interval method: betting (finite-sample, needs bounded rewards), normal, "
        "percentile (Poisson bootstrap) or bootstrap-t (studentized Poisson bootstrap). auto: "
        "per estimator, betting where it applies and the reward range is known "
        "(--reward-range or the data's metadata), else normal. Each estimate names its "
        "method; a missing interval says why.",
    ),
]
RewardRange = Annotated[
    tuple[float, float] | None,
    typer.Option(
        metavar="LOW HIGH",
        help="Every reward lies in [LOW, HIGH]; enables betting intervals. "
        "Checked against the data.",
    ),
]
Horizon = Annotated[
    int | None,
    typer.Option(
        metavar="STEPS",
        help="No episode is longer than STEPS; betting intervals need it when "
        "--gamma is 1. Checked against the data.",
    ),
]
BootstrapSamples = Annotated[int, typer.Option(help="Bootstrap replicates.")]
Seed = Annotated[
    int,
    typer.Option(
        help="Seed of the random streams: the bootstrap's, a fitted Q's (--q fit:mlp) and "
        "the actions drawn for V-hat (continuous actions)."
    ),
]


def _intervals(
    confidence: float,
    ci: str,
    reward_range: tuple[float, float] | None,
    horizon: int | None,
    bootstrap_samples: int,
    seed: int,
) -> IntervalConfig:
    return IntervalConfig(confidence, ci, reward_range, horizon, bootstrap_samples, seed)


INTERVALS = OptionGroup(
    (
        ("confidence", Confidence, IntervalConfig.confidence),
        ("ci", IntervalMethod, IntervalConfig.method),
        ("reward_range", RewardRange, None),
        ("horizon", Horizon, None),
        ("bootstrap_samples", BootstrapSamples, IntervalConfig.bootstrap_samples),
        ("seed", Seed, IntervalConfig.seed),
    ),
    _intervals,
)


# --- choosing between policies (evaluate): SPEC 11
Baseline = Annotated[
    str | None,
    typer.Option(
        metavar=one_of("NAME", "behavior"),
        help="Compare every other policy with this one on the same episodes: the paired "
        "difference per estimator, its standard error, interval (--ci's method) and the "
        "share of bootstrap replicates where it is better. NAME: a --policy value (or "
        "its NAME=); behavior: the logging policy (its value is the mean return).",
    ),
]
Truth = Annotated[
    str | None,
    typer.Option(
        metavar="FILE",
        help="True values of the policies (truth.json of ope generate, or a JSON object "
        "{policy: value}): adds rmse, nmse, Spearman, regret@k, nregret@k, precision@k, "
        "sharpe@k and interval coverage per estimator.",
    ),
]
TopK = Annotated[
    list[int] | None,
    typer.Option(
        metavar="K",
        help="The k of the @k selection metrics (repeat for several); default 1 and 3. "
        "Needs --truth.",
    ),
]


def _choosing(baseline: str | None, truth: str | None, top_k: list[int] | None) -> ChoosingConfig:
    return ChoosingConfig(baseline, truth, tuple(top_k) if top_k else None)


CHOOSING = OptionGroup(
    (("baseline", Baseline, None), ("truth", Truth, None), ("top_k", TopK, None)), _choosing
)


# --- runtime (evaluate): kernel precision and devices
def _runtime(precision: PrecisionOption | None, devices: int | None) -> RuntimeConfig:
    return RuntimeConfig(precision.value if precision else None, devices)


RUNTIME = OptionGroup((("precision", Precision, None), ("devices", Devices, None)), _runtime)


# --- multi-process runs (evaluate)
def _cluster(
    coordinator: str | None,
    num_processes: int | None,
    process_id: int | None,
    distributed: bool,
    timeout: int | None,
) -> DistributedConfig:
    from ope_cli.estimation.distributed import DistributedConfig

    return DistributedConfig(
        coordinator=coordinator,
        num_processes=num_processes,
        process_id=process_id,
        auto=distributed,
        timeout=timeout,
    )


CLUSTER = OptionGroup(
    (
        ("coordinator", Coordinator, None),
        ("num_processes", NumProcesses, None),
        ("process_id", ProcessId, None),
        ("distributed", Distributed, False),
        ("timeout", Timeout, None),
    ),
    _cluster,
)
