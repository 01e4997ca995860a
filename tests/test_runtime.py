"""``ope_cli.runtime``: the one writer of jax.config (x64, compilation cache, collectives)."""

from __future__ import annotations

import re
from pathlib import Path

import jax
import jax.numpy as jnp
import pytest

from ope_cli import runtime

PACKAGE = Path(runtime.__file__).resolve().parent


def test_configure_turns_on_64_bit_types():
    runtime.configure()
    assert jax.config.jax_enable_x64
    assert jnp.zeros(1, jnp.float64).dtype == jnp.float64
    assert jnp.arange(3).dtype == jnp.int64


def test_configure_is_idempotent():
    first = runtime.configure()
    assert runtime.configure() == first


def test_cache_directory_follows_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("OPE_CACHE_DIR", str(tmp_path / "mine"))
    assert runtime.cache_directory() == str(tmp_path / "mine")
    for off in ("off", "0", "None", "FALSE"):
        monkeypatch.setenv("OPE_CACHE_DIR", off)
        assert runtime.cache_directory() is None
    monkeypatch.delenv("OPE_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert runtime.cache_directory() == str(tmp_path / "xdg" / "ope" / "xla")


@pytest.fixture
def restore_cache():
    """Tests below point the cache elsewhere; the session's cache comes back after them."""
    before = jax.config.jax_compilation_cache_dir
    yield
    jax.config.update("jax_compilation_cache_dir", before)


def test_enable_compilation_cache_creates_and_sets_the_directory(
    monkeypatch, tmp_path, restore_cache
):
    target = tmp_path / "cache" / "xla"
    monkeypatch.setenv("OPE_CACHE_DIR", str(target))
    assert runtime.enable_compilation_cache() == str(target)
    assert target.is_dir()
    assert jax.config.jax_compilation_cache_dir == str(target)


def test_enable_compilation_cache_off_or_unwritable_changes_nothing(
    monkeypatch, tmp_path, restore_cache
):
    before = jax.config.jax_compilation_cache_dir
    monkeypatch.setenv("OPE_CACHE_DIR", "off")
    assert runtime.enable_compilation_cache() is None
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory\n")
    monkeypatch.setenv("OPE_CACHE_DIR", str(blocker / "xla"))
    assert runtime.enable_compilation_cache() is None  # a read-only home must not stop a run
    assert jax.config.jax_compilation_cache_dir == before


def test_runtime_is_the_only_module_that_writes_jax_config():
    writers = [
        str(path.relative_to(PACKAGE))
        for path in sorted(PACKAGE.rglob("*.py"))
        if re.search(r"jax\.config\.update\(", path.read_text())
    ]
    assert writers == ["runtime.py"]
