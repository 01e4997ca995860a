"""Ctrl-C handling of the ``ope`` process (ope_cli/interrupts.py): where raising
KeyboardInterrupt is unsafe, and the timer that ends a process whose interrupt was lost."""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import time

import pytest
from conftest import interruptible

from ope_cli import interrupts


def test_a_plain_frame_is_safe_to_raise_in():
    assert not interrupts.unsafe_to_raise(sys._getframe())
    assert not interrupts.unsafe_to_raise(None)


def test_an_import_or_a_gc_callback_is_unsafe(tmp_path, monkeypatch):
    """Raised in a garbage-collector callback, KeyboardInterrupt was printed and ignored
    (JAX registers one: the command ran on); raised into an import (jaxlib's), it crashed
    the process."""
    seen = []

    def callback(phase, info):
        seen.append(interrupts.unsafe_to_raise(sys._getframe()))

    gc.callbacks.append(callback)
    try:
        gc.collect()
    finally:
        gc.callbacks.remove(callback)
    assert seen and all(seen)
    (tmp_path / "ope_test_probe_import.py").write_text(
        "import sys\nfrom ope_cli import interrupts\n"
        "UNSAFE = interrupts.unsafe_to_raise(sys._getframe())\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    import ope_test_probe_import

    assert ope_test_probe_import.UNSAFE


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [*interruptible([sys.executable]), "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
    )


def _interrupted_once(handling: str, after: str) -> subprocess.CompletedProcess:
    """A process with the handler installed, interrupted once while it sleeps: ``handling``
    runs in its ``except KeyboardInterrupt`` block, ``after`` past it."""
    prelude = (
        "import os, signal, time\n"
        "from ope_cli import interrupts\n"
        "interrupts.install()\n"
        "try:\n"
        "    os.kill(os.getpid(), signal.SIGINT)\n"
        "    time.sleep(5)\n"
        "except KeyboardInterrupt:\n"
    )
    return _run(prelude + f"    {handling}\n{after}\n")


@pytest.mark.slow  # real processes
def test_an_interrupt_lost_on_the_way_ends_the_process_after_the_grace():
    """An interrupt that something swallows (as Python does in a garbage-collector
    callback) still ends the process: one line, exit 130, GRACE_SECONDS later."""
    started = time.monotonic()
    done = _interrupted_once("pass  # lost, as in a callback", "time.sleep(60)")
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "ope: interrupted\n")
    assert time.monotonic() - started < 30


@pytest.mark.slow  # real processes
def test_an_interrupt_reported_in_time_disarms_the_timer_and_an_ignored_one_stays_ignored():
    """Once the command line reports the interrupt, the timer does not end the process
    (the supervisor keeps its own time for its workers); a process started with SIGINT
    ignored (a background job) keeps ignoring it, as Python does."""
    after = 'time.sleep(interrupts.GRACE_SECONDS + 1)\nprint("still here")'
    done = _interrupted_once("interrupts.handled()", after)
    assert (done.returncode, done.stdout, done.stderr) == (0, "still here\n", "")
    done = _run(
        """
        import os, signal, time
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        from ope_cli import interrupts
        interrupts.install()
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.5)
        print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)
        """
    )
    assert (done.returncode, done.stdout) == (0, "True\n")


@pytest.mark.slow  # real processes
def test_a_second_interrupt_ends_the_process_at_once():
    """A second Ctrl-C during the first one's cleanup was raised again and ended the
    process with a traceback; it ends it at once, with the one line."""
    again = "os.kill(os.getpid(), signal.SIGINT); time.sleep(5)  # pressed again"
    done = _interrupted_once(again, 'print("not reached")')
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "ope: interrupted\n")


@pytest.mark.slow  # real processes
def test_signals_after_the_result_are_ignored_and_sigterm_before_is_one_line():
    """Once the result is written (``finished``), SIGINT and SIGTERM are ignored: one in
    the teardown killed the process after a complete document (Python puts its own
    handler back before tearing down), and a shell saw 130. Where the teardown may wait (a
    cluster worker's), either ends the process at once with the result's code. Before
    that, SIGTERM is raised as Ctrl-C is, and says so with exit code 143."""
    for number in ("SIGINT", "SIGTERM"):
        for waits, expected in (
            (False, (0, "the result, then done", "")),
            (True, (3, "the result", "")),
        ):
            done = _run(
                f"""
                import atexit, os, signal, time
                from ope_cli import interrupts
                interrupts.install()
                print("the result", end="")
                interrupts.finished({0 if not waits else 3}, teardown_waits={waits})
                def teardown():  # signalled in the interpreter's teardown
                    os.kill(os.getpid(), signal.{number})
                    time.sleep(0.5)
                    print(", then done", end="")
                atexit.register(teardown)
                """
            )
            assert (done.returncode, done.stdout, done.stderr) == expected, (number, waits)
    done = _run(
        """
        import os, signal, sys, time
        from ope_cli import interrupts
        interrupts.install()
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        except KeyboardInterrupt:
            interrupts.handled()
            print(interrupts.message(), interrupts.exit_code())
        """
    )
    assert (done.returncode, done.stdout) == (0, "ope: terminated 143\n")


@pytest.mark.slow  # a real process
def test_a_held_step_finishes_before_the_interrupt():
    """``held``: a Ctrl-C during a step that must not stop half done (generate replacing an
    earlier run's files) is raised once the step is over, also with other threads running
    (as JAX's are: a signal mask held the calling thread only, another took the signal)."""
    done = _run(
        """
        import os, signal, threading, time
        from ope_cli import interrupts
        interrupts.install()
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
        seen = []
        try:
            with interrupts.held():
                os.kill(os.getpid(), signal.SIGINT)
                time.sleep(0.2)
                seen.append("done")
            time.sleep(5)
        except KeyboardInterrupt:
            interrupts.handled()
            print(seen)
        """
    )
    assert (done.returncode, done.stdout) == (0, "['done']\n")


def test_a_weak_reference_callback_is_unsafe():
    """Raised in a weak reference's callback (a WeakKeyDictionary's entry going, a
    finalizer), KeyboardInterrupt was printed and ignored: the command ran on and exited 0."""
    import weakref

    class Owner:
        pass

    seen = []
    owner = Owner()
    weakref.finalize(owner, lambda: seen.append(interrupts.unsafe_to_raise(sys._getframe())))
    del owner
    gc.collect()
    assert seen == [True]


def test_the_weak_references_own_calls_are_safe():
    """JAX's tracing calls WeakKeyDictionary.setdefault and finalize.__init__: a Ctrl-C
    there ended the process at once, leaving generate's staging folder behind."""
    import weakref

    class Key:
        def __hash__(self):
            seen.append(interrupts.unsafe_to_raise(sys._getframe()))
            return 1

    seen = []
    table = weakref.WeakKeyDictionary()
    key = Key()
    table.setdefault(key, 1)
    table.get(key)
    assert seen and not any(seen)


def test_an_interrupt_lost_in_a_callback_leaves_no_result(tmp_path, monkeypatch, ope_in_process):
    """One that no frame showed (raised and ignored in a callback, ``interrupts.lost``):
    no command writes its result or its files, and each exits 130 with the one line."""
    data = tmp_path / "g"
    assert ope_in_process(["generate", "bandit", str(data), "--episodes", "20"]).returncode == 0
    logs, policy = str(data / "logs.parquet"), str(data / "policies/eval_0.npz")
    commands = {
        "evaluate": (["evaluate", logs, "-p", policy, "-f", "json"], None),
        "generate": (["generate", "bandit", str(tmp_path / "g2")], tmp_path / "g2"),
        "convert": (["convert", logs, str(tmp_path / "c.parquet")], tmp_path / "c.parquet"),
        "fit-q": (["fit-q", logs, "-p", policy, "-o", str(tmp_path / "q.npz")], tmp_path / "q.npz"),
        "fit-behavior": (["fit-behavior", logs, "-o", str(tmp_path / "b.npz")], tmp_path / "b.npz"),
    }
    for name, (args, output) in commands.items():
        monkeypatch.setattr(interrupts, "_armed", [True])  # raised, never reported
        done = ope_in_process(args)
        assert (done.returncode, done.stdout, done.stderr) == (130, "", "ope: interrupted\n"), name
        assert not interrupts.lost()
        if output is not None:
            assert not output.exists(), name
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g"]  # nothing half written


def test_the_entry_module_imports_nothing_before_ctrl_c_is_handled():
    """``ope`` loads ope_cli.__main__ before its handler is installed: a module imported
    there (ctypes was) met a Ctrl-C of the first milliseconds with a traceback."""
    code = "import sys, ope_cli.__main__; print(sorted(set(sys.modules) - BEFORE))"
    before = "import sys; BEFORE = set(sys.modules); "
    done = subprocess.run(
        [sys.executable, "-c", before + code], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['ope_cli', 'ope_cli.__main__', 'ope_cli._version']"


@pytest.mark.slow  # a real process joining a one-process run
def test_sigterm_still_ends_a_process_that_joined_a_run():
    """JAX's distributed runtime takes SIGTERM for its preemption notice: a scheduler's
    SIGTERM mid-run printed "SIGTERM caught" and the run went on to exit 0."""
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    done = _run(
        f"""
        import os, signal, time
        from ope_cli import interrupts
        from ope_cli.estimation.distributed import DistributedConfig, initialize
        interrupts.install()
        initialize(DistributedConfig("127.0.0.1:{port}", 1, 0, timeout=30))
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(10)
            print("ran on")
        except KeyboardInterrupt:
            print(interrupts.message(), interrupts.exit_code())
        """
    )
    assert done.stdout == "ope: terminated 143\n", done
