"""``ope inspect`` (ope_cli/inspection.py): the schema as detected, counts, length histogram,
propensity summary, action counts, and every validation problem - with the same checks,
and the same verdict per episode, as ``ope evaluate --on-invalid drop``."""

from __future__ import annotations

import dataclasses
import io
import json
import math
import tracemalloc

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import test_on_invalid
from datasets import (
    add_target_probs,
    episode_layout_table,
    random_checkpoint,
    random_episodes,
    step_layout_table,
    write_step_layout,
    write_table,
)
from rich.console import Console

from ope_cli.config import ColumnMapping
from ope_cli.data.validate import REASONS
from ope_cli.errors import DataError
from ope_cli.inspection import InspectConfig, inspect
from ope_cli.report.inspect import render_table, to_json, to_json_dict


def _episodes(seed=0, n=50, **options):
    rng = np.random.default_rng(seed)
    behavior = random_checkpoint("linear_softmax", rng, obs_dim=3, n_actions=3)
    return random_episodes(rng, n, behavior=behavior, median_length=6, max_length=40, **options)


def test_clean_data(tmp_path):
    episodes = _episodes()
    write_step_layout(episodes, tmp_path / "logs.parquet", row_group_size=33)
    report = inspect(InspectConfig(str(tmp_path / "logs.parquet"), read_rows=50))
    doc = json.loads(to_json(report))
    lengths = np.array([len(e["reward"]) for e in episodes])
    assert report.ok and doc["valid"] and doc["problems"] == []
    assert doc["dataset"]["layout"] == "step"
    assert doc["dataset"]["columns"]["behavior_prob"] == {"name": "behavior_prob", "type": "double"}
    # a list<double> column: the length its vectors have (the type says none)
    assert doc["dataset"]["observation"] == {"kind": "vector", "dim": 3}
    counts = doc["counts"]
    assert counts["episodes"] == counts["valid_episodes"] == len(episodes)
    assert counts["steps"] == counts["rows_read"] == lengths.sum()
    assert (counts["min_length"], counts["max_length"]) == (lengths.min(), lengths.max())
    histogram = doc["length_histogram"]
    assert sum(b["episodes"] for b in histogram) == len(episodes)
    for b in histogram:
        assert b["episodes"] == np.sum((lengths >= b["min"]) & (lengths <= b["max"]))
    probs = np.concatenate([e["behavior_prob"] for e in episodes])
    summary = doc["behavior_prob"]
    assert summary["kind"] == "probability"
    assert summary["min"] == pytest.approx(probs.min(), rel=1e-12)
    assert summary["max"] == pytest.approx(probs.max(), rel=1e-12)
    assert summary["median"] == pytest.approx(np.median(probs), rel=3e-3)
    actions = np.concatenate([e["action"] for e in episodes])
    assert doc["action_counts"] == {str(a): int(np.sum(actions == a)) for a in np.unique(actions)}


def test_behavior_median_of_an_even_count_is_the_middle_pair_s_mean():
    """The median of an even number of probabilities is the mean of the middle two (it was
    the lower one: 4.9% off on 30 steps against the 0.2% the README states)."""
    from ope_cli.inspection import InspectReport

    rng = np.random.default_rng(3)
    for size in (2, 4, 18, 30, 31):
        probs = rng.uniform(0.05, 0.95, size)
        report = InspectReport("x", "parquet", 1, None, {})
        report._add_behavior(np.log(probs))
        assert report.behavior_median == pytest.approx(np.median(probs), rel=2e-3), size


def test_the_smallest_behavior_probability_keeps_its_log():
    """A log column's e^-801 is a min of 0.0 in float64; its log is kept for the report."""
    from ope_cli.inspection import InspectReport

    report = InspectReport("x", "parquet", 1, None, {})
    report._add_behavior(np.array([-1.0, -801.0]))
    report._add_behavior(np.array([-2.0]))
    assert report.behavior_min == 0.0 and report.behavior_log_min == -801.0


def test_episode_layout_and_logged_targets(tmp_path):
    """Without --policy, a target column is validated too; observations are optional."""
    rng = np.random.default_rng(1)
    behavior = random_checkpoint("linear_softmax", rng)
    episodes = add_target_probs(random_episodes(rng, 20, behavior=behavior), behavior)
    table = episode_layout_table(episodes, extra_columns=["target_prob"]).drop_columns(
        ["observations"]
    )
    write_table(table, tmp_path / "episodes.parquet")
    doc = to_json_dict(inspect(InspectConfig(str(tmp_path / "episodes.parquet"))))
    assert doc["dataset"]["layout"] == "episode"
    assert doc["dataset"]["target"] == "prob"
    assert doc["dataset"]["observation"] is None
    assert doc["counts"]["rows_read"] == 20 and doc["valid"]


def test_declared_bounds_are_shown_and_checked(tmp_path):
    """Bounds in the schema metadata (what betting intervals rely on) are reported, and every
    reward or step beyond them is a problem."""
    episodes = _episodes(n=30)
    table = step_layout_table(episodes)
    rewards = np.concatenate([e["reward"] for e in episodes])
    declared = {"reward_range": [float(np.quantile(rewards, 0.1)), 10.0], "horizon": 5}
    write_table(
        table.replace_schema_metadata({"ope": json.dumps(declared)}), tmp_path / "l.parquet"
    )
    report = inspect(InspectConfig(str(tmp_path / "l.parquet")))
    doc = to_json_dict(report)
    assert doc["dataset"]["declared"] == declared
    found = {p.reason: p.episodes for p in report.problems}
    low_reward = np.array([np.any(e["reward"] < declared["reward_range"][0]) for e in episodes])
    too_long = np.array([len(e["reward"]) > 5 for e in episodes])
    assert found == {
        "reward_out_of_range": int(low_reward.sum()),
        "episode_too_long": int(too_long.sum()),
    }
    console = Console(width=120, record=True)
    render_table(report, console)
    text = console.export_text()
    assert "rewards in [" in text and "at most 5 steps" in text


@pytest.fixture(scope="module")
def messy(tmp_path_factory):
    """test_on_invalid's table of planted problems split over two files, and a third file
    that is damaged."""
    root = tmp_path_factory.mktemp("messy")
    episodes, _, policy = test_on_invalid._setup(root)
    table, plan = test_on_invalid._bad_step_table(episodes)
    middle = int(test_on_invalid._rows(episodes)[40])
    (root / "logs").mkdir()
    write_table(table.slice(0, middle), root / "logs" / "part-0.parquet", row_group_size=50)
    write_table(table.slice(middle), root / "logs" / "part-1.parquet", row_group_size=50)
    whole = (root / "logs" / "part-1.parquet").read_bytes()
    (root / "logs" / "part-2.parquet").write_bytes(whole[: len(whole) // 2])
    return root, episodes, policy, plan


def test_every_problem_is_listed_with_counts(messy):
    root, episodes, policy, plan = messy
    report = inspect(InspectConfig(str(root / "logs"), policies=(str(policy),), read_rows=16))
    assert not report.ok
    by_reason: dict[str, int] = {}
    for problem in report.problems:
        by_reason[problem.reason] = by_reason.get(problem.reason, 0) + problem.episodes
    planted = set(test_on_invalid.PLANTED) | {
        "null_observation",
        "behavior_prob_zero",
        "duplicate_step",
    }
    assert set(by_reason) == planted | {"file_error"}
    # Each planted problem once, plus the second problems of the two double episodes.
    assert by_reason["reward_not_finite"] == 2
    assert by_reason["behavior_prob_zero"] == 2
    assert by_reason["duplicate_step"] == 2
    (damaged,) = [p for p in report.problems if p.reason == "file_error"]
    assert damaged.file.endswith("part-2.parquet")
    assert report.invalid_episodes == len(plan)
    assert report.episodes == len(episodes) - len(plan)
    for problem in report.problems:
        if problem.reason != "file_error":
            assert problem.file.endswith(".parquet") and problem.episode is not None


def test_problems_are_listed_in_one_order_for_any_batch_size(messy):
    """The problems came in the order they were found, which follows the batch cuts:
    --read-rows 3 listed the same problems in another order than the default. They are
    listed in the order of the checks, as are their counts and first places."""
    root, _, policy, _ = messy

    def listed(rows: int) -> list:
        config = InspectConfig(str(root / "logs"), policies=(str(policy),), read_rows=rows)
        return [dataclasses.astuple(p) for p in inspect(config).problems]

    default = listed(1 << 20)
    assert len(default) > 3
    assert [p[0] for p in default] == sorted((p[0] for p in default), key=REASONS.index)
    for rows in (3, 16):
        assert listed(rows) == default


def test_inspect_and_drop_agree(messy):
    """The same checks, the same verdict: what inspect counts as invalid is exactly what
    evaluate --on-invalid drop leaves out (on the readable files)."""
    root, _, policy, _ = messy
    readable = root / "readable"
    readable.mkdir(exist_ok=True)
    for name in ("part-0.parquet", "part-1.parquet"):
        (readable / name).write_bytes((root / "logs" / name).read_bytes())
    report = inspect(InspectConfig(str(readable), policies=(str(policy),)))
    result = test_on_invalid._run(readable, policy)
    assert report.invalid_episodes == result.dataset.episodes_dropped
    assert report.invalid_steps == result.dataset.steps_dropped
    assert report.episodes == result.dataset.episodes and report.steps == result.dataset.steps
    assert report.rows_read == result.dataset.rows_read


def test_cli_exit_codes_and_formats(messy, ope_many_in_process):
    root, _, policy, _ = messy
    write_step_layout(_episodes(seed=2, n=10), root / "clean.parquet")
    runs = ope_many_in_process(
        {
            "messy_json": {
                "args": ["inspect", "logs", "-p", str(policy), "--format", "json"],
                "cwd": root,
            },
            "clean_table": {"args": ["inspect", "clean.parquet", "--format", "table"], "cwd": root},
            "clean_default": {"args": ["inspect", "clean.parquet"], "cwd": root},
            "csv": {"args": ["inspect", "clean.parquet", "--format", "csv"], "cwd": root},
        }
    )
    run = runs["messy_json"]
    assert run.returncode == 3, run
    doc = json.loads(run.stdout)
    assert not doc["valid"] and len(doc["problems"]) >= len(test_on_invalid.PLANTED)
    assert len(run.stderr.splitlines()) == 1 and run.stderr.startswith("ope: invalid data: "), run
    invalid = doc["counts"]["invalid_episodes"]  # an episode with two problems counts once
    assert f"validation problem, in {invalid:,} episode(s)" in run.stderr, (invalid, run)
    assert ", and 1 file(s) not read to the end (see the report)" in run.stderr, run
    assert (
        runs["clean_table"].returncode == 0
        and "no validation problems" in runs["clean_table"].stdout
    ), runs["clean_table"]
    assert json.loads(runs["clean_default"].stdout)["valid"] is True  # a pipe gets JSON
    assert runs["csv"].returncode == 2, runs["csv"]
    for run in runs.values():
        assert "Traceback" not in run.stderr, run


def test_table_names_every_kind_of_problem_and_the_damaged_file(messy, monkeypatch):
    """The table ``ope inspect logs --format table`` prints (120 columns) of the messy data
    without a policy."""
    root, _, _, _ = messy
    monkeypatch.chdir(root)
    console = Console(width=120, record=True, file=io.StringIO())
    render_table(inspect(InspectConfig("logs")), console)
    text = console.export_text()
    for word in ("reward_not_finite", "missing_step", "file_error", "part-2.parquet"):
        assert word in text, word


def test_table_rendering(messy):
    root, _, policy, _ = messy
    console = Console(width=160, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    render_table(inspect(InspectConfig(str(root / "logs"), policies=(str(policy),))), console)
    text = console.export_text()
    for word in (
        "columns",
        "episode lengths",
        "behavior probability",
        "actions",
        "validation problems",
        "action_out_of_range",
    ):
        assert word in text, word
    # the summaries cover the valid episodes, as the tables beside them say
    assert "behavior probability (valid episodes): min" in text


def test_unusable_data_is_one_error(tmp_path):
    write_table(step_layout_table(_episodes(n=5)).drop_columns(["reward"]), tmp_path / "x.parquet")
    with pytest.raises(DataError, match=r"x\.parquet: no reward column"):
        inspect(InspectConfig(str(tmp_path / "x.parquet")))
    with pytest.raises(DataError, match="no such file"):
        inspect(InspectConfig(str(tmp_path / "nothing")))


def test_same_report_for_any_batch_size(tmp_path):
    episodes = _episodes(seed=3, n=60)
    table = step_layout_table(episodes)
    rewards = table.column("reward").to_numpy().copy()
    rewards[[5, 77, 140]] = np.nan
    write_table(
        table.set_column(4, "reward", pa.array(rewards)),
        tmp_path / "logs.parquet",
        row_group_size=41,
    )
    docs = [
        to_json_dict(inspect(InspectConfig(str(tmp_path / "logs.parquet"), read_rows=rows)))
        for rows in (1, 13, 1 << 20)
    ]
    for doc in docs[1:]:
        assert doc == docs[0]


def test_memory_is_bounded_by_the_batch(tmp_path):
    """Four times the data, about the same peak of Python/NumPy memory (batches of 4,096
    rows; Arrow's own buffers are per batch too)."""
    peaks = []
    for n in (2_000, 8_000):
        path = tmp_path / f"logs{n}.parquet"
        write_step_layout(_episodes(seed=4, n=n), path, row_group_size=4096)
        tracemalloc.start()
        report = inspect(InspectConfig(str(path), columns=ColumnMapping(), read_rows=4096))
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
        assert report.ok
    assert peaks[1] < 1.6 * peaks[0], peaks


def _returns(episodes, gamma: float) -> np.ndarray:
    return np.array([np.sum(e["reward"] * gamma ** np.arange(len(e["reward"]))) for e in episodes])


def test_rewards_returns_and_the_logging_policys_value(tmp_path):
    """Per-step reward statistics and the discounted return's distribution, for the gamma
    the data declares or --gamma; the mean return (the logging policy's value) with its
    standard error, streamed over small batches."""
    episodes = _episodes(seed=3, n=60)
    table = step_layout_table(episodes).replace_schema_metadata({"ope": '{"gamma": 0.8}'})
    write_table(table, tmp_path / "g.parquet")
    rewards = np.concatenate([e["reward"] for e in episodes])
    for gamma, source in ((None, "data"), (0.5, "option")):
        report = inspect(InspectConfig(str(tmp_path / "g.parquet"), read_rows=37, gamma=gamma))
        doc = json.loads(to_json(report))
        used = 0.8 if gamma is None else gamma
        assert (doc["gamma"], doc["gamma_source"]) == (used, source)
        assert doc["dataset"]["declared"]["gamma"] == 0.8
        # --gamma replacing the declared one is warned of, as evaluate warns (it was not)
        codes = [w["code"] for w in doc["warnings"]]
        assert codes == ([] if gamma is None else ["gamma_not_the_data_s"])
        reward = doc["reward"]
        assert reward["mean"] == pytest.approx(rewards.mean(), rel=1e-9)
        assert reward["std"] == pytest.approx(rewards.std(), rel=1e-6)
        assert (reward["min"], reward["max"]) == (rewards.min(), rewards.max())
        returns = _returns(episodes, used)
        value = doc["return"]
        assert value["value"] == pytest.approx(returns.mean(), rel=1e-9)
        assert value["stderr"] == pytest.approx(returns.std(ddof=1) / np.sqrt(60), rel=1e-9)
        assert value["quantiles"]["p50"] == pytest.approx(np.median(returns), rel=1e-9)
        assert (value["min"], value["max"]) == pytest.approx((returns.min(), returns.max()))
    console = Console(width=160, record=True)
    render_table(report, console)
    text = console.export_text()
    assert (
        "reward per step (valid episodes): mean" in text
        and "discounted return (gamma=0.5, --gamma)" in text
    )
    assert "logging policy's value (mean discounted return)" in text
    assert "declared in the metadata: gamma 0.8" in text
    assert "warning: gamma is 0.5 (--gamma), not the 0.8 the data declares" in text


def test_inspect_without_a_declared_gamma_uses_one(tmp_path):
    episodes = _episodes(seed=4, n=20)
    write_step_layout(episodes, tmp_path / "l.parquet")
    report = inspect(InspectConfig(str(tmp_path / "l.parquet")))
    doc = to_json_dict(report)
    assert (doc["gamma"], doc["gamma_source"]) == (1.0, "default")
    assert doc["return"]["value"] == pytest.approx(_returns(episodes, 1.0).mean(), rel=1e-9)
    # warned, as evaluate warns, in JSON and the table (returns summed undiscounted)
    (warning,) = doc["warnings"]
    assert warning["code"] == "gamma_default" and set(warning) == {"code", "message", "policy"}
    console = Console(width=300, record=True)
    render_table(report, console)
    assert "warning: gamma is 1, the default" in console.export_text()
    given = to_json_dict(inspect(InspectConfig(str(tmp_path / "l.parquet"), gamma=0.9)))
    assert given["warnings"] == []


def test_data_without_rows_fails_as_evaluate_does(tmp_path, ope_in_process):
    """inspect passes only what evaluate can evaluate: data without rows is one
    ``no episodes`` line and exit 3 (with the report on stdout, "valid": false)."""
    write_step_layout(_episodes(seed=2, n=3), tmp_path / "some.parquet")
    pq.write_table(pq.read_table(tmp_path / "some.parquet").slice(0, 0), tmp_path / "none.parquet")
    run = ope_in_process(["inspect", tmp_path / "none.parquet", "--format", "json"])
    assert run.returncode == 3, run
    assert (
        run.stderr
        == f"ope: invalid data: {tmp_path / 'none.parquet'}: no episodes (the data has no rows)\n"
    )
    assert json.loads(run.stdout)["valid"] is False


def test_the_error_line_counts_kinds_of_problem_not_rows(tmp_path, ope_in_process):
    """An episode-layout row whose rewards list is one longer than its three other lists is
    three report rows of one kind (lists_disagree): the line said "3 kind(s)"."""
    table = {
        "episode_id": [10, 11],
        "observations": [[0.1, 0.2], [0.3, 0.4]],
        "actions": [[0, 1], [1, 0]],
        "rewards": [[1.0, 2.0], [1.0, 2.0, 3.0]],
        "action_probs": [[0.5, 0.5], [0.5, 0.5]],
    }
    pq.write_table(pa.table(table), tmp_path / "lists.parquet")
    run = ope_in_process(["inspect", tmp_path / "lists.parquet", "--format", "json"])
    assert run.returncode == 3, run
    assert [p["reason"] for p in json.loads(run.stdout)["problems"]] == ["lists_disagree"] * 3
    assert "1 kind(s) of validation problem (3 row(s) in the report), in 1 episode(s)" in (
        run.stderr
    )


def test_a_null_step_is_located_at_its_row(tmp_path):
    """Filled to be recorded, a null step sorted first: it was reported at step 0 of its
    episode, with a made-up missing step beside it. It keeps its row's place."""
    episodes = _episodes(n=20)
    long = next(i for i, e in enumerate(episodes) if len(e["reward"]) > 8)
    table = step_layout_table(episodes)
    steps = table.column("step").to_pylist()
    ids = table.column("episode_id").to_pylist()
    row = [i for i, e in enumerate(ids) if e == episodes[long]["episode_id"]][5]
    steps[row] = None
    table = table.set_column(table.schema.get_field_index("step"), "step", pa.array(steps))
    pq.write_table(table, tmp_path / "logs.parquet")
    report = inspect(InspectConfig(str(tmp_path / "logs.parquet")))
    (problem,) = report.problems
    assert (problem.reason, problem.episode, problem.step) == ("null_step", ids[row], 5)
    assert report.invalid_episodes == 1


def test_the_actions_counted_one_by_one_do_not_depend_on_the_batches(tmp_path):
    """Past 1,000 distinct actions, the ones counted one by one were the first met, so
    --read-rows 100 listed 223 other actions than the default: the 1,000 smallest are."""
    rng = np.random.default_rng(3)
    steps = 3_000
    table = {
        "episode_id": np.arange(steps) // 10,
        "step": np.arange(steps) % 10,
        "observation": rng.normal(size=steps),
        "action": rng.integers(0, 1_500, steps),
        "reward": np.ones(steps),
        "behavior_prob": np.full(steps, 0.5),
    }
    pq.write_table(pa.table(table), tmp_path / "many.parquet")
    reports = [
        inspect(InspectConfig(str(tmp_path / "many.parquet"), read_rows=rows))
        for rows in (65_536, 100, 7)
    ]
    counted = sorted(set(table["action"].tolist()))[:1_000]
    for report in reports:
        assert sorted(report.action_counts) == counted
        assert sum(report.action_counts.values()) + report.other_actions == steps
        assert report.action_counts == reports[0].action_counts


def _logged(episode_id: list, step: list, reward: list | None = None) -> pa.Table:
    """Steps of the given ids and step numbers: observation 0, action 0, probability 0.5,
    reward 1 (or ``reward``)."""
    n = len(step)
    return pa.table(
        {
            "episode_id": episode_id,
            "step": step,
            "observation": np.zeros(n),
            "action": np.zeros(n, np.int64),
            "reward": np.ones(n) if reward is None else reward,
            "behavior_prob": np.full(n, 0.5),
        }
    )


@pytest.mark.parametrize("read_rows", [1, 3, 100])
def test_a_split_episode_is_one_problem_not_a_missing_step_too(tmp_path, read_rows):
    """Episode 0's rows in two stretches: its later part is invalid as a reappearance;
    that its steps start at 2 there is no second problem (the file holds steps 0 and 1).
    The problem counts the later part's rows and is located at its first step (it said
    one row, at step 0)."""
    table = _logged([0, 0, 1, 1, 0, 0], [0, 1, 0, 1, 2, 3])
    pq.write_table(table, tmp_path / "logs.parquet")
    report = inspect(InspectConfig(str(tmp_path / "logs.parquet"), read_rows=read_rows))
    (problem,) = report.problems
    assert problem.reason == "episode_reappears"
    assert (report.invalid_episodes, report.invalid_steps) == (1, 2)
    assert (problem.episodes, problem.steps, problem.episode, problem.step) == (1, 2, 0, 2)


def test_without_valid_episodes_every_length_is_null(tmp_path):
    table = pa.table(
        {
            "episode_id": [0, 0],
            "step": [0, 1],
            "observation": [0.0, 0.0],
            "action": [0, 0],
            "reward": [1.0, float("nan")],
            "behavior_prob": [0.5, 0.5],
        }
    )
    pq.write_table(table, tmp_path / "logs.parquet")
    report = inspect(InspectConfig(str(tmp_path / "logs.parquet")))
    assert report.min_length is report.max_length is None  # the API's, as the JSON's
    counts = to_json_dict(report)["counts"]
    assert counts["valid_episodes"] == 0
    assert counts["min_length"] is counts["max_length"] is counts["mean_length"] is None


def test_a_problem_after_a_missing_step_is_located_at_its_own_step(tmp_path):
    """In an episode without step 2, a NaN reward at step 4 was located at step 3 (its
    place in the episode); it is at the step its row says."""
    table = _logged([0, 0, 0, 0, 1, 1], [0, 1, 3, 4, 0, 1], [1.0, 1.0, 1.0, math.nan, 1.0, 1.0])
    pq.write_table(table, tmp_path / "logs.parquet")
    report = inspect(InspectConfig(str(tmp_path / "logs.parquet")))
    located = {problem.reason: (problem.episode, problem.step) for problem in report.problems}
    assert located["reward_not_finite"] == (0, 4)


def test_a_missing_step_is_located_at_the_step_that_is_missing(tmp_path):
    """Without step 2, inspect said "first at episode 0, step 3", a step that is there (as
    evaluate says, "step 2 is missing")."""
    table = _logged([0, 0, 0, 0, 1, 1], [0, 1, 3, 4, 0, 1], [1.0] * 6)
    pq.write_table(table, tmp_path / "logs.parquet")
    report = inspect(InspectConfig(str(tmp_path / "logs.parquet")))
    located = {problem.reason: (problem.episode, problem.step) for problem in report.problems}
    assert located == {"missing_step": (0, 2)}


def test_rewards_on_a_large_offset_keep_their_spread(tmp_path):
    """Rewards of 1e8 + N(0, 1): the std came from raw sums of r^2 and was 0, and the
    table read "mean 1e+08, std 0, min 1e+08, max 1e+08", a constant."""
    rng = np.random.default_rng(5)
    n = 1000
    reward = 1e8 + rng.normal(size=n)
    table = pa.table(
        {
            "episode_id": np.arange(n),
            "step": np.zeros(n, np.int64),
            "observation": np.zeros(n),
            "action": np.zeros(n, np.int64),
            "reward": reward,
            "behavior_prob": np.full(n, 0.5),
        }
    )
    pq.write_table(table, tmp_path / "offset.parquet")
    report = inspect(InspectConfig(str(tmp_path / "offset.parquet")))
    stats = to_json_dict(report)["reward"]
    assert stats["std"] == pytest.approx(reward.std(), rel=1e-6)
    assert stats["mean"] == pytest.approx(reward.mean(), rel=1e-15)
    console = Console(file=io.StringIO(), width=200)
    render_table(report, console)
    (line,) = [x for x in console.file.getvalue().splitlines() if "reward per step" in x]
    shown = dict(part.split(" ")[-2:] for part in line.split(": ", 1)[1].split(", "))
    assert float(shown["min"]) == pytest.approx(reward.min(), abs=0.1)
    assert float(shown["max"]) == pytest.approx(reward.max(), abs=0.1)
    assert float(shown["std"]) == pytest.approx(reward.std(), rel=1e-3)


def test_a_damaged_first_file_is_reported_and_skipped(messy, tmp_path):
    """README: a file that fails while it is read is reported and skipped. A damaged FIRST
    file stopped inspect with pyarrow's words, as the schema is read from it."""
    root, episodes, policy, plan = messy
    logs = tmp_path / "logs"
    logs.mkdir()
    whole = (root / "logs" / "part-0.parquet").read_bytes()
    (logs / "part-0.parquet").write_bytes(whole[: len(whole) // 2])
    (logs / "part-1.parquet").write_bytes((root / "logs" / "part-1.parquet").read_bytes())
    report = inspect(InspectConfig(str(logs), policies=(str(policy),)))
    (damaged,) = [p for p in report.problems if p.reason == "file_error"]
    assert damaged.file == str(logs / "part-0.parquet")
    assert report.episodes > 0
