"""``ope_cli.estimation.kernel_cache``: kernels compiled once, kept on disk, and called by later
kernels (processes) without tracing, with the same results."""

from __future__ import annotations

import hashlib
import uuid
from pathlib import Path

import jax
import numpy as np
import pytest
from datasets import random_checkpoint, random_episodes, save_checkpoint, write_step_layout

import ope_cli
from ope_cli import runtime
from ope_cli.config import BatchingConfig, EvaluationConfig
from ope_cli.estimation import kernel_cache
from ope_cli.estimation.kernel import Kernel, KernelSettings, group_policies, trace_count
from ope_cli.estimation.pipeline import stream
from ope_cli.models.policies import _mlp_log_prob


@pytest.fixture(scope="module")
def batches(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kernel_cache")
    rng = np.random.default_rng(3)
    behavior = random_checkpoint("linear_softmax", rng)
    episodes = random_episodes(rng, 60, behavior=behavior, max_length=30)
    data = write_step_layout(episodes, tmp / "logs.parquet")
    policy = save_checkpoint(tmp / "policy.npz", random_checkpoint("linear_softmax", rng))
    config = EvaluationConfig(  # few window shapes: each compiles three times
        data=str(data), policies=(str(policy),), gamma=0.9, batching=BatchingConfig(min_bucket=8)
    )
    batch_stream = stream(config, 1, None, (0, 1))
    padded = [(batch, batch_stream.bucketer.width_of(batch)) for batch in batch_stream]
    return padded, group_policies(batch_stream.policies)[0]


def test_the_source_digest_covers_the_whole_package():
    """Kept kernels are keyed by every Python file of ope_cli/, not only of estimation/
    where kernel_cache.py lives."""
    root = Path(ope_cli.__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    assert kernel_cache.source_digest() == digest.hexdigest()


def _kernel(group):
    return Kernel(group, KernelSettings(0.9, 8, np.float64))


def _outputs(group, padded):
    kernel = _kernel(group)
    return [jax.device_get(kernel(batch, width)) for batch, width in padded]


def test_kept_kernels_are_called_without_tracing(batches, tmp_path, monkeypatch):
    padded, group = batches
    monkeypatch.setenv("OPE_CACHE_DIR", "off")
    expected = _outputs(group, padded)  # traced as usual: no cache, nothing kept
    monkeypatch.setenv("OPE_CACHE_DIR", str(tmp_path))
    # keys of a source never compiled before, as in an edited checkout: the suite's own
    # persistent cache (``in_process_cache``) may hold this code's kernels from a past run,
    # and an executable loaded from it is not kept
    fresh = uuid.uuid4().hex
    monkeypatch.setattr(kernel_cache, "source_digest", lambda: fresh)
    jax.clear_caches()
    before = trace_count()
    first = _outputs(group, padded)
    windows = {(batch.shape[0], width) for batch, width in padded}
    lanes = {batch.shape[0] for batch, _ in padded}
    kernels = len(windows) + len(lanes)  # advance per window shape, finish per lane count
    assert trace_count() - before == kernels
    assert len(list((tmp_path / "kernels").glob("*.bin"))) == kernels
    kernel_cache.clear_caches()
    before, counts = trace_count(), runtime.compilation_counts()
    again = _outputs(group, padded)  # a new kernel, as in a new process: read from disk
    assert trace_count() == before  # not traced
    loaded = runtime.compilation_counts() - counts
    assert loaded.cache_hits == loaded.requests == kernels  # no XLA compilation
    for one, two, three in zip(expected, first, again, strict=True):
        jax.tree.map(np.testing.assert_array_equal, one, two)
        jax.tree.map(np.testing.assert_array_equal, one, three)


def test_key_names_code_shapes_and_options(batches):
    padded, group = batches
    kernel = _kernel(group)
    batch, width = padded[0]
    static = {"kernel": "_advance_kernel", **kernel.static._asdict()}
    code = kernel._estimator_code()
    (start, window), *_ = kernel.windows(batch, width)
    args = (kernel.params, None, None, window, np.int32(start), kernel.gamma, kernel.seed)
    key = kernel_cache.kernel_key(args, static, code)
    assert key == kernel_cache.kernel_key(args, static, code) and len(key) == 64
    assert kernel_cache.kernel_key(args, {**static, "num_groups": 16}, code) != key
    assert kernel_cache.kernel_key(args, {**static, "kernel": "_finish_kernel"}, code) != key
    wider = (*args[:3], window._replace(group=window.group.astype(np.int64)), *args[4:])
    assert kernel_cache.kernel_key(wider, static, code) != key

    def user_log_prob(params, observation, action):  # user code: never kept
        return 0.0

    assert kernel_cache.kernel_key(args, {**static, "log_prob": user_log_prob}, code) is None
    relu, tanh = _mlp_log_prob("relu"), _mlp_log_prob("tanh")  # closures of one name
    assert kernel_cache.kernel_key(args, {**static, "log_prob": relu}, code) is None
    assert kernel_cache.kernel_key(args, {**static, "behavior_log_prob": tanh}, code) is None
    assert kernel_cache.kernel_key(args, static, [*code, user_log_prob]) is None


def test_nothing_is_kept_without_a_compilation_cache(monkeypatch):
    monkeypatch.setenv("OPE_CACHE_DIR", "off")
    assert kernel_cache.directory() is None
    assert kernel_cache.load_or_compile(None, "0" * 64, jax.local_devices()) is None


def test_source_digest_is_stable():
    assert kernel_cache.source_digest() == kernel_cache.source_digest()
    assert len(kernel_cache.source_digest()) == 64
