"""Formatters: result objects -> text. They read ``ope_cli.results`` (and the inspect
report) only, never the pipeline, and number formatting lives in ``formatting``.

- ``table``: the evaluate tables (rich); ``json_format``: the JSON document;
  ``csv_format``: CSV; ``inspect``: ``ope inspect`` as JSON or tables;
  ``plots``: PNG figures (matplotlib, optional).
"""

from ope_cli.report.csv_format import DIAGNOSTIC_FIELDS, to_csv
from ope_cli.report.json_format import SCHEMA_VERSION, to_json, to_json_dict
from ope_cli.report.table import (
    SPARK,
    diagnostic_warnings,
    rank_policies,
    render_table,
    resolve_rank_by,
    weight_sparklines,
)
from ope_cli.report.warnings import dropped_line

FORMATS = ("table", "json", "csv")

__all__ = [
    "DIAGNOSTIC_FIELDS",
    "FORMATS",
    "SCHEMA_VERSION",
    "SPARK",
    "diagnostic_warnings",
    "dropped_line",
    "rank_policies",
    "render_table",
    "resolve_rank_by",
    "to_csv",
    "to_json",
    "to_json_dict",
    "weight_sparklines",
]
