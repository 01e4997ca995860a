"""``ope fit-q``: the fit's diagnostics and the dm estimate as one JSON document or a table."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from ope_cli.estimation.run_plan import GAMMA_SOURCES
from ope_cli.report.fit import to_json_dict
from ope_cli.report.formatting import count, resolved, significant

if TYPE_CHECKING:  # annotations only: formatters do not import the fitting code
    from ope_cli.models.q_models.command import FitQResult


def to_json(result: FitQResult) -> str:
    """The result as one JSON document (non-finite numbers as null)."""
    return json.dumps(to_json_dict(result, "fit-q"), indent=2, allow_nan=False)


def render_table(result: FitQResult, console: Console) -> None:
    """The fit (model, data, Bellman errors) and the dm estimate."""
    table = Table(
        title=f"Q model {result.model} ({result.kind}) of {result.policy} -> {result.out}",
        title_justify="left",
        show_header=False,
    )
    table.add_column("")
    table.add_column("", justify="right")
    table.add_row("fitted on", f"{count(result.episodes)} episodes, {count(result.steps)} steps")
    table.add_row("gamma", f"{significant(result.gamma)} ({GAMMA_SOURCES[result.gamma_source]})")
    stderr = significant(result.dm_stderr)
    if result.dm_stderr_note:
        stderr += f" ({result.dm_stderr_note})"
    # to its standard error; without one, to 10 digits (V-hat of 1e8 + 0.1 s read 1e+08)
    dm = resolved(result.dm, result.dm_stderr) if result.dm_stderr else significant(result.dm, 10)
    table.add_row("dm estimate (mean V of the initial states)", dm)
    table.add_row("dm standard error (over initial states, Q taken as exact)", stderr)
    rmse = significant(result.bellman_rmse)
    if result.bellman_rmse_note:
        rmse += f" ({result.bellman_rmse_note})"
    table.add_row("Bellman residual RMSE (in-sample)", rmse)
    if result.ridge is not None:
        table.add_row("ridge", significant(result.ridge))
    if result.iterations is not None:
        converged = "converged" if result.converged else "not converged"
        if not result.heldout_steps:  # the change of Q was watched on the training steps
            converged += " on the training steps: too few episodes to hold a fifth out"
        table.add_row("iterations", f"{result.iterations} ({converged})")
        table.add_row(
            f"Bellman residual RMSE (held out: {count(result.heldout_steps or 0)} steps)",
            significant(result.heldout_bellman_rmse),
        )
    table.add_row("seconds", f"{result.seconds:.2f}")
    console.print(table)
    for warning in result.warnings:
        console.print(f"warning: {warning['message']}", style="yellow", markup=False)
