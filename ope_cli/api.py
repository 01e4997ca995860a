"""The Python API a notebook user writes: the command line's options as keywords.

    import ope_cli

    run = ope_cli.evaluate("logs.parquet", policies=["a.npz", "b.npz"], gamma=0.99,
                           baseline="behavior", ci="bootstrap-t")
    run.to_dict()["results"][0]["estimates"]["wis"]["value"]   # the JSON document
    run.to_pandas()                                            # one row per policy x estimator

``evaluate`` and ``inspect`` take the data and every option of their command as keywords:
the config records' field names (``EvaluationConfig``, ``BatchingConfig``, ``ColumnMapping``)
or the command line's spellings (``policy``, ``estimator``, ``ci``, ``obs_col`` ...); a
single string where a command repeats an option (``policies="a.npz"``) is one value. The
config records stay for those who build them: ``evaluate(EvaluationConfig(...))``. An
unknown keyword is a UsageError naming it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from ope_cli.config import BatchingConfig, ColumnMapping, EvaluationConfig
from ope_cli.errors import UsageError
from ope_cli.inspection import InspectConfig, InspectReport
from ope_cli.results import EvaluationResult

# the command line's spellings of fields whose names differ
OPTION_NAMES = {
    "policy": "policies",
    "estimator": "estimators",
    "ci": "interval",
    "episode_col": "episode",
    "step_col": "step",
    "obs_col": "observation",
    "action_col": "action",
    "reward_col": "reward",
    "behavior_prob_col": "behavior_prob",
    "behavior_log_prob_col": "behavior_log_prob",
    "target_prob_col": "target_prob",
    "target_log_prob_col": "target_log_prob",
    "q_col": "q_value",
    "v_col": "v_value",
}
SEQUENCES = ("policies", "estimators", "q", "top_k")  # repeatable options: tuples


def _fields(record) -> set[str]:
    return {field.name for field in dataclasses.fields(record)}


def _config(record, data: str, options: Mapping[str, Any]):
    """``record`` (EvaluationConfig or InspectConfig) of ``data`` and keyword ``options``,
    batching and column options gathered into their own records."""
    own, batching, columns = {}, {}, {}
    for key, value in options.items():
        name = OPTION_NAMES.get(key, key)
        if name in SEQUENCES and value is not None:
            value = (value,) if isinstance(value, str | int) else tuple(value)
        fields = _fields(record)
        if name in fields - {"data", "columns", "batching"}:
            own[name] = value
        elif "batching" in fields and name in _fields(BatchingConfig):
            batching[name] = value
        elif "columns" in fields and name in _fields(ColumnMapping):
            columns[name] = value
        else:
            raise UsageError(f"unknown option {key!r}; the options are {', '.join(_known(record))}")
    if columns:
        own["columns"] = ColumnMapping(**columns)
    if batching:
        own["batching"] = BatchingConfig(**batching)
    return record(data=str(data), **own)


def _known(record) -> list[str]:
    """The keywords ``record``'s function takes, in the command line's spellings."""
    fields = _fields(record) - {"data", "columns", "batching"}
    if "batching" in _fields(record):
        fields |= _fields(BatchingConfig)
    spelled = {cli for cli, name in OPTION_NAMES.items() if name not in _fields(BatchingConfig)}
    return sorted(fields | spelled)


def _as(subclass, record):
    """``record`` (a dataclass) as an instance of its ``subclass`` with the same fields."""
    return subclass(**{f.name: getattr(record, f.name) for f in dataclasses.fields(record)})


@dataclasses.dataclass(frozen=True)
class Evaluation(EvaluationResult):
    """What ``evaluate`` returns: the EvaluationResult, with the JSON document and a tidy
    table."""

    def to_dict(self, rank_by: str | None = None) -> dict[str, Any]:
        """The ``--format json`` document (SPEC section 5) as a dict."""
        from ope_cli.report.json_format import to_json_dict

        return to_json_dict(self, rank_by)

    def to_pandas(self, rank_by: str | None = None):
        """A pandas DataFrame with ``--format csv``'s columns, one row per policy x
        estimator (undefined numbers NaN). Needs pandas."""
        try:
            import pandas
        except ImportError:
            raise UsageError("to_pandas needs pandas: pip install pandas") from None
        from ope_cli.report.csv_format import tidy_rows

        header, rows = tidy_rows(self, rank_by)
        return pandas.DataFrame(rows, columns=header)


def evaluate(data: str | EvaluationConfig, /, **options: Any) -> Evaluation:
    """Estimates each policy's value from the logged episodes in ``data`` (``ope evaluate``).

    ``options``: ``ope evaluate``'s options as keywords (see the module docstring), plus
    ``on_progress``, ``on_status`` and ``distributed`` of ``pipeline.evaluate``. ``data``
    may be an EvaluationConfig instead (then only those three).
    """
    from ope_cli.estimation.pipeline import evaluate as run

    hooks = {k: options.pop(k) for k in ("on_progress", "on_status", "distributed") if k in options}
    if isinstance(data, EvaluationConfig):
        if options:
            raise UsageError("pass options as keywords or in the EvaluationConfig, not both")
        config = data
    else:
        config = _config(EvaluationConfig, data, options)
    return _as(Evaluation, run(config, **hooks))


@dataclasses.dataclass
class Inspection(InspectReport):
    """What ``inspect`` returns: the InspectReport, with the ``--format json`` document."""

    def to_dict(self) -> dict[str, Any]:
        from ope_cli.report.inspect import to_json_dict

        return to_json_dict(self)


def inspect(data, /, **options: Any) -> Inspection:
    """What ``data`` holds and every validation problem in it (``ope inspect``);
    ``options``: ``ope inspect``'s as keywords, or an InspectConfig as ``data``."""
    from ope_cli.inspection import inspect as run

    if isinstance(data, InspectConfig):
        if options:
            raise UsageError("pass options as keywords or in the InspectConfig, not both")
        return _as(Inspection, run(data))
    return _as(Inspection, run(_config(InspectConfig, data, options)))
