"""Consoles of the command line, created per call so that they write to the current
``sys.stdout`` / ``sys.stderr`` (which in-process callers and tests may redirect)."""

from __future__ import annotations

import contextlib
import shutil
import sys
from collections.abc import Iterator

from rich.console import Console

from ope_cli import interrupts


def stderr_console() -> Console:
    """A console on the current stderr: progress, warnings, errors (people, not data)."""
    return Console(stderr=True, emoji=False)


def say(line: str, highlight: bool = False) -> None:
    """One unwrapped line on stderr, printed as is (no markup)."""
    stderr_console().print(line, markup=False, highlight=highlight, soft_wrap=True)


def say_warnings(messages) -> None:
    """Each warning a JSON or CSV result carries, a line on stderr ("warning: ..."): SPEC 1
    puts warnings there, and a script that reads only the numbers would show a person none
    (the table says them in its footer, on stdout)."""
    for message in messages:
        say(f"warning: {message}")


def table_console(width: int) -> Console:
    """A console for tables on stdout: the terminal's width on a terminal, else ``width``
    columns (the 80 columns rich assumes in a pipe would fold paths). A dumb terminal
    (TERM=dumb) gets its size from COLUMNS and LINES or the terminal, with both fixed: rich
    takes one as 80 x 25, and ignores a width set later (``print_whole``) without a height."""
    console = Console(emoji=False)
    if not console.is_terminal:
        return Console(width=width, emoji=False)
    if console.is_dumb_terminal:
        columns, lines = shutil.get_terminal_size()
        return Console(width=columns, height=lines, emoji=False)
    return console


@contextlib.contextmanager
def stdout_kept_for_the_result() -> Iterator[None]:
    """While a command runs user code (an entry point's module on import, its function when
    traced): what Python prints to stdout goes to stderr, so that stdout holds the result
    alone (``| jq`` reads it). The command writes its result after the block; an interrupt
    lost on the way (``interrupts.lost``) is raised at its end, before any result."""
    with contextlib.redirect_stdout(sys.stderr):
        yield
    interrupts.raise_if_lost()  # Ctrl-C during the run: no result
