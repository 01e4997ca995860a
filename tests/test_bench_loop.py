"""The per-episode Python loop baseline shipped inside the package (``ope_cli.bench.loop``):
the same IS, WIS, PDIS and WPDIS as the plain float64 reference, and its command-line example."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from datasets import (
    perturb_checkpoint,
    random_checkpoint,
    random_episodes,
    save_checkpoint,
    step_layout_table,
    to_reference_input,
    write_step_layout,
)
from reference import reference_estimates

from ope_cli.bench import loop

ESTIMATORS = ("is", "wis", "pdis", "wpdis")
EXAMPLE = Path(__file__).resolve().parent.parent / "studies" / "is_loop.py"


@pytest.mark.parametrize("kind", ["linear_softmax", "tabular"])
def test_loop_matches_reference(tmp_path, kind):
    rng = np.random.default_rng(5)
    behavior = random_checkpoint(kind, rng)
    episodes = random_episodes(rng, 40, behavior=behavior, median_length=8, max_length=40)
    target = perturb_checkpoint(behavior, rng, 0.3)
    checkpoint = save_checkpoint(tmp_path / "target.npz", target)
    table = step_layout_table(episodes, shuffle_steps_within_episode=True)
    actual = loop.loop_estimates(table, str(checkpoint), 0.9)
    expected = reference_estimates(to_reference_input(episodes, target), 0.9)
    for name in ESTIMATORS:
        assert actual[name] == pytest.approx(expected[name], rel=1e-9), name


def test_a_longer_wpdis_horizon_walks_more_steps_to_the_same_estimates(tmp_path):
    """``ope bench`` runs the loop on the first episodes with the whole data's longest
    episode as WPDIS's horizon, as the run on every episode walks it (to the first
    episodes' longest, the extrapolated loop came out 20-28% fast): the steps after the
    end add nothing to the estimates."""
    rng = np.random.default_rng(6)
    behavior = random_checkpoint("tabular", rng)
    episodes = random_episodes(rng, 30, behavior=behavior, median_length=6, max_length=20)
    checkpoint = save_checkpoint(tmp_path / "target.npz", perturb_checkpoint(behavior, rng, 0.3))
    table = step_layout_table(episodes)
    walked = loop.loop_estimates(table, str(checkpoint), 0.9, horizon=500)
    assert walked == pytest.approx(loop.loop_estimates(table, str(checkpoint), 0.9), rel=1e-12)


def test_loop_rejects_other_checkpoint_kinds(tmp_path):
    checkpoint = tmp_path / "mlp.npz"
    np.savez(checkpoint, kind=np.asarray("mlp_softmax"))
    with pytest.raises(ValueError, match="tabular and linear_softmax"):
        loop.load_policy(str(checkpoint))


@pytest.mark.slow  # a real process
def test_example_script_runs_the_packaged_loop(tmp_path):
    rng = np.random.default_rng(6)
    behavior = random_checkpoint("linear_softmax", rng)
    episodes = random_episodes(rng, 10, behavior=behavior, median_length=5, max_length=20)
    data = write_step_layout(episodes, tmp_path / "logs.parquet")
    checkpoint = save_checkpoint(tmp_path / "target.npz", perturb_checkpoint(behavior, rng, 0.2))
    shown = subprocess.run(
        [sys.executable, str(EXAMPLE), str(data), str(checkpoint), "--gamma", "0.9"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(shown.stdout) == loop.loop_estimates(str(data), str(checkpoint), 0.9)
