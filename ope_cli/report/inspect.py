"""``ope inspect`` output: the report of ``ope_cli.inspect`` as one JSON document or as
rich tables. Reads the report object only."""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING, Any

from rich.table import Table

from ope_cli.errors import NO_EPISODES
from ope_cli.estimation.run_plan import GAMMA_SOURCES
from ope_cli.report.formatting import (
    document_header,
    from_log,
    json_number,
    resolved,
    significant,
)
from ope_cli.report.layout import print_whole
from ope_cli.report.warnings import default_gamma_warning, replaced_gamma_warning

if TYPE_CHECKING:  # the report's type only: formatters do not import the data path
    from ope_cli.inspection import InspectReport


def to_json_dict(report: InspectReport) -> dict[str, Any]:
    s = report.schema
    return {
        **document_header("inspect"),
        "dataset": _dataset_dict(report),
        "gamma": report.gamma,
        "gamma_source": report.gamma_source,  # option (--gamma), data (declared) or default
        # per-step rewards of the valid episodes: mean, std, min, max
        "reward": {k: json_number(v) for k, v in report.rewards.reward_stats().items()},
        # the discounted return of each valid episode: "value" (its mean: the logging
        # policy's value) with its "stderr", "std", "min", "max" and "quantiles"
        "return": _return_dict(report),
        "counts": _counts_dict(report),
        "length_histogram": [
            {"min": low, "max": high, "episodes": count}
            for low, high, count in report.length_histogram()
        ],
        "behavior_prob": None
        if report.behavior_min is None
        else {
            "kind": "probability" if s.action_kind == "discrete" else "density",
            "min": json_number(report.behavior_min),
            # ln of the min: a log column's e^-801 is a min of 0.0 in float64
            "log_min": json_number(report.behavior_log_min),
            "median": json_number(report.behavior_median),
            "max": json_number(report.behavior_max),
        },
        "action_counts": None
        if report.action_counts is None
        else {str(action): count for action, count in sorted(report.action_counts.items())},
        "other_actions": report.other_actions,
        "problems": [_problem_dict(p) for p in report.problems],
        "valid": report.ok,
        # {code, message, policy} as evaluate's: the default gamma on long episodes
        "warnings": [w.to_dict() for w in inspect_warnings(report)],
    }


def inspect_warnings(report: InspectReport) -> list:
    """What inspect warns about: returns summed undiscounted by default (evaluate's
    gamma_default; inspect printed returns and a logging-policy value at gamma 1 without
    a word), or discounted by a --gamma that is not the data's declared one."""
    warnings = [
        default_gamma_warning(report.gamma_source, report.max_length or 0),
        replaced_gamma_warning(
            report.gamma,
            report.gamma_source,
            report.declared.gamma,
            "the returns and the logging policy's value shown are",
        ),
    ]
    return [w for w in warnings if w is not None]


def _dataset_dict(report: InspectReport) -> dict[str, Any]:
    """The inspected data: where it is, its layout, columns, spaces and declared bounds."""
    s = report.schema
    return {
        "source": report.source,
        "format": report.format,
        "files": report.files,
        "layout": s.layout,
        "columns": {
            role: {"name": name, "type": report.column_types[role]}
            for role, name in s.columns.items()
        },
        "observation": None
        if s.observation_kind is None
        else {"kind": s.observation_kind, "dim": report.observation_dim},
        "action": {"kind": s.action_kind, "vector": s.action_is_vector},
        # None: no propensity column (ope evaluate then needs --behavior)
        "behavior": None if not s.behavior_logged else "log_prob" if s.behavior_is_log else "prob",
        "target": s.target,
        "declared": _declared_dict(report),
    }


def _counts_dict(report: InspectReport) -> dict[str, Any]:
    """The rows, episodes and steps read, valid and invalid, and the episodes' lengths."""
    return {
        "rows_read": report.rows_read,
        "episodes": report.episodes + report.invalid_episodes,
        "steps": report.steps + report.invalid_steps,
        "valid_episodes": report.episodes,
        "valid_steps": report.steps,
        "invalid_episodes": report.invalid_episodes,
        "invalid_steps": report.invalid_steps,
        "min_length": report.min_length,
        "max_length": report.max_length,
        "mean_length": report.steps / report.episodes if report.episodes else None,
    }


def _problem_dict(p) -> dict[str, Any]:
    return {
        "reason": p.reason,
        "message": p.message,
        "episodes": p.episodes,
        "steps": p.steps,
        "file": p.file,
        "episode": p.episode,
        "step": p.step,
    }


def _declared_dict(report: InspectReport) -> dict[str, Any]:
    """The bounds the metadata declares (null when not), and its gamma when it has one."""
    declared = report.declared
    entry: dict[str, Any] = {
        "reward_range": list(declared.reward_range) if declared.reward_range else None,
        "horizon": declared.horizon,
    }
    if declared.gamma is not None:
        entry["gamma"] = declared.gamma
    return entry


def _return_dict(report: InspectReport) -> dict[str, Any]:
    stats = report.rewards.return_stats()
    quantiles = {k: json_number(v) for k, v in stats.pop("quantiles").items()}
    return {**{k: json_number(v) for k, v in stats.items()}, "quantiles": quantiles}


def _reward_lines(doc: dict[str, Any]) -> list[str]:
    """Per-step rewards, and the discounted return with the logging policy's value."""
    reward, returns = doc["reward"], doc["return"]
    if reward["mean"] is None:
        return []
    source = GAMMA_SOURCES.get(doc["gamma_source"], doc["gamma_source"])
    # each to its spread's second digit (``resolved``): rewards of 1e8 + N(0, 1) read
    # "mean 1e+08, min 1e+08, max 1e+08", a constant
    spread, spread_g = reward["std"], returns["std"]
    lines = [
        f"reward per step (valid episodes): mean {resolved(reward['mean'], spread)}, std "
        f"{significant(reward['std'])}, min {resolved(reward['min'], spread)}, max "
        f"{resolved(reward['max'], spread)}",
        f"discounted return (gamma={doc['gamma']:g}, {source}): "
        + ", ".join(
            f"{k} {resolved(v, spread_g)}"
            for k, v in (
                ("min", returns["min"]),
                *returns["quantiles"].items(),
                ("max", returns["max"]),
            )
        ),
        "logging policy's value (mean discounted return): "
        f"{resolved(returns['value'], returns['stderr'])} ± {significant(returns['stderr'])} "
        "(standard error)",
    ]
    return lines


def to_json(report: InspectReport) -> str:
    return json.dumps(to_json_dict(report), indent=2, allow_nan=False, default=str)


def _schema_lines(report: InspectReport, counts: dict[str, Any]) -> list[str]:
    """What the schema says: observations, actions, behavior column, declared bounds, counts."""
    s = report.schema
    observation = (
        "none"
        if s.observation_kind is None
        else s.observation_kind
        + (f" (size {report.observation_dim})" if report.observation_dim else "")
    )
    action = s.action_kind + (" vectors" if s.action_is_vector else "")
    behavior = (
        "no behavior probability column (ope evaluate needs --behavior "
        "CKPT|package.module:name|estimate)"
        if not s.behavior_logged
        else "behavior column holds "
        + ("log-probabilities" if s.behavior_is_log else "probabilities")
    )
    lines = [
        f"observations: {observation}; actions: {action}; {behavior}"
        + (f"; target {s.target} logged" if s.target else "")
    ]
    declared, parts = report.declared, []
    if declared.reward_range:
        parts.append(f"rewards in [{declared.reward_range[0]:g}, {declared.reward_range[1]:g}]")
    if declared.horizon:
        parts.append(f"at most {declared.horizon} steps")
    if parts:
        lines.append(f"declared in the metadata (for betting intervals): {', '.join(parts)}")
    if declared.gamma is not None:
        lines.append(f"declared in the metadata: gamma {declared.gamma:g}")
    lengths = (
        f"valid episode lengths {report.min_length} to {report.max_length}"
        if report.episodes
        else "no valid episodes"
    )
    lines.append(
        f"episodes: {counts['episodes']:,} ({counts['invalid_episodes']:,} invalid); steps: "
        f"{counts['steps']:,} ({counts['invalid_steps']:,} in invalid episodes); {lengths}"
    )
    return lines


def _columns_table(report: InspectReport) -> Table:
    columns = Table(title="columns", title_justify="left")
    for name in ("role", "column", "type"):
        columns.add_column(name)
    for role, name in report.schema.columns.items():
        columns.add_row(role, name, report.column_types[role])
    return columns


def _lengths_table(report: InspectReport) -> Table:
    histogram = Table(title="episode lengths (valid episodes)", title_justify="left")
    histogram.add_column("length", justify="right")
    histogram.add_column("episodes", justify="right")
    histogram.add_column("")
    largest = max(count for _, _, count in report.length_histogram()) or 1
    for low, high, count in report.length_histogram():
        histogram.add_row(
            str(low) if low == high else f"{low}-{high}",
            f"{count:,}",
            "#" * math.ceil(30 * count / largest) if count else "",
        )
    return histogram


def _actions_table(report: InspectReport) -> Table:
    actions = Table(title="actions (valid episodes)", title_justify="left")
    actions.add_column("action", justify="right")
    actions.add_column("steps", justify="right")
    actions.add_column("share", justify="right")
    ranked = sorted(report.action_counts.items(), key=lambda item: (-item[1], item[0]))
    for action, count in ranked[:20]:
        actions.add_row(str(action), f"{count:,}", f"{count / max(report.steps, 1):.1%}")
    rest = sum(count for _, count in ranked[20:]) + report.other_actions
    if rest:
        actions.add_row(
            f"{len(ranked) - 20 if len(ranked) > 20 else 0} more + other",
            f"{rest:,}",
            f"{rest / max(report.steps, 1):.1%}",
        )
    return actions


def _problems_table(report: InspectReport) -> Table:
    problems = Table(title=f"validation problems ({len(report.problems)})", title_justify="left")
    for name, justify in (
        ("reason", "left"),
        ("problem", "left"),
        ("episodes", "right"),
        ("steps affected", "right"),
        ("first at", "left"),
    ):
        problems.add_column(name, justify=justify, overflow="fold")
    for p in report.problems:
        problems.add_row(p.reason, p.message, f"{p.episodes:,}", f"{p.steps:,}", p.location)
    return problems


def render_table(report: InspectReport, console) -> None:
    """The report as rich tables (``console`` is a rich Console on stdout)."""
    doc = to_json_dict(report)
    counts = doc["counts"]
    console.print(
        f"[bold]{report.source}[/bold]: {report.format}, {report.files} file(s), "
        f"{report.schema.layout} layout, {counts['rows_read']:,} rows read",
        highlight=False,
    )
    print_whole(console, _columns_table(report))
    lines = _schema_lines(report, counts)
    for line in lines:
        console.print(line, highlight=False)
    if report.episodes:
        print_whole(console, _lengths_table(report))
    if doc["behavior_prob"] is not None:
        b = doc["behavior_prob"]
        console.print(
            f"behavior {b['kind']} (valid episodes): min {from_log(b['log_min'])}, "
            f"median {significant(b['median'])}, max {significant(b['max'])}",
            highlight=False,
        )
    for line in _reward_lines(doc):
        console.print(line, highlight=False)
    if report.action_counts is not None:
        print_whole(console, _actions_table(report))
    for warning in doc["warnings"]:
        console.print(f"warning: {warning['message']}", style="yellow", markup=False)
    if report.ok:
        console.print("no validation problems found", highlight=False)
        return
    if not report.problems:
        console.print(NO_EPISODES, highlight=False)
        return
    print_whole(console, _problems_table(report))
