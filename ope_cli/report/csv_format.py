"""``ope evaluate --format csv``: one row per policy x estimator."""

from __future__ import annotations

import csv
import dataclasses
import io

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
# policy's label and rank, and the warnings that concern the row's policy or the whole run
EXTRA = ("ci_method", "note", "label", "rank", "warnings")
# --baseline: the row's paired difference from the baseline (empty on the baseline's rows);
# with several policies whether it could be the best by the row's estimator; --truth: the
# estimator's selection metrics ("selection_" + metric), the same on each of its rows
COMPARISON = ("delta", "delta_stderr", "delta_ci_low", "delta_ci_high", "p_improvement")
CHOICE = (*COMPARISON, "could_be_best")
WARNING_SEPARATOR = " | "


def to_csv(result: EvaluationResult, rank_by: str | None = None) -> str:
    """One row per policy x estimator; the policy's diagnostics, rank and warnings repeat on
    each of its rows (a warning is "code: message"). Numbers are written exactly
    (``repr``); an undefined number is an empty cell."""
    rank_by = resolve_rank_by(result, rank_by)
    ranks = rank_policies(result, rank_by)
    warnings = run_warnings(result, ranks, rank_by)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    metrics = list(next(iter(result.selection.values()))) if result.selection else []
    writer.writerow((*HEADER, *EXTRA, *CHOICE, *(f"selection_{m}" for m in metrics)))
    for policy, rank in zip(result.results, ranks, strict=True):
        diagnostics = dataclasses.asdict(policy.diagnostics)
        concerning = WARNING_SEPARATOR.join(
            f"{w.code}: {w.message}" for w in warnings if w.policy in (None, policy.policy)
        )
        for name, e in policy.estimates.items():
            cells = [
                e.value,
                e.stderr,
                e.ci_low,
                e.ci_high,
                *(diagnostics[k] for k in DIAGNOSTIC_FIELDS),
            ]
            numbers = ("" if c is None else repr(float(c)) for c in cells)
            extra = (
                policy.ci_methods.get(name) or "",
                e.note or "",
                policy.shown,
                "" if rank is None else rank,
                concerning,
            )
            chosen = (*_comparison_cells(policy, name), *_selection_cells(result, name, metrics))
            writer.writerow([policy.policy, name, *numbers, *extra, *chosen])
    return out.getvalue()


def _number(x) -> str:
    return "" if x is None else repr(float(x))


def _comparison_cells(policy, name: str) -> list[str]:
    """The CHOICE cells of one policy and estimator."""
    c = (policy.comparison or {}).get(name)
    cells = (
        ["" for _ in COMPARISON]
        if c is None
        else [_number(x) for x in (c.delta, c.stderr, c.ci_low, c.ci_high, c.p_improvement)]
    )
    flags = policy.could_be_best or {}
    cells.append("" if name not in flags else str(flags[name]).lower())
    return cells


def _selection_cells(result: EvaluationResult, name: str, metrics: list[str]) -> list[str]:
    own = (result.selection or {}).get(name, {})
    return [_number(own.get(metric)) for metric in metrics]
