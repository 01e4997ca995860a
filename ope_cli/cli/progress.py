"""The progress display of ``ope evaluate`` on stderr."""

from __future__ import annotations

import re
import threading
import time

from rich.console import Console

from ope_cli.cli.console import stderr_console

ROW_PHASES = ("reading", "evaluating")  # statuses during which the rows measure the work
# once every row is read, what remains (the last batches) has no rows to count
ALL_READ = "evaluating the last batches (every row read)"
PASS = re.compile(r"\(pass \d+ of \d+\)")  # a status that starts a pass over the data
WIDE = 140  # columns from which the status line has room for every part of it whole


class ProgressDisplay:
    """Progress of ``ope evaluate`` on stderr: a status ("compiling kernel for [B, T] ...",
    "reading") with a spinner, and a bar of rows read out of the total known from the Parquet
    metadata, with throughput, elapsed time and ETA.

    It appears only when stderr is a terminal and not ``--quiet``, and only for runs longer
    than ``delay`` seconds (a timer starts the display; rich's own refresh thread keeps the
    spinner and clock moving while the main thread is busy compiling). ``with ProgressDisplay(q) as
    (on_progress, on_status)``: both None when disabled.
    """

    def __init__(self, quiet: bool, console: Console | None = None, delay: float = 1.0):
        self.console = console or stderr_console()
        self.enabled = not quiet and self.console.is_terminal
        self.delay = delay
        self._progress = None
        self._task = None
        self._timer = None
        self._lock = threading.Lock()
        self._started = self._closed = False
        self._total: int | None = None  # rows, kept while a step without rows runs
        self._rows = 0
        # seconds spent in row phases (reading, evaluating), not compiling: the rate and the
        # ETA count those alone (after a compile, the average over it gave an ETA of 28 s
        # for a read of 1 s, and a stale rate while compiling)
        self._row_seconds = 0.0
        self._phase_since: float | None = None
        # the pass over the data under way ("evaluating (pass 3 of 4)"), which the rows'
        # phases keep saying: "reading" and ALL_READ replaced it at once
        self._pass = ""

    def __enter__(self):
        if not self.enabled:
            return None, None
        from rich.progress import (
            BarColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
        )
        from rich.table import Column

        # on a narrow terminal the status and the bar give way (the status ends in "…"), so
        # that the numbers keep their place whole: cut at the line's end, a rate of
        # 619,000 rows/s read "6,19"
        narrow = self.console.width < WIDE
        status, bar = (Column(ratio=3, no_wrap=True, overflow="ellipsis"), Column(ratio=1))
        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}", table_column=status if narrow else None),
            BarColumn(bar_width=None if narrow else 40, table_column=bar if narrow else None),
            TextColumn("{task.fields[rows]}", table_column=Column(no_wrap=True)),
            TextColumn("{task.fields[rate]}", style="cyan", table_column=Column(no_wrap=True)),
            TimeElapsedColumn(),
            TextColumn("{task.fields[eta]}", table_column=Column(no_wrap=True)),
            console=self.console,
            expand=narrow,
            transient=True,
            # stdout is the result's: the command routes it (``stdout_kept_for_the_result``)
            # and rich's swap of sys.stdout, undone after that block, left it on stderr
            redirect_stdout=False,
        )
        self._task = self._progress.add_task("starting", total=None, rows="", rate="", eta="eta")
        self._timer = threading.Timer(self.delay, self._start)
        self._timer.daemon = True
        self._timer.start()
        return self.update, self.status

    def _start(self) -> None:
        with self._lock:
            if not self._closed:
                self._progress.start()
                self._started = True

    def _seconds_in_row_phases(self) -> float:
        now = time.monotonic()
        running = 0.0 if self._phase_since is None else now - self._phase_since
        return self._row_seconds + running

    def _eta(self, rows: int, total: int | None, seconds: float) -> str:
        if not total or not rows or seconds <= 0 or rows >= total:
            return ""
        left = (total - rows) * seconds / rows
        return f"eta {int(left) // 60}:{int(left) % 60:02d}"

    def update(self, rows: int, total: int | None) -> None:
        """Rows read so far, of ``total`` (None when unknown); fewer than before: a new pass
        over the data, with its own rate."""
        if rows < self._rows:
            self._row_seconds, self._phase_since = 0.0, None
        if self._phase_since is None:
            self._phase_since = time.monotonic()
        seconds = self._seconds_in_row_phases()
        # the average over the time spent reading and evaluating so far
        rate = f"{rows / seconds:,.0f} rows/s" if rows and seconds > 0 else ""
        self._total, self._rows = total, rows
        counted = f"{rows:,}" + (f"/{total:,}" if total else "") + " rows"
        if total and rows >= total:  # the last batches remain: no bar to fill, no ETA
            self._pulse()
            said = {"description": self._all_read(), "rows": counted, "rate": rate, "eta": ""}
            self._progress.update(self._task, completed=rows, **said)
            return
        self._progress.update(
            self._task,
            completed=rows,
            total=total,
            description=self._pass or "reading",
            rows=counted,
            rate=rate,
            eta=self._eta(rows, total, seconds),
        )

    def status(self, text: str) -> None:
        """A step without row progress ("compiling shape 3 of 17", "loading compiled
        kernels", "fitting pass 1 of 2"), or back to the rows ("reading", "evaluating").
        While such a step runs, the bar pulses and shows no ETA: rows all read do not
        mean that the work is done."""
        task = self._progress.tasks[0] if self._progress.tasks else None
        if PASS.search(text):
            self._pass = text.removesuffix(" ...")
        if text in ROW_PHASES or task is None:
            if self._phase_since is None:
                self._phase_since = time.monotonic()
            text = self._pass or text
            if self._total is not None and self._rows >= self._total:
                text = self._all_read()  # every row read: still no bar to fill
            elif task is not None and self._total is not None:
                eta = self._eta(self._rows, self._total, self._seconds_in_row_phases())
                self._progress.update(self._task, total=self._total, eta=eta)
            self._progress.update(self._task, description=text)
            return
        if self._phase_since is not None:  # a step without rows: its time is not reading's
            self._row_seconds += time.monotonic() - self._phase_since
            self._phase_since = None
        self._pulse()
        self._progress.update(self._task, description=text, eta="")

    def _all_read(self) -> str:
        """What the display says once every row is read (the last batches, or a fit's
        iterations, remain)."""
        return f"{self._pass}, every row read" if self._pass else ALL_READ

    def _pulse(self) -> None:
        """The bar pulses (no total): rich's ``update(total=None)`` keeps the total, and the
        bar stood full while a compile or the last batches ran."""
        self._progress.tasks[0].total = None

    def __exit__(self, *exc_info):
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            self._closed = True
            if self._started:
                self._progress.stop()
        return False
