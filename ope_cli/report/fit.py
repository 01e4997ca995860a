"""``ope fit-behavior``: the fit's diagnostics as one JSON document or as tables."""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from ope_cli.report.formatting import count, document_header, json_number, significant

if TYPE_CHECKING:  # annotations only: formatters do not import the fitting code
    from ope_cli.models.behavior_models.command import FitBehaviorResult


def to_json_dict(result: FitBehaviorResult, command: str = "fit-behavior") -> dict[str, Any]:
    """The result of ``command`` (fit-behavior, fit-q) as plain JSON values (non-finite
    numbers as null), after the header every document has."""

    def clean(value: Any) -> Any:
        if isinstance(value, float):
            return json_number(value)
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list):
            return [clean(v) for v in value]
        return value

    return {**document_header(command), **clean(dataclasses.asdict(result))}


def to_json(result: FitBehaviorResult) -> str:
    return json.dumps(to_json_dict(result), indent=2, allow_nan=False)


def render_table(result: FitBehaviorResult, console: Console) -> None:
    """The fit (model, data, log-likelihoods) and, with logged propensities, how far the
    estimated probabilities are from them, with a calibration table for discrete actions."""
    fit = Table(
        title=f"behavior model {result.model} -> {result.out}",
        title_justify="left",
        show_header=False,
    )
    fit.add_column("")
    fit.add_column("", justify="right")
    fit.add_row("fitted on", f"{count(result.episodes)} episodes, {count(result.steps)} steps")
    fit.add_row("mean log-likelihood (in-sample)", significant(result.mean_log_likelihood))
    fit.add_row(
        f"mean log-likelihood (held out: {count(result.heldout_episodes)} episodes by id hash)",
        significant(result.heldout_mean_log_likelihood),
    )
    fit.add_row("seconds", f"{result.seconds:.2f}")
    console.print(fit)
    logged = result.logged
    if logged is None:
        why = result.logged_note or "no logged propensity column to compare with"
        console.print(Text(why, style="dim"))
        return
    console.print(
        Text(
            f"against the logged column {logged.column!r} over {count(logged.steps)} steps: "
            f"log(logged / estimated) mean {significant(logged.mean_log_ratio)}, mean absolute "
            f"{significant(logged.mean_abs_log_ratio)}, max absolute "
            f"{significant(logged.max_abs_log_ratio)}"
        )
    )
    if logged.calibration:
        console.print(_calibration_table(logged.calibration))
    for warning in result.warnings:
        console.print(f"warning: {warning['message']}", style="yellow", markup=False)


def _calibration_table(calibration) -> Table:
    """Steps by estimated probability, with the mean logged probability of each bin."""
    table = Table(title="calibration (steps by estimated probability)", title_justify="left")
    for name in ("estimated in", "steps", "mean estimated", "mean logged"):
        table.add_column(name, justify="right")
    for row in calibration:
        table.add_row(
            f"[{row.low:.1f}, {row.high:.1f})",
            count(row.steps),
            significant(row.mean_estimated),
            significant(row.mean_logged),
        )
    return table
