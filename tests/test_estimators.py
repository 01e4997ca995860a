"""Estimators as plug-ins (ope_cli/estimation/estimators/): per-episode carries walked in windows
against plain formulas,
closed forms, the registry, and a toy estimator registered from the tests alone that goes
through the whole pipeline (in process, the table and JSON formatters, several devices)."""

from __future__ import annotations

import functools
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import subprocess_env, xla_flags
from datasets import (
    perturb_checkpoint,
    random_checkpoint,
    random_episodes,
    save_checkpoint,
    to_reference_input,
    write_step_layout,
)
from reference import discounts, reference_estimates

from ope_cli.estimation import estimators, stats
from ope_cli.estimation.estimators import base
from ope_cli.estimation.estimators.reduction import (
    WeightedBatch,
    batch_statistics,
    log_ratios,
)

TESTS = Path(__file__).parent


def _one_group(totals: base.Sums) -> base.Grouped:
    """``totals`` as the sums of one resampling group (a finalize's Grouped)."""
    return base.Grouped(totals, np.zeros(1, np.int64), lambda groups: totals)


def one_episode(rng, length, padded, gamma=0.9):
    """(log ratios [padded], rewards, discounts, step mask) of an episode absorbing after
    ``length`` steps, as NumPy arrays."""
    real = np.arange(padded) < length
    log_ratio = np.where(real, rng.normal(0, 0.5, padded), 0.0)
    reward = np.where(real, rng.normal(1, 1, padded), 0.0)
    return log_ratio, reward, gamma ** np.arange(padded), real


@functools.cache
def _jitted_advance_one():
    """``reduction._advance_one`` jitted once (op by op, each window's few dozen operations
    each compiled on their own; ``test_jitted_walk_equals_the_eager_one`` checks the two)."""
    from ope_cli.estimation.estimators.reduction import _advance_one

    return jax.jit(_advance_one, static_argnums=(2, 3))


def walk(name, log_ratio, reward, discount, real, width):
    """(per-episode values, {StepSum: [T]}) of estimator ``name`` (with the core values)
    on one episode, walked through ``reduction._advance_one`` in windows of ``width`` steps."""
    from ope_cli.estimation.estimators.reduction import init_carry

    carry = init_carry(jnp.zeros(()), (name,), False)
    step_values = {}
    for start in range(0, log_ratio.size, width):
        part = slice(start, start + width)
        steps = (
            jnp.asarray(log_ratio[part]),
            jnp.asarray(reward[part]),
            discounts(discount[part]),
            jnp.asarray(real[part]),
            jnp.asarray(np.arange(start, start + width) == 0),
            {},
        )
        carry, values, _ = _jitted_advance_one()(carry, steps, (name,), None)
        for key, value in values.items():
            step_values.setdefault(key, []).append(np.asarray(value))
    values = base.core_values(carry.trajectory)
    values.update(estimators.get(name).finish(carry.estimators[name], carry.trajectory))
    steps = {key: np.concatenate(parts) for key, parts in step_values.items()}
    return {key: float(v) for key, v in values.items()}, steps, carry.trajectory


@pytest.mark.parametrize("width", [8, 4, 3, 1])
def test_per_episode_carries_match_plain_formulas_in_any_windows(width):
    rng = np.random.default_rng(0)
    log_ratio, reward, discount, real = one_episode(rng, 5, 12)
    log_w = np.cumsum(log_ratio)
    g = reward @ discount
    padded = -(-12 // width) * width  # whole windows: the padding is absorbing
    arrays = [np.pad(x, (0, padded - 12)) for x in (log_ratio, reward)]
    arrays += [0.9 ** np.arange(padded), np.pad(real, (0, padded - 12))]
    values, steps, trajectory = walk("is", *arrays, width)
    assert values["is_wg"] == pytest.approx(g, rel=1e-15)  # relative to W itself
    assert values["is_w2g2"] == pytest.approx(g * g, rel=1e-15)
    assert values["count"] == 1.0 and values["zero_count"] == 0.0
    assert values["sum_w"] == 1.0 and values["sum_w2"] == 1.0
    assert float(trajectory.log_w) == pytest.approx(log_w[-1], rel=1e-14)
    assert float(trajectory.log_peak) == pytest.approx(log_w.max(), rel=1e-14)
    np.testing.assert_allclose(steps["wr_t"][:12], reward, rtol=1e-15)
    np.testing.assert_array_equal(steps["w_t"], np.ones(padded))
    values, *_ = walk("pdis", *arrays, width)
    log_discounted = log_w + np.log(discount)
    assert float(trajectory.log_discounted_peak) == pytest.approx(log_discounted.max(), rel=1e-14)
    # P relative to the largest gamma^t W_t of a step with a reward, the size of its terms
    largest = log_discounted[reward != 0].max()
    p = np.sum(np.exp(log_discounted - largest) * reward)
    assert values["pdis_scale"] == pytest.approx(largest, rel=1e-14)
    assert values["sum_p"] == pytest.approx(p, rel=1e-13)
    assert values["sum_p2"] == pytest.approx(p * p, rel=1e-13)


def test_jitted_walk_equals_the_eager_one():
    from ope_cli.estimation.estimators.reduction import _advance_one, init_carry

    rng = np.random.default_rng(5)
    log_ratio, reward, discount, real = one_episode(rng, 7, 8)
    steps = (jnp.asarray(log_ratio), jnp.asarray(reward), discounts(discount), jnp.asarray(real))
    steps = (*steps, jnp.asarray(np.arange(8) == 0), {})
    carry = init_carry(jnp.zeros(()), ("pdis",), False)

    def step(carry, steps):
        return _advance_one(carry, steps, ("pdis",), None)[:2]

    eager = step(carry, steps)
    jitted = jax.jit(step)(carry, steps)
    for a, b in zip(jax.tree.leaves(eager), jax.tree.leaves(jitted), strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-14)


def test_zero_weight_episode_values_stay_finite():
    rng = np.random.default_rng(1)
    log_ratio, reward, discount, real = one_episode(rng, 3, 4)
    log_ratio[1] = -np.inf  # pi_e gives the second action probability 0
    values, steps, trajectory = walk("pdis", log_ratio, reward, discount, real, 2)
    assert values["zero_count"] == 1.0
    assert np.isfinite(values["sum_p"]) and np.isfinite(values["sum_p2"])
    assert float(trajectory.log_w) == -np.inf


@jax.jit
def _jitted_statistics(batch, gamma):
    return batch_statistics(batch, gamma, 8, estimators=("is", "wis", "pdis", "wpdis"))


def finalize_episodes(episodes, gamma, groups=None):
    """Estimates of reference-format episodes through one padded batch, merge and finalize."""
    n, longest = len(episodes), max(len(ep["reward"]) for ep in episodes)
    log_target, log_behavior, reward = (np.zeros((n, longest)) for _ in range(3))
    step_mask = np.zeros((n, longest), bool)
    for i, ep in enumerate(episodes):
        t = len(ep["reward"])
        log_target[i, :t], log_behavior[i, :t], reward[i, :t] = (
            ep["log_target"],
            ep["log_behavior"],
            ep["reward"],
        )
        step_mask[i, :t] = True
    group = np.arange(n) % 8 if groups is None else groups
    batch = WeightedBatch(
        log_ratios(jnp.asarray(log_target), jnp.asarray(log_behavior), jnp.asarray(step_mask)),
        jnp.asarray(reward),
        jnp.asarray(step_mask),
        jnp.ones(n, bool),
        jnp.asarray(group, jnp.int32),
        jnp.zeros((n, 0)),
    )
    statistics = _jitted_statistics(batch, jnp.asarray(gamma))
    accumulator = stats.merge(stats.init(8), stats.from_batch(statistics))
    return stats.finalize(accumulator, gamma, longest, 0.95)


def test_on_policy_data_gives_the_mean_return():
    rng = np.random.default_rng(2)
    episodes = []
    for _ in range(20):
        t = int(rng.integers(1, 9))
        log_b = np.log(rng.uniform(0.1, 1.0, t))
        episodes.append({"log_target": log_b, "log_behavior": log_b, "reward": rng.normal(size=t)})
    estimates, diagnostics = finalize_episodes(episodes, 1.0)
    mean_return = np.mean([ep["reward"].sum() for ep in episodes])
    for name in ("is", "wis", "pdis"):
        assert estimates[name].value == pytest.approx(mean_return, rel=1e-12), name
    assert diagnostics.ess == pytest.approx(20, rel=1e-12)


def test_one_episode_gives_its_return_for_the_weighted_estimators():
    rng = np.random.default_rng(3)
    episode = {
        "log_target": rng.normal(size=6),
        "log_behavior": rng.normal(size=6),
        "reward": rng.normal(size=6),
    }
    estimates, _ = finalize_episodes([episode], 0.9)
    ret = float(episode["reward"] @ 0.9 ** np.arange(6))
    assert estimates["wis"].value == pytest.approx(ret, rel=1e-12)
    assert estimates["wpdis"].value == pytest.approx(ret, rel=1e-12)
    reference = reference_estimates([episode], 0.9)
    for name in ("is", "pdis"):
        assert estimates[name].value == pytest.approx(reference[name], rel=1e-12)
    assert estimates["is"].stderr is None and estimates["wis"].stderr is None


def test_registry_order_titles_and_method_texts():
    assert estimators.names()[:4] == ("is", "wis", "pdis", "wpdis")
    assert [estimators.get(n).title for n in ("is", "wis", "pdis", "wpdis")] == [
        "IS",
        "WIS",
        "PDIS",
        "WPDIS",
    ]
    assert estimators.title("unknown") == "unknown"
    four = ("is", "wis", "pdis", "wpdis")
    assert base.describe_standard_errors(four) == (
        "standard errors: sample standard error (is, pdis), delta method (wis), grouped "
        "jackknife over 32 episode-id hash groups (wpdis)"
    )
    assert base.describe_betting(four) == (
        "trajectory weights for is and wis, per-decision weights for pdis and wpdis"
    )
    assert base.describe_bootstrap_t(four) == (
        "studentized (bootstrap-t) interval for is, wis, pdis and percentile for wpdis"
    )


def test_a_sum_cannot_be_declared_twice_differently():
    clash = base.Estimator(
        name="clash",
        title="CLASH",
        stderr_method="none",
        sums=(base.Sum("sum_wg", base.DECISION),),  # is and wis declare it on TRAJECTORY
        finalize=lambda grouped, context: base.Point(None, None),
    )
    with pytest.raises(ValueError, match="already declared differently"):
        estimators.register(clash)
    assert "clash" not in estimators.names()


# --- a toy estimator through the whole pipeline ----------------------------------------------


@pytest.fixture(scope="module")
def toy_case(tmp_path_factory):
    """Logs of 200 episodes and a checkpoint; the expected toy value of that policy."""
    tmp = tmp_path_factory.mktemp("toy")
    rng = np.random.default_rng(4)
    behavior = random_checkpoint("tabular", rng)
    episodes = random_episodes(rng, 200, behavior=behavior, max_length=12)
    target = perturb_checkpoint(behavior, rng, 0.3)
    path = save_checkpoint(tmp / "target.npz", target)
    data = write_step_layout(episodes, tmp / "logs.parquet")
    reference = to_reference_input(episodes, target)
    sys.path.insert(0, str(TESTS))
    import toy_estimator

    expected = toy_estimator.expected_toy(
        [ep["log_target"] for ep in reference], [ep["log_behavior"] for ep in reference]
    )
    estimators.unregister("toy")
    return data, path, expected, reference


@pytest.fixture
def toy_registered():
    import toy_estimator

    estimators.register(toy_estimator.TOY)
    yield
    estimators.unregister("toy")


def test_toy_estimator_through_evaluate_and_the_formatters(toy_case, toy_registered):
    from rich.console import Console

    from ope_cli.config import EvaluationConfig, IntervalConfig
    from ope_cli.estimation.pipeline import evaluate
    from ope_cli.report import render_table, to_json

    data, path, expected, reference = toy_case
    config = EvaluationConfig(
        data=str(data), policies=(str(path),), gamma=0.9, estimators=("toy", "wis")
    )
    result = evaluate(config)
    toy = result.results[0].estimates["toy"]
    assert toy.value == pytest.approx(expected, rel=1e-10)
    assert toy.stderr is not None and toy.ci_low < toy.value < toy.ci_high
    wis = reference_estimates(reference, 0.9)["wis"]
    assert result.results[0].estimates["wis"].value == pytest.approx(wis, rel=1e-10)
    assert "toy sample standard error (toy)" in result.confidence.method

    document = json.loads(to_json(result))
    assert list(document["results"][0]["estimates"]) == ["toy", "wis"]
    assert document["results"][0]["estimates"]["toy"]["value"] == pytest.approx(expected)
    console = Console(file=io.StringIO(), width=200)
    render_table(result, console, rank_by="toy")
    assert "TOY" in console.file.getvalue()

    bootstrap = evaluate(
        EvaluationConfig(
            data=str(data),
            policies=(str(path),),
            gamma=0.9,
            estimators=("toy",),
            intervals=IntervalConfig(method="bootstrap-t", bootstrap_samples=50),
        )
    )
    interval = bootstrap.results[0].estimates["toy"]
    assert interval.value == pytest.approx(expected, rel=1e-10)
    assert interval.ci_low is not None and interval.ci_low < interval.value < interval.ci_high


@pytest.mark.slow
def test_toy_estimator_on_two_devices_through_the_cli(toy_case):
    """A fresh process: the device count is set before JAX starts, the helper module
    registers the toy, and the CLI's own entry point runs with --estimator toy."""
    data, path, expected, _ = toy_case
    env = subprocess_env(
        {
            "XLA_FLAGS": xla_flags("--xla_force_host_platform_device_count=2"),
            "PYTHONPATH": os.pathsep.join([str(TESTS.parent), str(TESTS)]),
        }
    )
    command = [
        sys.executable,
        str(TESTS / "toy_estimator.py"),
        "evaluate",
        str(data),
        "-p",
        str(path),
        "--gamma",
        "0.9",
        "--estimator",
        "toy",
        "--devices",
        "2",
        "--format",
        "json",
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    document = json.loads(done.stdout)
    assert document["runtime"]["devices"] == 2
    assert list(document["results"][0]["estimates"]) == ["toy"]
    assert document["results"][0]["estimates"]["toy"]["value"] == pytest.approx(expected, rel=1e-10)


@pytest.mark.parametrize("name", ["wpdis", "wdr"])
def test_replicates_sum_their_steps_in_blocks(monkeypatch, name):
    """A self-normalised estimator's bootstrap replicates add their [R, L] per-step terms a
    block of steps at a time (bounded temporaries): the same values as all at once."""
    rng = np.random.default_rng(8)
    replicates, length = 6, 50
    step_sums = {
        "w_t": rng.gamma(1.0, size=(replicates, length)),
        "wr_t": rng.normal(size=(replicates, length)),
        "wq_t": rng.normal(size=(replicates, length)),
        "wv_next_t": rng.normal(size=(replicates, length)),
    }
    step_sums["w_t"][2, 30] = 0.0  # a replicate with no weight left at a step: NaN
    sums = base.Sums(
        {
            "dm_v": np.ones(replicates),
            "dm_dev": np.tile([4.0, 1.0, 1.0], (replicates, 1)),  # about the pivot 0
            "count": np.full(replicates, 4.0),
        },
        {},
        {"dm_terms": 0.0},
        step_sums,
        {"step": np.zeros(length)},
    )
    context = base.Context(0.97, length)
    whole = estimators.get(name).replicates(sums, context)[0]
    monkeypatch.setattr(base, "STEP_BLOCK_CELLS", 3 * replicates)  # blocks of three steps
    blocks = estimators.get(name).replicates(sums, context)[0]
    assert np.isnan(whole[2]) and np.isnan(blocks[2])
    np.testing.assert_allclose(blocks, whole, rtol=1e-13)
    assert np.all(np.isfinite(np.delete(whole, 2)))


def test_a_standard_error_float64_sums_cannot_resolve_gets_a_note():
    """sum x^2 - (sum x)^2 / n cancels when the terms' mean dwarfs their spread (a constant
    added to every reward): the standard error comes with what it is good to, and where
    that is beyond UNRESOLVED (the computed spread may be rounding alone: a standard error
    45x too large was noted "good to about 5e-01") it is dropped, with the reason."""

    from ope_cli.estimation.estimators.importance import (
        NOT_RESOLVED,
        RESOLVED,
        UNRESOLVED,
        spread_resolution,
    )

    rng = np.random.default_rng(4)
    spread = rng.normal(size=2000)
    notes, drops = {}, {}
    for offset in (0.0, 1e3, 1e5, 1e7):
        x = offset + spread
        notes[offset], drops[offset] = spread_resolution(x.sum(), (x * x).sum(), x.size)
    assert notes[0.0] is None and notes[1e3] is None
    assert notes[1e5].startswith("standard error good to about 2e-06 only")
    assert notes[1e7].startswith(f"{NOT_RESOLVED} in float64 sums")
    assert "1e+07 times their spread" in notes[1e7]
    assert drops == {0.0: False, 1e3: False, 1e5: False, 1e7: True}
    assert spread_resolution(6.0, 12.0, 3.0) == (  # three equal terms: 2, 2, 2 (0 is right)
        "standard error 0 to float64's precision: any spread of the terms is below the "
        "rounding of their squares' sum",
        False,
    )
    assert spread_resolution(1.0, 1.0, 1.0) == (None, False)
    assert (RESOLVED, UNRESOLVED) == (1e-6, 1e-3)
    # terms computed in float32 were each rounded by eps32 of their size: that moves the
    # standard error by about e / sqrt(12 n) + e^2 / 24, e = eps32 * size / spread (a Q-hat
    # of 1e6 + N(0, 1) left dm's 4.7% off, noted "good to about 4e-04" from the sums alone)
    single = {}
    for offset in (0.0, 1e3, 1e5, 1e6, 1e7):
        x = offset + spread
        single[offset] = spread_resolution(x.sum(), (x * x).sum(), x.size, precision="float32")
    assert single[0.0] == single[1e3] == (None, False)
    assert single[1e5] == (
        "standard error good to about 8e-05 only from rounding its float32 terms: the terms' "
        "mean is 1e+05 times their spread",
        False,
    )
    for offset in (1e6, 1e7):
        note, drop = single[offset]
        assert note.startswith(f"{NOT_RESOLVED} in float32 terms: the terms' mean is") and drop
    assert spread_resolution(6.0, 12.0, 3.0, precision="float32")[0].startswith(
        "standard error 0 to float32's precision"
    )

    def through_is(x):  # the estimator's own finalize
        totals = base.Sums(
            {"is_wg": x.sum(), "is_w2g2": (x * x).sum(), "count": float(x.size)},
            {"weighted_return": 0.0},
            {},
            {},
            {},
        )
        context = base.Context(1.0, 1)
        return estimators.get("is").finalize(_one_group(totals), context)

    noted = through_is(1e5 + spread)  # the value and standard error stay, noted
    assert noted.value == pytest.approx(1e5 + spread.mean()) and noted.stderr is not None
    assert "good to about" in noted.note
    dropped = through_is(1e7 + spread)  # the value stays; the standard error is null
    assert dropped.value == pytest.approx(1e7 + spread.mean()) and dropped.stderr is None
    assert dropped.note.startswith(NOT_RESOLVED)


def test_a_standard_error_noted_zero_is_zero():
    """The resolution check and the standard error read the same cancelled difference: with
    terms 1.9e12 + U(0, 1) (a large constant in every reward), sum x^2 / n - (sum x / n)^2
    could round to 0 where sum x^2 - (sum x)^2 / n did not, and IS printed a standard error
    of 1134 (the reference 0.0196) noted "0 to float64's precision". Each standard error
    is now 0 with that note, or null (unresolved), or the reference."""

    from ope_cli.estimation.estimators.importance import NOT_RESOLVED, zero_to_precision

    outcomes = set()
    for seed in range(40):
        x = 1.9e12 + np.random.default_rng(seed).uniform(0, 1, size=400)
        totals = base.Sums(
            {"is_wg": x.sum(), "is_w2g2": (x * x).sum(), "count": float(x.size)},
            {"weighted_return": 0.0},
            {},
            {},
            {},
        )
        point = estimators.get("is").finalize(_one_group(totals), base.Context(1, 1))
        note = point.note or ""
        if note.startswith(zero_to_precision()):
            assert point.stderr == 0.0, (seed, point)
            outcomes.add("zero")
        elif note.startswith(NOT_RESOLVED):
            assert point.stderr is None, (seed, point)
            outcomes.add("null")
        else:
            reference = x.std(ddof=1) / np.sqrt(x.size)
            assert point.stderr == pytest.approx(reference, rel=1e-3), (seed, point)
    assert outcomes == {"zero", "null"}


def test_a_standard_error_of_huge_terms_is_not_noted_zero():
    """total * total overflowed past 1.3e154: 1000 terms of about 1.5e152 (10% spread) had
    a standard error of 0, noted "0 to float64's precision" (the true one is 4.6e149)."""
    from ope_cli.estimation.estimators.importance import mean_and_sem, spread_resolution

    x = 1.5e152 * (1 + 0.1 * np.random.default_rng(2).standard_normal(1000))
    _, stderr = mean_and_sem(x.sum(), (x * x).sum(), 1000.0, 0.0)
    assert float(stderr) == pytest.approx(x.std(ddof=1) / np.sqrt(1000), rel=1e-9)
    assert spread_resolution(x.sum(), (x * x).sum(), 1000.0) == (None, False)


def test_a_mean_below_float64_s_range_is_noted():
    """Every trajectory weight about e^-800: IS is not 0 but prints as 0 +- 0, and the
    zero-width warning blamed the episodes' spread. Its note says the weights underflow;
    a mean in range has none."""

    from ope_cli.estimation.estimators.importance import UNDERFLOW

    x = np.random.default_rng(1).uniform(1, 2, size=30)

    def through_is(log_scale):
        totals = base.Sums(
            {"is_wg": x.sum(), "is_w2g2": (x * x).sum(), "count": float(x.size)},
            {"weighted_return": log_scale},
            {},
            {},
            {},
        )
        return estimators.get("is").finalize(_one_group(totals), base.Context(1, 1))

    below = through_is(-800.0)
    assert below.value == 0.0 and below.stderr == 0.0 and below.note == UNDERFLOW
    assert through_is(-600.0).note is None and through_is(-600.0).value > 0


def test_wis_of_one_weighted_episode_has_no_standard_error():
    """Where every other weight is zero, WIS is that episode's return and its delta-method
    standard error is 0 by construction (it printed 0.0 and a zero-width interval): null,
    with the reason; two weighted episodes keep theirs."""

    def wis(count, zero_count, returns, weights):
        w, g = np.asarray(weights, float), np.asarray(returns, float)
        pivot = g[np.argmax(w)]
        totals = base.Sums(
            {
                "sum_wg": w @ g,
                "sum_w": w.sum(),
                "wis_w": np.array([w.sum(), w @ (g - pivot)]),
                "wis_w2": np.array([w @ w, (w * w) @ (g - pivot), (w * w) @ (g - pivot) ** 2]),
                "count": float(count),
                "zero_count": float(zero_count),
            },
            {"trajectory": 0.0},
            {},
            {},
            {},
        )
        context = base.Context(1.0, 1)
        return estimators.get("wis").finalize(_one_group(totals), context)

    one = wis(3, 2, [2.5, 1.0, 7.0], [1.0, 0.0, 0.0])
    assert one.value == pytest.approx(2.5) and one.stderr is None
    assert one.note == "one episode holds all the weight; no standard error"
    two = wis(3, 1, [2.5, 1.0, 7.0], [1.0, 0.5, 0.0])
    assert two.value == pytest.approx(2.0) and two.stderr > 0 and two.note is None


def test_a_jackknife_standard_error_below_float64_rounding_is_dropped():
    """WPDIS's leave-one-group-out values of rewards 1e8 + tiny noise differ by less than
    their rounding: the jackknife standard error (33% off where it was printed without a
    word) is null with the reason; an ordinary one is kept without a note."""
    from ope_cli.estimation.estimators.importance import NOT_RESOLVED, _resolved_spread

    assert _resolved_spread(0.05, 2.0) == (0.05, None)
    stderr, note = _resolved_spread(2.6e-7, 1e8)
    assert stderr is None and note.startswith(f"{NOT_RESOLVED} in float64 sums")
    stderr, note = _resolved_spread(1e-3, 1e8)  # rounding 2e-7 of it: kept, noted
    assert stderr == 1e-3 and note.startswith("standard error good to about 2e-04 only")
    assert _resolved_spread(0.0, 20.0) == (0.0, None)  # equal leave-outs: a constant return


def test_the_discounts_are_computed_once_per_context():
    """Every leave-one-group-out value of the jackknife reads gamma^t: a context computes
    it once (33 powers over a 1.8M-step episode took 4.2 s), as the definition gives it."""
    context = base.Context(0.97, 1_000)
    assert context.discount_t is context.discount_t
    np.testing.assert_array_equal(context.discount_t, 0.97 ** np.arange(1_000.0))


def test_a_spread_cancelled_in_the_squares_is_not_a_standard_error_of_zero(tmp_path):
    """Rewards of 1e6 + 0.01 noise (four steps, weights 1): sum x^2 - (sum x)^2 / n
    cancelled to 0, and IS and PDIS printed a standard error of 0.0 and an interval of no
    width (the reference 0.0037), while a larger noise (0.1) gave null. The episode-id
    hash groups' means differ past their rounding, so the spread is lost, not 0: null with
    the reason. Identical episodes keep their standard error of 0."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ope_cli.config import EvaluationConfig
    from ope_cli.estimation.estimators.importance import NOT_RESOLVED, zero_to_precision
    from ope_cli.estimation.pipeline import evaluate

    def estimates(rewards_et: np.ndarray) -> dict:
        episodes, steps = rewards_et.shape
        table = pa.table(
            {
                "episode_id": np.repeat(np.arange(episodes), steps),
                "step": np.tile(np.arange(steps), episodes),
                "action": np.zeros(episodes * steps, np.int64),
                "reward": rewards_et.ravel(),
                "behavior_prob": np.full(episodes * steps, 0.5),
                "target_prob": np.full(episodes * steps, 0.5),
            }
        )
        path = tmp_path / "logs.parquet"
        pq.write_table(table, path)
        config = EvaluationConfig(data=str(path), gamma=1.0, estimators=("is", "pdis"))
        return evaluate(config).results[0].estimates

    noisy = 1e6 + 0.01 * np.random.default_rng(7).normal(size=(20, 4))
    reference = noisy.sum(axis=1).std(ddof=1) / np.sqrt(20)
    assert reference > 1e-3
    for name, estimate in estimates(noisy).items():
        assert estimate.value == pytest.approx(noisy.sum(axis=1).mean(), rel=1e-12), name
        assert estimate.stderr is None and estimate.ci_low is None, (name, estimate)
        assert estimate.note.startswith(NOT_RESOLVED), estimate.note
    identical = np.tile([1e6 + 0.5, 1e6 + 0.25, 1e6, 1e6 + 0.75], (20, 1))
    for name, estimate in estimates(identical).items():
        assert estimate.stderr == 0.0, (name, estimate)
        assert estimate.note is None or estimate.note.startswith(zero_to_precision())


@pytest.mark.parametrize("spread", [0.1, 1.0, 10.0])
def test_a_spread_float64_resolves_only_roughly_is_not_a_standard_error_of_zero(tmp_path, spread):
    """Rewards of 1e12 + N(0, 1) on 40 one-step episodes (weights 1): the squares cancelled
    to 0, and the hash groups' check asked their leave-out means to resolve the spread to
    1e-3 before it believed the terms differ, so IS and PDIS printed 0.0 and warned that
    the episodes show no spread (the reference 0.126). A spread beyond the leave-out
    means' rounding is enough: null, with the reason."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ope_cli.config import EvaluationConfig
    from ope_cli.estimation.estimators.importance import NOT_RESOLVED
    from ope_cli.estimation.pipeline import evaluate

    n = 40
    rewards = 1e12 + spread * np.random.default_rng(0).normal(size=n)
    table = pa.table(
        {
            "episode_id": np.arange(n),
            "action": np.zeros(n, np.int64),
            "reward": rewards,
            "behavior_prob": np.full(n, 0.5),
            "target_prob": np.full(n, 0.5),
        }
    )
    pq.write_table(table, tmp_path / "logs.parquet")
    config = EvaluationConfig(data=str(tmp_path / "logs.parquet"), gamma=1.0)
    estimates = evaluate(config).results[0].estimates
    for name in ("is", "pdis"):
        estimate = estimates[name]
        assert estimate.stderr is None and estimate.note.startswith(NOT_RESOLVED), estimate


def test_the_discounts_are_computed_once_per_run_and_cannot_be_written():
    """Each policy's and the comparison's finalisation made its own Context, and each
    computed gamma^t again (1.4 s of a run over a 10M-step episode); one array serves them
    all, read-only, since every reader shares it."""
    from ope_cli.estimation.estimators.base import Context

    first, second = Context(0.9, 50), Context(0.9, 50, "float32")
    assert first.discount_t is second.discount_t
    np.testing.assert_array_equal(first.discount_t, 0.9 ** np.arange(50, dtype=np.float64))
    with pytest.raises(ValueError, match="read-only"):
        first.discount_t[0] = 2.0
    assert Context(0.5, 50).discount_t[1] == 0.5
