"""The whole pipeline (reader -> episodes -> buckets -> kernel -> stats) against the
plain float64 NumPy reference, and its invariance to how the data is cut."""

from __future__ import annotations

import dataclasses
import math
import zlib

import numpy as np
import pytest
from datasets import (
    perturb_checkpoint,
    random_checkpoint,
    random_episodes,
    save_checkpoint,
    to_reference_input,
    write_episode_layout,
    write_step_layout,
    write_table,
)
from reference import DIAGNOSTICS, ESTIMATORS, reference_estimates, reference_stderr

from ope_cli.config import BatchingConfig, BehaviorConfig, EvaluationConfig, QConfig, RuntimeConfig
from ope_cli.data.buckets import window_shapes
from ope_cli.data.ids import RESAMPLING_GROUPS, id_keys
from ope_cli.errors import PolicyError
from ope_cli.estimation.pipeline import evaluate


def assert_close(actual, expected, rtol, what=""):
    if expected is None:
        assert actual is None, what
        return
    assert actual is not None, what
    assert actual == pytest.approx(expected, rel=rtol, abs=rtol * 1e-3), what


def run(data, policies, gamma=0.95, precision="float64", **batching):
    config = EvaluationConfig(
        data=str(data),
        policies=tuple(str(p) for p in policies),
        gamma=gamma,
        batching=BatchingConfig(**batching),
        runtime=RuntimeConfig(precision=precision),
    )
    return evaluate(config)


def check_against_reference(result, episodes, checkpoints, gamma, rtol):
    for policy_result, ckpt in zip(result.results, checkpoints, strict=True):
        reference_input = to_reference_input(episodes, ckpt)
        expected = reference_estimates(reference_input, gamma)
        expected_stderr = reference_stderr(reference_input, gamma)
        for name in ESTIMATORS:
            assert_close(policy_result.estimates[name].value, expected[name], rtol, name)
        for name in ("is", "wis", "pdis"):
            assert_close(policy_result.estimates[name].stderr, expected_stderr[name], rtol, name)
        for name in DIAGNOSTICS:
            assert_close(getattr(policy_result.diagnostics, name), expected[name], rtol, name)


def make_case(tmp_path, kind, n_episodes=300, seed=0, policies=2, **episode_options):
    rng = np.random.default_rng(seed)
    behavior = random_checkpoint(kind, rng)
    episodes = random_episodes(rng, n_episodes, behavior=behavior, **episode_options)
    checkpoints = [perturb_checkpoint(behavior, rng, 0.3 * (i + 1)) for i in range(policies)]
    paths = [save_checkpoint(tmp_path / f"ckpt{i}.npz", c) for i, c in enumerate(checkpoints)]
    return episodes, checkpoints, paths


@pytest.mark.parametrize("kind", ["tabular", "linear_softmax", "mlp_softmax", "linear_gaussian"])
@pytest.mark.parametrize("layout", ["step", "episode"])
def test_matches_reference_for_each_policy_kind_and_layout(tmp_path, kind, layout):
    # A stable seed: hash() of strings changes with every interpreter (PYTHONHASHSEED).
    seed = zlib.crc32(f"{kind}/{layout}".encode()) % 1000
    episodes, checkpoints, paths = make_case(tmp_path, kind, seed=seed)
    writer = write_step_layout if layout == "step" else write_episode_layout
    data = writer(episodes, tmp_path / "logs.parquet")
    result = run(data, paths, gamma=0.95, batch_steps=512, read_rows=97)
    assert result.dataset.layout == layout
    assert result.dataset.episodes == len(episodes)
    assert result.dataset.steps == sum(len(e["reward"]) for e in episodes)
    check_against_reference(result, episodes, checkpoints, 0.95, rtol=1e-6)


def test_float32_kernel_matches_reference_to_1e4(tmp_path):
    episodes, checkpoints, paths = make_case(tmp_path, "linear_softmax", seed=3)
    data = write_step_layout(episodes, tmp_path / "logs.parquet")
    result = run(data, paths, gamma=0.99, precision="float32")
    assert result.runtime.precision == "float32"
    check_against_reference(result, episodes, checkpoints, 0.99, rtol=1e-4)


def test_float32_discounts_gamma_near_one_as_float64_does(tmp_path):
    """gamma^t was taken of gamma rounded to float32 (0.999999 as 0.99999899): at t = 60,000
    every float32 estimate but wpdis (discounted on the host) was 6e-4 off. Ratios 1 and
    rewards 1: each estimate is sum_t gamma^t exactly."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    episodes, steps, gamma = 2, 60_000, 0.999999
    table = {
        "episode_id": np.repeat(np.arange(episodes), steps),
        "step": np.tile(np.arange(steps), episodes),
        "observation": np.zeros(episodes * steps, np.int64),
        "action": np.zeros(episodes * steps, np.int64),
        "reward": np.ones(episodes * steps),
        "behavior_prob": np.full(episodes * steps, 0.5),
    }
    pq.write_table(pa.table(table), tmp_path / "logs.parquet")
    np.savez(tmp_path / "pi.npz", kind=np.array("tabular"), logits=np.zeros((1, 2)))
    result = run(tmp_path / "logs.parquet", [tmp_path / "pi.npz"], gamma, "float32")
    exact = (1 - gamma**steps) / (1 - gamma)
    for name, estimate in result.results[0].estimates.items():
        assert estimate.value == pytest.approx(exact, rel=2e-5), name


def test_float32_warns_about_data_it_cannot_hold(tmp_path):
    """float32 keeps 7 digits: observations 1e6 from 0 lose the logits to rounding (a QA
    run: IS 6% off, no word). The run's data magnitudes make a warning in float32 runs,
    and none in float64 or on data of ordinary size."""
    from ope_cli.report.warnings import FLOAT32_RANGE, run_warnings

    episodes, _, paths = make_case(tmp_path, "linear_softmax", seed=4, policies=1)
    data = write_step_layout(episodes, tmp_path / "logs.parquet")
    far = [dict(e, observation=e["observation"] + 1e6) for e in episodes]
    far_data = write_step_layout(far, tmp_path / "far.parquet")

    def warned(path, precision):
        result = run(path, paths, precision=precision)
        return [w.message for w in run_warnings(result) if w.code == FLOAT32_RANGE]

    (message,) = warned(far_data, "float32")
    assert message.startswith(
        "float32 (this run's precision) keeps about 7 digits, and observations reach 1e6 in "
        "magnitude:"
    )
    assert warned(far_data, "float64") == [] and warned(data, "float32") == []
    # below 1e4, but 1e-4 of their size or less apart: a linear Q fit's dm was 57 standard
    # errors off in float32 on observations 5000 + U(0, 1), without a word
    close = [dict(e, observation=5000 + e["observation"] / 10) for e in episodes]
    (message,) = warned(write_step_layout(close, tmp_path / "close.parquet"), "float32")
    assert "observations reach" not in message
    assert "the observations vary by 1e-4 of their size or less" in message
    spread = [dict(e, observation=1000 + e["observation"]) for e in episodes]  # 3 digits
    assert warned(write_step_layout(spread, tmp_path / "spread.parquet"), "float32") == []


def test_float32_warns_of_rewards_that_cancel_in_the_returns(tmp_path):
    """Rewards of +1000 and -1000 + U(0, 0.001) cancel in the returns (a QA run: 0.0025 +-
    3e-4), and float32, which rounds each reward by 6e-5, gave a WPDIS 2.8% off with no
    warning: each reward and each return has a spread far above 1e-4 of its own size.
    Here 20-step episodes, returns 0.005 +- 9e-4."""
    import pyarrow as pa

    from ope_cli.report.warnings import FLOAT32_RANGE, run_warnings

    rng = np.random.default_rng(7)
    episodes, length = 100, 20
    reward = np.where(np.arange(length) % 2 == 0, 1000.0, -1000.0)
    reward = np.tile(reward, episodes) + np.where(
        np.arange(episodes * length) % 2, rng.uniform(0, 1e-3, episodes * length), 0.0
    )
    log_behavior = np.full(episodes * length, math.log(0.5))
    table = pa.table(
        {
            "episode_id": np.repeat(np.arange(episodes), length),
            "step": np.tile(np.arange(length), episodes),
            "action": np.zeros(episodes * length, np.int64),
            "reward": reward,
            "behavior_log_prob": log_behavior,
            "target_log_prob": log_behavior + rng.normal(0, 0.05, episodes * length),
        }
    )
    path = write_table(table, tmp_path / "cancel.parquet")

    def warned(precision):
        config = EvaluationConfig(
            data=str(path), gamma=1.0, runtime=RuntimeConfig(precision=precision)
        )
        found = run_warnings(evaluate(config))
        return [w.message for w in found if w.code == FLOAT32_RANGE]

    (message,) = warned("float32")
    assert "the episode returns vary by 1e-6 of the rewards' size or less" in message
    assert "rewards reach" not in message  # 1e3: below what float32 is warned of alone
    assert warned("float64") == []


def test_float32_sums_over_episodes_keep_the_spread_of_large_values(tmp_path):
    """A float32 run summed each batch's terms and their squares in float32: with rewards
    1000 + U(0, 1), IS's standard error was 3% low (0.0 at 1e4, noted as float64's
    rounding), and with a critic's V-hat 1e4 + N(0, 1) dm's was 71% high. The sums over
    episodes are float64 now; the critic's magnitude is warned about (float32_range)."""
    import pyarrow as pa

    from ope_cli.config import ColumnMapping
    from ope_cli.estimation.pipeline import NO_MAGNITUDE
    from ope_cli.report.warnings import FLOAT32_RANGE, run_warnings

    rng = np.random.default_rng(8)
    n = 2000
    log_behavior = np.full(n, math.log(0.5))
    table = pa.table(
        {
            "episode_id": np.arange(n),
            "step": np.zeros(n, np.int64),
            "action": np.zeros(n, np.int64),
            "reward": 1000.0 + rng.uniform(0, 1, n),
            "behavior_log_prob": log_behavior,
            "target_log_prob": log_behavior + np.minimum(rng.normal(0, 0.3, n), 0.69),
            "q": 1e4 + rng.normal(0, 1, n),
            "v": 1e4 + rng.normal(0, 1, n),
        }
    )
    path = write_table(table, tmp_path / "large.parquet")
    results = {}
    for precision in ("float64", "float32"):
        config = EvaluationConfig(
            data=str(path),
            gamma=1.0,
            estimators=("is", "pdis", "dm", "dr"),
            columns=ColumnMapping(q_value="q", v_value="v"),
            runtime=RuntimeConfig(precision=precision),
        )
        results[precision] = evaluate(config)
    exact, single = (results[p].results[0].estimates for p in ("float64", "float32"))
    for name in ("is", "pdis", "dm", "dr"):
        assert single[name].stderr == pytest.approx(exact[name].stderr, rel=1e-3), name
    (warning,) = [w for w in run_warnings(results["float32"]) if w.code == FLOAT32_RANGE]
    assert "the critic's Q-hat or V-hat values reach 1e4" in warning.message
    assert not [w for w in run_warnings(results["float64"]) if w.code == FLOAT32_RANGE]
    # what float32 must hold is measured by float32 runs alone (a tenth of a float64 run):
    # a float64 one measures the values' sizes only (float64_range), not their spreads
    measured = results["float64"].dataset.magnitudes
    assert measured[1:4] == results["float32"].dataset.magnitudes[1:4]
    assert set(measured[:1] + measured[4:]) == {NO_MAGNITUDE}
    assert results["float32"].dataset.magnitudes[1] == 3  # the rewards reach 1e3


def test_magnitudes_of_a_chunk():
    from types import SimpleNamespace

    from ope_cli.estimation.pipeline import NO_MAGNITUDE, magnitudes

    chunk = SimpleNamespace(
        observation=np.array([[0.5, -2e5], [3.0, 1.0]], np.float32),
        reward=np.array([0.0, -3e31, 2e-42]),
        offsets=np.array([0, 1, 3]),
        action=np.array([[1.0], [-7e5], [0.0]]),
        q_value=np.array([1.0, -5e4, 2.0]),
        v_value=np.array([3e2, 1.0, 2.0]),
    )
    assert magnitudes(chunk).tolist() == [5, 31, 42, 4, 5] + [NO_MAGNITUDE] * 4
    states = SimpleNamespace(  # observations and actions that are indices, one reward
        observation=np.array([10**6]),
        reward=np.zeros(1),
        offsets=np.array([0, 1]),
        action=np.array([10**6]),
    )
    assert magnitudes(states).tolist() == [NO_MAGNITUDE] * 9


def test_the_digits_a_sum_keeps_before_the_values_differences_show():
    from ope_cli.estimation.pipeline import (
        NO_MAGNITUDE,
        SPREAD_BLOCK,
        _size_and_spread,
        lost_digits,
    )

    rng = np.random.default_rng(2)
    assert lost_digits(9000 + rng.normal(0, 0.01, 1000)) == 5  # 9000 / 0.01 = 10^5.95
    assert lost_digits(-1000.0 + rng.integers(0, 2, 1000)) == 3  # 1000 / 0.5 = 10^3.3
    assert lost_digits(np.tile([1.0, 0.0, 1.0], 10)) == 0
    assert lost_digits(np.ones(50)) == NO_MAGNITUDE  # all equal: nothing to resolve
    # too few to say a spread: two close returns of a chunk of two episodes said 1e-6
    assert lost_digits(np.array([1e5, 1e5 + 0.1])) == NO_MAGNITUDE
    assert lost_digits(np.tile([1e308, -1e308], 20)) == NO_MAGNITUDE  # no finite spread
    # [N, d] observations: the feature that keeps most digits above its spread (a constant
    # feature has none to resolve)
    features = np.column_stack([rng.normal(0, 1, 100), 5000 + rng.uniform(0, 1, 100)])
    assert lost_digits(np.column_stack([features, np.ones(100)]).astype(np.float32)) == 4
    # a float64 constant's standard deviation is not 0 but rounding (0.1's: 1e-17), which
    # warned of observations varying by 1e-13 of their size
    assert lost_digits(np.full(100, 0.1)) == NO_MAGNITUDE
    assert lost_digits(np.column_stack([np.full(100, 0.1), rng.normal(0, 1, 100)])) == 0
    # in blocks of rows, shifted: as np.std, of many rows and of an offset far above them
    many = 1e8 + rng.normal(0, 1, (3 * SPREAD_BLOCK // 2 + 7, 2))  # four blocks of rows
    many[SPREAD_BLOCK + 3] = (-2e8, 3e8)  # the largest |value|s, in a later block
    size, spread = _size_and_spread(many)
    np.testing.assert_allclose(spread, np.std(many - 1e8, axis=0), rtol=1e-6)
    np.testing.assert_array_equal(size, [2e8, 3e8])


def test_float32_warns_about_rewards_it_cannot_tell_apart(tmp_path):
    """Rewards 9000 + N(0, 0.01) in one-step episodes: float32's per-step sums cannot
    resolve their differences, and WPDIS's standard error was 26% off (2.5e-5 for 3.2e-5)
    without a word. The float32 warning now says that the rewards vary by 1e-5 of their
    size; float64 runs and rewards of ordinary spread say nothing."""
    import pyarrow as pa

    from ope_cli.report.warnings import FLOAT32_RANGE, run_warnings

    rng = np.random.default_rng(5)
    n = 5000
    log_behavior = np.full(n, math.log(0.5))

    def warned(offset, precision):
        table = pa.table(
            {
                "episode_id": np.arange(n),
                "action": np.zeros(n, np.int64),
                "reward": offset + rng.normal(0, 0.01, n),
                "behavior_log_prob": log_behavior,
                "target_log_prob": log_behavior + rng.normal(0, 0.3, n).clip(-2, 0.69),
            }
        )
        path = write_table(table, tmp_path / f"r{offset}.parquet")
        config = EvaluationConfig(data=str(path), gamma=1.0, runtime=RuntimeConfig(precision))
        return [w.message for w in run_warnings(evaluate(config)) if w.code == FLOAT32_RANGE]

    (message,) = warned(9000.0, "float32")
    assert "the rewards vary by 1e-5 of their size or less" in message
    assert "episode returns" not in message  # one-step episodes: their returns are the rewards
    assert warned(9000.0, "float64") == [] and warned(0.0, "float32") == []
    assert warned(10.0, "float32") == []  # 10 / 0.01: 3 digits, 4 of float32's 7 left


def _values(result):
    return [
        {name: (e.value, e.stderr) for name, e in r.estimates.items()}
        | {"diagnostics": tuple(vars(r.diagnostics).values())}
        for r in result.results
    ]


def assert_same_results(a, b, rtol=1e-9):
    for ra, rb in zip(_values(a), _values(b), strict=True):
        for key in ra:
            for x, y in zip(ra[key], rb[key], strict=True):
                assert_close(x, y, rtol, key)


@pytest.mark.parametrize(
    "batching",
    [
        dict(read_rows=1),
        dict(read_rows=13, batch_steps=64),
        dict(batch_steps=100_000, min_bucket=2),
        dict(min_bucket=5, batch_steps=333),
        dict(min_bucket=300),  # one bucket for everything
    ],
)
@pytest.mark.slow  # a property / statistical test: the full suite runs it
def test_invariant_to_record_batches_buckets_and_batch_sizes(tmp_path, batching):
    episodes, _, paths = make_case(tmp_path, "linear_softmax", n_episodes=150, seed=5)
    data = write_step_layout(episodes, tmp_path / "logs.parquet")
    assert_same_results(run(data, paths), run(data, paths, **batching))


@pytest.mark.slow  # a property / statistical test: the full suite runs it
def test_invariant_to_file_splitting_and_format(tmp_path):
    episodes, _, paths = make_case(tmp_path, "mlp_softmax", n_episodes=200, seed=7)
    one = run(write_step_layout(episodes, tmp_path / "one.parquet"), paths)
    split = run(
        write_step_layout(episodes, tmp_path / "split", n_files=7, row_group_size=50), paths
    )
    feather = run(write_step_layout(episodes, tmp_path / "one.arrow", file_format="feather"), paths)
    episode_layout = run(write_episode_layout(episodes, tmp_path / "episodes", n_files=3), paths)
    shuffled = run(
        write_step_layout(
            episodes, tmp_path / "shuffled.parquet", shuffle_steps_within_episode=True
        ),
        paths,
    )
    for other in (split, feather, episode_layout, shuffled):
        assert_same_results(one, other)
    assert split.dataset.files == 7


@pytest.mark.slow  # a property / statistical test: the full suite runs it
def test_policies_in_one_pass_equal_separate_runs(tmp_path):
    rng = np.random.default_rng(11)
    behavior = random_checkpoint("linear_softmax", rng)
    episodes = random_episodes(rng, 120, behavior=behavior)
    data = write_step_layout(episodes, tmp_path / "logs.parquet")
    stacked = [
        save_checkpoint(tmp_path / f"s{i}.npz", perturb_checkpoint(behavior, rng, 0.5))
        for i in range(3)
    ]
    mlp = save_checkpoint(tmp_path / "mlp.npz", random_checkpoint("mlp_softmax", rng))
    order = [stacked[0], mlp, stacked[1], stacked[2]]  # mixed kinds keep command-line order
    together = run(data, order)
    assert [r.policy for r in together.results] == [str(p) for p in order]
    for i, path in enumerate(order):
        alone = run(data, [path])
        for name in ESTIMATORS:
            assert_close(
                together.results[i].estimates[name].value,
                alone.results[0].estimates[name].value,
                1e-12,
                name,
            )


def test_stacked_policies_merged_in_parts_equal_one_part(tmp_path, monkeypatch):
    """A kernel's stacked policies are merged MERGE_POLICIES at a time (a list of parts):
    parts of one and two policies give bit for bit what one part of all five gives, in
    command-line order."""
    import ope_cli.estimation.pipeline as pipeline

    rng = np.random.default_rng(12)
    behavior = random_checkpoint("linear_softmax", rng)
    data = write_step_layout(random_episodes(rng, 60, behavior=behavior), tmp_path / "logs.parquet")
    paths = [
        save_checkpoint(tmp_path / f"s{i}.npz", perturb_checkpoint(behavior, rng, 0.5))
        for i in range(5)
    ]
    whole = _values(run(data, paths, batch_steps=256, min_bucket=4))
    for size in (1, 2):
        monkeypatch.setattr(pipeline, "MERGE_POLICIES", size)
        assert _values(run(data, paths, batch_steps=256, min_bucket=4)) == whole


def test_on_policy_data_gives_mean_return(tmp_path):
    rng = np.random.default_rng(2)
    behavior = random_checkpoint("linear_softmax", rng)
    episodes = random_episodes(rng, 100, behavior=behavior)
    data = write_step_layout(episodes, tmp_path / "logs.parquet")
    path = save_checkpoint(tmp_path / "behavior.npz", behavior)
    result = run(data, [path], gamma=1.0)
    mean_return = np.mean([e["reward"].sum() for e in episodes])
    for name in ESTIMATORS:
        assert result.results[0].estimates[name].value == pytest.approx(mean_return, rel=1e-9)
    assert result.results[0].diagnostics.ess == pytest.approx(100)


def test_long_horizon_weights_that_overflow_a_naive_product(tmp_path):
    """Episodes of 2,000-3,000 steps whose log-weights reach hundreds: the naive float64
    product overflows (WIS = inf/inf) or underflows, the log-space pipeline does not."""
    rng = np.random.default_rng(4)
    behavior = random_checkpoint("tabular", rng, n_states=6, n_actions=3)
    episodes = random_episodes(rng, 12, behavior=behavior, length_dist="uniform", max_length=3000)
    for e in episodes:  # force long episodes
        assert len(e["reward"]) >= 1
    episodes = [e for e in episodes if len(e["reward"]) >= 2000] or episodes[:1]
    target = perturb_checkpoint(behavior, rng, 2.0)
    path = save_checkpoint(tmp_path / "far.npz", target)
    reference_input = to_reference_input(episodes, target)
    log_final = [np.sum(e["log_target"] - e["log_behavior"]) for e in reference_input]
    assert max(abs(x) for x in log_final) > 710  # exp() of it is outside float64
    data = write_step_layout(episodes, tmp_path / "long.parquet")
    result = run(data, [path], gamma=1.0)
    assert result.dataset.max_length >= 2000
    expected = reference_estimates(reference_input, 1.0)
    for name in ("wis", "wpdis"):
        assert expected[name] is not None
        assert_close(result.results[0].estimates[name].value, expected[name], 1e-6, name)
    for name in DIAGNOSTICS:
        assert_close(getattr(result.results[0].diagnostics, name), expected[name], 1e-6, name)


def test_wpdis_stderr_is_the_grouped_jackknife(tmp_path):
    episodes, checkpoints, paths = make_case(
        tmp_path, "linear_softmax", n_episodes=400, seed=9, policies=1
    )
    data = write_step_layout(episodes, tmp_path / "logs.parquet")
    result = run(data, paths, gamma=0.9)
    reference_input = to_reference_input(episodes, checkpoints[0])
    groups = id_keys(np.array([e["episode_id"] for e in episodes])) % np.uint64(RESAMPLING_GROUPS)
    leave_out = np.array(
        [
            reference_estimates(
                [x for x, grp in zip(reference_input, groups, strict=True) if grp != g], 0.9
            )["wpdis"]
            for g in np.unique(groups)
        ]
    )
    k = len(leave_out)
    expected = math.sqrt((k - 1) / k * np.sum((leave_out - leave_out.mean()) ** 2))
    assert result.results[0].estimates["wpdis"].stderr == pytest.approx(expected, rel=1e-6)


ENTRY_POINT = """
import jax
import jax.numpy as jnp
import numpy as np

_params = np.load({path!r})


def log_prob(observation, action):
    logits = observation @ _params["weight"] + _params["bias"]
    return jax.nn.log_softmax(logits)[action]
"""


def test_compiles_once_per_window_shape(tmp_path, monkeypatch):
    longest = 120  # ten buckets: enough shapes, each compiled at most once
    episodes, _, paths = make_case(
        tmp_path,
        "linear_softmax",
        n_episodes=600,
        seed=12,
        length_dist="uniform",
        max_length=longest,
        policies=1,
    )
    data = write_step_layout(episodes, tmp_path / "logs.parquet")
    # A freshly imported entry point is a function the jit cache has never seen.
    (tmp_path / "fresh_policy.py").write_text(ENTRY_POINT.format(path=str(paths[0])))
    monkeypatch.chdir(tmp_path)
    first = run(data, ["fresh_policy:log_prob"], batch_steps=1024, read_rows=500)
    # an advance kernel per window shape, and one finish kernel (the carry's lanes are fixed)
    assert first.runtime.compiles == len(first.runtime.batch_shapes) + 1
    catalogue = window_shapes(BatchingConfig(batch_steps=1024))
    assert set(first.runtime.batch_shapes) <= {(shape.lanes, shape.width) for shape in catalogue}
    again = run(data, ["fresh_policy:log_prob"], batch_steps=1024, read_rows=333)
    assert again.runtime.compiles == 0  # same shapes, same function: nothing traced again
    assert_same_results(first, again)
    checkpoint = run(data, paths, batch_steps=1024, read_rows=500)
    assert_same_results(first, checkpoint)


def test_float32_observations_call_the_kernels_of_float64_ones(tmp_path):
    """Observations stored as float32 (as D4RL and Minari store them, and ``ope convert``
    writes them) were handed to the kernel as they were, so a warm cache compiled a set of
    kernels of their own (4 on the shipped example's slice): the windows now hold the
    kernel's dtype, and the numbers are those of the same values stored as float64."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    episodes, _, paths = make_case(tmp_path, "linear_softmax", n_episodes=200, seed=21)
    table = pq.read_table(write_step_layout(episodes, tmp_path / "logs.parquet"))
    column = table.schema.get_field_index("observation")
    narrow = table.set_column(
        column, "observation", table["observation"].cast(pa.list_(pa.float32()))
    )
    rounded = table.set_column(  # the float32 values, stored as float64
        column, "observation", narrow["observation"].cast(pa.list_(pa.float64()))
    )
    pq.write_table(narrow, tmp_path / "narrow.parquet")
    pq.write_table(rounded, tmp_path / "rounded.parquet")
    wide = run(tmp_path / "rounded.parquet", paths, batch_steps=1024)
    assert wide.runtime.compiles > 0
    narrowed = run(tmp_path / "narrow.parquet", paths, batch_steps=1024)
    assert narrowed.runtime.compiles == 0
    assert_same_results(wide, narrowed, rtol=0)


def test_dictionary_encoded_columns_of_an_arrow_file_give_the_plain_columns_numbers(tmp_path):
    """A Feather file with dictionary-encoded actions and rewards (as Arrow IPC keeps them)
    was refused; it gives the numbers of the same columns stored plain."""
    import pyarrow as pa
    import pyarrow.feather as feather
    import pyarrow.parquet as pq

    episodes, _, paths = make_case(tmp_path, "tabular", n_episodes=60, seed=23)
    table = pq.read_table(write_step_layout(episodes, tmp_path / "logs.parquet"))
    feather.write_feather(table, tmp_path / "plain.arrow")
    encoded = table
    for name in ("action", "reward"):
        column = encoded.schema.get_field_index(name)
        encoded = encoded.set_column(column, name, encoded[name].dictionary_encode())
    feather.write_feather(encoded, tmp_path / "encoded.arrow")
    assert pa.types.is_dictionary(feather.read_table(tmp_path / "encoded.arrow")["reward"].type)
    assert_same_results(
        run(tmp_path / "plain.arrow", paths), run(tmp_path / "encoded.arrow", paths), rtol=0
    )


def test_logged_target_probabilities(tmp_path):
    from datasets import add_target_probs

    episodes, checkpoints, paths = make_case(
        tmp_path, "linear_softmax", n_episodes=100, seed=13, policies=1
    )
    logged = add_target_probs(episodes, checkpoints[0])
    data = write_step_layout(logged, tmp_path / "logs.parquet", extra_columns=("target_prob",))
    from_logged = run(data, [])
    from_checkpoint = run(data, paths)
    assert from_logged.results[0].policy == "logged target probabilities"
    assert_same_results(from_logged, from_checkpoint, rtol=1e-9)


def test_profile_histogram_and_wpdis_path(tmp_path):
    episodes, checkpoints, paths = make_case(
        tmp_path, "linear_softmax", n_episodes=200, seed=17, policies=1
    )
    data = write_step_layout(episodes, tmp_path / "logs.parquet")
    result = run(data, paths, gamma=0.9)
    policy = result.results[0]
    profile = policy.profile
    assert profile.histogram_counts.sum() + profile.zero_weights == result.dataset.episodes
    log10_w = np.array(
        [
            np.sum(e["log_target"] - e["log_behavior"])
            for e in to_reference_input(episodes, checkpoints[0])
        ]
    ) / np.log(10)
    expected, _ = np.histogram(log10_w, bins=profile.histogram_edges)
    np.testing.assert_array_equal(profile.histogram_counts[1:-1], expected)
    assert profile.wpdis_partial_t.shape == (result.dataset.max_length,)
    assert profile.wpdis_partial_t[-1] == pytest.approx(policy.estimates["wpdis"].value, rel=1e-9)
    assert profile.mean_weight_t[0] == pytest.approx(
        np.mean(
            [
                np.exp(e["log_target"][0] - e["log_behavior"][0])
                for e in to_reference_input(episodes, checkpoints[0])
            ]
        ),
        rel=1e-9,
    )


def test_a_policy_glob_stands_for_its_sorted_checkpoints(tmp_path):
    episodes, _, paths = make_case(tmp_path, "linear_softmax", n_episodes=60, seed=19, policies=3)
    data = write_step_layout(episodes, tmp_path / "logs.parquet")
    by_glob = run(data, [str(tmp_path / "ckpt*.npz")])
    listed = run(data, sorted(paths))
    assert [r.policy for r in by_glob.results] == [str(p) for p in sorted(paths)]
    assert_same_results(by_glob, listed)
    with pytest.raises(PolicyError, match="no checkpoint matches"):
        run(data, [str(tmp_path / "nothing*.npz")])


def test_stream_yields_padded_batches_of_every_episode_once(tmp_path):
    """``stream`` alone (no kernel): every real step of every episode reaches exactly one
    padded batch, batches hold a multiple of the devices' count, and the counters agree."""
    from ope_cli.estimation.pipeline import stream

    episodes, _, paths = make_case(tmp_path, "linear_softmax", n_episodes=120)
    data = write_step_layout(episodes, tmp_path / "logs.parquet")
    config = EvaluationConfig(
        data=str(data),
        policies=(str(paths[0]),),
        batching=BatchingConfig(batch_steps=256, read_rows=53),
    )
    progress = []
    batches = stream(config, multiple_of=2, on_progress=lambda rows, total: progress.append(rows))
    assert batches.schema.layout == "step" and len(batches.policies) == 1
    seen = list(batches)
    real_steps = sum(int(b.step_mask.sum()) for b in seen)
    total = sum(len(e["reward"]) for e in episodes)
    assert real_steps == total == batches.counters.steps
    assert sum(int(b.episode_mask.sum()) for b in seen) == len(episodes)
    assert batches.counters.episodes == len(episodes)
    assert batches.counters.rows_read == total and progress[-1] == total
    assert {(b.shape[0], batches.bucketer.width_of(b)) for b in seen} == batches.shapes
    assert all(b.shape[0] % 2 == 0 for b in seen)
    assert batches.seen_keys().size == len(episodes)
    assert sum(b.shape[0] * b.shape[1] for b in seen) == batches.counters.padded_steps


def test_progress_names_compiling_on_a_first_run_and_loading_on_a_warm_one(tmp_path, monkeypatch):
    """The status lines of a first run say which window shape compiles (k of at most the
    catalogue's size); a warm run's say its kernels load, compiled, from the disk."""
    episodes, _, paths = make_case(tmp_path, "linear_softmax", n_episodes=60, seed=21)
    data = write_step_layout(episodes, tmp_path / "logs.parquet")
    monkeypatch.setenv("OPE_CACHE_DIR", str(tmp_path / "cache"))
    config = EvaluationConfig(data=str(data), policies=(str(paths[0]),), gamma=0.9)
    first, warm = [], []
    evaluate(config, on_status=first.append)
    evaluate(config, on_status=warm.append)
    size = len(window_shapes(BatchingConfig()))
    assert first[0].startswith(f"compiling the kernel for window shape 1 of at most {size}, [")
    assert "evaluating" in first and "evaluating" in warm
    loading = [line for line in warm if line != "evaluating"]
    assert loading and all(line.startswith("loading the compiled kernel") for line in loading)
    # user code is traced every run, compiled or found in the compilation cache: a warm
    # run said "compiling" where its JSON counted cache hits and no compilation
    (tmp_path / "user_policy.py").write_text(
        "import jax.numpy as jnp\n"
        "def log_prob(observation, action):\n"
        "    return -jnp.log(4.0) + 0.0 * jnp.sum(observation)\n"
        "log_prob.n_actions = 4\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    traced = []
    user = dataclasses.replace(config, policies=("user_policy:log_prob",))
    evaluate(user, on_status=traced.append)
    evaluate(user, on_status=traced.append)
    lines = [line for line in traced if line != "evaluating"]
    assert lines and all(line.startswith("tracing the kernel for window shape") for line in lines)


def test_progress_names_the_fitting_passes(tmp_path, monkeypatch):
    """--behavior estimate and --q fit each read the data once before the evaluation, and
    an estimate on data that logs propensities too evaluates again under them after it: the
    status lines count every pass (that last one ran unannounced, under a full bar)."""
    import pyarrow.parquet as pq

    from ope_cli.envs.generate import generate

    generate("chain", tmp_path / "chain", episodes=60, seed=3)
    logged = tmp_path / "chain" / "logs.parquet"
    unlogged = tmp_path / "unlogged.parquet"
    pq.write_table(pq.read_table(logged).drop_columns(["behavior_prob"]), unlogged)
    config = EvaluationConfig(
        data=str(logged),
        policies=(str(tmp_path / "chain" / "policies" / "eval_0.npz"),),
        gamma=0.9,
        behavior=BehaviorConfig(policy="estimate"),
        q=QConfig(sources=("fit",)),
    )
    import ope_cli.models.fitted_q as fitted_q

    fits = []
    fit_q_function = fitted_q.fit_q_function

    def counted_fit(*args, **kwargs):
        fits.append(args[2])
        return fit_q_function(*args, **kwargs)

    monkeypatch.setattr(fitted_q, "fit_q_function", counted_fit)
    lines, rows = [], []
    evaluate(config, on_status=lines.append, on_progress=lambda read, total: rows.append(read))
    # the comparison reads Q-hat as the run fitted it: fitting it again was a silent pass
    assert fits == ["fit"], fits
    # the comparison's rows are counted from 0 again: the display stood at every row read
    total = pq.ParquetFile(logged).metadata.num_rows
    assert rows.count(0) == 2 and rows.index(total) < len(rows) - rows[::-1].index(0) - 1, rows
    assert rows[-1] == total
    assert lines[:3] == [
        "fitting the behavior policy (pass 1 of 4) ...",
        "fitting Q-hat (pass 2 of 4) ...",
        "evaluating (pass 3 of 4)",
    ]
    compare = "evaluating again with the logged propensities, to compare (pass 4 of 4) ..."
    assert lines.count(compare) == 1 and lines.index(compare) > 2, lines
    after = lines[lines.index(compare) + 1 :]  # its kernels load or compile, and say so
    announced = [line for line in after if "the kernel for window shape" in line]
    assert announced and set(after) - set(announced) == {"evaluating"}, lines
    lines.clear()
    evaluate(dataclasses.replace(config, data=str(unlogged)), on_status=lines.append)
    assert lines[:3] == [
        "fitting the behavior policy (pass 1 of 3) ...",
        "fitting Q-hat (pass 2 of 3) ...",
        "evaluating (pass 3 of 3)",
    ]
    assert not any("logged propensities" in line for line in lines), lines


def test_rewards_that_cancel_exactly_are_no_spread_to_resolve():
    """10,000-step episodes whose rewards +-1000 cancel exactly: their returns differ only
    by float64's rounding of the sum (1e-14 of the rewards' size), which said "the episode
    returns vary by 1e-14 of the rewards' size"; those roundings are no spread."""
    from ope_cli.estimation.pipeline import NO_MAGNITUDE, lost_digits

    rng = np.random.default_rng(2)
    rewards = rng.uniform(-1000, 1000, (40, 5_000))
    returns = np.concatenate([rewards, -rewards[:, ::-1]], axis=1).sum(axis=1)  # [40] ~0
    assert np.abs(returns).max() > 0  # float64's rounding, not 0
    assert lost_digits(returns, 1000.0, 10_000) == NO_MAGNITUDE
    assert lost_digits(returns + rng.normal(0, 1e-3, 40), 1000.0, 10_000) == 5  # / 1.06e-3
