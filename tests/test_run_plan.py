"""``ope_cli.estimation.run_plan``: option checks and the interval plan, decided before any
data is read (no JAX, no data)."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from ope_cli.api import evaluation_config
from ope_cli.config import EvaluationConfig
from ope_cli.data.sources import DeclaredBounds
from ope_cli.errors import UsageError
from ope_cli.estimation.run_plan import (
    check_config,
    check_seed_applies,
    plan_intervals,
    resolve_gamma,
)

NOTHING = DeclaredBounds()


def config(**options) -> EvaluationConfig:
    return evaluation_config("logs.parquet", **options)


def test_auto_is_normal_without_bounds_and_betting_with_them():
    assert plan_intervals(config(gamma=0.9), NOTHING).method == "normal"
    declared = DeclaredBounds(reward_range=(0.0, 1.0))
    plan = plan_intervals(config(gamma=0.9), declared)
    assert plan.method == "betting"
    assert plan.bounds_source == "declared by the data"
    assert plan.betting_range == pytest.approx((0.0, 1.0, 10.0))  # horizon 1 / (1 - gamma)


def test_betting_with_estimated_behavior_probabilities_says_what_its_guarantee_assumes():
    """It said "valid for any number of episodes" under --behavior estimate too, where the
    weights' mean is 1 only as far as the fit is right."""
    declared = DeclaredBounds(reward_range=(0.0, 1.0))
    estimated = config(gamma=0.9, behavior="estimate")
    described = plan_intervals(estimated, declared).describe(estimated)
    assert "valid for any number of episodes" in described
    assert "their guarantee assumes the true behavior probabilities" in described
    logged = config(gamma=0.9)
    assert "guarantee assumes" not in plan_intervals(logged, declared).describe(logged)


def test_betting_without_a_betting_estimator_leaves_no_empty_clause():
    """Only wdr reported under betting intervals: the method line read "discounted horizon
    20; ; standard errors"."""
    options = config(gamma=0.95, ci="betting", estimators=("wdr",), q="q.npz")
    described = plan_intervals(options, DeclaredBounds(reward_range=(0.0, 1.0))).describe(options)
    assert described.endswith("discounted horizon 20"), described


@pytest.mark.parametrize(
    ("given", "said"),
    [
        ((1.0, 2.0), "rewards in [1, 2] (--reward-range) widened to [0, 2] to hold 0,"),
        ((-3.0, -1.0), "rewards in [-3, -1] (--reward-range) widened to [-3, 0] to hold 0,"),
        ((0.0, 1.0), "rewards in [0, 1] (--reward-range),"),
    ],
)
def test_betting_says_the_reward_range_its_bets_take(given, said):
    """The bets take the range widened to hold an ended episode's reward 0; the method said
    the range as given, [1, 2], under an interval computed with [0, 2]."""
    options = config(gamma=0.9, reward_range=given)
    described = plan_intervals(options, NOTHING).describe(options)
    assert said in described, described


def test_options_come_before_what_the_data_declares():
    declared = DeclaredBounds(reward_range=(0.0, 1.0), horizon=50)
    plan = plan_intervals(config(gamma=1.0, reward_range=(2.0, 3.0), horizon=7), declared)
    # the absorbing reward 0 must lie in the range: it is widened to [0, 3]
    assert plan.betting_range == (0.0, 3.0, 7.0)
    assert (plan.bounds_source, plan.horizon_source) == ("--reward-range", "--horizon")
    discounted = plan_intervals(config(gamma=0.5, horizon=3), declared)
    assert discounted.betting_range[2] == pytest.approx(1 + 0.5 + 0.25)


@pytest.mark.parametrize("interval", ["normal", "percentile", "betting"])
def test_given_or_declared_bounds_are_checked_whatever_the_method(interval):
    """--horizon and --reward-range say they are checked against the data, as the data's
    own declarations are: with asymptotic intervals too (they were checked for betting
    only, so a 5-step episode passed --horizon 2)."""
    chunk = SimpleNamespace(
        steps=SimpleNamespace(reward=np.array([0.1, 0.9, 0.2, 0.3, 0.4, 0.5])),
        lengths=np.array([5, 1]),
    )
    declared = DeclaredBounds(reward_range=(0.0, 0.5))
    plan = plan_intervals(config(gamma=0.9, interval=interval, horizon=2), declared)
    checks = {check.reason: check for check in plan.chunk_checks(chunk)}
    assert checks["episode_too_long"].rows.tolist() == [0, 0, 1, 1, 1, 0]
    assert "horizon of 2 steps (--horizon)" in checks["episode_too_long"].message
    assert checks["reward_out_of_range"].rows.tolist() == [0, 1, 0, 0, 0, 0]
    assert "(declared by the data)" in checks["reward_out_of_range"].message
    assert list(plan_intervals(config(gamma=0.9), NOTHING).chunk_checks(chunk)) == []


def test_betting_without_bounds_names_what_is_missing():
    with pytest.raises(UsageError, match="pass --reward-range LOW HIGH, or declare"):
        plan_intervals(config(interval="betting", gamma=0.9), NOTHING)
    # at gamma 1 the range alone is refused too: the refusal names both
    with pytest.raises(UsageError, match="pass --reward-range LOW HIGH with --horizon STEPS, or"):
        plan_intervals(config(interval="betting"), NOTHING)
    with pytest.raises(UsageError, match="--horizon"):
        plan_intervals(config(gamma=1.0, reward_range=(0.0, 1.0)), NOTHING)


def test_an_explicit_method_is_kept_and_described():
    plan = plan_intervals(config(interval="percentile", bootstrap_samples=50, seed=3), NOTHING)
    assert plan.method == "percentile" and plan.betting_range is None
    text = plan.describe(config(bootstrap_samples=50, seed=3))
    assert "50 replicates, seed 3" in text and "asymptotic" in text


def test_the_asymptotic_note_names_what_gives_betting_intervals():
    """An asymptotic method's note says what would give betting intervals, for the data at
    hand: the reward range (and at gamma 1 a horizon); with the range and gamma 1, a
    horizon; with both (or gamma < 1), just asking for them."""
    bounded = DeclaredBounds(reward_range=(0.0, 1.0))
    cases = [
        (config(gamma=0.9, interval="normal"), NOTHING, "--reward-range LOW HIGH gives"),
        # gamma 1 without a horizon: the range alone is refused ("also needs --horizon")
        (config(interval="normal"), NOTHING, "--reward-range LOW HIGH with --horizon STEPS gives"),
        (config(horizon=9, interval="normal"), NOTHING, "--reward-range LOW HIGH gives"),
        (config(gamma=1.0, interval="normal"), bounded, "--horizon STEPS (or --gamma < 1) gives"),
        (config(gamma=0.9, interval="normal"), bounded, "--ci betting (or auto) gives"),
        (config(gamma=1.0, horizon=9, interval="normal"), bounded, "--ci betting (or auto) gives"),
    ]
    for options, declared, words in cases:
        plan = plan_intervals(options, declared)
        assert words in plan.describe(options), (options, declared)


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(gamma=1.5), "--gamma"),
        (dict(confidence=1.0), "--confidence"),
        (dict(estimators=("nope",)), "unknown estimator 'nope'"),
        (dict(min_bucket=0), "--min-bucket must be at least 2, got 0"),
        (dict(min_bucket=1), "--min-bucket must be at least 2, got 1"),  # as the help says
        (dict(read_rows=0), "--read-rows must be at least 1, got 0"),
        (dict(batch_steps=-1), "--batch-steps must be at least 1, got -1"),
        # allocated whatever the data: 1e8 took 6 GB for 1,804 steps; 1e8 steps of a short
        # window asked for petabytes (an internal error)
        (dict(batch_steps=10**8), "--batch-steps must be at most 4,194,304, got 100,000,000"),
        (dict(min_bucket=10**8), "--min-bucket must be at most 4,096, got 100,000,000"),
        # past 2**63 pyarrow's OverflowError was an internal error (exit 1)
        (dict(read_rows=2**70), "--read-rows must be at most 2,147,483,648, got 1,180,591"),
        (dict(interval="magic"), "--ci must be one of"),
        (dict(reward_range=(1.0, 0.0)), "--reward-range"),
        (dict(horizon=0), "--horizon"),
        (dict(interval="percentile", bootstrap_samples=5), "--bootstrap-samples"),
        # 10 replicates made a "99%" interval of their range, far narrower than 99%
        (
            dict(interval="percentile", confidence=0.99, bootstrap_samples=100),
            "--bootstrap-samples must be at least 200 for 0.99 intervals",
        ),
        (dict(interval="bootstrap-t", bootstrap_samples=39), "at least 40 for 0.95"),
        # ignored by every other method (and -3 accepted), while P(better) stayed null
        (dict(bootstrap_samples=500), "--bootstrap-samples applies to --ci percentile"),
        (dict(interval="normal", bootstrap_samples=-3), "--bootstrap-samples applies to"),
        (dict(seed=-1), "--seed"),
        (dict(on_invalid="skip"), "--on-invalid"),
        # it changed nothing without a fitted Q, where --behavior-cross-fit was refused
        (dict(cross_fit=5), "--cross-fit applies to --q fit"),
        (dict(cross_fit=5, q=("q.npz",)), "--cross-fit applies to --q fit"),
        # it changed nothing without a Q to draw V-hat's actions for
        (dict(v_samples=64), "--v-samples applies to --q only"),
        (dict(v_samples=64, q_col="q", v_col="v"), "--v-samples applies to --q only"),
        # a Q fitted or loaded for estimators that never read it (-e wis --q fit)
        (
            dict(estimators=("wis", "is"), q=("fit",)),
            r"--q is used by dm, dr and wdr only; the estimators asked for \(wis, is\) use",
        ),
        (dict(estimators=("wpdis",), q_col="q", v_col="v"), "--q-col with --v-col is used by"),
        # one of two named columns of one probability was dropped without a word
        (
            dict(behavior_prob_col="p", behavior_log_prob_col="lp"),
            "--behavior-prob-col and --behavior-log-prob-col name two columns",
        ),
        (dict(target_prob_col="p", target_log_prob_col="lp"), "--target-prob-col and --target"),
        # the named column was not read: --behavior gives the probabilities
        (
            dict(behavior="b.npz", behavior_log_prob_col="lp"),
            "--behavior-log-prob-col names a logged behavior column, but --behavior b.npz",
        ),
        (dict(behavior="pkg.mod:pi", behavior_prob_col="p"), "--behavior-prob-col names a"),
        # the named target column was checked, never read: --policy gives the probabilities
        (
            dict(policies=("pi.npz",), target_prob_col="tp"),
            "--target-prob-col names a logged target column, which serves a run without "
            "--policy, but --policy gives",
        ),
        (dict(policies=("pi.npz",), target_log_prob_col="lp"), "--target-log-prob-col names"),
    ],
)
def test_bad_option_values_are_usage_errors(options, message):
    with pytest.raises(UsageError, match=message):
        check_config(config(**options))


def test_good_options_pass():
    check_config(config(gamma=0.99, confidence=0.9, reward_range=(-1.0, 1.0), horizon=10))
    check_config(config(cross_fit=5, q=("fit:linear",)))
    check_config(config(v_samples=64, q=("q.npz",)))
    check_config(config(estimators=("wis", "dm"), q=("q.npz",)))  # one that reads Q-hat
    # an estimate is compared with the logged column (README): the column is read
    check_config(config(behavior="estimate", behavior_prob_col="mypb"))
    check_config(config(target_prob_col="tp"))  # no --policy: the column is the target


def test_auto_falls_back_to_normal_and_says_why_an_interval_is_missing():
    """Under --ci auto with betting bounds, dm gets the normal interval; without a standard
    error (one episode) its note says so, not that betting does not apply to it."""
    from ope_cli.estimation.run_plan import NO_INTERVAL, NO_VALUE, complete_intervals
    from ope_cli.estimation.stats import Estimate
    from ope_cli.results import PolicyResult

    bounded = DeclaredBounds(reward_range=(0.0, 1.0))
    options = config(gamma=0.9, q=("q.npz",))
    plan = plan_intervals(options, bounded)
    assert plan.method == "betting"
    one = Estimate(value=0.5, stderr=None, ci_low=None, ci_high=None)
    many = Estimate(value=0.5, stderr=0.1, ci_low=None, ci_high=None)
    none = Estimate(value=None, stderr=None, ci_low=None, ci_high=None)
    result = PolicyResult("pi", {"dm": one, "dr": many, "wdr": none}, None, None)
    completed = complete_intervals(result, plan, options)
    assert completed.ci_methods == {"dm": "normal", "dr": "normal", "wdr": "normal"}
    # the estimate is shown: the note blames its standard error alone
    assert completed.estimates["dm"].note == NO_INTERVAL and "standard error" in NO_INTERVAL
    assert completed.estimates["wdr"].note == NO_VALUE
    dr = completed.estimates["dr"]
    assert (dr.ci_low, dr.ci_high) == pytest.approx((0.5 - 0.196, 0.5 + 0.196), abs=1e-3)


@pytest.mark.parametrize("method", ["percentile", "bootstrap-t"])
def test_one_episode_names_its_bootstrap_method_with_the_reason_of_its_null(method):
    """One episode under --ci percentile: ci_method was null (the table's method column
    blank) where normal's named its method beside the same null interval."""
    from ope_cli.estimation.run_plan import NO_INTERVAL, complete_intervals
    from ope_cli.estimation.stats import Estimate
    from ope_cli.results import PolicyResult

    options = config(interval=method)
    plan = plan_intervals(options, NOTHING)
    one = Estimate(value=0.5, stderr=None, ci_low=None, ci_high=None)
    result = PolicyResult("pi", {"is": one, "wis": one}, None, None)
    completed = complete_intervals(result, plan, options)
    assert completed.ci_methods == {"is": method, "wis": method}
    assert {e.note for e in completed.estimates.values()} == {NO_INTERVAL}


def test_a_betting_interval_beside_no_standard_error_says_why_there_is_none():
    from ope_cli.estimation.run_plan import NO_STDERR, complete_intervals
    from ope_cli.estimation.stats import Estimate
    from ope_cli.results import PolicyResult

    options = config(gamma=0.9, reward_range=(0.0, 1.0))
    plan = plan_intervals(options, NOTHING)
    one = Estimate(value=0.5, stderr=None, ci_low=0.1, ci_high=0.9)
    completed = complete_intervals(PolicyResult("pi", {"is": one}, None, None), plan, options)
    assert completed.ci_methods == {"is": "betting"}
    assert completed.estimates["is"].note == NO_STDERR
    assert (completed.estimates["is"].ci_low, completed.estimates["is"].ci_high) == (0.1, 0.9)


def test_auto_without_an_estimator_that_bets_is_normal_and_says_what_would():
    """-e dr alone on bounded data: the run's interval said "betting" (with an empty
    clause of betting estimators) while every interval was a normal one."""
    bounded = DeclaredBounds(reward_range=(0.0, 1.0))
    options = config(gamma=0.9, estimators=("dr",), q=("q.npz",))
    plan = plan_intervals(options, bounded)
    assert plan.method == "normal"
    assert "--estimator is|wis|pdis|wpdis gives finite-sample betting" in plan.describe(options)
    assert plan_intervals(config(gamma=0.9, estimators=("dr", "is")), bounded).method == "betting"


def test_reward_range_without_discount_names_where_gamma_1_comes_from():
    """It said "--reward-range with --gamma 1" where no --gamma was given."""
    with pytest.raises(UsageError, match=r"with gamma 1 \(the default\) also needs --horizon"):
        plan_intervals(config(reward_range=(0.0, 1.0)), NOTHING)
    declared = DeclaredBounds(gamma=1.0)
    with pytest.raises(UsageError, match=r"with gamma 1 \(declared by the data\) also"):
        plan_intervals(config(reward_range=(0.0, 1.0)), declared)


@pytest.mark.parametrize("method", ["normal", "percentile", "bootstrap-t"])
def test_reward_range_without_discount_checks_the_rewards_of_other_intervals(method):
    """--ci normal --reward-range at gamma 1 was refused for want of a --horizon, which
    only betting intervals need: the range still checks every reward."""
    samples = {} if method == "normal" else {"bootstrap_samples": 200}
    options = config(reward_range=(0.0, 1.0), interval=method, **samples)
    plan = plan_intervals(options, NOTHING)
    assert plan.method == method and plan.betting_range is None
    assert plan.checked[0] == (0.0, 1.0)
    assert "--horizon STEPS" in plan.describe(options)


@pytest.mark.parametrize(  # q_models: each --q source's fitted model, None for a checkpoint
    ("options", "method", "q_models", "action_kind"),
    [
        (dict(interval="percentile"), "percentile", [], "discrete"),
        (dict(interval="bootstrap-t"), "bootstrap-t", [], "discrete"),
        (dict(q=["fit:mlp"]), "normal", ["mlp"], "discrete"),
        (dict(q=["q.npz"]), "normal", [None], "continuous"),  # V-hat's actions are drawn
    ],
)
def test_a_seed_is_taken_where_something_is_drawn(options, method, q_models, action_kind):
    check_seed_applies(config(seed=3, **options), method, q_models, action_kind)


@pytest.mark.parametrize(
    ("options", "method", "q_models", "action_kind"),
    [
        ({}, "normal", [], "discrete"),
        (dict(reward_range=(0.0, 1.0)), "betting", [], "discrete"),
        (dict(q=["fit:linear"]), "normal", ["linear"], "discrete"),  # nothing random in it
        (dict(q=["q.npz"]), "normal", [None], "discrete"),  # over discrete actions V-hat is a sum
        ({}, "normal", [], "continuous"),  # critic columns (no --q source) draw nothing
    ],
)
def test_a_seed_that_would_change_nothing_is_refused(options, method, q_models, action_kind):
    with pytest.raises(UsageError, match=f"--seed applies to .*none of them [(]{method}"):
        check_seed_applies(config(seed=3, **options), method, q_models, action_kind)
    check_seed_applies(config(**options), method, q_models, action_kind)  # the default


@pytest.mark.parametrize(
    ("option", "declared", "source"), [(-0.0, None, "option"), (None, -0.0, "data")]
)
def test_a_discount_of_minus_zero_is_zero(option, declared, source):
    """``--gamma -0`` printed "-0" in every format (and "gamma=-0" in the table)."""
    gamma, given = resolve_gamma(option, DeclaredBounds(gamma=declared))
    assert (str(gamma), given) == ("0.0", source)
