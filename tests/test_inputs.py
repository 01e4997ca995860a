"""What an evaluation reads and fits first (ope_cli/estimation/inputs.py): the fits return
new inputs and leave the ones they were given as they were."""

from __future__ import annotations

import dataclasses

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasets import random_checkpoint, random_episodes, save_checkpoint, write_step_layout

from ope_cli.config import BatchingConfig, BehaviorConfig, EvaluationConfig, QConfig
from ope_cli.errors import DataError
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


@pytest.mark.parametrize("read_rows", [1, 2, 65536])
def test_the_first_row_sets_the_observation_size_whatever_the_batching(tmp_path, read_rows):
    """A first episode of 2-vectors among episodes of 3-vectors, for a policy of 3: the
    same refusal for any --read-rows (the first batch's most common size decided before:
    one episode dropped with the default batches, a refusal with one-row ones)."""
    rows = [(0, [0.1, 0.2]), (0, [0.3, 0.4])] + [
        (episode, [0.1 * episode, 0.2, 0.3]) for episode in range(1, 5) for _ in range(2)
    ]
    table = pa.table(
        {
            "episode_id": [episode for episode, _ in rows],
            "observation": [observation for _, observation in rows],
            "action": [1] * len(rows),
            "reward": [1.0] * len(rows),
            "behavior_prob": [0.5] * len(rows),
        }
    )
    pq.write_table(table, tmp_path / "logs.parquet")
    policy = save_checkpoint(
        tmp_path / "policy.npz",
        random_checkpoint("linear_softmax", np.random.default_rng(1), obs_dim=3, n_actions=2),
    )
    config = EvaluationConfig(
        data=str(tmp_path / "logs.parquet"), policies=(str(policy),), on_invalid="drop"
    )
    inputs = open_inputs(dataclasses.replace(config, batching=BatchingConfig(read_rows=read_rows)))
    with pytest.raises(DataError, match="observation has size 2, but policy .* expects 3"):
        list(inputs.checked_episodes())
