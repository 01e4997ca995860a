"""``ope evaluate --format json``: one JSON document (schema_version 1, SPEC section 5)."""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from ope_cli.report.formatting import SCHEMA_VERSION, document_header, json_number
from ope_cli.report.table import rank_policies, resolve_rank_by
from ope_cli.report.warnings import run_warnings
from ope_cli.results import EvaluationResult, PolicyResult

__all__ = ["SCHEMA_VERSION", "to_json", "to_json_dict"]
ESTIMATE_FIELDS = ("value", "stderr", "ci_low", "ci_high")
COMPARISON_FIELDS = ("delta", "stderr", "ci_low", "ci_high", "p_improvement")


def _policy_dict(policy: PolicyResult, rank: int | None) -> dict[str, Any]:
    estimates = {}
    for name, estimate in policy.estimates.items():
        entry = {k: json_number(getattr(estimate, k)) for k in ESTIMATE_FIELDS}
        # the interval's method (betting, normal, percentile, bootstrap-t; null without one)
        entry["ci_method"] = policy.ci_methods.get(name)
        if estimate.note:
            entry["note"] = estimate.note
        estimates[name] = entry
    diagnostics = {k: json_number(v) for k, v in dataclasses.asdict(policy.diagnostics).items()}
    if policy.q is not None:  # {"source", "name", "kind", "fit"}: where Q-hat comes from
        q = dataclasses.asdict(policy.q)
        if q["fit"] is not None:
            q["fit"] = {
                k: json_number(v) if isinstance(v, float) else v for k, v in q["fit"].items()
            }
        diagnostics["q"] = q
    entry = {
        "policy": policy.policy,
        "label": policy.shown,  # what the table and figures call it
        "source": policy.source,  # the path of --policy NAME=PATH, else null
        "rank": rank,  # by the ranking estimator ("rank_by"), 1 = highest; null: no value
        "estimates": estimates,
        "diagnostics": diagnostics,
        "actions_checked": policy.actions_checked,
    }
    if policy.comparison is not None:  # --baseline: this policy minus the baseline
        entry["comparison"] = {
            name: _comparison_dict(comparison) for name, comparison in policy.comparison.items()
        }
    if policy.could_be_best is not None:  # two or more policies
        entry["could_be_best"] = dict(policy.could_be_best)
    return entry


def _comparison_dict(comparison) -> dict[str, Any]:
    entry = {k: json_number(getattr(comparison, k)) for k in COMPARISON_FIELDS}
    if comparison.note:
        entry["note"] = comparison.note
    return entry


def _behavior_dict(result: EvaluationResult) -> dict[str, Any] | None:
    if result.behavior is None:
        return None
    entry = dataclasses.asdict(result.behavior)
    entry.pop("actions_checked")  # said by the warning actions_unchecked where it is False
    fit = entry.pop("fit")
    if fit is not None:
        for name in ("mean_log_likelihood", "heldout_mean_log_likelihood"):
            fit[name] = json_number(fit[name])
        for weights in (fit["mean_weight"] or {}).values():
            weights.update({k: json_number(v) for k, v in weights.items()})
        for gap in filter(None, (fit["logged_gap"] or {}).values()):
            gap["standard_errors"] = json_number(gap["standard_errors"])
            for side in ("estimated", "logged"):
                gap[side] = {k: json_number(v) for k, v in gap[side].items()}
        entry["fit"] = fit
    return entry


def to_json_dict(result: EvaluationResult, rank_by: str | None = None) -> dict[str, Any]:
    """The spec's JSON document (section 5); extra fields are additions, none renamed.
    ``rank_by``: the estimator that ranks the policies (default: WIS, else the first)."""
    rank_by = resolve_rank_by(result, rank_by)
    ranks = rank_policies(result, rank_by)
    confidence, runtime = result.confidence, result.runtime
    return {
        **document_header(),
        "dataset": _dataset_dict(result),
        "gamma": result.gamma,
        "gamma_source": result.gamma_source,  # option (--gamma), data (declared) or default
        "declared_gamma": result.declared_gamma,  # the data's own, null when it declares none
        "confidence": {
            "level": confidence.level,
            "interval": confidence.interval,
            "method": confidence.method,
            "reward_range": list(confidence.reward_range) if confidence.reward_range else None,
            "horizon": confidence.horizon,
            "replicates": confidence.replicates,  # bootstrap replicates drawn (0: none)
        },
        "rank_by": rank_by,
        "baseline": result.baseline,  # --baseline: what each "comparison" is against
        # --baseline behavior: the logging policy's own value, the mean discounted return
        "behavior_value": json_number(result.behavior_value)
        if result.baseline == "behavior"
        else None,
        "results": [
            _policy_dict(policy, rank) for policy, rank in zip(result.results, ranks, strict=True)
        ],
        # what the table's footer warns about: [{"code", "message", "policy"}], policy
        # null for the whole run
        "warnings": [w.to_dict() for w in run_warnings(result, ranks, rank_by)],
        **_selection(result),
        "runtime": {
            "seconds": runtime.seconds,
            "steps_per_second": result.steps_per_second,
            "backend": runtime.backend,
            "devices": runtime.devices,
            "processes": runtime.processes,
            "precision": runtime.precision,
            "padded_steps": runtime.padded_steps,
            "batch_shapes": [list(shape) for shape in runtime.batch_shapes],
            "compiles": runtime.compiles,
            "compilations": runtime.compilations,
            "compile_seconds": runtime.compile_seconds,
            "cache_hits": runtime.cache_hits,
        },
    }


def _dataset_dict(result: EvaluationResult) -> dict[str, Any]:
    """The document's "dataset" block: what was read, used and dropped, and the behavior
    policy."""
    dataset = result.dataset
    return {
        "source": dataset.source,
        "layout": dataset.layout,
        "files": dataset.files,
        "episodes": dataset.episodes,
        "steps": dataset.steps,
        "rows_read": dataset.rows_read,
        "max_length": dataset.max_length,
        # Every row read is used or dropped (--on-invalid drop); in the episode layout a
        # row is an episode: rows_read = episodes + episodes_dropped.
        "on_invalid": dataset.on_invalid,
        "steps_used": dataset.steps,
        "steps_dropped": dataset.steps_dropped,
        "episodes_dropped": dataset.episodes_dropped,
        "dropped": {reason: dict(counts) for reason, counts in dataset.dropped.items()},
        # {"source": "column" | "checkpoint" | "entry_point" | "estimated", "name": ...,
        #  "kind": ...}, and "fit" for an estimated model
        "behavior": _behavior_dict(result),
    }


def _selection(result: EvaluationResult) -> dict[str, Any]:
    """{"selection": {estimator: {metric: value}}} with --truth, else nothing."""
    if result.selection is None:
        return {}
    return {
        "selection": {
            name: {metric: json_number(value) for metric, value in metrics.items()}
            for name, metrics in result.selection.items()
        }
    }


def to_json(result: EvaluationResult, rank_by: str | None = None) -> str:
    """The document as indented JSON text (no trailing newline)."""
    return json.dumps(to_json_dict(result, rank_by), indent=2, allow_nan=False)
