"""The progress display of ``ope evaluate`` on stderr."""

from __future__ import annotations

import threading
import time

from rich.console import Console

from ope_cli.cli.console import stderr_console


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
        self._reading_since: float | None = None

    def __enter__(self):
        if not self.enabled:
            return None, None
        from rich.progress import (
            BarColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[rows]}"),
            TextColumn("{task.fields[rate]}", style="cyan"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=self.console,
            transient=True,
        )
        self._task = self._progress.add_task("starting", total=None, rows="", rate="")
        self._timer = threading.Timer(self.delay, self._start)
        self._timer.daemon = True
        self._timer.start()
        return self.update, self.status

    def _start(self) -> None:
        with self._lock:
            if not self._closed:
                self._progress.start()
                self._started = True

    def update(self, rows: int, total: int | None) -> None:
        """Rows read so far, of ``total`` (None when unknown)."""
        now = time.monotonic()
        if self._reading_since is None:
            self._reading_since = now
        elapsed = now - self._reading_since
        rate = f"{rows / elapsed:,.0f} rows/s" if rows and elapsed > 0 else ""  # average so far
        self._progress.update(
            self._task,
            completed=rows,
            total=total,
            description="reading",
            rows=f"{rows:,}" + (f"/{total:,}" if total else "") + " rows",
            rate=rate,
        )

    def status(self, text: str) -> None:
        """A step without row progress, e.g. the first compilation of a batch shape."""
        self._progress.update(self._task, description=text)

    def __exit__(self, *exc_info):
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            self._closed = True
            if self._started:
                self._progress.stop()
        return False
