"""Several real processes on 127.0.0.1 under JAX's multi-process runtime."""

from __future__ import annotations

import copy
import json
import socket
import subprocess
import time

import numpy as np
import pytest
from conftest import (
    interruptible,
    ope_command,
    run_ope,
    subprocess_env,
    wait_until_started,
    xla_flags,
)
from datasets import (
    perturb_checkpoint,
    random_checkpoint,
    random_episodes,
    save_checkpoint,
    step_layout_table,
    write_step_layout,
    write_table,
)

pytestmark = pytest.mark.slow


def close_to(value):
    """A number to a relative 1e-9; anything else (a method's name, a note, a source) equal."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    return pytest.approx(value, rel=1e-9)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(args, process_id, num_processes, port, cwd, timeout=60, extra_env=None, signals=False):
    """A process of a cluster run (``signals``: with SIGINT at its default, to be sent one)."""
    cluster = [
        "--coordinator",
        f"127.0.0.1:{port}",
        "--num-processes",
        str(num_processes),
        "--process-id",
        str(process_id),
        "--timeout",
        str(timeout),
    ]
    # one device each, the suite's compiler settings
    env = subprocess_env({"XLA_FLAGS": xla_flags(), **(extra_env or {})})
    command = interruptible(ope_command()) if signals else ope_command()
    return subprocess.Popen(
        [*command, "evaluate", *args, *cluster],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_cluster(args, num_processes, cwd, timeout=60):
    """Runs every process to completion; returns [(returncode, stdout, stderr)] by process id."""
    port = free_port()
    processes = [start(args, i, num_processes, port, cwd, timeout) for i in range(num_processes)]
    outputs = [p.communicate(timeout=300) for p in processes]
    return [(p.returncode, *output) for p, output in zip(processes, outputs, strict=True)]


_SINGLE: dict[tuple, dict] = {}  # one-process references, shared by the tests that need one


def single(args, cwd):
    """The JSON document of a one-process ``ope evaluate ARGS`` (run once per ARGS; each
    caller gets its own copy)."""
    key = (tuple(map(str, args)), str(cwd))
    if key not in _SINGLE:
        done = run_ope(["evaluate", *args], cwd=cwd)
        assert done.returncode == 0, done
        _SINGLE[key] = json.loads(done.stdout)
    return copy.deepcopy(_SINGLE[key])


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("cluster")
    rng = np.random.default_rng(31)
    behavior = random_checkpoint("linear_softmax", rng)
    episodes = random_episodes(rng, 600, behavior=behavior, max_length=120)
    write_step_layout(episodes, tmp / "five", n_files=5)
    write_step_layout(episodes, tmp / "two", n_files=2)
    for i in range(2):
        save_checkpoint(tmp / f"p{i}.npz", perturb_checkpoint(behavior, rng, 0.4 * (i + 1)))
    return tmp, episodes


def assert_same_json(one, many):
    assert many["dataset"] | {"files": one["dataset"]["files"]} == one["dataset"]
    for a, b in zip(one["results"], many["results"], strict=True):
        assert a["policy"] == b["policy"]
        for name, estimate in a["estimates"].items():
            for field, value in estimate.items():
                assert b["estimates"][name][field] == close_to(value), (name, field)
        for field, value in a["diagnostics"].items():
            assert b["diagnostics"][field] == close_to(value), field
        assert b.get("could_be_best") == a.get("could_be_best")
        for name, comparison in a.get("comparison", {}).items():  # --baseline
            for field, value in comparison.items():
                assert b["comparison"][name][field] == close_to(value), (name, field)


@pytest.mark.parametrize("num_processes, data", [(2, "five"), (3, "five"), (3, "two")])
def test_processes_agree_with_one_process(world, num_processes, data):
    """(3, "two"): fewer files than processes, so process 2 reads nothing and is idle."""
    tmp, _ = world
    args = [
        data,
        "-p",
        "p0.npz",
        "-p",
        "p1.npz",
        "--baseline",
        "p0.npz",
        "--gamma",
        "0.95",
        "--format",
        "json",
        "--ci",
        "bootstrap-t",
        "--bootstrap-samples",
        "40",
    ]
    reference = single(args, tmp)
    outcomes = run_cluster(args, num_processes, tmp)
    for code, _, err in outcomes:
        assert code == 0, err
    assert all(out == "" for _, out, _ in outcomes[1:])  # only process 0 prints
    result = json.loads(outcomes[0][1])
    assert result["runtime"]["processes"] == num_processes
    assert "comparison" in result["results"][1]  # p1 against the baseline p0
    assert_same_json(reference, result)
    # process 0 says the warnings on stderr, as one process does (its supervisor passed on
    # only error lines), and no other process says them again
    said = [f"warning: {w['message']}" for w in result["warnings"]]
    assert said and outcomes[0][2].splitlines() == said, outcomes[0][2]
    assert all(err == "" for _, _, err in outcomes[1:])


def test_processes_with_different_device_counts_agree_with_one_process(world):
    """One process with 1 device, the other with 3 (hosts with unequal accelerators): the
    processes' exchanges gathered over every local device, which needs the same count on
    each, and ended in an internal error (a reshape of 4 devices into [2, 1])."""
    tmp, _ = world
    args = ["five", "-p", "p0.npz", "-p", "p1.npz", "--baseline", "p0.npz", "--format", "json"]
    reference = single(args, tmp)
    port = free_port()
    three = {"XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=3")}
    processes = [start(args, 0, 2, port, tmp), start(args, 1, 2, port, tmp, extra_env=three)]
    outputs = [p.communicate(timeout=300) for p in processes]
    outcomes = [(p.returncode, *out) for p, out in zip(processes, outputs, strict=True)]
    for code, _, err in outcomes:
        assert code == 0, err
    assert_same_json(reference, json.loads(outcomes[0][1]))


@pytest.mark.parametrize("cross_fit", ["1", "3"])
def test_behavior_estimated_across_processes_matches_one_process(world, cross_fit):
    """--behavior estimate: each process collects its share, the statistics are gathered,
    and every process fits what one process reading every file would."""
    tmp, _ = world
    args = ["five", "-p", "p0.npz", "--gamma", "0.95", "--format", "json"]
    args += ["--behavior", "estimate:linear_softmax", "--behavior-cross-fit", cross_fit]
    reference = single(args, tmp)
    outcomes = run_cluster(args, 2, tmp)
    for code, _, err in outcomes:
        assert code == 0, err
    result = json.loads(outcomes[0][1])
    assert result["runtime"]["processes"] == 2
    fit = result["dataset"].pop("behavior")["fit"]
    expected = reference["dataset"].pop("behavior")["fit"]  # its seconds differ
    assert_same_json(reference, result)
    for field in ("episodes", "steps", "mean_log_likelihood", "floored"):
        assert fit[field] == pytest.approx(expected[field], rel=1e-9), field
    for policy, weights in expected["mean_weight"].items():
        assert fit["mean_weight"][policy] == pytest.approx(weights, rel=1e-9), policy


def test_a_data_error_in_one_process_stops_all(world):
    tmp, episodes = world
    bad = [dict(e) for e in episodes[:40]]
    bad[-1]["reward"] = np.array(bad[-1]["reward"], dtype=float)
    bad[-1]["reward"][0] = np.nan
    (tmp / "bad").mkdir()
    write_table(step_layout_table(bad[:20]), tmp / "bad" / "a.parquet")
    write_table(step_layout_table(bad[20:]), tmp / "bad" / "b.parquet")
    outcomes = run_cluster(["bad", "-p", "p0.npz", "--format", "json"], 2, tmp)
    codes = [code for code, _, _ in outcomes]
    assert codes == [3, 3], outcomes
    assert "reward is NaN" in outcomes[1][2]
    assert outcomes[0][2].startswith("ope: ") and "process 1 failed" in outcomes[0][2]
    for _, _, err in outcomes:  # process 0 too says where to go from there
        assert "ope inspect bad" in err and "--on-invalid drop" in err, err
    for _, out, err in outcomes:
        assert out == "" and "Traceback" not in err and len(err.strip().splitlines()) == 1


def test_an_episode_id_in_two_processes_is_an_error(world):
    tmp, episodes = world
    (tmp / "dup").mkdir()
    write_table(step_layout_table(episodes[:10]), tmp / "dup" / "a.parquet")
    write_table(step_layout_table(episodes[5:15]), tmp / "dup" / "b.parquet")  # ids 5..9 twice
    outcomes = run_cluster(["dup", "-p", "p0.npz", "--format", "json"], 2, tmp)
    assert [code for code, _, _ in outcomes] == [3, 3], outcomes
    # where: both files, each process's (it said how many, not where)
    where = "the first is in dup/a.parquet (process 0) and dup/b.parquet (process 1)"
    for _, out, err in outcomes:
        assert "5 episode id(s) appear in the files of more than one process" in err
        assert where in err and out == "" and len(err.strip().splitlines()) == 1


def test_unreachable_coordinator_ends_with_a_clear_error(world):
    tmp, _ = world
    started = time.monotonic()
    lonely = start(["five", "-p", "p0.npz"], 1, 2, free_port(), tmp, timeout=5)
    out, err = lonely.communicate(timeout=120)
    assert lonely.returncode == 5, err
    assert time.monotonic() - started < 60
    assert out == "" and "Traceback" not in err
    assert err.startswith("ope: distributed run failed") and "coordinator" in err
    assert len(err.strip().splitlines()) == 1


def test_a_lonely_process_0_says_its_peers_did_not_join(world):
    """Process 0 is the coordinator: when no peer joins, it says so (it said the
    coordinator did not answer, which is itself)."""
    tmp, _ = world
    lonely = start(["five", "-p", "p0.npz"], 0, 2, free_port(), tmp, timeout=5)
    out, err = lonely.communicate(timeout=120)
    assert lonely.returncode == 5 and out == "", err
    assert "not all 2 processes joined the run in time" in err
    assert len(err.strip().splitlines()) == 1


def test_processes_given_different_options_are_refused(world):
    """Each process estimated its share with its own --gamma (or checkpoint) and process 0
    printed merged numbers of no run, exit 0: now every process refuses, naming them."""
    tmp, _ = world
    port = free_port()
    args = ["five", "-p", "p0.npz", "--format", "json", "--gamma"]
    processes = [start([*args, gamma], i, 2, port, tmp) for i, gamma in enumerate(("0.9", "0.5"))]
    outputs = [p.communicate(timeout=300) for p in processes]
    outcomes = [(p.returncode, *output) for p, output in zip(processes, outputs, strict=True)]
    for code, out, err in outcomes:
        assert code == 2 and out == "", outcomes
        assert err == (
            "ope: usage error: the processes were given different options (these settings "
            "differ: gamma): give every process the same command line but its --process-id "
            "(--read-rows, --batch-steps, --min-bucket and --devices may differ), and the "
            "same contents in the checkpoint and truth files and entry-point modules it names\n"
        )


def test_a_process_given_another_num_processes_than_the_coordinator_is_refused(world):
    """Process 1 told --num-processes 3 joined process 0's run of 2 and ran on, exit 0,
    without a word: every process now refuses, as for any option given differently."""
    tmp, _ = world
    port = free_port()
    args = ["five", "-p", "p0.npz", "--format", "json"]
    processes = [start(args, 0, 2, port, tmp), start(args, 1, 3, port, tmp)]
    outputs = [p.communicate(timeout=300) for p in processes]
    for process, (out, err) in zip(processes, outputs, strict=True):
        assert (process.returncode, out) == (2, ""), err
        assert err.startswith(
            "ope: usage error: the processes were given different options (these settings "
            "differ: num_processes): give every process the same command line but its "
            "--process-id"
        )
        assert len(err.splitlines()) == 1


SLOW_POLICY = """
import os
import time

import jax

_params = {"weight": jax.numpy.zeros((4, 4)), "bias": jax.numpy.zeros(4)}


def log_prob(observation, action):
    marker = os.environ.get("OPE_TEST_STALL")
    if marker:  # at trace time: this process has joined the run and stalls in its work
        open(marker, "w").close()
        time.sleep(120)
    return jax.nn.log_softmax(observation @ _params["weight"] + _params["bias"])[action]
"""


def test_a_process_that_dies_ends_the_others_without_a_hang(world):
    """Process 1 joins, stalls in its share and is killed; process 0, done with its own share
    and waiting for the reduction, must end with a clear error, not hang."""
    tmp, _ = world
    (tmp / "stall_policy.py").write_text(SLOW_POLICY)
    port = free_port()
    args = ["five", "-p", "stall_policy:log_prob"]
    survivor = start(args, 0, 2, port, tmp, timeout=10)
    marker = tmp / "stalled"
    marker.unlink(missing_ok=True)
    victim = start(args, 1, 2, port, tmp, timeout=10, extra_env={"OPE_TEST_STALL": str(marker)})
    waited = time.monotonic()
    while not marker.exists() and time.monotonic() - waited < 120:  # joined, now stalling
        time.sleep(0.2)
    assert marker.exists()
    assert victim.poll() is None and survivor.poll() is None  # both joined and are working
    victim.kill()  # SIGKILL to the `ope` process; its worker must not outlive it
    started = time.monotonic()
    out, err = survivor.communicate(timeout=120)
    victim.communicate(timeout=60)
    assert time.monotonic() - started < 60
    assert survivor.returncode == 5, err
    assert out == "" and "Traceback" not in err
    assert err.startswith("ope: distributed run failed") and "died or stopped answering" in err
    assert len(err.strip().splitlines()) == 1


@pytest.mark.slow
def test_on_invalid_drop_across_processes_matches_one_process(world):
    """Invalid episodes in the files of both processes: each drops its own, the counts by
    reason are summed, and the estimates equal a one-process run's."""
    tmp, episodes = world
    bad = [dict(e) for e in episodes[:60]]
    for index, reason in ((3, "reward"), (25, "reward"), (41, "behavior_prob")):
        values = np.array(bad[index][reason], dtype=float)
        values[0] = np.nan
        bad[index][reason] = values
    (tmp / "dropping").mkdir()
    write_table(step_layout_table(bad[:30]), tmp / "dropping" / "a.parquet")
    write_table(step_layout_table(bad[30:]), tmp / "dropping" / "b.parquet")
    args = ["dropping", "-p", "p0.npz", "--format", "json", "--on-invalid", "drop"]
    reference = single(args, tmp)
    assert reference["dataset"]["episodes_dropped"] == 3
    outcomes = run_cluster(args, 2, tmp)
    for code, _, err in outcomes:
        assert code == 0, err
    result = json.loads(outcomes[0][1])
    assert result["runtime"]["processes"] == 2
    assert_same_json(reference, result)


def test_fitted_q_across_processes_matches_one_process(world):
    """--q fit:linear, cross-fitted: each process collects its share of the LSTDQ sums, they
    are gathered, and dm, dr and wdr equal those of one process reading every file."""
    tmp, _ = world
    args = ["five", "-p", "p0.npz", "--gamma", "0.95", "--format", "json", "--ci", "normal"]
    args += ["--q", "fit:linear", "--cross-fit", "3"]
    reference = single(args, tmp)
    outcomes = run_cluster(args, 2, tmp)
    for code, _, err in outcomes:
        assert code == 0, err
    result = json.loads(outcomes[0][1])
    assert result["runtime"]["processes"] == 2
    fit = result["results"][0]["diagnostics"].pop("q")["fit"]
    expected = reference["results"][0]["diagnostics"].pop("q")["fit"]  # its seconds differ
    assert set(reference["results"][0]["estimates"]) >= {"dm", "dr", "wdr"}
    assert_same_json(reference, result)
    for field in ("episodes", "steps", "folds", "bellman_rmse", "dm"):
        assert fit[field] == pytest.approx(expected[field], rel=1e-9), field


def test_ctrl_c_while_joining_is_one_line_and_exit_130(world):
    """Ctrl-C on a process waiting for its peers: the supervisor printed a Python
    traceback, and waited out the child's whole join timeout."""
    import signal

    tmp, _ = world
    waiting = start(["five", "-p", "p0.npz"], 0, 2, free_port(), tmp, timeout=120, signals=True)
    wait_until_started(waiting)
    time.sleep(4)  # imported and joining
    started = time.monotonic()
    waiting.send_signal(signal.SIGINT)
    out, err = waiting.communicate(timeout=60)
    assert (waiting.returncode, out) == (130, ""), err
    assert err == "ope: interrupted\n", err
    assert time.monotonic() - started < 20  # not the join's 120 s


@pytest.mark.slow  # real processes
def test_a_hangup_or_a_killed_worker_is_said_as_such(world):
    """A worker ended by a signal its supervisor passed on (SIGHUP: it has no handler for
    it) was "stopped by the JAX runtime", exit 5; and a worker killed outright (out of
    memory, kill -9) blamed "another process"."""
    import signal

    tmp, _ = world
    for stop in ("hangup", "kill"):
        waiting = start(["five", "-p", "p0.npz"], 0, 2, free_port(), tmp, timeout=120, signals=True)
        wait_until_started(waiting)
        time.sleep(4)  # imported and joining
        if stop == "hangup":
            waiting.send_signal(signal.SIGHUP)
        else:
            subprocess.run(["pkill", "-KILL", "-P", str(waiting.pid)], check=True)
        out, err = waiting.communicate(timeout=60)
        if stop == "hangup":
            assert (waiting.returncode, out, err) == (129, "", "ope: terminated\n")
        else:
            assert (waiting.returncode, out) == (5, ""), err
            assert err.startswith("ope: distributed run failed: this process's worker was killed")


@pytest.mark.parametrize(
    ("ends", "code", "said"),
    [
        # a worker whose result was out ends with exit 0 at SIGINT (interrupts.finished),
        # its own lines passed on, not the runtime's
        ("os._exit(0)", 0, "warning: low ess\nope: x\n"),
        # one that the interrupt stopped (or a peer's: exit 5): one line, exit 130
        ("os._exit(130)", 130, "ope: x\n"),
        ("os._exit(5)", 130, "ope: x\n"),
        ("os.kill(os.getpid(), signal.SIGKILL)", 130, "ope: x\n"),
    ],
)
def test_ctrl_c_after_the_worker_wrote_its_result_keeps_the_result_s_exit_code(
    ends, code, said, capsys
):
    """Ctrl-C to the process group of process 0 once its worker had printed the whole
    result: the worker ended with the result's code, but the supervisor said "ope:
    interrupted" and exited 130."""
    import sys

    from ope_cli.cli import supervisor

    script = f"""import os, signal, sys, time
signal.signal(signal.SIGINT, lambda *_: {ends})
sys.stderr.write("warning: low ess\\nruntime noise\\nope: x\\n")
sys.stderr.flush()
print("ready", flush=True)
time.sleep(60)
"""
    child = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert child.stdout.readline() == b"ready\n"
    assert supervisor._interrupted(child) == code
    assert capsys.readouterr().err == said


def test_the_supervisor_passes_on_a_signal_that_came_before_its_child():
    """SIGTERM (SIGHUP) reaching the supervisor before its worker exists is sent to the
    worker once it runs (it escaped as a traceback); later ones go straight to it."""
    import signal

    from ope_cli.cli.supervisor import Forward

    class Child:
        def __init__(self):
            self.received = []

        def send_signal(self, number):
            self.received.append(number)

    forward, child = Forward(), Child()
    forward(signal.SIGTERM)
    assert child.received == []
    forward.started(child)
    forward(signal.SIGHUP)
    assert child.received == [signal.SIGTERM, signal.SIGHUP]
    assert forward.received == {signal.SIGTERM, signal.SIGHUP}
