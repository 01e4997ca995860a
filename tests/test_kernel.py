"""The kernel's reduction (ope_cli/estimators/batch.py, run by ope_cli/kernel.py): vmapped
per-episode terms against a per-episode loop, padded against unpadded batches, jit against
eager, and one trace per bucket shape however many episode lengths the data has."""

from __future__ import annotations

import jax

jax.config.update("jax_enable_x64", True)

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from datasets import (  # noqa: E402
    perturb_checkpoint,
    random_checkpoint,
    random_episodes,
    save_checkpoint,
    write_step_layout,
)

from ope_cli import stats  # noqa: E402
from ope_cli.estimators.base import Episode  # noqa: E402
from ope_cli.estimators.batch import (  # noqa: E402
    WeightedBatch,
    batch_statistics,
    episode_terms,
    log_weights,
)

K = 4
FOUR = ("is", "wis", "pdis", "wpdis")


def random_batch(rng, lengths, rows=None, steps=None, garbage=np.nan):
    """Plain [B, T] arrays of episodes with ``lengths``, padded to rows x steps with
    ``garbage`` on every padded cell."""
    rows, steps = rows or len(lengths), steps or max(lengths)
    log_target, log_behavior, reward = (np.full((rows, steps), garbage) for _ in range(3))
    step_mask = np.zeros((rows, steps), bool)
    for i, t in enumerate(lengths):
        log_behavior[i, :t] = np.log(rng.uniform(0.1, 1.0, t))
        log_target[i, :t] = log_behavior[i, :t] + rng.normal(0, 0.4, t)
        reward[i, :t] = rng.normal(1, 1, t)
        step_mask[i, :t] = True
    group = np.arange(rows) % K
    return log_target, log_behavior, reward, step_mask, np.arange(rows) < len(lengths), group


def sub_batch(arrays, rows, steps):
    """The first ``rows`` episodes and ``steps`` steps of ``random_batch`` arrays."""
    log_target, log_behavior, reward, step_mask, episode_mask, group = arrays
    cut = (slice(0, rows), slice(0, steps))
    return (
        log_target[cut],
        log_behavior[cut],
        reward[cut],
        step_mask[cut],
        episode_mask[:rows],
        group[:rows],
    )


def statistics(arrays, gamma=0.9):
    log_target, log_behavior, reward, step_mask, episode_mask, group = (
        jnp.asarray(a) for a in arrays
    )
    batch = WeightedBatch(
        log_weights(log_target, log_behavior, step_mask),
        reward,
        step_mask,
        episode_mask,
        group.astype(jnp.int32),
        jnp.zeros((reward.shape[0], 0)),
    )
    return batch_statistics(batch, jnp.asarray(gamma), K, estimators=FOUR)


jitted = jax.jit(statistics)


def finalized(accumulator, max_length, gamma=0.9):
    estimates, diagnostics = stats.finalize(accumulator, gamma, max_length, 0.95)
    return {name: (e.value, e.stderr) for name, e in estimates.items()}, diagnostics


def assert_same_estimates(a, b, rel=1e-12):
    (estimates_a, diagnostics_a), (estimates_b, diagnostics_b) = a, b
    for name in estimates_a:
        assert estimates_b[name] == pytest.approx(estimates_a[name], rel=rel, abs=1e-15), name
    for field in ("ess", "mean_weight", "max_weight", "max_weight_share"):
        assert getattr(diagnostics_b, field) == pytest.approx(
            getattr(diagnostics_a, field), rel=rel
        ), field


def test_vmapped_terms_equal_a_per_episode_loop():
    rng = np.random.default_rng(0)
    arrays = random_batch(rng, [3, 7, 1, 5], steps=8, garbage=0.0)
    log_target, log_behavior, reward, step_mask, _, _ = arrays
    log_w = np.asarray(log_weights(log_target, log_behavior, step_mask))
    discount = 0.9 ** np.arange(8)
    ret = reward @ discount
    scales = {"trajectory": jnp.asarray(log_w[:, -1].max()), "decision": jnp.asarray(log_w.max())}
    batch = Episode(log_w, reward, discount, step_mask, ret, {}, scales)
    vmapped = episode_terms(jax.tree.map(jnp.asarray, batch), FOUR)
    from ope_cli.estimators import get
    from ope_cli.estimators.base import core_terms

    for i in range(4):
        one = Episode(log_w[i], reward[i], discount, step_mask[i], ret[i], {}, scales)
        looped = core_terms(jax.tree.map(jnp.asarray, one))
        for name in FOUR:
            looped.update(get(name).terms(jax.tree.map(jnp.asarray, one)))
        for name, value in looped.items():
            np.testing.assert_allclose(vmapped[name][i], value, rtol=1e-14, err_msg=name)


def test_one_batch_equals_one_batch_per_episode_merged():
    rng = np.random.default_rng(1)
    lengths = [int(t) for t in rng.integers(1, 12, size=9)]
    arrays = random_batch(rng, lengths, rows=9, steps=12)
    whole = stats.merge(stats.init(K), stats.from_batch(jitted(arrays)))
    parts = stats.init(K)
    for i, t in enumerate(lengths):
        one = tuple(a[i : i + 1, :t] if a.ndim == 2 else a[i : i + 1] for a in arrays)
        parts = stats.merge(parts, stats.from_batch(jitted(one)))
    assert_same_estimates(finalized(whole, 11), finalized(parts, 11))


def test_padding_rows_and_steps_change_nothing():
    rng = np.random.default_rng(2)
    lengths = [4, 9, 2, 9, 6]
    padded = random_batch(rng, lengths, rows=8, steps=16)  # NaN on every padded cell
    tight = sub_batch(padded, 5, 9)
    a = stats.from_batch(jitted(padded))
    b = stats.from_batch(jitted(tight))
    assert_same_estimates(finalized(a, 9), finalized(b, 9))
    # The sums of a longer bucket past the longest episode are the ended-episode values.
    np.testing.assert_allclose(stats.extend(b, 16).step_sums["w_t"], a.step_sums["w_t"], rtol=1e-12)


def test_jit_equals_eager():
    rng = np.random.default_rng(3)
    arrays = random_batch(rng, [2, 5, 3], rows=4, steps=6)
    eager = jax.tree.map(np.asarray, statistics(arrays))
    compiled = jax.tree.map(np.asarray, jitted(arrays))
    for x, y in zip(jax.tree.leaves(eager), jax.tree.leaves(compiled), strict=True):
        np.testing.assert_allclose(x, y, rtol=1e-12)


def _many_lengths_case(tmp):
    rng = np.random.default_rng(4)
    behavior = random_checkpoint("tabular", rng)
    episodes = random_episodes(rng, 300, behavior=behavior, max_length=60)
    path = save_checkpoint(tmp / "p.npz", perturb_checkpoint(behavior, rng, 0.2))
    return write_step_layout(episodes, tmp / "logs.parquet"), path


def test_one_trace_per_bucket_shape_over_many_lengths(tmp_path):
    from ope_cli.config import BatchingConfig, EvaluationConfig
    from ope_cli.pipeline import evaluate

    data, path = _many_lengths_case(tmp_path)
    config = EvaluationConfig(
        data=str(data),
        policies=(str(path),),
        gamma=0.95,
        batching=BatchingConfig(batch_steps=256, read_rows=500),
    )
    first = evaluate(config)
    assert len({length for _, length in first.batch_shapes}) > 3  # many buckets
    assert first.compiles <= len(first.batch_shapes)
    again = evaluate(config)
    assert again.compiles == 0
    assert again.results[0].estimates == first.results[0].estimates


def test_every_configuration_is_exported_once_for_all_shapes(tmp_path, ope_in_process):
    """The kernel is traced once per configuration at symbolic [B, T] (jax.export) and
    compiled per shape from that, for every option that changes what it computes: the
    Q-based estimators, a behavior checkpoint, bootstrap counts, the betting histogram."""
    from ope_cli import kernel_cache

    out = tmp_path / "chain"
    assert ope_in_process(["generate", "chain", str(out), "--episodes", "60"]).returncode == 0
    policy, q = out / "policies" / "eval_0.npz", out / "q" / "eval_0.npz"
    common = ["evaluate", str(out / "logs.parquet"), "-p", str(policy), "--format", "json"]
    common += ["--min-bucket", "64"]  # few shapes: each configuration compiles them
    runs = {
        "q": ["--q", str(q)],
        "behavior": ["--behavior", str(out / "behavior.npz")],
        "bootstrap": ["--ci", "bootstrap-t", "--bootstrap-samples", "20"],
        "betting": ["--ci", "betting", "--gamma", "0.95"],
    }
    for name, options in runs.items():
        kernel_cache._EXPORTED.clear()  # earlier tests in this process may have exported it
        run = ope_in_process([*common, *options])
        assert run.returncode == 0, run
        (exported,) = kernel_cache._EXPORTED.values()  # one configuration, however many shapes
        assert exported is not None, name


def test_exported_kernel_equals_the_kernel_traced_per_shape(tmp_path):
    """The kernel compiled from its symbolic export and the one traced at the batch's
    concrete shape give the same statistics, bit for bit."""
    from ope_cli import kernel
    from ope_cli.config import EvaluationConfig
    from ope_cli.pipeline import stream

    data, path = _many_lengths_case(tmp_path)
    config = EvaluationConfig(data=str(data), policies=(str(path),), gamma=0.95)
    batches = stream(config, 1, None, (0, 1))
    (group,) = kernel.group_policies(batches.policies)
    one = kernel.Kernel(group, 0.95, K, np.float64, None, num_replicates=8)
    for batch in list(batches)[:3]:
        exported = jax.device_get(one(batch))
        args, static = one.arguments(batch)
        traced = jax.device_get(kernel._kernel(*args, **static))
        jax.tree.map(np.testing.assert_array_equal, exported, traced)
