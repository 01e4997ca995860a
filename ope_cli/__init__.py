"""ope: offline policy evaluation of RL policies over logged episodes.

The public API (``__all__``)::

    import ope_cli

    result = ope_cli.evaluate("logs.parquet", policies=["a.npz"], gamma=0.99)
    result.results[0].estimates["wis"].value
    result.to_dict()        # the --format json document
    result.to_pandas()      # one row per policy x estimator (with pandas installed)

    report = ope_cli.inspect("logs.parquet")
    truth = ope_cli.generate("chain", "demo", episodes=5000)

The command line's options are keywords (``ope_cli.api``); the config records
(``EvaluationConfig``, ``InspectConfig``) are accepted too.

Names load on first use, so ``import ope_cli`` (and the command line's ``--help``) does
not import JAX. Errors are ``OpeError`` subclasses carrying the CLI's exit code.
"""

from __future__ import annotations

import importlib

from ope_cli._version import __version__

_API = {  # public name -> (module, attribute)
    "evaluate": ("ope_cli.api", "evaluate"),
    "Evaluation": ("ope_cli.api", "Evaluation"),
    "Inspection": ("ope_cli.api", "Inspection"),
    "EvaluationConfig": ("ope_cli.config", "EvaluationConfig"),
    "BatchingConfig": ("ope_cli.config", "BatchingConfig"),
    "BehaviorConfig": ("ope_cli.config", "BehaviorConfig"),
    "ChoosingConfig": ("ope_cli.config", "ChoosingConfig"),
    "ColumnMapping": ("ope_cli.config", "ColumnMapping"),
    "IntervalConfig": ("ope_cli.config", "IntervalConfig"),
    "QConfig": ("ope_cli.config", "QConfig"),
    "RuntimeConfig": ("ope_cli.config", "RuntimeConfig"),
    "EvaluationResult": ("ope_cli.results", "EvaluationResult"),
    "PolicyResult": ("ope_cli.results", "PolicyResult"),
    "inspect": ("ope_cli.api", "inspect"),
    "InspectConfig": ("ope_cli.inspection", "InspectConfig"),
    "InspectReport": ("ope_cli.inspection", "InspectReport"),
    "generate": ("ope_cli.envs.generate", "generate"),
    "OpeError": ("ope_cli.errors", "OpeError"),
    "UsageError": ("ope_cli.errors", "UsageError"),
    "DataError": ("ope_cli.errors", "DataError"),
    "PolicyError": ("ope_cli.errors", "PolicyError"),
}

__all__ = ["__version__", *_API]


def __getattr__(name: str) -> object:
    """Loads a public name on first use and keeps it on the package."""
    try:
        module, attribute = _API[name]
    except KeyError:
        raise AttributeError(f"module 'ope_cli' has no attribute {name!r}") from None
    value = getattr(importlib.import_module(module), attribute)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_API})
