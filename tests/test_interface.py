"""SPEC section 12, "An interface that cannot mislead": one test per rule, on a small chain
dataset written by ``ope generate`` (which declares its gamma), run in this process.

- the discount comes from somewhere named (--gamma, the data's metadata, the default);
- one Q for one policy (--q once for several policies is refused; --q globs pair in order);
- warnings travel with the numbers (JSON "warnings", the CSV column, each result's rank);
- every estimate has an interval or a reason (ci_method per estimator, a note for a null
  interval, shown in the table);
- names that people read (--policy NAME=PATH; the shortest unambiguous path suffix).
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from ope_cli.policies import split_name, suffix_labels
from ope_cli.sources import METADATA_KEY

GAMMA = 0.9
POLICIES = "demo/policies/*.npz"
QS = "demo/q/eval_*.npz"


@pytest.fixture(scope="module")
def root(tmp_path_factory, ope_in_process) -> Path:
    """demo/ (chain, 200 episodes, gamma 0.9 declared) and nogamma.parquet (the same logs
    without a declared gamma)."""
    root = tmp_path_factory.mktemp("interface")
    done = ope_in_process(
        ["generate", "chain", "demo", "--episodes", "200", "--gamma", str(GAMMA)], cwd=root
    )
    assert done.returncode == 0, done
    table = pq.read_table(root / "demo" / "logs.parquet")
    declared = json.loads(table.schema.metadata[METADATA_KEY.encode()])
    assert declared["gamma"] == GAMMA  # ope generate writes the gamma it used
    del declared["gamma"]
    pq.write_table(
        table.replace_schema_metadata({METADATA_KEY: json.dumps(declared)}),
        root / "nogamma.parquet",
    )
    return root


RUNS = {
    "declared": ["demo/logs.parquet", "-p", POLICIES, "--q", QS, "-f", "json"],
    "declared_table": ["demo/logs.parquet", "-p", POLICIES, "--q", QS, "-f", "table"],
    "option": ["demo/logs.parquet", "-p", "demo/policies/eval_0.npz", "--gamma", "0.5"],
    "default": ["nogamma.parquet", "-p", POLICIES, "-f", "json"],
    "default_csv": ["nogamma.parquet", "-p", POLICIES, "-f", "csv"],
    "default_table": ["nogamma.parquet", "-p", POLICIES, "-f", "table"],
    "one_q": ["demo/logs.parquet", "-p", POLICIES, "--q", "demo/q/eval_0.npz"],
    "betting": [
        *("demo/logs.parquet", "-p", "demo/policies/eval_0.npz", "--q", "demo/q/eval_0.npz"),
        *("--ci", "betting", "-f", "table"),
    ],
    "betting_json": [
        *("demo/logs.parquet", "-p", "demo/policies/eval_0.npz", "--q", "demo/q/eval_0.npz"),
        *("--ci", "betting", "-f", "json"),
    ],
    "named": [
        *("demo/logs.parquet", "-p", "best=demo/policies/eval_0.npz"),
        *("-p", "demo/policies/eval_1.npz", "-f", "json"),
    ],
    "named_table": [
        *("demo/logs.parquet", "-p", "best=demo/policies/eval_0.npz"),
        *("-p", "demo/policies/eval_1.npz", "-f", "table"),
    ],
}


@pytest.fixture(scope="module")
def runs(root, ope_many_in_process) -> dict:
    return ope_many_in_process(
        {name: {"args": ["evaluate", *args], "cwd": root} for name, args in RUNS.items()}
    )


def _json(run) -> dict:
    assert run.returncode == 0, run
    return json.loads(run.stdout)


# --- the discount comes from somewhere named


def test_the_declared_gamma_is_used_and_named(runs):
    doc = _json(runs["declared"])
    assert (doc["gamma"], doc["gamma_source"]) == (GAMMA, "data")
    assert not any(w["code"] == "gamma_default" for w in doc["warnings"])
    assert f"gamma={GAMMA:g} (declared by the data)" in runs["declared_table"].stdout


def test_gamma_option_wins_over_the_declared_one(runs):
    doc = _json(runs["option"])
    assert (doc["gamma"], doc["gamma_source"]) == (0.5, "option")


def test_the_default_gamma_is_a_warning_in_every_format(runs):
    doc = _json(runs["default"])
    assert (doc["gamma"], doc["gamma_source"]) == (1.0, "default")
    (warning,) = [w for w in doc["warnings"] if w["code"] == "gamma_default"]
    assert warning["policy"] is None and "--gamma" in warning["message"]
    rows = list(csv.DictReader(io.StringIO(runs["default_csv"].stdout)))
    assert rows and all("gamma_default" in row["warnings"] for row in rows)
    table = runs["default_table"].stdout
    assert "gamma=1 (the default" in table
    assert "warning: gamma is 1, the default" in " ".join(table.split())


# --- one Q for one policy


def test_one_q_for_several_policies_is_a_usage_error(runs):
    run = runs["one_q"]
    assert run.returncode == 2 and run.stdout == "", run
    (line,) = run.stderr.splitlines()
    assert line.startswith("ope: usage error: --q demo/q/eval_0.npz is one Q-hat for 3 policies")
    assert "once per --policy, in the same order" in line and "--q fit" in line


def test_q_globs_pair_in_order_and_the_pairing_is_printed(runs):
    doc = _json(runs["declared"])
    for k, result in enumerate(doc["results"]):
        assert result["policy"] == f"demo/policies/eval_{k}.npz"
        assert result["diagnostics"]["q"]["name"] == f"demo/q/eval_{k}.npz"
        assert result["diagnostics"]["q"]["source"] == "checkpoint"
    footer = " ".join(runs["declared_table"].stdout.split())
    for k in range(3):
        assert f"eval_{k}.npz: Q-hat from demo/q/eval_{k}.npz (tabular_q)" in footer


# --- warnings travel with the numbers; every result carries its rank


def test_warnings_and_ranks_in_json_and_csv(runs):
    doc = _json(runs["declared"])
    assert doc["rank_by"] == "wis"
    values = [r["estimates"]["wis"]["value"] for r in doc["results"]]
    ranks = [r["rank"] for r in doc["results"]]
    assert sorted(ranks) == [1, 2, 3]
    assert values[ranks.index(1)] == max(values)
    for warning in doc["warnings"]:
        assert set(warning) == {"code", "message", "policy"}
    # betting does not apply to dm, dr, wdr: their normal intervals are asymptotic
    (asymptotic,) = [w for w in doc["warnings"] if w["code"] == "asymptotic_intervals"]
    assert "dm, dr, wdr: normal intervals" in asymptotic["message"]
    rows = list(csv.DictReader(io.StringIO(runs["default_csv"].stdout)))
    assert {"warnings", "rank", "ci_method", "note", "label"} <= set(rows[0])
    assert sorted({row["rank"] for row in rows}) == ["1", "2", "3"]


def test_policy_warnings_name_their_policy_in_json():
    """A low effective sample size, in JSON as in the footer, with the policy it concerns."""
    from test_report import EXAMPLES

    from ope_cli.config import EvaluationConfig
    from ope_cli.pipeline import evaluate
    from ope_cli.report import to_json_dict
    from ope_cli.report.table import footer_lines

    policy = str(EXAMPLES / "policies" / "ckpt.npz")
    result = evaluate(
        EvaluationConfig(str(EXAMPLES / "data" / "logs.parquet"), (policy,), gamma=1.0)
    )
    (one,) = result.results
    poor = dataclasses.replace(
        one, diagnostics=dataclasses.replace(one.diagnostics, ess=5.0, ess_fraction=0.01)
    )
    result = dataclasses.replace(result, results=[poor])
    doc = to_json_dict(result)
    (low,) = [w for w in doc["warnings"] if w["code"] == "low_ess"]
    assert low["policy"] == policy and "effective sample size" in low["message"]
    assert f"warning: {low['message']}" in [text for text, _ in footer_lines(result, "wis")]


# --- every estimate has an interval or a reason


def test_auto_names_the_method_per_estimator(runs):
    doc = _json(runs["declared"])
    estimates = doc["results"][0]["estimates"]
    for name in ("is", "wis", "pdis", "wpdis"):
        assert estimates[name]["ci_method"] == "betting", name
    for name in ("dm", "dr", "wdr"):  # auto: normal where betting does not apply
        assert estimates[name]["ci_method"] == "normal", name
        assert estimates[name]["ci_low"] < estimates[name]["value"] < estimates[name]["ci_high"]


def test_a_null_interval_always_has_a_note_shown_in_the_table(runs):
    doc = _json(runs["betting_json"])
    for name, estimate in doc["results"][0]["estimates"].items():
        if estimate["ci_low"] is None:
            assert estimate["note"], name
            assert estimate["ci_method"] is None, name
    assert doc["results"][0]["estimates"]["dr"]["ci_low"] is None  # --ci betting, as asked
    table = runs["betting"].stdout
    assert "n/a (1)" in table
    assert "(1) betting intervals do not apply to this estimator" in table


# --- names that people read


def test_named_policies_and_short_labels(runs):
    doc = _json(runs["named"])
    best, other = doc["results"]
    assert (best["policy"], best["label"], best["source"]) == (
        "best",
        "best",
        "demo/policies/eval_0.npz",
    )
    assert (other["policy"], other["label"]) == ("demo/policies/eval_1.npz", "eval_1.npz")
    table = runs["named_table"].stdout
    assert "│ best " in table and "eval_1.npz = demo/policies/eval_1.npz" in table
    assert "best = demo/policies/eval_0.npz" in table


def test_suffix_labels_are_the_shortest_unambiguous():
    assert suffix_labels(["runs/a/ckpt.npz", "runs/b/ckpt.npz", "x/y.npz"]) == [
        "a/ckpt.npz",
        "b/ckpt.npz",
        "y.npz",
    ]
    assert suffix_labels(["pkg.mod:policy", "ckpt.npz"]) == ["pkg.mod:policy", "ckpt.npz"]
    assert split_name("best=ckpts/a.npz") == ("best", "ckpts/a.npz")
    assert split_name("pkg.mod:policy") == (None, "pkg.mod:policy")
    assert split_name("date=2024/a.npz")[0] == "date"  # NAME=PATH when no such file exists
