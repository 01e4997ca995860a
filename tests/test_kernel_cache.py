"""``ope_cli.kernel_cache``: kernels compiled once, kept on disk, and called by later
kernels (processes) without tracing, with the same results."""

from __future__ import annotations

import jax
import numpy as np
import pytest
from datasets import random_checkpoint, random_episodes, save_checkpoint, write_step_layout

from ope_cli import kernel_cache, runtime
from ope_cli.config import BatchingConfig, EvaluationConfig
from ope_cli.estimators import get, names
from ope_cli.kernel import Kernel, group_policies, trace_count
from ope_cli.pipeline import stream
from ope_cli.policies import _mlp_log_prob


@pytest.fixture(scope="module")
def batches(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("kernel_cache")
    rng = np.random.default_rng(3)
    behavior = random_checkpoint("linear_softmax", rng)
    episodes = random_episodes(rng, 60, behavior=behavior, max_length=30)
    data = write_step_layout(episodes, tmp / "logs.parquet")
    policy = save_checkpoint(tmp / "policy.npz", random_checkpoint("linear_softmax", rng))
    config = EvaluationConfig(  # few shapes (buckets 1 and 64), as each compiles three times
        data=str(data), policies=(str(policy),), gamma=0.9, batching=BatchingConfig(min_bucket=64)
    )
    batch_stream = stream(config, 1, None, (0, 1))
    return list(batch_stream), group_policies(batch_stream.policies)[0]


def _kernel(group):
    return Kernel(group, 0.9, 8, np.float64, None)


def _outputs(group, padded):
    kernel = _kernel(group)
    return [jax.device_get(kernel(batch)) for batch in padded]


def test_kept_kernels_are_called_without_tracing(batches, tmp_path, monkeypatch):
    padded, group = batches
    monkeypatch.setenv("OPE_CACHE_DIR", "off")
    expected = _outputs(group, padded)  # traced as usual: no cache, nothing kept
    monkeypatch.setenv("OPE_CACHE_DIR", str(tmp_path))
    jax.clear_caches()
    before = trace_count()
    first = _outputs(group, padded)
    shapes = {batch.shape for batch in padded}
    assert trace_count() - before == len(shapes)  # compiled: traced once per shape
    assert len(list((tmp_path / "kernels").glob("*.bin"))) == len(shapes)
    kernel_cache.clear_caches()
    before, counts = trace_count(), runtime.compilation_counts()
    again = _outputs(group, padded)  # a new kernel, as in a new process: read from disk
    assert trace_count() == before
    assert not kernel_cache._EXPORTED  # not even traced once at symbolic shapes
    loaded = runtime.compilation_counts() - counts
    assert loaded.cache_hits == loaded.requests == len(shapes)  # no XLA compilation
    for one, two, three in zip(expected, first, again, strict=True):
        jax.tree.map(np.testing.assert_array_equal, one, two)
        jax.tree.map(np.testing.assert_array_equal, one, three)


def test_key_names_code_shapes_and_options(batches):
    padded, group = batches
    kernel = _kernel(group)
    static = dict(
        log_prob=group.head.log_prob,
        behavior_log_prob=None,
        num_groups=8,
        num_replicates=0,
        dtype="float64",
        mesh=None,
        estimators=names(),
    )
    code = [get(name).terms for name in names()]
    args = (kernel.params, None, padded[0], kernel.gamma, kernel.seed, None)
    key = kernel_cache.kernel_key(args, static, code)
    assert key == kernel_cache.kernel_key(args, static, code) and len(key) == 64
    assert kernel_cache.kernel_key(args, {**static, "num_groups": 16}, code) != key
    wider = (*args[:2], padded[0]._replace(group=padded[0].group.astype(np.int64)), *args[3:])
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
    assert kernel_cache.load_or_compile(None, "0" * 64) is None


def test_source_digest_is_stable():
    assert kernel_cache.source_digest() == kernel_cache.source_digest()
    assert len(kernel_cache.source_digest()) == 64


def _total(x, *, scale):
    return x.sum() * scale


def _needs_a_concrete_length(x, *, scale):
    return jax.numpy.zeros(int(x.shape[0])) * scale  # int() of a symbolic size fails


def test_exported_once_then_compiled_per_shape():
    """``exported`` traces once at symbolic shapes; each new concrete shape is one
    compilation (counted), a shape seen before none; code that needs concrete shapes is
    not exported (None: its callers trace it per shape)."""
    (size,) = jax.export.symbolic_shape("B")
    specs = (jax.ShapeDtypeStruct((size,), np.float64),)
    call = kernel_cache.exported(_total, {"scale": 2.0}, specs)
    assert call is kernel_cache.exported(_total, {"scale": 2.0}, specs)  # kept, not redone
    assert call is not kernel_cache.exported(_total, {"scale": 3.0}, specs)
    before = kernel_cache.compilation_count()
    jitted = kernel_cache.jitted(call)
    for length in (3, 5, 3):
        assert float(jitted(np.ones(length))) == 2.0 * length
    assert kernel_cache.compilation_count() - before == 2
    assert kernel_cache.exported(_needs_a_concrete_length, {"scale": 2.0}, specs) is None
