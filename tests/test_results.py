"""The result records' own text and numbers (``ope_cli.results``): where a Q-hat comes
from, the name shown for a policy, and the run's speed."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from ope_cli.results import EvaluationResult, PolicyResult, QSource


@pytest.mark.parametrize(
    ("source", "said"),
    [
        (QSource("checkpoint", "q/eval_0.npz", "tabular_q"), "Q-hat from q/eval_0.npz (tabular_q)"),
        (
            QSource("columns", "'q_hat', 'v_hat'"),
            "Q-hat and V-hat from the columns 'q_hat', 'v_hat'",
        ),
        (
            QSource("fit", "fit", "linear", {"folds": 1}),
            "Q-hat fitted in this run (fitted Q evaluation, linear, in-sample)",
        ),
        (
            QSource("fit", "fit:mlp", "mlp", {"folds": 3}),
            "Q-hat fitted in this run (fitted Q evaluation, mlp, cross-fitted over 3 folds)",
        ),
    ],
)
def test_a_q_source_says_where_q_hat_comes_from(source, said):
    assert source.describe() == said


def test_a_policy_is_shown_by_its_label_else_as_given():
    fields = {"estimates": {}, "diagnostics": None, "profile": None}
    assert PolicyResult("runs/a/ckpt.npz", label="a/ckpt.npz", **fields).shown == "a/ckpt.npz"
    assert PolicyResult("runs/a/ckpt.npz", **fields).shown == "runs/a/ckpt.npz"


def test_steps_per_second_is_zero_when_no_time_was_measured():
    def speed(steps: int, seconds: float) -> float:
        run = SimpleNamespace(
            dataset=SimpleNamespace(steps=steps), runtime=SimpleNamespace(seconds=seconds)
        )
        return EvaluationResult.steps_per_second.fget(run)

    assert speed(1_000, 0.5) == 2_000.0
    assert speed(1_000, 0.0) == 0.0
