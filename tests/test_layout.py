"""Tables printed whole (ope_cli/report/layout.py): numbers never folded, short words never
cut, long paths folded rather than widening the table."""

from __future__ import annotations

import io
import sys

from rich.console import Console
from rich.table import Table

from ope_cli.report.layout import FOLDED_WORDS, print_whole


def _selection_like() -> Table:
    table = Table()
    table.add_column("metric")
    for name in ("IS", "WIS", "PDIS", "WPDIS", "DM", "DR", "WDR"):
        table.add_column(name, justify="right")
    table.add_row("precision@3", *["0.002556", "5.063e-05"] * 3, "0.001804")
    return table


def _lines(table: Table, width: int) -> list[str]:
    console = Console(width=width, record=True)
    print_whole(console, table)
    assert console.width == width  # as it was
    assert all(column.width is None for column in table.columns)  # as they were
    return console.export_text().splitlines()


def test_a_table_narrower_than_its_numbers_is_printed_at_their_width():
    """At 80 columns rich folded 0.002556 over two lines ("0.00255" over "6") and cut
    "precision@3" to "precis…": a reader took 0.00255 for the value."""
    for width in (40, 80, 200):
        lines = _lines(_selection_like(), width)
        row = next(line for line in lines if "precision@3" in line)
        assert row.count("0.002556") == 3 and row.count("5.063e-05") == 3, lines
        assert "…" not in "".join(lines)
        if width >= 100:  # it fits: the console's width is not exceeded
            assert max(len(line.rstrip()) for line in lines) <= width


def test_a_long_path_folds_and_does_not_widen_the_table():
    """A policy path is one long word: folded over lines (the report's columns fold), as
    before, where the numbers fit."""
    table = Table()
    table.add_column("policy", overflow="fold")  # as the report's
    table.add_column("value", justify="right", overflow="fold")
    path = "/a/very/long/directory/of/checkpoints/" * 3 + "eval_0.npz"
    table.add_row(path, "1.2345")
    lines = _lines(table, 60)
    assert max(len(line.rstrip()) for line in lines) <= 60
    assert "".join(line.split("│")[1].strip() for line in lines if line.count("│") == 3) == path
    assert len(path) > FOLDED_WORDS


def test_columns_that_cut_or_never_wrap_keep_their_longest_word():
    """The allowance to fold is for columns that fold: a histogram's bars (no_wrap) were
    cut to "56…" at 40 columns, and a column name past 16 characters (ellipsis) too. A
    validation reason of inspect's (up to 23 characters) in a column that folds stays whole
    ("reward_not_finit" over "e" at 80 columns)."""
    table = Table()
    table.add_column("name")  # rich's default: an ellipsis for a word too long
    table.add_column("bars", no_wrap=True)
    table.add_column("reason", overflow="fold")
    name, bars, reason = "trajectory_identifier_column", "▁▂▃▄▅▆▇█" * 4, "behavior_prob_above_one"
    table.add_row(name, bars, reason)
    text = "\n".join(_lines(table, 30))
    assert name in text and bars in text and reason in text and "…" not in text


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_dumb_terminal_takes_its_columns_and_keeps_numbers_whole(monkeypatch):
    """rich gives a dumb terminal (TERM=dumb: Emacs' shell, some CI logs) 80 x 25 whatever
    COLUMNS says, and ignores a width set later unless a height is set too: a table wider
    than 80 folded 0.08388 into "0.0838" over "8"."""
    from ope_cli.cli.console import table_console

    monkeypatch.setenv("TERM", "dumb")
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setattr(sys, "stdout", _Terminal())
    console = table_console(100)
    assert console.is_dumb_terminal and console.width == 200
    monkeypatch.setenv("COLUMNS", "40")
    console = table_console(100)
    print_whole(console, _selection_like())
    row = next(line for line in sys.stdout.getvalue().splitlines() if "precision@3" in line)
    assert row.count("0.002556") == 3 and row.count("5.063e-05") == 3
