"""``ope evaluate DATA``: options -> EvaluationConfig -> pipeline.evaluate -> a formatter."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import typer

from ope_cli.cli.console import say, table_console
from ope_cli.cli.options import (
    COLUMN_OPTIONS,
    DEFAULT_COLUMNS,
    BatchSteps,
    Behavior,
    BehaviorCrossFit,
    Coordinator,
    CrossFit,
    Data,
    Devices,
    Distributed,
    Estimators,
    EvaluateFormat,
    Gamma,
    MinBucket,
    MinPropensity,
    NumProcesses,
    OnInvalid,
    OutputFormat,
    Precision,
    ProcessId,
    QOption,
    Quiet,
    ReadRows,
    Timeout,
    VSamples,
    column_options,
)
from ope_cli.cli.progress import ProgressDisplay
from ope_cli.config import ESTIMATORS, BatchingConfig, ColumnMapping, EvaluationConfig
from ope_cli.errors import UsageError
from ope_cli.estimators import names
from ope_cli.plan import reported_estimators

if TYPE_CHECKING:  # annotations only: the distributed runtime and results load with the run
    from ope_cli.distributed import DistributedConfig
    from ope_cli.results import EvaluationResult

TABLE_WIDTH = 100  # least columns of a table written to a file or pipe
TABLE_MARGIN = 90  # columns besides the policy name


@column_options(*COLUMN_OPTIONS)
def evaluate(
    data: Data,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            "--policy",
            "-p",
            help="Checkpoint .npz or entry point package.module:name; repeat for several "
            "policies (one pass). Omit to use target probabilities logged in the data.",
        ),
    ] = None,
    behavior: Behavior = None,
    min_propensity: MinPropensity = 1e-3,
    behavior_cross_fit: BehaviorCrossFit = 1,
    q: QOption = None,
    cross_fit: CrossFit = 2,
    v_samples: VSamples = 16,
    gamma: Gamma = 1.0,
    estimator: Estimators = None,
    output_format: EvaluateFormat = None,
    confidence: Annotated[float, typer.Option(help="Confidence level of the intervals.")] = 0.95,
    ci: Annotated[
        str,
        typer.Option(
            "--ci",
            help="Interval method: betting (finite-sample, needs bounded rewards), normal, "
            "percentile (Poisson bootstrap) or bootstrap-t (studentized Poisson bootstrap). auto: "
            "betting when the reward range is known (--reward-range or the data's metadata), else "
            "normal.",
        ),
    ] = "auto",
    reward_range: Annotated[
        tuple[float, float] | None,
        typer.Option(
            metavar="LOW HIGH",
            help="Every reward lies in [LOW, HIGH]; enables betting intervals. "
            "Checked against the data.",
        ),
    ] = None,
    horizon: Annotated[
        int | None,
        typer.Option(
            metavar="STEPS",
            help="No episode is longer than STEPS; betting intervals need it when "
            "--gamma is 1. Checked against the data.",
        ),
    ] = None,
    bootstrap_samples: Annotated[int, typer.Option(help="Bootstrap replicates.")] = 200,
    seed: Annotated[int, typer.Option(help="Seed of the bootstrap's random streams.")] = 0,
    precision: Precision = None,
    devices: Devices = None,
    quiet: Quiet = False,
    on_invalid: Annotated[
        OnInvalid,
        typer.Option(
            help="error: stop at the first invalid value; drop: leave out the episodes with "
            "invalid values (NaN/inf, bad probabilities, out-of-range actions or states, "
            "duplicate or missing steps, nulls) and report how many were dropped, and why."
        ),
    ] = OnInvalid.error,
    rank_by: Annotated[
        str,
        typer.Option(
            help=f"Estimator that ranks several policies in the table, highest first "
            f"({', '.join(ESTIMATORS)}); the best is highlighted."
        ),
    ] = "wis",
    plot: Annotated[
        str | None,
        typer.Option(
            metavar="DIR",
            help="Also write PNG figures into DIR: log10 weight histogram, per-step "
            "WPDIS and mean weight, estimates with intervals. Needs matplotlib: "
            "pip install 'ope-cli\\[plot]'.",
        ),
    ] = None,  # \[ : not rich markup
    coordinator: Coordinator = None,
    num_processes: NumProcesses = None,
    process_id: ProcessId = None,
    distributed: Distributed = False,
    timeout: Timeout = 60,
    read_rows: ReadRows = BatchingConfig.read_rows,
    batch_steps: BatchSteps = BatchingConfig.batch_steps,
    min_bucket: MinBucket = BatchingConfig.min_bucket,
    columns: ColumnMapping = DEFAULT_COLUMNS,
) -> None:
    """Estimate each policy's value from the logged episodes in DATA.

    Examples:

      ope evaluate logs.parquet --policy ckpt.npz --gamma 0.99

      ope evaluate logs/ -p a.npz -p b.npz --format json | jq '.results[0].estimates.wis.value'

      ope evaluate episodes.parquet --policy mypkg.models:policy --obs-col state --behavior-prob-col pscore

      ope evaluate minari_logs/ --policy ckpt.npz --behavior behavior.npz

      ope evaluate logs_without_propensities.parquet --policy ckpt.npz --behavior estimate

      ope evaluate logs.parquet --policy ckpt.npz --q fit
    """
    from ope_cli.distributed import DistributedConfig

    config = EvaluationConfig(
        data=data,
        policies=tuple(policy or ()),
        behavior=behavior,
        min_propensity=min_propensity,
        behavior_cross_fit=behavior_cross_fit,
        gamma=gamma,
        estimators=tuple(dict.fromkeys(e.lower() for e in estimator)) if estimator else None,
        q=tuple(q or ()),
        cross_fit=cross_fit,
        v_samples=v_samples,
        confidence=confidence,
        interval=ci,
        reward_range=reward_range,
        horizon=horizon,
        bootstrap_samples=bootstrap_samples,
        seed=seed,
        columns=columns,
        batching=BatchingConfig(
            read_rows=read_rows, batch_steps=batch_steps, min_bucket=min_bucket
        ),
        precision=precision.value if precision else None,
        devices=devices,
        on_invalid=on_invalid.value,
    )
    cluster = DistributedConfig(
        coordinator=coordinator,
        num_processes=num_processes,
        process_id=process_id,
        auto=distributed,
        timeout_seconds=timeout,
    )
    run_and_report(config, cluster, output_format, rank_by, plot, quiet)


def run_and_report(
    config: EvaluationConfig,
    cluster: DistributedConfig,
    output_format: OutputFormat | None,
    rank_by: str,
    plot: str | None,
    quiet: bool,
) -> None:
    """Checks the output options, runs the evaluation (with progress), writes the figures,
    then the result on stdout, from process 0 only."""
    from ope_cli.pipeline import evaluate as run_evaluation

    rank_by = check_rank_by(rank_by, reported_estimators(config))
    if plot is not None:
        from ope_cli.report.plots import require_matplotlib

        require_matplotlib()  # before the run, not after it
    chosen = output_format or (OutputFormat.table if sys.stdout.isatty() else OutputFormat.json)
    # pipeline.evaluate configures the runtime (ope_cli.runtime), around joining a cluster.
    with ProgressDisplay(quiet) as (on_progress, on_status):
        result = run_evaluation(
            config, on_progress=on_progress, distributed=cluster, on_status=on_status
        )
    if result.process_id != 0:
        return  # every process holds the reduced result; process 0 prints it
    if plot is not None:  # before the result: a figure that cannot be written leaves stdout empty
        from ope_cli.report.plots import write_plots

        written = write_plots(result, plot)
        if not quiet:
            say(f"figures: {', '.join(str(p) for p in written)}")
    write_result(result, chosen, rank_by)


def write_result(result: EvaluationResult, chosen: OutputFormat, rank_by: str) -> None:
    """The result on stdout in the chosen format."""
    from ope_cli.report import render_table, to_csv, to_json

    if chosen is OutputFormat.json:
        sys.stdout.write(to_json(result) + "\n")
    elif chosen is OutputFormat.csv:
        sys.stdout.write(to_csv(result))
    else:
        longest = max(len(r.policy) for r in result.results)  # no policy name is cut
        render_table(result, table_console(max(TABLE_WIDTH, longest + TABLE_MARGIN)), rank_by)


def check_rank_by(rank_by: str, estimators: tuple[str, ...]) -> str:
    """--rank-by as an estimator the run reports; the default (wis) falls back to the first
    reported estimator when --estimator leaves WIS out."""
    rank_by = rank_by.lower()
    if rank_by not in names():
        raise UsageError(f"--rank-by must be one of {', '.join(names())}, got {rank_by!r}")
    if rank_by in estimators:
        return rank_by
    if rank_by == "wis":
        return estimators[0]
    raise UsageError(
        f"--rank-by {rank_by}: not among the reported estimators "
        f"({', '.join(estimators)}); add --estimator {rank_by}"
    )
