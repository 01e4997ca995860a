"""The table formatter on real result objects: ranking, the best policy, the in-terminal
weight histogram and plain-words warnings for poor diagnostics (no CLI in between)."""

from __future__ import annotations

import dataclasses
import io
import json
import math
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

from ope_cli.config import EvaluationConfig
from ope_cli.estimation.pipeline import evaluate
from ope_cli.report import (
    SPARK,
    diagnostic_warnings,
    rank_policies,
    render_table,
    resolve_rank_by,
    to_csv,
    to_json,
    weight_sparklines,
)

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
CKPT, OTHER = (str(EXAMPLES / "policies" / name) for name in ("ckpt.npz", "other.npz"))


@pytest.fixture(scope="module")
def result():
    """The shipped example, two policies: other.npz has the higher WIS (0.21 vs -5.28).
    gamma = 1 is given: the example declares no discount, and the default is warned about."""
    return evaluate(
        EvaluationConfig(
            data=str(EXAMPLES / "data" / "logs.parquet"), policies=(CKPT, OTHER), gamma=1.0
        )
    )


def _render(result, **options) -> str:
    out = io.StringIO()
    render_table(result, Console(file=out, width=160, force_terminal=False), **options)
    return out.getvalue()


def _with_diagnostics(result, index, **changes):
    results = list(result.results)
    policy = results[index]
    results[index] = dataclasses.replace(
        policy, diagnostics=dataclasses.replace(policy.diagnostics, **changes)
    )
    return dataclasses.replace(result, results=results)


def test_rank_by_estimator(result):
    assert resolve_rank_by(result) == "wis"
    assert rank_policies(result, "wis") == [2, 1]
    values = [p.estimates["pdis"].value for p in result.results]
    assert rank_policies(result, "pdis") == ([1, 2] if values[0] > values[1] else [2, 1])
    narrowed = dataclasses.replace(result, estimators=("pdis", "is"))
    assert resolve_rank_by(narrowed) == "pdis"


def test_undefined_values_rank_last(result):
    results = list(result.results)
    estimates = dict(results[1].estimates)
    estimates["wis"] = dataclasses.replace(estimates["wis"], value=None)
    results[1] = dataclasses.replace(results[1], estimates=estimates)
    assert rank_policies(dataclasses.replace(result, results=results), "wis") == [1, None]


def test_table_groups_by_policy_ranks_and_marks_the_best(result):
    text = _render(result)
    for heading in ("rank", "policy", "estimator", "value ± std. err.", "95% interval"):
        assert heading in text
    best_row = next(line for line in text.splitlines() if "★ 1" in line)
    assert " other.npz " in best_row and " IS " in best_row  # labelled by its file name
    assert f"other.npz = {OTHER}" in text  # the footer gives the label's path
    assert "rank: by WIS" in text
    wis = result.results[0].estimates["wis"]
    assert f"{wis.value:.4g} ± {wis.stderr:.4g}" in text
    assert f"[{wis.ci_low:.4g}, {wis.ci_high:.4g}]" in text
    assert "warning" not in text  # the example's diagnostics are healthy


def test_rank_by_option_changes_the_caption(result):
    assert "rank: by PDIS" in _render(result, rank_by="pdis")


def test_one_policy_has_no_rank_column(result):
    one = dataclasses.replace(result, results=result.results[:1])
    text = _render(one)
    assert "rank" not in text and "★" not in text


def test_weight_histogram_in_the_table(result):
    lines, ticks, labels = weight_sparklines(result)
    assert len(lines) == 2 and len({len(line) for line in (*lines, ticks, labels)}) == 1
    assert all(set(line) <= set(SPARK) and "█" in line for line in lines)  # each scaled to its max
    assert ticks.count("┬") == 1 and labels[ticks.index("┬")] == "1"  # the tick marks weight 1
    text = _render(result)
    assert "trajectory weights (log scale)" in text
    for line in lines:
        assert line.strip() in text


def test_weight_axis_labels_never_run_together(result):
    """With weights up to 16, the label "1" was printed against the right end's "17.8",
    which then read "117.8"."""
    from ope_cli.report.table import weight_label

    profile = result.results[0].profile
    edges, bins = profile.histogram_edges, len(profile.histogram_counts) - 2
    ends = set()
    for low in range(bins):
        for high in range(low, bins):
            counts = np.zeros(bins + 2, np.int64)
            counts[[low + 1, high + 1]] = 1
            policy = dataclasses.replace(
                result.results[0],
                profile=dataclasses.replace(profile, histogram_counts=counts.tolist()),
            )
            _, ticks, labels = weight_sparklines(dataclasses.replace(result, results=[policy]))
            words = labels.split()
            shown = {weight_label(edge) for edge in edges} | {"1"}
            assert set(words) <= shown, labels
            assert "1" not in words or labels[ticks.index("┬")] == "1"
            ends.add(len(words))
    assert ends == {2, 3}  # both ends, with "1" where it has room


def test_warnings_in_plain_words(result):
    poor = _with_diagnostics(
        result, 1, ess=50.0, ess_fraction=0.025, max_weight_share=0.6, mean_weight=3.2
    )
    warnings = diagnostic_warnings(poor)
    assert len(warnings) == 3 and all(w.startswith(OTHER) for w in warnings)
    assert "effective sample size" in warnings[0] and "2.5%" in warnings[0]
    assert "one episode holds 60%" in warnings[1]
    assert "mean weight is 3.2" in warnings[2] and "behavior probabilities" in warnings[2]
    text = _render(poor)
    assert text.count("warning:") == 3

    low_mean = _with_diagnostics(result, 0, mean_weight=0.3)
    assert [w.split(":")[0] for w in diagnostic_warnings(low_mean)] == [CKPT]


def test_all_zero_weights_get_one_warning(result):
    zero = _with_diagnostics(
        result,
        0,
        ess=None,
        ess_fraction=None,
        mean_weight=0.0,
        max_weight=0.0,
        max_weight_share=None,
        zero_weight_fraction=1.0,
    )
    (warning,) = diagnostic_warnings(zero)
    assert "every trajectory weight is zero" in warning


def test_unchecked_actions_are_reported(result):
    from ope_cli.report.json_format import to_json_dict

    assert all(p.actions_checked for p in result.results)
    assert to_json_dict(result)["results"][0]["actions_checked"] is True
    results = list(result.results)
    results[0] = dataclasses.replace(results[0], actions_checked=False)
    unchecked = dataclasses.replace(result, results=results)
    (warning,) = diagnostic_warnings(unchecked)
    assert warning.startswith(CKPT) and "not checked" in warning and "n_actions" in warning
    assert to_json_dict(unchecked)["results"][0]["actions_checked"] is False
    assert "not checked" in _render(unchecked)


def test_zero_width_intervals_are_warned(tmp_path):
    """Logs whose rewards are all 0: every episode's value is 0, so every standard error is
    0 and every interval [0, 0]; the report says that this is no certainty, per policy
    (the one estimator of a one-episode run has no standard error: nothing to warn)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ope_cli.report import to_json_dict

    table = pq.read_table(EXAMPLES / "data" / "logs.parquet")
    zero = pa.array(pa.compute.multiply(table["reward"], 0), table.schema.field("reward").type)
    path = tmp_path / "zero.parquet"
    pq.write_table(table.set_column(table.schema.get_field_index("reward"), "reward", zero), path)
    zeroed = evaluate(EvaluationConfig(data=str(path), policies=(CKPT,), gamma=1.0))
    estimates = zeroed.results[0].estimates
    assert all(e.value == 0 and e.ci_low == e.ci_high == 0 for e in estimates.values())
    (warning,) = [w for w in to_json_dict(zeroed)["warnings"] if w["code"] == "zero_width_interval"]
    assert warning["policy"] == CKPT
    assert warning["message"].startswith(f"{CKPT}: {', '.join(estimates)}: the interval has no")
    assert "the standard error is 0, as the 2,000 episodes show no spread" in warning["message"]


def test_intervals_of_some_width_are_not_warned(result):
    assert not any("the interval has no width" in text for text in diagnostic_warnings(result))


def test_a_zero_width_interval_from_a_spread_float64_lost_says_so(result):
    """Rewards of 1e12 plus a spread of 1: uncentred sums can cancel the spread to 0 (the
    estimate's note says so). The warning then names the constant that can hide a spread,
    not only episodes that show none; an interval of no width without that note keeps the
    plain message."""
    from ope_cli.estimation.estimators.importance import zero_to_precision
    from ope_cli.report.warnings import ZERO_WIDTH, policy_warnings

    policy = result.results[0]
    note = f"{zero_to_precision()}: any spread of the terms is below the rounding of their ..."
    point = dataclasses.replace(policy.estimates["is"], value=1e12, stderr=0.0)
    point = dataclasses.replace(point, ci_low=1e12, ci_high=1e12)

    def message(estimate) -> str:
        only = dataclasses.replace(policy, estimates={"is": estimate})
        (warning,) = [w for w in policy_warnings(only, 2000) if w.code == ZERO_WIDTH]
        return warning.message

    hidden = message(dataclasses.replace(point, note=note))
    assert hidden.endswith(
        "For is, float64 may also have lost a spread: their values share a constant far "
        "larger than it (in every reward, say); subtracting it from the rewards shows "
        "whether there is one."
    )
    # a float32 run's note names float32, and so does the warning (it named float64)
    single = message(dataclasses.replace(point, note=note.replace("float64", "float32")))
    assert single.endswith(
        hidden.split("For is, ")[0] + "For is, float32 may" + hidden.split("float64 may")[1]
    )
    plain = message(dataclasses.replace(point, note=None))
    assert "show no spread in these values (each gives the same value, or one" in plain
    assert "constant" not in plain


def test_dm_far_from_dr_is_warned(result):
    """DM more than 3 of DR's standard errors from DR: a biased Q-hat, whose DM interval
    (sampling spread only) is narrow around the wrong value; within 3, no warning."""
    from ope_cli.report.warnings import DM_FAR_FROM_DR, policy_warnings

    policy = result.results[0]
    point = dataclasses.replace(policy.estimates["is"], value=5.0, stderr=0.5)

    def warned(dm_value: float) -> list[str]:
        estimates = {"dm": dataclasses.replace(point, value=dm_value), "dr": point}
        only = dataclasses.replace(policy, estimates=estimates)
        return [w.message for w in policy_warnings(only, 2000) if w.code == DM_FAR_FROM_DR]

    (message,) = warned(9.0)
    assert message == (
        f"{policy.policy}: dm is 8 of dr's standard errors from dr: Q-hat is probably biased "
        "for this policy, and dm's interval, which counts only its sampling spread, does "
        "not cover that; prefer dr or wdr, or a better Q model."
    )
    assert warned(6.4) == [] and warned(3.6) == []
    # never rounded onto the threshold: 3.01 read "dm is 3 of dr's standard errors"
    (near,) = warned(6.505)
    assert near.startswith(f"{policy.policy}: dm is 3.01 of dr's standard errors"), near
    (far,) = warned(5.0 + 0.5 * 1234.4)
    assert far.startswith(f"{policy.policy}: dm is 1,234 of dr's standard errors"), far

    # dr without spread (every return the same): any dm not dr to rounding is far from it
    exact = dataclasses.replace(point, value=1.0, stderr=0.0)
    estimates = {"dm": dataclasses.replace(exact, value=5.0), "dr": exact}
    only = dataclasses.replace(policy, estimates=estimates)
    (message,) = [w.message for w in policy_warnings(only, 2000) if w.code == DM_FAR_FROM_DR]
    assert "dm is 5 where dr is 1, with a standard error of 0: Q-hat is probably" in message
    same = dataclasses.replace(policy, estimates={"dm": exact, "dr": exact})
    assert not [w for w in policy_warnings(same, 2000) if w.code == DM_FAR_FROM_DR]


@pytest.mark.parametrize(
    ("fit", "warned"),
    [
        ({"model": "mlp", "iterations": 100, "converged": False}, True),
        ({"model": "mlp", "iterations": [12, 1000], "converged": [True, False]}, True),
        ({"model": "mlp", "iterations": [12, 14], "converged": [True, True]}, False),
        ({"model": "linear"}, False),  # a closed form: nothing to converge
    ],
)
def test_a_fitted_q_that_did_not_converge_is_warned(result, fit, warned):
    """A Q-hat fitted with fewer iterations than its look-ahead undervalues (dm printed
    63.4 for a true 95 on 300-step episodes): every format says so."""
    from ope_cli.report.warnings import Q_FIT_NOT_CONVERGED, policy_warnings
    from ope_cli.results import QSource

    policy = dataclasses.replace(result.results[0], q=QSource("fit", "fit", "mlp_q", fit))
    found = [w.message for w in policy_warnings(policy, 2000) if w.code == Q_FIT_NOT_CONVERGED]
    assert bool(found) == warned
    if warned:
        ran = max(fit["iterations"]) if isinstance(fit["iterations"], list) else 100
        assert found[0].startswith(
            f"{policy.policy}: the fitted Q-hat (mlp) did not converge in {ran} iterations"
        )


def test_intervals_on_a_fitted_q_say_they_leave_out_its_error(result):
    """A coverage study on generated chain data: dm's 95% interval on a fitted Q-hat
    covered the truth 2-37% of the time, with only the generic warning; dr's and wdr's
    65-85% where heavy weights met a poor fit."""
    from ope_cli.report.warnings import FITTED_Q_INTERVALS, run_warnings
    from ope_cli.results import QSource

    point = result.results[0].estimates["is"]
    estimates = {"dm": point, "dr": point, "wis": point}

    def with_q(q, names=("wis", "dm", "dr")):
        policy = dataclasses.replace(
            result.results[0], q=q, estimates={n: estimates[n] for n in names}
        )
        return dataclasses.replace(result, results=[policy], estimators=names)

    def found(evaluation):
        return [w.message for w in run_warnings(evaluation) if w.code == FITTED_Q_INTERVALS]

    (message,) = found(with_q(QSource("fit", "fit", "linear_q", {"model": "linear"})))
    assert message.startswith("dm, dr read a fitted Q-hat (--q fit), and their intervals")
    assert "dm's takes Q-hat as exact" in message
    (no_dm,) = found(with_q(QSource("fit", "fit", "linear_q", {}), ("wis", "dr")))
    assert no_dm.startswith("dr read a fitted Q-hat") and "dm's" not in no_dm
    (dm_alone,) = found(with_q(QSource("fit", "fit", "linear_q", {}), ("wis", "dm")))
    assert dm_alone.startswith("dm read a fitted Q-hat") and "dr's" not in dm_alone
    assert found(with_q(QSource("q.npz", "checkpoint", "linear_q", None))) == []
    assert found(with_q(None, ("wis",))) == []
    # one policy's Q-hat fitted, the other's a checkpoint: the warning is the first's own
    # (run-wide, CSV put it on the rows of the policy whose Q-hat is exact)
    fit = with_q(QSource("fit", "fit", "linear_q", {}))
    given = dataclasses.replace(
        fit.results[0], policy="other.npz", q=QSource("q.npz", "checkpoint", "linear_q", None)
    )
    mixed = dataclasses.replace(fit, results=[fit.results[0], given])
    (own,) = [w for w in run_warnings(mixed) if w.code == FITTED_Q_INTERVALS]
    assert own.policy == fit.results[0].policy != "other.npz"
    assert own.message.startswith(f"{own.policy}: dm, dr read a fitted Q-hat")


def _with_estimate(result, index: int, name: str, **fields):
    """``result`` with policy ``index``'s ``name`` estimate changed."""
    results = list(result.results)
    policy = results[index]
    estimates = dict(policy.estimates)
    estimates[name] = dataclasses.replace(estimates[name], **fields)
    results[index] = dataclasses.replace(policy, estimates=estimates)
    return dataclasses.replace(result, results=results)


def test_values_are_shown_to_their_standard_error(result):
    """Four significant digits printed 1000.00469 ± 0.00035 as "1000 ± 0.0003528" and its
    interval [1000.0040, 1000.0054] as "[1000, 1000]": a real interval of no width, and two
    policies 13 standard errors apart shown equal."""
    close = _with_estimate(
        result, 0, "wis", value=1000.0046897, stderr=0.00035278, ci_low=1000.0040, ci_high=1000.0053
    )
    text = _render(close)
    assert "1000.00469 ± 0.0003528" in text
    assert "[1000.00400, 1000.00530]" in text
    assert "[1000, 1000]" not in text
    # a wide spread keeps four significant digits, as before
    wide = _with_estimate(result, 0, "wis", value=2.0, stderr=0.3, ci_low=1.4, ci_high=2.6)
    assert "2 ± 0.3" in _render(wide) and "[1.4, 2.6]" in _render(wide)


def test_the_interval_header_keeps_the_level_s_digits(result):
    for confidence, header in ((0.999, "99.9% interval"), (0.975, "97.5% interval")):
        shown = dataclasses.replace(
            result, confidence=dataclasses.replace(result.confidence, level=confidence)
        )
        assert header in _render(shown)
        assert "100% interval" not in _render(shown)


def test_a_narrow_terminal_folds_numbers_rather_than_cutting_them(result):
    """At 60 columns "5.161e-10" was cut to "5.161…", a number near 5."""
    tiny = _with_estimate(
        result, 0, "is", value=5.161e-10, stderr=1.2e-11, ci_low=4.69e-10, ci_high=5.63e-10
    )
    out = io.StringIO()
    render_table(tiny, Console(file=out, width=60, force_terminal=False))
    table = out.getvalue().split("weight diagnostics")[0]
    assert "…" not in table
    assert "5.161e" in table and "4.69e" in table and "-10" in table  # folded, not cut


def test_an_estimate_outside_its_own_interval_is_warned_about_in_every_format(result):
    """A betting interval (shared by is and wis) gave IS 1.029 against [0.5192, 1.017] on
    generated data, with no warning."""
    from ope_cli.report import to_csv, to_json

    outside = _with_estimate(result, 0, "is", value=1.029, ci_low=0.5192, ci_high=1.017)
    policy = outside.results[0]
    betting = dataclasses.replace(policy, ci_methods={**policy.ci_methods, "is": "betting"})
    outside = dataclasses.replace(outside, results=[betting, *outside.results[1:]])
    warnings = json.loads(to_json(outside))["warnings"]
    (warning,) = [w for w in warnings if w["code"] == "estimate_outside_interval"]
    assert warning["policy"] == CKPT and warning["message"].startswith(f"{CKPT}: is: ")
    assert "betting: a confidence set" in warning["message"]
    assert "estimate_outside_interval" in to_csv(outside)
    assert "lies outside its own interval" in _render(outside)
    inside = json.loads(to_json(result))["warnings"]
    assert not [w for w in inside if w["code"] == "estimate_outside_interval"]


def test_equal_values_share_a_rank_and_both_are_the_best(result):
    """Two identical checkpoints were ranked 1 and 2 (by command-line order), only the first
    marked best, while the selection metrics said the top 1 was undetermined."""
    value = result.results[1].estimates["wis"].value
    tied = _with_estimate(result, 0, "wis", value=value)
    assert rank_policies(tied, "wis") == [1, 1]
    third = dataclasses.replace(tied, results=[*tied.results, result.results[0]])
    assert rank_policies(third, "wis") == [1, 1, 3]
    assert _render(tied).count("★ 1") == 2
    ranks = [r["rank"] for r in json.loads(to_json(tied))["results"]]
    assert ranks == [1, 1]


def test_values_equal_to_rounding_share_a_rank(result):
    """One policy as an entry point and as a checkpoint: WIS 2e-15 apart, both shown as
    2.365, were ranked 1 and 2, one of them the best."""
    value = result.results[1].estimates["wis"].value
    tied = _with_estimate(result, 0, "wis", value=value * (1 + 2e-15))
    assert rank_policies(tied, "wis") == [1, 1]
    apart = _with_estimate(result, 0, "wis", value=value * (1 + 1e-9))
    assert rank_policies(apart, "wis") == ([1, 2] if value > 0 else [2, 1])


def test_weight_warnings_never_round_onto_their_thresholds():
    """The warnings quote the number that crossed the threshold with the digits that show
    it: "9.996 of 100 episodes (9.996%)", not "10.0 of 100 episodes (10.0%)"."""
    from ope_cli.estimation.stats import Diagnostics
    from ope_cli.report.warnings import policy_warnings
    from ope_cli.results import PolicyResult

    diagnostics = Diagnostics(9.996, 0.09996, 0.49996, 3.0, 0.5004, 0.0)
    policy = PolicyResult("pi", {}, diagnostics, None)
    messages = {w.code: w.message for w in policy_warnings(policy, 100)}
    assert "is 9.996 of 100 episodes (9.996%)" in messages["low_ess"]
    assert "holds 50.04% of the total weight" in messages["one_episode_dominates"]
    assert "the mean weight is 0.49996, far from 1" in messages["mean_weight_far_from_one"]


@pytest.mark.parametrize(
    ("mean", "ess", "warned"),
    [
        (1.945, 1994.0, "1.95, 31 standard errors above 1"),  # a fitted model off: inside [0.5, 2]
        (1.104, 116.0, None),  # the right propensities, heavy weights: 1.1 standard errors
        (1.04, 3000.0, None),  # 5 standard errors, but within 5% of 1
        # below 1 with light tails (ESS 99.75%): probability where the logs have none
        (0.8, 3990.0, "0.8, 320 standard errors below 1 (its expected value when the beh"),
        (0.8, 400.0, None),  # below 1, heavy tails (ESS 10%) pull the mean down: 5.3 errors
        (0.97, 3990.0, None),  # 47 standard errors below 1, but within 5% of 1
    ],
)
def test_a_mean_weight_many_standard_errors_off_one_is_warned_of(mean, ess, warned):
    """The mean weight's warning also fires inside [0.5, 2] where the mean is more than 4
    of its standard errors (from the ESS) and 5% above 1: a behavior model missing the
    behavior's spread gave 1.945 +- 0.031 and was not warned of. Below 1 too where the
    weights are light-tailed (an ESS of half the episodes or more), so that heavy tails
    cannot be what pulls the mean down: a policy putting 60% on an action never logged in
    a state gave IS 0.283 +- 0.005 (truth 0.59), mean weight 0.69, ESS 97%, unwarned."""
    from ope_cli.estimation.stats import Diagnostics
    from ope_cli.report.warnings import policy_warnings
    from ope_cli.results import PolicyResult

    diagnostics = Diagnostics(ess, ess / 4000, mean, 3.0, 0.01, 0.0)
    codes = {
        w.code: w.message for w in policy_warnings(PolicyResult("pi", {}, diagnostics, None), 4000)
    }
    if warned is None:
        assert "mean_weight_far_from_one" not in codes
    else:
        assert f"the mean weight is {warned}" in codes["mean_weight_far_from_one"]
        below = "light-tailed (an effective sample size of 99.8% of the episodes), the polic"
        assert (below in codes["mean_weight_far_from_one"]) == (mean < 1)
        assert (
            "puts about 20% of its probability where the logs have (almost) none"
            in (codes["mean_weight_far_from_one"])
        ) == (mean < 1)


def test_the_mean_weight_above_one_by_where_the_propensities_come_from(result):
    """Out-of-fold estimated propensities (--behavior-cross-fit) raise the mean weight on
    their own (a right model on 1,000 bandit episodes: 1.10, 4.5 standard errors above 1):
    they get a higher bar (10 standard errors, 20%), which a model missing the behavior's
    spread still crosses (1.946, 31). The advice names what the run used: the column, or
    the fitted model (it said to check behavior_prob, which --behavior estimate never
    reads). The table flags the cell by the same rule (1.94, 31 standard errors above 1,
    was not flagged)."""
    from ope_cli.models.behavior import BehaviorFit, BehaviorSource
    from ope_cli.report.table import _diagnostics_table

    def run(mean: float, ess: float, folds: int | None):
        off = _with_diagnostics(result, 0, mean_weight=mean, ess=ess)
        off = dataclasses.replace(off, dataset=dataclasses.replace(off.dataset, episodes=4000))
        if folds is None:
            return off
        fit = BehaviorFit("linear_softmax", 4000, 4000, -1.0, 1e-3, 0, 1.0, cross_fit=folds)
        return dataclasses.replace(off, behavior=BehaviorSource("estimated", "x", fit=fit))

    def flagged(run_) -> bool:
        (column,) = [c for c in _diagnostics_table(run_).columns if c.header == "mean weight"]
        return "yellow" in str(list(column.cells)[0].style)

    wrong = run(1.945, 1994.0, None)  # a --behavior checkpoint or the column
    (message,) = diagnostic_warnings(wrong)
    assert "31 standard errors above 1" in message and "behavior probabilities are" in message
    assert flagged(wrong)
    for folds in (1, 3):  # a fitted model, in-sample or out-of-fold: still warned
        (message,) = diagnostic_warnings(run(1.945, 1994.0, folds))
        assert "31 standard errors above 1" in message
        assert "check the estimated behavior model" in message
        assert ("--behavior-cross-fit" in message) == (folds == 3)
    ess = 4000 / (1 + 3999 * (0.1 / (4.5 * 1.10)) ** 2)  # 1.10: 4.5 standard errors above 1
    assert diagnostic_warnings(run(1.10, ess, None))  # exact propensities: warned
    assert diagnostic_warnings(run(1.10, ess, 1))  # in-sample: warned
    assert diagnostic_warnings(run(1.10, ess, 3)) == [] and not flagged(run(1.10, ess, 3))


def test_an_out_of_fold_estimate_far_from_the_logged_one_names_the_folds_noise(result):
    """The right model on 100 chain episodes, 3 folds, moved an estimate 3.5 standard errors
    from the logged column's: the warning said the model missed the behavior and pointed to
    ope fit-behavior, which fits in-sample and found nothing."""
    from ope_cli.models.behavior import BehaviorFit, BehaviorSource
    from ope_cli.report.warnings import estimated_behavior_warnings

    gap = {
        "estimator": "is",
        "estimated": {"value": 1.5, "stderr": 0.1},
        "logged": {"value": 1.0, "stderr": 0.1},
        "standard_errors": 0.5 / math.hypot(0.1, 0.1),  # 3.5
    }

    def run(folds: int):
        fit = BehaviorFit("tabular", 100, 900, -1.0, 1e-3, 0, 1.0, "behavior_prob", None, folds)
        fit = dataclasses.replace(fit, logged_gap={"pi": gap, "other": None})
        behavior = BehaviorSource("estimated", "tabular", "tabular", fit)
        return estimated_behavior_warnings(dataclasses.replace(result, behavior=behavior))

    (in_sample,) = run(1)
    assert in_sample.policy == "pi" and in_sample.message.startswith("pi: is is 1.5 ")
    assert "3.5 standard errors apart" in in_sample.message
    assert "misses what the behavior depends on" in in_sample.message
    assert "`ope fit-behavior`" in in_sample.message
    (folds,) = run(3)
    assert "(--behavior-cross-fit 3) is fitted on the other folds' episodes" in folds.message
    assert "--behavior-cross-fit 1 shows whether it does" in folds.message
    assert "`ope fit-behavior`" not in folds.message
    # far beyond what the folds' noise gives: the model (21 standard errors, cross-fitted)
    gap.update(estimated={"value": 1.0 + 21 * math.hypot(0.1, 0.1), "stderr": 0.1})
    gap["standard_errors"] = 21.0
    (far,) = run(3)
    assert "21 standard errors apart: the model misses" in far.message


def test_an_in_sample_behavior_fit_that_overfits_is_warned_of_in_every_format(result):
    """--behavior estimate:mlp_softmax on 600 bandit episodes scored -1.72 nats per step in
    sample and -2.96 on held-out episodes: every IS interval missed the truth (28% low),
    with nothing said, where ope fit-behavior warned of the same fit. The run's warnings
    (JSON, CSV, the table's footer) say so; a held-out score close to the in-sample one,
    or none (another model, a cross-fit), says nothing."""
    from ope_cli.models.behavior import BehaviorFit, BehaviorSource
    from ope_cli.report.warnings import run_warnings

    def warned(heldout: float | None, model: str = "mlp_softmax") -> list:
        fit = BehaviorFit(model, 600, 600, -1.7177, 1e-3, 0, 2.0)
        fit = dataclasses.replace(fit, heldout_mean_log_likelihood=heldout)
        behavior = BehaviorSource("estimated", model, model, fit)
        run = dataclasses.replace(result, behavior=behavior)
        return [w for w in run_warnings(run) if w.code == "behavior_fit_overfits"], run

    (warning,), run = warned(-2.9607)
    assert warning.message.startswith(
        "the mlp_softmax model scores -2.96 nats per step on the held-out fifth of the "
        "episodes against -1.72 on the episodes it was fitted on: it overfits them"
    )
    assert warning.message.endswith(
        "prefer a simpler model (linear_softmax, or tabular for integer states) or more episodes."
    )
    codes = [w["code"] for w in json.loads(to_json(run))["warnings"]]
    assert "behavior_fit_overfits" in codes
    assert "behavior_fit_overfits: the mlp_softmax model scores -2.96" in to_csv(run)
    assert "the mlp_softmax model scores -2.96 nats per step" in " ".join(_render(run).split())
    assert warned(-1.9)[0] == [] and warned(None)[0] == []
    # no held-out score where one was to be made (a fold held no episode): said, not silent
    (unchecked,) = [w for w in run_warnings(warned(None)[1]) if w.code == "behavior_fit_unchecked"]
    assert unchecked.message.startswith("none, or every one, of the 600 episode(s) fell")
    assert [w for w in run_warnings(warned(None, "tabular")[1]) if "unchecked" in w.code] == []
    _, run = warned(None)
    fit = dataclasses.replace(run.behavior.fit, cross_fit=2)  # out-of-fold: nothing to score
    cross = dataclasses.replace(run, behavior=dataclasses.replace(run.behavior, fit=fit))
    assert [w for w in run_warnings(cross) if "unchecked" in w.code] == []
    # linear_softmax overfitting 3 episodes was told to prefer "(tabular, linear_softmax)"
    (linear,), _ = warned(-2.9607, "linear_softmax")
    assert linear.message.endswith("would be off; prefer more episodes.")


def test_drops_for_one_policy_s_range_say_they_apply_to_every_policy(result):
    """Episodes outside one candidate's state range were dropped for every policy (so that
    the comparisons stay paired), moving another policy's WPDIS from 2.392 to 2.025, and
    the drop warning named no policy. It says so where a policy's range dropped them."""
    from ope_cli.report.warnings import dropped_line

    def line(reason: str, results=None) -> str:
        dataset = dataclasses.replace(
            result.dataset,
            episodes_dropped=21,
            steps_dropped=210,
            dropped={reason: {"episodes": 21, "steps": 210}},
        )
        return dropped_line(
            dataclasses.replace(result, dataset=dataset, results=results or result.results)
        )

    said = "left out for every policy, so that their comparisons stay paired"
    assert said in line("state_out_of_range") and said in line("action_out_of_range")
    assert said not in line("reward_not_finite")
    assert said not in line("state_out_of_range", result.results[:1])  # one policy


def test_a_zero_width_interval_from_underflow_says_so():
    """IS and PDIS of weights that all underflow print 0 +- 0: the warning says the values
    are below float64's range, not that the episodes show no spread."""
    from ope_cli.estimation.estimators.importance import UNDERFLOW
    from ope_cli.estimation.stats import Diagnostics, Estimate
    from ope_cli.report.warnings import policy_warnings
    from ope_cli.results import PolicyResult

    estimates = {
        "is": Estimate(0.0, 0.0, 0.0, 0.0, UNDERFLOW),
        "wis": Estimate(1.0, 0.0, 1.0, 1.0),
    }
    diagnostics = Diagnostics(30.0, 1.0, 1.0, 1.0, 0.1, 0.0)
    (warning,) = policy_warnings(PolicyResult("pi", estimates, diagnostics, None), 30)
    assert warning.message.startswith(
        "pi: is: the interval has no width because the values are below float64's range"
    )
    assert "wis: the interval has no width: the standard error is 0, as the 30" in warning.message


def test_weights_below_the_float_range_are_not_shown_as_zero(result):
    """Every weight about 1e-4343 (logits of -1e4): the table showed a mean and a largest
    weight of 0 beside "zero weights 0.0%"; they are below float64's range, not zero."""
    underflowed = _with_diagnostics(result, 0, mean_weight=0.0, max_weight=0.0)
    rendered = _render(underflowed)
    rows = [line for line in rendered.splitlines() if line.count("< 5e-324") == 2]
    assert len(rows) == 1, rendered  # the mean and the largest weight
    assert "the mean weight is < 5e-324, far from 1" in " ".join(rendered.split()), rendered
    zero = _with_diagnostics(result, 0, mean_weight=0.0, max_weight=0.0, zero_weight_fraction=1.0)
    assert "< 5e-324" not in _render(zero)  # every weight zero: 0 is right


def test_a_mean_weight_above_one_without_spread_is_warned(result):
    """200 weights of exactly 1.5 (IS = 1.5 x WIS) were warned of by no format, while 1.5
    +- 0.001 were 7,400 standard errors above 1: with no spread the mean is exact."""
    from ope_cli.report.warnings import MEAN_WEIGHT_OFF, policy_warnings

    def warned(mean: float) -> list[str]:
        constant = _with_diagnostics(result, 0, mean_weight=mean, ess=200.0, ess_fraction=1.0)
        return [
            w.message
            for w in policy_warnings(constant.results[0], 200)
            if w.code == MEAN_WEIGHT_OFF
        ]

    (message,) = warned(1.5)
    assert "the mean weight is 1.5, above 1 in every episode alike (the weights have no" in (
        " ".join(message.split())
    )
    assert warned(1.0) == [] and warned(1.01) == []  # 1.01: within the 5% the rule allows
    (below,) = warned(0.8)  # every weight 0.8: probability where the logs have none
    assert "the mean weight is 0.8, below 1 in every episode alike" in " ".join(below.split())


def test_one_dominating_episode_names_each_self_normalised_estimate():
    """One episode holding most of the weight is all of every estimate that divides by the
    weights, and of WDR's weighted correction (its direct-method part is every episode's)
    when the run reports it, which the warning left out."""
    from ope_cli.estimation.stats import Diagnostics, Estimate
    from ope_cli.report.warnings import policy_warnings
    from ope_cli.results import PolicyResult

    diagnostics = Diagnostics(1.2, 0.012, 1.0, 3.0, 0.9, 0.0)
    names = ("is", "wis", "pdis", "wpdis", "dm", "dr", "wdr")
    estimates = {name: Estimate(1.0, 0.1, 0.8, 1.2) for name in names}
    policy = PolicyResult("pi", estimates, diagnostics, None)
    message = {w.code: w.message for w in policy_warnings(policy, 100)}["one_episode_dominates"]
    assert message.endswith(
        "WIS and WPDIS are essentially that single episode's return, and WDR's correction "
        "to the Q-hat estimate is that episode's."
    )
    estimates = {name: Estimate(1.0, 0.1, 0.8, 1.2) for name in ("is", "wis")}
    policy = PolicyResult("pi", estimates, diagnostics, None)
    message = {w.code: w.message for w in policy_warnings(policy, 100)}["one_episode_dominates"]
    assert message.endswith("WIS is essentially that single episode's return.")


def test_no_number_is_folded_in_a_narrow_terminal(result):
    """At 80 columns and less the tables folded numbers over two lines ("0.00255" over "6")
    and cut names ("eval_0.np" over "z", "precis…"): every number of the diagnostics table,
    as JSON has it (4 significant digits), is on one line at 50 columns."""
    out = io.StringIO()
    render_table(result, Console(file=out, width=50, force_terminal=False))
    lines = out.getvalue().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("weight diagnostics"))
    rows = [line for line in lines[start:] if line.startswith("│")]
    for policy in result.results:
        label = policy.policy.rsplit("/", 1)[-1]
        row = next((line for line in rows if label in line), None)
        assert row is not None, (label, rows)  # the label whole, on its row
        ess = f"{policy.diagnostics.ess:.1f}"
        assert ess in row, (ess, row)
    assert "…" not in out.getvalue()


def test_values_without_a_spread_are_shown_to_their_row_s_finest(result):
    """Rewards of 1e8 + N(0, 1): a dm whose standard error float64 did not resolve read
    "1e+08" beside a WIS of 100000000.4645 +- 0.009214, as if 0.46 apart; and the behavior
    baseline's title read "mean return 100000000" beside rows of 100000000.032 and their
    difference -0.0008 (subtracted, the wrong sign)."""
    offset = _with_estimate(result, 0, "wis", value=100000000.4645, stderr=0.009214)
    unresolved = {"stderr": None, "ci_low": None, "ci_high": None, "note": "not resolved"}
    offset = _with_estimate(offset, 0, "is", value=100000000.46487, **unresolved)
    offset = _with_estimate(offset, 0, "pdis", value=1e8 + 0.51234, stderr=None, ci_low=None)
    rows = _render(offset)
    assert "100000000.4649" in rows and "1e+08" not in rows  # is, to wis's 0.0092
    assert "100000000.5123" in rows  # pdis: neither a standard error nor an interval
    # a standard error of 0 (float64 resolved no spread) and a zero-width interval
    zero = {"stderr": 0.0, "ci_low": 100000000.46487, "ci_high": 100000000.46487}
    rows = _render(_with_estimate(offset, 0, "is", value=100000000.46487, **zero))
    assert "100000000.4649 ± 0" in rows and "[100000000.4649, 100000000.4649]" in rows
    # a row where nothing has a spread: the whole part at least
    bare = {"stderr": None, "ci_low": None, "ci_high": None}
    alone = offset
    for name in result.results[1].estimates:
        alone = _with_estimate(alone, 1, name, value=2.00000000115e8, **bare)
    assert "200000000 " in _render(alone) and "2e+08" not in _render(alone)
    from ope_cli.report.table import _own_value  # the comparison table's title

    behavior = dataclasses.replace(offset, baseline="behavior", behavior_value=100000000.0328)
    assert _own_value(behavior) == ", mean return 100000000.0328"  # to wis's 0.0092
