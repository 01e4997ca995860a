"""Helpers of the behavior-policy tests (test_behavior.py, test_fit_behavior.py): logs
without their propensity column, and two evaluations' estimates compared."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

FIELDS = ("value", "stderr", "ci_low", "ci_high")  # compared for every estimate


def drop_propensities(logs: Path, out: Path) -> Path:
    """Writes ``logs`` without its behavior-probability columns (behavior_prob,
    behavior_log_prob) to ``out``; returns ``out``."""
    table = pq.read_table(logs)
    keep = [name for name in table.column_names if not name.startswith("behavior")]
    pq.write_table(table.select(keep), out)
    return out


def assert_same_estimates(left: dict, right: dict, rtol: float = 1e-6) -> None:
    """Two ``--format json`` documents give every policy the same estimates (FIELDS, to
    ``rtol`` relative or 1e-12 absolute; None where the other is None)."""
    assert len(left["results"]) == len(right["results"])
    for a, b in zip(left["results"], right["results"], strict=True):
        for name, estimate in a["estimates"].items():
            for field in FIELDS:
                expected, actual = estimate[field], b["estimates"][name][field]
                if expected is None:
                    assert actual is None, (name, field)
                else:
                    assert actual == pytest.approx(expected, rel=rtol, abs=1e-12), (name, field)
