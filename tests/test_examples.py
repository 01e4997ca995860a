"""The interop examples in examples/ run as documented and give the numbers they promise.

- from_transitions.py: a Gymnasium-style transition list and a dict of NumPy arrays
  become the same step-layout Parquet file, which ``ope`` evaluates;
- jax_policy.py: a plain-JAX MLP used as ``--policy examples.jax_policy:log_prob`` gives
  exactly the estimates of the same network as an ``mlp_softmax`` checkpoint;
- pick_best.sh: evaluates a directory of checkpoints in one pass and picks the best one
  from the JSON, with jq (skipped where jq is missing) and with Python's json module;
- choose_a_policy.py: the same choice from Python with the public API only, against the
  truth that ``ope_cli.generate`` wrote.

The scripts run as documented, in subprocesses; the files of the Python examples are
evaluated with the Python API ``ope_cli.evaluate``, the ``ope`` commands of pick_best.sh
run as the real entry point.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
from conftest import ope_command, subprocess_env

import ope_cli
from ope_cli.envs.generate import generate

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
DATA = EXAMPLES / "data" / "logs.parquet"
ESTIMATE_FIELDS = ("value", "stderr", "ci_low", "ci_high")


def _python(args, cwd=ROOT, env=None, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=subprocess_env(env),
    )


def _assert_same_estimates(a: dict, b: dict, rel: float) -> None:
    for name, estimate in a["estimates"].items():
        for field in ESTIMATE_FIELDS:
            expected = b["estimates"][name][field]
            assert estimate[field] == pytest.approx(expected, rel=rel, abs=1e-12), (name, field)


def test_episode_ids_and_steps_from_done_flags():
    sys.path.insert(0, str(ROOT))
    try:
        from examples.from_transitions import episode_ids_and_steps
    finally:
        sys.path.remove(str(ROOT))
    done = np.array([False, False, True, True, False, True, False])  # last episode unfinished
    episode_id, step = episode_ids_and_steps(done)
    assert episode_id.tolist() == [0, 0, 0, 1, 2, 2, 3]
    assert step.tolist() == [0, 1, 2, 0, 0, 1, 0]


@pytest.mark.slow  # a real process
def test_from_transitions_writes_files_ope_evaluates(tmp_path):
    made = _python([EXAMPLES / "from_transitions.py", tmp_path])
    assert made.returncode == 0, made.stderr
    transitions, arrays = tmp_path / "transitions.parquet", tmp_path / "arrays.parquet"
    table = pq.read_table(transitions)
    assert table.equals(pq.read_table(arrays))
    assert table.column_names == [
        "episode_id",
        "step",
        "observation",
        "action",
        "reward",
        "behavior_prob",
    ]
    episode_id = table.column("episode_id").to_numpy()
    step = table.column("step").to_numpy()
    starts = np.flatnonzero(np.diff(episode_id, prepend=-1))
    assert (step[starts] == 0).all() and (np.diff(episode_id) >= 0).all()

    checkpoint = EXAMPLES / "policies" / "ckpt.npz"
    docs = [ope_cli.evaluate(path, policies=checkpoint).to_dict() for path in (transitions, arrays)]
    assert docs[0]["dataset"]["episodes"] == len(starts)
    assert docs[0]["dataset"]["steps"] == table.num_rows
    _assert_same_estimates(docs[0]["results"][0], docs[1]["results"][0], rel=1e-12)


@pytest.mark.slow  # the example runs as a real process, as a user runs it
def test_jax_policy_entry_point_equals_the_mlp_checkpoint(tmp_path, monkeypatch):
    checkpoint = tmp_path / "mlp.npz"
    made = _python([EXAMPLES / "jax_policy.py", checkpoint])
    assert made.returncode == 0, made.stderr
    monkeypatch.chdir(ROOT)  # the entry point imports from the working directory
    monkeypatch.syspath_prepend(str(ROOT))  # (restored after the test)
    doc = ope_cli.evaluate(
        DATA.relative_to(ROOT), policies=["examples.jax_policy:log_prob", checkpoint]
    ).to_dict()
    entry, saved = doc["results"]
    assert entry["policy"] == "examples.jax_policy:log_prob"
    # it declares its actions, as the README asks of a complete entry point
    assert "actions_unchecked" not in [w["code"] for w in doc["warnings"]]
    assert all(entry["estimates"][e]["value"] is not None for e in entry["estimates"])
    _assert_same_estimates(entry, saved, rel=1e-9)


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """``ope generate bandit``'s files: logs, three evaluation checkpoints and their true
    values."""
    out = tmp_path_factory.mktemp("pick") / "bandit"
    generate("bandit", out, episodes=3000)
    truth = json.loads((out / "truth.json").read_text())
    return out, truth


# the script's real ope processes (three of them, through jq or python): slow tests
@pytest.mark.slow
@pytest.mark.parametrize("tool", ["jq", "python"])
def test_pick_best_picks_the_truly_best_checkpoint(checkpoints, tool):
    if tool == "jq" and shutil.which("jq") is None:
        pytest.skip("jq is not installed")
    out, truth = checkpoints
    env = subprocess_env(
        {
            "OPE": " ".join(ope_command()),
            "PYTHON": sys.executable,
            "USE_JQ": "1" if tool == "jq" else "0",
        }
    )
    script = [str(EXAMPLES / "pick_best.sh"), str(out / "logs.parquet"), str(out / "policies")]
    # an estimator named as ope accepts it, in capitals (the script looked up "WIS" in the JSON)
    script.append("WIS" if tool == "python" else "wis")
    run = subprocess.run(["bash", *script], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 0, run.stderr
    best = max(truth["policies"], key=lambda p: p["value"])["policy"]
    assert Path(run.stdout.strip()) == out / best, (run.stdout, run.stderr)
    ranked = [line for line in run.stderr.splitlines() if line.endswith(".npz")]
    assert len(ranked) == len(truth["policies"]), run.stderr
    assert ranked[0].endswith(best)


def test_pick_best_without_checkpoints_is_a_usage_error(tmp_path):
    run = subprocess.run(
        ["bash", str(EXAMPLES / "pick_best.sh"), str(DATA), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2
    assert "no .npz checkpoints" in run.stderr


def test_choose_a_policy_ranks_candidates_with_the_public_api(tmp_path, capsys):
    """The notebook example: five chain candidates ranked by WPDIS, each paired with the
    behavior policy; the printed table follows the JSON document and the truth."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "choose_a_policy", EXAMPLES / "choose_a_policy.py"
    )
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    document, values = example.choose(tmp_path, episodes=400)
    results = document["results"]
    assert [r["rank"] for r in results] == [1, 2, 3, 4, 5]
    wpdis = [r["estimates"]["wpdis"]["value"] for r in results]
    assert wpdis == sorted(wpdis, reverse=True)
    truth = json.loads((tmp_path / "truth.json").read_text())
    assert values == {Path(p["policy"]).name: p["value"] for p in truth["policies"]}
    assert document["baseline"] == "behavior"
    for r in results:
        assert set(r["comparison"]) == set(r["estimates"])
        assert isinstance(r["could_be_best"]["wpdis"], bool)
    assert results[-1]["could_be_best"]["wpdis"] is False  # eval_4, far below the best
    assert document["selection"]["wpdis"]["regret@1"] >= 0
    saved, sys.argv = sys.argv, [str(EXAMPLES / "choose_a_policy.py"), str(tmp_path / "again")]
    try:
        example.main()  # as typed: its own data, 2,000 episodes
    finally:
        sys.argv = saved
    header, *rows, regret = capsys.readouterr().out.splitlines()
    assert header.split()[:3] == ["rank", "policy", "wpdis"] and regret.startswith("picking")
    assert [row.split()[0] for row in rows] == ["1", "2", "3", "4", "5"]
    assert sorted(row.split()[1] for row in rows) == [f"eval_{k}.npz" for k in range(5)]
