"""``--on-invalid drop``: invalid episodes are left out, counted by reason, and everything
else is exactly what the valid episodes alone give (ope_cli/data/episodes.py, pipeline.py).

Invalid values are planted in chosen episodes of a random dataset; the estimates with
``drop`` must equal the float64 reference over the remaining episodes, the report must
count the dropped episodes and steps under the first problem of each, and every row read
must be accounted for (step layout: rows_read = steps + steps_dropped; episode layout,
where a row is an episode: rows_read = episodes + episodes_dropped).
"""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasets import (
    add_target_probs,
    episode_layout_table,
    perturb_checkpoint,
    random_checkpoint,
    random_episodes,
    save_checkpoint,
    step_layout_table,
    to_reference_input,
    write_table,
)
from reference import DIAGNOSTICS, ESTIMATORS, reference_estimates
from rendered import shown

import ope_cli
from ope_cli.config import BatchingConfig, EvaluationConfig, RuntimeConfig
from ope_cli.errors import DataError, InvalidValueError
from ope_cli.estimation.pipeline import evaluate
from ope_cli.report.warnings import DROPPED

GAMMA = 0.9


def _setup(tmp_path, n=80, seed=3):
    rng = np.random.default_rng(seed)
    behavior = random_checkpoint("linear_softmax", rng, obs_dim=3, n_actions=3)
    episodes = random_episodes(rng, n, behavior=behavior, median_length=5, max_length=12)
    target = perturb_checkpoint(behavior, rng, 0.4)
    policy = save_checkpoint(tmp_path / "target.npz", target)
    return episodes, target, policy


def _run(data, policy, on_invalid="drop", **batching):
    config = EvaluationConfig(
        data=str(data),
        policies=(str(policy),),
        gamma=GAMMA,
        on_invalid=on_invalid,
        batching=BatchingConfig(**batching),
        runtime=RuntimeConfig(precision="float64"),
    )
    return evaluate(config)


def _assert_matches(result, episodes, target):
    expected = reference_estimates(to_reference_input(episodes, target), GAMMA)
    (policy,) = result.results
    for name in ESTIMATORS:
        assert policy.estimates[name].value == pytest.approx(expected[name], rel=1e-6), name
    for name in DIAGNOSTICS:
        assert getattr(policy.diagnostics, name) == pytest.approx(expected[name], rel=1e-6), name


def _rows(episodes) -> np.ndarray:
    """[E + 1] first row of each episode in the step-layout table, then the total."""
    return np.concatenate([[0], np.cumsum([len(e["reward"]) for e in episodes])])


# reason -> how it is planted into the step-layout table at an episode's step 1
PLANTED = (
    "reward_not_finite",
    "behavior_prob_zero",
    "behavior_prob_above_one",
    "action_out_of_range",
    "action_negative",
    "observation_not_finite",
    "duplicate_step",
    "missing_step",
    "null_reward",
    "ragged_observation",
    "behavior_prob_nan",
    "null_action",
)


def _set(column, value):
    """A planter that sets ``column`` at the episode's second row to ``value``."""

    def plant(columns, row, _end):
        columns[column][row] = value

    return plant


def _set_step(columns, row, _end):
    columns["step"][row + 1] = 1  # a duplicate step


def _shift_last_step(columns, _row, end):
    columns["step"][end - 1] += 10  # a missing step


def _nan_observation(columns, row, _end):
    columns["observation"][row][0] = float("nan")


def _ragged_observation(columns, row, _end):
    columns["observation"][row] = columns["observation"][row][:2]


# How each PLANTED problem is written into the columns: plant(columns, row, end of episode).
_PLANT = {
    "reward_not_finite": _set("reward", float("inf")),
    "behavior_prob_zero": _set("behavior_prob", 0.0),
    "behavior_prob_above_one": _set("behavior_prob", 1.5),
    "behavior_prob_nan": _set("behavior_prob", float("nan")),
    "action_out_of_range": _set("action", 3),
    "action_negative": _set("action", -2),
    "observation_not_finite": _nan_observation,
    "duplicate_step": _set_step,
    "missing_step": _shift_last_step,
    "null_reward": _set("reward", None),
    "null_action": _set("action", None),
    "ragged_observation": _ragged_observation,
}


def _bad_step_table(episodes):
    """The step table with one problem planted per episode in PLANTED order, plus two
    episodes with two problems each (counted under the first check that fails). Returns
    (table, {episode index: reason})."""
    candidates = [i for i, e in enumerate(episodes) if len(e["reward"]) >= 3 and i % 3 == 1]
    plan = dict(zip(candidates, PLANTED, strict=False))
    doubles = candidates[len(PLANTED) : len(PLANTED) + 2]
    assert len(plan) == len(PLANTED) and len(doubles) == 2
    table = step_layout_table(episodes)
    starts = _rows(episodes)
    columns = {name: table.column(name).to_pylist() for name in table.column_names}
    for index, reason in plan.items():
        _PLANT[reason](columns, int(starts[index]) + 1, int(starts[index + 1]))
    first, second = doubles
    columns["behavior_prob"][int(starts[first])] = 0.0  # behavior 0 at step 0 ...
    columns["reward"][int(starts[first]) + 2] = float("nan")  # ... but the reward check runs first
    columns["observation"][int(starts[second]) + 1] = None  # null (read first) ...
    columns["step"][int(starts[second]) + 2] = 0  # ... before a duplicate step 0
    plan[first], plan[second] = "reward_not_finite", "null_observation"
    return pa.table(
        {name: pa.array(values, table.schema.field(name).type) for name, values in columns.items()}
    ), plan


def _expected_dropped(episodes, plan) -> dict:
    dropped: dict[str, dict[str, int]] = {}
    for index, reason in plan.items():
        counts = dropped.setdefault(reason, {"episodes": 0, "steps": 0})
        counts["episodes"] += 1
        counts["steps"] += len(episodes[index]["reward"])
    return dropped


@pytest.fixture(scope="module")
def step_case(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("drop")
    episodes, target, policy = _setup(tmp_path)
    table, plan = _bad_step_table(episodes)
    write_table(table, tmp_path / "bad.parquet")
    return tmp_path, episodes, target, policy, plan


@pytest.mark.parametrize("read_rows", [1, 7, 64, 65_536])
def test_drop_leaves_out_exactly_the_invalid_episodes(step_case, read_rows):
    """However record batches cut the episodes (invalid rows carried into the next batch),
    the result is the reference over the valid episodes."""
    tmp_path, episodes, target, policy, plan = step_case
    result = _run(tmp_path / "bad.parquet", policy, read_rows=read_rows, batch_steps=256)
    valid = [e for i, e in enumerate(episodes) if i not in plan]
    _assert_matches(result, valid, target)
    assert result.dataset.episodes == len(valid)
    assert result.dataset.episodes_dropped == len(plan)
    assert result.dataset.dropped == _expected_dropped(episodes, plan)
    assert result.dataset.rows_read == result.dataset.steps + result.dataset.steps_dropped
    assert result.dataset.steps_dropped == sum(len(episodes[i]["reward"]) for i in plan)


def test_default_stops_at_the_first_invalid_value(step_case):
    """Without drop the run stops; read row by row, at the first invalid episode (in larger
    batches a null is seen as the batch is read, before earlier episodes' values)."""
    tmp_path, episodes, _, policy, plan = step_case
    first = min(plan)
    with pytest.raises(DataError, match=rf"episode {episodes[first]['episode_id']}, step 1\b"):
        _run(tmp_path / "bad.parquet", policy, on_invalid="error", read_rows=1)


def test_drop_without_invalid_episodes_changes_nothing(tmp_path):
    episodes, target, policy = _setup(tmp_path, n=40, seed=5)
    write_table(step_layout_table(episodes), tmp_path / "good.parquet")
    dropped = _run(tmp_path / "good.parquet", policy)
    error = _run(tmp_path / "good.parquet", policy, on_invalid="error")
    assert (
        dropped.dataset.episodes_dropped == dropped.dataset.steps_dropped == 0
        and dropped.dataset.dropped == {}
    )
    assert dropped.dataset.rows_read == dropped.dataset.steps == error.dataset.steps
    for a, b in zip(
        dropped.results[0].estimates.values(), error.results[0].estimates.values(), strict=True
    ):
        assert a == b
    _assert_matches(dropped, episodes, target)


def test_drop_in_the_episode_layout(tmp_path):
    episodes, target, policy = _setup(tmp_path, n=60, seed=9)
    table = episode_layout_table(episodes)
    table = table.append_column(
        "steps", pa.array([list(range(len(e["reward"]))) for e in episodes], pa.list_(pa.int64()))
    )
    columns = {name: table.column(name).to_pylist() for name in table.column_names}
    long = [i for i, e in enumerate(episodes) if len(e["reward"]) >= 3]
    plan = {
        long[0]: "null_action",
        long[1]: "empty_episode",
        long[2]: "lists_disagree",
        long[3]: "reward_not_finite",
        long[4]: "duplicate_step",
        long[5]: "observation_not_finite",
        long[6]: "null_reward",
    }
    columns["actions"][long[0]] = None
    columns["rewards"][long[6]] = None  # counted with its other lists' steps (it said 0)
    for name in ("observations", "actions", "rewards", "action_probs", "steps"):
        columns[name][long[1]] = []
    columns["rewards"][long[2]] = columns["rewards"][long[2]][:-1]
    columns["rewards"][long[3]][1] = float("nan")
    columns["steps"][long[4]][2] = 1
    columns["observations"][long[5]][0][1] = float("-inf")
    bad = pa.table(
        {name: pa.array(values, table.schema.field(name).type) for name, values in columns.items()}
    )
    write_table(bad, tmp_path / "episodes.parquet", row_group_size=7)

    result = _run(tmp_path / "episodes.parquet", policy, read_rows=5, batch_steps=256)
    valid = [e for i, e in enumerate(episodes) if i not in plan]
    _assert_matches(result, valid, target)
    steps = {i: len(episodes[i]["reward"]) for i in plan}
    steps[long[1]] = 0  # emptied
    steps[long[2]] -= 1  # its rewards list was shortened
    expected = {reason: {"episodes": 1, "steps": steps[i]} for i, reason in plan.items()}
    assert result.dataset.dropped == expected
    assert (
        result.dataset.rows_read
        == result.dataset.episodes + result.dataset.episodes_dropped
        == len(episodes)
    )
    assert result.dataset.steps + result.dataset.steps_dropped == sum(
        steps.get(i, len(e["reward"])) for i, e in enumerate(episodes)
    )
    # without drop, a null list is an error that --on-invalid drop can leave out, as a
    # null value is (its line named no --on-invalid)
    nulls = bad.filter(pa.array([i in (long[0], long[6]) for i in range(len(episodes))]))
    write_table(nulls, tmp_path / "nulls.parquet")
    with pytest.raises(InvalidValueError, match="is null") as raised:
        _run(tmp_path / "nulls.parquet", policy, on_invalid="error")
    assert raised.value.droppable


def test_drop_checks_states_against_a_tabular_policy(tmp_path):
    rng = np.random.default_rng(2)
    behavior = random_checkpoint("tabular", rng, n_states=5, n_actions=2)
    episodes = random_episodes(rng, 30, behavior=behavior, median_length=4, max_length=8)
    policy = save_checkpoint(tmp_path / "tab.npz", behavior)
    table = step_layout_table(episodes)
    states = table.column("observation").to_numpy().copy()
    starts = _rows(episodes)
    states[starts[4]] = 5  # one past the last state
    states[starts[9]] = -1
    table = table.set_column(
        table.schema.get_field_index("observation"), "observation", pa.array(states)
    )
    write_table(table, tmp_path / "tab.parquet")
    result = _run(tmp_path / "tab.parquet", policy)
    assert result.dataset.dropped == {
        "state_negative": {"episodes": 1, "steps": len(episodes[9]["reward"])},
        "state_out_of_range": {"episodes": 1, "steps": len(episodes[4]["reward"])},
    }
    _assert_matches(result, [e for i, e in enumerate(episodes) if i not in (4, 9)], behavior)


def test_structural_problems_are_never_dropped(tmp_path):
    """Drop is for bad values in an episode; rows of one episode in two places, or data that
    does not fit the policy at all, still stop the run."""
    episodes, _, policy = _setup(tmp_path, n=20, seed=4)
    (tmp_path / "split").mkdir()
    write_table(step_layout_table(episodes[:6]), tmp_path / "split" / "part-0.parquet")
    write_table(step_layout_table(episodes[5:]), tmp_path / "split" / "part-1.parquet")
    with pytest.raises(DataError, match="more than one place"):
        _run(tmp_path / "split", policy)
    other = save_checkpoint(
        tmp_path / "wide.npz",
        random_checkpoint("linear_softmax", np.random.default_rng(0), obs_dim=5, n_actions=3),
    )
    write_table(step_layout_table(episodes), tmp_path / "logs.parquet")
    with pytest.raises(DataError, match="expects 5"):
        _run(tmp_path / "logs.parquet", other)


def test_dropping_every_episode_is_an_error(tmp_path):
    episodes, _, policy = _setup(tmp_path, n=10, seed=6)
    table = step_layout_table(episodes)
    table = table.set_column(
        table.schema.get_field_index("reward"), "reward", pa.array(np.full(table.num_rows, np.nan))
    )
    write_table(table, tmp_path / "all_bad.parquet")
    with pytest.raises(DataError, match=r"dropped every episode.*reward_not_finite: 10"):
        _run(tmp_path / "all_bad.parquet", policy)


def test_json_document_reports_what_was_dropped(step_case, monkeypatch):
    """The JSON document's dataset block (``Evaluation.to_dict``); without drop the same
    data stops the run with a DataError (exit code 3)."""
    tmp_path, episodes, _, policy, plan = step_case
    monkeypatch.chdir(tmp_path)
    options = {"policies": policy.name, "gamma": 0.9}
    document = ope_cli.evaluate("bad.parquet", on_invalid="drop", **options).to_dict()
    dataset = document["dataset"]
    expected = _expected_dropped(episodes, plan)
    assert dataset["on_invalid"] == "drop"
    assert dataset["dropped"] == expected
    assert dataset["episodes_dropped"] == len(plan)
    assert dataset["steps_dropped"] == sum(c["steps"] for c in expected.values())
    assert dataset["steps_used"] == dataset["steps"]
    assert dataset["rows_read"] == dataset["steps_used"] + dataset["steps_dropped"]
    with pytest.raises(DataError) as raised:
        ope_cli.evaluate("bad.parquet", policies=policy.name)
    assert raised.value.exit_code == 3


def test_every_format_reports_what_was_dropped(step_case, monkeypatch):
    """The table's line under its tables (once), a warning in the JSON's warnings and in
    every CSV row's warnings column; nothing where nothing was dropped."""
    tmp_path, episodes, _, policy, plan = step_case
    monkeypatch.chdir(tmp_path)
    evaluation = ope_cli.evaluate("bad.parquet", policies=policy.name, on_invalid="drop", gamma=0.9)
    table = shown(evaluation, "table")
    (line,) = [li for li in table.splitlines() if "--on-invalid drop" in li]
    assert f"dropped {len(plan)} invalid episode(s)" in line
    assert "reward_not_finite" in line
    (warning,) = [
        w for w in json.loads(shown(evaluation, "json"))["warnings"] if w["code"] == DROPPED
    ]
    assert warning["policy"] is None and warning["message"] == line.strip()
    rows = list(csv.DictReader(io.StringIO(shown(evaluation, "csv"))))
    assert rows and all(f"{DROPPED}: {line.strip()}" in row["warnings"] for row in rows)
    write_table(step_layout_table(episodes), tmp_path / "clean.parquet")
    clean = ope_cli.evaluate("clean.parquet", policies=policy.name, on_invalid="drop", gamma=0.9)
    assert DROPPED not in shown(clean, "json") + shown(clean, "csv")


def test_default_json_accounts_for_every_row(tmp_path, monkeypatch):
    episodes, _, policy = _setup(tmp_path, n=15, seed=8)
    pq.write_table(step_layout_table(episodes), tmp_path / "logs.parquet")
    monkeypatch.chdir(tmp_path)
    dataset = ope_cli.evaluate("logs.parquet", policies=policy.name).to_dict()["dataset"]
    assert dataset["on_invalid"] == "error"
    assert dataset["dropped"] == {} and dataset["episodes_dropped"] == dataset["steps_dropped"] == 0
    assert dataset["rows_read"] == dataset["steps_used"] == dataset["steps"]


def test_an_infinite_reward_is_dropped_under_a_declared_range(tmp_path):
    """With a declared reward range, an infinite reward is still a bad value that drop
    leaves out (reward_not_finite), not a broken promise about the range that stops the
    run; the estimates are those of the other episodes."""
    episodes, target, policy = _setup(tmp_path, n=30, seed=8)
    bad = [dict(e) for e in episodes]
    reward = np.array(bad[4]["reward"], dtype=float)
    reward[-1] = np.inf
    bad[4]["reward"] = reward
    low = min(float(np.min(e["reward"])) for e in episodes)
    high = max(float(np.max(e["reward"])) for e in episodes)
    table = step_layout_table(bad)
    bounds = {"reward_range": [low, high]}
    write_table(
        table.replace_schema_metadata({"ope": json.dumps(bounds)}), tmp_path / "declared.parquet"
    )
    result = _run(tmp_path / "declared.parquet", policy)
    assert result.dataset.dropped == {"reward_not_finite": {"episodes": 1, "steps": len(reward)}}
    _assert_matches(result, episodes[:4] + episodes[5:], target)


RAGGED_GAMMA = 0.9
RAGGED_READ_ROWS = (1, 7, 64, 65_536)
RAGGED = (1, 2, 3)  # episodes with size-2 observations at every step
# The observation width every other observation is judged against is decided once for the
# data (``episode_stream.vector_widths``): it was the most common length of the first record
# batch, so which episodes were "ragged" moved with --read-rows. Below, the data's first row
# has the usual size 3 and episodes 1-3, right after it, size 2: 7 rows are mostly size 2.


@pytest.fixture(scope="module")
def ragged_case(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("ragged")
    rng = np.random.default_rng(11)
    behavior = random_checkpoint("linear_softmax", rng, obs_dim=3, n_actions=3)
    episodes = random_episodes(rng, 40, behavior=behavior, median_length=6, max_length=12)
    first = episodes[0]
    episodes[0] = {k: (v[:1] if isinstance(v, np.ndarray) else v) for k, v in first.items()}
    target = perturb_checkpoint(behavior, rng, 0.4)
    policy = save_checkpoint(tmp_path / "target.npz", target)
    episodes = add_target_probs(episodes, target)
    table = step_layout_table(episodes, extra_columns=("target_prob",))
    observation = table.column("observation").to_pylist()
    null_head = list(observation)
    row = 0
    for i, episode in enumerate(episodes):
        length = len(episode["reward"])
        for r in range(row, row + length):
            if i in RAGGED:
                observation[r] = observation[r][:2]
            if i in (0, 1):
                null_head[r] = None
        row += length
    assert sum(len(episodes[i]["reward"]) for i in RAGGED) >= 6  # 7 rows: mostly size 2
    index = table.column_names.index("observation")
    ragged = table.set_column(index, "observation", pa.array(observation, pa.list_(pa.float64())))
    nulls = table.set_column(index, "observation", pa.array(null_head, pa.list_(pa.float64())))
    write_table(ragged, tmp_path / "ragged.parquet")
    write_table(nulls, tmp_path / "null_head.parquet")
    return tmp_path, episodes, target, policy


def _evaluate_ragged(ope_in_process, data, policy, *options):
    return ope_in_process(
        [
            "evaluate",
            data,
            *(["--policy", policy] if policy else []),
            "--gamma",
            str(RAGGED_GAMMA),
            "--precision",
            "float64",
            "--format",
            "json",
            *options,
        ]
    )


def _check_ragged(run, episodes, target, left_out, reason):
    assert run.returncode == 0, run
    report = json.loads(run.stdout)
    valid = [e for i, e in enumerate(episodes) if i not in left_out]
    expected = reference_estimates(to_reference_input(valid, target), RAGGED_GAMMA)
    (result,) = report["results"]
    for name in ESTIMATORS:
        assert result["estimates"][name]["value"] == pytest.approx(expected[name], rel=1e-6)
    assert report["dataset"]["episodes"] == len(valid)
    steps = sum(len(episodes[i]["reward"]) for i in left_out)
    assert report["dataset"]["dropped"] == {reason: {"episodes": len(left_out), "steps": steps}}


@pytest.mark.parametrize("read_rows", RAGGED_READ_ROWS)
@pytest.mark.parametrize("logged", [False, True], ids=["checkpoint", "logged_target"])
@pytest.mark.parametrize(
    ("data", "left_out", "reason"),
    [
        ("ragged.parquet", RAGGED, "ragged_observation"),
        ("null_head.parquet", (0, 1), "null_observation"),
    ],
    ids=["ragged", "null_head"],
)
def test_what_drop_leaves_out_does_not_depend_on_read_rows(
    ope_in_process, ragged_case, read_rows, logged, data, left_out, reason
):
    """The data's observation width is decided once (``episode_stream.vector_widths``).
    ragged: the size-2 episodes are dropped and the rest evaluated, however the rows are
    cut (--read-rows 7 made 2 the size: the checkpoint run stopped at a size mismatch, and
    with logged target probabilities 36 size-3 episodes were dropped instead). null_head:
    null observations in the first record batch are dropped as such (a batch of nulls set
    the width to 0, and every later observation was ragged)."""
    tmp_path, episodes, target, policy = ragged_case
    run = _evaluate_ragged(
        ope_in_process,
        tmp_path / data,
        None if logged else policy,
        "--on-invalid",
        "drop",
        "--read-rows",
        str(read_rows),
    )
    _check_ragged(run, episodes, target, left_out, reason)


def test_ragged_error_names_the_same_row_whatever_the_batches(ope_in_process, ragged_case):
    """Without drop, the error names the first observation whose size is not the data's
    (episode 1), not whichever size the first record batch happened to hold most of."""
    tmp_path, _, _, policy = ragged_case
    runs = [
        _evaluate_ragged(ope_in_process, tmp_path / "ragged.parquet", policy, "--read-rows", str(n))
        for n in RAGGED_READ_ROWS
    ]
    for run in runs:
        assert run.returncode == 3, run
        assert "episode 1, step 0" in run.stderr, run
