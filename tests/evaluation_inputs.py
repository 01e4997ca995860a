"""What ``ope evaluate`` estimates from, short of estimating, for tests whose subject is the
data (sources, conversion, object storage): two sources that give the same inputs give the same
estimates, and a bad input's DataError is the one line ``ope`` prints (exit 3)."""

from __future__ import annotations

import numpy as np
import pytest

from ope_cli.api import evaluation_config
from ope_cli.data.episode_stream import DataConfig, open_episodes
from ope_cli.data.episodes import concat_chunks
from ope_cli.data.steps import STEP_FIELDS
from ope_cli.errors import DataError
from ope_cli.estimation.inputs import open_inputs


def evaluation_inputs(source, policy, **options):
    """What ``ope evaluate SOURCE --policy POLICY [options]`` estimates from, short of
    estimating: its inputs (policies, discount, bounds) and every episode as the evaluation
    validates them, in one chunk. ``options``: evaluate's options as keywords."""
    config = evaluation_config(str(source), policies=[str(policy)], **options)
    inputs = open_inputs(config)
    return inputs, concat_chunks(list(inputs.checked_episodes()))


def assert_same_evaluation(first, second) -> None:
    """Two ``evaluation_inputs`` from which every estimate is the same: equal policy
    parameters, discount and bounds, and the same episodes in the same order, every
    per-step array equal in dtype and value."""
    (inputs, chunk), (other_inputs, other) = first, second
    for policy, other_policy in zip(inputs.policies, other_inputs.policies, strict=True):
        assert (policy.kind, policy.static) == (other_policy.kind, other_policy.static)
        assert policy.params.keys() == other_policy.params.keys()
        for key, value in policy.params.items():
            np.testing.assert_array_equal(value, other_policy.params[key], strict=True)
    for name in ("gamma", "reward_range", "horizon"):
        assert getattr(inputs.plan, name) == getattr(other_inputs.plan, name), name
    assert chunk.ids.tolist() == other.ids.tolist()
    np.testing.assert_array_equal(chunk.keys, other.keys, strict=True)
    np.testing.assert_array_equal(chunk.lengths, other.lengths, strict=True)
    assert chunk.num_steps > 0
    for name in STEP_FIELDS:
        values, others = getattr(chunk, name), getattr(other, name)
        assert (values is None) == (others is None), name
        if values is not None:
            np.testing.assert_array_equal(values, others, strict=True, err_msg=name)


def data_error(call, *args, **kwargs) -> str:
    """The message of the DataError ``call(*args, **kwargs)`` raises (``ope`` prints it as
    its one line on stderr and exits 3)."""
    with pytest.raises(DataError) as error:
        call(*args, **kwargs)
    return str(error.value)


def read_episodes(source, **config):
    """Every episode of ``source`` as ``ope evaluate --policy`` reads them
    (``DataConfig(source, **config)``)."""
    return list(open_episodes(DataConfig(str(source), **config)))
