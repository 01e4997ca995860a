"""Choosing between policies (SPEC section 11): --truth parsing, selection metrics on
hand-computed cases, could-be-best sets, and the paired-difference references."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from ope_cli.choosing.selection import (
    BASELINE_BEHAVIOR,
    average_ranks,
    bonferroni_level,
    check_truth_gamma,
    check_truth_horizon,
    could_be_best,
    coverage,
    estimated_best,
    grouped_jackknife_difference,
    missing_truth_note,
    normal_paired_intervals,
    p_improvement,
    paired_mean_difference,
    precision_at_k,
    read_truth,
    regret_at_k,
    selection_by_estimator,
    selection_metrics,
    spearman,
    tied_at_edge,
    top_k_set,
)
from ope_cli.errors import UsageError


def one_line(error: pytest.ExceptionInfo) -> str:
    message = str(error.value)
    assert message and "\n" not in message
    return message


# ------------------------------------------------------------------------------- --truth


def generated_truth(folder, names=("eval_0", "eval_1")) -> str:
    """A truth.json in the format ``ope generate`` writes, with `names` under policies/."""
    entry = {"stderr": 0.0, "method": "exact", "q": None}
    truth = {
        "env": "chain",
        "gamma": 1.0,
        "policies": [
            {"policy": f"policies/{name}.npz", "value": 1.0 + k, **entry}
            for k, name in enumerate(names)
        ],
        "behavior": {"policy": "behavior.npz", "value": 0.5, **entry},
    }
    path = folder / "truth.json"
    path.write_text(json.dumps(truth))
    return str(path)


def test_truth_json_matches_by_path_then_file_name_and_behavior(tmp_path):
    path = generated_truth(tmp_path)
    by_path = str(tmp_path / "policies" / "eval_0.npz")
    by_name = "copies/eval_1.npz"
    truth = read_truth(path, [by_path, by_name, "behavior"])
    assert truth == {by_path: 1.0, by_name: 2.0, "behavior": 0.5}
    assert list(truth) == [by_path, by_name, "behavior"]


def test_file_uri_policies_match_by_path(tmp_path):
    """A file:// policy was matched by file name only: two policies named pi.npz in two
    folders were "several policies" for one entry, where their plain paths matched."""
    folder = tmp_path / "t"
    folder.mkdir()
    (folder / "truth.json").write_text(
        json.dumps(
            {
                "policies": [
                    {"policy": "a/pi.npz", "value": 1.0},
                    {"policy": "b/pi.npz", "value": 2.0},
                ]
            }
        )
    )
    a, b = (f"file://{folder / name / 'pi.npz'}" for name in ("a", "b"))
    assert read_truth(str(folder / "truth.json"), [a, b]) == {a: 1.0, b: 2.0}
    assert read_truth(f"file://{folder / 'truth.json'}", [a, b]) == {a: 1.0, b: 2.0}


def test_truth_json_written_by_generate(tmp_path, monkeypatch):
    from ope_cli.envs.generate import generate

    written = generate("bandit", tmp_path / "demo", episodes=20)
    monkeypatch.chdir(tmp_path)
    names = [f"demo/policies/eval_{k}.npz" for k in range(3)]
    truth = read_truth(tmp_path / "demo" / "truth.json", [*names, "behavior"])
    assert truth == {
        **{name: entry["value"] for name, entry in zip(names, written["policies"], strict=True)},
        "behavior": written["behavior"]["value"],
    }


def test_a_truth_of_other_checkpoints_is_refused_in_one_line(tmp_path):
    """truth.json records each checkpoint's sha256: the truth of another ``ope generate``
    run (other policies under the same file names) is refused, not matched by name."""
    from ope_cli.envs.generate import generate

    generate("bandit", tmp_path / "a", episodes=20, shift=0.5)
    generate("bandit", tmp_path / "b", episodes=20, shift=0.25)
    names = [str(tmp_path / "a" / "policies" / f"eval_{k}.npz") for k in range(3)]
    assert read_truth(tmp_path / "a" / "truth.json", names)[names[0]] is not None
    with pytest.raises(UsageError) as error:
        read_truth(tmp_path / "b" / "truth.json", names)
    assert f"another checkpoint than {names[0]}" in one_line(error)


def test_truth_without_behavior_baseline_ignores_the_behavior_entry(tmp_path):
    path = generated_truth(tmp_path)
    assert read_truth(path, ["eval_0.npz", "eval_1.npz"]) == {"eval_0.npz": 1.0, "eval_1.npz": 2.0}


def test_truth_of_more_policies_than_given_serves_the_ones_given(tmp_path):
    """A truth.json of three policies with two of them evaluated was refused ("names
    'policies/eval_2.npz', which is not one of the --policy values given"): evaluating a
    subset of what ``ope generate`` wrote is the ordinary case."""
    path = generated_truth(tmp_path, names=("eval_0", "eval_1", "eval_2"))
    truth = read_truth(path, ["policies/eval_0.npz", "policies/eval_1.npz"])
    assert truth == {"policies/eval_0.npz": 1.0, "policies/eval_1.npz": 2.0}


def test_truth_missing_a_policy_gives_none_and_a_note(tmp_path):
    path = generated_truth(tmp_path, names=("eval_0",))
    truth = read_truth(path, ["eval_0.npz", "eval_1.npz"])
    assert truth == {"eval_0.npz": 1.0, "eval_1.npz": None}
    assert missing_truth_note(truth) == (
        "--truth has no value for eval_1.npz; left out of the selection metrics"
    )
    assert missing_truth_note({"a": 1.0}) is None
    assert missing_truth_note({"a": 1.0, "behavior": None}) == (
        "--truth has no value for behavior; no sharpe@k"
    )


def test_truth_json_behavior_checkpoint_given_as_a_policy(tmp_path):
    path = generated_truth(tmp_path, names=("eval_0",))
    truth = read_truth(path, ["eval_0.npz", str(tmp_path / "behavior.npz"), "behavior"])
    assert truth == {"eval_0.npz": 1.0, str(tmp_path / "behavior.npz"): 0.5, "behavior": 0.5}
    assert read_truth({"a.npz": 1.0}, ["a.npz", "behavior"]) == {"a.npz": 1.0, "behavior": None}


def test_truth_as_a_policy_value_object(tmp_path):
    path = tmp_path / "values.json"
    path.write_text(json.dumps({"a.npz": 1.5, "pkg.mod:policy": -2, "behavior": 0.25}))
    truth = read_truth(str(path), ["pkg.mod:policy", "a.npz", "behavior"])
    assert truth == {"pkg.mod:policy": -2.0, "a.npz": 1.5, "behavior": 0.25}
    assert read_truth({"a.npz": np.float32(3.0)}, ["a.npz"]) == {"a.npz": 3.0}


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "expected a JSON object"),
        ('{"a.npz": "high"}', "not a finite number"),
        ('{"a.npz": 1, "b/a.npz": 2}', "names 'a.npz' twice"),
    ],
)
def test_bad_truth_files_are_refused_in_one_line(tmp_path, content, words):
    path = tmp_path / "truth.json"
    path.write_text(content)
    with pytest.raises(UsageError) as error:
        read_truth(path, ["a.npz"])
    assert words in one_line(error)


def test_a_truth_for_another_gamma_is_refused_in_one_line(tmp_path):
    """truth.json's values are for its "gamma": another run discount (from any source) is
    a usage error naming both; the same one, or a truth that declares none, passes."""
    truth = {"gamma": 0.95, "policies": [{"policy": "a.npz", "value": 2.4}]}
    path = tmp_path / "truth.json"
    path.write_text(json.dumps(truth))
    check_truth_gamma(path, 0.95, "data")
    check_truth_gamma(truth, 0.95 * (1 + 1e-14), "option")  # the same float, printed again
    check_truth_gamma({k: v for k, v in truth.items() if k != "gamma"}, 0.5, "option")
    check_truth_gamma({"a.npz": 2.4}, 0.5, "option")  # {policy: value}: no discount said
    cases = (
        (0.5, "option", "--gamma", "0.5"),
        (1.0, "default", "the default", "1"),
        # a float32 0.95 is 0.949999988...: it read "gamma 0.95, but ... gamma 0.95"
        (float(np.float32(0.95)), "option", "--gamma", "0.949999988079071"),
    )
    for gamma, source, words, shown in cases:
        with pytest.raises(UsageError) as error:
            check_truth_gamma(path, gamma, source)
        line = one_line(error)
        assert f"gives true values for gamma 0.95, but this run discounts by gamma {shown}" in line
        assert f"({words})" in line and "--gamma 0.95" in line


def test_a_truth_for_another_horizon_is_refused_and_a_looser_bound_is_not():
    """A horizon the data declares (or --horizon gives) bounds the episodes, it does not cut
    them: a truth for episodes that run to their end fits data declaring 500 whose longest
    episode has 58 steps, and a truth for horizon 1000 fits a bound of 2000 or 500 with
    70-step episodes (each was refused). Refused: an episode past the truth's horizon, or
    one that reached the bound where the truth runs further."""
    full = {"horizon": None, "policies": []}
    cut = {"horizon": 1000, "policies": []}
    check_truth_horizon(full, 500, 58)
    check_truth_horizon(cut, 2000, 1000)
    check_truth_horizon(cut, 500, 70, by_option=True)
    check_truth_horizon(cut, 1000, 1000, by_option=True)  # the bound is the truth's horizon
    check_truth_horizon({"a.npz": 1.0}, 3, 9)  # says no horizon: not checked
    check_truth_horizon({"policies": []}, 3, 9)  # no "horizon" key: the same
    for truth, bound, longest, by_option, words in (
        (cut, None, 1001, False, "of at most 1000 steps (its horizon), but the data holds an"),
        (full, 500, 500, False, "an episode of 500 steps, the bound the data"),
        (cut, 400, 400, False, "for horizon 1000, but the data holds an"),
        (full, 70, 70, True, "or a --horizon above the longest episode"),
    ):
        with pytest.raises(UsageError) as error:
            check_truth_horizon(truth, bound, longest, by_option)
        assert words in one_line(error)


def test_unreadable_truth_file_and_ambiguous_file_name(tmp_path):
    with pytest.raises(UsageError) as error:
        read_truth(tmp_path / "absent.json", ["a.npz"])
    assert "cannot read" in one_line(error)
    with pytest.raises(UsageError) as error:
        read_truth({"elsewhere/a.npz": 1.0}, ["x/a.npz", "y/a.npz"])
    assert "matches several policies" in one_line(error)


# ---------------------------------------------------------------------- selection metrics

J = {"a": 1.0, "b": 2.0, "c": 3.0, "d": 4.0}
J_HAT = {"a": 1.5, "b": 1.0, "c": 4.0, "d": 3.0}


def test_every_metric_on_a_hand_computed_case():
    intervals = {"a": (0.0, 2.0), "b": (0.5, 1.5), "c": (None, None), "d": (3.5, 4.5)}
    metrics, notes = selection_metrics(J, J_HAT, intervals, baseline_value=2.0)
    # errors 0.5, -1, 1, -1: mean square 3.25 / 4; mean J^2 = 30 / 4
    # ranks of J-hat 2, 1, 4, 3 against 1, 2, 3, 4: sum d^2 = 4, rho = 1 - 6 * 4 / (4 * 15)
    # S_1 = {c}: regret 4 - 3; S_3 = {c, d, a}: J = 3, 4, 1, two of them in the top 3 of J
    # (J >= 2); sharpe@3 = (4 - 2) / population std of (3, 4, 1) = sqrt(42 / 27)
    expected = {
        "rmse": math.sqrt(0.8125),
        "nmse": 0.8125 / 7.5,
        "spearman": 0.6,
        "coverage": 2 / 3,
        "regret@1": 1.0,
        "nregret@1": 1 / 3,
        "precision@1": 0.0,
        "sharpe@1": None,
        "regret@3": 0.0,
        "nregret@3": 0.0,
        "precision@3": 2 / 3,
        "sharpe@3": 2 / math.sqrt(42 / 27),
    }
    assert list(metrics) == list(expected)
    for name, value in expected.items():
        assert metrics[name] == (None if value is None else pytest.approx(value, abs=1e-12)), name
    assert notes == ["coverage over 3 of 4 policies; 1 without an interval left out"]


def test_equal_estimates_across_the_top_k_edge_give_no_at_k_metrics():
    """Where equal estimates straddle the top-k set's edge the set is not determined: its
    @k metrics are None with a note, in either order of the policies (breaking the tie by
    that order gave regret@1 2.0 or 0.0). Ties inside the set, or of the other metrics,
    are determined."""
    estimate_k, true_k = np.array([2.0, 2.0, 1.0]), np.array([1.0, 3.0, 2.0])
    assert top_k_set(estimate_k, 2).tolist() == [0, 1]  # the listing keeps policy order
    assert regret_at_k(estimate_k, true_k, 2) == 0.0  # {a, b} in either order
    assert tied_at_edge(estimate_k, 1).tolist() == [0, 1]
    assert tied_at_edge(estimate_k, 2).size == 0 and tied_at_edge(estimate_k, 3).size == 0
    # equal to float64 rounding is equal (an entry point and its checkpoint: 2e-15 apart)
    assert tied_at_edge(np.array([2.0 * (1 + 2e-15), 2.0, 1.0]), 1).tolist() == [0, 1]
    assert tied_at_edge(np.array([2.0 * (1 + 1e-9), 2.0, 1.0]), 1).size == 0
    truth, estimates = {"a": 1.0, "b": 3.0, "c": 2.0}, {"a": 2.0, "b": 2.0, "c": 1.0}
    for order in (["a", "b", "c"], ["b", "a", "c"]):
        metrics, notes = selection_metrics(
            {p: truth[p] for p in order}, {p: estimates[p] for p in order}, top_k=(1, 2)
        )
        for name in ("regret", "nregret", "precision", "sharpe"):
            assert metrics[f"{name}@1"] is None, name
        tied = ", ".join(p for p in order if p != "c")
        assert notes == [
            f"{tied} have equal estimates across the top-1 edge: the top 1 by estimate is "
            "not determined, so no regret/nregret/precision/sharpe@1"
        ]
        assert metrics["regret@2"] == 0.0 and metrics["precision@2"] == 0.5
        assert metrics["spearman"] == pytest.approx(0.0)  # ranks (2.5, 2.5, 1) vs (1, 3, 2)


def test_ties_in_the_true_values_count_for_precision():
    true_k = np.array([5.0, 5.0, 1.0])
    assert precision_at_k(np.array([1.0, 2.0, 0.0]), true_k, 1) == 1.0  # b ties a, the best
    assert precision_at_k(np.array([0.0, 1.0, 2.0]), true_k, 1) == 0.0
    assert precision_at_k(np.array([0.0, 1.0, 2.0]), true_k, 2) == 0.5


def test_spearman_with_ties_against_hand_values():
    assert average_ranks(np.array([1.0, 2.0, 2.0, 3.0])).tolist() == [1.0, 2.5, 2.5, 4.0]
    assert average_ranks(np.array([3.0, 1.0, 3.0, 3.0])).tolist() == [3.0, 1.0, 3.0, 3.0]
    # ranks (1, 2.5, 2.5, 4) against (1, 2, 3, 4): 4.5 / sqrt(4.5 * 5) = sqrt(0.9)
    rho = spearman(np.array([1.0, 2.0, 2.0, 3.0]), np.array([1.0, 2.0, 3.0, 4.0]))
    assert rho == pytest.approx(math.sqrt(0.9), abs=1e-12)
    assert spearman(np.array([2.0, 2.0, 1.0]), np.array([1.0, 3.0, 2.0])) == 0.0
    assert spearman(np.array([3.0, 2.0, 1.0]), np.array([1.0, 2.0, 3.0])) == pytest.approx(-1.0)
    assert spearman(np.array([1.0]), np.array([1.0])) is None
    assert spearman(np.array([1.0, 1.0]), np.array([1.0, 2.0])) is None


def test_spearman_ties_estimates_equal_to_rounding_as_the_ranks_do():
    """Two estimates 1.5e-15 apart (a policy as a checkpoint and as an entry point) share a
    rank and leave the top-1 set undetermined; Spearman's ranks tie them too. It ranked
    them by the last bit: 1.0 or 0.5 by the truths' order, where the tie gives 0.866."""
    estimates = np.array([3.088083854490306, 3.0880838544903075, 1.0])
    expected = math.sqrt(0.75)  # ranks (2.5, 2.5, 1) against (2, 3, 1) or (3, 2, 1)
    assert average_ranks(estimates).tolist() == [2.5, 2.5, 1.0]
    assert spearman(estimates, np.array([0.3, 0.5, 0.1])) == pytest.approx(expected)
    assert spearman(estimates, np.array([0.5, 0.3, 0.1])) == pytest.approx(expected)
    chained = np.array([1.0, 1.0 + 4e-13, 1.0 + 8e-13, 1.0 + 1.2e-12, 2.0])  # neighbours tie
    assert average_ranks(chained).tolist() == [2.5, 2.5, 2.5, 2.5, 5.0]
    assert average_ranks(np.array([1.0, np.inf, 2.0])).tolist() == [1.0, 3.0, 2.0]


def test_a_policy_called_behavior_without_a_truth_is_said_to_be_left_out():
    """Its shown name is the baseline's: the note said "no sharpe@k" only."""
    note = missing_truth_note({"p.npz": None, BASELINE_BEHAVIOR: 1.0}, {"p.npz": "behavior"})
    assert note == "--truth has no value for behavior; left out of the selection metrics"


def test_one_policy():
    metrics, notes = selection_metrics({"a": 3.0}, {"a": 2.5}, {"a": (2.0, 3.5)}, top_k=(1,))
    assert metrics == {
        "rmse": 0.5,
        "nmse": pytest.approx(0.25 / 9),
        "spearman": None,
        "coverage": 1.0,
        "regret@1": 0.0,
        "nregret@1": None,
        "precision@1": 1.0,
        "sharpe@1": None,
    }
    assert notes == []


def test_all_true_values_equal():
    metrics, _ = selection_metrics(
        {"a": 2.0, "b": 2.0, "c": 2.0}, {"a": 1.0, "b": 2.0, "c": 3.0}, baseline_value=1.0
    )
    assert metrics["nmse"] == pytest.approx(1 / 6)
    assert metrics["spearman"] is None
    assert metrics["regret@1"] == metrics["regret@3"] == 0.0
    assert metrics["nregret@1"] is None and metrics["nregret@3"] is None
    assert metrics["precision@1"] == metrics["precision@3"] == 1.0
    assert metrics["sharpe@3"] is None  # the std of the chosen true values is 0
    assert metrics["coverage"] is None  # no intervals given


def test_all_true_values_zero_has_no_nmse():
    metrics, _ = selection_metrics({"a": 0.0, "b": 0.0}, {"a": 1.0, "b": 0.0}, top_k=(1, 2))
    assert metrics["nmse"] is None and metrics["rmse"] == pytest.approx(math.sqrt(0.5))


def test_top_k_above_the_number_of_policies_is_refused_in_one_line():
    with pytest.raises(UsageError) as error:
        selection_metrics({"a": 1.0, "b": 2.0}, {"a": 1.0, "b": 2.0})
    assert one_line(error) == "--top-k 3 exceeds the 2 policies with a true value"
    assert error.value.exit_code == 2
    with pytest.raises(UsageError) as error:
        selection_metrics({"a": 1.0}, {"a": 1.0}, top_k=(0,))
    one_line(error)


def test_a_missing_true_value_leaves_the_policy_out():
    truth = {"a": 1.0, "b": None, "c": 3.0}
    with_b, _ = selection_metrics(truth, {"a": 1.0, "b": 100.0, "c": 2.0}, top_k=(1, 2))
    without_b, _ = selection_metrics({"a": 1.0, "c": 3.0}, {"a": 1.0, "c": 2.0}, top_k=(1, 2))
    assert with_b == without_b
    assert with_b["rmse"] == pytest.approx(math.sqrt(0.5)) and with_b["regret@1"] == 0.0
    with pytest.raises(UsageError) as error:
        selection_metrics({"a": None}, {"a": 1.0}, top_k=(1,))
    assert "no value for any" in one_line(error)


def test_an_undefined_estimate_makes_the_ranking_metrics_null_with_a_note():
    metrics, notes = selection_metrics(
        {"a": 1.0, "b": 2.0},
        {"a": None, "b": 2.0},
        {"a": (0.0, 2.0), "b": (3.0, 4.0)},
        top_k=(1,),
    )
    assert all(metrics[name] is None for name in metrics if name != "coverage")
    assert metrics["coverage"] == 0.5
    assert notes == ["no estimate for a; no rmse, nmse, spearman or @k metrics"]


def test_a_spearman_left_null_says_which_side_is_constant():
    """Every true value equal: spearman was null with no word (SPEC 11 names K < 2 only)."""
    metrics, notes = selection_metrics(
        {"a": 0.3, "b": 0.3, "c": 0.3}, {"a": 1.0, "b": 2.0, "c": 3.0}
    )
    assert metrics["spearman"] is None
    assert "the true values are all equal: no ranking for spearman to correlate" in notes
    metrics, notes = selection_metrics({"a": 1.0, "b": 2.0}, {"a": 5.0, "b": 5.0}, top_k=(2,))
    assert metrics["spearman"] is None
    assert "the estimates are all equal: no ranking for spearman to correlate" in notes
    # equal to rounding (0.1 + 0.2 against 0.3) is equal, as spearman's ranks take it
    truth = {"a": 0.1 + 0.2, "b": 0.3, "c": 0.3}
    metrics, notes = selection_metrics(truth, {"a": 1.0, "b": 2.0, "c": 3.0})
    assert "the true values are all equal: no ranking for spearman to correlate" in notes
    metrics, notes = selection_metrics({"a": 1.0, "b": 2.0}, {"a": 1.0, "b": 3.0}, top_k=(1,))
    assert metrics["spearman"] == 1.0 and notes == []


def test_selection_by_estimator_keys_the_metrics_by_estimator():
    estimates = {"pdis": J_HAT, "wis": {**J_HAT, "b": None}}
    intervals = {"pdis": {p: (v - 0.6, v + 0.6) for p, v in J_HAT.items()}}
    selection, notes = selection_by_estimator(
        J, estimates, intervals, baseline_value=2.0, top_k=(1,)
    )
    assert list(selection) == ["pdis", "wis"]
    assert (
        selection["pdis"]
        == selection_metrics(J, J_HAT, intervals["pdis"], baseline_value=2.0, top_k=(1,))[0]
    )
    assert selection["pdis"]["coverage"] == 0.25  # errors 0.5, -1, 1, -1: only a within 0.6
    assert selection["wis"]["rmse"] is None
    assert notes == [
        "wis: no estimate for b; no rmse, nmse, spearman or @k metrics",
        "wis: coverage over 0 of 4 policies; 4 without an interval left out",
    ]


def test_coverage_counts_the_undefined_intervals():
    assert coverage([(0.0, 1.0), (None, 2.0)], np.array([0.5, 1.0])) == (1.0, 1)
    assert coverage([(None, None)], np.array([0.5])) == (None, 1)
    assert coverage([(0.0, 1.0), (0.0, 1.0)], np.array([1.0, 1.5])) == (0.5, 0)


# --------------------------------------------------------------------- could-be-best sets


def test_bonferroni_level():
    assert bonferroni_level(0.95, 11) == pytest.approx(0.995)
    assert bonferroni_level(0.9, 2) == pytest.approx(0.9)
    assert bonferroni_level(0.95, 1) == 0.95
    with pytest.raises(ValueError):
        bonferroni_level(1.0, 3)


def test_could_be_best_on_a_constructed_case():
    estimates = {"a": 1.0, "b": 0.9, "c": 0.5}
    # V(a) - V(b) = 0.1 with stderr 0.048: above 0 at 95% (z 1.96) but not at the
    # Bonferroni level 97.5% for K = 3 (z 2.24); V(a) - V(c) = 0.5 +- 0.1 is above 0 at both.
    differences = {("a", "b"): (0.1, 0.048), ("a", "c"): (0.5, 0.1)}
    assert 0.1 - 1.96 * 0.048 > 0 > 0.1 - 2.2414 * 0.048
    assert could_be_best(estimates, differences, 0.95) == {"a": True, "b": True, "c": False}
    # with two policies the comparison is at 95% itself, and b is confidently worse
    assert could_be_best({"a": 1.0, "b": 0.9}, differences, 0.95) == {"a": True, "b": False}


def test_could_be_best_with_a_callable_asks_for_the_bonferroni_level():
    calls = []

    def paired_interval(best, other, level):
        calls.append((best, other, level))
        return (0.1, 0.3) if other == "c" else (-0.1, 0.3)

    result = could_be_best({"a": 0.5, "b": 0.4, "c": 0.1, "d": None}, paired_interval, 0.9)
    assert result == {"a": True, "b": True, "c": False, "d": True}
    assert [(b, k) for b, k, _ in calls] == [("a", "b"), ("a", "c"), ("a", "d")]
    assert all(level == pytest.approx(1 - 0.1 / 3) for _, _, level in calls)


def test_could_be_best_ties_reversed_pairs_and_undefined():
    assert estimated_best({"a": 1.0, "b": 1.0}) == "a"
    assert estimated_best({"a": None, "b": float("nan")}) is None
    # (c, a) given instead of (a, c): used negated
    assert could_be_best({"a": 2.0, "c": 0.0}, {("c", "a"): (-2.0, 0.1)}, 0.95) == {
        "a": True,
        "c": False,
    }
    assert could_be_best({"a": 2.0, "c": 0.0}, {}, 0.95) == {"a": True, "c": True}
    assert could_be_best({"a": None}, {}, 0.95) == {"a": True}
    low, high = normal_paired_intervals({("a", "b"): (1.0, 0.5)})("a", "b", 0.95)
    assert (low, high) == (pytest.approx(1 - 1.959964 * 0.5), pytest.approx(1 + 1.959964 * 0.5))
    assert normal_paired_intervals({("a", "b"): (1.0, None)})("a", "b", 0.95) == (None, None)


# --------------------------------------------------------------------- paired differences


def correlated_terms(n: int = 2000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Per-episode terms of two policies on the same episodes: a shared episode effect
    (the return) plus a small policy-specific part."""
    rng = np.random.default_rng(seed)
    shared_i = rng.lognormal(0.0, 1.0, n)
    terms_0 = shared_i * (1 + 0.05 * rng.standard_normal(n))
    terms_k = 1.1 * shared_i * (1 + 0.05 * rng.standard_normal(n))
    return terms_k, terms_0


def test_paired_mean_difference_against_the_reference_and_below_unpaired():
    terms_k, terms_0 = correlated_terms()
    delta, stderr = paired_mean_difference(terms_k, terms_0)
    difference_i = terms_k - terms_0
    assert delta == pytest.approx(np.mean(terms_k) - np.mean(terms_0), rel=1e-12)
    reference = math.sqrt(np.sum((difference_i - difference_i.mean()) ** 2) / (len(terms_k) - 1))
    assert stderr == pytest.approx(reference / math.sqrt(len(terms_k)), rel=1e-9)
    se_k = np.std(terms_k, ddof=1) / math.sqrt(len(terms_k))
    se_0 = np.std(terms_0, ddof=1) / math.sqrt(len(terms_0))
    assert stderr < 0.25 * math.sqrt(se_k**2 + se_0**2)


def test_paired_mean_difference_edge_cases():
    assert paired_mean_difference(np.array([2.0]), np.array([0.5])) == (1.5, None)
    assert paired_mean_difference(np.array([1.0, 3.0]), np.array([0.0, 0.0])) == (2.0, 1.0)
    with pytest.raises(ValueError):
        paired_mean_difference(np.ones(3), np.ones(2))


def test_grouped_jackknife_difference_of_a_ratio_estimate():
    """WIS-like ratio estimates of two policies on the same 32 groups of episodes: the
    jackknife of the difference against the formula, and below the unpaired errors."""
    rng = np.random.default_rng(1)
    n, groups = 3200, 32
    group_i = rng.integers(0, groups, n)
    return_i = rng.lognormal(0.0, 1.0, n)
    weight_k_i = rng.lognormal(0.0, 0.3, n)
    weight_0_i = weight_k_i * rng.lognormal(0.0, 0.05, n)

    def leave_out(weight_i):
        return np.array(
            [
                np.sum((weight_i * return_i)[group_i != g]) / np.sum(weight_i[group_i != g])
                for g in range(groups)
            ]
        )

    def ratio(weight_i):
        return np.sum(weight_i * return_i) / np.sum(weight_i)

    values_k, values_0 = leave_out(weight_k_i), leave_out(weight_0_i)
    delta = ratio(weight_k_i) - ratio(weight_0_i)
    stderr = grouped_jackknife_difference(values_k, values_0, delta)
    difference_g = values_k - values_0
    reference = math.sqrt((groups - 1) / groups * np.sum((difference_g - difference_g.mean()) ** 2))
    assert stderr == pytest.approx(reference, rel=1e-9)

    def jackknife(values):
        return math.sqrt((groups - 1) / groups * np.sum((values - values.mean()) ** 2))

    assert stderr < 0.5 * math.sqrt(jackknife(values_k) ** 2 + jackknife(values_0) ** 2)
    assert grouped_jackknife_difference(values_k, values_0, None) is None
    assert grouped_jackknife_difference(values_k[:1], values_0[:1], delta) is None
    values_k[3] = np.nan
    assert grouped_jackknife_difference(values_k, values_0, delta) is None


def test_grouped_jackknife_difference_of_two_groups_is_undefined():
    """Two episodes in two groups: each leave-out holds one episode, whose WIS is its return
    for every policy, so both leave-out differences are 0; the standard error was 0 (a
    zero-width interval, and the baseline left out of the could-be-best set)."""
    returns = np.array([0.2, 0.8])
    weight_k, weight_0 = np.array([0.2, 3.0]), np.array([0.4, 2.5])
    delta = (weight_k @ returns) / weight_k.sum() - (weight_0 @ returns) / weight_0.sum()
    leave_out = returns[::-1]  # group g left out: the other episode's return, either policy
    assert delta != 0
    assert grouped_jackknife_difference(leave_out, leave_out.copy(), delta) is None
    three = np.array([0.5, 0.4, 0.3])
    assert grouped_jackknife_difference(three, three - [0.1, 0.0, 0.1], delta) is not None


def test_p_improvement():
    assert p_improvement(np.array([1.0, 2.0, 3.0, 4.0]), np.array([0.0, 3.0, 2.0, 5.0])) == 0.5
    assert p_improvement(np.array([1.0, 1.0]), np.array([1.0, 0.0])) == 0.5  # ties are not > 0
    rounding = np.array([1e-15, -1e-15, 2e-15, 3e-15])
    assert p_improvement(rounding, np.zeros(4)) == 0.75
    assert p_improvement(rounding, np.zeros(4), tie=1e-12) == 0.0  # rounding: no improvement
    assert p_improvement(None, None) is None
    assert p_improvement(np.array([]), np.array([])) is None
    assert p_improvement(np.array([np.nan, 1.0]), np.array([0.0, 0.0])) is None  # half undefined
    defined = np.r_[np.ones(19), np.nan]
    assert p_improvement(defined, np.zeros(20)) == 1.0  # 95% defined: the share among them


@pytest.mark.slow  # a real process
def test_the_module_imports_no_jax():
    code = "import sys, ope_cli.choosing.selection; assert 'jax' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_truth_names_a_policy_by_the_name_of_name_equals_path():
    """An object's key may be the NAME of ``--policy NAME=PATH`` (as ``--baseline`` may):
    refused before; a path still wins, and a NAME that is no label names no policy (which
    is then left without a true value, said by ``missing_truth_note``)."""
    names = ["ckpts/a.npz", "ckpts/b.npz", BASELINE_BEHAVIOR]
    labels = {"fast": "ckpts/a.npz", "slow": "ckpts/b.npz"}
    truth = read_truth({"fast": 1.5, "ckpts/b.npz": 0.5}, names, labels)
    assert truth == {"ckpts/a.npz": 1.5, "ckpts/b.npz": 0.5, BASELINE_BEHAVIOR: None}
    unlabelled = read_truth({"fast": 1.5}, names)
    assert unlabelled == dict.fromkeys(names)
    assert "ckpts/a.npz" in missing_truth_note(unlabelled)
    with pytest.raises(UsageError, match="names 'ckpts/a.npz' twice"):
        read_truth({"fast": 1.5, "ckpts/a.npz": 1.0}, names, labels)
