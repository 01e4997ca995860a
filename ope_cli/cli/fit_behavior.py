"""``ope fit-behavior DATA --out B.npz``: fit pi_b to the logged actions, write it as a
policy checkpoint, print the fit's diagnostics."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from ope_cli.cli.console import stdout_kept_for_the_result, table_console
from ope_cli.cli.groups import WRITTEN, Written
from ope_cli.cli.options import (
    BehaviorModelOption,
    Data,
    InspectFormat,
    Overwrite,
    ReadRows,
    column_group,
    option_groups,
)
from ope_cli.config import BatchingConfig, ColumnMapping


@option_groups(
    output=WRITTEN,
    columns=column_group(
        "episode", "step", "observation", "action", "behavior_prob", "behavior_log_prob"
    ),
)
def fit_behavior(
    data: Data,
    *,
    out: Annotated[
        str,
        typer.Option(
            "--out", "-o", help="Checkpoint .npz to write (usable as --behavior and --policy)."
        ),
    ],
    model: BehaviorModelOption = None,
    overwrite: Overwrite = False,
    output: Written,  # --format, --quiet
    read_rows: ReadRows = BatchingConfig.read_rows,
    columns: ColumnMapping,  # the "Columns" panel
) -> None:
    """Fit the behavior policy to the logged actions in DATA; write it as a checkpoint.

    Maximum likelihood; prints the mean log-likelihood in-sample and of held-out episodes
    and, where the data also logs propensities, how far the estimate is from them.

    Examples (the second uses the first's checkpoint):

      ope fit-behavior logs.parquet --out behavior.npz

      ope evaluate logs.parquet -p ckpt.npz --behavior behavior.npz
    """
    from ope_cli.models.behavior_models.base import check_model_name
    from ope_cli.models.behavior_models.command import FitBehaviorConfig, run_fit_behavior
    from ope_cli.report.fit import render_table, to_json

    if model is not None:
        check_model_name(model)
    config = FitBehaviorConfig(
        data=data,
        out=out,
        model=model,
        columns=columns,
        read_rows=read_rows,
        overwrite=overwrite,
    )
    from ope_cli import runtime

    runtime.enable_x64()  # the iterative models fit in float64
    with stdout_kept_for_the_result():
        result = run_fit_behavior(config)
    if output.format is InspectFormat.json:
        sys.stdout.write(to_json(result) + "\n")
        output.say_warnings(warning["message"] for warning in result.warnings)
    else:
        render_table(result, table_console(width=120))
