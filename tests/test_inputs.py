"""What an evaluation reads and fits first (ope_cli/estimation/inputs.py): the fits return
new inputs and leave the ones they were given as they were."""

from __future__ import annotations

import numpy as np
from datasets import random_checkpoint, random_episodes, save_checkpoint, write_step_layout

from ope_cli.config import BehaviorConfig, EvaluationConfig, QConfig
from ope_cli.estimation.inputs import fit_models, open_inputs
from ope_cli.models.qfunctions import FIT


def test_fit_models_returns_the_fitted_inputs(tmp_path):
    """--behavior estimate and --q fit: fit_models gives the estimated behavior policy and
    its source, and a fitted Q per policy; the inputs it was given keep their unfitted
    models, and with nothing to fit the same inputs come back."""
    rng = np.random.default_rng(5)
    behavior = random_checkpoint("tabular", rng)
    episodes = random_episodes(rng, 60, behavior=behavior, median_length=5, max_length=20)
    data = write_step_layout(episodes, tmp_path / "logs.parquet")
    policy = save_checkpoint(tmp_path / "policy.npz", random_checkpoint("tabular", rng))
    config = EvaluationConfig(
        data=str(data),
        policies=(str(policy),),
        gamma=0.9,
        behavior=BehaviorConfig(policy="estimate"),
        q=QConfig(sources=("fit",)),
    )
    given = open_inputs(config)
    assert given.behavior is None and given.behavior_source is None
    assert [q.kind for q in given.qs] == [FIT]

    fitted = fit_models(given)
    assert fitted is not given
    assert fitted.behavior is not None and fitted.behavior_source.source == "estimated"
    assert fitted.behavior_source.fit.logged_column == "behavior_prob"
    assert fitted.qs[0].kind != FIT and fitted.qs[0].fit is not None
    assert given.behavior is None and given.behavior_source is None
    assert [q.kind for q in given.qs] == [FIT]

    plain = open_inputs(EvaluationConfig(data=str(data), policies=(str(policy),)))
    assert fit_models(plain) is plain
