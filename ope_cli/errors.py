"""The project's exception types; each carries the exit code the CLI returns for it."""

from __future__ import annotations

# What every command says of data that has no rows (and so no episode).
NO_EPISODES = "no episodes (the data has no rows)"
# Ctrl-C: the exit code shells report for SIGINT, and the one line every path prints
INTERRUPTED_EXIT_CODE = 130
INTERRUPTED = "ope: interrupted"


class OpeError(Exception):
    """A problem the user can act on, reported as one line on stderr."""

    exit_code: int = 1
    kind: str = "error"


class UsageError(OpeError):
    """Bad command-line usage: unknown option values, missing arguments (exit 2)."""

    exit_code = 2
    kind = "usage error"


class DataError(OpeError):
    """The logged data is missing, unreadable, or breaks the data contract (exit 3)."""

    exit_code = 3
    kind = "invalid data"


class InvalidValueError(DataError):
    """A value or an episode breaks the data contract where ``--on-invalid error`` stops;
    ``droppable``: whether ``--on-invalid drop`` would leave its episode out instead (a
    bound the run was given, or a size the policy expects, concerns every episode);
    ``reason``: the code of the check that found it, if any."""

    def __init__(self, message: str, droppable: bool = True, reason: str | None = None):
        super().__init__(message)
        self.droppable = droppable
        self.reason = reason  # the check's code (``validate.REASONS``), where one found it


class PolicyError(OpeError):
    """A policy checkpoint or entry point cannot be loaded or used (exit 4)."""

    exit_code = 4
    kind = "invalid policy"


def where(file: str | None = None, episode: object = None, step: int | None = None) -> str:
    """Formats a location prefix such as ``logs.parquet: episode 17, step 3: ``."""
    parts = []
    if file is not None:
        parts.append(str(file))
    inner = []
    if episode is not None:
        inner.append(f"episode {episode!r}" if isinstance(episode, str) else f"episode {episode}")
    if step is not None:
        inner.append(f"step {step}")
    if inner:
        parts.append(", ".join(inner))
    return ": ".join(parts) + ": " if parts else ""


def first_line(error: BaseException) -> str:
    """The first line of ``error``'s message (its type's name when it has none), for a
    one-line report of an error raised by a library."""
    text = str(error).strip().splitlines()
    return text[0] if text else type(error).__name__


def summary(error: BaseException) -> str:
    """``Type: first line`` of ``error`` (``Type`` alone when it has no message), for a
    one-line report of an error raised by code ``ope`` does not own (a user's policy)."""
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0]}" if text else type(error).__name__
