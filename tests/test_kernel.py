"""The kernel's reduction (ope_cli/estimation/estimators/reduction.py, run by
ope_cli/estimation/kernel.py): vmapped per-episode carries against a per-episode loop, padded
against unpadded batches, jit against eager, a batch walked in windows against the whole batch
at once, and one compilation per window shape however many episode lengths the data has."""

from __future__ import annotations

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from datasets import (
    perturb_checkpoint,
    random_checkpoint,
    random_episodes,
    save_checkpoint,
    write_step_layout,
)
from reference import discounts

from ope_cli.estimation import stats
from ope_cli.estimation.estimators.reduction import (
    WeightedBatch,
    WeightedWindow,
    _advance_one,
    advance_window,
    batch_statistics,
    init_carry,
    log_ratios,
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
        log_ratios(log_target, log_behavior, step_mask),
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


def test_vmapped_carries_equal_a_per_episode_loop():
    rng = np.random.default_rng(0)
    arrays = random_batch(rng, [3, 7, 1, 5], steps=8, garbage=0.0)
    log_target, log_behavior, reward, step_mask, _, group = arrays
    log_ratio = np.asarray(log_ratios(log_target, log_behavior, step_mask))
    discount = 0.9 ** np.arange(8)
    first = step_mask & (np.arange(8) == 0)
    carry = init_carry(jnp.zeros(4), FOUR, False)
    window = WeightedWindow(
        jnp.asarray(log_ratio),
        jnp.asarray(reward),
        jnp.asarray(step_mask),
        jnp.ones(4, bool),
        jnp.asarray(group, jnp.int32),
        jnp.zeros((4, 0)),
    )
    # jitted: op by op, the window's few dozen operations each compile on their own
    vmapped, _ = jax.jit(advance_window, static_argnums=(3, 4))(carry, window, 0.9, K, FOUR)
    advance_one = jax.jit(_advance_one, static_argnums=(2, 3))  # one compilation, four calls
    for i in range(4):
        one = init_carry(jnp.zeros(()), FOUR, False)
        steps = (log_ratio[i], reward[i], discounts(discount), step_mask[i], first[i], {})
        looped, _, _ = advance_one(one, jax.tree.map(jnp.asarray, steps), FOUR, None)
        for a, b in zip(jax.tree.leaves(looped), jax.tree.leaves(vmapped), strict=True):
            np.testing.assert_allclose(np.asarray(b)[i], np.asarray(a), rtol=1e-14)


@pytest.mark.slow  # a property: invariance to the batching
def test_one_batch_equals_one_batch_per_episode_merged():
    """Each episode's one-row batch keeps the whole batch's width (NaN after the episode's
    end), so that the nine batches compile one shape, not one per length."""
    rng = np.random.default_rng(1)
    lengths = [int(t) for t in rng.integers(1, 12, size=9)]
    arrays = random_batch(rng, lengths, rows=9, steps=12)
    whole = stats.merge(stats.init(K), stats.from_batch(jitted(arrays)))
    parts = stats.init(K)
    for i in range(len(lengths)):
        one = tuple(a[i : i + 1] for a in arrays)
        parts = stats.merge(parts, stats.from_batch(jitted(one)))
    assert_same_estimates(finalized(whole, 11), finalized(parts, 11))


@pytest.mark.slow  # a property: invariance to padding
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


def _many_lengths_case(tmp, seed=4, max_length=60):
    rng = np.random.default_rng(seed)
    behavior = random_checkpoint("tabular", rng)
    episodes = random_episodes(rng, 300, behavior=behavior, max_length=max_length)
    path = save_checkpoint(tmp / "p.npz", perturb_checkpoint(behavior, rng, 0.2))
    return write_step_layout(episodes, tmp / f"logs_{seed}.parquet"), path


def test_one_compilation_per_window_shape_over_many_lengths(tmp_path):
    """Any number of episode lengths compiles one advance kernel per window shape and one
    finish kernel; data of other lengths, none."""
    from ope_cli.config import BatchingConfig, EvaluationConfig
    from ope_cli.estimation.pipeline import evaluate

    data, path = _many_lengths_case(tmp_path)
    config = EvaluationConfig(
        data=str(data),
        policies=(str(path),),
        gamma=0.95,
        batching=BatchingConfig(batch_steps=256, read_rows=500),
    )
    first = evaluate(config)
    assert first.runtime.compiles == len(first.runtime.batch_shapes) + 1
    again = evaluate(config)
    assert again.runtime.compiles == 0
    assert again.results[0].estimates == first.results[0].estimates
    other, _ = _many_lengths_case(tmp_path, seed=5, max_length=45)
    assert (
        evaluate(config.__class__(**{**config.__dict__, "data": str(other)})).runtime.compiles == 0
    )


def test_every_configuration_compiles_nothing_for_new_data(tmp_path):
    """For every option that changes what the kernel computes (the Q-based estimators, a
    behavior checkpoint, bootstrap counts, the betting histogram), a second dataset with
    other lengths compiles nothing: the shapes come from the catalogue, not the data."""
    import ope_cli
    from ope_cli.envs.generate import generate

    out = {}
    for name, episodes, seed in (("a", 60, 1), ("b", 45, 2)):
        out[name] = tmp_path / name
        generate("chain", out[name], episodes=episodes, seed=seed)
    runs = {
        "q": {"q": str(out["a"] / "q" / "eval_0.npz")},
        "behavior": {"behavior": str(out["a"] / "behavior.npz")},
        "bootstrap": {"ci": "bootstrap-t", "bootstrap_samples": 40},
        "betting": {"ci": "betting", "gamma": 0.95},
    }
    policy = out["a"] / "policies" / "eval_0.npz"
    for name, options in runs.items():
        for data, expect_none in (("a", False), ("b", True)):
            result = ope_cli.evaluate(out[data] / "logs.parquet", policies=policy, **options)
            if expect_none:
                assert result.runtime.compiles == 0, name


def test_assemble_lays_windows_side_by_side_and_shifts_lag_sums():
    """``assemble``: each window's per-step sums [D, P, K, C] at its offset in [D, P, K, T];
    a lag-1 sum (column c of a window holds its step c - 1) one step earlier, the batch's
    last column 0; windows that do not follow one another are refused, so no column is
    left unwritten."""
    from ope_cli.estimation.estimators.reduction import ScalarStatistics, StepStatistics
    from ope_cli.estimation.kernel import KernelOutput, assemble

    rng = np.random.default_rng(0)
    width, length, shape = 4, 12, (1, 2, 3)
    scales, sums, lagged = (rng.normal(size=(*shape, length)) for _ in range(3))

    def window(start: int) -> tuple[int, StepStatistics]:
        columns = slice(start, start + width)
        shifted = np.concatenate([np.zeros((*shape, 1)), lagged], -1)[..., columns]
        return start, StepStatistics(
            step_log_scales={"w": scales[..., columns]},
            step_sums={"w_t": sums[..., columns], "wv_next_t": shifted},
            replicate_step_log_scales={},
            replicate_step_sums={},
        )

    scalar = ScalarStatistics({}, {}, {}, {}, np.zeros(1), np.zeros(1))
    windows = [window(start) for start in range(0, length, width)]
    out = assemble(KernelOutput(windows, scalar, None, length))

    def stacked(rows):  # K rows [D, P, T] -> [D, P, K, T]
        return np.stack(rows, axis=-2)

    np.testing.assert_array_equal(stacked(out.step_log_scales["w"]), scales)
    np.testing.assert_array_equal(stacked(out.step_sums["w_t"]), sums)
    np.testing.assert_array_equal(stacked(out.step_sums["wv_next_t"])[..., :-1], lagged[..., :-1])
    np.testing.assert_array_equal(stacked(out.step_sums["wv_next_t"])[..., -1], 0.0)
    with pytest.raises(ValueError, match="does not follow"):
        assemble(KernelOutput([windows[0], windows[2]], scalar, None, length))

    # With each group's longest episode, a group's rows run to the end of the window after
    # it (the one holding its last lag-1 value); a group without episodes has none.
    lengths = np.array([4, 0, 12])
    out = assemble(KernelOutput(windows, scalar, None, length, group_lengths=lengths))
    for group, kept in enumerate([8, 0, 12]):
        np.testing.assert_array_equal(out.step_log_scales["w"][group], scales[..., group, :kept])
        np.testing.assert_array_equal(out.step_sums["w_t"][group], sums[..., group, :kept])
        lag = out.step_sums["wv_next_t"][group]
        assert lag.shape == (1, 2, kept)
        np.testing.assert_array_equal(lag[..., :-1], lagged[..., group, : max(kept - 1, 0)])
        np.testing.assert_array_equal(lag[..., -1:], 0.0)
    # windows already cut to the groups they extend (on the host) assemble the same
    few = [
        (start, w._replace(step_log_scales={"w": w.step_log_scales["w"][..., [2], :]}))
        if start >= 8
        else (start, w)
        for start, w in windows
    ]
    few = [
        (start, w._replace(step_sums={k: v[..., [2], :] for k, v in w.step_sums.items()}))
        if start >= 8
        else (start, w)
        for start, w in few
    ]
    again = assemble(KernelOutput(few, scalar, None, length, group_lengths=lengths))
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(again), strict=True):
        np.testing.assert_array_equal(a, b)


# a property: widths 1 and 3 with the slow tests, 8 in the quick loop
@pytest.mark.parametrize(
    "width", [pytest.param(1, marks=pytest.mark.slow), pytest.param(3, marks=pytest.mark.slow), 8]
)
def test_a_batch_walked_in_windows_equals_the_whole_batch(tmp_path, width):
    """The statistics of a batch walked in windows of any width are those of the batch
    walked as one window, with bootstrap replicates."""
    from ope_cli.config import EvaluationConfig
    from ope_cli.data.buckets import PaddedBatch
    from ope_cli.estimation import kernel
    from ope_cli.estimation.pipeline import stream

    data, path = _many_lengths_case(tmp_path)
    config = EvaluationConfig(data=str(data), policies=(str(path),), gamma=0.95)
    batches = stream(config, 1, None, (0, 1))
    (group,) = kernel.group_policies(batches.policies)
    one = kernel.Kernel(group, kernel.KernelSettings(0.95, K, np.float64, num_replicates=8))
    for batch in list(batches)[:3]:
        length = -(-batch.shape[1] // width) * width  # whole windows of padding after it

        def longer(x, length=length):
            return np.pad(x, [(0, 0), (0, length - x.shape[1])] + [(0, 0)] * (x.ndim - 2))

        grown = PaddedBatch(
            *(jax.tree.map(longer, part) if i < 2 else part for i, part in enumerate(batch))
        )
        whole, windowed = (
            stats.dense_groups(stats.from_batch(kernel.batch_statistics_of(one, grown, w)), length)
            for w in (None, width)
        )  # a group's rows end after its window: lengthened by their ended-episode values
        for a, b in zip(jax.tree.leaves(whole), jax.tree.leaves(windowed), strict=True):
            np.testing.assert_allclose(b, a, rtol=1e-9)  # the same numbers to rounding


def test_a_long_episode_costs_its_own_group_row(tmp_path):
    """A batch walked in many windows: each window that extends few groups' rows comes to
    the host as those rows while later ones run, and a group's assembled rows end after
    the window that follows its longest episode (one long episode: one long row), equal to
    the batch walked as one window once lengthened by the ended-episode values."""
    from ope_cli.config import EvaluationConfig
    from ope_cli.data.buckets import pad
    from ope_cli.data.episodes import concat_chunks
    from ope_cli.estimation import kernel
    from ope_cli.estimation.pipeline import stream

    rng = np.random.default_rng(8)
    behavior = random_checkpoint("tabular", rng)
    episodes = [
        {
            **random_episodes(
                rng, 1, behavior=behavior, length_dist="fixed", median_length=n, max_length=n
            )[0],
            "episode_id": i,
        }
        for i, n in enumerate([200, 3, 17, 5])
    ]
    path = save_checkpoint(tmp_path / "p.npz", perturb_checkpoint(behavior, rng, 0.2))
    data = write_step_layout(episodes, tmp_path / "logs.parquet")
    batches = stream(EvaluationConfig(data=str(data), policies=(str(path),), gamma=0.95))
    chunk = concat_chunks(list(batches.reread_chunks()))
    assert sorted(chunk.lengths.tolist()) == [3, 5, 17, 200]
    batch = pad(chunk, 208, 4)._replace(group=np.arange(4, dtype=np.int32))  # one each
    (group,) = kernel.group_policies(batches.policies)
    one = kernel.Kernel(group, kernel.KernelSettings(0.95, 8, np.float64))
    lengths = batch.step_mask.sum(axis=1)
    output = one(batch, 16)  # 13 windows
    expected = np.zeros(8, np.int64)
    expected[:4] = np.where(2 * lengths > 208, 208, lengths)  # past half: the whole batch
    assert output.group_lengths.tolist() == expected.tolist()
    on_host = [w for _, w in output.windows if isinstance(w.step_sums["w_t"], np.ndarray)]
    assert len(on_host) == 13 - 2 - 1  # all but the first and the two in flight
    assert [w.step_sums["w_t"].shape[-2] for w in on_host] == [2] + [1] * 9
    assembled = stats.from_batch(kernel.assemble(jax.device_get(output)))
    kept = np.where(expected > 0, np.minimum((expected // 16 + 1) * 16, 208), 0)
    assert stats.row_lengths(assembled).tolist() == kept.tolist()
    whole = stats.from_batch(kernel.batch_statistics_of(one, batch))  # one window of 208
    for field in ("step_log_scales", "step_sums"):
        a = getattr(stats.dense_groups(assembled, 208), field)
        b = getattr(stats.dense_groups(whole, 208), field)
        for name in b:
            np.testing.assert_allclose(a[name], b[name], rtol=1e-12, err_msg=name)


def one_episode_batch(tmp_path, seed: int):
    """(a one-lane [1, 160] batch of one 150-step episode, the policy group evaluating it)."""
    from ope_cli.config import EvaluationConfig
    from ope_cli.data.buckets import pad
    from ope_cli.data.episodes import concat_chunks
    from ope_cli.estimation import kernel
    from ope_cli.estimation.pipeline import stream

    rng = np.random.default_rng(seed)
    behavior = random_checkpoint("tabular", rng)
    episodes = random_episodes(
        rng, 1, behavior=behavior, length_dist="fixed", median_length=150, max_length=150
    )
    path = save_checkpoint(tmp_path / "p.npz", perturb_checkpoint(behavior, rng, 0.2))
    data = write_step_layout(episodes, tmp_path / "logs.parquet")
    batches = stream(EvaluationConfig(data=str(data), policies=(str(path),), gamma=0.95))
    (group,) = kernel.group_policies(batches.policies)
    return pad(concat_chunks(list(batches.reread_chunks())), 160, 1), group


def test_a_one_lane_window_makes_only_its_groups_row(tmp_path):
    """A one-lane batch's windows make and send its episode's group's per-step row alone
    ([1, C], not [K, C]); assembled, its statistics are bit for bit those of every group's
    rows, also walked as the bench walks it (no group lengths given)."""
    from ope_cli.estimation import kernel

    batch, group = one_episode_batch(tmp_path, 10)
    batch = batch._replace(group=np.array([3], np.int32))  # not row 0: a misplaced row shows
    settings = kernel.KernelSettings(0.95, 8, np.float64, num_replicates=3)
    own, every = kernel.Kernel(group, settings), kernel.Kernel(group, settings)
    every.static = every.static._replace(own_rows=False)
    output = own(batch, 16)
    assert {np.shape(w.step_sums["w_t"])[-2] for _, w in output.windows} == {1}
    assert {np.shape(w.step_sums["w_t"])[-2] for _, w in every(batch, 16).windows} == {1, 8}
    expected = kernel.batch_statistics_of(every, batch, 16)
    walked = own.walk(own.device_windows(batch, 16), own.counts(batch))
    for got in (kernel.assemble(jax.device_get(output)), kernel.assemble(jax.device_get(walked))):
        for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(got), strict=True):
            np.testing.assert_array_equal(b, a)


def test_a_long_episode_joins_its_bootstrap_sums_as_its_windows_come(tmp_path):
    """One long episode alone in its batch, with bootstrap replicates: from the first
    window on, each window that comes to the host puts its [R, C] replicate sums in place
    in the batch's joined arrays (``KernelOutput.joined``) instead of holding them, and the
    assembled statistics equal the batch walked as one window."""
    from ope_cli.estimation import kernel

    batch, group = one_episode_batch(tmp_path, 9)
    one = kernel.Kernel(group, kernel.KernelSettings(0.95, 8, np.float64, num_replicates=6))
    output = one(batch, 16)  # 10 windows, all but the last two joined as they came
    joined = output.joined["replicate_step_sums"]
    assert set(joined) == {"w_t", "wr_t"} and joined["w_t"].written == 8 * 16
    assert [len(w.replicate_step_sums) for _, w in output.windows] == [0] * 8 + [2, 2]
    windowed = stats.from_batch(kernel.assemble(jax.device_get(output)))
    whole = stats.from_batch(kernel.batch_statistics_of(one, batch))  # one window of 160
    for field in ("replicate_step_log_scales", "replicate_step_sums"):
        for name, expected in getattr(whole, field).items():
            got = getattr(windowed, field)[name]
            assert got.shape == expected.shape == (*expected.shape[:-1], 160)
            np.testing.assert_allclose(got, expected, rtol=1e-12, err_msg=name)


def test_faulty_q_counts_count_real_steps_per_policy():
    """Non-finite Q-hat or V-hat is counted per policy on real steps only: a padded cell
    or a filler row's NaN is not the Q function's fault."""
    from ope_cli.estimation.kernel import faulty_q_counts

    step_mask = np.array([[True, True, False], [True, False, False], [False, False, False]])
    batch = SimpleNamespace(step_mask=step_mask, episode_mask=np.array([True, True, False]))
    q = np.zeros((2, 3, 3))
    v = np.zeros((2, 3, 3))
    q[0, 0, 1] = np.nan  # policy 0: a real step
    v[0, 1, 0] = np.inf  # policy 0: another
    q[1, 0, 2] = np.nan  # policy 1: padding
    v[1, 2, 0] = -np.inf  # policy 1: a filler row
    counts = np.asarray(faulty_q_counts({"q_t": q, "v_t": v}, batch))
    np.testing.assert_array_equal(counts, [[2, 0]])
    np.testing.assert_array_equal(np.asarray(faulty_q_counts({}, batch)), [[0]])


def test_q_sizes_are_the_largest_finite_values_of_real_steps():
    """The largest |Q-hat| or |V-hat| per policy, over real steps only, not-finite values
    left to ``faulty_q_counts``: float32 must hold it (the float32_range warning)."""
    from ope_cli.estimation.kernel import q_sizes

    step_mask = np.array([[True, True, False], [True, False, False], [False, False, False]])
    batch = SimpleNamespace(step_mask=step_mask, episode_mask=np.array([True, True, False]))
    q = np.zeros((2, 3, 3))
    v = np.zeros((2, 3, 3))
    q[0, 0, 1], v[0, 1, 0], q[0, 0, 0] = -3e6, 2e6, np.inf  # policy 0: real steps
    v[1, 0, 0], q[1, 0, 2], v[1, 2, 0] = 5.0, -1e9, 1e9  # policy 1: padding, a filler row
    np.testing.assert_array_equal(np.asarray(q_sizes({"q_t": q, "v_t": v}, batch)), [[3e6, 5]])
    np.testing.assert_array_equal(np.asarray(q_sizes({}, batch)), [[0]])


@pytest.mark.parametrize("q_actions", [4, 5])
def test_v_hat_takes_the_probabilities_from_the_policies_logits(q_actions):
    """With the policies' logits (softmax checkpoints), every action's log-probability is
    the one log_prob gives, bit for bit, and its probability exp of it within rounding,
    from the same exponentials; a Q source over more actions than the logits (its own
    n_actions) takes log_prob's path instead."""
    from ope_cli.estimation.kernel import _policy_action_probs
    from ope_cli.models.policies import checkpoint_policy

    rng = np.random.default_rng(8)
    policies = [
        checkpoint_policy("p.npz", random_checkpoint("linear_softmax", rng, obs_dim=3, n_actions=4))
        for _ in range(2)
    ]
    params = {
        key: jnp.asarray(np.stack([p.params[key] for p in policies])) for key in policies[0].params
    }
    observation = jnp.asarray(rng.normal(size=(5, 6, 3)))
    head = policies[0]
    q = SimpleNamespace(n_actions=q_actions)
    shared = SimpleNamespace(q=q, logits=head.logits, log_prob=head.log_prob)
    alone = SimpleNamespace(q=q, logits=None, log_prob=head.log_prob)

    def probs(static):  # jitted, as the kernel runs it (eager, each op dispatched: seconds)
        return jax.jit(lambda p, o: _policy_action_probs(static, p, o, np.float64))

    log_pi, pi = probs(shared)(params, observation)
    expected_log_pi, expected_pi = probs(alone)(params, observation)
    assert log_pi.shape == (2, 5, 6, q_actions)
    np.testing.assert_array_equal(log_pi, expected_log_pi)
    if q_actions == 4:
        np.testing.assert_allclose(pi, expected_pi, rtol=1e-15, atol=0)
    else:
        np.testing.assert_array_equal(pi, expected_pi)


def test_devices_below_one_says_so():
    """--devices 0 said "this process has 1 device(s)", as if the count were too large."""
    from ope_cli.errors import UsageError
    from ope_cli.estimation.kernel import local_mesh

    for count in (0, -2):
        with pytest.raises(UsageError, match=f"--devices must be at least 1, got {count}"):
            local_mesh(count)
    with pytest.raises(UsageError, match="--devices 99: this process has"):
        local_mesh(99)
