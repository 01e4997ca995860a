"""Typed checks, the registry of reasons and the on-invalid policy (ope_cli/data/validate.py)."""

from __future__ import annotations

import numpy as np
import pytest

from ope_cli.data.columns import DataSchema
from ope_cli.data.steps import Steps
from ope_cli.data.validate import (
    FATAL_REASONS,
    ON_INVALID,
    READ_FLAGS,
    REASONS,
    REGISTRY,
    Check,
    Validation,
    bounds_checks,
    dropped_by_reason,
    on_invalid_policy,
    value_checks,
)
from ope_cli.errors import DataError, PolicyError


def test_the_registry_is_the_one_source_of_reasons():
    assert len(set(REASONS)) == len(REASONS) == len(REGISTRY)
    assert READ_FLAGS == REASONS[: len(READ_FLAGS)]  # read flags are judged first
    assert FATAL_REASONS == {
        "observation_size",
        "action_size",
        "episode_reappears",
        "file_error",
        "reward_out_of_range",
        "episode_too_long",
    }
    assert len(READ_FLAGS) <= 16  # they are bits of a uint16


@pytest.mark.parametrize(
    "name, plain, fatal", [("error", True, True), ("drop", False, True), ("collect", False, False)]
)
def test_on_invalid_policies(name, plain, fatal):
    policy = on_invalid_policy(name)
    assert policy is ON_INVALID[name] and on_invalid_policy(policy) is policy
    assert policy.raises("reward_not_finite") is plain
    assert policy.raises("episode_reappears") is fatal
    with pytest.raises(ValueError, match="on_invalid must be"):
        on_invalid_policy("ignore")


def lengths_and_checks():
    lengths = np.array([2, 3, 1])  # rows 0-1, 2-4, 5
    rows = lambda *r: np.isin(np.arange(6), r)  # noqa: E731
    checks = [
        Check("reward_not_finite", "reward is NaN", rows(3)),
        Check("behavior_prob_nan", "behavior is NaN", rows(2, 5)),
    ]
    return lengths, checks


def test_judge_raises_at_the_first_problem_under_error():
    """The earliest row with a problem, whichever check finds it (it named the first
    check's: a null reward at episode 20 where episode 14's NaN came first); on one row,
    the first check's."""
    lengths, checks = lengths_and_checks()
    episode_of_row = np.repeat(np.arange(3), lengths)
    starts = np.r_[0, np.cumsum(lengths)]

    def locate(row: int) -> tuple[int, int]:
        return int(episode_of_row[row]), int(row - starts[episode_of_row[row]])

    with pytest.raises(DataError, match=r"f.parquet: episode 1, step 0: behavior is NaN \(2 row"):
        Validation("error").judge("f.parquet", checks, lengths, episode_of_row, locate)
    checks.insert(1, Check("observation_not_finite", "observation is NaN", np.isin(range(6), [2])))
    with pytest.raises(DataError, match=r"episode 1, step 0: observation is NaN \(1 row"):
        Validation("error").judge("f.parquet", checks, lengths, episode_of_row, locate)


def test_a_policy_check_that_fails_after_a_data_problem_leaves_the_data_problem_first():
    """A policy's checks raise their PolicyError as they are made: once a data problem is
    found, that ends the checks and the data problem is reported (exit 3, as before the
    earliest row was sought), not the policy's (exit 4)."""
    lengths, checks = lengths_and_checks()

    def then_the_policy():
        yield from checks
        raise PolicyError("policy p's probabilities sum to 0.6")

    with pytest.raises(DataError, match="behavior is NaN"):
        Validation("error").judge(
            "f", then_the_policy(), lengths, np.repeat(range(3), lengths), lambda r: (r, 0)
        )
    with pytest.raises(PolicyError, match="sum to 0.6"):  # with no data problem before it
        Validation("error").judge("f", then_the_policy_alone(), lengths, None, lambda r: (r, 0))


def then_the_policy_alone():
    raise PolicyError("policy p's probabilities sum to 0.6")
    yield


def test_judge_gives_each_episode_its_first_reason_and_keep_counts_drops():
    lengths, checks = lengths_and_checks()
    validation = Validation("drop")
    episode_of_row = np.repeat(np.arange(3), lengths)
    first = validation.judge("f", checks, lengths, episode_of_row, lambda r: (r, 0))
    assert [REASONS[i] if i >= 0 else None for i in first] == [
        None,
        "reward_not_finite",
        "behavior_prob_nan",
    ]
    keep = validation.keep(first, lengths)
    np.testing.assert_array_equal(keep, [True, False, False])
    assert validation.episodes_dropped == 2 and validation.steps_dropped == 4
    assert dropped_by_reason(validation.dropped_counts()) == {
        "reward_not_finite": {"episodes": 1, "steps": 3},
        "behavior_prob_nan": {"episodes": 1, "steps": 1},
    }
    problem = validation.problems[("behavior_prob_nan", "behavior is NaN")]
    assert (problem.episodes, problem.steps, problem.episode) == (2, 2, 2)


def test_bounds_checks_flag_rewards_and_steps_beyond_the_horizon():
    """An infinite reward is not also out of range: it is reward_not_finite's, which
    --on-invalid drop may drop, where an out-of-range reward stops the run."""
    reward = np.array([0.0, 2.0, 0.5, np.inf, -np.inf, np.nan, 0.5])
    steps = Steps(None, np.zeros(7, np.int64), reward, np.zeros(7), None)
    checks = list(bounds_checks(steps, np.array([2, 5]), (0.0, 1.0), 2, ("--reward-range", "x")))
    assert [c.reason for c in checks] == ["reward_out_of_range", "episode_too_long"]
    np.testing.assert_array_equal(checks[0].rows, [False, True, False, False, False, False, False])
    np.testing.assert_array_equal(checks[1].rows, [False, False, False, False, True, True, True])
    assert "--reward-range" in checks[0].message


def test_a_negative_state_index_says_how_to_give_features():
    """An integer observation is a state index (SPEC 2); a negative one is invalid, and the
    message says how to give integer features instead."""
    schema = DataSchema("step", {}, "index", None, "discrete", False, False, "prob")
    steps = Steps(np.array([0, -2, 1]), np.zeros(3, np.int64), np.zeros(3), np.zeros(3), None)
    (check,) = [c for c in value_checks(steps, schema) if c.reason == "state_negative"]
    np.testing.assert_array_equal(check.rows, [False, True, False])
    assert "store features as floats" in check.message


def test_a_logged_target_log_probability_above_zero_is_invalid_data():
    """A discrete action's logged target log-probability above 0 (probability > 1): a
    droppable data problem, as the behavior column's is (inspect said valid, and evaluate
    blamed a 'policy' for it); -inf (probability 0) is a probability."""
    schema = DataSchema("step", {}, "index", None, "discrete", False, False, "log_prob")
    log_target = np.array([0.0, 0.01, -np.inf, -1.0])
    steps = Steps(
        np.zeros(4, np.int64), np.zeros(4, np.int64), np.zeros(4), np.zeros(4), log_target
    )
    (check,) = [c for c in value_checks(steps, schema) if c.reason == "target_prob_above_one"]
    np.testing.assert_array_equal(check.rows, [False, True, False, False])
    assert "target_prob_above_one" not in FATAL_REASONS


@pytest.mark.parametrize("log", [False, True])
def test_an_infinite_probability_is_one_problem(log):
    """+inf was counted as both infinite and above 1, -inf as both infinite and negative:
    inspect's counts by reason then added up to more problems than the data had. Each
    value of the behavior column, then of the target column, has one reason at most."""
    values = np.array([np.inf, 0.5, -0.5] if log else [np.inf, -np.inf, 2.0, -0.5, 0.5])
    n, zeros = values.size, np.zeros(values.size)
    behavior = DataSchema("step", {}, "index", None, "discrete", False, log, "prob")
    target = DataSchema("step", {}, "index", None, "discrete", False, False, "prob")
    if log:
        target = DataSchema("step", {}, "index", None, "discrete", False, False, "log_prob")
    integers = np.zeros(n, np.int64)
    for steps, schema in (
        (Steps(integers, integers, zeros, values, None), behavior),
        (Steps(integers, integers, zeros, None, values), target),
    ):
        reasons = np.sum([c.rows for c in value_checks(steps, schema)], axis=0)
        assert reasons.tolist() == [1] * (n - 1) + [0]  # the last value alone is valid
