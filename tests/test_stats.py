"""Batch statistics (ope_cli/estimation/estimators/reduction.py) and mergeable accumulators
(ope_cli/estimation/stats.py) against the plain float64 NumPy reference (tests/reference.py)."""

from __future__ import annotations

import dataclasses
import functools
import math
from statistics import NormalDist

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from reference import DIAGNOSTICS, ESTIMATORS, reference_estimates, reference_stderr

from ope_cli.estimation import stats
from ope_cli.estimation.estimators.base import Context
from ope_cli.estimation.estimators.reduction import WeightedBatch, batch_statistics, log_ratios

K = 8  # resampling groups
REL = 1e-9


def random_episodes(rng, n, max_length=30, ratio_scale=0.3, reward_mean=1.0):
    """Reference-format episodes: float64 "log_target", "log_behavior", "reward" [T_i]."""
    out = []
    for _ in range(n):
        t = int(rng.integers(1, max_length + 1))
        log_b = np.log(rng.uniform(0.05, 1.0, size=t))
        out.append(
            {
                "log_target": log_b + ratio_scale * rng.normal(size=t),
                "log_behavior": log_b,
                "reward": reward_mean + rng.normal(size=t),
            }
        )
    return out


# A few padded shapes, so that the jitted statistics compile a handful of times in all.
BATCH_ROWS = (16, 64)
BATCH_STEPS = (32, 48, 64)


def padded_batch(episodes, groups, rng, shape=None):
    """[B, T] arrays for ``episodes``, with NaN on every padded cell (which must not leak).
    The shape is drawn from BATCH_ROWS x BATCH_STEPS unless given."""
    if shape is None:
        longest = max(len(ep["reward"]) for ep in episodes)
        b = int(rng.choice([r for r in BATCH_ROWS if r >= len(episodes)]))
        t = int(rng.choice([s for s in BATCH_STEPS if s >= longest]))
    else:
        b, t = shape
    extra_rows = b - len(episodes)
    log_target = np.full((b, t), np.nan)
    log_behavior = np.full((b, t), np.nan)
    reward = np.full((b, t), np.nan)
    step_mask = np.zeros((b, t), bool)
    for i, ep in enumerate(episodes):
        n = len(ep["reward"])
        log_target[i, :n] = ep["log_target"]
        log_behavior[i, :n] = ep["log_behavior"]
        reward[i, :n] = ep["reward"]
        step_mask[i, :n] = True
    episode_mask = np.arange(b) < len(episodes)
    group = np.concatenate([groups, rng.integers(0, K, size=extra_rows)]).astype(np.int32)
    return log_target, log_behavior, reward, step_mask, episode_mask, group


def _statistics(log_target, log_behavior, reward, step_mask, episode_mask, group, gamma):
    log_ratio = log_ratios(log_target, log_behavior, step_mask)
    no_replicates = jnp.zeros((log_ratio.shape[0], 0))
    batch = WeightedBatch(log_ratio, reward, step_mask, episode_mask, group, no_replicates)
    return batch_statistics(batch, gamma, K)


_jitted_statistics = jax.jit(_statistics)


def statistics_of(*arrays, jit=True):
    """BatchStatistics of ``padded_batch`` arrays and a discount factor."""
    *arrays, gamma = arrays
    function = _jitted_statistics if jit else _statistics
    return function(*(jnp.asarray(a) for a in arrays), jnp.asarray(gamma, jnp.float64))


def accumulate(episodes, groups, gamma, rng, max_batches=6):
    """Shuffles the episodes, cuts them into random batches of different padded shapes,
    and merges their statistics; returns the accumulator and the longest episode."""
    order = rng.permutation(len(episodes))
    n_batches = int(rng.integers(1, min(max_batches, len(episodes)) + 1))
    cuts = (
        np.sort(rng.choice(np.arange(1, len(episodes)), size=n_batches - 1, replace=False))
        if n_batches > 1
        else []
    )
    acc = stats.init(K)
    for part in np.split(order, cuts):
        arrays = padded_batch([episodes[i] for i in part], groups[part], rng)
        acc = stats.merge(acc, stats.from_batch(statistics_of(*arrays, gamma)))
    return acc, max(len(ep["reward"]) for ep in episodes)


def jackknife_reference(episodes, groups, gamma):
    """Delete-a-group jackknife standard error of WPDIS, from the reference on subsets."""
    present = np.unique(groups)
    values = np.array(
        [
            reference_estimates(
                [ep for ep, g in zip(episodes, groups, strict=True) if g != k], gamma
            )["wpdis"]
            for k in present
        ]
    )
    k = len(present)
    return math.sqrt((k - 1) / k * np.sum((values - values.mean()) ** 2))


def assert_close(got, expected, rel=REL, what=""):
    if expected is None:
        assert got is None, what
    else:
        assert got is not None, what
        assert got == pytest.approx(expected, rel=rel, abs=1e-300), what


def check_against_reference(estimates, diagnostics, episodes, gamma, groups=None, confidence=0.95):
    """Values, stderrs and diagnostics against the reference; with ``groups`` also WPDIS's
    delete-a-group jackknife stderr. Standard errors are checked for n >= 2 only."""
    ref = reference_estimates(episodes, gamma)
    ref_se = reference_stderr(episodes, gamma)
    for name in ESTIMATORS:
        assert_close(estimates[name].value, ref[name], what=name)
    for name in ("is", "wis", "pdis") if len(episodes) > 1 else ():
        assert_close(estimates[name].stderr, ref_se[name], what=f"{name} stderr")
    for name in DIAGNOSTICS:
        assert_close(getattr(diagnostics, name), ref[name], what=name)
    if groups is not None and len(np.unique(groups)) > 1 and ref["wpdis"] is not None:
        assert_close(
            estimates["wpdis"].stderr,
            jackknife_reference(episodes, groups, gamma),
            rel=1e-7,
            what="wpdis stderr",
        )
    z = NormalDist().inv_cdf(0.5 + confidence / 2)
    for name in ESTIMATORS:
        e = estimates[name]
        if e.value is not None and e.stderr is not None:
            assert e.ci_low == pytest.approx(e.value - z * e.stderr, rel=1e-12, abs=1e-15)
            assert e.ci_high == pytest.approx(e.value + z * e.stderr, rel=1e-12, abs=1e-15)


# ------------------------------------------------------------------ against reference


# seed 0 in the quick loop, the other random draws with the slow (property) tests
@pytest.mark.parametrize("seed", [0, *(pytest.param(s, marks=pytest.mark.slow) for s in (1, 2, 3))])
@pytest.mark.parametrize("gamma", [1.0, 0.9])
def test_random_batches_match_reference(seed, gamma):
    rng = np.random.default_rng(seed)
    episodes = random_episodes(rng, int(rng.integers(20, 60)))
    groups = rng.integers(0, K, size=len(episodes))
    acc, max_length = accumulate(episodes, groups, gamma, rng)
    estimates, diagnostics = stats.finalize(acc, gamma, max_length, 0.95)
    check_against_reference(estimates, diagnostics, episodes, gamma, groups)


@pytest.mark.slow  # a property: the merge's invariance to how episodes are batched
def test_result_does_not_depend_on_the_batching():
    rng = np.random.default_rng(99)
    episodes = random_episodes(rng, 40)
    groups = rng.integers(0, K, size=len(episodes))
    results = []
    for seed in range(3):
        acc, max_length = accumulate(episodes, groups, 0.95, np.random.default_rng(seed))
        estimates, _ = stats.finalize(acc, 0.95, max_length, 0.9)
        results.append({name: (e.value, e.stderr) for name, e in estimates.items()})
    for other in results[1:]:
        for name in ESTIMATORS:
            assert other[name] == pytest.approx(results[0][name], rel=1e-12)


def test_on_policy_data():
    rng = np.random.default_rng(4)
    episodes = random_episodes(rng, 25, ratio_scale=0.0)
    acc, max_length = accumulate(episodes, rng.integers(0, K, size=25), 1.0, rng)
    estimates, diagnostics = stats.finalize(acc, 1.0, max_length, 0.95)
    mean_return = np.mean([ep["reward"].sum() for ep in episodes])
    assert estimates["is"].value == pytest.approx(mean_return, rel=1e-12)
    assert estimates["wis"].value == pytest.approx(mean_return, rel=1e-12)
    assert estimates["pdis"].value == pytest.approx(mean_return, rel=1e-12)
    assert diagnostics.ess == pytest.approx(25, rel=1e-12)
    assert diagnostics.mean_weight == pytest.approx(1.0, rel=1e-12)
    assert diagnostics.zero_weight_fraction == 0.0


@pytest.mark.slow  # a property (and eager dispatch takes seconds)
def test_jit_matches_eager():
    rng = np.random.default_rng(5)
    episodes = random_episodes(rng, 12)
    arrays = padded_batch(episodes, rng.integers(0, K, size=12), rng, shape=(16, 32))
    eager = statistics_of(*arrays, 0.9, jit=False)
    compiled = statistics_of(*arrays, 0.9)
    for name, x in fields_of(eager).items():
        np.testing.assert_allclose(x, fields_of(compiled)[name], rtol=1e-12, err_msg=name)


def test_batch_statistics_are_float64_with_x64():
    rng = np.random.default_rng(6)
    arrays = padded_batch(random_episodes(rng, 4), np.zeros(4, np.int32), rng)
    for leaf in jax.tree_util.tree_leaves(statistics_of(*arrays, 1.0)):
        assert leaf.dtype == jnp.float64


# -------------------------------------------------------------------------- merge


def random_accumulator(seed, n=15, max_length=None, gamma=0.95, with_episodes=False):
    rng = np.random.default_rng(seed)
    episodes = random_episodes(
        rng, n, max_length=max_length or int(rng.integers(3, 40)), ratio_scale=1.0
    )
    shift = rng.normal(0, 3)  # different scales per accumulator
    for ep in episodes:
        ep["log_target"] = ep["log_target"] + shift / len(ep["reward"])
    groups = rng.integers(0, K, size=n)
    arrays = padded_batch(episodes, groups, rng)
    acc = stats.from_batch(statistics_of(*arrays, gamma))
    return (acc, episodes, groups) if with_episodes else acc


def fields_of(acc) -> dict[str, np.ndarray]:
    """Every array of an accumulator (a pytree of dicts), by its path."""
    if dataclasses.is_dataclass(acc):
        return {f.name: np.asarray(getattr(acc, f.name)) for f in dataclasses.fields(acc)}
    leaves = jax.tree_util.tree_flatten_with_path(acc)[0]
    return {jax.tree_util.keystr(path): np.asarray(value) for path, value in leaves}


def assert_accumulators_close(a, b, rel=1e-12):
    fa, fb = fields_of(a), fields_of(b)
    assert fa.keys() == fb.keys()
    for name in fa:
        x, y = fa[name], fb[name]
        assert x.shape == y.shape, name
        scale = max(np.max(np.abs(np.where(np.isfinite(x), x, 0)), initial=0.0), 1e-300)
        np.testing.assert_allclose(x, y, rtol=rel, atol=rel * scale, err_msg=name)


def test_merge_is_commutative():
    for seed in range(5):
        a, b = random_accumulator(seed), random_accumulator(seed + 100)
        assert_accumulators_close(stats.merge(a, b), stats.merge(b, a))


def test_merge_is_associative():
    for seed in range(5):
        a, b, c = (random_accumulator(seed + k) for k in (0, 10, 20))
        assert_accumulators_close(
            stats.merge(stats.merge(a, b), c), stats.merge(a, stats.merge(b, c))
        )


def test_init_is_the_identity():
    for seed in range(3):
        a = random_accumulator(seed)
        assert_accumulators_close(stats.merge(stats.init(K), a), a, rel=0)
        assert_accumulators_close(stats.merge(a, stats.init(K)), a, rel=0)
    assert_accumulators_close(stats.merge(stats.init(K), stats.init(K)), stats.init(K), rel=0)


def test_merging_a_short_batch_into_a_long_one_combines_only_its_groups():
    """A short batch holding 2 of the K groups merged into a longer accumulator, either
    way round: the per-step sums are, bit for bit, those of lengthening both and combining
    every group, and the estimates are the reference's of the union."""
    long_acc, long_episodes, long_groups = random_accumulator(
        40, n=15, max_length=60, with_episodes=True
    )
    rng = np.random.default_rng(41)
    short_episodes = random_episodes(rng, 3, max_length=6, ratio_scale=1.0)
    short_groups = np.array([1, 4, 4])
    arrays = padded_batch(short_episodes, short_groups, rng, shape=(4, 8))
    dense = stats.from_batch(statistics_of(*arrays, 0.95))

    def own_rows(rows):  # as ``kernel.assemble`` gives them: none for a group without episodes
        return [row if g in short_groups else row[..., :0] for g, row in enumerate(rows)]

    short = dense._replace(
        step_log_scales={k: own_rows(v) for k, v in dense.step_log_scales.items()},
        step_sums={k: own_rows(v) for k, v in dense.step_sums.items()},
    )
    assert 0 < np.count_nonzero(stats.row_lengths(short)) < K  # the rows-only path
    assert short.length < long_acc.length
    episodes = short_episodes + long_episodes
    groups = np.concatenate([short_groups, long_groups])
    length = long_acc.length
    for merged in (stats.merge(short, long_acc), stats.merge(long_acc, short)):
        lengthened = [stats.dense_groups(acc, length) for acc in (dense, long_acc)]
        scales, sums = stats._merge_steps(
            *(field for acc in lengthened for field in (acc.step_log_scales, acc.step_sums))
        )
        got = stats.dense_groups(merged, length)
        for name, value in {**scales, **sums}.items():
            np.testing.assert_array_equal(
                {**got.step_log_scales, **got.step_sums}[name], value, err_msg=name
            )
        longest = max(len(e["reward"]) for e in episodes)
        estimates, diagnostics = stats.finalize(merged, 0.95, longest, 0.95)
        check_against_reference(estimates, diagnostics, episodes, 0.95, groups)


def test_rows_of_one_length_merge_as_group_by_group():
    """Two accumulators whose per-group rows all have one length merge as one stacked
    [K, L] array, bit for bit what merging each group's rows on their own gives, and a
    row of another length sends a merge group by group."""
    rng = np.random.default_rng(50)

    def accumulator(shift):
        episodes = random_episodes(rng, 40, max_length=30, ratio_scale=1.0)
        for episode in episodes:  # scales far apart: the larger side's scale wins
            episode["log_target"] = episode["log_target"] + shift
        arrays = padded_batch(episodes, rng.integers(0, K, size=40), rng, shape=(64, 32))
        return stats.from_batch(statistics_of(*arrays, 0.95))

    a, b = accumulator(0.0), accumulator(0.3)
    assert stats._one_length(a, b)
    merged = stats.merge(a, b)
    for group in range(K):
        scales_a, sums_a, _ = stats._group_row(a, group)
        scales_b, sums_b, _ = stats._group_row(b, group)
        scales, sums = stats._merge_steps(scales_a, sums_a, scales_b, sums_b)
        for name, row in {**scales, **sums}.items():
            got = {**merged.step_log_scales, **merged.step_sums}[name][group]
            np.testing.assert_array_equal(got, row, err_msg=f"{name}, group {group}")
    shorter = b._replace(step_sums={k: [*v[:-1], v[-1][..., :5]] for k, v in b.step_sums.items()})
    assert not stats._one_length(a, shorter)


def test_merged_accumulators_match_reference_of_the_union():
    parts = [random_accumulator(seed, gamma=0.9, with_episodes=True) for seed in (30, 31, 32)]
    acc = functools.reduce(stats.merge, [p[0] for p in parts], stats.init(K))
    episodes = [ep for p in parts for ep in p[1]]
    groups = np.concatenate([p[2] for p in parts])
    estimates, diagnostics = stats.finalize(acc, 0.9, max(len(e["reward"]) for e in episodes), 0.95)
    check_against_reference(estimates, diagnostics, episodes, 0.9, groups)


def test_merge_with_an_all_zero_weight_accumulator():
    rng = np.random.default_rng(3)
    zero_episodes = random_episodes(rng, 5)
    for ep in zero_episodes:
        ep["log_target"] = ep["log_target"].copy()
        ep["log_target"][0] = -np.inf
    zero_groups = rng.integers(0, K, size=5)
    zero = stats.from_batch(statistics_of(*padded_batch(zero_episodes, zero_groups, rng), 1.0))
    a, episodes, groups = random_accumulator(1, gamma=1.0, with_episodes=True)
    everything = episodes + zero_episodes
    all_groups = np.concatenate([groups, zero_groups])
    longest = max(len(e["reward"]) for e in everything)
    for merged in (stats.merge(a, zero), stats.merge(zero, a)):
        estimates, diagnostics = stats.finalize(merged, 1.0, longest, 0.95)
        check_against_reference(estimates, diagnostics, everything, 1.0, all_groups)
        assert diagnostics.zero_weight_fraction == pytest.approx(5 / 20)


# ------------------------------------------------------------------ extreme weights


@pytest.mark.parametrize("offset", [1000.0, -1000.0])
def test_weights_beyond_float64_still_give_weighted_estimates(offset):
    """Every trajectory weight is about exp(+-1000): naive products are inf or 0."""
    rng = np.random.default_rng(8)
    episodes = random_episodes(rng, 30, ratio_scale=0.5)
    for ep in episodes:
        t = len(ep["reward"])
        per_step = np.full(t, offset / t)
        ep["log_target"] = ep["log_target"] + per_step
    groups = rng.integers(0, K, size=len(episodes))
    with np.errstate(over="raise"):
        weights = np.array([np.sum(ep["log_target"] - ep["log_behavior"]) for ep in episodes])
    assert np.all(np.abs(weights) > 900)
    acc, max_length = accumulate(episodes, groups, 0.95, rng)
    estimates, diagnostics = stats.finalize(acc, 0.95, max_length, 0.95)
    ref = reference_estimates(episodes, 0.95)
    assert ref["wis"] is not None and ref["wpdis"] is not None
    check_against_reference(estimates, diagnostics, episodes, 0.95)  # jackknife: test below
    if offset > 0:
        assert estimates["is"].value is None
        assert estimates["pdis"].value is None
        assert estimates["is"].note


def test_weights_jumping_mid_episode_and_across_batches():
    """Log-ratio jumps of +-1000 at random steps: scales differ per step and per batch."""
    rng = np.random.default_rng(9)
    episodes = random_episodes(rng, 40, ratio_scale=0.5)
    for ep in episodes:
        if rng.uniform() < 0.6:
            ep["log_target"] = ep["log_target"].copy()
            ep["log_target"][rng.integers(len(ep["reward"]))] += rng.choice([1000.0, -1000.0])
    groups = rng.integers(0, K, size=len(episodes))
    acc, max_length = accumulate(episodes, groups, 1.0, rng)
    estimates, diagnostics = stats.finalize(acc, 1.0, max_length, 0.95)
    ref = reference_estimates(episodes, 1.0)
    assert ref["wis"] is not None and ref["wpdis"] is not None
    check_against_reference(estimates, diagnostics, episodes, 1.0, groups)


def wpdis_with_one_dominant_group(log_offset):
    """Episodes of group 0 have every weight about exp(log_offset) times those of groups 1-3."""
    rng = np.random.default_rng(13)
    episodes = random_episodes(rng, 24, max_length=10, ratio_scale=0.2)
    groups = np.arange(24) % 4
    for ep, g in zip(episodes, groups, strict=True):
        if g == 0:
            ep["log_target"] = ep["log_target"].copy()
            ep["log_target"][0] += log_offset
    acc, max_length = accumulate(episodes, groups, 1.0, rng)
    estimates, _ = stats.finalize(acc, 1.0, max_length, 0.95)
    return estimates["wpdis"], episodes, groups


@pytest.mark.parametrize("log_offset", [20.0, 30.0, 36.0, 800.0])
def test_wpdis_jackknife_when_one_group_dominates(log_offset):
    """Leaving out the dominant group leaves weights that are tiny next to it (e^-30) or
    below float64's range next to it (e^-800) but perfectly usable on their own: the
    leave-one-group-out WPDIS is well defined, so the standard error must be too."""
    wpdis, episodes, groups = wpdis_with_one_dominant_group(log_offset)
    assert_close(wpdis.value, reference_estimates(episodes, 1.0)["wpdis"], what="wpdis")
    assert_close(
        wpdis.stderr, jackknife_reference(episodes, groups, 1.0), rel=1e-6, what="wpdis stderr"
    )


def test_all_zero_weights():
    rng = np.random.default_rng(10)
    episodes = random_episodes(rng, 12)
    for ep in episodes:
        ep["log_target"] = ep["log_target"].copy()
        ep["log_target"][-1] = -np.inf  # target probability 0 at every episode's last step
    groups = rng.integers(0, K, size=len(episodes))
    acc, max_length = accumulate(episodes, groups, 1.0, rng)
    estimates, diagnostics = stats.finalize(acc, 1.0, max_length, 0.95)
    wis = estimates["wis"]
    assert (wis.value, wis.stderr, wis.ci_low, wis.ci_high) == (None, None, None, None)
    assert wis.note
    assert estimates["wpdis"].value is None
    assert estimates["wpdis"].note
    assert diagnostics.zero_weight_fraction == 1.0
    ref = reference_estimates(episodes, 1.0)
    assert estimates["is"].value == pytest.approx(ref["is"], abs=0)  # 0
    assert_close(estimates["pdis"].value, ref["pdis"], what="pdis")
    assert_close(estimates["pdis"].stderr, reference_stderr(episodes, 1.0)["pdis"], what="pdis se")
    for name in DIAGNOSTICS:
        assert_close(getattr(diagnostics, name), ref[name], what=name)


def test_some_zero_weights():
    rng = np.random.default_rng(11)
    episodes = random_episodes(rng, 20)
    for ep in episodes[::3]:
        ep["log_target"] = ep["log_target"].copy()
        ep["log_target"][0] = -np.inf
    groups = rng.integers(0, K, size=len(episodes))
    acc, max_length = accumulate(episodes, groups, 0.9, rng)
    estimates, diagnostics = stats.finalize(acc, 0.9, max_length, 0.95)
    check_against_reference(estimates, diagnostics, episodes, 0.9, groups)
    assert diagnostics.zero_weight_fraction == pytest.approx(7 / 20)


# ------------------------------------------------------------------- tiny cases


def test_single_episode():
    rng = np.random.default_rng(12)
    (episode,) = random_episodes(rng, 1, max_length=10)
    acc, max_length = accumulate([episode], np.array([3]), 0.9, rng)
    estimates, diagnostics = stats.finalize(acc, 0.9, max_length, 0.95)
    ret = float(np.sum(0.9 ** np.arange(len(episode["reward"])) * episode["reward"]))
    assert estimates["wis"].value == pytest.approx(ret, rel=1e-12)
    for name in ESTIMATORS:
        assert estimates[name].stderr is None, name
        assert estimates[name].ci_low is None and estimates[name].ci_high is None, name
    assert diagnostics.ess == pytest.approx(1.0)
    assert diagnostics.max_weight_share == pytest.approx(1.0)
    check_against_reference(estimates, diagnostics, [episode], 0.9)


def test_hand_example():
    """Episode A: ratios (2, 0.5), rewards (1, 2); episode B: ratio 0.5, reward 3 (gamma 0.9)."""
    episodes = [
        {
            "log_target": np.log([0.5, 0.25]),
            "log_behavior": np.log([0.25, 0.5]),
            "reward": np.array([1.0, 2.0]),
        },
        {"log_target": np.log([0.25]), "log_behavior": np.log([0.5]), "reward": np.array([3.0])},
    ]
    arrays = padded_batch(episodes, np.array([0, 1]), np.random.default_rng(0), shape=(16, 32))
    acc = stats.merge(stats.init(K), stats.from_batch(statistics_of(*arrays, 0.9)))
    estimates, diagnostics = stats.finalize(acc, 0.9, 2, 0.95)
    assert estimates["is"].value == pytest.approx(2.15, rel=1e-12)
    assert estimates["wis"].value == pytest.approx(43 / 15, rel=1e-12)
    assert estimates["pdis"].value == pytest.approx(2.65, rel=1e-12)
    assert estimates["wpdis"].value == pytest.approx(2.6, rel=1e-12)
    assert estimates["is"].stderr == pytest.approx(0.65, rel=1e-12)
    assert estimates["pdis"].stderr == pytest.approx(1.15, rel=1e-12)
    assert diagnostics.ess == pytest.approx(1.8, rel=1e-12)
    assert diagnostics.max_weight == pytest.approx(1.0, rel=1e-12)
    assert diagnostics.max_weight_share == pytest.approx(2 / 3, rel=1e-12)


def test_finalize_is_pure_and_orders_estimators():
    acc = random_accumulator(2)
    first = stats.finalize(acc, 0.95, 40, 0.95)
    second = stats.finalize(acc, 0.95, 40, 0.95)
    assert list(first[0]) == list(ESTIMATORS)
    assert first == second


# ------------------------------------------------- WIS standard error, one dominant episode


def dominated_episodes(rng, n, share):
    """Episodes where the first holds ``share`` of the total trajectory weight."""
    episodes = random_episodes(rng, n, max_length=6, ratio_scale=0.2)
    log_final = np.array([np.sum(ep["log_target"] - ep["log_behavior"]) for ep in episodes])
    rest = np.log(np.sum(np.exp(log_final[1:])))
    target = rest + math.log(share) - math.log1p(-share)  # w_0 / (w_0 + rest) = share
    episodes[0]["log_target"] = episodes[0]["log_target"] + (target - log_final[0]) / len(
        episodes[0]["reward"]
    )
    return episodes


@pytest.mark.parametrize("share", [1 - 1e-6, 1 - 1e-10, 1 - 1e-13])
@pytest.mark.parametrize("heavy_first", [True, False])
def test_wis_stderr_when_one_episode_holds_nearly_all_the_weight(share, heavy_first):
    """The delta-method sum sum_i w_i^2 (G_i - WIS)^2 is tiny next to w_0^2 G_0^2: expanded
    into raw sums it cancels catastrophically; centred on a pivot it matches the plain
    two-pass reference, also when the heavy episode arrives in a later batch (the pivot
    then moves when the accumulators merge)."""
    rng = np.random.default_rng(17)
    episodes = dominated_episodes(rng, 30, share)
    order = list(range(30)) if heavy_first else [*range(1, 30), 0]
    acc = stats.init(K)
    for part in np.array_split(np.array(order), 3):
        arrays = padded_batch([episodes[i] for i in part], part % K, rng)
        acc = stats.merge(acc, stats.from_batch(statistics_of(*arrays, 0.9)))
    estimates, diagnostics = stats.finalize(acc, 0.9, 6, 0.95)
    reference = reference_stderr(episodes, 0.9)["wis"]
    assert diagnostics.max_weight_share == pytest.approx(share, rel=1e-9)
    assert estimates["wis"].stderr == pytest.approx(reference, rel=1e-6)
    assert estimates["wis"].value == pytest.approx(reference_estimates(episodes, 0.9)["wis"])


@pytest.mark.parametrize("head", ["none", "median"])
@pytest.mark.parametrize("ratio_scale", [0.3, 3.0])
def test_row_by_row_finalisation_equals_the_dense_one(monkeypatch, ratio_scale, head):
    """Past DENSE_CELLS (a very long episode), finalisation combines each group's rows one at
    a time and selects the jackknife's leave-one-outs one by one: the same estimates,
    standard errors, intervals and per-step profile as the [K, T] layout, to rounding."""
    rng = np.random.default_rng(23)
    episodes = random_episodes(rng, 60, ratio_scale=ratio_scale)
    groups = rng.integers(0, K, size=len(episodes))
    full, max_length = accumulate(episodes, groups, 0.9, rng)
    assert stats.grouped_sums(full, max_length).leave_one_out is not None
    dense = stats.finalize(full, 0.9, max_length, 0.95)
    dense_profile = stats.profile(full, 0.9, max_length)
    # each group's rows cut after its longest episode, as ``kernel.assemble`` may cut them
    own = np.zeros(K, np.int64)
    for episode, group in zip(episodes, groups, strict=True):
        own[group] = max(own[group], len(episode["reward"]))

    def cut(rows):
        return [row[..., :n] for row, n in zip(rows, own, strict=True)]

    acc = full._replace(
        step_log_scales={k: cut(v) for k, v in full.step_log_scales.items()},
        step_sums={k: cut(v) for k, v in full.step_sums.items()},
    )
    # and odd groups' rows past the longest episode, as a window's end may leave them
    acc = stats.extend(acc, max_length, rows=np.where(np.arange(K) % 2, max_length + 5, own))
    assert len(set(stats.row_lengths(acc).tolist())) > 1  # ragged rows
    # every row merged one by one, or the rows up to the median length combined at once
    cells = 0 if head == "none" else K * int(np.median(own))
    monkeypatch.setattr(stats, "DENSE_CELLS", cells)
    assert stats.grouped_sums(acc, max_length).leave_one_out is None  # row by row
    rows = stats.finalize(acc, 0.9, max_length, 0.95)
    assert rows[1] == dense[1]
    assert rows[0].keys() == dense[0].keys()
    for name, estimate in dense[0].items():
        for field in ("value", "stderr", "ci_low", "ci_high"):
            expected, got = getattr(estimate, field), getattr(rows[0][name], field)
            assert (got is None) == (expected is None), (name, field)
            if expected is not None:
                assert got == pytest.approx(expected, rel=1e-12, abs=1e-300), (name, field)
    np.testing.assert_allclose(
        stats.profile(acc, 0.9, max_length).wpdis_partial_t,
        dense_profile.wpdis_partial_t,
        rtol=1e-12,
    )


def test_leave_one_out_values_one_group_at_a_time_equal_all_at_once(monkeypatch):
    """``leave_one_out_values`` (the paired comparisons' jackknife) past DENSE_CELLS selects
    the groups one at a time, row by row: the same [G] values as all at once."""
    from ope_cli.estimation.estimators import get

    rng = np.random.default_rng(29)
    episodes = random_episodes(rng, 50, ratio_scale=1.0)
    groups = rng.integers(0, K, size=len(episodes))
    acc, max_length = accumulate(episodes, groups, 0.9, rng)
    context = Context(0.9, max_length)
    for name in ("wpdis", "pdis", "wis"):
        own = stats.restricted(acc, (name,))

        def values_of(sums, name=name):
            return get(name).replicates(sums, context)[0]

        present, together = stats.leave_one_out_values(own, max_length, values_of)
        monkeypatch.setattr(stats, "DENSE_CELLS", 0)
        again, one_by_one = stats.leave_one_out_values(own, max_length, values_of)
        monkeypatch.undo()
        np.testing.assert_array_equal(again, present)
        assert present.size > 1
        np.testing.assert_allclose(one_by_one, together, rtol=1e-12)


@pytest.mark.parametrize("ratio_scale", [0.3, 3.0])
def test_leave_one_out_sums_equal_each_selection(ratio_scale):
    """All groups left out at once (vectorised) equal one selection per group, also where
    one group alone holds a step's largest weight (heavy weights: ratio_scale 3)."""
    rng = np.random.default_rng(17)
    episodes = random_episodes(rng, 60, ratio_scale=ratio_scale)
    groups = rng.integers(0, K, size=len(episodes))
    acc, max_length = accumulate(episodes, groups, 0.9, rng)
    acc = stats.extend(acc, max_length)
    present, together = stats.leave_one_out_sums(acc, max_length)
    grouped = stats.grouped_sums(acc, max_length)
    np.testing.assert_array_equal(present, grouped.groups)
    for position, g in enumerate(present):
        one = grouped.select(present[present != g])
        for name, value in one.sums.items():
            np.testing.assert_allclose(together.sums[name][position], value, rtol=1e-12)
        for name, value in one.step_sums.items():
            np.testing.assert_allclose(
                together.step_sums[name][position], value, rtol=1e-12, atol=1e-300
            )
        for name, value in one.step_log_scales.items():
            np.testing.assert_array_equal(together.step_log_scales[name][position], value)


def with_random_replicate_steps(acc, rng, length: int, replicates: int = 5):
    """``acc`` with R bootstrap replicates' per-step sums and scales of ``length`` steps."""
    return acc._replace(
        replicate_step_log_scales={k: rng.normal(0, 3, size=length) for k in acc.step_log_scales},
        replicate_step_sums={
            k: rng.gamma(1.0, size=(replicates, length)) * (1 if k == "w_t" else rng.normal())
            for k in acc.step_sums
        },
    )


@pytest.mark.parametrize("lengths", [(3, 40), (40, 3), (25, 25), (0, 17)])
def test_replicate_steps_merge_in_blocks_as_if_lengthened_first(monkeypatch, lengths):
    """Merging bootstrap per-step sums of different lengths lengthens the shorter side a
    block of steps at a time: bit for bit what lengthening it first gives."""
    rng = np.random.default_rng(31 + lengths[0])
    a = with_random_replicate_steps(random_accumulator(1), rng, lengths[0])
    b = with_random_replicate_steps(random_accumulator(2), rng, lengths[1])
    longest = max(lengths)
    long_a, long_b = stats.extend_replicates(a, longest), stats.extend_replicates(b, longest)
    scales, sums = stats._merge_steps(
        long_a.replicate_step_log_scales,
        long_a.replicate_step_sums,
        long_b.replicate_step_log_scales,
        long_b.replicate_step_sums,
    )
    monkeypatch.setattr(stats, "STEP_BLOCK_CELLS", 7)  # 5 replicates: blocks of one step
    merged = stats.merge(a, b)
    assert set(merged.replicate_step_sums) == set(sums)
    for name, expected in {**scales, **sums}.items():
        got = {**merged.replicate_step_log_scales, **merged.replicate_step_sums}[name]
        assert got.shape[-1] == longest
        np.testing.assert_array_equal(got, expected, err_msg=name)
