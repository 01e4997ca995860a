"""A corpus of bad inputs, each run through the ``ope`` command line (SPEC 1, 2, 3), in
this process through ``ope_cli.cli.run`` (``test_cli``'s smoke tests check that a real
``ope`` process gives the same exit code and line).

Every case must end with its exit code (2 usage, 3 data, 4 policy), exactly one stderr
line ``ope: ...`` that names what is wrong and where (file, episode, step, column) and how
many rows share the problem, no traceback, and an empty stdout - also with
``--format json`` (the exit code says it failed; stdout never holds half a document).

``tests/test_cli.py`` already covers about forty bad inputs (``BAD`` there); this corpus
adds the rest of the hardening list and reuses that module's world (one small logged
dataset, checkpoints ``a.npz``/``b.npz``, entry-point modules) and helpers. Inputs are
generated into tmp_path, never committed, so each case shows how its file is broken.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import textwrap
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.feather as feather
import pytest
import test_cli
from datasets import (
    add_target_probs,
    episode_layout_table,
    random_checkpoint,
    random_episodes,
    save_checkpoint,
    step_layout_table,
    write_table,
)
from test_cli import World, _list_column, _numpy, _observations, _replace

ENTRY_MODULE = "ope_corpus_policies"


@dataclasses.dataclass
class Corpus:
    """test_cli's world plus a tabular and a Gaussian dataset with their checkpoints."""

    world: World
    tabular: pa.Table  # 10 states, 3 actions; checkpoint tab.npz
    gaussian: pa.Table  # obs_dim 4, act_dim 2; checkpoint gauss.npz
    logged: pa.Table  # world.table plus target_prob under a.npz

    @property
    def root(self) -> Path:
        return self.world.root


def _build_corpus(root: Path) -> Corpus:
    world = test_cli._build_world(root)
    rng = np.random.default_rng(7)
    tab = random_checkpoint("tabular", rng, n_states=10, n_actions=3)
    save_checkpoint(root / "tab.npz", tab)
    tabular = step_layout_table(
        random_episodes(rng, 20, behavior=tab, median_length=4, max_length=8)
    )
    write_table(tabular, root / "tab.parquet")
    gauss = random_checkpoint("linear_gaussian", rng, obs_dim=4, act_dim=2)
    save_checkpoint(root / "gauss.npz", gauss)
    gaussian = step_layout_table(
        random_episodes(rng, 20, behavior=gauss, median_length=4, max_length=8)
    )
    write_table(gaussian, root / "gauss.parquet")
    logged = step_layout_table(
        add_target_probs(world.episodes, world.ckpt_a), extra_columns=["target_prob"]
    )
    (root / f"{ENTRY_MODULE}.py").write_text(
        textwrap.dedent("""\
        import jax.numpy as jnp

        not_callable = 42


        def vector(observation, action):
            return jnp.zeros(3)


        def raises(observation, action):
            raise ValueError("this policy refuses to run")


        def one_argument(observation):
            return jnp.float64(0.0)


        def returns_string(observation, action):
            return "log-prob"


        class _NegativeProb:
            def prob(self, observation, action):
                return jnp.float64(-0.25) + 0 * action


        negative_prob = _NegativeProb()


        class _DoubleProb:
            n_actions = 4

            def prob(self, observation, action):
                return jnp.float64(0.5) + 0 * action  # they sum to 2 over the 4 actions


        double_prob = _DoubleProb()


        def complex_log_prob(observation, action):
            return jnp.complex64(-1.386) + 0 * action


        complex_log_prob.n_actions = 4
        """)
    )
    (root / "ope_corpus_syntax.py").write_text("def log_prob(observation, action)\n    return 0\n")
    return Corpus(world, tabular, gaussian, logged)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Corpus:
    return _build_corpus(tmp_path_factory.mktemp("corpus"))


# ---------------------------------------------------------------------- input makers


@dataclasses.dataclass(frozen=True)
class Case:
    """A bad input: ``make(corpus, name) -> args`` after ``command``, the exit code, and
    regular expressions (case-insensitive) the stderr line must contain. ``{F}`` is the
    case's neutral input name, ``{E}`` the bad episode id, ``{S}`` step 2."""

    id: str
    code: int
    patterns: tuple[str, ...]
    make: object
    command: tuple[str, ...] = ("evaluate",)
    forbidden: tuple[str, ...] = ()


def _write(c: Corpus, name: str, table: pa.Table, policy: str | None = "a.npz", *extra) -> list:
    path = c.world.write(f"{name}.parquet", table)
    return [path, *(["-p", policy] if policy else []), *extra]


def _table(transform, policy: str | None = "a.npz", *extra):
    """Writes ``transform(corpus)`` and evaluates it with ``policy``."""
    return lambda c, name: _write(c, name, transform(c), policy, *extra)


def _world_table(c: Corpus) -> pa.Table:
    return c.world.table


def _log_table(c: Corpus) -> pa.Table:
    return step_layout_table(c.world.episodes, prob_column="behavior_log_prob")


def _logged_table(c: Corpus) -> pa.Table:
    return c.logged


def _at_bad_row(column: str, value, table_of=_world_table):
    """``column`` set to ``value`` at the bad episode's step 2 of ``table_of(corpus)``."""

    def transform(c: Corpus) -> pa.Table:
        table = table_of(c)
        values = _numpy(table, column)
        values = values.astype(np.result_type(values.dtype, np.asarray(value).dtype))
        values[c.world.bad_row] = value
        return _replace(table, column, values)

    return transform


def _null_at_bad_row(column: str):
    def transform(c: Corpus) -> pa.Table:
        table = c.world.table
        values = table.column(column).to_pylist()
        values[c.world.bad_row] = None
        return _replace(table, column, pa.array(values, table.schema.field(column).type))

    return transform


def _obs_at_bad_row(index: int, value):
    def transform(c: Corpus) -> pa.Table:
        obs = _observations(c.world)
        obs[c.world.bad_row, index] = value
        return _replace(c.world.table, "observation", _list_column(obs))

    return transform


def _bad_row_moved_to_the_end(c: Corpus) -> pa.Table:
    """The bad episode's step 2 after every other row: its id appears in two places."""
    rows = np.arange(c.world.table.num_rows)
    order = np.concatenate([rows[rows != c.world.bad_row], [c.world.bad_row]])
    return c.world.table.take(order)


def _null_inside_obs(c: Corpus) -> pa.Table:
    rows = _observations(c.world).tolist()
    rows[c.world.bad_row][1] = None
    return _replace(c.world.table, "observation", pa.array(rows, pa.list_(pa.float64())))


def _drop(*columns: str):
    return lambda c: c.world.table.drop_columns(list(columns))


def _retype(column: str, array_of):
    return lambda c: _replace(c.world.table, column, array_of(c.world.table.column(column)))


def _nested_obs(c: Corpus) -> pa.Table:
    rows = [[[x] for x in row] for row in _observations(c.world).tolist()]
    return _replace(c.world.table, "observation", pa.array(rows))


def _episodes(c: Corpus) -> pa.Table:
    return episode_layout_table(c.world.episodes)


def _episode_rewards_nested(c: Corpus) -> pa.Table:
    table = _episodes(c)
    rewards = [[[r] for r in ep] for ep in table.column("rewards").to_pylist()]
    return _replace(table, "rewards", pa.array(rewards))


def _episode_obs_too_deep(c: Corpus) -> pa.Table:
    table = _episodes(c)
    obs = [[[[x] for x in step] for step in ep] for ep in table.column("observations").to_pylist()]
    return _replace(table, "observations", pa.array(obs))


def _episode_list_edit(column: str, edit):
    def transform(c: Corpus) -> pa.Table:
        table = _episodes(c)
        values = table.column(column).to_pylist()
        values[c.world.bad_episode] = edit(values[c.world.bad_episode])
        return _replace(table, column, pa.array(values, table.schema.field(column).type))

    return transform


def _empty_episode(c: Corpus) -> pa.Table:
    table = _episodes(c)
    for column in ("observations", "actions", "rewards", "action_probs"):
        values = table.column(column).to_pylist()
        values[c.world.bad_episode] = []
        table = _replace(table, column, pa.array(values, table.schema.field(column).type))
    return table


def _episode_steps(edit):
    def transform(c: Corpus) -> pa.Table:
        table = _episodes(c)
        steps = [list(range(len(r))) for r in table.column("rewards").to_pylist()]
        steps[c.world.bad_episode] = edit(steps[c.world.bad_episode])
        return table.append_column("steps", pa.array(steps, pa.list_(pa.int64())))

    return transform


def _set_step(value):
    def transform(c: Corpus) -> pa.Table:
        steps = _numpy(c.world.table, "step")
        steps[c.world.bad_row] = value
        return _replace(c.world.table, "step", steps)

    return transform


def _obs_dim_changes_between_batches(c: Corpus) -> pa.Table:
    """Rows of the second half have 5-element observations: each record batch (of 64 rows)
    is consistent on its own, the dataset is not."""
    obs = _observations(c.world)
    half = (c.world.table.num_rows // 2 // 64) * 64
    rows = [row[:4] if i < half else [*row[:4], 0.0] for i, row in enumerate(obs.tolist())]
    return _replace(c.world.table, "observation", pa.array(rows, pa.list_(pa.float64())))


def _scalar_obs(c: Corpus) -> pa.Table:
    return _replace(c.world.table, "observation", _observations(c.world)[:, 0].copy())


def _support_violation(c: Corpus) -> pa.Table:
    table = c.logged
    behavior, target = _numpy(table, "behavior_prob"), _numpy(table, "target_prob")
    behavior[c.world.bad_row] = 0.0
    target[c.world.bad_row] = 0.25
    return _replace(_replace(table, "behavior_prob", behavior), "target_prob", target)


def _gaussian_at(column: str, value):
    def transform(c: Corpus) -> pa.Table:
        table = c.gaussian
        if column == "action":
            actions = np.asarray(table.column("action").to_pylist(), np.float64)
            actions[3, 0] = value
            return _replace(table, "action", _list_column(actions))
        values = _numpy(table, column)
        values[3] = value
        return _replace(table, column, values)

    return transform


def _gaussian_action_size(c: Corpus) -> pa.Table:
    actions = np.asarray(c.gaussian.column("action").to_pylist(), np.float64)
    return _replace(c.gaussian, "action", _list_column(np.c_[actions, actions[:, :1]]))


def _tabular_state(value):
    def transform(c: Corpus) -> pa.Table:
        states = _numpy(c.tabular, "observation")
        states[3] = value
        return _replace(c.tabular, "observation", states)

    return transform


def _raw_file(name_suffix: str, content):
    def make(c: Corpus, name: str) -> list:
        data = content(c) if callable(content) else content
        return [c.world.text(f"{name}{name_suffix}", data), "-p", "a.npz"]

    return make


def _corrupt_page(c: Corpus) -> bytes:
    """Footer and magic intact, data pages overwritten: only reading the values fails."""
    data = bytearray((c.root / "data.parquet").read_bytes())
    for offset in range(64, len(data) // 2, 7):
        data[offset] = 0xFF
    return bytes(data)


def _truncated_feather(c: Corpus) -> bytes:
    path = c.root / "bad" / "whole.feather"
    path.parent.mkdir(exist_ok=True)
    feather.write_feather(c.world.table, path)
    data = path.read_bytes()
    return data[: len(data) // 2]


def _directory(files):
    """A directory of the given {name: table or bytes}."""

    def make(c: Corpus, name: str) -> list:
        directory = c.root / "bad" / name
        directory.mkdir(parents=True)
        for file, content in files(c).items():
            if isinstance(content, bytes):
                (directory / file).write_bytes(content)
            else:
                write_table(content, directory / file)
        return [f"bad/{name}", "-p", "a.npz"]

    return make


def _checkpoint(mutate, data: str = "data.parquet"):
    def make(c: Corpus, name: str) -> list:
        (c.root / "bad").mkdir(exist_ok=True)
        ckpt = mutate(dict(c.world.ckpt_a))
        save_checkpoint(c.root / "bad" / f"{name}.npz", ckpt)
        return [data, "-p", f"bad/{name}.npz"]

    return make


def _mlp(**changes):
    def mutate(_: dict) -> dict:
        rng = np.random.default_rng(0)
        ckpt = random_checkpoint("mlp_softmax", rng, obs_dim=4, n_actions=4, hidden=(8,))
        return {**ckpt, **changes}

    return mutate


def _zip_with_garbage(c: Corpus, name: str) -> list:
    import zipfile

    (c.root / "bad").mkdir(exist_ok=True)
    with zipfile.ZipFile(c.root / "bad" / f"{name}.npz", "w") as archive:
        archive.writestr("kind.npy", b"\x93NUMPY garbage that is not an array header")
    return ["data.parquet", "-p", f"bad/{name}.npz"]


def _args(*args: str):
    return lambda c, name: list(args)


def _generate_into(prepare):
    """``ope generate bandit OUT`` where ``prepare(corpus, name) -> OUT`` breaks OUT."""

    def make(c: Corpus, name: str) -> list:
        (c.root / "bad").mkdir(exist_ok=True)
        return ["bandit", prepare(c, name), "--episodes", "20"]

    return make


def _out_under_a_file(c: Corpus, name: str) -> str:
    (c.root / "bad" / f"{name}.txt").write_text("a file, not a directory\n")
    return f"bad/{name}.txt/out"


def _out_policies_is_a_file(c: Corpus, name: str) -> str:
    out = c.root / "bad" / name
    out.mkdir()
    (out / "policies").write_text("in the way\n")
    return f"bad/{name}"


def _out_logs_is_a_directory(c: Corpus, name: str) -> str:
    out = c.root / "bad" / name
    (out / "logs.parquet" / "keep").mkdir(parents=True)
    return f"bad/{name}"


def _out_read_only(c: Corpus, name: str) -> str:
    out = c.root / "bad" / name
    (out / "policies").mkdir(parents=True)
    (out / "logs.parquet").write_bytes(b"old")
    for path in (out / "policies", out):
        path.chmod(0o555)
    return f"bad/{name}"


LOC = (r"\bepisode {E}\b", r"\bstep {S}\b")
FILE = r"{F}\.parquet"
COUNT = r"\(\d+ (row|episode|step)"  # how many share the problem
INSPECT = r"every problem: ope inspect \S+"  # where to see them all
DROPPABLE = (INSPECT, r"to leave out the invalid episodes and report them: --on-invalid drop")
GEN = ("generate",)

CASES = [
    # --- missing columns (test_cli covers reward, action, behavior_prob)
    Case("missing_episode_id", 3, ("episode", "--episode-col"), _table(_drop("episode_id"))),
    Case("missing_observation", 3, ("observation", "--obs-col"), _table(_drop("observation"))),
    Case(
        "episode_layout_missing_actions",
        3,
        ("action",),
        _table(lambda c: _episodes(c).drop_columns(["actions"])),
    ),
    Case(
        "column_option_names_absent_column",
        3,
        ("'nope'", "--step-col"),
        lambda c, name: _write(c, name, c.world.table, "a.npz", "--step-col", "nope"),
    ),
    # --- wrong types
    Case(
        "string_actions",
        3,
        ("'action'", "string"),
        _table(_retype("action", lambda a: pc.cast(a, pa.string()))),
    ),
    Case(
        "string_observations",
        3,
        ("'observation'",),
        _table(
            lambda c: _replace(
                c.world.table,
                "observation",
                pa.array([str(r) for r in _observations(c.world).tolist()]),
            )
        ),
    ),
    Case(
        "bool_rewards",
        3,
        ("'reward'", "bool"),
        _table(_retype("reward", lambda a: pc.greater(a, 0))),
    ),
    Case(
        "string_behavior_prob",
        3,
        ("'behavior_prob'", "string"),
        _table(_retype("behavior_prob", lambda a: pc.cast(a, pa.string()))),
    ),
    Case(
        "float_step_column",
        3,
        ("'step'", "double", "integer"),
        _table(_retype("step", lambda a: pc.cast(a, pa.float64()))),
    ),
    Case(
        "float_episode_id",
        3,
        ("'episode_id'", "double", "integers or strings"),
        _table(_retype("episode_id", lambda a: pc.cast(a, pa.float64()))),
    ),
    Case("observation_list_of_lists", 3, ("'observation'", "list<"), _table(_nested_obs)),
    Case(
        "reward_list_in_step_rows",
        3,
        ("'reward'|list column", "episode layout"),
        _table(_retype("reward", lambda a: pa.array([[x] for x in a.to_pylist()]))),
    ),
    Case(
        "episode_rewards_nested_too_deep",
        3,
        ("'rewards'", "numbers"),
        _table(_episode_rewards_nested),
    ),
    Case(
        "episode_observations_nested_too_deep",
        3,
        ("'observations'",),
        _table(_episode_obs_too_deep),
    ),
    # --- NaN, inf and null values (test_cli covers NaN/inf/null reward)
    Case(
        "minus_inf_reward",
        3,
        (FILE, *LOC, "reward", "inf", COUNT),
        _table(_at_bad_row("reward", -np.inf)),
    ),
    Case(
        "nan_observation",
        3,
        (FILE, *LOC, "observation", "nan", COUNT),
        _table(_obs_at_bad_row(1, np.nan)),
    ),
    Case(
        "inf_observation",
        3,
        (FILE, *LOC, "observation", "inf", COUNT),
        _table(_obs_at_bad_row(3, np.inf)),
    ),
    Case(
        "null_observation",
        3,
        (FILE, *LOC, "'observation'", "null", COUNT, *DROPPABLE),
        _table(_null_at_bad_row("observation")),
    ),
    Case(
        "null_inside_observation",
        3,
        (FILE, *LOC, "'observation'", "null", COUNT, *DROPPABLE),
        _table(_null_inside_obs),
    ),
    Case(
        "nan_behavior_prob",
        3,
        (FILE, *LOC, "behavior prob", "nan", COUNT),
        _table(_at_bad_row("behavior_prob", np.nan)),
    ),
    Case(
        "inf_behavior_prob",
        3,
        (FILE, *LOC, "behavior prob", "inf", COUNT),
        _table(_at_bad_row("behavior_prob", np.inf)),
    ),
    Case(
        "null_behavior_prob",
        3,
        (FILE, *LOC, "'behavior_prob'", "null", COUNT, *DROPPABLE),
        _table(_null_at_bad_row("behavior_prob")),
    ),
    Case(
        "null_action",
        3,
        (FILE, *LOC, "'action'", "null", COUNT, *DROPPABLE),
        _table(_null_at_bad_row("action")),
    ),
    Case(
        "null_step",
        3,
        (FILE, r"\bepisode {E}\b", "'step'", "null", COUNT, *DROPPABLE),
        _table(_null_at_bad_row("step")),
    ),
    Case(
        "null_episode_id",
        3,
        (FILE, "'episode_id'", "null", COUNT, INSPECT),
        _table(_null_at_bad_row("episode_id")),
        forbidden=("on-invalid",),  # an episode without an id cannot be dropped
    ),
    Case(
        "episode_id_reappears",
        3,
        (FILE, r"\bepisode {E}\b", "more than one place", "contiguous", INSPECT),
        _table(_bad_row_moved_to_the_end),
        forbidden=("on-invalid",),  # never dropped: the rows of one episode are unclear
    ),
    Case(
        "nan_behavior_log_prob",
        3,
        (FILE, *LOC, "behavior log-prob", "nan", COUNT),
        _table(_at_bad_row("behavior_log_prob", np.nan, _log_table)),
    ),
    Case(
        "positive_behavior_log_prob",
        3,
        (FILE, *LOC, "behavior log-prob", "> ?0", COUNT),
        _table(_at_bad_row("behavior_log_prob", 0.5, _log_table)),
    ),
    Case(
        "minus_inf_behavior_log_prob",
        3,
        (FILE, *LOC, "behavior log-prob", "support", COUNT),
        _table(_at_bad_row("behavior_log_prob", -np.inf, _log_table)),
    ),
    Case(
        "nan_target_prob",
        3,
        (FILE, *LOC, "target prob", "nan", COUNT),
        _table(_at_bad_row("target_prob", np.nan, _logged_table), None),
    ),
    Case(
        "target_prob_above_one",
        3,
        (FILE, *LOC, "target prob", "> ?1", COUNT),
        _table(_at_bad_row("target_prob", 1.5, _logged_table), None),
    ),
    Case(
        "negative_target_prob",
        3,
        (FILE, *LOC, "target prob", "negative", COUNT),
        _table(_at_bad_row("target_prob", -0.5, _logged_table), None),
    ),
    Case(
        "nan_action_continuous",
        3,
        (FILE, r"\bstep 3\b|episode", "action", "nan", COUNT),
        _table(_gaussian_at("action", np.nan), "gauss.npz"),
    ),
    # --- support: a logged target probability > 0 where the behavior probability is 0
    Case(
        "support_violation_logged_target",
        3,
        (FILE, *LOC, "support violation", "target", COUNT),
        _table(_support_violation, None),
    ),
    Case(
        "zero_behavior_prob_names_support",
        3,
        (FILE, *LOC, "behavior prob", "support", COUNT),
        _table(_at_bad_row("behavior_prob", 0.0)),
    ),
    # --- actions and states against the policy
    Case(
        "huge_action",
        3,
        (FILE, *LOC, "action", "outside", COUNT),
        _table(_at_bad_row("action", 2**40)),
    ),
    Case(
        "state_out_of_range",
        3,
        (FILE, "state", r"\b10 states\b", COUNT),
        _table(_tabular_state(10), "tab.npz"),
    ),
    Case(
        "negative_state",
        3,
        (FILE, "state", "negative", COUNT),
        _table(_tabular_state(-1), "tab.npz"),
    ),
    Case(
        "float_states_for_tabular_policy",
        3,
        ("tabular", "integer"),
        _table(lambda c: c.world.table, "tab.npz"),
    ),
    Case(
        "integer_actions_for_gaussian_policy",
        3,
        ("action", "integers", "continuous"),
        _table(lambda c: c.world.table, "gauss.npz"),
    ),
    Case(
        "action_vector_size",
        3,
        (FILE, "action", r"\b3\b", r"\b2\b"),
        _table(_gaussian_action_size, "gauss.npz"),
    ),
    # --- observation sizes
    Case(
        "scalar_observation_for_vector_policy",
        3,
        ("observation", r"\b1\b", r"\b4\b"),
        _table(_scalar_obs),
    ),
    Case(
        "observation_size_changes_between_batches",
        3,
        (FILE, "observation", r"\b5\b", r"\b4\b"),
        _table(
            _obs_dim_changes_between_batches,
            f"{test_cli.POLICY_MODULE}:log_prob",
            "--read-rows",
            "64",
        ),
    ),
    # --- steps and episodes
    Case("negative_step", 3, (FILE, r"\bepisode {E}\b", "step"), _table(_set_step(-1))),
    Case("huge_step", 3, (FILE, r"\bepisode {E}\b", "missing"), _table(_set_step(2**40))),
    Case(
        "episode_layout_duplicate_step",
        3,
        (FILE, r"\bepisode {E}\b", "more than once"),
        _table(_episode_steps(lambda s: [0, 0, *s[2:]])),
    ),
    Case(
        "episode_layout_empty_episode",
        3,
        (FILE, r"\bepisode {E}\b", "no steps", *DROPPABLE),
        _table(_empty_episode),
    ),
    Case(
        "episode_layout_lists_disagree",
        3,
        (FILE, r"\bepisode {E}\b", "'actions' has 1 entries", *DROPPABLE),
        _table(_episode_list_edit("actions", lambda a: a[:1])),
    ),
    Case(
        "episode_layout_null_list",
        3,
        (FILE, r"\bepisode {E}\b", "'actions'", "null"),
        _table(_episode_list_edit("actions", lambda a: None)),
    ),
    # --- files
    Case("zero_byte_file", 3, (FILE, "empty|0 bytes"), _raw_file(".parquet", b"")),
    Case(
        "corrupt_data_pages",
        3,
        (FILE, "cannot read|corrupt|invalid"),
        _raw_file(".parquet", _corrupt_page),
    ),
    Case(
        "truncated_feather",
        3,
        (r"{F}\.feather", "cannot|corrupt|invalid|truncated"),
        _raw_file(".feather", _truncated_feather),
    ),
    Case(
        "directory_of_zero_row_files",
        3,
        ("no (rows|episodes)",),
        _directory(
            lambda c: {
                "part-0.parquet": c.world.table.slice(0, 0),
                "part-1.parquet": c.world.table.slice(0, 0),
            }
        ),
    ),
    Case(
        "directory_with_a_text_file",
        3,
        (r"{F}/notes\.parquet", "not a parquet"),
        _directory(
            lambda c: {"part-0.parquet": c.world.table, "notes.parquet": b"just some notes\n"}
        ),
    ),
    Case(
        "directory_files_disagree_on_types",
        3,
        (r"{F}/part-1\.parquet", "'reward'", "string", "double"),
        _directory(
            lambda c: {
                "part-0.parquet": step_layout_table(c.world.episodes[:10]),
                "part-1.parquet": _replace(
                    step_layout_table(c.world.episodes[10:20]),
                    "reward",
                    pa.array(
                        [
                            f"{x}"
                            for x in _numpy(step_layout_table(c.world.episodes[10:20]), "reward")
                        ]
                    ),
                ),
            }
        ),
    ),
    Case(
        "glob_matches_nothing",
        3,
        ("no files match",),
        _args("bad/nothing-here-*.parquet", "-p", "a.npz"),
    ),
    # --- checkpoints (test_cli covers a missing array, a bias shape, an unknown kind, pickle)
    Case(
        "checkpoint_without_kind",
        4,
        (r"{F}\.npz", "'kind'"),
        _checkpoint(lambda c: {k: v for k, v in c.items() if k != "kind"}),
    ),
    Case(
        "checkpoint_weight_1d",
        4,
        (r"{F}\.npz", "'weight'", "shape"),
        _checkpoint(lambda c: {**c, "weight": c["weight"].ravel()}),
    ),
    Case(
        "checkpoint_weight_3d",
        4,
        (r"{F}\.npz", "'weight'", "shape"),
        _checkpoint(lambda c: {**c, "weight": c["weight"][None]}),
    ),
    Case(
        "checkpoint_tabular_logits_1d",
        4,
        (r"{F}\.npz", "'logits'", "shape"),
        _checkpoint(lambda c: {"kind": "tabular", "logits": np.zeros(5)}, "tab.parquet"),
    ),
    Case(
        "checkpoint_mlp_layers_disagree",
        4,
        (r"{F}\.npz", "weight_1"),
        _checkpoint(_mlp(weight_1=np.zeros((5, 4)))),
    ),
    Case(
        "checkpoint_mlp_unknown_activation",
        4,
        (r"{F}\.npz", "activation", "gelu"),
        _checkpoint(_mlp(activation="gelu")),
    ),
    Case(
        "checkpoint_zero_temperature",
        4,
        (r"{F}\.npz", "temperature"),
        _checkpoint(lambda c: {**c, "temperature": np.float64(0.0)}),
    ),
    Case(
        "checkpoint_nan_weight",
        4,
        (r"{F}\.npz", "'weight'", "nan"),
        _checkpoint(lambda c: {**c, "weight": np.full_like(c["weight"], np.nan)}),
    ),
    Case(  # no actions: it was "action is outside policy's 0 actions (0..-1)", exit 3
        "checkpoint_without_actions",
        4,
        (r"{F}\.npz", "'weight'", "no entries"),
        _checkpoint(lambda c: {**c, "weight": c["weight"][:, :0], "bias": c["bias"][:0]}),
    ),
    Case(
        "checkpoint_string_weight",
        4,
        (r"{F}\.npz", "'weight'", "dtype"),
        _checkpoint(lambda c: {**c, "weight": np.array([["a", "b"]])}),
    ),
    Case(
        "checkpoint_numeric_kind",
        4,
        (r"{F}\.npz", "kind"),
        _checkpoint(lambda c: {**c, "kind": np.float64(3.0)}),
    ),
    Case(
        "checkpoint_gaussian_log_std_length",
        4,
        (r"{F}\.npz", "log_std"),
        _checkpoint(
            lambda c: {
                "kind": "linear_gaussian",
                "weight": np.zeros((4, 2)),
                "bias": np.zeros(2),
                "log_std": np.zeros(3),
            },
            "gauss.parquet",
        ),
    ),
    Case(
        "checkpoint_empty_file",
        4,
        (r"{F}\.npz", "not a|zip"),
        lambda c, name: ["data.parquet", "-p", c.world.text(f"{name}.npz", b"")],
    ),
    Case("checkpoint_zip_of_garbage", 4, (r"{F}\.npz", "checkpoint"), _zip_with_garbage),
    Case(
        "checkpoint_is_a_directory",
        4,
        (r"{F}\.npz",),
        lambda c, name: (
            (c.root / "bad" / f"{name}.npz").mkdir(parents=True),
            ["data.parquet", "-p", f"bad/{name}.npz"],
        )[1],
    ),
    # --- entry points (test_cli covers import failures and untraceable Python)
    Case(
        "entry_point_not_callable",
        4,
        (f"{ENTRY_MODULE}:not_callable", "callable"),
        _args("data.parquet", "-p", f"{ENTRY_MODULE}:not_callable"),
    ),
    Case(
        "entry_point_returns_a_vector",
        4,
        (f"{ENTRY_MODULE}:vector", "scalar", r"\(3,\)"),
        _args("data.parquet", "-p", f"{ENTRY_MODULE}:vector"),
    ),
    Case(
        "entry_point_raises",
        4,
        (f"{ENTRY_MODULE}:raises", "failed while traced", "ValueError", "refuses"),
        _args("data.parquet", "-p", f"{ENTRY_MODULE}:raises"),
    ),
    Case(  # an object's prob: its error speaks of probabilities, not log_prob's NaN
        "entry_point_prob_below_zero",
        4,
        (f"{ENTRY_MODULE}:negative_prob", "probability below 0 or NaN", "prob method"),
        _args("data.parquet", "-p", f"{ENTRY_MODULE}:negative_prob"),
    ),
    Case(
        "entry_point_prob_not_normalised",
        4,
        (f"{ENTRY_MODULE}:double_prob", "sum to 2", "prob must return normalised probabilities"),
        _args("data.parquet", "-p", f"{ENTRY_MODULE}:double_prob"),
    ),
    Case(  # one line: NumPy's ComplexWarning came first
        "entry_point_returns_complex",
        4,
        (f"{ENTRY_MODULE}:complex_log_prob", "complex64"),
        _args("data.parquet", "-p", f"{ENTRY_MODULE}:complex_log_prob"),
    ),
    Case(
        "entry_point_wrong_signature",
        4,
        (f"{ENTRY_MODULE}:one_argument", "TypeError"),
        _args("data.parquet", "-p", f"{ENTRY_MODULE}:one_argument"),
    ),
    Case(
        "entry_point_returns_a_string",
        4,
        (f"{ENTRY_MODULE}:returns_string",),
        _args("data.parquet", "-p", f"{ENTRY_MODULE}:returns_string"),
    ),
    Case(
        "entry_point_syntax_error",
        4,
        ("ope_corpus_syntax", "SyntaxError"),
        _args("data.parquet", "-p", "ope_corpus_syntax:log_prob"),
    ),
    Case(
        "entry_point_malformed_spec",
        4,
        ("entry point|package.module:name",),
        _args("data.parquet", "-p", ":log_prob"),
    ),
    # --- usage
    Case(
        "on_invalid_unknown",
        2,
        ("on-invalid", "skip"),
        _args("data.parquet", "-p", "a.npz", "--on-invalid", "skip"),
    ),
    Case(
        "read_rows_zero",
        2,
        ("batching|read-rows",),
        _args("data.parquet", "-p", "a.npz", "--read-rows", "0"),
    ),
    Case(
        "confidence_above_one",
        2,
        ("confidence", r"1\.5"),
        _args("data.parquet", "-p", "a.npz", "--confidence", "1.5"),
    ),
    Case(
        "precision_float16",
        2,
        ("precision", "float16"),
        _args("data.parquet", "-p", "a.npz", "--precision", "float16"),
    ),
    Case("no_data_argument", 2, ("DATA|missing argument",), _args("-p", "a.npz")),
    Case("devices_zero", 2, ("devices",), _args("data.parquet", "-p", "a.npz", "--devices", "0")),
    # --- ope generate into an output path that cannot be written
    Case(
        "generate_out_under_a_file",
        2,
        (r"{F}\.txt", "not a directory|cannot write"),
        _generate_into(_out_under_a_file),
        GEN,
    ),
    Case(
        "generate_policies_path_is_a_file",
        2,
        ("policies", "cannot write|exists|not a directory"),
        _generate_into(_out_policies_is_a_file),
        GEN,
    ),
    Case(
        "generate_logs_path_is_a_directory",
        2,
        ("logs.parquet", "cannot write|directory"),
        _generate_into(_out_logs_is_a_directory),
        GEN,
    ),
]

if os.geteuid() != 0:  # root writes into read-only directories, so the case cannot fail
    CASES.append(
        Case(
            "generate_read_only_out",
            2,
            ("{F}", "cannot write|permission"),
            _generate_into(_out_read_only),
            GEN,
        )
    )


def _input_name(case: Case) -> str:
    return f"case{CASES.index(case):03d}"


# Cases rerun with --format json: the same exit code and line, and stdout still empty.
JSON_CASES = (
    "missing_episode_id",
    "nan_observation",
    "support_violation_logged_target",
    "corrupt_data_pages",
    "checkpoint_weight_1d",
    "entry_point_raises",
    "observation_size_changes_between_batches",
)


@pytest.fixture(scope="module")
def runs(corpus, ope_many_in_process) -> dict:
    """Every case through ``ope_cli.cli.run`` in this process (a real ``ope`` process
    spends most of its second importing; ``test_cli``'s smoke tests cross that boundary)."""
    calls = {}
    for case in CASES:
        args = [*case.command, *case.make(corpus, _input_name(case))]
        calls[case.id] = {"args": args, "cwd": corpus.root}
        if case.id in JSON_CASES:
            calls[f"{case.id}/json"] = {"args": [*args, "--format", "json"], "cwd": corpus.root}
    return ope_many_in_process(calls)


def _check_line(run, case: Case, corpus: Corpus) -> str:
    assert run.returncode == case.code, run
    assert run.stdout == "", run
    assert "Traceback" not in run.stderr, run
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run
    (line,) = lines
    assert line.startswith("ope: "), run
    assert "internal error" not in line, run
    values = {"F": _input_name(case), "E": corpus.world.bad_episode, "S": 2}
    for pattern in case.patterns:
        pattern = pattern.format(**values) if re.search(r"\{[FES]\}", pattern) else pattern
        assert re.search(pattern, line, re.IGNORECASE), f"{pattern!r} not in: {line}"
    for pattern in case.forbidden:
        assert not re.search(pattern, line, re.IGNORECASE), f"{pattern!r} misstates: {line}"
    return line


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_is_one_clear_error_line(corpus, runs, case):
    _check_line(runs[case.id], case, corpus)


@pytest.mark.parametrize("name", JSON_CASES)
def test_json_format_errors_leave_stdout_empty(corpus, runs, name):
    case = next(c for c in CASES if c.id == name)
    line = _check_line(runs[f"{name}/json"], case, corpus)
    assert line == runs[name].stderr.strip()


def test_corpus_ids_are_unique_and_cover_every_exit_code():
    ids = [case.id for case in CASES]
    assert len(ids) == len(set(ids))
    assert {case.code for case in CASES} == {2, 3, 4}
    assert not set(ids) & {case.id for case in test_cli.BAD}, "duplicates a test_cli case"


def test_generate_failure_leaves_no_json_on_stdout(runs):
    """ope generate prints truth.json's document only after writing everything."""
    for name in ("generate_out_under_a_file", "generate_logs_path_is_a_directory"):
        assert runs[name].stdout == ""
        with pytest.raises(json.JSONDecodeError):
            json.loads(runs[name].stdout)
