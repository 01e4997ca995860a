"""``ope inspect DATA``: what the data holds and every validation problem in it."""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from ope_cli.cli.console import say, stdout_kept_for_the_result, table_console
from ope_cli.cli.groups import WRITTEN, Written
from ope_cli.cli.options import (
    LOGGED_COLUMNS,
    Data,
    DeclaredGamma,
    InspectFormat,
    ReadRows,
    column_group,
    option_groups,
)
from ope_cli.config import BatchingConfig, ColumnMapping

INVALID_DATA_EXIT_CODE = 3


@option_groups(output=WRITTEN, columns=column_group(*LOGGED_COLUMNS))
def inspect(
    data: Data,
    *,
    policy: Annotated[
        list[str] | None,
        typer.Option(
            "--policy",
            "-p",
            help="Also check actions and states against this policy's ranges; repeatable.",
        ),
    ] = None,
    gamma: DeclaredGamma = None,
    output: Written,  # --format, --quiet
    read_rows: ReadRows = BatchingConfig.read_rows,
    columns: ColumnMapping,  # the "Columns" panel
) -> None:
    """Show DATA's schema, episodes, lengths, propensities, actions, rewards and discounted
    returns (with the logging policy's value), and every validation problem in it. Exits 3
    when there are problems (the report still goes to stdout).

    Example: ope inspect logs.parquet --format json | jq '.problems'
    """
    from ope_cli.inspection import InspectConfig
    from ope_cli.inspection import inspect as run_inspection
    from ope_cli.report.inspect import NO_EPISODES, inspect_warnings, render_table, to_json

    config = InspectConfig(
        data=data,
        columns=columns,
        read_rows=read_rows,
        policies=tuple(policy or ()),
        gamma=gamma,
    )
    with stdout_kept_for_the_result():
        report = run_inspection(config)
    if output.format is InspectFormat.json:
        sys.stdout.write(to_json(report) + "\n")
        if report.ok:  # else its one stderr line is the error's
            output.say_warnings(w.message for w in inspect_warnings(report))
    else:
        render_table(report, table_console(width=120))
    if not report.ok:
        sys.stdout.flush()
        # an episode with two problems is one invalid episode, as the report counts it
        # a file whose reading stopped holds episodes no count includes: say so (the line
        # said "in 0 episode(s)" of a file of four)
        stopped = sorted({p.file for p in report.problems if p.reason == "file_error"})
        unread = f", and {len(stopped)} file(s) not read to the end" if stopped else ""
        # the report's rows: one per (reason, message): three list columns that disagree
        # with the rewards are three rows of one kind
        kinds = len({p.reason for p in report.problems})
        rows = len(report.problems)
        listed = f" ({rows} row(s) in the report)" if rows != kinds else ""
        problems = (
            f"{kinds} kind(s) of validation problem{listed}, in "
            f"{report.invalid_episodes:,} episode(s){unread} (see the report)"
        )
        say(f"ope: invalid data: {data}: {problems if report.problems else NO_EPISODES}")
        raise typer.Exit(INVALID_DATA_EXIT_CODE)
