"""Outputs are never replaced silently (``ope_cli.outputs``, SPEC 12)."""

from __future__ import annotations

import pytest

from ope_cli.errors import UsageError
from ope_cli.outputs import refuse_existing


def test_the_first_existing_output_is_refused_unless_overwrite(tmp_path):
    new, kept, folder = tmp_path / "new.json", tmp_path / "kept.npz", tmp_path / "figures"
    kept.write_bytes(b"keep")
    folder.mkdir()
    refuse_existing([new], overwrite=False)  # nothing there: no error
    with pytest.raises(UsageError) as raised:
        refuse_existing([new, kept, folder], overwrite=False)
    assert str(raised.value) == f"{kept}: already exists (pass --overwrite to replace it)"
    with pytest.raises(UsageError, match="already exists \\(a directory\\)"):
        refuse_existing([folder], overwrite=False)
    refuse_existing([kept, folder], overwrite=True)
    assert kept.read_bytes() == b"keep"  # refusing, or allowing, writes nothing


def test_a_dangling_link_counts_as_existing(tmp_path):
    link = tmp_path / "out.npz"
    link.symlink_to(tmp_path / "missing")
    with pytest.raises(UsageError, match="out.npz: already exists"):
        refuse_existing([link], overwrite=False)
