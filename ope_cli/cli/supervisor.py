"""Multi-process runs: the ``ope`` process supervises a worker that joins the JAX
distributed runtime, so a runtime abort becomes one clear line and exit code 5."""

from __future__ import annotations

import contextlib
import os
import sys

from ope_cli import interrupts
from ope_cli.cli.console import say
from ope_cli.cli.options import CLUSTER_OPTIONS
from ope_cli.errors import INTERRUPTED, INTERRUPTED_EXIT_CODE

RUNTIME_EXIT_CODE = 5
WORKER_ENV = "OPE_CLUSTER_WORKER"

# the child's own lines, passed on (the runtime's logging is not): its one error line, and
# process 0's warnings and figures of a successful run
OWN_LINES = ("ope:", "warning: ", "figures: ")


def wants_cluster(argv: list[str]) -> bool:
    """Whether the command line asks for a multi-process run."""
    return any(a.split("=")[0] in CLUSTER_OPTIONS for a in argv)


def _die_with_parent() -> None:
    """In the worker: ask Linux to kill it when its supervisor dies, even by SIGKILL, so a
    killed ``ope`` never leaves a worker behind that its peers keep waiting for."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


class Forward:
    """The supervisor's SIGTERM and SIGHUP handler: the signal passed on to the child, one
    that comes before the child exists sent once it does (before, a SIGTERM then escaped
    as a traceback)."""

    def __init__(self) -> None:
        self.child = None
        self.pending: list[int] = []
        self.received: set[int] = set()  # every signal passed on (or to be)

    def __call__(self, number: int, frame=None) -> None:
        self.received.add(number)
        if self.child is None:
            self.pending.append(number)
        else:
            self.child.send_signal(number)

    def started(self, child) -> None:
        """``child`` now runs: the signals that came before go to it."""
        self.child = child
        for number in self.pending:
            child.send_signal(number)


def supervise(argv: list[str]) -> int:
    """Runs this command in a child process and reports how it ended.

    JAX's distributed runtime aborts a process (SIGABRT, with C++ logs) when a peer dies
    or stops answering; the child takes that fall, and this parent turns it into one clear
    line and exit code 5, or keeps the child's own line when it said what failed first.
    Only the child's own ``ope:`` lines reach stderr (all of it with --debug); stdout
    passes straight through.
    """
    import signal
    import subprocess

    env = {**os.environ, WORKER_ENV: "1", "PYTHONUNBUFFERED": "1"}
    forward = Forward()
    for forwarded in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(forwarded, forward)
    try:
        child = subprocess.Popen(
            [sys.executable, "-m", "ope_cli", *argv],
            stdin=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            preexec_fn=_die_with_parent,
        )
    except KeyboardInterrupt:  # Ctrl-C before there is a child: nothing else to stop
        say(INTERRUPTED)
        return INTERRUPTED_EXIT_CODE
    forward.started(child)
    debug = "--debug" in argv
    runtime_log = []  # the runtime's own fatal-error lines, to say what went wrong
    said = False  # whether the child already gave its one ``ope:`` line
    try:
        for raw in child.stderr:
            line = raw.decode(errors="replace")
            said = said or line.startswith("ope:")
            if debug or line.startswith(OWN_LINES):
                sys.stderr.write(line)
            elif "absl::Status" in line or line.startswith("RPC:"):
                runtime_log.append(line)
        code = child.wait()
    except KeyboardInterrupt:  # Ctrl-C: the child stops too, and one line says so
        return _interrupted(child)
    return _ended(code, said, runtime_log, forward, argv)


def _ended(code: int, said: bool, runtime_log: list[str], forward: Forward, argv) -> int:
    """The exit code (and, unless the child said it, the one line) of a child that ended
    with ``code``, its ``ope:`` line already passed on when ``said``."""
    import signal

    if code < 0 and -code in forward.received:  # ended by the signal this process passed on
        say(interrupts.TERMINATED)  # (one that came before it handled signals)
        return 128 - code
    if code < 0 and said:  # the runtime aborted a child that had said what failed
        return RUNTIME_EXIT_CODE
    if code == -signal.SIGKILL:  # not the runtime's (it aborts): the system's, or kill -9
        say(
            "ope: distributed run failed: this process's worker was killed (SIGKILL: out "
            "of memory, or kill -9); its peers stop too"
        )
        return RUNTIME_EXIT_CODE
    if code < 0:
        reason = _abort_reason("".join(runtime_log), argv)
        say(
            f"ope: distributed run failed: stopped by the JAX runtime "
            f"({signal.Signals(-code).name}): {reason}"
        )
        return RUNTIME_EXIT_CODE
    return code


INTERRUPT_GRACE_SECONDS = 5.0  # a child joining a run does not stop before its timeout


def _interrupted(child) -> int:
    """INTERRUPTED_EXIT_CODE after Ctrl-C, with one ``ope: interrupted`` line: the child
    gets SIGINT (the terminal may have sent it already), its ``ope:`` lines pass on, and
    past INTERRUPT_GRACE_SECONDS it is killed (it waited out the whole join timeout, and the
    parent printed a traceback). A child that had written its result ends with exit 0
    (``interrupts.finished``), and so does this process, with the child's own lines: the
    whole document on stdout was followed by "ope: interrupted" and exit 130. (Any other
    end is the interrupt's: a child that stopped on a peer's interrupt, exit 5, too.)"""
    import signal
    import subprocess

    interrupts.handled()  # this function keeps its own time
    with contextlib.suppress(ProcessLookupError):
        child.send_signal(signal.SIGINT)
    try:
        _, stderr = child.communicate(timeout=INTERRUPT_GRACE_SECONDS)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        child.kill()
        _, stderr = child.communicate()
    lines = (stderr or b"").decode(errors="replace").splitlines()
    if child.returncode == 0:  # it ended with its result out (``interrupts.finished``)
        for line in lines:
            if line.startswith(OWN_LINES):
                sys.stderr.write(line + "\n")
        return 0
    said = [line for line in lines if line.startswith("ope:")]
    say(said[-1] if said else INTERRUPTED)
    return INTERRUPTED_EXIT_CODE


def _abort_reason(log: str, argv: list[str]) -> str:
    """Why the JAX runtime aborted a worker, from its fatal-error lines ``log``."""
    joining = "RegisterTask" in log or "Deadline" in log and "heartbeat" not in log
    if joining and _process_id(argv) == 0:  # the coordinator itself: its peers are late
        expected = _num_processes(argv)
        which = "every process" if expected is None else f"all {expected} processes"
        return (
            f"not {which} joined the run in time (were they all started with this "
            "--coordinator? one that stopped before joining said why on its own stderr)"
        )
    if joining:
        return (
            "could not join the run: the coordinator did not answer in time (is process 0 "
            "running, and is --coordinator its reachable HOST:PORT?)"
        )
    return "another process died or stopped answering; see that process's error"


# where the launchers that --distributed detects put a process's rank (SLURM, Open MPI)
RANK_VARIABLES = ("SLURM_PROCID", "OMPI_COMM_WORLD_RANK")


# and the number of processes
SIZE_VARIABLES = ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE")


def _int_option(argv: list[str], option: str, variables: tuple[str, ...]) -> int | None:
    """The value of ``option`` on a command line, else of the first of the environment
    ``variables`` set (None: neither, or not a number)."""
    value = next((os.environ[name] for name in variables if name in os.environ), None)
    for index, argument in enumerate(argv):
        if argument == option and index + 1 < len(argv):
            value = argv[index + 1]
        elif argument.startswith(f"{option}="):
            value = argument.partition("=")[2]
    return int(value) if value is not None and value.isdigit() else None


def _process_id(argv: list[str]) -> int | None:
    """The --process-id of a command line, else the launcher's rank."""
    return _int_option(argv, "--process-id", RANK_VARIABLES)


def _num_processes(argv: list[str]) -> int | None:
    """The --num-processes of a command line, else the launcher's count of processes."""
    return _int_option(argv, "--num-processes", SIZE_VARIABLES)


def is_worker() -> bool:
    """Whether this process is the supervised worker of a multi-process run."""
    return bool(os.environ.get(WORKER_ENV))


def keep_stdout_for_the_result() -> None:
    """In the worker: the collectives library prints to the C-level stdout; point fd 1 at
    stderr and keep the real stdout for the result."""
    result_fd = os.dup(1)
    os.dup2(2, 1)
    sys.stdout = os.fdopen(result_fd, "w")
