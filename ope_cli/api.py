"""The Python API a notebook user writes: the command line's options as keywords.

    import ope_cli

    run = ope_cli.evaluate("logs.parquet", policies=["a.npz", "b.npz"], gamma=0.99,
                           baseline="behavior", ci="bootstrap-t")
    run.to_dict()["results"][0]["estimates"]["wis"]["value"]   # the JSON document
    run.to_pandas()                                            # one row per policy x estimator

``evaluate`` and ``inspect`` take the data and every option of their command as keywords:
the option's name in snake case (``gamma``, ``behavior``, ``cross_fit``, ``interval``,
``read_rows``, ``behavior_prob`` ...) or the command line's spellings (``policy``,
``estimator``, ``ci``, ``obs_col`` ...), gathered into the config record and its records of
options (``GROUPS``, ``BatchingConfig``, ``ColumnMapping``); a single string where a
command repeats an option (``policies="a.npz"``) is one value. The config records stay for
those who build them: ``evaluate(EvaluationConfig(...))``. An unknown keyword is a
UsageError naming it.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from numbers import Integral, Real
from typing import Any

from ope_cli.config import (
    BatchingConfig,
    BehaviorConfig,
    ChoosingConfig,
    ColumnMapping,
    EvaluationConfig,
    IntervalConfig,
    QConfig,
    RuntimeConfig,
    estimator_names,
    python_numbers,
)
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
# EvaluationConfig's records of options, each keyword (the command line's option) -> its
# field there
GROUPS: dict[str, tuple[type, dict[str, str]]] = {
    "behavior": (
        BehaviorConfig,
        {
            "behavior": "policy",
            "min_propensity": "min_propensity",
            "behavior_cross_fit": "cross_fit",
        },
    ),
    "q": (
        QConfig,
        {"q": "sources", "cross_fit": "cross_fit", "v_samples": "v_samples"},
    ),
    "intervals": (
        IntervalConfig,
        {
            "confidence": "confidence",
            "interval": "method",
            "reward_range": "reward_range",
            "horizon": "horizon",
            "bootstrap_samples": "bootstrap_samples",
            "seed": "seed",
        },
    ),
    "runtime": (RuntimeConfig, {"precision": "precision", "devices": "devices"}),
    "choosing": (ChoosingConfig, {"baseline": "baseline", "truth": "truth", "top_k": "top_k"}),
}
RECORDS = ("data", "columns", "batching", *GROUPS)  # fields that are not keywords themselves


def _fields(record) -> set[str]:
    return {field.name for field in dataclasses.fields(record)}


def _groups(record) -> dict[str, tuple[type, dict[str, str]]]:
    """``record``'s records of options (field -> (record, {keyword: its field}))."""
    fields = _fields(record)
    groups = {name: group for name, group in GROUPS.items() if name in fields}
    if "batching" in fields:
        groups["batching"] = (BatchingConfig, {f: f for f in _fields(BatchingConfig)})
    if "columns" in fields:
        groups["columns"] = (ColumnMapping, {f: f for f in _fields(ColumnMapping)})
    return groups


def _config(record, data: str, options: Mapping[str, Any], also: tuple[str, ...] = ()):
    """``record`` (EvaluationConfig or InspectConfig) of ``data`` and keyword ``options``,
    each group of options (batching, columns, intervals ...) gathered into its record;
    ``also``: the caller's own keywords, which an unknown one is told of too."""
    own: dict[str, Any] = {}
    grouped: dict[str, dict[str, Any]] = {}
    typed: dict[tuple[str | None, str], str] = {}  # (group, field) -> the keyword given
    groups = _groups(record)
    for key, value in options.items():
        name = OPTION_NAMES.get(key, key)
        if getattr(value, "ndim", None) == 0 and hasattr(value, "item"):  # a 0-d array
            value = value.item()
        value = _plain(value)
        if name in SEQUENCES and value is not None:
            # one value alone (a number, a string, anything not iterable) is one value given
            single = isinstance(value, str | bytes) or not isinstance(value, Iterable)
            value = (value,) if single else tuple(_plain(v) for v in value)
        if name == "estimators":
            value = estimator_names(value)
        group = next((g for g, (_, names) in groups.items() if name in names), None)
        if name in _fields(record) - set(RECORDS):
            target = (None, name)
        elif group is not None:
            target = (group, groups[group][1][name])
        else:
            known = ", ".join(sorted({*_known(record), *also}))
            raise UsageError(f"unknown option {key!r}; the options are {known}")
        if value is None and not _takes_none(
            record if group is None else groups[group][0], target[1]
        ):
            continue  # None for an option that takes none: its default, as the command line's
        if target in typed:  # two spellings of one option: the last one won without a word
            raise UsageError(f"{typed[target]} and {key} are one option: give it once")
        typed[target] = key
        if group is None:
            own[name] = value
        else:
            grouped.setdefault(group, {})[target[1]] = value
    for group, values in grouped.items():
        own[group] = groups[group][0](**values)
        _check_types(own[group], {f: k for (g, f), k in typed.items() if g == group})
    made = record(data=_data_path(data), **own)
    _check_types(made, {f: k for (g, f), k in typed.items() if g is None})
    return made


def _data_path(data: Any) -> str:
    """The data option as a string; a UsageError for anything but a path (evaluate(123)
    was Python's TypeError, an InspectConfig's Path an AttributeError)."""
    if not isinstance(data, str | os.PathLike):
        raise UsageError(f"data must be a path (a string or os.PathLike), got {data!r}")
    return os.fspath(data)


def _takes_none(record, name: str) -> bool:
    """Whether field ``name`` of the config record (class) ``record`` may be None
    (read_rows=None and policies=None were Python's TypeErrors)."""
    field = next(f for f in dataclasses.fields(record) if f.name == name)
    return "None" in str(field.type)


def _checked_record(record):
    """A config record given whole (EvaluationConfig, InspectConfig), NumPy numbers as
    Python ones, checked as keywords are: its gamma="0.9" was a TypeError, its data a
    Path an AttributeError, and its policies="x.npz" read letter by letter."""
    for group, (kind, _) in _groups(record).items():  # behavior="b.npz": a TypeError
        if not isinstance(getattr(record, group), kind):
            raise UsageError(
                f"{type(record).__name__}'s {group} must be a {kind.__name__}, got "
                f"{getattr(record, group)!r}"
            )
    record = dataclasses.replace(_python_numbers_in(record), data=_data_path(record.data))
    for part in (record, *(getattr(record, group) for group in _groups(record))):
        _check_types(part, {})
    if getattr(record, "estimators", None):  # as the keyword reads them: "WIS" was unknown
        record = dataclasses.replace(record, estimators=estimator_names(record.estimators))
    return record


def _plain(value):
    """``value`` with paths as strings and NumPy numbers as Python ones, alone or in a
    tuple or list (``policies=[Path("a.npz")]``), a 1-d array as a tuple of them, as
    options are read."""
    if isinstance(value, tuple | list):
        return type(value)(_plain(item) for item in value)
    if getattr(value, "ndim", None) == 1 and hasattr(value, "tolist"):  # reward_range=array
        return tuple(value.tolist())
    return python_numbers(os.fspath(value) if isinstance(value, os.PathLike) else value)


def _python_numbers_in(record):
    """``record`` (a config dataclass) with NumPy numbers as Python ones
    (``python_numbers``) and paths as strings, in its records of options too."""
    changes = {}
    for field in dataclasses.fields(record):
        value = getattr(record, field.name)
        made = _python_numbers_in(value) if dataclasses.is_dataclass(value) else _plain(value)
        if made is not value:
            changes[field.name] = made
    return dataclasses.replace(record, **changes) if changes else record


def _is_integer(value: object) -> bool:
    return isinstance(value, Integral) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool)


# what the command line's types guarantee, checked for keywords: field type -> (kind, check)
_TYPES = {
    "int": ("an integer", _is_integer),
    "float": ("a number", _is_number),
    "str": ("a string", lambda v: isinstance(v, str)),
    "tuple[float, float]": (
        "two numbers (low, high)",
        lambda v: isinstance(v, tuple | list) and len(v) == 2 and all(_is_number(x) for x in v),
    ),
    "tuple[int, ...]": (
        "integers",
        lambda v: not isinstance(v, str) and all(_is_integer(x) for x in v),
    ),
    # a bare string was read letter by letter ("x.npz": policies "x", ".", "n" ...)
    "tuple[str, ...]": (
        "a sequence of strings or paths",
        lambda v: not isinstance(v, str) and all(isinstance(x, str) for x in v),
    ),
}


def _check_types(record, keywords: Mapping[str, str]) -> None:
    """UsageError for a keyword whose value the command line's option would not take: an
    integer option given 1.9 or "3", a number given "0.9" (a float would otherwise be
    truncated, or fail later in Python's words). ``keywords``: field -> the keyword given
    for it, the name the message uses."""
    for field in dataclasses.fields(record):
        declared = str(field.type).replace(" | None", "")
        value = getattr(record, field.name)
        if declared not in _TYPES or value is None:
            continue
        kind, accepts = _TYPES[declared]
        if not accepts(value):
            name = keywords.get(field.name, field.name)
            raise UsageError(f"{name} must be {kind}, got {value!r}")


def evaluation_config(data: str, /, **options: Any) -> EvaluationConfig:
    """The EvaluationConfig of ``data`` and ``ope evaluate``'s options as keywords, as
    ``evaluate`` takes them. Raises UsageError for an unknown keyword."""
    return _config(EvaluationConfig, data, options)


def _known(record) -> list[str]:
    """The keywords ``record``'s function takes, in the command line's spellings."""
    fields = _fields(record) - set(RECORDS)
    accepted = set(fields)
    for group, (_, names) in _groups(record).items():
        accepted |= set(names)
        if group != "columns":  # the columns' keywords: their options' spellings
            fields |= set(names)
    spelled = {
        cli
        for cli, name in OPTION_NAMES.items()
        if name in accepted and name not in _fields(BatchingConfig)
    }
    return sorted(fields | spelled)


# ``evaluate``'s keywords beside its EvaluationConfig's: pipeline.evaluate's hooks, and the
# default ranking of ``to_dict`` and ``to_pandas`` (an unknown keyword was told the options
# without them)
HOOKS = ("on_progress", "on_status", "distributed")
RANK_BY = "rank_by"


def _as(subclass, record):
    """``record`` (a dataclass) as an instance of its ``subclass`` with the same fields."""
    return subclass(**{f.name: getattr(record, f.name) for f in dataclasses.fields(record)})


@dataclasses.dataclass(frozen=True)
class Evaluation(EvaluationResult):
    """What ``evaluate`` returns: the EvaluationResult, with the JSON document and a tidy
    table; ``rank_by``: evaluate's ``rank_by`` (``--rank-by``), the default of both."""

    rank_by: str | None = None

    def to_dict(self, rank_by: str | None = None) -> dict[str, Any]:
        """The ``--format json`` document (SPEC section 5) as a dict."""
        from ope_cli.report.json_format import to_json_dict

        return to_json_dict(self, rank_by or self.rank_by)

    def to_pandas(self, rank_by: str | None = None):
        """A pandas DataFrame with ``--format csv``'s columns, one row per policy x
        estimator (undefined numbers NaN; a column empty on every row is float64 NaN, as
        ``pandas.read_csv`` reads the CSV's). Needs pandas."""
        try:
            import pandas
        except ImportError:
            raise UsageError("to_pandas needs pandas: pip install pandas") from None
        from ope_cli.report.csv_format import tidy_rows

        header, rows = tidy_rows(self, rank_by or self.rank_by)
        frame = pandas.DataFrame(rows, columns=header)
        empty = [name for name in header if frame[name].isna().all()]
        return frame.astype(dict.fromkeys(empty, "float64"))


def evaluate(data: str | EvaluationConfig, /, **options: Any) -> Evaluation:
    """Estimates each policy's value from the logged episodes in ``data`` (``ope evaluate``).

    ``options``: ``ope evaluate``'s options as keywords (see the module docstring; ``rank_by``
    is the default of ``to_dict`` and ``to_pandas``), plus ``on_progress``, ``on_status``
    and ``distributed`` of ``pipeline.evaluate``. ``data`` may be an EvaluationConfig
    instead (then only those three and ``rank_by``).
    """
    from ope_cli.estimation.pipeline import evaluate as run
    from ope_cli.estimation.run_plan import reported_estimators
    from ope_cli.report.table import check_rank_by

    hooks = {k: options.pop(k) for k in HOOKS if k in options}
    rank_by = options.pop(RANK_BY, None)
    if isinstance(data, EvaluationConfig):
        if options:
            raise UsageError("pass options as keywords or in the EvaluationConfig, not both")
        config = _checked_record(data)
    else:
        config = _config(EvaluationConfig, data, options, also=(*HOOKS, RANK_BY))
    if rank_by is not None:  # refused before the data is read, as --rank-by is
        rank_by = check_rank_by(rank_by, reported_estimators(config))
    return dataclasses.replace(_as(Evaluation, run(config, **hooks)), rank_by=rank_by)


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
        return _as(Inspection, run(_checked_record(data)))
    return _as(Inspection, run(_config(InspectConfig, data, options)))
