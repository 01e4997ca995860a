"""``ope fit-q DATA --policy P --out Q.npz``: fitted Q evaluation of pi_e, written as a Q
checkpoint; prints the fit's diagnostics and the dm estimate."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from ope_cli.cli.console import stdout_kept_for_the_result, table_console
from ope_cli.cli.groups import WRITTEN, Written
from ope_cli.cli.helpmap import one_of
from ope_cli.cli.options import (
    Data,
    DeclaredGamma,
    InspectFormat,
    Overwrite,
    ReadRows,
    VSamples,
    column_group,
    option_groups,
    options_group,
)
from ope_cli.config import BatchingConfig, ColumnMapping, QConfig
from ope_cli.errors import UsageError
from ope_cli.models.q_models.base import MODELS as Q_MODELS

QModel = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        metavar=one_of(*Q_MODELS),
        help="Q model: tabular (the empirical MDP solved exactly), linear (LSTDQ) or mlp. "
        "Default: tabular for integer states, linear for other observations, mlp for "
        "continuous actions.",
    ),
]
Ridge = Annotated[
    float | None,
    typer.Option(help="Ridge of the linear model. Default: 1e-6 x the number of steps."),
]
FitSeed = Annotated[
    int | None,
    typer.Option(help="Seed of the mlp model (and of sampled actions). Default: 0."),
]
# the fit's own options: FitQConfig's model, gamma, ridge, seed and v_samples
FIT = options_group(
    ("model", QModel, None),
    ("gamma", DeclaredGamma, None),
    ("ridge", Ridge, None),
    ("seed", FitSeed, None),
    ("v_samples", VSamples, QConfig.v_samples),
)


@option_groups(
    fit=FIT,
    output=WRITTEN,
    columns=column_group("episode", "step", "observation", "action", "reward"),
)
def fit_q(
    data: Data,
    *,
    policy: Annotated[
        list[str],
        typer.Option(
            "--policy", "-p", help="Evaluation policy: checkpoint .npz or entry point module:name."
        ),
    ],
    out: Annotated[
        str, typer.Option("--out", "-o", help="Q checkpoint .npz to write (usable as --q).")
    ],
    fit: dict,  # --model, --gamma, --ridge, --seed
    overwrite: Overwrite = False,
    output: Written,  # --format, --quiet
    read_rows: ReadRows = BatchingConfig.read_rows,
    columns: ColumnMapping,  # the "Columns" panel
) -> None:
    """Fit the evaluation policy's action values Q(s, a) on DATA (fitted Q evaluation).

    The next observation is the next step's; the last step of an episode is terminal.
    Prints the fit's Bellman residuals and the dm estimate (mean V of the initial states).

    Example: ope fit-q logs.parquet --policy ckpt.npz --gamma 0.99 --out q.npz
    """
    from ope_cli.models.q_models.base import check_q_model_name
    from ope_cli.models.q_models.command import FitQConfig

    if len(policy) != 1:  # a repeated option would otherwise keep the last one silently
        raise UsageError(
            f"--policy is given {len(policy)} times: ope fit-q fits one policy's Q; run it "
            "once per policy (or ope evaluate --q fit for several)"
        )
    if fit["model"] is not None:
        check_q_model_name(fit["model"])
    config = FitQConfig(
        data=data,
        policy=policy[0],
        out=out,
        **fit,
        columns=columns,
        read_rows=read_rows,
        overwrite=overwrite,
    )
    _fit_and_print(config, output)


def _fit_and_print(config, output: Written) -> None:
    """Runs ``ope fit-q``'s fit (in float64) and prints its result as ``output``."""
    from ope_cli import runtime
    from ope_cli.models.q_models.command import run_fit_q
    from ope_cli.report.fit_q import render_table, to_json

    runtime.enable_x64()  # the fits run in float64
    with stdout_kept_for_the_result():
        result = run_fit_q(config)
    if output.format is InspectFormat.json:
        sys.stdout.write(to_json(result) + "\n")
        output.say_warnings(warning["message"] for warning in result.warnings)
    else:
        render_table(result, table_console(width=120))
