"""The plain NumPy script ``ope bench --script`` times ``ope evaluate`` against: its four
estimates against the float64 reference, called directly and run as the file it is."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
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
from reference import reference_estimates

from ope_cli.bench import numpy_script

ESTIMATORS = ("is", "wis", "pdis", "wpdis")


@pytest.fixture(scope="module")
def logged(tmp_path_factory):
    """(data path, checkpoint path, episodes, target checkpoint): long-tailed episodes of
    one to a few hundred steps, so WPDIS's normalisers hold many ended episodes."""
    rng = np.random.default_rng(11)
    behavior = random_checkpoint("linear_softmax", rng, obs_dim=5)
    episodes = random_episodes(rng, 120, behavior=behavior, obs_dim=5, max_length=300)
    target = perturb_checkpoint(behavior, rng, 0.4)
    directory = tmp_path_factory.mktemp("script")
    data = write_step_layout(episodes, directory / "logs.parquet", row_group_size=500)
    return data, save_checkpoint(directory / "target.npz", target), episodes, target


@pytest.mark.parametrize("gamma", [1.0, 0.97])
def test_script_estimates_match_the_reference(logged, gamma):
    data, _, episodes, target = logged
    table = pq.read_table(data, columns=numpy_script.COLUMNS)
    assert table["observation"].num_chunks > 1  # row groups: chunked columns are joined
    actual = numpy_script.estimates(table, target["weight"], target["bias"], gamma)
    expected = reference_estimates(to_reference_input(episodes, target), gamma)
    assert set(actual) == set(ESTIMATORS)
    for name in ESTIMATORS:
        assert actual[name] == pytest.approx(expected[name], rel=1e-10), name


@pytest.mark.slow  # a real process
def test_script_runs_as_a_file_and_prints_its_estimates(logged):
    data, checkpoint, episodes, target = logged
    done = subprocess.run(
        [sys.executable, numpy_script.__file__, str(data), str(checkpoint), "0.97"],
        capture_output=True,
        text=True,
        check=True,
    )
    printed = json.loads(done.stdout)
    expected = reference_estimates(to_reference_input(episodes, target), 0.97)
    for name in ESTIMATORS:
        assert printed[name] == pytest.approx(expected[name], rel=1e-10), name
    assert "ope_cli" not in done.stderr
