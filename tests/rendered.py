"""An evaluation as ``ope evaluate --format ...`` prints it, for tests whose subject is what
a format shows (a footer, a column) rather than the command line: the Python API's result
written by the command line's own writer. ``test_interface`` checks that ``ope evaluate``
prints exactly this."""

from __future__ import annotations

import contextlib
import io


def shown(evaluation, output: str, rank_by: str | None = None) -> str:
    """``evaluation`` (an EvaluationResult) as ``ope evaluate --format output`` writes it on
    stdout; ``rank_by``: --rank-by (None: not given, its default)."""
    from ope_cli.cli.evaluate import write_result
    from ope_cli.cli.options import OutputFormat

    written = io.StringIO()
    with contextlib.redirect_stdout(written):
        write_result(evaluation, OutputFormat(output), rank_by)
    return written.getvalue()
