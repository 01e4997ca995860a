"""Bootstrap intervals and ground truth: estimates against environments whose value is known."""

from __future__ import annotations

import math

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

from ope_cli.api import evaluation_config
from ope_cli.envs.generate import generate
from ope_cli.estimation.estimators.reduction import poisson_counts
from ope_cli.estimation.pipeline import evaluate


def run(data, policies, **options):
    config = evaluation_config(str(data), policies=tuple(str(p) for p in policies), **options)
    return evaluate(config)


def intervals(result):
    return [[(e.value, e.ci_low, e.ci_high) for e in r.estimates.values()] for r in result.results]


def test_poisson_counts_without_replicates_are_empty():
    hi = np.arange(5, dtype=np.uint32)
    counts = poisson_counts(hi, hi, np.uint32(5), 0)
    assert counts.shape == (5, 0)


def test_poisson_counts_are_poisson_one_and_depend_only_on_key_and_seed():
    hi = np.arange(2000, dtype=np.uint32)
    lo = (hi * 7919).astype(np.uint32)
    counts = np.asarray(poisson_counts(hi, lo, np.uint32(5), 300))
    assert counts.shape == (2000, 300)
    assert counts.mean() == pytest.approx(1.0, abs=0.01)
    assert counts.var() == pytest.approx(1.0, abs=0.02)
    assert np.mean(counts == 0) == pytest.approx(np.exp(-1), abs=0.005)
    # The same episode gets the same counts in any batch, at any position.
    shuffled = np.random.default_rng(0).permutation(2000)
    again = np.asarray(poisson_counts(hi[shuffled], lo[shuffled], np.uint32(5), 300))
    np.testing.assert_array_equal(again, counts[shuffled])
    other_seed = np.asarray(poisson_counts(hi, lo, np.uint32(6), 300))
    assert not np.array_equal(other_seed, counts)


@pytest.fixture(scope="module")
def small_case(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("boot")
    rng = np.random.default_rng(41)
    behavior = random_checkpoint("linear_softmax", rng)
    episodes = random_episodes(rng, 300, behavior=behavior, max_length=150)
    policy = save_checkpoint(tmp / "p.npz", perturb_checkpoint(behavior, rng, 0.3))
    one = write_step_layout(episodes, tmp / "one.parquet")
    split = write_step_layout(episodes, tmp / "split", n_files=4)
    return one, split, policy


@pytest.mark.slow  # a property / statistical test: the full suite runs it
@pytest.mark.parametrize("method", ["percentile", "bootstrap-t"])
def test_bootstrap_intervals_do_not_depend_on_batching_or_files(small_case, method):
    one, split, policy = small_case
    options = dict(interval=method, bootstrap_samples=64, seed=3, gamma=0.97)
    reference = intervals(run(one, [policy], **options))
    for other in (
        run(one, [policy], read_rows=17, batch_steps=300, **options),
        run(one, [policy], min_bucket=3, **options),
        run(split, [policy], **options),
    ):
        for a, b in zip(reference, intervals(other), strict=True):
            np.testing.assert_allclose(np.array(b, float), np.array(a, float), rtol=1e-9)
    different_seed = intervals(run(one, [policy], **{**options, "seed": 4}))
    assert different_seed != reference


@pytest.mark.slow  # a property / statistical test: the full suite runs it
def test_betting_intervals_do_not_depend_on_batching_or_files(small_case):
    one, split, policy = small_case
    options = dict(interval="betting", reward_range=(-3.0, 3.0), gamma=0.97)
    reference = intervals(run(one, [policy], **options))
    # (record-batch and batch sizes are covered by the bootstrap test: the same merge)
    for other in (
        run(one, [policy], min_bucket=3, **options),
        run(split, [policy], **options),
        run(one, [policy], precision="float32", **options),
    ):
        for a, b in zip(reference, intervals(other), strict=True):
            np.testing.assert_allclose(np.array(b, float), np.array(a, float), rtol=1e-6)
    # is/wis share the trajectory interval, pdis/wpdis the per-decision one; each holds V
    (is_, wis, pdis, wpdis) = reference[0]
    assert is_[1:] == wis[1:] and pdis[1:] == wpdis[1:]
    assert is_[1] < is_[2] and pdis[1] < pdis[2]


@pytest.mark.slow  # a property / statistical test: the full suite runs it
def test_betting_interval_covers_a_bandit_truth_and_narrows_with_data(tmp_path):
    widths = []
    for episodes in (500, 8000):
        out = tmp_path / str(episodes)
        truth = generate("bandit", out, episodes=episodes, seed=2, shift=0.5)
        result = run(out / "logs.parquet", [out / truth["policies"][0]["policy"]])
        assert (
            result.confidence.interval == "betting"
        )  # bandit declares rewards in [0, 1], horizon 1
        e = result.results[0].estimates["is"]
        assert e.ci_low <= truth["policies"][0]["value"] <= e.ci_high
        widths.append(e.ci_high - e.ci_low)
    assert widths[1] < widths[0] / 2.5  # ~ 1 / sqrt(n): 4x narrower for 16x the data


@pytest.mark.slow  # a property / statistical test: the full suite runs it
def test_bootstrap_spread_matches_the_analytic_standard_error(small_case):
    one, _, policy = small_case
    result = run(one, [policy], interval="percentile", bootstrap_samples=400, seed=1)
    for name in ("is", "pdis"):
        e = result.results[0].estimates[name]
        # A 95% percentile interval of a near-normal statistic spans about 2 * 1.96 standard errors.
        assert (e.ci_high - e.ci_low) / (2 * 1.96 * e.stderr) == pytest.approx(1.0, abs=0.25), name
        assert e.ci_low < e.value < e.ci_high


ENVIRONMENTS = {  # env -> (episodes, gamma)
    "bandit": (4000, 1.0),
    "chain": (3000, 0.95),
    "control": (3000, 0.99),
    "gaussian": (3000, 1.0),
}


@pytest.fixture(scope="module", params=sorted(ENVIRONMENTS))
def ground_truth(request, tmp_path_factory, small_control_truth):
    env = request.param
    episodes, gamma = ENVIRONMENTS[env]
    out = tmp_path_factory.mktemp(env)
    truth = generate(env, out, episodes=episodes, seed=11, gamma=gamma, shift=0.3)
    policies = [out / entry["policy"] for entry in truth["policies"]]
    result = run(out / "logs.parquet", policies, gamma=gamma)
    return env, truth, result


@pytest.mark.slow  # a property / statistical test: the full suite runs it
@pytest.mark.parametrize("names", [("is", "pdis"), ("wis", "wpdis")])
def test_estimators_land_near_the_truth(ground_truth, names):
    """Each estimate lands within 4 of its standard errors (plus the truth's own Monte Carlo
    error) of the true value, on every environment and evaluation policy: IS and PDIS are
    unbiased; WIS and WPDIS are consistent, and these samples are large enough."""
    env, truth, result = ground_truth
    for entry, policy in zip(truth["policies"], result.results, strict=True):
        for name in names:
            e = policy.estimates[name]
            tolerance = 4 * np.hypot(e.stderr, entry["stderr"])
            assert abs(e.value - entry["value"]) < tolerance, (env, entry["policy"], name, e, entry)


@pytest.mark.slow  # a property / statistical test: the full suite runs it
@pytest.mark.parametrize("ground_truth", ["control"], indirect=True)  # the long-horizon one
def test_per_decision_weighting_has_lower_variance_on_long_horizons(ground_truth):
    _, _, result = ground_truth
    for policy in result.results:
        assert policy.estimates["pdis"].stderr < policy.estimates["is"].stderr
        assert policy.estimates["wpdis"].stderr < policy.estimates["wis"].stderr


def _log_histograms(samples: np.ndarray) -> np.ndarray:
    """[S, bins] the kernel's histogram of log x (estimators.reduction._betting_histogram) of
    each row x of ``samples`` [S, n], in one call."""
    from ope_cli.estimation.estimators.reduction import _betting_histogram

    with np.errstate(divide="ignore"):
        log_x = np.log(samples)
    include = np.ones(samples.shape[1], bool)
    return np.asarray(_betting_histogram(log_x, include, np.float64))


def _log_histogram(x: np.ndarray) -> np.ndarray:
    """The kernel's histogram of log x for one variable."""
    return _log_histograms(x[None])[0]


@pytest.mark.parametrize(
    ("width", "gamma", "horizon"),
    # the padding walks past a horizon of 6 (9 steps walked) and stops short of one of 12
    [(8, 0.9, 12), (3, 0.9, 12), (8, 0.9, 6), (3, 1.0, 6), (8, 0.0, 12)],
)
def test_betting_variables_match_their_formulas(width, gamma, horizon):
    """Episodes walked in windows give the per-episode variables written plainly from the
    formulas (the padding walked after an episode's end cancels out)."""
    from ope_cli.estimation.estimators.reduction import (
        _advance_one,
        betting_inputs,
        betting_variables,
        init_carry,
    )

    rng = np.random.default_rng(7)
    lengths, steps, (a, b) = np.array([1, 4, 6, 6]), 9, (-1.0, 2.0)
    discounted = float(horizon) if gamma == 1.0 else (1 - gamma**horizon) / (1 - gamma)
    betting_range = jnp.asarray(betting_inputs((a, b, discounted), horizon, gamma))
    log_ratio = rng.normal(scale=0.7, size=(4, steps))
    reward = rng.uniform(a, b, size=(4, steps))
    mask = np.arange(steps) < lengths[:, None]
    log_w = np.cumsum(np.where(mask, log_ratio, 0.0), axis=1)
    span = (b - a) * discounted
    for i, n in enumerate(lengths):
        carry = init_carry(jnp.zeros(()), (), True)
        for start in range(0, steps, width):
            part = slice(start, start + width)
            window = (
                jnp.asarray(np.where(mask[i, part], log_ratio[i, part], 0.0)),
                jnp.asarray(np.where(mask[i, part], reward[i, part], 0.0)),
                discounts(gamma ** np.arange(start, min(start + width, steps))),
                jnp.asarray(mask[i, part]),
                jnp.asarray(np.arange(start, min(start + width, steps)) == 0),
                {},
            )
            carry, _, _ = _advance_one(carry, window, (), betting_range)
        got = np.exp(np.asarray(betting_variables(carry.betting, carry.trajectory, betting_range)))
        w_t, r_t, g_t = np.exp(log_w[i, :n]), reward[i, :n], gamma ** np.arange(n)
        ret, rest = g_t @ r_t, discounted - g_t.sum()  # rest: discount of the steps never taken
        want = [
            w_t[-1] * (ret - a * discounted) / span,
            w_t[-1] * (b * discounted - ret) / span,
            (g_t @ (w_t * (r_t - a)) - a * rest * w_t[-1]) / span,
            (g_t @ (w_t * (b - r_t)) + b * rest * w_t[-1]) / span,
        ]
        np.testing.assert_allclose(got, want, rtol=1e-12)


@pytest.mark.parametrize("horizon", [1100, 1200])
def test_betting_variables_of_a_weight_past_the_float_range(horizon):
    """An 1,100-step episode with W_t = 2^(t+1) (log W 762, beyond float64) and gamma 1/2,
    so every gamma^t W_t is 2: its per-decision variables are kept relative to the largest
    gamma^t W_t and come out right (relative to the largest W_t they were 0), the rest of
    the horizon's steps included in closed form."""
    from ope_cli.estimation.estimators.reduction import (
        _advance_one,
        betting_inputs,
        betting_variables,
        init_carry,
    )

    steps, gamma, a, b = 1100, 0.5, -1.0, 1.0
    discounted = (1 - gamma**horizon) / (1 - gamma)
    betting_range = jnp.asarray(betting_inputs((a, b, discounted), horizon, gamma))
    carry = init_carry(jnp.zeros(()), (), True)
    t = np.arange(steps)
    window = (
        jnp.full(steps, math.log(2.0)),
        jnp.ones(steps),
        (jnp.asarray(gamma**t), jnp.asarray(t * math.log(gamma))),
        jnp.ones(steps, bool),
        jnp.asarray(t == 0),
        {},
    )
    carry, _, _ = _advance_one(carry, window, (), betting_range)
    logs = np.asarray(betting_variables(carry.betting, carry.trajectory, betting_range))
    span = (b - a) * discounted
    rest = 2.0 * (1 - gamma ** (horizon - steps))  # W_{T-1} sum_{t >= T} gamma^t, exactly
    want_low = (2.0 * steps * (1.0 - a) - a * rest) / span  # gamma^t W_t (r_t - a) = 2 (1 - a)
    want_high = (2.0 * steps * (b - 1.0) + b * rest) / span
    np.testing.assert_allclose(np.exp(logs[2:]), [want_low, want_high], rtol=1e-12)


@pytest.mark.slow  # statistical: validity over repeated samples
def test_betting_lower_bound_is_valid_and_sharpens_with_data():
    from ope_cli.estimation.intervals import betting_lower_bound

    rng = np.random.default_rng(3)
    mean = 0.3
    misses, bounds = 0, {}
    for n in (100, 400, 1600):
        # heavy-tailed, non-negative, mean 0.3: lognormal weights times a [0, 1] return;
        # drawn one sample after the other, their histograms in one call per size
        samples = np.stack(
            [
                np.exp(rng.normal(-0.5, 1.0, n)) * rng.beta(0.6, 1.4, n)
                for _ in range(200 if n == 100 else 20)
            ]
        )
        for x, histogram in zip(samples, _log_histograms(samples), strict=True):
            bound = betting_lower_bound(histogram, 0.025)
            assert bound <= x.mean() + 1e-12
            misses += n == 100 and bound > mean
            bounds.setdefault(n, []).append(bound)
    assert misses <= 200 * 0.025 + 3 * np.sqrt(200 * 0.025)  # at most alpha, up to 3 sd
    gaps = [mean - np.mean(bounds[n]) for n in (100, 400, 1600)]
    assert gaps[0] > gaps[1] > gaps[2] > 0
    assert betting_lower_bound(np.zeros_like(_log_histogram(np.ones(1))), 0.025) is None
    assert betting_lower_bound(_log_histogram(np.zeros(50)), 0.025) == 0.0


def test_betting_variables_in_float32_with_gamma_near_one():
    """The rest of the horizon's discount, (gamma^T - gamma^h) / (1 - gamma), took 1 - gamma
    of gamma rounded to float32: 4.8e-7 for 5e-7 (5% off) at gamma 0.9999995. The kernel's
    constants now carry log gamma and 1 - gamma, each taken in float64."""
    from ope_cli.estimation.estimators.reduction import (
        _advance_one,
        betting_inputs,
        betting_variables,
        init_carry,
    )

    gamma, steps, horizon, a, b = 0.9999995, 1000, 1_000_000, 0.0, 1.0
    discounted = (1 - gamma**horizon) / (1 - gamma)
    rng = np.random.default_rng(2)
    log_ratio, reward = rng.normal(scale=0.1, size=steps), rng.uniform(a, b, size=steps)
    got = {}
    for dtype in (np.float32, np.float64):
        t = np.arange(steps)
        window = (
            jnp.asarray(log_ratio, dtype),
            jnp.asarray(reward, dtype),
            (jnp.asarray(gamma**t, dtype), jnp.asarray(t * math.log(gamma), dtype)),
            jnp.ones(steps, bool),
            jnp.asarray(t == 0),
            {},
        )
        betting_range = jnp.asarray(betting_inputs((a, b, discounted), horizon, gamma), dtype)
        carry = init_carry(jnp.zeros((), dtype), (), True)
        # jitted: op by op, each of the walk's operations compiles on its own
        carry, _, _ = jax.jit(_advance_one, static_argnums=2)(carry, window, (), betting_range)
        variables = jax.jit(betting_variables)(carry.betting, carry.trajectory, betting_range)
        got[dtype] = np.asarray(variables)
    np.testing.assert_allclose(np.exp(got[np.float32]), np.exp(got[np.float64]), rtol=1e-3)


def test_crossed_betting_bounds_say_chance_comes_first():
    """Lower variables of mean 0.9 and upper ones of mean 0.9 (their true means sum to 1,
    so these cannot both be): no value is consistent; the note named only faults (rewards
    out of range, missing actions), where on generated chain data it was chance."""
    from ope_cli.estimation.intervals import betting_intervals

    high_both = _log_histogram(np.full(400, 0.9))
    histogram = np.stack([high_both, high_both, high_both, high_both])
    intervals = betting_intervals(histogram, (0.0, 1.0, 1.0), 0.9)
    for low, high, note in intervals.values():
        assert low is None and high is None
        assert note.startswith("the lower betting bound exceeds the upper one")
        assert "by chance in at most 10% of datasets" in note
    (_, _, note), _ = betting_intervals(histogram, (0.0, 1.0, 1.0), 0.999).values()
    assert "in at most 0.1% of datasets" in note  # not "0%"
    (_, _, note), _ = betting_intervals(histogram, (0.0, 1.0, 1.0), 0.99999999).values()
    assert "in at most 0.000001% of datasets" in note  # not "1e-06%"
