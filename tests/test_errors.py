"""The error types and their one-line messages (``ope_cli.errors``): each type carries the
exit code of SPEC section 1, and the helpers that build or shorten a message."""

from __future__ import annotations

import pytest

from ope_cli.errors import (
    DataError,
    InvalidValueError,
    OpeError,
    PolicyError,
    UsageError,
    first_line,
    summary,
    where,
)


@pytest.mark.parametrize(
    ("error", "code", "kind"),
    [
        (UsageError, 2, "usage error"),
        (DataError, 3, "invalid data"),
        (InvalidValueError, 3, "invalid data"),  # --on-invalid error: still invalid data
        (PolicyError, 4, "invalid policy"),
    ],
)
def test_each_error_type_carries_its_exit_code(error, code, kind):
    assert issubclass(error, OpeError)
    assert (error.exit_code, error.kind) == (code, kind)


def test_where_names_the_file_episode_and_step_given():
    assert where("logs.parquet", 17, 3) == "logs.parquet: episode 17, step 3: "
    assert where("logs.parquet") == "logs.parquet: "
    assert where(episode="a7", step=0) == "episode 'a7', step 0: "  # a string id, quoted
    assert where() == ""


def test_first_line_and_summary_shorten_a_library_error_to_one_line():
    error = ValueError("  shapes (3,) and (4,) differ\n  at line 2\n")
    assert first_line(error) == "shapes (3,) and (4,) differ"
    assert summary(error) == "ValueError: shapes (3,) and (4,) differ"
    assert first_line(KeyError()) == summary(KeyError()) == "KeyError"  # no message
