"""``ope_cli.runtime``: the one writer of jax.config (x64, compilation cache, collectives)."""

from __future__ import annotations

import json
import re
import uuid
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from ope_cli import runtime
from ope_cli.config import BatchingConfig
from ope_cli.data.buckets import window_shapes

PACKAGE = Path(runtime.__file__).resolve().parent
TESTS = Path(__file__).resolve().parent


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
    before = runtime.compilation_cache_directory()
    yield
    runtime.use_compilation_cache_directory(before)


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


def test_use_compilation_cache_directory_sets_it_as_given(tmp_path, restore_cache):
    runtime.use_compilation_cache_directory(str(tmp_path))
    assert runtime.compilation_cache_directory() == str(tmp_path)
    runtime.use_compilation_cache_directory(None)
    assert runtime.compilation_cache_directory() is None


def test_persist_compilations_keeps_every_compilation_there(tmp_path, restore_cache):
    """The suite's own cache (``in_process_cache``) and the command's both keep even the
    quickest compilation: most of a test run's are a tenth of a second."""
    runtime.persist_compilations(str(tmp_path))
    assert runtime.compilation_cache_directory() == str(tmp_path)
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 0.0


def test_runtime_is_the_only_module_that_writes_jax_config():
    """Neither the package nor its tests write jax.config but through ``runtime``."""
    sources = [*sorted(PACKAGE.rglob("*.py")), *sorted(TESTS.rglob("*.py"))]
    writers = [
        str(path.relative_to(PACKAGE.parent))
        for path in sources
        if re.search(r"jax\.config\.update\(", path.read_text())
    ]
    assert writers == ["ope_cli/runtime.py"]


def test_compilation_counts_count_xla_compilations():
    x = jnp.arange(7.0)
    before = runtime.compilation_counts()
    salt = float(uuid.uuid4().int % 1_000_003)  # a program never compiled, in any run
    jax.jit(lambda x: jnp.sin(x) * 3.0 + salt)(x)
    done = runtime.compilation_counts() - before
    assert done.requests >= 1 and done.compilations >= 1
    assert done.cache_hits == 0
    assert done.seconds > 0


@pytest.mark.slow
def test_a_second_dataset_compiles_nothing_with_a_warm_cache(tmp_path, ope):
    """Compiled shapes do not depend on the data: once a first dataset has warmed the
    persistent cache, another with other lengths and another size compiles nothing."""
    from datasets import random_checkpoint, random_episodes, save_checkpoint, write_step_layout

    rng = np.random.default_rng(5)
    behavior = random_checkpoint("linear_softmax", rng)
    save_checkpoint(tmp_path / "policy.npz", random_checkpoint("linear_softmax", rng))
    first = random_episodes(rng, 400, behavior=behavior, length_dist="uniform", max_length=60)
    second = random_episodes(rng, 150, behavior=behavior, length_dist="skewed", max_length=60)
    write_step_layout(first, tmp_path / "first.parquet")
    write_step_layout(second, tmp_path / "second.parquet")
    cache = {"OPE_CACHE_DIR": str(tmp_path / "cache")}

    def evaluate(name):
        args = ["evaluate", name, "-p", "policy.npz", "--format", "json", "--gamma", "0.9"]
        done = ope(args, cwd=tmp_path, env=cache)
        assert done.returncode == 0, done
        return json.loads(done.stdout)["runtime"]

    cold, warm = evaluate("first.parquet"), evaluate("second.parquet")
    assert cold["compilations"] >= cold["compiles"] >= 1 and cold["cache_hits"] == 0
    assert warm["compilations"] == 0, warm
    assert warm["compiles"] == 0  # the traced kernels are kept too: nothing is traced
    assert warm["cache_hits"] >= 1


@pytest.mark.slow  # three ope processes
def test_kernels_compiled_from_the_persistent_cache_are_not_kept(tmp_path, ope):
    """An executable XLA:CPU loaded from the persistent cache serialises incompletely (its
    copy fails at the first call), so a kept kernel must come from a fresh compilation:
    with ``kernels/`` deleted and the persistent cache warm, runs stay correct and keep
    nothing; the first run keeps one kernel per window shape and one per lane count."""
    from datasets import random_checkpoint, random_episodes, save_checkpoint, write_step_layout

    rng = np.random.default_rng(6)
    behavior = random_checkpoint("linear_softmax", rng)
    save_checkpoint(tmp_path / "policy.npz", random_checkpoint("linear_softmax", rng))
    episodes = random_episodes(rng, 100, behavior=behavior, length_dist="uniform", max_length=7)
    write_step_layout(episodes, tmp_path / "logs.parquet")
    cache = tmp_path / "cache"

    def evaluate():
        args = ["evaluate", "logs.parquet", "-p", "policy.npz", "--format", "json"]
        done = ope(args, cwd=tmp_path, env={"OPE_CACHE_DIR": str(cache)})
        assert done.returncode == 0, done
        return json.loads(done.stdout)

    first = evaluate()
    kept = sorted((cache / "kernels").glob("*.bin"))
    # an advance kernel per window shape of the catalogue (the shapes this data did not need
    # too, for the next data), and one finish kernel (the carry's lanes are fixed)
    assert len(kept) == len(window_shapes(BatchingConfig())) + 1
    assert first["runtime"]["compiles"] == len(kept)
    for path in kept:
        path.unlink()
    again, third = evaluate(), evaluate()
    assert again["runtime"]["cache_hits"] >= 1 and again["runtime"]["compilations"] == 0
    assert not list((cache / "kernels").glob("*.bin"))
    for run in (again, third):
        assert run["results"][0]["estimates"] == first["results"][0]["estimates"]
