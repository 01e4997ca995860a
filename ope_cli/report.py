"""Result objects -> a rich table, one JSON document (schema_version 1), or CSV."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
from typing import Any

from rich.console import Console
from rich.table import Table

from ope_cli import __version__
from ope_cli.pipeline import EvaluationResult

SCHEMA_VERSION = 1
FORMATS = ("table", "json", "csv")
ESTIMATOR_TITLES = {"is": "IS", "wis": "WIS", "pdis": "PDIS", "wpdis": "WPDIS"}
DIAGNOSTIC_FIELDS = ("ess", "ess_fraction", "mean_weight", "max_weight", "max_weight_share",
                     "zero_weight_fraction")


def _number(x: float | None) -> float | None:
    """JSON-safe number: NaN/inf become null (the spec forbids NaN in the output)."""
    return x if x is not None and math.isfinite(x) else None


def to_json_dict(result: EvaluationResult) -> dict[str, Any]:
    """The spec's JSON document (section 5); extra fields are additions, none renamed."""
    results = []
    for policy in result.results:
        estimates = {}
        for name, estimate in policy.estimates.items():
            entry = {k: _number(getattr(estimate, k)) for k in ("value", "stderr", "ci_low", "ci_high")}
            if estimate.note:
                entry["note"] = estimate.note
            estimates[name] = entry
        results.append({
            "policy": policy.policy,
            "estimates": estimates,
            "diagnostics": {k: _number(v) for k, v in dataclasses.asdict(policy.diagnostics).items()},
        })
    return {
        "schema_version": SCHEMA_VERSION,
        "tool": {"name": "ope", "version": __version__},
        "dataset": {
            "source": result.source,
            "layout": result.layout,
            "files": result.files,
            "episodes": result.episodes,
            "steps": result.steps,
            "rows_read": result.rows_read,
            "max_length": result.max_length,
        },
        "gamma": result.gamma,
        "confidence": {"level": result.confidence_level, "method": result.confidence_method},
        "results": results,
        "runtime": {
            "seconds": result.seconds,
            "steps_per_second": result.steps_per_second,
            "backend": result.backend,
            "devices": result.devices,
            "processes": result.processes,
            "precision": result.precision,
            "padded_steps": result.padded_steps,
            "batch_shapes": [list(shape) for shape in result.batch_shapes],
            "compiles": result.compiles,
        },
    }


def to_json(result: EvaluationResult) -> str:
    return json.dumps(to_json_dict(result), indent=2, allow_nan=False)


def to_csv(result: EvaluationResult) -> str:
    """One row per policy x estimator; the policy's diagnostics repeat on each of its rows."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["policy", "estimator", "value", "stderr", "ci_low", "ci_high", *DIAGNOSTIC_FIELDS])
    for policy in result.results:
        diagnostics = dataclasses.asdict(policy.diagnostics)
        for name, e in policy.estimates.items():
            cells = [e.value, e.stderr, e.ci_low, e.ci_high, *(diagnostics[k] for k in DIAGNOSTIC_FIELDS)]
            writer.writerow([policy.policy, name, *("" if c is None else repr(float(c)) for c in cells)])
    return out.getvalue()


def _fmt(x: float | None, spec: str = ".4g") -> str:
    return "n/a" if x is None else format(x, spec)


def render_table(result: EvaluationResult, console: Console) -> None:
    """Estimates per policy (value, stderr, interval) and a diagnostics block."""
    level = f"{result.confidence_level:.0%}"
    title = (f"{result.source}: {result.episodes:,} episodes, {result.steps:,} steps "
             f"({result.layout} layout), gamma={result.gamma:g}")
    table = Table(title=title, title_justify="left")
    table.add_column("policy", style="bold", overflow="fold")
    table.add_column("estimator")
    table.add_column("value", justify="right")
    table.add_column("std. err.", justify="right")
    table.add_column(f"{level} interval", justify="right")
    for i, policy in enumerate(result.results):
        for j, (name, e) in enumerate(policy.estimates.items()):
            interval = "n/a" if e.ci_low is None else f"[{_fmt(e.ci_low)}, {_fmt(e.ci_high)}]"
            value = _fmt(e.value) if e.note is None or e.value is not None else f"n/a ({e.note})"
            table.add_row(policy.policy if j == 0 else "", ESTIMATOR_TITLES[name], value,
                          _fmt(e.stderr), interval, end_section=j == len(policy.estimates) - 1
                          and i < len(result.results) - 1)
    console.print(table)

    diagnostics = Table(title="weight diagnostics (trajectory weights)", title_justify="left")
    for column in ("policy", "ESS", "ESS / n", "mean weight", "max weight", "max share", "zero weights"):
        diagnostics.add_column(column, justify="left" if column == "policy" else "right",
                               overflow="fold")
    for policy in result.results:
        d = policy.diagnostics
        diagnostics.add_row(policy.policy, _fmt(d.ess, ".1f"), _fmt(d.ess_fraction, ".1%"),
                            _fmt(d.mean_weight), _fmt(d.max_weight), _fmt(d.max_weight_share, ".1%"),
                            _fmt(d.zero_weight_fraction, ".1%"))
    console.print(diagnostics)
    console.print(f"[dim]intervals: {result.confidence_method}[/dim]")
