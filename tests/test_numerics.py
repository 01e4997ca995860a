"""Numerical edge cases of the whole pipeline against the float64 reference (SPEC 4, 5).

Each case gives the reference's number (relative 1e-6), or - where no finite float64
exists - a null with a note saying why, never NaN or inf in the JSON document:

- trajectory weights whose product overflows float64 (log W > 709): WIS, WPDIS and the
  diagnostics are exact through log-space accumulation; IS/PDIS are null with a note;
- weights that underflow (log W < -745): the weighted estimates are still exact;
- one episode of more than 10,000 steps (a 16,384-step bucket);
- every weight zero (logged target probabilities 0): WIS and WPDIS null with a note;
- a single episode: WIS = its return, no standard error (n = 1);
- rewards of 1e30 (and 1e200, where squares overflow: standard errors null).
"""

from __future__ import annotations

import dataclasses
import json
import math

import numpy as np
import pyarrow as pa
import pytest
from datasets import (
    add_target_probs,
    perturb_checkpoint,
    random_checkpoint,
    random_episodes,
    save_checkpoint,
    step_layout_table,
    to_reference_input,
    write_step_layout,
    write_table,
)
from reference import (
    DIAGNOSTICS,
    ESTIMATORS,
    reference_estimates,
    reference_log_prob,
    reference_stderr,
)

import ope_cli
from ope_cli.config import (
    BatchingConfig,
    ChoosingConfig,
    ColumnMapping,
    EvaluationConfig,
    RuntimeConfig,
)
from ope_cli.data.buckets import window_shapes
from ope_cli.estimation.pipeline import evaluate
from ope_cli.report import to_json

REL = 1e-6


def _run(data, policies=(), gamma=1.0, **batching):
    config = EvaluationConfig(
        data=str(data),
        policies=tuple(str(p) for p in policies),
        gamma=gamma,
        batching=BatchingConfig(**batching),
        runtime=RuntimeConfig(precision="float64"),
    )
    return evaluate(config)


def _close(actual, expected, what):
    if expected is None:
        assert actual is None, f"{what}: expected null, got {actual}"
    else:
        assert actual is not None, f"{what}: expected {expected}, got null"
        assert math.isclose(actual, expected, rel_tol=REL, abs_tol=1e-300), (what, actual, expected)


def _check(result, reference_input, gamma, stderr=True):
    """Every estimate and diagnostic equals the reference; a null has a note; the JSON
    document holds no NaN or infinity."""
    expected = reference_estimates(reference_input, gamma)
    expected_stderr = reference_stderr(reference_input, gamma)
    (policy,) = result.results
    for name in ESTIMATORS:
        estimate = policy.estimates[name]
        _close(estimate.value, expected[name], name)
        if estimate.value is None:
            assert estimate.note, f"{name} is null without a note"
        if stderr and name in expected_stderr:
            _close(estimate.stderr, expected_stderr[name], f"{name}.stderr")
    for name in DIAGNOSTICS:
        _close(getattr(policy.diagnostics, name), expected[name], name)
    json.loads(to_json(result), parse_constant=lambda c: pytest.fail(f"{c} in the JSON"))
    return expected


def _opposed(tmp_path, n_episodes=24, length=400, seed=1):
    """Tabular episodes sampled from a peaked policy S, a policy A that puts the logged
    actions' probability mass elsewhere (logits -S), and the target checkpoint near S.
    Returns (episodes logged as if by A, episodes logged by S, checkpoints A and S', paths)."""
    rng = np.random.default_rng(seed)
    sampler = random_checkpoint("tabular", rng, n_states=4, n_actions=3, scale=3.0)
    anti = {"kind": "tabular", "logits": -sampler["logits"]}
    episodes = random_episodes(
        rng,
        n_episodes,
        behavior=sampler,
        length_dist="fixed",
        median_length=length,
        max_length=length,
    )
    near = perturb_checkpoint(sampler, rng, 0.3)

    def logged_by(ckpt):
        out = []
        for e in episodes:
            log_b = reference_log_prob(ckpt, e["observation"], e["action"])
            out.append({**e, "behavior_log_prob": log_b, "behavior_prob": np.exp(log_b)})
        return out

    return (
        logged_by(anti),
        episodes,
        anti,
        near,
        save_checkpoint(tmp_path / "anti.npz", anti),
        save_checkpoint(tmp_path / "near.npz", near),
    )


def test_weights_that_overflow_float64_as_a_product(tmp_path):
    """Logged propensities of a policy that rarely takes the logged actions, a target that
    usually does: every trajectory weight is beyond e^709, the largest float64."""
    logged, _, _, near, _, near_path = _opposed(tmp_path)
    reference_input = to_reference_input(logged, near)
    log_w = [float(np.sum(e["log_target"] - e["log_behavior"])) for e in reference_input]
    assert min(log_w) > 710, min(log_w)
    result = _run(write_step_layout(logged, tmp_path / "logs.parquet"), [near_path])
    expected = _check(result, reference_input, 1.0)
    assert expected["wis"] is not None and expected["wpdis"] is not None
    estimates = result.results[0].estimates
    assert estimates["is"].value is None and "overflow" in estimates["is"].note
    assert estimates["pdis"].value is None and "overflow" in estimates["pdis"].note
    assert result.results[0].diagnostics.max_weight is None  # e^{log W} itself overflows
    assert result.results[0].diagnostics.ess is not None


def _log_space_pdis(log_ratios, rewards, gamma):
    """[n] each episode's sum_t gamma^t W_t r_t, computed as exp(t log gamma + log W_t)."""
    return np.array(
        [
            np.sum(np.exp(np.arange(len(r)) * math.log(gamma) + np.cumsum(lr)) * r)
            for lr, r in zip(log_ratios, rewards, strict=True)
        ]
    )


@pytest.mark.parametrize(
    ("steps", "ratio", "gamma", "precision"),
    [
        (1100, 2.0, 0.5, "float64"),  # W_t reaches 2^1100 (log 762), gamma^t W_t stays 1
        (700, 2.0, 0.5, "float64"),  # log W 485: W_t^2 overflows, the terms do not
        (500, 2.0, 0.5, "float32"),  # log W 347, far past float32's 88
    ],
)
def test_discounted_terms_of_weights_past_the_float_range(tmp_path, steps, ratio, gamma, precision):
    """PDIS and DR (with a zero Q, so DR = PDIS) of an episode whose weight W_t leaves the
    float range while every discounted term gamma^t W_t r_t stays small: their terms are
    kept relative to the largest gamma^t W_t. Relative to the largest W_t they underflowed:
    PDIS and DR printed 0.0 +- 0.0 (log W past 709), a standard error of 0 (past 355), or
    in float32 a value 61% low, each without a note."""
    lengths = (steps, 1, 2, 3)
    log_ratios = [np.full(steps, math.log(ratio))] + [np.zeros(k) for k in lengths[1:]]
    rewards = [np.ones(k) for k in lengths]
    log_behavior = math.log(0.5)
    table = pa.table(
        {
            "episode_id": np.repeat(np.arange(4), lengths),
            "step": np.concatenate([np.arange(k) for k in lengths]),
            "action": np.zeros(sum(lengths), np.int64),
            "reward": np.concatenate(rewards),
            "behavior_log_prob": np.full(sum(lengths), log_behavior),
            "target_log_prob": log_behavior + np.concatenate(log_ratios),
            "q": np.zeros(sum(lengths)),
            "v": np.zeros(sum(lengths)),
        }
    )
    write_table(table, tmp_path / "long.parquet")
    terms = _log_space_pdis(log_ratios, rewards, gamma)
    value, stderr = terms.mean(), terms.std(ddof=1) / math.sqrt(len(terms))
    config = EvaluationConfig(
        data=str(tmp_path / "long.parquet"),
        gamma=gamma,
        estimators=("pdis", "dr"),
        columns=ColumnMapping(q_value="q", v_value="v"),
        runtime=RuntimeConfig(precision=precision),
    )
    (result,) = evaluate(config).results
    rel = 1e-9 if precision == "float64" else 1e-3  # float32: log W drifts ~1e-5 over 500 steps
    for name in ("pdis", "dr"):
        estimate = result.estimates[name]
        assert estimate.value == pytest.approx(value, rel=rel), name
        assert estimate.stderr == pytest.approx(stderr, rel=rel), name


def _ratio_logs(path, log_ratios, rewards) -> str:
    """Episodes given by their log ratios and rewards (lists of [T_i]) as a step-layout
    file with logged log-probabilities (each at most 0: the ratio's rises in the behavior's,
    its falls in the target's) and a zero critic (q, v: then DR equals PDIS)."""
    lengths = np.array([len(r) for r in rewards])
    ratios = np.concatenate(log_ratios)
    log_half = math.log(0.5)
    table = pa.table(
        {
            "episode_id": np.repeat(np.arange(lengths.size), lengths),
            "step": np.concatenate([np.arange(k) for k in lengths]),
            "action": np.zeros(lengths.sum(), np.int64),
            "reward": np.concatenate(rewards),
            "behavior_log_prob": log_half - np.maximum(ratios, 0.0),
            "target_log_prob": log_half + np.minimum(ratios, 0.0),
            "q": np.zeros(lengths.sum()),
            "v": np.zeros(lengths.sum()),
        }
    )
    write_table(table, path)
    return str(path)


def _critic_run(data: str, estimators: tuple[str, ...], **options):
    """The one policy's result of evaluating ``data`` (``_ratio_logs``) at gamma 1 in
    float64 with its critic columns."""
    config = EvaluationConfig(
        data=data,
        gamma=1.0,
        estimators=estimators,
        columns=ColumnMapping(q_value="q", v_value="v"),
        runtime=RuntimeConfig(precision="float64"),
        **options,
    )
    (result,) = evaluate(config).results
    return result


def _check_mean_of_terms(result, names, terms) -> None:
    """Each of ``names`` is the mean of ``terms`` with its sample standard error."""
    for name in names:
        estimate = result.estimates[name]
        assert estimate.value == pytest.approx(terms.mean(), rel=1e-9), name
        expected = terms.std(ddof=1) / math.sqrt(terms.size)
        assert estimate.stderr == pytest.approx(expected, rel=1e-9), (name, estimate.note)


@pytest.mark.parametrize("long", [400, 760])  # log W of the long episode: 400, 760
def test_an_enormous_weight_with_a_zero_return_leaves_the_other_terms(tmp_path, long):
    """One episode's weight e^400 or e^760 with no reward at all: its IS, PDIS and DR
    terms are 0, so the estimates are the other episodes' ordinary mean. Against its
    weight as the batch's scale, every other term underflowed: IS and PDIS printed 0.0 +-
    0.0 (past e^745), or their standard errors 0 (past e^355), with a zero-width interval
    said to show "no spread" in the data."""
    rng = np.random.default_rng(5)
    short = 300
    log_ratios = [rng.normal(0.0, 0.3, 5) for _ in range(short)] + [np.ones(long)]
    rewards = [rng.integers(0, 2, 5).astype(float) for _ in range(short)] + [np.zeros(long)]
    data = _ratio_logs(tmp_path / "logs.parquet", log_ratios, rewards)
    pairs = zip(log_ratios[:-1], rewards[:-1], strict=True)
    is_terms = np.append([np.exp(lr.sum()) * r.sum() for lr, r in pairs], 0.0)  # e^760 * 0
    pdis_terms = np.append(_log_space_pdis(log_ratios[:-1], rewards[:-1], 1.0), 0.0)
    behavior = ChoosingConfig(baseline="behavior")
    result = _critic_run(data, ("is", "pdis", "dr"), choosing=behavior)
    returns = np.array([r.sum() for r in rewards])
    for name, terms in (("is", is_terms), ("pdis", pdis_terms), ("dr", pdis_terms)):
        _check_mean_of_terms(result, (name,), terms)
        estimate = result.estimates[name]
        assert estimate.ci_low < estimate.value < estimate.ci_high, name
        paired = result.comparison[name]  # the same terms, paired with the returns
        assert paired.delta == pytest.approx((terms - returns).mean(), rel=1e-9), name
        expected = (terms - returns).std(ddof=1) / math.sqrt(terms.size)
        assert paired.stderr == pytest.approx(expected, rel=1e-9), name


def test_a_weight_that_peaks_far_above_its_term_keeps_its_square(tmp_path):
    """An episode whose weight climbs to e^414 and falls to e^14.5 before its one reward:
    its PDIS (and DR) term e^14.5 is the sample's largest, but relative to its peak it is
    e^-400, whose square underflowed: the standard error was 0.0, noted as a spread
    below rounding."""
    rng = np.random.default_rng(2)
    log_ratios = [rng.normal(0.0, 0.2, 3) for _ in range(40)]
    log_ratios.append(np.r_[np.full(10, 41.45), np.full(8, -50.0)])
    rewards = [rng.integers(0, 2, 3).astype(float) for _ in range(40)]
    rewards.append(np.r_[np.zeros(17), 1.0])
    data = _ratio_logs(tmp_path / "logs.parquet", log_ratios, rewards)
    result = _critic_run(data, ("pdis", "dr"))
    _check_mean_of_terms(result, ("pdis", "dr"), _log_space_pdis(log_ratios, rewards, 1.0))


@pytest.mark.parametrize(("climb", "final"), [(18, -4.0), (19, 37.5)])
def test_a_weight_past_e709_that_falls_back_before_its_reward(tmp_path, climb, final):
    """log W climbs 41.4 a step to 746 (or 787) and falls back to -4 (37.5) before the
    episode's one reward: its PDIS and DR terms are ordinary, but relative to its
    discounted peak they underflowed to 0 in the carry: DR printed 0.0631 against 0.0677,
    or 0.0214 against 4.6e14, with no word."""
    rng = np.random.default_rng(4)
    log_ratios = [rng.normal(0.0, 0.2, 3) for _ in range(40)]
    peak = 41.4 * climb
    fall = (peak - final) / 15
    log_ratios.append(np.r_[np.full(climb, 41.4), np.full(15, -fall)])
    rewards = [rng.integers(0, 2, 3).astype(float) for _ in range(40)]
    rewards.append(np.r_[np.zeros(climb + 14), 10.0])
    data = _ratio_logs(tmp_path / "logs.parquet", log_ratios, rewards)
    # only the steps with a reward: W_t itself overflows float64 on the way up
    pairs = zip(log_ratios, rewards, strict=True)
    terms = np.array([np.sum(np.exp(np.cumsum(lr)[r != 0]) * r[r != 0]) for lr, r in pairs])
    assert terms[-1] == pytest.approx(10.0 * math.exp(final), rel=1e-9)
    _check_mean_of_terms(_critic_run(data, ("pdis", "dr")), ("pdis", "dr"), terms)


def test_weights_that_underflow_float64(tmp_path):
    """The roles swapped: every trajectory weight is below e^-745 (0.0 as a plain float64
    product), yet WIS and WPDIS are exact and no weight counts as zero."""
    _, sampled, _, _, anti_path, _ = _opposed(tmp_path)
    anti = {"kind": "tabular", "logits": np.load(anti_path)["logits"]}
    reference_input = to_reference_input(sampled, anti)
    log_w = [float(np.sum(e["log_target"] - e["log_behavior"])) for e in reference_input]
    assert max(log_w) < -745, max(log_w)
    result = _run(write_step_layout(sampled, tmp_path / "low.parquet"), [anti_path])
    expected = _check(result, reference_input, 1.0)
    assert expected["wis"] is not None
    assert result.results[0].estimates["is"].value == 0.0  # underflows to 0, which is right
    assert result.results[0].diagnostics.zero_weight_fraction == 0.0  # tiny, not zero


def test_an_episode_of_more_than_10000_steps(tmp_path):
    rng = np.random.default_rng(3)
    behavior = random_checkpoint("linear_softmax", rng, obs_dim=3, n_actions=3)
    episodes = random_episodes(rng, 6, behavior=behavior, median_length=20, max_length=40)
    long = random_episodes(
        rng, 1, behavior=behavior, length_dist="fixed", median_length=12_345, max_length=12_345
    )[0]
    episodes.insert(2, {**long, "episode_id": 1000})
    target = perturb_checkpoint(behavior, rng, 0.02)  # log W stays moderate over 12k steps
    policy = save_checkpoint(tmp_path / "near.npz", target)
    result = _run(
        write_step_layout(episodes, tmp_path / "logs.parquet", row_group_size=5000),
        [policy],
        gamma=0.999,
        read_rows=4096,
    )
    assert result.dataset.max_length == 12_345
    # walked whole, window after window, by the one-lane window of very long episodes
    long_window = window_shapes(BatchingConfig())[-1]
    assert (long_window.lanes, long_window.width) in result.runtime.batch_shapes
    _check(result, to_reference_input(episodes, target), 0.999)


@pytest.mark.slow  # a million steps: written, evaluated and referenced
def test_a_one_million_step_episode_matches_the_reference(tmp_path):
    """One 1,000,000-step episode among short ones, log W drifting hundreds of e-folds:
    walked alone, window after window (its carry in log space), it gives the reference's
    estimates and standard errors, without holding more than a window in the kernel."""
    rng = np.random.default_rng(11)
    behavior = random_checkpoint("linear_softmax", rng, obs_dim=2, n_actions=3)
    episodes = random_episodes(rng, 5, behavior=behavior, median_length=20, max_length=40)
    long = random_episodes(
        rng, 1, behavior=behavior, length_dist="fixed", median_length=10**6, max_length=10**6
    )[0]
    episodes.insert(1, {**long, "episode_id": 1000})
    target = perturb_checkpoint(behavior, rng, 0.05)
    policy = save_checkpoint(tmp_path / "near.npz", target)
    data = write_step_layout(episodes, tmp_path / "logs.parquet", row_group_size=1 << 17)
    result = _run(data, [policy], gamma=0.9999)
    assert result.dataset.max_length == 10**6
    long_window = window_shapes(BatchingConfig())[-1]
    assert (long_window.lanes, long_window.width) in result.runtime.batch_shapes
    reference = to_reference_input(episodes, target)
    log_w = np.cumsum(reference[1]["log_target"] - reference[1]["log_behavior"])
    assert np.ptp(log_w) > 100  # far beyond what exp of a plain product survives in a window
    _check(result, reference, 0.9999)


def test_all_zero_weights_give_null_wis_with_a_note(tmp_path):
    rng = np.random.default_rng(4)
    behavior = random_checkpoint("linear_softmax", rng)
    episodes = add_target_probs(
        random_episodes(rng, 30, behavior=behavior, median_length=6, max_length=12), behavior
    )
    table = step_layout_table(episodes, extra_columns=["target_prob"])
    table = table.set_column(
        table.schema.get_field_index("target_prob"),
        "target_prob",
        pa.array(np.zeros(table.num_rows)),
    )
    write_table(table, tmp_path / "zero.parquet")
    result = _run(tmp_path / "zero.parquet")
    reference_input = [
        {**e, "log_target": np.full(len(e["reward"]), -np.inf)}
        for e in to_reference_input(episodes, behavior)
    ]
    expected = _check(result, reference_input, 1.0)
    assert expected["wis"] is None and expected["wpdis"] is None
    estimates = result.results[0].estimates
    assert estimates["is"].value == 0.0 and estimates["pdis"].value == 0.0
    assert "zero" in estimates["wis"].note
    assert "zero" in estimates["wpdis"].note
    document = json.loads(to_json(result))
    assert document["results"][0]["estimates"]["wis"]["value"] is None
    assert "NaN" not in to_json(result)


def test_a_single_episode(tmp_path):
    rng = np.random.default_rng(5)
    behavior = random_checkpoint("linear_softmax", rng)
    episodes = random_episodes(
        rng, 1, behavior=behavior, length_dist="fixed", median_length=9, max_length=9
    )
    target = perturb_checkpoint(behavior, rng, 0.5)
    policy = save_checkpoint(tmp_path / "target.npz", target)
    result = _run(write_step_layout(episodes, tmp_path / "one.parquet"), [policy], gamma=0.9)
    reference_input = to_reference_input(episodes, target)
    _check(result, reference_input, 0.9, stderr=False)  # the reference's WIS stderr is 0 here
    episode_return = float(np.sum(episodes[0]["reward"] * 0.9 ** np.arange(9)))
    estimates = result.results[0].estimates
    assert estimates["wis"].value == pytest.approx(episode_return, rel=1e-12)
    for name in ESTIMATORS:  # no spread from one episode: no standard error, no interval
        assert estimates[name].stderr is None and estimates[name].ci_low is None, name
    assert result.results[0].diagnostics.ess == pytest.approx(1.0)


@pytest.mark.parametrize("scale", [1e30, 1e200])
@pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")  # the reference's
def test_huge_rewards(tmp_path, scale):
    """1e30 rewards: every number is right. 1e200: so are the values, and the IS and PDIS
    standard errors, which their terms' own scale keeps in range; squares of WIS's
    returns overflow float64, so its standard error (and interval) is null, not inf or
    NaN."""
    rng = np.random.default_rng(6)
    behavior = random_checkpoint("linear_softmax", rng)
    episodes = random_episodes(rng, 40, behavior=behavior, median_length=5, max_length=10)
    episodes = [{**e, "reward": e["reward"] * scale} for e in episodes]
    target = perturb_checkpoint(behavior, rng, 0.3)
    policy = save_checkpoint(tmp_path / "target.npz", target)
    result = _run(write_step_layout(episodes, tmp_path / "big.parquet"), [policy], gamma=0.95)
    reference_input = to_reference_input(episodes, target)
    _check(result, reference_input, 0.95, stderr=scale < 1e100)
    estimates = result.results[0].estimates
    if scale < 1e100:
        assert all(estimates[name].stderr is not None for name in ESTIMATORS)
    else:
        expected = reference_stderr(reference_input, 0.95)
        for name in ("is", "pdis"):
            _close(estimates[name].stderr, expected[name], f"{name}.stderr")
        wis = estimates["wis"]
        assert wis.value is not None and wis.stderr is None and wis.ci_low is None
        # the reason names the overflow (it said only "one episode, or too few")
        assert "squares of the terms beyond float64's range" in wis.note


def test_to_larger_equals_rescaling_both_sides_to_the_max():
    """One exponential per element, the same bits as rescaling each side to the max (-inf
    on either or both sides, ties included)."""
    from ope_cli.estimation.estimators.logspace import rescale, to_larger

    rng = np.random.default_rng(0)
    a, b = rng.normal(scale=300.0, size=(2, 1000))
    a[:100], b[50:150] = -np.inf, -np.inf
    b[200:250] = a[200:250]
    larger, factor_a, factor_b = to_larger(a, b)
    assert np.array_equal(larger, np.maximum(a, b))
    assert np.array_equal(factor_a, rescale(a, larger))
    assert np.array_equal(factor_b, rescale(b, larger))


def test_returns_that_overflow_are_null_with_their_own_reason(tmp_path, recwarn):
    """Rewards 1e308 twice overflow the return while every weight is 1: null estimates whose
    notes name the returns (they said the weights overflow, or that every weight is zero),
    and no NumPy warning on the way."""
    table = pa.table(
        {
            "episode_id": [0, 0, 1],
            "step": [0, 1, 0],
            "observation": [0.0, 0.0, 0.0],
            "action": [0, 0, 0],
            "reward": [1e308, 1e308, 1.0],
            "behavior_prob": [0.5] * 3,
            "target_prob": [0.5] * 3,
        }
    )
    write_table(table, tmp_path / "logs.parquet")
    (result,) = _run(tmp_path / "logs.parquet").results
    assert result.diagnostics.mean_weight == 1.0
    notes = {name: (e.value, e.note) for name, e in result.estimates.items()}
    assert notes["is"] == (None, "the trajectory weights or the returns overflow float64")
    assert notes["wis"] == (None, "not finite in float64: the weighted returns overflow")
    assert notes["pdis"] == (None, "the per-decision weights or the rewards overflow float64")
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


@pytest.mark.parametrize("others", [[1e308, 1.0], [1e308, 1.0, 1.0, 1.0]])
def test_an_overflowing_return_beside_a_term_near_float64s_largest_is_not_left_out(
    tmp_path, others
):
    """An episode whose return overflows (1e308 twice) beside one whose term is about 1e308:
    the overflowing term's factor to the batch's scale, e^-709, is subnormal, which XLA on
    CPU flushes to zero, and the term was dropped: IS and PDIS printed the other episodes'
    mean, 5e307 or 3.3e307, with no word. They are null, and say why."""
    rewards = [1e308, 1e308, *others]
    lengths = [2] + [2] * (len(others) // 2)
    table = pa.table(
        {
            "episode_id": np.repeat(np.arange(len(lengths)), lengths),
            "step": np.concatenate([np.arange(n) for n in lengths]),
            "observation": [0.0] * len(rewards),
            "action": [0] * len(rewards),
            "reward": rewards,
            "behavior_prob": [0.5] * len(rewards),
            "target_prob": [0.5] * len(rewards),
        }
    )
    write_table(table, tmp_path / "logs.parquet")
    (result,) = _run(tmp_path / "logs.parquet").results
    notes = {name: (e.value, e.note) for name, e in result.estimates.items()}
    assert notes["is"] == (None, "the trajectory weights or the returns overflow float64")
    assert notes["pdis"] == (None, "the per-decision weights or the rewards overflow float64")


@pytest.mark.parametrize("target", [0.0, 1e-300])
def test_an_overflowing_return_of_a_negligible_weight_counts_as_zero(tmp_path, target):
    """Weight 0 (or 1e-600) times a return that overflows: the term is 0 (or 8e-292), and IS
    and WIS keep their values, as PDIS and WPDIS do (they went null when overflowing terms
    were first kept whatever their factor)."""
    table = pa.table(
        {
            "episode_id": [0, 0, 1, 1, 2, 2],
            "step": [0, 1] * 3,
            "observation": [0.0] * 6,
            "action": [0] * 6,
            "reward": [1e308, 1e308, 1.0, 2.0, 3.0, 1.0],
            "behavior_prob": [0.5] * 6,
            "target_prob": [target, target if target else 0.5, 0.5, 0.5, 0.5, 0.5],
        }
    )
    write_table(table, tmp_path / "logs.parquet")
    (result,) = _run(tmp_path / "logs.parquet").results
    values = {name: e.value for name, e in result.estimates.items()}
    assert values["is"] == pytest.approx(7 / 3, rel=1e-12)
    assert values["wis"] == pytest.approx(3.5, rel=1e-12)


def _log_prob_table(episodes) -> pa.Table:
    """A step table of (rewards, behavior log-probabilities, target log-probabilities)
    per episode."""
    columns = {name: [] for name in ("episode_id", "step", "reward")}
    columns.update(behavior_log_prob=[], target_log_prob=[])
    for episode, (rewards, log_b, log_pi) in enumerate(episodes):
        columns["episode_id"] += [episode] * len(rewards)
        columns["step"] += list(range(len(rewards)))
        columns["reward"] += list(rewards)
        columns["behavior_log_prob"] += list(log_b)
        columns["target_log_prob"] += list(log_pi)
    n = len(columns["reward"])
    return pa.table({**columns, "observation": [0.0] * n, "action": [0] * n})


def _float64_range(result) -> list[str]:
    from ope_cli.report.warnings import FLOAT64_RANGE, run_warnings

    return [w.message for w in run_warnings(result) if w.code == FLOAT64_RANGE]


FLOAT64_EDGES = {
    # WIS: a weight e^-709.5 below the largest times a return of 1e308 (1.0 printed, 1.738)
    "weight": ([([1.0], [-709.5], [0.0]), ([1e308], [0.0], [0.0]), ([3.0], [0.0], [0.0])], 1.0),
    # gamma^t below 2.2e-308 times rewards of 1e300 (3.4e-301 printed, 3.4e-21)
    "discount": (
        [
            ([0.0] * 160 + [1e300] * 40, [0.0] * 200, [0.0] * 200),
            ([0.0] * 200, [0.0] * 200, [0.0] * 200),
            ([1e-300] * 200, [0.0] * 200, [0.0] * 200),
        ],
        0.01,
    ),
    # rewards below float64's normal range, which the kernel takes as 0 (0 +- 0 printed)
    "subnormal": ([([1e-308], [0.0], [0.0]), ([5e-324], [0.0], [0.0])], 1.0),
}


@pytest.mark.parametrize("case", FLOAT64_EDGES)
def test_values_at_float64s_edges_are_warned_of(tmp_path, case):
    """XLA on CPU flushes values below 2.2e-308 to zero: a weight or a discount that small
    times a reward near float64's largest lost its term (finite numbers 40% off and more,
    without a word), and subnormal rewards counted as 0. The float64_range warning says so,
    with the bound of what can be lost."""
    episodes, gamma = FLOAT64_EDGES[case]
    write_table(_log_prob_table(episodes), tmp_path / "logs.parquet")
    (message,) = _float64_range(_run(tmp_path / "logs.parquet", gamma=gamma))
    assert "2.2e-308" in message
    exposed = {  # 2.2e-308 x episodes x steps x 10^(1 + the rewards' decimal magnitude)
        # x the largest weight (at most episodes x the largest mean weight at a step)
        "weight": "rewards reach 1e308: the terms counted as 0 can add up to more than float64",
        "discount": "rewards reach 1e300: the terms counted as 0 can add up to 4.0e-04",
        "subnormal": "rewards as small as 1e-324 (below 2.2e-308 the kernel takes them as 0)",
    }[case]
    assert exposed in message
    if case != "subnormal":
        assert "more than 1e-9 of is, wis, pdis and wpdis;" in message


def test_what_weighted_estimates_lose_over_many_episodes_is_warned_of(tmp_path, recwarn):
    """WIS loses every episode whose weight is below 2.2e-308 of the largest: 40,000 of
    them, returns of 9.9e299 at weight e^-708.5 against e^-710 ... printed 1000.00063
    where WIS is 1000.00079 (1.6e-7), and one episode's bound did not warn."""
    lifted = [([9.9e299], [-1.5], [0.0])] * 40_000
    write_table(_log_prob_table([([1000.0], [-710.0], [0.0]), *lifted]), tmp_path / "logs.parquet")
    (message,) = _float64_range(_run(tmp_path / "logs.parquet"))
    assert "is, wis, pdis and wpdis;" in message
    assert not [w for w in recwarn if issubclass(w.category, RuntimeWarning)]


def test_differences_that_can_lose_their_size_are_warned_of(tmp_path):
    """Two policies apart only on the one episode of weight e^710: WIS's difference is
    7.9e-4 and printed 9.6e-4, and only the estimates were compared with the bound."""
    n = 40_000
    table = pa.table(
        {
            "episode_id": np.arange(n + 1),
            "step": np.zeros(n + 1, np.int64),
            "observation": [0] + [1] * n,
            "action": np.zeros(n + 1, np.int64),
            "reward": [1000.0] + [9.9e299] * n,
            "behavior_log_prob": [-710.0] + [-1.5] * n,
        }
    )
    write_table(table, tmp_path / "logs.parquet")
    logits = {"p1": [[0.0, -800.0], [0.0, -800.0]], "p2": [[0.0, 0.0], [0.0, -800.0]]}
    for name, values in logits.items():
        np.savez(tmp_path / f"{name}.npz", kind=np.array("tabular"), logits=np.array(values))
    config = EvaluationConfig(
        data=str(tmp_path / "logs.parquet"),
        policies=tuple(f"{name}={tmp_path / name}.npz" for name in logits),
        gamma=1.0,
        estimators=("wis",),
        choosing=ChoosingConfig(baseline="p1"),
        runtime=RuntimeConfig(precision="float64"),
    )
    (message,) = _float64_range(evaluate(config))
    assert "the difference in wis (p2)" in message


def test_critic_values_name_the_estimators_that_read_them(tmp_path):
    """Q-hat and V-hat columns of 2e300: dm, dr and wdr (dm exactly 0: its terms are too),
    not the IS family, which never reads them."""
    n = 200
    table = _log_prob_table([([0.0] * n, [0.0] * n, [0.0] * n)] * 5)
    q = np.where(np.arange(n) >= 160, 2e300, 0.0)
    table = table.append_column("q", pa.array(np.tile(q, 5))).append_column(
        "v", pa.array(np.tile(q / 2, 5))
    )
    write_table(table, tmp_path / "logs.parquet")
    config = EvaluationConfig(
        data=str(tmp_path / "logs.parquet"),
        gamma=0.01,
        columns=ColumnMapping(q_value="q", v_value="v"),
        runtime=RuntimeConfig(precision="float64"),
    )
    (message,) = _float64_range(evaluate(config))
    assert "Q-hat or V-hat values reach 1e300" in message
    assert "more than 1e-9 of dm, dr and wdr;" in message


def test_estimates_of_exactly_zero_are_warned_of_where_every_term_can_be_lost(tmp_path):
    """Rewards of 1e300 at step 155 only, gamma 0.01: gamma^155 = 1e-310 is flushed, so
    IS and WIS were 0.0 +- 0 where they are 1e-10, and the warning left exact zeros out."""
    late = ([0.0] * 155 + [1e300], [math.log(0.5)] * 156, [math.log(0.5)] * 156)
    write_table(_log_prob_table([late] * 50), tmp_path / "logs.parquet")
    result = _run(tmp_path / "logs.parquet", gamma=0.01)
    assert result.results[0].estimates["is"].value == 0.0
    (message,) = _float64_range(result)
    assert "more than 1e-9 of is, wis, pdis and wpdis;" in message
    config = EvaluationConfig(  # the logging policy's value is such a mean return too
        data=str(tmp_path / "logs.parquet"),
        gamma=0.01,
        choosing=ChoosingConfig(baseline="behavior"),
        runtime=RuntimeConfig(precision="float64"),
    )
    result = evaluate(config)
    assert result.behavior_value == 0.0
    (message,) = _float64_range(result)
    assert "the logging policy's value (its mean discounted return)" in message


def test_estimates_of_exactly_zero_are_not_warned_of(tmp_path):
    """Rewards of 1e20 on episodes the policy never takes: every estimate is exactly 0, and
    no lost term can make one (the warning named all four)."""
    never = ([1e20, 5e19], [math.log(0.5)] * 2, [-math.inf] * 2)
    nothing = ([0.0, 0.0], [math.log(0.5)] * 2, [0.0, 0.0])
    write_table(_log_prob_table([never] * 50 + [nothing] * 50), tmp_path / "logs.parquet")
    assert _float64_range(_run(tmp_path / "logs.parquet", gamma=0.9)) == []


def test_what_a_large_weight_scales_is_warned_of(tmp_path):
    """A reward of -1e308 at weight e^-300 under a later weight of e^409: rescaled to it,
    the term's factor e^-709 is flushed, and PDIS printed -2.1e177 where it is -4.7e177,
    without a word (the bound left the weights out)."""
    heavy = ([-1e308, -1.0], [0.0, -709.0], [-300.0, 0.0])
    write_table(_log_prob_table([heavy, ([1.0], [0.0], [0.0])]), tmp_path / "logs.parquet")
    (message,) = _float64_range(_run(tmp_path / "logs.parquet"))
    assert "pdis" in message.split("more than 1e-9 of ")[1]


def test_zeros_that_no_flush_makes_are_not_warned_of(tmp_path):
    """Weights all 0 (IS exactly 0), and a logging policy's value of 0 from returns of
    +-1e300 with gamma 1 (nothing is discounted below 2.2e-308): both were named."""
    zero = [([1e250], [math.log(0.5)], [-math.inf])] * 20
    write_table(_log_prob_table(zero), tmp_path / "zero.parquet")
    config = EvaluationConfig(
        data=str(tmp_path / "zero.parquet"),
        gamma=1.0,
        estimators=("is",),
        runtime=RuntimeConfig(precision="float64"),
    )
    assert _float64_range(evaluate(config)) == []
    signs = [([1e300], [0.0], [0.0]), ([-1e300], [0.0], [0.0])] + [([0.0], [0.0], [0.0])] * 8
    write_table(_log_prob_table(signs), tmp_path / "signs.parquet")
    config = dataclasses.replace(
        config,
        data=str(tmp_path / "signs.parquet"),
        estimators=None,
        choosing=ChoosingConfig(baseline="behavior"),
    )
    result = evaluate(config)
    assert result.behavior_value == 0.0
    assert "logging policy" not in "".join(_float64_range(result))


def test_ordinary_and_large_values_are_not_warned_of(tmp_path):
    """Rewards of 1e20 with weights e^+-700: what can be lost is far below the estimates."""
    episodes = [
        ([1e20, 1.0], [0.0, 0.0], [0.0, -700.0]),
        ([2e20], [0.0], [0.0]),
        ([0.0], [0.0], [0.0]),
    ]
    write_table(_log_prob_table(episodes), tmp_path / "logs.parquet")
    assert _float64_range(_run(tmp_path / "logs.parquet", gamma=0.01)) == []


def test_an_undefined_estimate_and_difference_have_no_standard_error(tmp_path):
    """Weights of 1e600 (three steps of ratio 1e200) overflow float64: IS was null with a
    standard error of 0.0, and so was its difference from the logging policy's."""
    table = pa.table(
        {
            "episode_id": [0, 0, 0, 1, 1, 1, 2, 2, 2],
            "step": [0, 1, 2] * 3,
            "observation": [0.0] * 9,
            "action": [0] * 9,
            "reward": [1.0] * 9,
            "behavior_prob": [1e-200] * 9,
            "target_prob": [1.0] * 9,
        }
    )
    write_table(table, tmp_path / "logs.parquet")
    document = ope_cli.evaluate(
        str(tmp_path / "logs.parquet"), baseline="behavior", ci="percentile"
    ).to_dict()
    (result,) = document["results"]
    undefined = [e for e in result["estimates"].values() if e["value"] is None]
    assert undefined and all(e["stderr"] is None for e in undefined)
    differences = [c for c in result["comparison"].values() if c["delta"] is None]
    assert differences and all(c["stderr"] is None for c in differences)
