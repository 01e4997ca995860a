"""Paired comparisons, could-be-best sets and selection metrics of an evaluation (SPEC 11):
against the plain NumPy reference on random data, across batchings, on ``ope generate``
data with known values, the refusals of the choosing options, and the table and CSV
output of ``ope evaluate``."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import re

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasets import (
    perturb_checkpoint,
    random_checkpoint,
    random_episodes,
    save_checkpoint,
    to_reference_input,
    write_step_layout,
)
from reference import reference_paired, reference_replicates
from rendered import shown
from rich.console import Console

import ope_cli
from ope_cli.api import evaluation_config
from ope_cli.choosing.comparison import (
    CROSSED_BETTING,
    NO_DIFFERENCE,
    NO_SPREAD,
    NO_WEIGHT,
    TIED,
    read_run_truth,
    resolve_baseline,
)
from ope_cli.config import ChoosingConfig, EvaluationConfig, IntervalConfig
from ope_cli.data.ids import RESAMPLING_GROUPS, id_keys
from ope_cli.envs.generate import generate
from ope_cli.errors import UsageError
from ope_cli.estimation.bootstrap_counts import replicate_counts
from ope_cli.estimation.pipeline import WEIGHTLESS, evaluate
from ope_cli.models.policies import load_policies
from ope_cli.report.json_format import to_json_dict
from ope_cli.report.table import _comparison_table

GAMMA = 0.95


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """300 episodes of skewed lengths logged by a random linear-softmax policy, and three
    evaluation policies near it (moderate weights, so the reference runs in plain float64)."""
    rng = np.random.default_rng(11)
    folder = tmp_path_factory.mktemp("paired")
    behavior = random_checkpoint("linear_softmax", rng, temperature=1.0)
    episodes = random_episodes(rng, 300, behavior=behavior, median_length=8, max_length=60)
    data = write_step_layout(episodes, folder / "logs.parquet")
    checkpoints = [perturb_checkpoint(behavior, rng, 0.3) for _ in range(3)]
    paths = [save_checkpoint(folder / f"p{i}.npz", c) for i, c in enumerate(checkpoints)]
    save_checkpoint(folder / "behavior.npz", behavior)
    return data, episodes, checkpoints, paths


def _run(logged, baseline, **options):
    data, _, _, paths = logged
    config = evaluation_config(
        str(data),
        policies=tuple(str(p) for p in paths),
        gamma=GAMMA,
        baseline=baseline,
        **options.pop("batching", {}),
        **options,
    )
    return evaluate(config)


def _reference_rows(logged):
    _, episodes, checkpoints, _ = logged
    rows = [to_reference_input(episodes, c) for c in checkpoints]
    behavior = [{**ep, "log_target": ep["log_behavior"]} for ep in rows[0]]
    keys = id_keys(np.array([ep["episode_id"] for ep in episodes]))
    groups = (keys % np.uint64(RESAMPLING_GROUPS)).astype(int)
    return rows + [behavior], keys, groups


@pytest.mark.parametrize(
    ("baseline", "row", "batching"),
    [
        ("0", 0, {}),
        # another batching too: a property, with the slow tests
        pytest.param("behavior", 3, {"batch_steps": 512, "min_bucket": 4}, marks=pytest.mark.slow),
    ],
)
def test_paired_differences_match_the_reference(logged, baseline, row, batching):
    name = str(logged[3][int(baseline)]) if baseline != "behavior" else baseline
    result = _run(logged, name, batching=batching)
    rows, _, groups = _reference_rows(logged)
    assert result.baseline == name
    for k, policy in enumerate(result.results):
        if k == row:
            assert policy.comparison is None
            continue
        expected = reference_paired(rows[k], rows[row], GAMMA, groups)
        for estimator, (delta, stderr) in expected.items():
            got = policy.comparison[estimator]
            assert got.delta == pytest.approx(delta, rel=1e-9, abs=1e-12), estimator
            assert got.stderr == pytest.approx(stderr, rel=1e-9), estimator
            z = (got.ci_high - got.delta) / got.stderr
            assert z == pytest.approx(1.959964, rel=1e-5)  # normal, 95%
            assert got.p_improvement is None  # no bootstrap replicates


def test_paired_percentile_intervals_are_the_replicate_differences(logged):
    samples = 64
    result = _run(logged, str(logged[3][0]), interval="percentile", bootstrap_samples=samples)
    rows, keys, _ = _reference_rows(logged)
    hi, lo = (
        (keys >> np.uint64(32)).astype(np.uint32),
        (keys & np.uint64(0xFFFFFFFF)).astype(np.uint32),
    )
    counts = replicate_counts(hi, lo, np.uint32(0), samples)
    replicates = [reference_replicates(r, GAMMA, counts) for r in rows]
    for k in (1, 2):
        for estimator in ("is", "wis", "pdis", "wpdis"):
            d = replicates[k][estimator] - replicates[0][estimator]
            got = result.results[k].comparison[estimator]
            low, high = np.quantile(d, [0.025, 0.975])
            assert got.ci_low == pytest.approx(low, rel=1e-9), estimator
            assert got.ci_high == pytest.approx(high, rel=1e-9), estimator
            assert got.p_improvement == pytest.approx(np.mean(d > 0)), estimator


@pytest.mark.parametrize("ci", ["percentile", "bootstrap-t", "normal"])
def test_a_policy_against_its_own_logs_is_a_tie(logged, ci):
    """The behavior checkpoint against the behavior row (the logged probabilities) differs
    only by float64 rounding (~1e-16): a difference of 0 ± 0, the interval [0, 0], no
    replicate better (SPEC 11: the share with a difference > 0) and a note, not a sign
    read off the rounding."""
    data, _, _, paths = logged
    own = str(data.parent / "behavior.npz")
    result = evaluate(
        evaluation_config(
            str(data), policies=(own, str(paths[0])), gamma=GAMMA, baseline="behavior", ci=ci
        )
    )
    assert set(result.results[0].comparison) == {"is", "wis", "pdis", "wpdis"}
    for estimator, comparison in result.results[0].comparison.items():
        assert (comparison.delta, comparison.stderr) == (0.0, 0.0), estimator
        assert (comparison.ci_low, comparison.ci_high) == (0.0, 0.0), estimator
        assert comparison.p_improvement == (None if ci == "normal" else 0.0), estimator
        assert comparison.note == TIED
    assert result.results[1].comparison["is"].delta != 0.0


@pytest.mark.parametrize("ci", ["percentile", "bootstrap-t"])
def test_a_policy_against_its_own_copy_is_a_tie(logged, tmp_path, ci):
    """Bitwise-equal terms: every interval is [0, 0] (bootstrap-t studentized by a standard
    error of 0 gave 0/0, a null interval)."""
    data, _, _, paths = logged
    copy = tmp_path / "copy.npz"
    copy.write_bytes(paths[0].read_bytes())
    config = evaluation_config(
        str(data), policies=(str(paths[0]), str(copy)), gamma=GAMMA, baseline=str(paths[0]), ci=ci
    )
    for estimator, comparison in evaluate(config).results[1].comparison.items():
        assert (comparison.delta, comparison.stderr) == (0.0, 0.0), estimator
        assert (comparison.ci_low, comparison.ci_high) == (0.0, 0.0), estimator
        assert comparison.note == TIED


def test_a_null_interval_says_why_and_the_table_shows_every_note(logged, tmp_path):
    """On one episode no difference has a standard error: each null interval carries a
    note (they had none), which the table shows; a tie's note shows beside its [0, 0]."""
    data, _, _, paths = logged
    table = pq.read_table(data)
    first = table.column("episode_id")[0]
    one = table.filter(np.asarray(table.column("episode_id")) == first.as_py())
    pq.write_table(one, tmp_path / "one.parquet")
    copy = tmp_path / "copy.npz"
    copy.write_bytes(paths[0].read_bytes())
    policies = (str(paths[0]), str(paths[1]), str(copy))
    config = evaluation_config(
        str(tmp_path / "one.parquet"), policies=policies, gamma=GAMMA, baseline=str(paths[0])
    )
    result = evaluate(config)
    for estimator, comparison in result.results[1].comparison.items():
        assert comparison.ci_low is None and comparison.note == NO_SPREAD, estimator
    tied = evaluate(dataclasses.replace(config, data=str(data)))
    assert tied.results[2].comparison["is"].note == TIED
    for run, cell in ((result, f"n/a ({NO_SPREAD})"), (tied, f"[0, 0] ({TIED})")):
        console = Console(width=400, file=io.StringIO(), color_system=None)
        console.print(_comparison_table(run))  # wide: each cell on one line
        assert cell in console.file.getvalue()


@pytest.mark.slow  # a property: invariance to the batching
def test_comparisons_do_not_depend_on_the_batching(logged):
    first = _run(logged, "behavior")
    second = _run(logged, "behavior", batching={"batch_steps": 256, "min_bucket": 2})
    for a, b in zip(first.results, second.results, strict=True):
        for estimator, comparison in a.comparison.items():
            other = b.comparison[estimator]
            assert other.delta == pytest.approx(comparison.delta, rel=1e-10)
            assert other.stderr == pytest.approx(comparison.stderr, rel=1e-10)
        assert a.could_be_best == b.could_be_best


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    folder = tmp_path_factory.mktemp("chain")
    truth = generate("chain", folder, episodes=2000, seed=3, gamma=0.95)
    return folder, truth


def test_pairing_narrows_the_standard_error_on_generated_data(chain):
    folder, truth = chain
    policies = [folder / "policies" / f"eval_{k}.npz" for k in (0, 1)]
    document = ope_cli.evaluate(
        folder / "logs.parquet", policies=policies, baseline=str(policies[1])
    ).to_dict()
    first, second = document["results"]
    assert document["baseline"] == str(policies[1])
    assert "comparison" not in second
    paired = first["comparison"]["pdis"]
    se0, se1 = first["estimates"]["pdis"]["stderr"], second["estimates"]["pdis"]["stderr"]
    assert paired["stderr"] < 0.7 * math.sqrt(se0**2 + se1**2)
    exact = {entry["policy"]: entry["value"] for entry in truth["policies"]}
    difference = exact["policies/eval_0.npz"] - exact["policies/eval_1.npz"]
    assert abs(paired["delta"] - difference) < 4 * paired["stderr"]


def test_truth_gives_selection_metrics_and_could_be_best_sets(chain, monkeypatch):
    folder, _ = chain
    monkeypatch.chdir(folder)
    document = ope_cli.evaluate(
        folder / "logs.parquet",
        policies=folder / "policies" / "*.npz",
        truth=str(folder / "truth.json"),
        ci="normal",
    ).to_dict()
    selection = document["selection"]
    assert set(selection) == {"is", "wis", "pdis", "wpdis"}
    assert {"rmse", "nmse", "spearman", "coverage", "regret@1", "regret@3"} <= set(selection["wis"])
    assert selection["wis"]["spearman"] == pytest.approx(1.0)  # 3 well separated policies
    flags = [r["could_be_best"]["wis"] for r in document["results"]]
    assert flags[0] and not flags[2]  # eval_2 (a worse policy) is confidently worse
    assert document["baseline"] is None


@pytest.mark.parametrize(
    ("baseline", "truth", "top_k", "words"),
    [
        ("nope.npz", None, None, "--baseline nope.npz: no --policy is called that"),
        ("behavior", None, None, "--baseline behavior is ambiguous: a --policy is also"),
        # it printed no comparison and said nothing
        ("policies/eval_0.npz", None, None, "--baseline policies/eval_0.npz is the only"),
        (None, None, (1,), "--top-k needs --truth"),
        (None, "truth.json", (9,), "--top-k 9 exceeds the 3 policies"),
    ],
)
def test_choosing_options_refuse_in_one_line(chain, monkeypatch, baseline, truth, top_k, words):
    """Checked as the pipeline checks them before reading a row: the baseline, then the
    truth with --top-k."""
    folder, _ = chain
    monkeypatch.chdir(folder)
    named = [f"behavior={folder / 'policies' / 'eval_0.npz'}"]  # the logging policy's name
    given = {"behavior": named, "policies/eval_0.npz": ["policies/eval_0.npz"]}
    policies = load_policies(given.get(baseline, [str(folder / "policies" / "*.npz")]))
    with pytest.raises(UsageError, match=re.escape(words)) as raised:
        resolve_baseline(baseline, policies)
        read_run_truth(truth, top_k, policies)
    assert "\n" not in str(raised.value)


def test_a_baseline_path_may_be_spelled_another_way(chain, monkeypatch):
    """./policies/eval_1.npz or its absolute path names the policy given as
    policies/eval_1.npz (it was refused: "no --policy is called that"); a path that two
    --policy values load is refused as ambiguous."""
    folder, _ = chain
    monkeypatch.chdir(folder)
    policies = load_policies(["policies/eval_0.npz", "policies/eval_1.npz"])
    for spelling in (
        "policies/eval_1.npz",
        "./policies/eval_1.npz",
        "policies/../policies/eval_1.npz",
    ):
        assert resolve_baseline(spelling, policies) == 1
    assert resolve_baseline(str(folder / "policies" / "eval_0.npz"), policies) == 0
    twice = load_policies(
        ["policies/eval_0.npz", "again=policies/eval_0.npz", "policies/eval_1.npz"]
    )
    with pytest.raises(UsageError, match=re.escape("--baseline ./policies/eval_0.npz names 2")):
        resolve_baseline("./policies/eval_0.npz", twice)
    assert resolve_baseline("again", twice) == 1
    # however the other is spelled: it named the first quietly when spelled as it was given
    spelled = load_policies(["policies/eval_0.npz", "./policies/eval_0.npz"])
    with pytest.raises(UsageError, match=re.escape("--baseline policies/eval_0.npz names 2")):
        resolve_baseline("policies/eval_0.npz", spelled)


def test_a_baseline_spelled_another_way_is_the_policy_s_in_every_format(
    chain, monkeypatch, ope_in_process
):
    """The report names the baseline as results[i].policy: given as ./policies/eval_1.npz,
    the CSV's baseline_value was empty and the ranking figure drew no baseline."""
    folder, _ = chain
    monkeypatch.chdir(folder)
    args = ["evaluate", "logs.parquet", "-p", "policies/eval_0.npz", "-p", "policies/eval_1.npz"]
    args += ["-e", "is", "--baseline", "./policies/eval_1.npz"]
    document = json.loads(ope_in_process([*args, "-f", "json"], cwd=folder).stdout)
    assert document["baseline"] == "policies/eval_1.npz" == document["results"][1]["policy"]
    rows = list(
        csv.DictReader(io.StringIO(ope_in_process([*args, "-f", "csv"], cwd=folder).stdout))
    )
    (compared,) = [row for row in rows if row["delta"]]
    second = document["results"][1]["estimates"]["is"]["value"]
    assert compared["baseline"] == "policies/eval_1.npz"
    assert float(compared["baseline_value"]) == pytest.approx(second, rel=1e-12)


def test_could_be_best_sets_under_bootstrap_t_are_the_percentile_ones(tmp_path):
    """The sets use percentile intervals for every pair, the baseline's included (on this
    data a studentized interval against the baseline kept eval_2 in the IS set)."""
    generate("chain", tmp_path, episodes=400, seed=1, gamma=0.95)
    policies = sorted((tmp_path / "policies").glob("eval_*.npz"))

    def sets(ci: str) -> list[dict[str, bool]]:
        evaluation = ope_cli.evaluate(
            tmp_path / "logs.parquet",
            policies=policies,
            baseline=str(policies[2]),
            ci=ci,
            bootstrap_samples=200,
        )
        return [r.could_be_best for r in evaluation.results]

    percentile = sets("percentile")
    # 200 replicates are enough for the sets of 3 policies (80): each flag is determined
    assert all(isinstance(flag, bool) for flags in percentile for flag in flags.values())
    assert not percentile[2]["is"]
    assert sets("bootstrap-t") == percentile


def test_table_and_csv_show_the_comparisons_and_the_selection(chain):
    folder, _ = chain
    evaluation = ope_cli.evaluate(
        str(folder / "logs.parquet"),
        policies=str(folder / "policies" / "*.npz"),
        baseline="behavior",
        truth=str(folder / "truth.json"),
        ci="normal",
    )
    table = shown(evaluation, "table")
    assert "against the baseline behavior" in table
    # P(better) is n/a under --ci normal: the table says what gives it
    assert "P(better): bootstrap replicates, with --ci percentile or bootstrap-t" in table
    assert "◆ could be the best" in table
    assert "selection against the true values" in table and "regret@3" in table
    # sharpe@1 is n/a in every run: the table says why (the baseline's clause only where
    # there is a baseline: without one it named a baseline the run did not have)
    words = " ".join(table.split())
    assert "sharpe@k: n/a where the top k's true values have no spread" in words
    assert "or the baseline has no true value" in words
    alone = ope_cli.evaluate(
        str(folder / "logs.parquet"),
        policies=str(folder / "policies" / "*.npz"),
        truth=str(folder / "truth.json"),
        ci="normal",
    )
    words = " ".join(shown(alone, "table").split())
    assert "sharpe@k: n/a where the top k's true values have no spread (always for k = 1)" in words
    assert "baseline" not in words
    rows = list(csv.DictReader(io.StringIO(shown(evaluation, "csv"))))
    by_key = {(r["label"], r["estimator"]): r for r in rows}
    worse = by_key["eval_2.npz", "wis"]
    assert float(worse["delta_ci_high"]) < 0 and worse["could_be_best"] == "false"
    assert by_key["eval_0.npz", "wis"]["could_be_best"] == "true"
    assert float(worse["selection_spearman"]) == pytest.approx(1.0)


def test_plot_adds_the_ranking_figure_with_the_baseline_and_truth(chain, tmp_path):
    from ope_cli.report.plots import ranked_rows

    folder, truth = chain
    policies = tuple(str(folder / "policies" / f"eval_{k}.npz") for k in range(3))
    config = EvaluationConfig(
        data=str(folder / "logs.parquet"),
        policies=policies,
        choosing=ChoosingConfig(baseline="behavior", truth=str(folder / "truth.json")),
        intervals=IntervalConfig(method="normal"),
    )
    result = evaluate(config)
    rows, baseline = ranked_rows(result, "wis")
    assert baseline == "behavior"
    assert [r.name for r in rows][-1] == "behavior"
    assert rows[-1].estimate == pytest.approx(result.behavior_value)
    logs = pq.read_table(folder / "logs.parquet")
    ids, step, reward = (logs.column(c).to_numpy() for c in ("episode_id", "step", "reward"))
    _, episode = np.unique(ids, return_inverse=True)
    mean_return = np.bincount(episode, reward * result.gamma**step).mean()
    assert result.behavior_value == pytest.approx(mean_return, rel=1e-12)
    assert to_json_dict(result)["behavior_value"] == result.behavior_value  # in the JSON too
    assert rows[-1].truth == truth["behavior"]["value"]
    assert [r.could_be_best for r in rows[:3]] == [r.could_be_best["wis"] for r in result.results]
    assert all(r.truth is not None for r in rows)


def test_a_truth_without_a_policy_leaves_it_out_with_a_warning(chain, monkeypatch):
    folder, truth = chain
    values = {entry["policy"]: entry["value"] for entry in truth["policies"][:2]}
    (folder / "partial.json").write_text(json.dumps(values))
    monkeypatch.chdir(folder)
    document = ope_cli.evaluate(
        "logs.parquet", policies="policies/*.npz", truth="partial.json"
    ).to_dict()
    notes = [w["message"] for w in document["warnings"] if w["code"] == "selection"]
    assert any("no value for eval_2.npz;" in note for note in notes), notes  # as shown
    assert document["selection"]["wis"]["rmse"] is not None
    assert not any("as the baseline" in note for note in notes), notes
    # the baseline without a value: sharpe@k was null without a word (behavior's said so)
    document = ope_cli.evaluate(
        "logs.parquet", policies="policies/*.npz", truth="partial.json", baseline="eval_2.npz"
    ).to_dict()
    notes = [w["message"] for w in document["warnings"] if w["code"] == "selection"]
    assert any(note.endswith("; as the baseline, no sharpe@k") for note in notes), notes
    assert document["selection"]["wis"]["sharpe@1"] is None


def test_a_truth_of_more_policies_serves_the_ones_given(chain, monkeypatch):
    """ope generate's truth.json with two of its three policies evaluated exited 2 ("--truth
    names 'policies/eval_2.npz', which is not one of the --policy values given")."""
    folder, truth = chain
    monkeypatch.chdir(folder)
    given = ["policies/eval_0.npz", "policies/eval_1.npz"]
    run = ope_cli.evaluate("logs.parquet", policies=given, truth="truth.json").to_dict()
    exact = {entry["policy"]: entry["value"] for entry in truth["policies"]}
    wis = [r["estimates"]["wis"]["value"] for r in run["results"]]
    rmse = math.sqrt(np.mean([(w - exact[p]) ** 2 for w, p in zip(wis, given, strict=True)]))
    assert run["selection"]["wis"]["rmse"] == pytest.approx(rmse, rel=1e-12)
    assert not [w for w in run["warnings"] if w["code"] == "selection"]
    # an object naming only other policies leaves the given ones without a value, said
    (folder / "extra.json").write_text(json.dumps({"policies/nope.npz": 1.0}))
    policies = load_policies(given)
    assert set(read_run_truth("extra.json", None, policies).values()) == {None}


def test_doubly_robust_differences_are_the_differences_of_the_estimates(chain, monkeypatch):
    """With a Q source: dm, dr (means of terms) and wdr (a ratio, jackknifed) pair too."""
    folder, _ = chain
    monkeypatch.chdir(folder)
    results = ope_cli.evaluate(
        "logs.parquet",
        policies="policies/*.npz",
        q="q/eval_*.npz",
        baseline="policies/eval_2.npz",
        ci="normal",
    ).results
    baseline = results[2].estimates
    for result in results[:2]:
        for name in ("dm", "dr", "wdr"):
            got = result.comparison[name]
            expected = result.estimates[name].value - baseline[name].value
            assert got.delta == pytest.approx(expected, rel=1e-9), name
            assert 0 < got.stderr < result.estimates[name].stderr + 1.0


def test_csv_carries_the_level_and_each_difference_s_note(chain):
    """CSV gave the intervals without their level and dropped every difference's note (a
    tie with the baseline, a percentile fallback, why an interval is missing), which JSON
    and the table carry."""
    folder, _ = chain
    policy = str(folder / "policies" / "eval_0.npz")
    evaluation = ope_cli.evaluate(
        str(folder / "logs.parquet"),
        policies=(f"same={policy}", f"base={policy}", str(folder / "policies" / "eval_1.npz")),
        baseline="base",
        ci="normal",
        confidence=0.9,
    )
    rows = list(csv.DictReader(io.StringIO(shown(evaluation, "csv"))))
    document = evaluation.to_dict()
    notes = {
        (r["label"], name): c.get("note") or ""
        for r in document["results"]
        for name, c in r.get("comparison", {}).items()
    }
    assert any(notes.values())  # the tie's
    for row in rows:
        assert float(row["ci_level"]) == 0.9
        assert row["delta_note"] == notes.get((row["label"], row["estimator"]), ""), row


def test_csv_says_what_its_differences_are_measured_against(chain):
    """The CSV's delta columns named no baseline and gave no value for it (with --baseline
    behavior there is no baseline row either): each compared row carries both."""
    folder, _ = chain
    for baseline in ("behavior", str(folder / "policies" / "eval_1.npz")):
        evaluation = ope_cli.evaluate(
            str(folder / "logs.parquet"),
            policies=str(folder / "policies" / "*.npz"),
            baseline=baseline,
            ci="normal",
        )
        rows = list(csv.DictReader(io.StringIO(shown(evaluation, "csv"))))
        compared = [row for row in rows if row["delta"]]
        assert compared
        for row in compared:
            assert row["baseline"] == baseline
            value = float(row["value"]) - float(row["delta"])
            assert float(row["baseline_value"]) == pytest.approx(value, rel=1e-6, abs=1e-9)
        assert all(row["baseline"] == "" for row in rows if not row["delta"])


def test_a_difference_below_rounding_with_a_standard_error_above_it_is_kept(tmp_path):
    """Returns near 1e10: Δ = -0.0086 is below 1e-12 of the estimates' size but its standard
    error (0.017) is not; Δ was printed 0 with that standard error (an interval centred on 0,
    without the tie note). A tie now needs both to be rounding."""
    import pyarrow as pa

    rng = np.random.default_rng(1)
    behavior, target, n = np.array([0.5, 0.3, 0.2]), np.array([0.4, 0.3, 0.3]), 400
    action = rng.choice(3, n, p=behavior)
    reward = 1e10 + rng.standard_normal(n)
    table = {
        "episode_id": np.arange(n),
        "step": np.zeros(n, np.int64),
        "observation": np.zeros(n, np.int64),
        "action": action,
        "reward": reward,
        "behavior_prob": behavior[action],
    }
    pq.write_table(pa.table(table), tmp_path / "logs.parquet")
    for name, probs in (("same", behavior), ("pi", target)):
        np.savez(tmp_path / f"{name}.npz", kind=np.array("tabular"), logits=np.log([probs]))
    config = evaluation_config(
        str(tmp_path / "logs.parquet"),
        policies=(str(tmp_path / "same.npz"), str(tmp_path / "pi.npz")),
        estimators=("wis",),
        baseline="same.npz",
    )
    comparison = evaluate(config).results[1].comparison["wis"]
    weight = target[action] / behavior[action]
    expected = (weight @ (reward - 1e10)) / weight.sum() - (reward - 1e10).mean()  # exact offset
    assert comparison.delta == pytest.approx(expected, abs=1e-5)  # float64 at 1e10: 2e-6 apart
    assert comparison.stderr > 0.01 and comparison.note != TIED
    assert comparison.ci_low < comparison.delta < comparison.ci_high


def test_could_be_best_sets_need_replicates_for_their_bonferroni_level(logged):
    """Three policies at 95%: each comparison is at 97.5%, whose bootstrap quantiles need
    80 replicates. With fewer the set was read from the extreme replicates (20 policies and
    200 replicates called eval_01-12 confidently worse; 4,000 kept all 20); it is now
    undetermined (null), and every format says why."""
    from ope_cli.report.warnings import NO_BEST_SET, run_warnings

    few = _run(logged, None, interval="percentile", bootstrap_samples=60)
    assert all(set(r.could_be_best.values()) == {None} for r in few.results)
    (warning,) = [w for w in run_warnings(few) if w.code == NO_BEST_SET]
    assert "at 0.975 (Bonferroni, 3 policies)" in warning.message
    assert "at least 80 replicates" in warning.message
    # with enough (200): test_could_be_best_sets_under_bootstrap_t_are_the_percentile_ones


@pytest.fixture
def never(tmp_path, monkeypatch) -> str:
    """An entry-point policy that gives probability 0 to every action: every weight is 0."""
    (tmp_path / "ope_test_zero_policy.py").write_text(
        "import jax.numpy as jnp\n\nn_actions = 3\n\n\n"
        "def never(observation, action):\n    return jnp.full((), -jnp.inf)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return "never=ope_test_zero_policy:never"


def test_a_policy_without_weight_differs_from_nothing(chain, never):
    """Every weight zero: IS and PDIS are 0 +- 0, which says nothing about the policy (its
    warning says so), yet its difference from the logging policy came out -V_b with an
    interval that called it confidently worse. Each difference is null with the reason
    (under betting, WIS's was null without a note, beside an interval; normal intervals:
    test_weights_all_zero_rank_with_nothing_but_later_zeros_keep_per_decision)."""
    folder, truth = chain
    exact = {entry["policy"]: entry["value"] for entry in truth["policies"]}
    truth_file = folder / "truth_with_never.json"
    eval_0_path = str(folder / "policies" / "eval_0.npz")
    truth_file.write_text(json.dumps({"never": 1.0, eval_0_path: exact["policies/eval_0.npz"]}))
    document = ope_cli.evaluate(
        str(folder / "logs.parquet"),
        policies=(never, eval_0_path),
        baseline="behavior",
        ci="betting",
        truth=str(truth_file),
    ).to_dict()
    never, eval_0 = document["results"]
    assert never["estimates"]["is"]["value"] == 0.0
    for name in ("is", "pdis"):  # 0 +- 0 had the interval [0, 0], without a note
        estimate = never["estimates"][name]
        assert (estimate["ci_low"], estimate["ci_high"]) == (None, None), estimate
        assert estimate["note"] == WEIGHTLESS
    for name in ("is", "wis", "pdis", "wpdis"):
        difference = never["comparison"][name]
        assert difference["delta"] is None and difference["ci_low"] is None, difference
        assert difference["note"] == NO_WEIGHT
        assert eval_0["comparison"][name]["delta"] is not None  # the other compares as before
        assert eval_0["could_be_best"][name]  # the best of the ones the logs speak of
    assert "all_weights_zero" in [w["code"] for w in document["warnings"]]
    # its IS of 0 also counted in IS's rmse, spearman and regret against its true value,
    # beside WIS's "no estimate" for the same policy: no estimate for any of them now
    notes = [w["message"] for w in document["warnings"] if w["code"] == "selection"]
    for name in ("is", "pdis", "wis", "wpdis"):
        metrics = document["selection"][name]
        assert metrics["rmse"] is None and metrics["spearman"] is None, (name, metrics)
        assert f"{name}: no estimate for never; no rmse, nmse, spearman or @k metrics" in notes, (
            notes
        )


def test_a_difference_without_betting_interval_says_why(chain, tmp_path):
    """Logged actions all 0 under the data's propensities: a policy's own betting bounds
    cross (its note says so), and its difference from the baseline showed a bare n/a."""
    folder, _ = chain
    table = pq.read_table(folder / "logs.parquet")
    zero = pa.array(np.zeros(table.num_rows, np.int64))
    table = table.set_column(table.schema.get_field_index("action"), "action", zero)
    pq.write_table(table, tmp_path / "zero.parquet")
    paths = []
    for name, first in (("ok", 1.0), ("small", -2.0)):
        logits = np.zeros((10, 3))
        logits[:, 0] = first
        np.savez(tmp_path / f"{name}.npz", kind=np.array("tabular"), logits=logits)
        paths.append(str(tmp_path / f"{name}.npz"))
    document = ope_cli.evaluate(
        str(tmp_path / "zero.parquet"), policies=paths, baseline=paths[1], ci="betting"
    ).to_dict()
    ok = document["results"][0]
    crossed = [n for n, e in ok["estimates"].items() if e["ci_low"] is None]
    assert crossed and all("betting bound" in ok["estimates"][n]["note"] for n in crossed)
    for name in crossed:
        difference = ok["comparison"][name]
        assert difference["ci_low"] is None and difference["note"] == CROSSED_BETTING


def test_no_could_be_best_set_where_betting_gives_no_intervals(chain):
    """Under --ci betting, dm, dr and wdr have no intervals, so no pair of policies does:
    every policy was marked as could-be-best (nothing excluded one), without a word, where
    normal intervals call one confidently worse (DR 1.31 +- 0.08 beside 2.98 +- 0.33). The
    sets are now undetermined (null), and the warning says why; the importance-sampling
    sets stay as they were."""
    from ope_cli.report.warnings import NO_BEST_SET, run_warnings

    folder, _ = chain
    picked = (0, 1, 2)
    evaluation = ope_cli.evaluate(
        folder / "logs.parquet",
        policies=[folder / "policies" / f"eval_{k}.npz" for k in picked],
        q=[folder / "q" / f"eval_{k}.npz" for k in picked],
        ci="betting",
    )
    for result in evaluation.results:
        flags = result.could_be_best
        assert [flags[name] for name in ("dm", "dr", "wdr")] == [None] * 3
        assert all(isinstance(flags[name], bool) for name in ("is", "wis", "pdis", "wpdis"))
    (warning,) = [w for w in run_warnings(evaluation) if w.code == NO_BEST_SET]
    assert warning.message.startswith("no could-be-best set for dm, dr, wdr: betting intervals")
    assert "replicates" not in warning.message
    # the table says "n/a" there, and a null interval's reason once, under it (it was
    # also beside each of the nine values, folding every row into three lines)
    table = shown(evaluation, "table")
    assert table.count("betting intervals do not apply to this estimator") == 1
    assert table.count("n/a (1)") == 9 and re.search(r"DR .* │\s+n/a\s+│", table)
    auto = ope_cli.evaluate(
        folder / "logs.parquet",
        policies=[folder / "policies" / f"eval_{k}.npz" for k in picked],
        q=[folder / "q" / f"eval_{k}.npz" for k in picked],
        ci="auto",  # the data declares its reward range: betting, and normal for dm, dr, wdr
    )
    assert all(isinstance(r.could_be_best["dr"], bool) for r in auto.results)
    assert [r.ci_methods["dr"] for r in auto.results] == ["normal"] * 3


def test_betting_differences_are_said_to_be_unpaired(chain):
    """Under betting, a difference's interval is the two policies' own intervals combined,
    not paired: the table's title said "paired on the same episodes" beside a difference 16
    standard errors below 0 whose interval held 0. Its caption (and the could-be-best
    legend) now say so, and which options give paired ones."""
    folder, _ = chain
    policies = [folder / "policies" / f"eval_{k}.npz" for k in (0, 2)]

    def table(ci: str) -> str:
        run = ope_cli.evaluate(
            folder / "logs.parquet", policies=policies, baseline="behavior", ci=ci
        )
        return " ".join(shown(run, "table").split())

    betting, normal = table("betting"), table("normal")
    assert "betting intervals of a difference: each policy's own at 1 - alpha/2" in betting
    assert "not paired" in betting and "percentile, bootstrap-t or normal gives paired" in betting
    assert "(the differences paired on the same episodes, their betting intervals not)" in betting
    assert "could be the best (paired intervals, Bonferroni; betting's are not paired)" in betting
    assert "not paired" not in normal and "(paired on the same episodes)" in normal
    assert "could be the best (paired intervals, Bonferroni)" in normal


def test_p_better_says_how_many_replicates_it_is_a_share_of(chain):
    """A bootstrap's P(better) is a share of its replicates: 100.0% read as a certainty where
    it is every one of 200. The caption counts them (and JSON's confidence.replicates)."""
    folder, _ = chain
    policies = [folder / "policies" / f"eval_{k}.npz" for k in (0, 2)]
    run = ope_cli.evaluate(
        folder / "logs.parquet", policies=policies, baseline="behavior", ci="percentile"
    )
    drawn = run.confidence.replicates
    assert drawn > 0 and run.to_dict()["confidence"]["replicates"] == drawn
    words = " ".join(shown(run, "table").split())
    assert f"P(better): the share of the {drawn:,} bootstrap replicates in which" in words
    normal = ope_cli.evaluate(
        folder / "logs.parquet", policies=policies, baseline="behavior", ci="normal"
    )
    assert normal.confidence.replicates == 0
    words = " ".join(shown(normal, "table").split())
    assert "P(better): the share" not in words and "P(better): bootstrap replicates" in words


def test_a_leave_out_without_weight_is_the_reason_a_paired_wis_has_no_spread(tmp_path):
    """Three episodes in three resampling groups, one holding all the weight (the others
    e^-10000 below it): leaving its group out leaves no weight in float64, so the paired
    WIS has no jackknife standard error. The note blamed too few episodes or groups."""
    import pyarrow as pa

    episode = np.repeat([0, 1, 2], 3)
    groups = (id_keys(np.array([0, 1, 2])) % np.uint64(RESAMPLING_GROUPS)).astype(int)
    assert len(set(groups.tolist())) == 3
    table = pa.table(
        {
            "episode_id": episode,
            "step": np.tile([0, 1, 2], 3),
            "observation": np.array([2, 3, 3, 1, 0, 3, 3, 1, 0]),
            "action": np.array([1, 1, 1, 0, 0, 1, 0, 1, 1]),
            "reward": np.array([1.0, 1, 0, 0, 0, 1, 0, 1, 1]),
            "behavior_prob": np.full(9, 0.5),
        }
    )
    pq.write_table(table, tmp_path / "logs.parquet")
    logits = np.tile([-1e4, 0.0, -1e4], (4, 1))

    def against_behavior(name: str, scale: float):
        path = save_checkpoint(tmp_path / name, {"kind": "tabular", "logits": logits * scale})
        evaluation = ope_cli.evaluate(
            tmp_path / "logs.parquet",
            policies=(str(path),),
            baseline="behavior",
            estimators=("wis",),
            gamma=0.9,
        )
        return evaluation.results[0].comparison["wis"]

    difference = against_behavior("sure.npz", 1.0)
    assert difference.delta == pytest.approx(1.9 - (1.9 + 0.81 + 1.71) / 3)
    assert difference.stderr is None and difference.note == NO_SPREAD
    assert "a group left out leaves no weight within float64's range" in NO_SPREAD
    # the same three groups with weights float64 holds: a standard error (so the groups are
    # enough, and what removed it is the weight a group left out leaves)
    assert against_behavior("leaning.npz", 1 / 5e3).stderr > 0


def test_a_truth_for_another_horizon_is_refused_in_one_line(chain, tmp_path, monkeypatch):
    """truth.json says the horizon its values are for: against data that declares another,
    or whose episodes run past it, it is refused (a truth for horizon 5 scored estimates
    over episodes of up to 97 steps: rmse 2.4, coverage 0, without a word)."""
    folder, truth = chain
    monkeypatch.chdir(folder)
    cut = generate("chain", tmp_path / "cut", episodes=20, seed=3, gamma=0.95, horizon=5)
    assert truth["horizon"] is None and cut["horizon"] == 5
    (tmp_path / "h.json").write_text(json.dumps({**truth, "horizon": 5}))
    with pytest.raises(UsageError) as error:
        ope_cli.evaluate("logs.parquet", policies="policies/*.npz", truth=tmp_path / "h.json")
    line = str(error.value)
    assert "\n" not in line
    assert "of at most 5 steps (its horizon), but the data holds an episode of" in line
    # data cut at horizon 5 against the full episodes' truth: an episode reached the cut
    with pytest.raises(UsageError) as error:
        ope_cli.evaluate(
            tmp_path / "cut" / "logs.parquet",
            policies=[folder / "policies" / f"eval_{k}.npz" for k in range(3)],
            truth=folder / "truth.json",
        )
    assert "gives true values for episodes that run to their end, but the data holds an" in str(
        error.value
    )
    # a --horizon looser than the data's declared cut does not hide it
    with pytest.raises(UsageError, match="the bound the data declares"):
        ope_cli.evaluate(
            tmp_path / "cut" / "logs.parquet",
            policies=[folder / "policies" / f"eval_{k}.npz" for k in range(3)],
            truth=folder / "truth.json",
            horizon=7,
        )


def test_selection_notes_name_policies_as_the_results_do(chain, monkeypatch):
    """With --policy NAME=PATH, the tie and missing-truth notes named the paths while the
    results and the table called them by NAME."""
    folder, truth = chain
    monkeypatch.chdir(folder)
    (folder / "copy.npz").write_bytes((folder / "policies" / "eval_0.npz").read_bytes())
    value = truth["policies"][0]["value"]  # eval_0 and its copy tie; eval_2 has no value
    (folder / "named.json").write_text(
        json.dumps({"policies/eval_0.npz": value, "copy.npz": value})
    )
    given = ["a=policies/eval_0.npz", "b=copy.npz", "c=policies/eval_2.npz"]
    document = ope_cli.evaluate(
        "logs.parquet", policies=given, truth="named.json", estimators=("wis",)
    ).to_dict()
    notes = " | ".join(w["message"] for w in document["warnings"] if w["code"] == "selection")
    assert "a, b have equal estimates across the top-1 edge" in notes, notes
    assert "no value for c;" in notes, notes
    assert "policies/" not in notes, notes
    # the missing truth is c's warning (SPEC 12: null is for the run's; it was null)
    (missing,) = [w for w in document["warnings"] if "no value for c;" in w["message"]]
    assert missing["policy"] == "c"


def _near(folder, checkpoint: str, toward: str, eps: float, out):
    """A tabular checkpoint ``eps`` of the way from ``checkpoint`` toward ``toward``."""
    a, b = (np.load(folder / "policies" / name) for name in (checkpoint, toward))
    logits = a["logits"] + eps * (b["logits"] - a["logits"])
    np.savez(out, kind=a["kind"], logits=logits)
    return out


@pytest.mark.parametrize("eps", [1e-5, 1e-8])
def test_close_checkpoints_could_be_the_best_whatever_the_baseline(chain, tmp_path, eps):
    """A checkpoint eps of the way from eval_0 toward eval_1 is confidently worse than
    eval_0 by pdis whatever eps (its difference and the difference's spread both scale
    with eps). Without --baseline, the pair is read from co-moments kept from the first
    policy's row (eval_2, far from both): at eps 1e-5 their spread was below the 1e-8 of
    them that was taken as resolvable, so the set held every policy, where --baseline
    eval_0 gave it without the checkpoint. At 1e-8 rounding cannot resolve it: the set
    keeps the checkpoint, and a warning says so and how to resolve it."""
    folder, _ = chain
    near = _near(folder, "eval_0.npz", "eval_1.npz", eps, tmp_path / "near.npz")
    policies = [folder / "policies" / "eval_2.npz", folder / "policies" / "eval_0.npz", near]

    def run(baseline=None):
        document = ope_cli.evaluate(
            folder / "logs.parquet", policies=policies, baseline=baseline, ci="normal"
        ).to_dict()
        flags = [r["could_be_best"]["pdis"] for r in document["results"]]
        codes = [w["code"] for w in document["warnings"]]
        return flags, codes, document["warnings"]

    resolved, codes, _ = run(str(policies[1]))
    assert resolved == [False, True, False]  # against eval_0, per episode: always resolved
    assert "could_be_best_unresolved" not in codes
    flags, codes, warnings = run()
    if eps == 1e-5:
        assert flags == resolved and "could_be_best_unresolved" not in codes
        return
    assert flags == [False, True, True]
    (warning,) = [w for w in warnings if "could-be-best set by pdis may" in w["message"]]
    assert warning["code"] == "could_be_best_unresolved"
    assert warning["message"].startswith(
        "the could-be-best set by pdis may be too large: near.npz differs from the best, "
        "eval_0.npz, by less than float64 resolves"
    )
    assert warning["message"].endswith(
        "--baseline eval_0.npz takes each policy's differences "
        "from it episode by episode, which resolves them."
    )


def test_float32_differences_below_the_terms_rounding_are_said_so(chain, tmp_path):
    """float32 terms are each good to about 1e-7 of themselves: a checkpoint 1e-7 of the way
    from eval_0 toward eval_1 was called 11 standard errors worse than eval_0 by pdis (its
    difference, and the difference's spread, were that rounding), where float64 finds it
    slightly better. Its difference, which rounding can shift that far, has no value,
    standard error, interval or probability of improvement (it printed -6.1e-7 and 0.0
    where float64 gives +2.9e-8 and 0.94), with a note, and the set keeps it, with a
    warning."""
    folder, _ = chain
    near = _near(folder, "eval_0.npz", "eval_1.npz", 1e-7, tmp_path / "near.npz")
    policies = [folder / "policies" / "eval_2.npz", folder / "policies" / "eval_0.npz", near]
    document = ope_cli.evaluate(
        folder / "logs.parquet",
        policies=policies,
        baseline=str(policies[1]),
        ci="percentile",
        precision="float32",
    ).to_dict()
    difference = document["results"][2]["comparison"]["pdis"]
    assert difference["stderr"] is None and difference["ci_low"] is None, difference
    assert difference["delta"] is None and difference["p_improvement"] is None, difference
    assert "float32 rounding can shift it by" in difference["note"]
    assert "--precision float64 resolves it" in difference["note"]
    assert document["results"][0]["comparison"]["pdis"]["stderr"] is not None  # eval_2: far
    assert document["results"][2]["could_be_best"]["pdis"]
    warnings = [
        w["message"] for w in document["warnings"] if w["code"] == "could_be_best_unresolved"
    ]
    (pdis,) = [w for w in warnings if "set by pdis" in w]
    best = "eval_0.npz" if "the best, eval_0.npz" in pdis else "near.npz"
    way_out = "--precision float64 resolves" if best == "eval_0.npz" else "--baseline near.npz"
    assert way_out in pdis, pdis  # not the --baseline the run has already


def _five_step_logs(path, episodes=60, seed=0):
    """Five-step episodes, observation = the step, two actions logged at 1/2 each, rewards
    below 0 (so that a value of 0 would rank first)."""
    rng = np.random.default_rng(seed)
    n = episodes * 5
    table = pa.table(
        {
            "episode_id": np.repeat(np.arange(episodes), 5),
            "step": np.tile(np.arange(5), episodes),
            "observation": np.tile(np.arange(5), episodes),
            "action": rng.integers(0, 2, n),
            "reward": -1.0 - rng.random(n),
            "behavior_prob": np.full(n, 0.5),
        }
    )
    pq.write_table(table, path)
    return path


@pytest.fixture
def zeroing(tmp_path, monkeypatch) -> str:
    """Entry points over two actions: ``never`` gives every action probability 0,
    ``last_zero`` 1/2 each but 0 at the last step (observation 4)."""
    (tmp_path / "ope_test_zeroing.py").write_text(
        "import jax.numpy as jnp\n\nn_actions = 2\n\n\n"
        "def never(observation, action):\n    return jnp.full((), -jnp.inf)\n\n\n"
        "def last_zero(observation, action):\n"
        "    return jnp.where(observation >= 4, -jnp.inf, jnp.log(0.5))\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return "ope_test_zeroing"


def test_weights_all_zero_rank_with_nothing_but_later_zeros_keep_per_decision(tmp_path, zeroing):
    """A policy whose every weight is 0 has IS 0 +- 0: above every other value where the
    rewards are negative, it was ranked first (★). One whose weights are 0 from the last
    step on still has every earlier step's per-decision weight: its PDIS is a real value
    and compares as any other (the whole policy was taken as weightless)."""
    data = _five_step_logs(tmp_path / "logs.parquet")
    uniform = tmp_path / "uniform.npz"
    np.savez(uniform, kind="tabular", logits=np.zeros((5, 2)))
    document = ope_cli.evaluate(
        str(data),
        policies=(f"never={zeroing}:never", f"last={zeroing}:last_zero", str(uniform)),
        baseline="uniform.npz",
        gamma=0.9,
        ci="normal",
        rank_by="is",
    ).to_dict()
    never, last, _ = document["results"]
    assert never["estimates"]["is"]["value"] == 0.0
    assert never["rank"] is None and last["rank"] is None  # last's IS: all weights 0 too
    (note,) = [
        w["message"]
        for w in document["warnings"]
        if w["policy"] == "never" and w["code"] == "not_ranked"
    ]
    assert "its every is weight is zero (the logs say nothing about it)" in note
    for name in ("is", "wis"):
        assert last["comparison"][name]["delta"] is None
    for name in ("is", "wis", "pdis", "wpdis"):
        assert never["comparison"][name]["note"] == NO_WEIGHT
        assert never["comparison"][name]["ci_low"] is None
    # pdis of ``last``: the uniform policy's without its last step's discounted reward (< 0)
    assert last["comparison"]["pdis"]["delta"] > 0
    assert last["comparison"]["pdis"]["stderr"] is not None
    assert last["comparison"]["wpdis"]["note"] == NO_DIFFERENCE  # no weight left at step 4


def test_a_float32_difference_without_spread_for_another_reason_says_that(tmp_path):
    """Two episodes: WIS's jackknife has too few groups for a standard error, in float64
    as in float32; the float32 run blamed its rounding (and said float64 resolves it)."""
    data = _five_step_logs(tmp_path / "logs.parquet", episodes=2)
    rng = np.random.default_rng(3)
    paths = []
    for k in range(2):
        paths.append(tmp_path / f"p{k}.npz")
        np.savez(paths[-1], kind="tabular", logits=rng.normal(size=(5, 2)))
    document = ope_cli.evaluate(
        str(data),
        policies=tuple(str(p) for p in paths),
        baseline="p0.npz",
        gamma=0.9,
        ci="normal",
        precision="float32",
    ).to_dict()
    difference = document["results"][1]["comparison"]["wis"]
    assert difference["stderr"] is None and difference["note"] == NO_SPREAD, difference
    assert "could_be_best_unresolved" not in [w["code"] for w in document["warnings"]]


def test_float32_self_normalised_differences_keep_their_standard_errors_at_any_scale(
    chain, tmp_path
):
    """WIS does not change when every weight is multiplied by one constant, but the IS
    terms do: judged against them, every float32 WIS and WPDIS difference of weights near
    e^300 (a behavior probability 1e-130 at every first step) lost its standard error,
    and the could-be-best set held every policy. Against the returns, they keep them."""
    folder, _ = chain
    table = pq.read_table(folder / "logs.parquet")
    first = table.column("step").to_numpy() == 0
    prob = table.column("behavior_prob").to_numpy() * np.where(first, math.exp(-300), 1.0)
    scaled = table.set_column(
        table.schema.get_field_index("behavior_prob"), "behavior_prob", pa.array(prob)
    )
    pq.write_table(scaled, tmp_path / "scaled.parquet")
    policies = [folder / "policies" / f"eval_{k}.npz" for k in (0, 2)]
    runs = {
        precision: ope_cli.evaluate(
            tmp_path / "scaled.parquet",
            policies=policies,
            baseline=str(policies[0]),
            ci="normal",
            precision=precision,
        ).to_dict()
        for precision in ("float64", "float32")
    }
    for name in ("wis", "wpdis"):
        exact = runs["float64"]["results"][1]["comparison"][name]["stderr"]
        assert runs["float32"]["results"][1]["comparison"][name]["stderr"] == pytest.approx(
            exact, rel=1e-3
        )


def test_dm_differences_of_large_q_values_are_not_ties_below_a_twelfth_digit(logged, tmp_path):
    """Two policies' linear Q checkpoints of 1e12: their dm differed by about 0.4 with a
    paired standard error of about 1e-3, and the 1e-12 tie rule (1.0 at this size, for
    terms that round over every step) called it 0 +- 0, "the same estimates to rounding",
    and ranked them equal. dm's terms are one V-hat each: its ties are below 1e-14."""
    from ope_cli.choosing.comparison import tied
    from ope_cli.choosing.selection import selection_by_estimator
    from ope_cli.report.table import rank_policies

    data, _, checkpoints, paths = logged
    rng = np.random.default_rng(3)
    d, n = checkpoints[0]["weight"].shape
    qs = []
    for k in range(2):
        weight, bias = 0.1 * rng.normal(size=(d, n)), 1e12 + 0.2 * k + rng.normal(size=n) * 0.01
        qs.append(
            save_checkpoint(
                tmp_path / f"q{k}.npz", {"kind": "linear_q", "weight": weight, "bias": bias}
            )
        )
    config = evaluation_config(
        str(data),
        policies=(str(paths[0]), str(paths[1])),
        gamma=GAMMA,
        baseline=str(paths[0]),
        estimators=("dm",),
        q=tuple(str(q) for q in qs),
    )
    result = evaluate(config)
    first, second = (r.estimates["dm"].value for r in result.results)
    comparison = result.results[1].comparison["dm"]
    assert 1e-2 < abs(second - first) < 1.0  # a tie under 1e-12 of 1e12, not under 1e-14
    assert comparison.delta == pytest.approx(second - first, abs=1e-3)
    assert 0 < comparison.stderr < abs(comparison.delta) / 10 and comparison.note is None
    assert sorted(rank_policies(result, "dm")) == [1, 2]
    # the selection metrics against known values tie as the ranks do (they said "the
    # estimates are all equal" beside ranks 1 and 2)
    truth = {str(paths[0]): 0.0, str(paths[1]): 1.0}
    names = {str(paths[0]): "first", str(paths[1]): "second"}
    metrics, notes = selection_by_estimator(
        truth, {"dm": {str(paths[0]): first, str(paths[1]): second}}, top_k=(1,), names=names
    )
    assert metrics["dm"]["spearman"] == (1.0 if second > first else -1.0) and not notes, notes
    assert metrics["dm"]["precision@1"] == (1.0 if second > first else 0.0)
    assert (
        tied(1e-14)
        == "the same estimates to rounding (differences below 1e-14 of their size are ties)"
    )
