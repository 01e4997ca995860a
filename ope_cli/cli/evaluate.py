"""``ope evaluate DATA``: options -> EvaluationConfig -> pipeline.evaluate -> a formatter."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from ope_cli.cli.console import say, say_warnings, stdout_kept_for_the_result, table_console
from ope_cli.cli.groups import (
    BATCHING,
    CHOOSING,
    CLUSTER,
    EVALUATE_OUTPUT,
    INTERVALS,
    POLICY_SOURCES,
    RUNTIME,
    ConfigFields,
)
from ope_cli.cli.helpmap import one_of
from ope_cli.cli.options import (
    COLUMN_OPTIONS,
    Data,
    DeclaredGamma,
    Estimators,
    OnInvalid,
    OptionGroup,
    OutputFormat,
    Overwrite,
    Quiet,
    column_group,
    merged_group,
    option_groups,
    options_group,
)
from ope_cli.cli.progress import ProgressDisplay
from ope_cli.config import EvaluationConfig, estimator_names
from ope_cli.errors import InvalidValueError
from ope_cli.estimation.estimators import names
from ope_cli.estimation.run_plan import reported_estimators
from ope_cli.report.table import check_rank_by

if TYPE_CHECKING:  # annotations only: the distributed runtime and results load with the run
    from ope_cli.estimation.distributed import DistributedConfig
    from ope_cli.results import EvaluationResult

TABLE_WIDTH = 100  # least columns of a table written to a file or pipe
TABLE_MARGIN = 90  # columns besides the policy name

InvalidValues = Annotated[
    OnInvalid,
    typer.Option(
        help="error: stop at the first invalid value; drop: leave out the episodes with "
        "invalid values (NaN/inf, bad probabilities, out-of-range actions or states, "
        "duplicate or missing steps, nulls) and report how many were dropped, and why; an "
        "episode id found in two places (a split episode) still stops the run."
    ),
]
RankBy = Annotated[
    str | None,
    typer.Option(
        metavar=one_of(*names()),
        help="Estimator that ranks several policies, highest first (the table's rank "
        "column and each JSON result's rank); the best is highlighted. Default: wis, or the "
        "first reported estimator without it. dm, dr and wdr need a Q source (--q).",
    ),
]
PlotDir = Annotated[
    str | None,
    typer.Option(
        metavar="DIR",
        help="Also write PNG figures into DIR: log10 weight histogram, per-step "
        "WPDIS and mean weight, estimates with intervals, and the policies' ranking "
        "(figures already there need --overwrite). Needs matplotlib: "
        "pip install 'ope-cli\\[plot]'.",  # \[ : not rich markup
    ),
]


def _scope(gamma: float | None, estimator: list[str] | None) -> ConfigFields:
    return dict(gamma=gamma, estimators=estimator_names(estimator))


# ope evaluate's options beyond the shared groups, each run of them one parameter
SCOPE = OptionGroup((("gamma", DeclaredGamma, None), ("estimator", Estimators, None)), _scope)
ESTIMATES = merged_group(intervals=INTERVALS, choosing=CHOOSING, runtime=RUNTIME)
# the run's own options, in their declared order (--on-invalid, in the "Data and columns" panel, is one)
RUN_OPTIONS = options_group(
    ("quiet", Quiet, False),
    ("on_invalid", InvalidValues, OnInvalid.error),
    ("rank_by", RankBy, None),
    ("plot", PlotDir, None),
    ("overwrite", Overwrite, False),
)
READING = merged_group(batching=BATCHING, columns=column_group(*COLUMN_OPTIONS))


@option_groups(
    sources=POLICY_SOURCES,
    scope=SCOPE,
    output=EVALUATE_OUTPUT,
    estimates=ESTIMATES,
    run_options=RUN_OPTIONS,
    cluster=CLUSTER,
    reading=READING,
)
def evaluate(
    data: Data,
    *,
    sources: ConfigFields,  # --policy, --behavior ... --q ... --v-samples
    scope: ConfigFields,  # --gamma, --estimator
    output: OutputFormat,  # --format
    estimates: ConfigFields,  # --confidence ... --seed, --baseline ... --top-k, --precision, --devices
    run_options: dict,  # --quiet, --on-invalid, --rank-by, --plot, --overwrite
    cluster: DistributedConfig,  # the "Cluster" panel
    reading: ConfigFields,  # the "Batching" and "Columns" panels
) -> None:
    """Estimate each policy's value from the logged episodes in DATA.

    Examples:

      ope evaluate logs.parquet --policy ckpt.npz --gamma 0.99

      ope evaluate logs/ -p a.npz -p b.npz -f json | jq '.results[].estimates.wis'

      ope evaluate logs.parquet -p mypkg.models:policy --obs-col features

      ope evaluate minari_logs/ --policy ckpt.npz --behavior behavior.npz

      ope evaluate logs.parquet --policy ckpt.npz --behavior estimate

      ope evaluate logs.parquet --policy ckpt.npz --q fit

      ope evaluate logs.parquet -p 'ckpts/*.npz' --baseline behavior
    """
    shown = dict(run_options)
    on_invalid = shown.pop("on_invalid")
    config = EvaluationConfig(
        data=data, **sources, **scope, **estimates, **reading, on_invalid=on_invalid.value
    )
    run_and_report(config, cluster, output, **shown)


def run_and_report(
    config: EvaluationConfig,
    cluster: DistributedConfig,
    chosen: OutputFormat,
    rank_by: str | None,
    plot: str | None,
    quiet: bool,
    overwrite: bool = False,
) -> None:
    """Checks the output options, runs the evaluation (with progress), writes the figures,
    then the result on stdout, from process 0 only."""
    from ope_cli.estimation.pipeline import evaluate as run_evaluation

    if rank_by is not None:  # else the default (``resolve_rank_by``)
        rank_by = check_rank_by(rank_by, reported_estimators(config))
    if plot is not None:
        from ope_cli.outputs import refuse_existing
        from ope_cli.report.plots import FIGURES, check_plot_directory, require_matplotlib

        require_matplotlib()  # before the run, not after it
        check_plot_directory(plot)
        refuse_existing((Path(plot) / name for name in FIGURES), overwrite)
    # pipeline.evaluate configures the runtime (ope_cli.runtime), around joining a cluster.
    try:
        with ProgressDisplay(quiet) as (on_progress, on_status), stdout_kept_for_the_result():
            result = run_evaluation(
                config, on_progress=on_progress, distributed=cluster, on_status=on_status
            )
    except InvalidValueError as error:  # the same line, and where to go from there
        fix = invalid_data_fix(config, error.droppable, error.reason)
        fixed = InvalidValueError(f"{error}; {fix}", error.droppable, error.reason)
        fixed.kind = error.kind  # another process's: "error in another process"
        raise fixed from None
    if result.runtime.process_id != 0:
        return  # every process holds the reduced result; process 0 prints it
    if plot is not None:  # before the result: a figure that cannot be written leaves stdout empty
        from ope_cli.report.plots import write_plots

        written = write_plots(result, plot, rank_by)
        if not quiet:
            say(f"figures: {', '.join(str(p) for p in written)}")
    write_result(result, chosen, rank_by)
    if chosen is not OutputFormat.table and not quiet:  # the table says them in its footer
        from ope_cli.report.table import ranked_warnings

        say_warnings(warning.message for warning in ranked_warnings(result, rank_by))


def write_result(result: EvaluationResult, chosen: OutputFormat, rank_by: str | None) -> None:
    """The result on stdout in the chosen format."""
    from ope_cli.report import render_table, to_csv, to_json

    if chosen is OutputFormat.json:
        sys.stdout.write(to_json(result, rank_by) + "\n")
    elif chosen is OutputFormat.csv:
        sys.stdout.write(to_csv(result, rank_by))
    else:
        longest = max(len(r.shown) for r in result.results)  # no policy label is cut
        render_table(result, table_console(max(TABLE_WIDTH, longest + TABLE_MARGIN)), rank_by)


# problems ``ope inspect`` does not look for: the critic columns are evaluate's options
NOT_INSPECTED = ("critic_not_finite",)


def invalid_data_fix(
    config: EvaluationConfig, droppable: bool = True, reason: str | None = None
) -> str:
    """What to do about invalid data: see every problem (where ``ope inspect`` looks for
    the ``reason``'s kind: it sent NaN in a --q-col to an inspect that said "valid"), or
    (where drop applies to it) leave its episodes out."""
    ways = [] if reason in NOT_INSPECTED else [f"every problem: ope inspect {config.data}"]
    if config.on_invalid != "drop" and droppable:
        ways.append("to leave out the invalid episodes and report them: --on-invalid drop")
    return "; ".join(ways) or "fix the values"
