"""Ctrl-C for the ``ope`` process: one ``ope: interrupted`` line and exit 130, whatever
the process was doing when the signal came.

Python's own handler raises KeyboardInterrupt wherever the main thread next runs bytecode.
Two places lose it:

- inside an import: raised while ``jaxlib`` loaded, it ended in a segfault (3 of 48
  tries, Ctrl-C within a second of the start, 2 busy cores);
- inside a callback whose exceptions Python prints and ignores (JAX's garbage-collector
  callback, a weak reference's): the command ran on as if nothing had been pressed (5 of
  48 tries), or finished within the grace below and exited 0 (4 of 35).

So in an import or such a callback the handler ends the process at once (an import has
written nothing to clean up); elsewhere it raises KeyboardInterrupt as usual, so
that partial outputs are removed on the way out, and arms a timer: a process still running
``GRACE_SECONDS`` later, its interrupt lost, ends then. A second Ctrl-C ends it at once
(raised again, it interrupted the first one's cleanup with a traceback). The command line
disarms the timer once the interrupt has reached it (``handled``); an interrupt lost in a
callback no frame shows (``lost``) is raised again before a result or a file is written (a
``held`` step does not start), and ends the run as interrupted where one was written first.
SIGTERM (a batch scheduler's, ``kill``'s) is handled the same way, with ``ope: terminated``
and exit code 143 (128 + 15, a shell's for it): partial outputs go, where the default action
left them. Once
the command has written its result, the signals are ignored (``finished``), so the exit
code is the result's, not the signal's after a complete document. Only the console script
installs this (``install``): code that calls ``ope_cli`` in its own process keeps its own
handlers.
"""

from __future__ import annotations

import contextlib
import gc
import os
import signal
import sys
import types
import weakref
from collections.abc import Iterator

from ope_cli.errors import INTERRUPTED, INTERRUPTED_EXIT_CODE

GRACE_SECONDS = 3.0
TERMINATED = "ope: terminated"
TERMINATED_EXIT_CODE = 128 + signal.SIGTERM
HANDLED = (signal.SIGINT, signal.SIGTERM)
_armed = [False]  # the timer runs
_interrupted = [False]  # a first interrupt was raised: a second ends the process at once
_terminated = [False]  # the signal was SIGTERM
_holding = [0]  # ``held`` contexts open: a signal waits in _held
_held: list[int] = []


def _weakref_callbacks() -> frozenset[types.CodeType]:
    """The code of the weak references' callbacks in the standard library (the weak
    dictionaries' and sets' ``remove``, ``finalize.__call__``): Python ignores their
    exceptions. Their other code (``setdefault``, ``finalize.__init__``) runs in plain
    calls, JAX's tracing among them, and is safe to raise in."""
    codes = {weakref.finalize.__call__.__code__}
    for owner in (weakref.WeakValueDictionary, weakref.WeakKeyDictionary, weakref.WeakSet):
        codes.update(c for c in owner.__init__.__code__.co_consts if isinstance(c, types.CodeType))
    return frozenset(codes)


_CALLBACKS = _weakref_callbacks()


def exit_code() -> int:
    """The exit code of an interrupted run: 143 after SIGTERM, else 130."""
    return TERMINATED_EXIT_CODE if _terminated[0] else INTERRUPTED_EXIT_CODE


def message() -> str:
    """The one line of an interrupted run: ``ope: terminated`` after SIGTERM, else
    ``ope: interrupted``."""
    return TERMINATED if _terminated[0] else INTERRUPTED


def exit_interrupted(*_) -> None:
    """Says ``ope: interrupted`` (``ope: terminated``) and ends the process with exit code
    130 (143) at once."""
    sys.stderr.write(f"{message()}\n")
    sys.stderr.flush()
    os._exit(exit_code())


def unsafe_to_raise(frame: types.FrameType | None) -> bool:
    """Whether a KeyboardInterrupt raised in ``frame`` would be lost or harmful: a
    garbage-collector callback or a weak reference's (whose exceptions Python prints and
    ignores) is running at or below it, or an import is (raised into a C extension's
    loading, it crashed the process). A callback of the user's own weak reference is not
    known: ``lost`` catches what it swallows."""
    callbacks = _CALLBACKS | {getattr(c, "__code__", None) for c in gc.callbacks}
    while frame is not None:
        code = frame.f_code
        if code in callbacks:
            return True
        if code.co_filename.startswith("<frozen importlib"):
            return True
        frame = frame.f_back
    return False


def _on_interrupt(signum: int, frame: types.FrameType | None) -> None:
    if _holding[0]:  # raised when the step is done (``held``)
        _held.append(signum)
        return
    if not _interrupted[0]:
        _terminated[0] = signum == signal.SIGTERM
    if _interrupted[0] or unsafe_to_raise(frame):  # a second Ctrl-C: now, not another raise
        exit_interrupted()
    _interrupted[0] = True
    signal.signal(signal.SIGALRM, exit_interrupted)
    signal.setitimer(signal.ITIMER_REAL, GRACE_SECONDS)
    _armed[0] = True
    raise KeyboardInterrupt


def install() -> None:
    """Handles SIGINT and SIGTERM as the module says, each unless it is ignored (a job
    started in the background keeps ignoring SIGINT, as Python itself does)."""
    for number in HANDLED:
        if signal.getsignal(number) is not signal.SIG_IGN:
            signal.signal(number, _on_interrupt)


def reclaim() -> None:
    """Installs this module's handlers again where it had installed them (``install``):
    code that sets its own at the C level takes a signal without Python knowing (JAX's
    distributed runtime does so for SIGTERM, its preemption notice)."""
    for number in HANDLED:
        if signal.getsignal(number) is _on_interrupt:
            signal.signal(number, _on_interrupt)


def finished(code: int, teardown_waits: bool = False) -> None:
    """The command wrote its result, whose exit code is ``code``: from now on SIGINT and
    SIGTERM, where this module handles them, are ignored (a signal in the interpreter's
    teardown killed the process after a complete document, and a shell saw 130; Python
    puts a handler of its own back before that teardown, an ignored signal stays
    ignored). Where the teardown may wait (``teardown_waits``: a cluster worker's shutdown
    waits on its peers), either ends the process at once with ``code`` instead."""

    def end(*_) -> None:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        os._exit(code)

    for number in HANDLED:
        if signal.getsignal(number) is _on_interrupt:
            signal.signal(number, end if teardown_waits else signal.SIG_IGN)


def lost() -> bool:
    """Whether an interrupt was raised and has not reached the code that reports it: lost
    in a callback whose exceptions Python ignores, where no frame showed it."""
    return _armed[0]


def raise_if_lost() -> None:
    """KeyboardInterrupt where an interrupt was ``lost``: before a result is written, so
    that a run interrupted in time does not print one."""
    if _armed[0]:
        raise KeyboardInterrupt


def handled() -> None:
    """The interrupt reached the code that reports it: the timer is not needed."""
    if _armed[0]:
        signal.setitimer(signal.ITIMER_REAL, 0)
        _armed[0] = False


@contextlib.contextmanager
def held() -> Iterator[None]:
    """A context in which SIGINT and SIGTERM, where this module handles them (``install``),
    wait and are raised when it ends (the first of them): for a step that must not stop
    half done, such as replacing an earlier run's files with a new run's. A signal mask
    would not do: it holds the calling thread only, and with JAX loaded another thread
    took the signal while Python still ran the handler in the main thread; swapping the
    handlers raced with the signals it held. Nested, the outermost one raises."""
    raise_if_lost()  # an interrupt lost before the step: it does not start
    _holding[0] += 1
    try:
        yield
    finally:
        _holding[0] -= 1
        if not _holding[0] and _held:
            number = _held[0]
            _held.clear()
            _on_interrupt(number, sys._getframe())
