"""Tables printed whole: no number folded, no short word cut.

Where a table is wider than the console, rich narrows its columns evenly, below their
longest words: a number is folded over two lines ("0.00255" over "6", read as 0.00255) and
a name cut ("precis…"). Here the widest columns give way first and none goes below its
longest word; a table that still does not fit is printed at the width it needs, and a
terminal narrower than that wraps its lines with every character kept.
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

WIDEST = 10_000  # columns: wider than any table's longest line


# A word longer than this in a column that folds its words (a name, a path) may fold: a path
# over two lines is still read right; numbers (right-aligned), shorter words and columns
# that cut or never wrap (a histogram's bars, an ellipsis) are kept whole
FOLDED_WORDS = 24  # the longest validation reason (23) stays whole


def column_widths(console: Console, table: Table, available: int) -> list[int]:
    """Each column's width with its padding: its natural width, the widest narrowed first
    (one column at a time) until the table fits ``available`` columns of cells, never below
    its longest word (at most FOLDED_WORDS of a column that ``folds``)."""
    options = console.options.update(width=WIDEST, max_width=WIDEST)
    ranges = [table._measure_column(console, options, column) for column in table.columns]
    widths = [r.maximum for r in ranges]
    floors = [
        min(r.minimum, FOLDED_WORDS + table._get_padding_width(column._index))
        if folds(column)
        else r.minimum
        for r, column in zip(ranges, table.columns, strict=True)
    ]
    while sum(widths) > available:
        above = [i for i, (w, f) in enumerate(zip(widths, floors, strict=True)) if w > f]
        if not above:
            break
        widest = max(above, key=lambda i: widths[i])
        widths[widest] -= 1
    return widths


def folds(column) -> bool:
    """Whether a column may fold its long words over lines without a reader misreading
    them: one of names or paths that folds, not right-aligned numbers, bars or ellipses."""
    return column.justify != "right" and column.overflow == "fold" and not column.no_wrap


def print_whole(console: Console, table: Table) -> None:
    """Prints ``table`` with its columns fixed by ``column_widths``: at the console's width
    where they fit it, else at the width they need."""
    extra = table._extra_width  # borders
    widths = column_widths(console, table, console.width - extra)
    given = [column.width for column in table.columns]
    for column, width in zip(table.columns, widths, strict=True):
        column.width = max(1, width - table._get_padding_width(column._index))
    console_width = console.width
    try:
        if sum(widths) + extra <= console_width:
            console.print(table)
        else:
            console.width = sum(widths) + extra
            console.print(table, crop=False)
    finally:
        console.width = console_width
        for column, width in zip(table.columns, given, strict=True):
            column.width = width
