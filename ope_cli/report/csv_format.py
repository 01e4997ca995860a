"""``ope evaluate --format csv``: one row per policy x estimator."""

from __future__ import annotations

import csv
import dataclasses
import io
from typing import Any

from ope_cli.choosing.selection import BASELINE_BEHAVIOR
from ope_cli.report.table import rank_policies, resolve_rank_by
from ope_cli.report.warnings import run_warnings
from ope_cli.results import EvaluationResult

DIAGNOSTIC_FIELDS = (
    "ess",
    "ess_fraction",
    "mean_weight",
    "max_weight",
    "max_weight_share",
    "zero_weight_fraction",
)
HEADER = ("policy", "estimator", "value", "stderr", "ci_low", "ci_high", *DIAGNOSTIC_FIELDS)
# added after the spec's columns: the interval's method and the reason of a null one, the
# policy's label, rank and the estimator it ranks by, the warnings that concern the row's
# policy or the whole run, the run's discount with where it comes from (SPEC 12: every
# output says which), the intervals' confidence level (of the differences' too), and where
# the behavior probabilities and the row's policy's Q-hat come from (the table's footer
# lines: a CSV read alone did not say which Q dm, dr and wdr were computed with)
EXTRA = (
    "ci_method",
    "note",
    "label",
    "rank",
    "rank_by",
    "warnings",
    "gamma",
    "gamma_source",
    "ci_level",
    "behavior_source",
    "q_source",
)
# --baseline: the row's paired difference from the baseline (empty on the baseline's rows),
# the baseline (as given) and its value by the row's estimator (behavior: its mean return),
# and the difference's note (why its interval is missing, or what it is: a tie, a
# percentile fallback); with several policies whether it could be the best by the row's
# estimator; --truth: the estimator's selection metrics ("selection_" + metric), the same on
# each of its rows
COMPARISON = ("delta", "delta_stderr", "delta_ci_low", "delta_ci_high", "p_improvement")
CHOICE = (*COMPARISON, "baseline", "baseline_value", "delta_note", "could_be_best")
WARNING_SEPARATOR = " | "


def tidy_rows(
    result: EvaluationResult, rank_by: str | None = None
) -> tuple[list[str], list[list[Any]]]:
    """(column names, one row per policy x estimator) as Python values: numbers as floats,
    undefined ones None, could_be_best a bool (None: undetermined); the policy's
    diagnostics, rank and warnings repeat on each of its rows (a warning is "code:
    message")."""
    rank_by = resolve_rank_by(result, rank_by)
    ranks = rank_policies(result, rank_by)
    warnings = run_warnings(result, ranks, rank_by)
    metrics = list(next(iter(result.selection.values()))) if result.selection else []
    header = [*HEADER, *EXTRA, *CHOICE, *(f"selection_{m}" for m in metrics)]
    rows = []
    for policy, rank in zip(result.results, ranks, strict=True):
        diagnostics = dataclasses.asdict(policy.diagnostics)
        concerning = WARNING_SEPARATOR.join(
            f"{w.code}: {w.message}" for w in warnings if w.policy in (None, policy.policy)
        )
        for name, e in policy.estimates.items():
            c = (policy.comparison or {}).get(name)
            compared = (c.delta, c.stderr, c.ci_low, c.ci_high, c.p_improvement) if c else ()
            own = (result.selection or {}).get(name, {})
            rows.append(
                [
                    policy.policy,
                    name,
                    *(_float(x) for x in (e.value, e.stderr, e.ci_low, e.ci_high)),
                    *(_float(diagnostics[k]) for k in DIAGNOSTIC_FIELDS),
                    policy.ci_methods.get(name),
                    e.note,
                    policy.shown,
                    rank,
                    rank_by,
                    concerning,
                    _float(result.gamma),
                    result.gamma_source,
                    _float(result.confidence.level),
                    _behavior_line(result),
                    None if policy.q is None else policy.q.describe(),
                    *(_float(x) for x in compared or (None,) * len(COMPARISON)),
                    result.baseline if c else None,
                    _float(_baseline_value(result, name)) if c else None,
                    c.note if c else None,
                    (policy.could_be_best or {}).get(name),
                    *(_float(own.get(metric)) for metric in metrics),
                ]
            )
    return header, rows


def _behavior_line(result: EvaluationResult) -> str | None:
    """Where the behavior probabilities come from: the table footer's first line about them."""
    if result.behavior is None:
        return None
    return result.behavior.describe(timed=False).splitlines()[0]


def _baseline_value(result: EvaluationResult, name: str) -> float | None:
    """The baseline's value by estimator ``name``: the differences' reference (a CSV read
    alone did not say what they are measured against)."""
    if result.baseline == BASELINE_BEHAVIOR:
        return result.behavior_value
    for policy in result.results:
        if result.baseline in (policy.policy, policy.label, policy.source):
            return policy.estimates[name].value
    return None


def to_csv(result: EvaluationResult, rank_by: str | None = None) -> str:
    """``tidy_rows`` as CSV: numbers written exactly (``repr``), an undefined number or
    missing text an empty cell, booleans as true/false."""
    header, rows = tidy_rows(result, rank_by)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(header)
    for row in rows:
        writer.writerow([_cell(value) for value in row])
    return out.getvalue()


def _float(x) -> float | None:
    return None if x is None else float(x)


def _cell(value) -> str | int:
    if value is None:
        return ""
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, float):
        return repr(value)
    return value
