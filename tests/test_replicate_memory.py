"""Bootstrap replicates of per-step sums past the machine's memory: refused with one line
(ope_cli/estimation/replicate_memory.py)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from conftest import run_ope_in_process
from datasets import (
    perturb_checkpoint,
    random_checkpoint,
    random_episodes,
    save_checkpoint,
    write_step_layout,
)

from ope_cli.errors import UsageError
from ope_cli.estimation import replicate_memory
from ope_cli.estimation.replicate_memory import (
    REPLICATE_STEP_BYTES,
    check_replicate_memory,
    machine_memory,
    replicate_bytes,
)


def test_the_bytes_grow_with_replicates_sums_policies_and_steps():
    assert replicate_bytes(1_000_000, 200, 2, 1) == REPLICATE_STEP_BYTES * 400_000_000
    assert replicate_bytes(10, 200, 4, 3) == 12 * replicate_bytes(10, 200, 1, 1)
    assert replicate_bytes(10, 0, 4, 3) == 0


@pytest.mark.skipif(not hasattr(os, "sysconf"), reason="no sysconf: the size is unknown")
def test_this_machine_has_a_memory_size(monkeypatch):
    size = machine_memory()
    assert size is not None and size > 2**20
    monkeypatch.setattr(replicate_memory, "_CGROUP_LIMITS", (Path("/nonexistent/memory.max"),))
    assert machine_memory() >= size  # a container's limit only ever lowers it


@pytest.mark.skipif(not hasattr(os, "sysconf"), reason="no sysconf: the size is unknown")
def test_a_containers_limit_is_read_from_cgroup_v2_or_v1(monkeypatch, tmp_path):
    v2, v1 = tmp_path / "memory.max", tmp_path / "memory.limit_in_bytes"
    monkeypatch.setattr(replicate_memory, "_CGROUP_LIMITS", (v2, v1))
    physical = machine_memory()  # neither file: the physical memory
    v1.write_text(f"{2**30}\n")
    assert machine_memory() == min(physical, 2**30)  # cgroup v1 only
    v2.write_text("max\n")  # v2 without a limit: v1's
    assert machine_memory() == min(physical, 2**30)
    v2.write_text(f"{2**31}\n")  # v2's own limit first, even above v1's
    assert machine_memory() == min(physical, 2**31)
    v2.unlink()
    v1.write_text("9223372036854771712\n")  # cgroup v1's "no limit"
    assert machine_memory() == physical


def test_a_check_refuses_only_past_the_machines_memory(monkeypatch):
    needed = replicate_bytes(1_800_000, 200, 4, 1)
    monkeypatch.setattr(replicate_memory, "machine_memory", lambda: needed)
    check_replicate_memory("percentile", 1_800_000, 200, 4, 1)  # fits, just
    with pytest.raises(UsageError) as refused:
        check_replicate_memory("percentile", 1_800_001, 200, 4, 1)
    message = str(refused.value)
    assert "200 bootstrap replicates of 4 per-step sums" in message
    assert "1,800,001 steps" in message and "--ci normal" in message
    assert "\n" not in message
    monkeypatch.setattr(replicate_memory, "machine_memory", lambda: None)  # unknown: go on
    check_replicate_memory("percentile", 10**12, 200, 4, 1)


@pytest.fixture(scope="module")
def case(tmp_path_factory):
    root = tmp_path_factory.mktemp("replicates")
    rng = np.random.default_rng(3)
    behavior = random_checkpoint("tabular", rng)
    episodes = random_episodes(
        rng, 40, behavior=behavior, length_dist="fixed", median_length=50, max_length=50
    )
    data = write_step_layout(episodes, root / "logs.parquet")
    policy = save_checkpoint(root / "p.npz", perturb_checkpoint(behavior, rng, 0.2))
    return data, policy


@pytest.mark.parametrize("ci", ["percentile", "bootstrap-t"])
def test_evaluate_refuses_what_the_replicates_would_not_fit_in(case, monkeypatch, ci):
    """WPDIS's two per-step sums, 200 replicates, one policy, 50 steps: one byte less
    memory than they need is one line on stderr, exit 2, nothing on stdout; --ci normal
    keeps no replicates and runs."""
    data, policy = case
    monkeypatch.setattr(
        replicate_memory, "machine_memory", lambda: replicate_bytes(50, 200, 2, 1) - 1
    )
    refused = run_ope_in_process(["evaluate", data, "-p", policy, "--ci", ci, "-f", "json"])
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.count("\n") == 1 and "50 steps need about" in refused.stderr
    normal = run_ope_in_process(["evaluate", data, "-p", policy, "--ci", "normal", "-f", "json"])
    assert normal.returncode == 0, normal.stderr
