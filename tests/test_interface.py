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
import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import typer.main
from rendered import shown

from ope_cli.cli import helpmap
from ope_cli.cli import run as run_ope
from ope_cli.data.sources import METADATA_KEY
from ope_cli.errors import UsageError
from ope_cli.models.policies import split_name, suffix_labels

GAMMA = 0.9
POLICIES = "demo/policies/*.npz"
QS = "demo/q/eval_*.npz"


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    """demo/ (chain, 200 episodes, gamma 0.9 declared) and nogamma.parquet (the same logs
    without a declared gamma)."""
    from ope_cli.envs.generate import generate

    root = tmp_path_factory.mktemp("interface")
    generate("chain", root / "demo", episodes=200, gamma=GAMMA)
    table = pq.read_table(root / "demo" / "logs.parquet")
    declared = json.loads(table.schema.metadata[METADATA_KEY.encode()])
    assert declared["gamma"] == GAMMA  # ope generate writes the gamma it used
    del declared["gamma"]
    pq.write_table(
        table.replace_schema_metadata({METADATA_KEY: json.dumps(declared)}),
        root / "nogamma.parquet",
    )
    return root


# Each evaluation once, through the API (as evaluate's options); ``shown`` renders it with
# the command line's own writer. What only the command line does (its spellings, globs,
# exit codes, one-line refusals) runs through ``ope`` itself below.
EVALUATIONS = {
    "declared": ("demo/logs.parquet", {"policies": POLICIES, "q": QS}),
    "option": ("demo/logs.parquet", {"policies": "demo/policies/eval_0.npz", "gamma": 0.5}),
    "default": ("nogamma.parquet", {"policies": POLICIES}),
    "betting": (
        "demo/logs.parquet",
        {"policies": "demo/policies/eval_0.npz", "q": "demo/q/eval_0.npz", "ci": "betting"},
    ),
    "named": (
        "demo/logs.parquet",
        {"policies": ("best=demo/policies/eval_0.npz", "demo/policies/eval_1.npz")},
    ),
}
REFUSED = {  # refused before the data is read
    "truth_other_gamma": [
        *("demo/logs.parquet", "-p", POLICIES, "--truth", "demo/truth.json", "--gamma", "0.5"),
    ],
    "truth_default_gamma": ["nogamma.parquet", "-p", POLICIES, "--truth", "demo/truth.json"],
    "one_q": ["demo/logs.parquet", "-p", POLICIES, "--q", "demo/q/eval_0.npz"],
    "q_glob_count": ["demo/logs.parquet", "-p", POLICIES, "--q", "demo/q/*.npz"],
}


@pytest.fixture(scope="module")
def evaluations(root) -> dict:
    import ope_cli

    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(root)  # the paths as typed, relative, are the names shown
        return {
            name: ope_cli.evaluate(data, **options) for name, (data, options) in EVALUATIONS.items()
        }


def _json(evaluation) -> dict:
    return json.loads(shown(evaluation, "json"))


@pytest.fixture(scope="module")
def refused(root, ope_many_in_process) -> dict:
    return ope_many_in_process(
        {name: {"args": ["evaluate", *args], "cwd": root} for name, args in REFUSED.items()}
    )


def test_the_command_line_writes_what_its_writer_renders(root, evaluations, ope_many_in_process):
    """The tests below render the API's results with ``write_result``: the command line,
    globs and all, prints the same table, and the same document but for the run's timings."""
    args = ["evaluate", "demo/logs.parquet", "-p", POLICIES, "--q", QS]
    runs = ope_many_in_process(
        {name: {"args": [*args, "-f", name], "cwd": root} for name in ("table", "json")}
    )
    assert runs["table"].returncode == 0, runs["table"]
    assert runs["table"].stdout == shown(evaluations["declared"], "table")
    printed, rendered = json.loads(runs["json"].stdout), _json(evaluations["declared"])
    assert printed.pop("runtime").keys() == rendered.pop("runtime").keys()
    assert printed == rendered


# --- the discount comes from somewhere named


def test_the_declared_gamma_is_used_and_named(evaluations):
    doc = _json(evaluations["declared"])
    assert (doc["gamma"], doc["gamma_source"]) == (GAMMA, "data")
    assert not any(w["code"] == "gamma_default" for w in doc["warnings"])
    assert f"gamma={GAMMA:g} (declared by the data)" in shown(evaluations["declared"], "table")


def test_gamma_option_wins_over_the_declared_one(evaluations):
    """--gamma 0.5 on data declaring 0.95 showed only "gamma=0.5 (--gamma)": every format
    now also says which discount it replaced."""
    doc = _json(evaluations["option"])
    assert (doc["gamma"], doc["gamma_source"], doc["declared_gamma"]) == (0.5, "option", GAMMA)
    (warning,) = [w for w in doc["warnings"] if w["code"] == "gamma_not_the_data_s"]
    assert warning["message"].startswith(f"gamma is 0.5 (--gamma), not the {GAMMA:g} the data")
    assert warning["policy"] is None
    table = shown(evaluations["option"], "table")
    assert f"gamma=0.5 (--gamma; the data declares {GAMMA:g})" in table
    assert "gamma_not_the_data_s" in shown(evaluations["option"], "csv")
    declared = _json(evaluations["declared"])  # the data's own: no warning
    assert declared["declared_gamma"] == GAMMA
    assert not [w for w in declared["warnings"] if w["code"] == "gamma_not_the_data_s"]
    assert _json(evaluations["default"])["declared_gamma"] is None


def test_csv_rows_say_which_gamma(evaluations):
    rows = list(csv.DictReader(io.StringIO(shown(evaluations["declared"], "csv"))))
    assert rows and {(row["gamma"], row["gamma_source"]) for row in rows} == {(repr(GAMMA), "data")}


def test_csv_rows_say_which_q_and_which_behavior_probabilities(evaluations):
    """The pairing of policies and Q sources (SPEC 12) was in the table and JSON only."""
    result = evaluations["declared"]
    rows = list(csv.DictReader(io.StringIO(shown(result, "csv"))))
    table = shown(result, "table")
    for policy in result.results:
        sources = {row["q_source"] for row in rows if row["policy"] == policy.policy}
        assert sources == {policy.q.describe()} and policy.q.describe() in table
    (behavior,) = {row["behavior_source"] for row in rows}
    assert behavior.startswith("behavior probabilities: logged") and behavior in table


def test_a_truth_for_another_gamma_is_a_usage_error(refused):
    """truth.json holds values for the gamma it was generated with: compared with estimates
    at another gamma (given, or the default where the data declares none) they would give
    wrong selection metrics, so the run stops before reading the data."""
    line = _error_line(refused["truth_other_gamma"], 2)
    assert "gives true values for gamma 0.9, but this run discounts by gamma 0.5 (--gamma)" in line
    line = _error_line(refused["truth_default_gamma"], 2)
    assert "discounts by gamma 1 (the default)" in line and "--gamma 0.9" in line


def test_the_default_gamma_is_a_warning_in_every_format(evaluations):
    doc = _json(evaluations["default"])
    assert (doc["gamma"], doc["gamma_source"]) == (1.0, "default")
    (warning,) = [w for w in doc["warnings"] if w["code"] == "gamma_default"]
    assert warning["policy"] is None and "--gamma" in warning["message"]
    rows = list(csv.DictReader(io.StringIO(shown(evaluations["default"], "csv"))))
    assert rows and all("gamma_default" in row["warnings"] for row in rows)
    assert {(row["gamma"], row["gamma_source"]) for row in rows} == {("1.0", "default")}
    table = shown(evaluations["default"], "table")
    assert "gamma=1 (the default" in table
    assert "warning: gamma is 1, the default" in " ".join(table.split())


# --- one Q for one policy


def test_one_q_for_several_policies_is_a_usage_error(refused):
    run = refused["one_q"]
    assert run.returncode == 2 and run.stdout == "", run
    (line,) = run.stderr.splitlines()
    assert line.startswith("ope: usage error: --q demo/q/eval_0.npz is one Q-hat for 3 policies")
    assert "once per --policy, in the same order" in line and "--q fit" in line
    line = _error_line(refused["q_glob_count"], 2)  # q/ also holds behavior.npz: 4 for 3
    # the files it matched: generate writes q/behavior.npz beside the policies' Q-hats
    assert line.startswith(
        "ope: usage error: --q is given 4 times (globs expanded from 1: demo/q/behavior.npz, "
        "demo/q/eval_0.npz, demo/q/eval_1.npz, demo/q/eval_2.npz) for 3 policies"
    ), line


def test_q_globs_pair_in_order_and_the_pairing_is_printed(evaluations):
    doc = _json(evaluations["declared"])
    for k, result in enumerate(doc["results"]):
        assert result["policy"] == f"demo/policies/eval_{k}.npz"
        assert result["diagnostics"]["q"]["name"] == f"demo/q/eval_{k}.npz"
        assert result["diagnostics"]["q"]["source"] == "checkpoint"
        assert result["diagnostics"]["q"]["exact"] is True  # ope generate's exact Q
    footer = " ".join(shown(evaluations["declared"], "table").split())
    for k in range(3):
        assert f"eval_{k}.npz: Q-hat from demo/q/eval_{k}.npz (tabular_q, exact)" in footer


# --- warnings travel with the numbers; every result carries its rank


def test_warnings_and_ranks_in_json_and_csv(evaluations):
    doc = _json(evaluations["declared"])
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
    rows = list(csv.DictReader(io.StringIO(shown(evaluations["default"], "csv"))))
    assert {"warnings", "rank", "ci_method", "note", "label"} <= set(rows[0])
    assert sorted({row["rank"] for row in rows}) == ["1", "2", "3"]
    assert {row["rank_by"] for row in rows} == {"wis"}


def test_json_and_csv_runs_say_their_warnings_on_stderr(ope_in_process):
    """SPEC 1: warnings go to stderr. A JSON or CSV run kept them in the document only, so
    ``ope evaluate ... | jq .results`` showed a person none (a low ESS, the default gamma);
    each is now a line on stderr, stdout still the document alone, and --quiet keeps
    stderr empty. The table says them in its footer, on stdout, as before."""
    args = ["evaluate", "examples/data/logs.parquet", "-p", "examples/policies/ckpt.npz"]
    for output in ("json", "csv"):
        run = ope_in_process([*args, "-f", output])
        assert run.returncode == 0, run
        lines = run.stderr.splitlines()
        assert lines and all(line.startswith("warning: ") for line in lines), run.stderr
        assert any(line.startswith("warning: gamma is 1, the default") for line in lines)
        if output == "json":
            messages = [w["message"] for w in json.loads(run.stdout)["warnings"]]
            assert lines == [f"warning: {m}" for m in messages]
        quiet = ope_in_process([*args, "-f", output, "-q"])
        assert quiet.returncode == 0 and quiet.stderr == "", quiet
    table = ope_in_process([*args, "-f", "table"])
    assert table.stderr == "" and "warning: gamma is 1" in " ".join(table.stdout.split())


def test_inspect_and_fit_q_say_their_json_warnings_on_stderr(ope_in_process, tmp_path):
    """As evaluate does: inspect's and fit-q's JSON kept their warnings (the default gamma on
    200-step returns) in the document only. --quiet leaves them there; a table says them in
    itself; an inspection that finds problems keeps its one error line."""
    data = "examples/data/logs.parquet"
    fit = ["fit-q", data, "-p", "examples/policies/ckpt.npz", "-o", tmp_path / "q.npz"]
    for args in (["inspect", data], [*fit, "--overwrite"]):
        run = ope_in_process([*args, "-f", "json"])
        assert run.returncode == 0, run
        said = [f"warning: {w['message']}" for w in json.loads(run.stdout)["warnings"]]
        assert said and run.stderr.splitlines() == said, run
        assert said[0].startswith("warning: gamma is 1, the default")
        quiet = ope_in_process([*args, "-f", "json", "-q"])
        assert quiet.returncode == 0 and quiet.stderr == "", quiet
        table = ope_in_process([*args, "-f", "table"])
        assert table.stderr == "" and "warning: gamma is 1" in " ".join(table.stdout.split())


def test_policy_warnings_name_their_policy_in_json():
    """A low effective sample size, in JSON as in the footer, with the policy it concerns."""
    from test_report import EXAMPLES

    from ope_cli.config import EvaluationConfig
    from ope_cli.estimation.pipeline import evaluate
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
    shown = low["message"].replace(f"{policy}: ", "ckpt.npz: ", 1)  # the table's label
    assert f"warning: {shown}" in [text for text, _ in footer_lines(result, "wis")]


def test_run_wide_warnings_have_no_policy():
    """Floored estimated propensities and a policy left out of the ranking, in JSON."""
    from test_report import EXAMPLES

    from ope_cli.config import EvaluationConfig
    from ope_cli.estimation.pipeline import evaluate
    from ope_cli.models.behavior import BehaviorFit, BehaviorSource
    from ope_cli.report import to_json_dict

    policies = tuple(str(EXAMPLES / "policies" / n) for n in ("ckpt.npz", "other.npz"))
    result = evaluate(
        EvaluationConfig(str(EXAMPLES / "data" / "logs.parquet"), policies, gamma=1.0)
    )
    fit = BehaviorFit("linear_softmax", 10, 100, -1.0, 1e-3, floored=7, seconds=0.1)
    first = result.results[0]
    undefined = dict(first.estimates, wis=dataclasses.replace(first.estimates["wis"], value=None))
    result = dataclasses.replace(
        result,
        behavior=BehaviorSource("estimated", "linear_softmax", fit=fit),
        results=[dataclasses.replace(first, estimates=undefined), *result.results[1:]],
    )
    doc = to_json_dict(result)
    codes = {w["code"]: w for w in doc["warnings"]}
    assert codes["floored_propensities"]["policy"] is None
    assert "7 estimated behavior probabilities" in codes["floored_propensities"]["message"]
    assert codes["not_ranked"]["policy"] == policies[0]
    assert [r["rank"] for r in doc["results"]] == [None, 1]


# --- every estimate has an interval or a reason


def test_auto_names_the_method_per_estimator(evaluations):
    doc = _json(evaluations["declared"])
    estimates = doc["results"][0]["estimates"]
    for name in ("is", "wis", "pdis", "wpdis"):
        assert estimates[name]["ci_method"] == "betting", name
    for name in ("dm", "dr", "wdr"):  # auto: normal where betting does not apply
        assert estimates[name]["ci_method"] == "normal", name
        assert estimates[name]["ci_low"] < estimates[name]["value"] < estimates[name]["ci_high"]
        assert "note" not in estimates[name], name  # the betting note went with the null


def test_a_null_interval_always_has_a_note_shown_in_the_table(evaluations):
    doc = _json(evaluations["betting"])
    for name, estimate in doc["results"][0]["estimates"].items():
        if estimate["ci_low"] is None:
            assert estimate["note"], name
            assert estimate["ci_method"] is None, name
    assert doc["results"][0]["estimates"]["dr"]["ci_low"] is None  # --ci betting, as asked
    table = shown(evaluations["betting"], "table")
    assert "n/a (1)" in table
    assert "(1) betting intervals do not apply to this estimator" in table


# --- names that people read


def test_named_policies_and_short_labels(evaluations):
    doc = _json(evaluations["named"])
    best, other = doc["results"]
    assert (best["policy"], best["label"], best["source"]) == (
        "best",
        "best",
        "demo/policies/eval_0.npz",
    )
    assert (other["policy"], other["label"]) == ("demo/policies/eval_1.npz", "eval_1.npz")
    table = shown(evaluations["named"], "table")
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


def test_a_name_two_policies_would_share_is_refused(tmp_path, monkeypatch):
    """-p x=a.npz -p x=b.npz was accepted: "x" twice in every output, a warning of one on
    the other's CSV rows, and --baseline x picking one of them."""
    from ope_cli.models.policies import load_policies

    monkeypatch.chdir(tmp_path)
    for name in ("a.npz", "b.npz"):
        np.savez(tmp_path / name, kind=np.array("tabular"), logits=np.zeros((2, 2)))
    for specs in (["x=a.npz", "x=b.npz"], ["a.npz", "a.npz=b.npz"], ["x=a.npz", "x=a.npz"]):
        with pytest.raises(UsageError, match="give each policy its own name"):
            load_policies(specs)
    assert [p.label for p in load_policies(["x=a.npz", "y=a.npz", "b.npz"])] == ["x", "y", "b.npz"]
    # one policy twice (with two --q, say): two rows, told apart (both read "a.npz", tied)
    assert [p.label for p in load_policies(["a.npz", "a.npz", "a.npz"])] == [
        "a.npz",
        "a.npz #2",
        "a.npz #3",
    ]
    # a NAME cannot hold " #": no copy's label is another policy's NAME
    with pytest.raises(UsageError, match="cannot be a NAME"):
        load_policies(["a.npz #2=b.npz", "a.npz", "a.npz"])


def test_a_name_that_cannot_be_one_is_refused_as_such(tmp_path, monkeypatch):
    """'my policy=a.npz' said "no such checkpoint file", as if the whole were a path."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.npz").write_bytes(b"")
    for spec in ("my policy=a.npz", "a,b=a.npz", "'q'=a.npz"):
        with pytest.raises(UsageError, match="cannot be a NAME of NAME=PATH"):
            split_name(spec)
    assert split_name("ok=a.npz") == ("ok", "a.npz")
    assert split_name("missing name=b.npz") == (None, "missing name=b.npz")  # no such file


# --- nothing is overwritten silently


def _refused(run, path) -> None:
    assert run.returncode == 2 and run.stdout == "", run
    (line,) = run.stderr.splitlines()
    assert line.startswith(f"ope: usage error: {path}: already exists"), line
    assert "--overwrite" in line


def test_outputs_are_not_overwritten_without_overwrite(root, ope_in_process, tmp_path):
    truth = (root / "demo" / "truth.json").read_bytes()
    again = ope_in_process(["generate", "chain", "demo", "--episodes", "10"], cwd=root)
    _refused(again, "demo/logs.parquet")
    assert (root / "demo" / "truth.json").read_bytes() == truth
    assert pq.read_metadata(root / "demo" / "logs.parquet").num_rows > 10

    existing = tmp_path / "kept.npz"
    existing.write_bytes(b"keep")
    fits = {
        "fit-behavior": ["fit-behavior", "demo/logs.parquet", "--out", existing],
        "fit-q": [
            "fit-q",
            "demo/logs.parquet",
            "-p",
            "demo/policies/eval_0.npz",
            "--out",
            existing,
        ],
    }
    for args in fits.values():
        _refused(ope_in_process(args, cwd=root), existing)
        assert existing.read_bytes() == b"keep"


def test_plot_figures_are_not_overwritten(root, ope_in_process, tmp_path):
    pytest.importorskip("matplotlib")
    (tmp_path / "weights.png").write_bytes(b"keep")
    args = ["evaluate", "demo/logs.parquet", "-p", "demo/policies/eval_0.npz", "--plot", tmp_path]
    _refused(ope_in_process(args, cwd=root), tmp_path / "weights.png")
    assert (tmp_path / "weights.png").read_bytes() == b"keep"
    done = ope_in_process([*args, "--overwrite", "-q"], cwd=root)
    assert done.returncode == 0, done
    assert (tmp_path / "weights.png").read_bytes() != b"keep"


# --- help is a map


PYTHON_TYPE = re.compile(r"<(str|int|float|bool|path|list\[[^\]]*\]|[a-z_]+\|[a-z_|]+)>|\{\w+\}")


def _help(ope_in_process, *command: str):
    run = ope_in_process([*command, "--help"], env={"COLUMNS": "160"})
    assert run.returncode == 0, run
    return run.stdout


def test_help_names_no_python_type(ope_in_process):
    from ope_cli.cli import app

    commands = typer.main.get_command(app).commands
    for command in ((), *((name,) for name in commands)):
        text = _help(ope_in_process, *command)
        assert PYTHON_TYPE.search(text) is None, (command, PYTHON_TYPE.search(text))


def test_help_paragraphs_wrap_at_the_terminal_width(ope_in_process):
    """A paragraph after the first kept the docstring's line breaks: at 80 columns
    ``generate --help`` broke "OUT/truth.json (each" / "policy's true value)" in two."""
    from ope_cli.cli import app

    commands = typer.main.get_command(app).commands
    for name, command in commands.items():
        for paragraph in command.help.split("\n\n"):
            assert "\n" not in paragraph or paragraph.startswith("\b"), (name, paragraph)
    shown = ope_in_process(["generate", "--help"], env={"COLUMNS": "80"}).stdout
    words = " ".join(line.strip(" │") for line in shown.splitlines())
    assert "OUT/truth.json (each policy's true value)" in " ".join(words.split())
    lines = [line.rstrip() for line in shown.split("╭")[0].splitlines()]
    assert not any(line.endswith("(each") for line in lines), shown


def test_evaluate_help_is_grouped_in_panels_with_choices(ope_in_process):
    from ope_cli.estimation.estimators import names
    from ope_cli.estimation.intervals import INTERVALS

    text = _help(ope_in_process, "evaluate")
    panels = re.findall(r"╭─ (.+?) ─", text)
    assert panels == ["Arguments", "Options", *helpmap.PANEL_ORDER], panels
    words = " ".join(text.replace("│", " ").split())
    for choices in (names(), ("auto", *INTERVALS)):  # --estimator, --rank-by; --ci
        assert all(f" {name} |" in words or f"| {name} " in words for name in choices)
    assert "table | json | csv" in text and "FLOAT" in text and "INT" in text
    assert "Usage: ope evaluate [OPTIONS] DATA" in text
    assert "DM, DR, WDR" in _help(ope_in_process)  # the tool's line names every estimator


def test_choices_wrap_between_words_in_a_narrow_help(ope_in_process):
    """At 80 columns the help folded metavars mid-word ("mlp_s / oftmax",
    "package.module:n / ame"): every option's alternatives are spaced, so they wrap between
    them (an argument's stay joined: the usage line reads them as one word)."""
    from ope_cli.cli import app

    for name, command in typer.main.get_command(app).commands.items():
        for param in (p for p in command.params if p.param_type_name == "option"):
            assert re.search(r"\S\|\S", param.metavar or "") is None, (name, param.metavar)
    run = ope_in_process(["fit-behavior", "--help"], env={"COLUMNS": "80"})
    assert "mlp_softmax |" in run.stdout and not re.search(r"mlp_s(?!oftmax)", run.stdout)


def test_bench_help_groups_its_own_options_in_panels(ope_in_process):
    """They all stood under the generic "Options", with a metavar "INT [x>=1]"."""
    text = _help(ope_in_process, "bench")
    panels = re.findall(r"╭─ (.+?) ─", text)
    assert panels == ["Options", "Data and columns", "Measurements", "Output", "Performance"]
    options = text[text.index("╭─ Options") : text.index("╭─ Data and columns")]
    assert re.findall(r"--[a-z-]+", options) == ["--help"], options
    assert "x>=" not in text


def test_ope_alone_prints_the_help_and_succeeds(ope_in_process, ope):
    alone = ope_in_process([])
    assert alone.returncode == 0 and alone.stderr == "", alone
    assert "Usage: ope" in alone.stdout and "evaluate" in alone.stdout
    real = ope([])  # across the process boundary too
    assert real.returncode == 0 and "Usage: ope" in real.stdout, real


def test_generate_lists_the_registered_environments():
    from ope_cli.cli.generate import ENVIRONMENT_CHOICES
    from ope_cli.envs.registry import ENVIRONMENTS

    assert ENVIRONMENT_CHOICES == "|".join(ENVIRONMENTS)


# --- errors carry the fix


def _error_line(run, code: int) -> str:
    assert run.returncode == code and run.stdout == "", run
    (line,) = run.stderr.splitlines()
    return line


def test_errors_carry_the_fix(root, ope_many_in_process):
    policy = "demo/policies/eval_0.npz"
    table = pq.read_table(root / "demo" / "logs.parquet")
    rewards = table.column("reward").to_numpy().copy()
    rewards[3] = float("nan")
    pq.write_table(
        table.set_column(table.schema.get_field_index("reward"), "reward", pa.array(rewards)),
        root / "nan.parquet",
    )
    calls = {
        "glob": ["demo/logs.parquet", "-p", policy, "demo/policies/eval_1.npz"],
        "directory": ["demo/logs.parquet", "-p", "demo/policies"],
        "rank_by": ["demo/logs.parquet", "-p", policy, "--rank-by", "dr"],
        "invalid": ["nan.parquet", "-p", policy],
        "too_long": ["demo/logs.parquet", "-p", policy, "--horizon", "2"],
        "format": ["demo/logs.parquet", "-p", policy, "--format", "xml"],
    }
    runs = ope_many_in_process(
        {name: {"args": ["evaluate", *args], "cwd": root} for name, args in calls.items()}
    )
    line = _error_line(runs["glob"], 2)
    assert "unexpected extra argument" in line and "quote a glob pattern" in line
    assert "repeat --policy" in line
    line = _error_line(runs["directory"], 4)
    assert "demo/policies: a directory" in line and "'demo/policies/*.npz'" in line
    line = _error_line(runs["rank_by"], 2)
    assert "--rank-by dr" in line and "--q" in line
    line = _error_line(runs["invalid"], 3)
    assert "reward" in line and "ope inspect nan.parquet" in line and "--on-invalid drop" in line
    line = _error_line(runs["too_long"], 3)  # a bound is never dropped: no drop to suggest
    assert "longer than the horizon of 2 steps (--horizon)" in line
    assert "ope inspect demo/logs.parquet" in line and "--on-invalid drop" not in line
    line = _error_line(runs["format"], 2)
    assert "'xml' is not one of" in line and "Value error" not in line


# --- progress says what is happening


def test_progress_shows_a_step_without_rows_without_an_eta():
    """A compilation midway: the status names the step, the bar pulses and no ETA is shown;
    back to evaluating with rows left, the ETA is back; with every row read, the last
    batches show no ETA either (it said "eta 0:00:00" while work remained)."""
    import time

    from rich.console import Console

    from ope_cli.cli.progress import ALL_READ, ProgressDisplay

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=140)
    with ProgressDisplay(quiet=False, console=console, delay=0.0) as (on_progress, on_status):
        time.sleep(0.2)  # the delayed start
        on_progress(500, 1_000)
        time.sleep(0.2)
        on_status("compiling shape 1 of 3")
        time.sleep(0.3)  # rich refreshes while the caller is busy
        on_status("evaluating")
        time.sleep(0.3)
        on_progress(1_000, 1_000)
        time.sleep(0.3)
    frames = re.split(r"\r|\x1b\[2K|\x1b\[1A", out.getvalue())
    compiling = [f for f in frames if "compiling shape 1 of 3" in f]
    evaluating = [f for f in frames if "evaluating" in f and ALL_READ not in f]
    last = [f for f in frames if ALL_READ in f]
    assert compiling and all("eta" not in f for f in compiling), compiling
    assert evaluating and all("eta" in f for f in evaluating), evaluating
    assert last and all("eta" not in f for f in last), last


def test_fit_q_takes_the_declared_gamma_too(root, ope_in_process, tmp_path):
    args = ["fit-q", "demo/logs.parquet", "-p", "demo/policies/eval_0.npz", "-f", "json"]
    declared = ope_in_process([*args, "--out", tmp_path / "d.npz"], cwd=root)
    given = ope_in_process([*args, "--out", tmp_path / "g.npz", "--gamma", "0.5"], cwd=root)
    for run, named in ((declared, (GAMMA, "data")), (given, (0.5, "option"))):
        assert run.returncode == 0, run
        doc = json.loads(run.stdout)
        assert (doc["gamma"], doc["gamma_source"]) == named


@pytest.mark.parametrize(
    ("args", "fix"),
    [
        (
            ["evaluate", "d.parquet", "-p", "a.npz", "b.npz"],
            "--policy takes one value at a time: repeat --policy",
        ),
        (
            ["evaluate", "d.parquet", "-p", "a.npz", "--q", "a.npz", "b.npz"],
            "--q takes one value at a time: repeat --q",
        ),
        (
            ["--debug", "evaluate", "d.parquet", "e.parquet"],
            "quote a glob pattern ('logs/*.parquet')",
        ),
        (
            ["fit-q", "d.parquet", "-p", "a.npz", "--out", "q.npz", "r.npz"],
            "--out takes one value: quote",
        ),
        # after a flag, or after DATA with the options first: DATA's glob, not the option's
        (["evaluate", "d.parquet", "-p", "a.npz", "-q", "x"], "quote a glob pattern ('logs/*"),
        (["evaluate", "-p", "a.npz", "d.parquet", "e.parquet"], "quote a glob pattern ('logs/*"),
        (["evaluate", "--gamma", "0.9", "d.parquet", "e"], "quote a glob pattern ('logs/*"),
        (["evaluate", "d.parquet", "--policy=a.npz", "b.npz"], "repeat --policy before each"),
        (["evaluate", "d.parquet", "-pa.npz", "b.npz"], "repeat --policy before each"),
        (["evaluate", "d.parquet", "-qp", "a.npz", "b.npz"], "repeat --policy before each"),
        (["evaluate", "d.parquet", "-p", "a(1).npz", "b(2).npz"], "repeat --policy before each"),
        (["evaluate", "d", "--reward-range", "0", "1", "2"], "--reward-range takes 2 values"),
        # a number's option, and a command without arguments: no glob to quote
        (["bench", "--rounds", "1", "extra"], "--rounds takes one number: drop the extra"),
        (["evaluate", "d", "--top-k", "1", "2"], "--top-k takes one number at a time: repeat"),
        (["evaluate", "d", "--format", "json", "x"], "--format takes one of its choices: drop"),
        (["bench", "extra"], "ope bench takes no arguments but its options: drop the extra"),
        (["bench", "--data", "a.parquet", "b.parquet"], "--data takes one value: quote a glob"),
        # -p's glob before DATA: its second file was taken as DATA (same suffix), not DATA's
        (["evaluate", "-p", "a.npz", "b.npz", "c.npz", "d.parquet"], "repeat --policy before"),
    ],
)
def test_extra_arguments_name_the_option_they_ran_into(args, fix, capsys):
    """An unquoted glob after --q was told to "repeat --policy before each value", and so
    was one after DATA or --out: the fix names the option (or the path) the values ran into."""
    assert run_ope(args) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.count("\n") == 1
    assert "Got unexpected extra argument" in captured.err and fix in captured.err


@pytest.mark.parametrize(
    ("args", "line"),
    [
        (["evaluate", "d.parquet", "--gamma", "abc"], "--gamma takes a number, got 'abc'"),
        (["evaluate", "d.parquet", "--gamma=x"], "--gamma takes a number, got 'x'"),
        (
            ["generate", "chain", "out", "--episodes", "1e3"],
            "--episodes takes a whole number (an integer), got '1e3'",
        ),
        # the value rejected: a repeatable option's first bad one, a one-value option's last
        (
            ["evaluate", "d", "--top-k", "x", "--top-k", "1"],
            "--top-k takes a whole number (an integer), got 'x'",
        ),
        (["evaluate", "d", "--gamma", "xyz", "--gamma=abc"], "--gamma takes a number, got 'abc'"),
        (
            ["evaluate", "d", "--reward-range", "abc", "1"],
            "--reward-range takes a number, got 'abc'",
        ),
        (["evaluate", "d", "--reward-range", "a", "b"], "--reward-range takes a number, got 'a'"),
    ],
)
def test_a_number_that_does_not_parse_is_named_with_its_value(args, line, capsys):
    """The validation library's "Input should be a valid number, unable to parse string as
    a number" reached the user, without the value it could not parse."""
    assert run_ope(args) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == f"ope: usage error: {line}\n"


@pytest.mark.parametrize(
    ("command", "args"),
    [
        ("fit-q", ["-p", "demo/policies/eval_0.npz", "--out", "{tmp}/q.npz"]),
        ("fit-behavior", ["--out", "{tmp}/b.npz"]),
        ("convert", ["{tmp}/c.parquet"]),
        ("inspect", []),
    ],
)
def test_every_json_document_starts_with_the_schema_version_and_the_tool(
    root, ope_in_process, tmp_path, command, args
):
    """fit-q's, fit-behavior's and convert's JSON had neither schema_version nor tool,
    which inspect's and evaluate's start with: a script could not tell their versions."""
    from ope_cli import __version__

    given = [arg.format(tmp=tmp_path) for arg in args]
    run = ope_in_process([command, "demo/logs.parquet", *given, "-f", "json"], cwd=root)
    assert run.returncode == 0, run
    document = json.loads(run.stdout)
    assert list(document)[:3] == ["schema_version", "tool", "command"]
    assert document["schema_version"] == 1 and document["command"] == command
    assert document["tool"] == {"name": "ope", "version": __version__}


@pytest.mark.parametrize(
    ("option", "code", "line"),
    [
        # each was read as the working directory: --policy and --q then proposed the glob
        # '/*.npz' (the root's checkpoints), --plot wrote its figures there, --truth could
        # not read "" (Is a directory)
        ("--policy", 4, "invalid policy: an empty path names no checkpoint"),
        ("--q", 4, "invalid policy: an empty path names no Q checkpoint"),
        ("--plot", 2, "usage error: --plot needs a directory; an empty path names none"),
        ("--truth", 2, "usage error: --truth needs a truth.json; an empty path names none"),
    ],
)
def test_an_empty_path_is_refused_rather_than_read_as_the_working_directory(
    option, code, line, tmp_path, monkeypatch, capsys
):
    from test_report import EXAMPLES

    monkeypatch.chdir(tmp_path)
    policy = [] if option == "--policy" else ["--policy", str(EXAMPLES / "policies" / "ckpt.npz")]
    args = ["evaluate", str(EXAMPLES / "data" / "logs.parquet"), *policy, option, ""]
    assert run_ope(args) == code
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == f"ope: {line}\n"
    assert list(tmp_path.iterdir()) == []


def test_fit_q_refuses_an_empty_policy_as_evaluate_does(tmp_path, capsys):
    """fit-q --policy "" said ": expected an .npz checkpoint or an entry point"."""
    from test_report import EXAMPLES

    data = str(EXAMPLES / "data" / "logs.parquet")
    assert run_ope(["fit-q", data, "--policy", "", "--out", str(tmp_path / "q.npz")]) == 4
    captured = capsys.readouterr()
    assert (captured.out, captured.err) == (
        "",
        "ope: invalid policy: an empty path names no checkpoint\n",
    )
