"""The per-step fields and map_arrays (ope_cli/data/steps.py)."""

from __future__ import annotations

import numpy as np

from ope_cli.data.buckets import PaddedBatch
from ope_cli.data.steps import STEP_FIELDS, Steps, map_arrays


def test_map_arrays_maps_nested_records_and_keeps_none():
    steps = Steps(None, np.arange(3), np.ones(3), np.zeros(3), None)
    doubled = map_arrays(lambda a: a * 2, steps)
    assert isinstance(doubled, Steps) and doubled.observation is None and doubled.log_target is None
    np.testing.assert_array_equal(doubled.action, [0, 2, 4])
    joined = map_arrays(lambda a, b: np.concatenate([a, b]), steps, steps)
    assert joined.reward.shape == (6,)


def test_padded_batch_is_a_pytree_and_reads_step_fields_by_name():
    import jax

    steps = Steps(None, np.zeros((2, 4), np.int64), np.ones((2, 4)), np.zeros((2, 4)), None)
    batch = PaddedBatch(
        steps,
        np.ones((2, 4), bool),
        np.ones(2, bool),
        np.zeros(2, np.int32),
        np.zeros(2, np.uint32),
        np.zeros(2, np.uint32),
    )
    assert batch.shape == (2, 4) and batch.reward is batch.steps.reward
    assert len(jax.tree.leaves(batch)) == 3 + 5  # absent fields are empty subtrees
    rows = map_arrays(lambda a: a[:1], batch)
    assert isinstance(rows, PaddedBatch) and rows.shape == (1, 4)
    assert set(STEP_FIELDS) == set(Steps._fields)
