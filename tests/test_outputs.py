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


def test_a_checkpoint_is_written_in_place_and_never_half(tmp_path, monkeypatch):
    """Through a symlink (an --overwrite replaced the link, leaving its file stale), with
    Ctrl-C held; an interrupt lost before it leaves no file the run created."""
    import numpy as np

    from ope_cli import interrupts
    from ope_cli.outputs import write_checkpoint_file

    target = tmp_path / "real.npz"
    target.write_bytes(b"old")
    (tmp_path / "link.npz").symlink_to(target)
    write_checkpoint_file(str(tmp_path / "link.npz"), {"q": np.ones(3)})
    assert (tmp_path / "link.npz").is_symlink()
    assert np.load(target)["q"].tolist() == [1.0, 1.0, 1.0]
    monkeypatch.setattr(interrupts, "_armed", [True])  # raised in a callback, never reported
    with pytest.raises(KeyboardInterrupt):
        write_checkpoint_file(str(tmp_path / "new.npz"), {"q": np.ones(3)})
    assert not (tmp_path / "new.npz").exists()
    monkeypatch.setattr(interrupts, "_armed", [False])
    with pytest.raises(UsageError, match=r"^--out .*/nowhere/q\.npz: cannot write the checkpoint"):
        write_checkpoint_file(str(tmp_path / "nowhere" / "q.npz"), {"q": np.ones(3)})


def test_a_checkpoint_write_that_fails_keeps_the_earlier_file(tmp_path, monkeypatch):
    """A full disk mid-write truncated the earlier checkpoint (--overwrite) or left a
    half file that the next run refused as existing."""
    import errno

    import numpy as np

    from ope_cli.outputs import write_checkpoint_file

    def full_disk(handle, **arrays):
        handle.write(b"PK\x03\x04 half")
        raise OSError(errno.ENOSPC, "No space left on device")

    earlier = tmp_path / "q.npz"
    write_checkpoint_file(str(earlier), {"q": np.ones(2)})
    monkeypatch.setattr(np, "savez", full_disk)
    for path in (earlier, tmp_path / "new.npz"):
        with pytest.raises(UsageError, match=r"cannot write the checkpoint \(No space left"):
            write_checkpoint_file(str(path), {"q": np.zeros(2)})
    monkeypatch.undo()
    assert np.load(earlier)["q"].tolist() == [1.0, 1.0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q.npz"]  # no half, no .partial
