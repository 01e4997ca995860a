"""``ope evaluate --format csv``: one row per policy x estimator."""

from __future__ import annotations

import csv
import dataclasses
import io

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


def to_csv(result: EvaluationResult) -> str:
    """One row per policy x estimator; the policy's diagnostics repeat on each of its rows.
    Numbers are written exactly (``repr``); an undefined number is an empty cell."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(HEADER)
    for policy in result.results:
        diagnostics = dataclasses.asdict(policy.diagnostics)
        for name, e in policy.estimates.items():
            cells = [
                e.value,
                e.stderr,
                e.ci_low,
                e.ci_high,
                *(diagnostics[k] for k in DIAGNOSTIC_FIELDS),
            ]
            writer.writerow(
                [policy.policy, name, *("" if c is None else repr(float(c)) for c in cells)]
            )
    return out.getvalue()
