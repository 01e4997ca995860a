"""The ``ope`` command line: typer options -> config -> core -> formatter -> exit code.

``run(argv)`` runs one command in this process and returns its exit code, mapping every
error to one stderr line in one place; ``main()`` (the console script) wraps it and also
supervises multi-process runs. Heavy imports (jax, the pipeline) happen inside the
commands, so ``ope --help`` is instant.
"""

from __future__ import annotations

import enum
import os
import re
import sys
import traceback
import typing
from pathlib import Path
from typing import Annotated

import numpy as np
import typer

from ope_cli import interrupts
from ope_cli._version import __version__
from ope_cli.cli import bench, convert, evaluate, fit_behavior, fit_q, generate, inspect, supervisor
from ope_cli.cli.console import say
from ope_cli.cli.helpmap import HelpMapGroup
from ope_cli.errors import INTERRUPTED_EXIT_CODE, OpeError, UsageError
from ope_cli.estimation.estimators import names, title

INTERNAL_ERROR_EXIT_CODE = 1

app = typer.Typer(
    name="ope",
    cls=HelpMapGroup,
    help=f"Offline policy evaluation ({', '.join(title(n) for n in names())}) over logged "
    "episodes (Parquet, Arrow, Minari, D4RL-style HDF5).",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


def _version(value: bool) -> None:
    if value:
        print(f"ope {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
    version: Annotated[
        bool | None,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = None,
) -> None:
    """Estimate how well evaluation policies would do, from episodes logged by another policy.

    Example: [bold]ope evaluate logs.parquet --policy ckpt.npz --gamma 0.99[/bold]
    """
    # --debug is read from the command line by ``run``, which handles the errors.


app.command("evaluate")(evaluate.evaluate)
app.command("fit-behavior")(fit_behavior.fit_behavior)
app.command("fit-q")(fit_q.fit_q)
app.command("generate")(generate.generate)
app.command("inspect")(inspect.inspect)
app.command("convert")(convert.convert)
bench.register(app)


def _error_line(error: BaseException) -> str:
    return str(error).strip().replace("\n", " ")


# prefixes that a validation library puts before its own message
LIBRARY_PREFIXES = ("Value error, ", "Assertion failed, ")
EXTRA_ARGUMENTS = "Got unexpected extra argument"


def usage_message(error: typer.TyperException, argv: list[str] | None = None) -> str:
    """One line for an option-parsing error, with no library prefix, and the fix where
    one is known: extra arguments are mostly an unquoted glob the shell expanded, into the
    values of the option before them (``argv``), or of the command's positional argument."""
    message = _error_line(error.format_message())
    for prefix in LIBRARY_PREFIXES:
        message = message.replace(prefix, "")
    if message.startswith(EXTRA_ARGUMENTS):
        message += f": {_extra_arguments_fix(message, argv or [])}"
    return _parse_failure(message, argv or [])


# a number option's value that did not parse, in the validation library's words
_NOT_PARSED = re.compile(
    r"^Invalid value for '(?P<option>[^']+)'(?: / '[^']+')*: Input should be a valid "
    r"(?P<kind>number|integer)\b.*$"
)


def _parse_failure(message: str, argv: list[str]) -> str:
    """ "Invalid value for '--gamma': Input should be a valid number, unable to parse
    string as a number" (the validation library's words, without the value) as "--gamma
    takes a number, got 'abc'": the value it rejected, the last given of a one-value
    option, the first that does not parse of a repeatable one."""
    found = _NOT_PARSED.match(message)
    if found is None:
        return message
    option, kind = found["option"], found["kind"]
    parse = float if kind == "number" else int
    values = [(word, owner) for word, owner in _words(argv)[1] if _is_option(owner, option)]
    bad = [word for word, _ in values if not _parses(parse, word)]
    option_of = values[0][1] if values else None
    if not bad:
        got = None
    elif option_of.multiple:  # each value converted in turn: the first bad one failed
        got = bad[0]
    else:  # the last given is the one used; of two values, its first bad one
        last = [word for word, _ in values[-option_of.nargs :]]
        got = next((word for word in last if not _parses(parse, word)), last[-1])
    what = "a number" if kind == "number" else "a whole number (an integer)"
    return f"{option} takes {what}" + (f", got {got!r}" if got is not None else "")


def _parses(parse, word: str) -> bool:
    try:
        parse(word)
    except ValueError:
        return False
    return True


def _is_option(owner, name: str) -> bool:
    return owner not in (None, POSITIONAL, FLAG) and name in owner.opts


def _extra_arguments_fix(message: str, argv: list[str]) -> str:
    """What to do about the extra arguments ``message`` names (click: "... (a b)"): repeat
    the option whose values ran into them where it is repeatable, or quote the glob the
    shell expanded (an unquoted glob is the common cause)."""

    def glob(option: str, example: str) -> str:
        return (
            f"quote a glob pattern ({option}'{example}'), which the shell expands into several "
            "arguments"
        )

    command, words = _words(argv)
    if command is None:
        return f"{glob('--policy ', 'ckpts/*.npz')}, or repeat --policy before each value"
    # the first positional word past the command's own arguments (DATA; SOURCE OUT)
    taken = sum(p.nargs for p in command.params if p.param_type_name == "argument")
    positions = [i for i, (_, owner) in enumerate(words) if owner is POSITIONAL]
    at = positions[taken] if len(positions) > taken else 0
    before = words[at - 1][1] if at > 0 else POSITIONAL
    ran_on = _glob_ran_into_arguments(words, positions)
    if ran_on is not None:
        before = ran_on
    if before in (POSITIONAL, FLAG) and taken == 0:  # bench: no DATA (--data names it)
        return f"ope {command.name} takes no arguments but its options: drop the extra ones"
    if before in (POSITIONAL, FLAG):  # after the command's own paths
        return glob("", "logs/*.parquet")
    name = max(before.opts, key=len)
    if before.nargs > 1:
        return f"{name} takes {before.nargs} values: drop the extra ones"
    number = _takes_a_number(before)
    if number or _takes_a_choice(before):  # no glob expands into them
        what = "one number" if number else "one of its choices"
        if before.multiple:
            return f"{name} takes {what} at a time: repeat {name} before each value"
        return f"{name} takes {what}: drop the extra ones"
    if not before.multiple:
        return f"{name} takes one value: {glob(name + ' ', '...')}, or drop the extra ones"
    return (
        f"{name} takes one value at a time: repeat {name} before each value, or "
        f"{glob(name + ' ', 'dir/*')}"
    )


def _takes_a_number(option) -> bool:
    """Whether ``option`` (a command's parameter) takes an int or a float: no glob expands
    into it."""
    annotation = _value_annotation(option)
    if annotation is not None:  # typer's own parameters
        return annotation in (int, float)
    return getattr(getattr(option, "type", None), "name", "").startswith(("integer", "float"))


def _value_annotation(option):
    """The type of one value of a typer ``option`` (``list[int]``'s int), or None."""
    annotation = getattr(getattr(option, "type_descriptor", None), "annotation", None)
    if typing.get_origin(annotation) in (list, tuple):
        (annotation, *_) = typing.get_args(annotation) or (None,)
    return annotation


def _takes_a_choice(option) -> bool:
    """Whether ``option`` takes one of a fixed set of values (an Enum, or click's choices)."""
    annotation = _value_annotation(option)
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return True
    return getattr(getattr(option, "type", None), "name", "") == "choice"


def _glob_ran_into_arguments(words: list[tuple[str, object]], positions: list[int]):
    """The repeatable option whose unquoted glob ran on into the command's own arguments
    (``-p ckpts/*.npz logs.parquet``: the second file was taken as DATA), or None: the
    first positional word follows its value and has the same suffix (a.npz, b.npz)."""
    first = positions[0] if positions else 0
    if first == 0:
        return None
    value, owner = words[first - 1]
    if owner in (POSITIONAL, FLAG) or not owner.multiple:
        return None
    suffix = Path(value).suffix
    return owner if suffix and Path(words[first][0]).suffix == suffix else None


POSITIONAL, FLAG = "positional", "flag"  # what a command-line word is, beside an option's value


def _words(argv: list[str]) -> tuple[object | None, list[tuple[str, object]]]:
    """(the click command of ``argv``, [(word, what it is)] of the words after the command
    name): the click option whose value the word is, POSITIONAL, or FLAG (an option name,
    or an option with its value as --name=value); (None, []) for an unknown command."""
    words = [word for word in argv if word != "--debug"]
    group = typer.main.get_command(app)
    command = group.commands.get(words[0]) if words and hasattr(group, "commands") else None
    if command is None:
        return None, []
    options = {name: p for p in command.params if p.param_type_name == "option" for name in p.opts}
    read, owner, owed, only_positional = [], None, 0, False
    for word in words[1:]:
        if owed:  # a value of the option before (--reward-range takes two)
            read.append((word, owner))
            owed -= 1
        elif only_positional or not word.startswith("-") or word == "-":
            read.append((word, POSITIONAL))
        elif word == "--":
            only_positional = True
            read.append((word, FLAG))
        else:
            option, value = _option_word(word, options)
            owner, owed = option, 0 if option is None or option.is_flag else option.nargs
            if owed and value is not None:  # --name=value, or -nVALUE
                read.append((value, option))
                owed -= 1
            else:
                read.append((word, FLAG))
    return command, read


def _option_word(word: str, options: dict) -> tuple[object | None, str | None]:
    """(the click option that ``word`` names, its value in the same word or None):
    --name, --name=value, -n or -nVALUE; (None, None) for no option of the command."""
    name, inline, value = word.partition("=")
    if name in options:
        return options[name], value if inline else None
    if word.startswith("--"):
        return None, None
    for at in range(1, len(word)):  # -qp: flags, then one option whose value follows
        option = options.get("-" + word[at])
        if option is None or not option.is_flag:
            rest = word[at + 1 :]
            return option, rest or None
    return None, None


def run(argv: list[str]) -> int:
    """Runs ``ope ARGV`` in this process and returns the exit code (SPEC: 0 ok, 1 internal
    error, 2 usage, 3 data, 4 policy, 130 interrupted). Results go to ``sys.stdout``; an
    error is one line ``ope: ...`` on ``sys.stderr``, its traceback only with ``--debug``."""
    debug = "--debug" in argv
    if debug:  # accepted anywhere on the line, not only before the command
        argv = ["--debug", *(a for a in argv if a != "--debug")]
    if not argv:  # ``ope`` alone: the help, and success
        argv = ["--help"]
    try:
        # a value beyond float range is reported with the numbers (a note, a warning code):
        # NumPy's RuntimeWarning lines about it would only break stderr's one-line contract
        with np.errstate(all="ignore"):
            code = app(args=list(argv), prog_name="ope", standalone_mode=False)
    except OpeError as error:
        if debug:
            traceback.print_exc()
        say(f"ope: {error.kind}: {_error_line(error)}")
        return error.exit_code
    except typer.Abort:
        interrupts.handled()
        say("ope: aborted")
        return INTERRUPTED_EXIT_CODE
    except typer.TyperException as error:  # usage errors from option parsing
        say(f"ope: usage error: {usage_message(error, list(argv))}")
        return UsageError.exit_code
    except KeyboardInterrupt:
        code = INTERRUPTED_EXIT_CODE
    except Exception as error:  # noqa: BLE001 - anything else is a bug: say so, exit 1
        if debug:
            traceback.print_exc()
        say(
            f"ope: internal error (a bug; rerun with --debug for the traceback): "
            f"{type(error).__name__}: {_error_line(error)}",
            highlight=True,
        )
        return INTERNAL_ERROR_EXIT_CODE
    # typer returns Ctrl-C as 130, without a word; an interrupt lost in a callback (Python
    # printed and ignored it) ends the run as interrupted, even where its result is out
    if code == INTERRUPTED_EXIT_CODE or interrupts.lost():
        interrupts.handled()
        say(interrupts.message())
        return interrupts.exit_code()
    return code if isinstance(code, int) else 0


def exit_with(code: int) -> None:
    """Ends the process with ``code``; after Ctrl-C (SIGTERM) without tearing the
    interpreter down while XLA's threads may still run (that ended in a segfault in 2 of 8
    tries); else with the signals ignored from now on, or in a cluster worker ending it at
    once with ``code`` (``interrupts.finished``): the result is out."""
    if code in (INTERRUPTED_EXIT_CODE, interrupts.TERMINATED_EXIT_CODE):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    interrupts.finished(code, teardown_waits=supervisor.is_worker())
    sys.exit(code)


def main() -> None:
    """Console entry point: ``ope ARGS`` -> exit code. A multi-process run is handed to a
    supervised worker process (see ``supervisor``)."""
    argv = sys.argv[1:]
    if supervisor.wants_cluster(argv):
        if not supervisor.is_worker():
            exit_with(supervisor.supervise(argv))
        supervisor.keep_stdout_for_the_result()
    exit_with(run(argv))


__all__ = ["app", "main", "run"]
