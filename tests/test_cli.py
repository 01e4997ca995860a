"""The ``ope`` command line on Parquet/Arrow files in tmp_path.

The cases run in this process through ``ope_cli.cli.run(argv)`` with stdout and stderr
captured (an ``ope`` process costs about a second of imports and compiles); each group is
declared up front and run by one module-scoped fixture (``good``, ``bad``), and the tests
then check one finished run each. The data layouts (``variants``), whose subject is the
data rather than the command line, run through the Python API. A few smoke tests (``SMOKE``) run the
real ``ope`` entry point in subprocesses and check that exit codes, the one stderr line
and an empty stdout are the same across the process boundary.

Checked against SPEC.md: section 1 (stdout carries only the result, exit codes, one
stderr line per user error, no traceback), section 2 (layouts, aliases, column
options, bad values), section 3 (checkpoints, entry points, logged targets) and
section 5 (the JSON document). Numbers are compared with the float64 NumPy reference
in ``tests/reference.py`` to a relative 1e-6.

Choices of the tool that the tests pin down (the spec leaves them open):
- without ``--format``, output to a pipe (not a terminal) is JSON;
- no ``--policy`` and no target-probability column is invalid data (exit 3);
- actions outside the checkpoint's action space, observations of the wrong size and
  float actions for a discrete policy are data errors (exit 3), not policy errors.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import math
import os
import platform
import re
import signal
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path
from typing import Annotated

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import typer
from datasets import (
    add_target_probs,
    episode_layout_table,
    perturb_checkpoint,
    random_checkpoint,
    random_episodes,
    save_checkpoint,
    step_layout_table,
    to_reference_input,
    write_episode_layout,
    write_step_layout,
    write_table,
)
from reference import DIAGNOSTICS, ESTIMATORS, reference_estimates, reference_stderr

import ope_cli

GAMMA = 0.9
N_EPISODES = 300
ESTIMATE_FIELDS = ("value", "stderr", "ci_low", "ci_high")
REL = 1e-6
POLICY_MODULE = "ope_cli_test_policies"  # written into the work directory, imported by ope
EVAL = ("evaluate",)
LONG_POLICY = "checkpoints/run-2024-06-13/step_000100000.npz"
COMMON = ("--gamma", str(GAMMA))


# ----------------------------------------------------------------------------- data


@dataclasses.dataclass
class World:
    """One small logged dataset, two checkpoints, their reference values, and a work dir.

    Every ``ope`` run uses ``root`` as its working directory and relative paths.
    ``bad_episode`` is an episode id (> 0, at least 3 steps) where bad values are planted;
    ``bad_row`` is its step-2 row and ``last_row`` its last row in ``table``.
    """

    root: Path
    episodes: list
    table: pa.Table
    ckpt_a: dict
    ckpt_b: dict
    ref_a: dict
    ref_b: dict
    stderr_a: dict
    stderr_b: dict
    bad_episode: int
    bad_row: int
    last_row: int

    @property
    def steps(self) -> int:
        return int(sum(len(ep["reward"]) for ep in self.episodes))

    @property
    def max_length(self) -> int:
        return int(max(len(ep["reward"]) for ep in self.episodes))

    def write(self, name: str, table: pa.Table, **options) -> str:
        """Writes ``table`` as bad/NAME and returns the path relative to ``root``."""
        (self.root / "bad").mkdir(exist_ok=True)
        write_table(table, self.root / "bad" / name, **options)
        return f"bad/{name}"

    def text(self, name: str, content: str | bytes) -> str:
        (self.root / "bad").mkdir(exist_ok=True)
        path = self.root / "bad" / name
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)
        return f"bad/{name}"


def _build_world(root: Path) -> World:
    rng = np.random.default_rng(20240613)
    behavior = random_checkpoint("linear_softmax", rng, obs_dim=4, n_actions=4)
    # Episodes of 1..8 steps fit one length bucket of the default batching: one compile
    # per kernel keeps each ope process short (one variant below uses several buckets).
    episodes = random_episodes(rng, N_EPISODES, behavior=behavior, median_length=4, max_length=8)
    ckpt_a = perturb_checkpoint(behavior, rng, 0.3)
    ckpt_b = perturb_checkpoint(behavior, rng, 0.6)
    save_checkpoint(root / "a.npz", ckpt_a)
    save_checkpoint(root / "b.npz", ckpt_b)
    table = step_layout_table(episodes)
    write_table(table, root / "data.parquet")

    lengths = np.array([len(ep["reward"]) for ep in episodes])
    bad_episode = int(np.flatnonzero((lengths >= 3) & (np.arange(len(lengths)) > 0))[0])
    start = int(lengths[:bad_episode].sum())
    ref_input_a = to_reference_input(episodes, ckpt_a)
    ref_input_b = to_reference_input(episodes, ckpt_b)
    _write_policy_modules(root, root / "a.npz")
    return World(
        root=root,
        episodes=episodes,
        table=table,
        ckpt_a=ckpt_a,
        ckpt_b=ckpt_b,
        ref_a=reference_estimates(ref_input_a, GAMMA),
        ref_b=reference_estimates(ref_input_b, GAMMA),
        stderr_a=reference_stderr(ref_input_a, GAMMA),
        stderr_b=reference_stderr(ref_input_b, GAMMA),
        bad_episode=bad_episode,
        bad_row=start + 2,
        last_row=start + int(lengths[bad_episode]) - 1,
    )


def _write_policy_modules(root: Path, checkpoint: Path) -> None:
    """Entry-point modules: a per-step JAX function and an object with ``prob`` equal to the
    linear_softmax checkpoint, a module that fails to import, two untraceable functions."""
    (root / f"{POLICY_MODULE}.py").write_text(
        textwrap.dedent(f"""\
        import jax
        import jax.numpy as jnp
        import numpy as np

        # NumPy float64 constants: traced after ope enables x64, so the math is float64.
        with np.load({str(checkpoint)!r}) as _ckpt:
            _WEIGHT = np.asarray(_ckpt["weight"], np.float64)
            _BIAS = np.asarray(_ckpt["bias"], np.float64)


        def log_prob(observation, action):
            return jax.nn.log_softmax(observation @ _WEIGHT + _BIAS)[action]


        class ProbPolicy:
            def prob(self, observation, action):
                return jax.nn.softmax(observation @ _WEIGHT + _BIAS)[action]


        prob_policy = ProbPolicy()
        """)
    )
    (root / "ope_cli_test_broken.py").write_text(
        "import ope_cli_test_no_such_dependency  # noqa: F401\n\n"
        "def log_prob(observation, action):\n    return 0.0\n"
    )
    (root / "ope_cli_test_untraceable.py").write_text(
        textwrap.dedent("""\
        import jax.numpy as jnp


        def with_float(observation, action):
            return jnp.log(float(observation[0]) ** 2 + 0.5) - 2.0


        def with_if(observation, action):
            if observation[0] > 0:
                return jnp.log(0.5)
            return jnp.log(0.25)
        """)
    )


@pytest.fixture(scope="module")
def world(tmp_path_factory) -> World:
    return _build_world(tmp_path_factory.mktemp("cli"))


def _list_column(matrix: np.ndarray) -> pa.Array:
    """[N, d] -> list<double> column."""
    flat = pa.array(np.ascontiguousarray(matrix, np.float64).ravel())
    offsets = pa.array(np.arange(0, matrix.size + 1, matrix.shape[1], dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, flat)


def _replace(table: pa.Table, name: str, values) -> pa.Table:
    array = values if isinstance(values, (pa.Array, pa.ChunkedArray)) else pa.array(values)
    return table.set_column(table.schema.get_field_index(name), name, array)


def _numpy(table: pa.Table, name: str) -> np.ndarray:
    return table.column(name).to_numpy().copy()


def _observations(world: World) -> np.ndarray:
    return np.concatenate([ep["observation"] for ep in world.episodes])  # [N, 4]


# ----------------------------------------------------------------------------- checks


def _reject_constant(name: str):
    raise ValueError(f"non-finite number {name} in the JSON output")


def parse_json(run) -> dict:
    """stdout as exactly one JSON document, with no NaN/Infinity anywhere."""
    assert run.returncode == 0, run
    return json.loads(run.stdout, parse_constant=_reject_constant)


def assert_quiet_stderr(run) -> None:
    """A successful run may warn on stderr (a line each, "warning: ..."; the warnings' own
    words may say "standard error"), but reports no error and no traceback."""
    assert "Traceback" not in run.stderr, run
    lines = run.stderr.splitlines()
    assert not any(line.startswith("ope:") for line in lines), run
    assert all(line.startswith("warning: ") for line in lines), run


def _is_number(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _number_or_null(x) -> bool:
    return x is None or _is_number(x)


def check_document(doc: dict, policies: list[str], estimators=ESTIMATORS, source=None) -> None:
    """Every field of SPEC section 5, with the right types."""
    assert doc["schema_version"] == 1
    assert doc["tool"] == {**doc["tool"], "name": "ope", "version": ope_cli.__version__}
    dataset = doc["dataset"]
    if source is not None:
        assert dataset["source"] == source
    assert isinstance(dataset["source"], str)
    assert dataset["layout"] in ("step", "episode")
    for key in ("episodes", "steps", "max_length"):
        assert isinstance(dataset[key], int) and not isinstance(dataset[key], bool), key
    assert _is_number(doc["gamma"])
    assert doc["confidence"]["level"] == pytest.approx(0.95)
    assert isinstance(doc["confidence"]["method"], str) and doc["confidence"]["method"]
    assert [r["policy"] for r in doc["results"]] == policies
    for result in doc["results"]:
        assert set(result["estimates"]) == set(estimators)
        for name, estimate in result["estimates"].items():
            for field in ESTIMATE_FIELDS:
                assert field in estimate, (name, field)
                assert _number_or_null(estimate[field]), (name, field, estimate[field])
        for field in DIAGNOSTICS:
            assert field in result["diagnostics"], field
            assert _number_or_null(result["diagnostics"][field]), field
    runtime = doc["runtime"]
    assert _is_number(runtime["seconds"]) and runtime["seconds"] >= 0
    assert _is_number(runtime["steps_per_second"]) and runtime["steps_per_second"] >= 0
    assert isinstance(runtime["backend"], str) and runtime["backend"]
    assert isinstance(runtime["devices"], int) and runtime["devices"] >= 1
    assert isinstance(runtime["processes"], int) and runtime["processes"] >= 1


def assert_close(actual, expected, what: str, rel: float = REL) -> None:
    if expected is None:
        assert actual is None, f"{what}: expected null, got {actual}"
    else:
        assert actual is not None, f"{what}: expected {expected}, got null"
        assert math.isclose(actual, expected, rel_tol=rel, abs_tol=1e-12), (
            f"{what}: {actual} != reference {expected}"
        )


def assert_matches_reference(
    result: dict, ref: dict, ref_stderr: dict | None = None, estimators=ESTIMATORS
) -> None:
    """Estimates and diagnostics of one ``results`` entry against reference_estimates."""
    for name in estimators:
        assert_close(result["estimates"][name]["value"], ref[name], f"{name}.value")
    for name in DIAGNOSTICS:
        assert_close(result["diagnostics"][name], ref[name], f"diagnostics.{name}")
    for name, expected in (ref_stderr or {}).items():
        if name in estimators:
            assert_close(result["estimates"][name]["stderr"], expected, f"{name}.stderr")


def assert_same_numbers(one: dict, other: dict) -> None:
    """Two ``results`` entries agree to a relative 1e-6 (policy names aside)."""
    for name, estimate in one["estimates"].items():
        for field in ESTIMATE_FIELDS:
            assert_close(estimate[field], other["estimates"][name][field], f"{name}.{field}")
    for name in DIAGNOSTICS:
        assert_close(one["diagnostics"][name], other["diagnostics"][name], f"diagnostics.{name}")


# ----------------------------------------------------------------------- good runs


def _good_calls(world: World) -> dict[str, list[str]]:
    eps = world.episodes
    logged = step_layout_table(add_target_probs(eps, world.ckpt_a), extra_columns=["target_prob"])
    write_table(logged, world.root / "logged.parquet")
    zero = _replace(logged, "target_prob", np.zeros(logged.num_rows))
    write_table(zero, world.root / "logged_zero.parquet")
    long_policy = world.root / LONG_POLICY  # a checkpoint path as training runs write them
    long_policy.parent.mkdir(parents=True)
    save_checkpoint(long_policy, world.ckpt_a)
    json_a = [*EVAL, "data.parquet", "-p", "a.npz", *COMMON]
    return {
        "a": [*json_a, "--format", "json"],
        "b_default_format": [*EVAL, "data.parquet", "-p", "b.npz", *COMMON],
        "several": [
            *EVAL,
            "data.parquet",
            "-p",
            "b.npz",
            "-p",
            f"{POLICY_MODULE}:log_prob",
            "-p",
            "a.npz",
            *COMMON,
            "--format",
            "json",
        ],
        "csv": [*EVAL, "data.parquet", "-p", "a.npz", "-p", "b.npz", *COMMON, "--format", "csv"],
        "table": [
            *EVAL,
            "data.parquet",
            "-p",
            LONG_POLICY,
            "-p",
            "b.npz",
            *COMMON,
            "--format",
            "table",
        ],
        "estimators": [*json_a, "--estimator", "wis", "--estimator", "is", "--format", "json"],
        "entry_points": [
            *EVAL,
            "data.parquet",
            "-p",
            f"{POLICY_MODULE}:log_prob",
            "-p",
            f"{POLICY_MODULE}:prob_policy",
            *COMMON,
            "--format",
            "json",
        ],
        "logged": [*EVAL, "logged.parquet", *COMMON, "--format", "json"],
        "logged_zero": [*EVAL, "logged_zero.parquet", *COMMON, "--format", "json"],
        "version": ["--version"],
        "help": ["--help"],
        "evaluate_help": ["evaluate", "--help"],
    }


@pytest.fixture(scope="module")
def good_calls(world) -> dict[str, list[str]]:
    """{name: args}; writes the inputs of the good runs once."""
    return _good_calls(world)


@pytest.fixture(scope="module")
def good(world, good_calls, ope_many_in_process) -> dict:
    return ope_many_in_process(
        {name: {"args": args, "cwd": world.root} for name, args in good_calls.items()}
    )


def test_json_document_matches_reference(world, good):
    run = good["a"]
    doc = parse_json(run)
    assert_quiet_stderr(run)
    check_document(doc, ["a.npz"], source="data.parquet")
    assert doc["dataset"]["layout"] == "step"
    assert doc["dataset"]["episodes"] == N_EPISODES
    assert doc["dataset"]["steps"] == world.steps
    assert doc["dataset"]["max_length"] == world.max_length
    assert doc["gamma"] == pytest.approx(GAMMA)
    (result,) = doc["results"]
    assert_matches_reference(result, world.ref_a, world.stderr_a)
    for name, estimate in result["estimates"].items():
        assert estimate["stderr"] > 0, name
        assert estimate["ci_low"] < estimate["value"] < estimate["ci_high"], name
    assert doc["runtime"]["processes"] == 1


def test_default_format_off_a_terminal_is_json(world, good):
    """Documented choice: stdout that is not a terminal gets JSON unless --format says."""
    run = good["b_default_format"]
    doc = parse_json(run)
    assert_quiet_stderr(run)
    check_document(doc, ["b.npz"])
    assert_matches_reference(doc["results"][0], world.ref_b, world.stderr_b)


def test_several_policies_in_one_run_keep_order_and_numbers(world, good):
    doc = parse_json(good["several"])
    assert_quiet_stderr(good["several"])
    check_document(doc, ["b.npz", f"{POLICY_MODULE}:log_prob", "a.npz"])
    b, entry_a, a = doc["results"]
    assert_same_numbers(b, parse_json(good["b_default_format"])["results"][0])
    assert_same_numbers(a, parse_json(good["a"])["results"][0])
    assert_same_numbers(entry_a, a)
    assert_matches_reference(b, world.ref_b, world.stderr_b)
    assert_matches_reference(a, world.ref_a, world.stderr_a)


def test_csv_output(world, good):
    run = good["csv"]
    assert run.returncode == 0, run
    assert_quiet_stderr(run)
    rows = list(csv.DictReader(io.StringIO(run.stdout)))
    header = next(csv.reader(io.StringIO(run.stdout)))
    assert {"policy", "estimator", "value", "stderr", "ci_low", "ci_high"} <= set(header)
    assert [(r["policy"], r["estimator"]) for r in rows] == [
        (p, e) for p in ("a.npz", "b.npz") for e in ESTIMATORS
    ]
    for row in rows:
        ref = world.ref_a if row["policy"] == "a.npz" else world.ref_b
        assert_close(
            float(row["value"]), ref[row["estimator"]], f"{row['policy']} {row['estimator']}"
        )
        assert float(row["ci_low"]) < float(row["value"]) < float(row["ci_high"])


def test_table_output(good):
    """Written to a pipe or file (80 columns), the table still names every policy in full:
    two checkpoints of one run differ only at the end of their paths."""
    run = good["table"]
    assert run.returncode == 0, run
    assert_quiet_stderr(run)
    for label in ("IS", "WIS", "PDIS", "WPDIS"):
        assert re.search(rf"\b{label}\b", run.stdout), (label, run.stdout)
    assert not run.stdout.lstrip().startswith("{")
    assert "b.npz" in run.stdout
    assert LONG_POLICY in run.stdout, run


def test_estimator_option_restricts_the_estimates(world, good):
    doc = parse_json(good["estimators"])
    check_document(doc, ["a.npz"], estimators=("wis", "is"))
    assert_matches_reference(
        doc["results"][0], world.ref_a, world.stderr_a, estimators=("wis", "is")
    )


def test_entry_points_equal_the_checkpoint(world, good):
    """A per-step JAX ``log_prob`` function and an object with a ``prob`` method, both
    the linear_softmax checkpoint a.npz, imported from the working directory."""
    run = good["entry_points"]
    doc = parse_json(run)
    assert_quiet_stderr(run)
    check_document(doc, [f"{POLICY_MODULE}:log_prob", f"{POLICY_MODULE}:prob_policy"])
    checkpoint = parse_json(good["a"])["results"][0]
    for result in doc["results"]:
        assert_matches_reference(result, world.ref_a, world.stderr_a)
        assert_same_numbers(result, checkpoint)


def test_logged_target_probabilities(world, good):
    run = good["logged"]
    doc = parse_json(run)
    assert_quiet_stderr(run)
    assert len(doc["results"]) == 1
    check_document(doc, [doc["results"][0]["policy"]], source="logged.parquet")
    assert_matches_reference(doc["results"][0], world.ref_a, world.stderr_a)


def test_undefined_estimates_are_null_not_nan(world, good):
    """Logged target probabilities all 0: every weight is 0, so WIS, WPDIS, ESS and the max
    weight share are 0/0 -> null; IS = PDIS = 0; the document is still valid JSON."""
    run = good["logged_zero"]
    assert "NaN" not in run.stdout and "Infinity" not in run.stdout, run
    doc = parse_json(run)
    assert_quiet_stderr(run)
    check_document(doc, [doc["results"][0]["policy"]])
    ref = reference_estimates(
        [
            {**e, "log_target": np.full(len(e["reward"]), -np.inf)}
            for e in to_reference_input(world.episodes, world.ckpt_a)
        ],
        GAMMA,
    )
    assert ref["wis"] is None and ref["wpdis"] is None and ref["zero_weight_fraction"] == 1.0
    result = doc["results"][0]
    assert_matches_reference(result, ref)
    assert result["estimates"]["wis"]["ci_low"] is None
    assert result["estimates"]["wis"]["ci_high"] is None


def test_version_and_help(good):
    assert good["version"].returncode == 0, good["version"]
    assert ope_cli.__version__ in good["version"].stdout
    assert good["help"].returncode == 0, good["help"]
    assert "evaluate" in good["help"].stdout
    run = good["evaluate_help"]
    assert run.returncode == 0, run
    for option in ("--policy", "--format", "--gamma", "--estimator"):
        assert option in run.stdout, option


def test_console_script_makes_host_blas_single_threaded_before_numpy(monkeypatch):
    """``ope`` sets one BLAS thread (the host's small products beside XLA's threads) before
    NumPy loads, leaving a user's own setting alone."""
    imported = subprocess.run(
        [sys.executable, "-c", "import sys, ope_cli.__main__; print('numpy' in sys.modules)"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert imported.stdout.strip() == "False"
    from ope_cli.__main__ import main

    monkeypatch.delenv("OPENBLAS_NUM_THREADS", raising=False)
    monkeypatch.setenv("MKL_NUM_THREADS", "3")
    monkeypatch.setattr(sys, "argv", ["ope", "--version"])
    handlers = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        with pytest.raises(SystemExit) as exited:
            main()
    finally:  # main() handles the signals, then ignores them: this process's children
        for number, handler in handlers.items():  # inherited an ignored SIGTERM
            signal.signal(number, handler)
    assert exited.value.code == 0
    assert os.environ["OPENBLAS_NUM_THREADS"] == "1"
    assert os.environ["MKL_NUM_THREADS"] == "3"


@pytest.mark.slow  # a real process
def test_console_script_reads_data_without_importing_pandas(world):
    """``ope`` loads pyarrow with pandas hidden (pyarrow's look for pandas costs 0.2 s):
    reading and inspecting data leaves pandas unimported, and pyarrow's pandas functions
    still work once a user's code wants them."""
    pytest.importorskip("pandas")
    code = (
        "import sys\n"
        "from ope_cli.__main__ import main\n"
        "sys.argv = ['ope', 'inspect', 'data.parquet', '--format', 'json']\n"
        "try:\n"
        "    main()\n"
        "except SystemExit as exited:\n"
        "    code = exited.code\n"
        "print('pandas' in sys.modules, file=sys.stderr)\n"
        "import pyarrow\n"
        "print(pyarrow.table({'x': [1, 2]}).to_pandas().shape, file=sys.stderr)\n"
        "sys.exit(code)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=world.root, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["counts"]["episodes"] == N_EPISODES
    assert done.stderr.splitlines()[-2:] == ["False", "(2, 1)"]


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt is glibc's")
def test_console_script_keeps_freed_memory_on_glibc():
    """Every mallopt option the console script sets is accepted (it returns 1 for each)."""
    from ope_cli.__main__ import keep_freed_memory

    assert keep_freed_memory()


# -------------------------------------------------------- layouts, columns, files


def _variant_calls(world: World) -> dict[str, tuple[str, dict, str]]:
    """{name: (data, evaluate's options as keywords, expected layout)}; each evaluates
    a.npz."""
    eps, root = world.episodes, world.root
    calls: dict[str, tuple[str, dict, str]] = {}

    # state/pscore plus decoys under the default names: the options must win over them.
    table = step_layout_table(eps, column_names={"observation": "state", "behavior_prob": "pscore"})
    table = table.append_column("observation", _list_column(_observations(world)[:, :3]))
    table = table.append_column("behavior_prob", pa.array(np.full(table.num_rows, 0.5)))
    write_table(table, root / "state_pscore.parquet")
    calls["column_options"] = (
        "state_pscore.parquet",
        {"obs_col": "state", "behavior_prob_col": "pscore"},
        "step",
    )

    aliases = {
        "observation": "obs",
        "action": "actions",
        "reward": "rewards",
        "behavior_prob": "propensity",
    }
    write_table(step_layout_table(eps, column_names=aliases), root / "aliases.parquet")
    calls["aliases"] = ("aliases.parquet", {}, "step")

    write_episode_layout(eps, root / "episodes.parquet")
    calls["episode_layout"] = ("episodes.parquet", {}, "episode")

    write_episode_layout(
        eps, root / "episodes_no_id.parquet", id_type=None, obs_type="fixed_size_list"
    )
    calls["episode_layout_no_id_fixed_size_obs"] = ("episodes_no_id.parquet", {}, "episode")

    write_step_layout(eps, root / "log_prob.parquet", prob_column="behavior_log_prob")
    calls["behavior_log_prob"] = ("log_prob.parquet", {}, "step")

    write_step_layout(eps, root / "data.feather", file_format="feather", row_group_size=97)
    calls["feather"] = ("data.feather", {}, "step")

    write_step_layout(eps, root / "parts", n_files=3)
    calls["directory"] = ("parts", {}, "step")

    write_step_layout(eps, root / "globbed", n_files=4)
    (root / "globbed" / "README.txt").write_text("not data; the glob must not pick this up\n")
    calls["glob"] = ("globbed/part-*.parquet", {}, "step")

    write_step_layout(
        eps,
        root / "shuffled.parquet",
        id_type=str,
        shuffle_steps_within_episode=True,
        row_group_size=101,
    )
    calls["string_ids_shuffled_steps_small_batches"] = (
        "shuffled.parquet",
        {"read_rows": 37, "min_bucket": 2},
        "step",
    )

    write_step_layout(eps, root / "no_step.parquet", include_step=False)
    calls["no_step_column"] = ("no_step.parquet", {}, "step")
    return calls


VARIANTS = (
    "column_options",
    "aliases",
    "episode_layout",
    "episode_layout_no_id_fixed_size_obs",
    "behavior_log_prob",
    "feather",
    "directory",
    "glob",
    "string_ids_shuffled_steps_small_batches",
    "no_step_column",
)


@pytest.fixture(scope="module")
def variants(world) -> dict:
    """{name: (the JSON document, expected layout, data)}: the layouts are the data's
    subject, not the command line's, so they run through the Python API."""
    calls = _variant_calls(world)
    assert tuple(calls) == VARIANTS
    policy = str(world.root / "a.npz")
    return {
        name: (
            json.loads(
                json.dumps(
                    ope_cli.evaluate(
                        str(world.root / data), policies=[policy], gamma=GAMMA, **options
                    ).to_dict()
                ),
                parse_constant=_reject_constant,
            ),
            layout,
            str(world.root / data),
        )
        for name, (data, options, layout) in calls.items()
    }


@pytest.mark.parametrize("name", VARIANTS)
def test_data_variants_give_the_reference_numbers(world, variants, name):
    doc, layout, source = variants[name]
    check_document(doc, [str(world.root / "a.npz")], source=source)
    assert doc["dataset"]["layout"] == layout
    assert doc["dataset"]["episodes"] == N_EPISODES
    assert doc["dataset"]["steps"] == world.steps
    assert doc["dataset"]["max_length"] == world.max_length
    assert_matches_reference(doc["results"][0], world.ref_a, world.stderr_a)


# ------------------------------------------------------------------------ bad inputs


@dataclasses.dataclass(frozen=True)
class Bad:
    """A bad input: ``make(world, name) -> args`` (after ``evaluate``), the exit code, and
    regular expressions (case-insensitive) the stderr line must (``patterns``) and must
    not (``forbidden``) contain.

    ``make`` writes its files under the neutral ``name`` (``{F}`` in a pattern), so no
    pattern matches just because of a file name. ``{E}``, ``{S}`` and ``{L}`` stand for the
    bad episode id, step 2, and that episode's last step.
    """

    id: str
    code: int
    patterns: tuple[str, ...]
    make: object
    forbidden: tuple[str, ...] = ()  # patterns that would misstate the problem


def _with_policy(path: str, policy: str = "a.npz") -> list[str]:
    return [path, "-p", policy]


def _drop(column: str):
    def make(w: World, name: str) -> list[str]:
        return _with_policy(w.write(f"{name}.parquet", w.table.drop_columns([column])))

    return make


def _set_value(column: str, value):
    """Sets ``column`` at the bad episode's step 2."""

    def make(w: World, name: str) -> list[str]:
        values = _numpy(w.table, column)
        values[w.bad_row] = value
        return _with_policy(w.write(f"{name}.parquet", _replace(w.table, column, values)))

    return make


def _null_reward(w: World, name: str) -> list[str]:
    values = _numpy(w.table, "reward").tolist()
    values[w.bad_row] = None
    return _with_policy(w.write(f"{name}.parquet", _replace(w.table, "reward", pa.array(values))))


def _string_rewards(w: World, name: str) -> list[str]:
    rewards = pa.array([f"{r:.6f}" for r in _numpy(w.table, "reward")])
    return _with_policy(w.write(f"{name}.parquet", _replace(w.table, "reward", rewards)))


def _float_actions(w: World, name: str) -> list[str]:
    actions = _numpy(w.table, "action").astype(np.float64)
    return _with_policy(w.write(f"{name}.parquet", _replace(w.table, "action", actions)))


def _obs_size_3(w: World, name: str) -> list[str]:
    table = _replace(w.table, "observation", _list_column(_observations(w)[:, :3]))
    return _with_policy(w.write(f"{name}.parquet", table))


def _obs_size_3_fixed(w: World, name: str) -> list[str]:
    flat = pa.array(np.ascontiguousarray(_observations(w)[:, :3]).ravel())
    table = _replace(w.table, "observation", pa.FixedSizeListArray.from_arrays(flat, 3))
    return _with_policy(w.write(f"{name}.parquet", table))


def _ragged_obs(w: World, name: str) -> list[str]:
    rows = _observations(w).tolist()
    rows[w.bad_row] = rows[w.bad_row][:3]
    table = _replace(w.table, "observation", pa.array(rows, pa.list_(pa.float64())))
    return _with_policy(w.write(f"{name}.parquet", table))


def _duplicate_step(w: World, name: str) -> list[str]:
    steps = _numpy(w.table, "step")
    steps[w.bad_row] = 1  # steps 0, 1, 1, 3, ...
    return _with_policy(w.write(f"{name}.parquet", _replace(w.table, "step", steps)))


def _missing_step(w: World, name: str) -> list[str]:
    steps = _numpy(w.table, "step")
    steps[w.last_row] += 1  # 0, ..., L-1, L+1: step L is missing
    return _with_policy(w.write(f"{name}.parquet", _replace(w.table, "step", steps)))


def _split_episode(with_step: bool):
    """The bad episode's last row moved after the next episode's rows (ids E, E+1, E)."""

    def make(w: World, name: str) -> list[str]:
        n = w.table.num_rows
        next_end = w.last_row + 1 + len(w.episodes[w.bad_episode + 1]["reward"])
        order = np.r_[0 : w.last_row, w.last_row + 1 : next_end, w.last_row, next_end:n]
        table = w.table.take(pa.array(order))
        if not with_step:
            table = table.drop_columns(["step"])
        return _with_policy(w.write(f"{name}.parquet", table))

    return make


def _episode_in_two_files(w: World, name: str) -> list[str]:
    e = w.bad_episode
    directory = w.root / "bad" / name
    directory.mkdir(parents=True)
    write_table(step_layout_table(w.episodes[: e + 1]), directory / "part-0.parquet")
    write_table(step_layout_table(w.episodes[e : e + 10]), directory / "part-1.parquet")
    return _with_policy(f"bad/{name}")


def _zero_rows(w: World, name: str) -> list[str]:
    return _with_policy(w.write(f"{name}.parquet", w.table.slice(0, 0)))


def _empty_directory(w: World, name: str) -> list[str]:
    directory = w.root / "bad" / name
    directory.mkdir(parents=True)
    (directory / "_SUCCESS").write_text("")
    return _with_policy(f"bad/{name}")


def _truncated(w: World, name: str) -> list[str]:
    data = (w.root / "data.parquet").read_bytes()
    return _with_policy(w.text(f"{name}.parquet", data[: len(data) // 2]))


def _episode_lists_disagree(w: World, name: str) -> list[str]:
    table = episode_layout_table(w.episodes)
    rewards = table.column("rewards").to_pylist()
    rewards[w.bad_episode] = rewards[w.bad_episode][:-1]
    table = _replace(table, "rewards", pa.array(rewards, pa.list_(pa.float64())))
    return _with_policy(w.write(f"{name}.parquet", table))


def _checkpoint(mutate):
    """A copy of checkpoint a, changed by ``mutate(dict) -> dict``, saved as bad/ID.npz."""

    def make(w: World, name: str) -> list[str]:
        (w.root / "bad").mkdir(exist_ok=True)
        save_checkpoint(w.root / "bad" / f"{name}.npz", mutate(dict(w.ckpt_a)))
        return _with_policy("data.parquet", f"bad/{name}.npz")

    return make


def _pickled_checkpoint(w: World, name: str) -> list[str]:
    (w.root / "bad").mkdir(exist_ok=True)
    with open(w.root / "bad" / f"{name}.npz", "wb") as handle:
        np.savez(
            handle,
            kind=np.array("linear_softmax"),
            weight=w.ckpt_a["weight"],
            bias=w.ckpt_a["bias"],
            meta=np.array([{"lr": 0.1}], dtype=object),
        )
    return _with_policy("data.parquet", f"bad/{name}.npz")


def _text_checkpoint(w: World, name: str) -> list[str]:
    return _with_policy("data.parquet", w.text(f"{name}.npz", "weights: [1, 2, 3]\n"))


def _args(*args: str):
    return lambda w, name: list(args)


def _without(mapping: dict, key: str) -> dict:
    return {k: v for k, v in mapping.items() if k != key}


LOC = (r"\bepisode {E}\b", r"\bstep {S}\b")  # the bad value's episode and step
SPLIT = "contiguous|more than one (place|run)|split|appears again"

BAD = [
    # missing or mistyped columns (schema)
    Bad("missing_reward", 3, ("reward",), _drop("reward")),
    Bad("missing_action", 3, ("action",), _drop("action")),
    Bad("missing_behavior_prob", 3, ("behavior", "prob"), _drop("behavior_prob")),
    Bad("string_rewards", 3, ("reward", "type|string"), _string_rewards),
    # bad values: what and where (file, episode, step)
    Bad("nan_reward", 3, (r"{F}\.parquet", *LOC, "reward", "nan"), _set_value("reward", np.nan)),
    Bad("inf_reward", 3, (r"{F}\.parquet", *LOC, "reward", "inf"), _set_value("reward", np.inf)),
    Bad("null_reward", 3, (r"{F}\.parquet", *LOC, "reward", "null|missing"), _null_reward),
    Bad(
        "zero_behavior_prob",
        3,
        (r"{F}\.parquet", *LOC, "behavior prob"),
        _set_value("behavior_prob", 0.0),
    ),
    Bad(
        "negative_behavior_prob",
        3,
        (r"{F}\.parquet", *LOC, "behavior prob"),
        _set_value("behavior_prob", -0.25),
    ),
    Bad(
        "behavior_prob_above_one",
        3,
        (r"{F}\.parquet", *LOC, "behavior prob", "> ?1|greater than 1|above 1"),
        _set_value("behavior_prob", 1.5),
    ),
    Bad(
        "action_out_of_range",
        3,
        (r"{F}\.parquet", *LOC, "action", r"\b4\b"),
        _set_value("action", 4),
    ),
    Bad(
        "negative_action",
        3,
        (r"{F}\.parquet", *LOC, "action", "negative|< ?0"),
        _set_value("action", -1),
    ),
    Bad("float_actions_discrete_policy", 3, ("action", "integer|discrete"), _float_actions),
    Bad("observation_size", 3, ("observation", r"\b3\b", r"\b4\b"), _obs_size_3),
    Bad("observation_size_fixed_list", 3, ("observation", r"\b3\b", r"\b4\b"), _obs_size_3_fixed),
    Bad(  # the drop that applies to it is named, as for other invalid values
        "ragged_observations",
        3,
        (r"{F}\.parquet", *LOC, "observation", "--on-invalid drop"),
        _ragged_obs,
    ),
    # episode structure
    Bad(
        "duplicate_step",
        3,
        (r"{F}\.parquet", LOC[0], "duplicate|more than once|twice"),
        _duplicate_step,
    ),
    Bad(
        "missing_step",
        3,
        (r"{F}\.parquet", LOC[0], r"missing", r"\bstep {L}\b"),
        _missing_step,
    ),
    # ids E, E+1, E: with a step column the second run of E holds its last step, so no step
    # of E is missing or repeated; the error must say the rows are split, not "step 0 is missing"
    Bad(
        "episode_rows_interleaved",
        3,
        (r"{F}\.parquet", LOC[0], SPLIT),
        _split_episode(with_step=True),
        forbidden=("missing",),
    ),
    Bad(
        "episode_rows_interleaved_no_step",
        3,
        (r"{F}\.parquet", LOC[0], SPLIT),
        _split_episode(with_step=False),
    ),
    Bad(
        "episode_in_two_files",
        3,
        (r"{F}/part-1\.parquet", LOC[0], "file|more than one"),
        _episode_in_two_files,
    ),
    Bad(
        "episode_lists_disagree",
        3,
        (r"{F}\.parquet", LOC[0], "rewards"),
        _episode_lists_disagree,
    ),
    # files
    Bad("zero_rows", 3, (r"{F}\.parquet", "no (rows|episodes|data)|empty"), _zero_rows),
    Bad(
        "empty_directory",
        3,
        ("{F}", "no data files|no (parquet )?files|empty"),
        _empty_directory,
    ),
    Bad(
        "nonexistent_path",
        3,
        ("does_not_exist.parquet", "no such|not found|does not exist"),
        _args("bad/does_not_exist.parquet", "-p", "a.npz"),
    ),
    Bad(
        "truncated_parquet",
        3,
        (
            r"{F}\.parquet",
            "cannot|corrupt|invalid|truncated|unreadable|parquet magic|footer",
        ),
        _truncated,
    ),
    Bad(
        "text_not_parquet",
        3,
        (r"{F}\.parquet", "not a parquet|unrecognised|unrecognized"),
        lambda w, name: _with_policy(w.text(f"{name}.parquet", "episode_id,reward\n0,1.0\n")),
    ),
    # checkpoints and entry points
    Bad(
        "checkpoint_missing_file",
        4,
        ("bad/no_such_checkpoint.npz", "no such|not found|does not exist"),
        _args("data.parquet", "-p", "bad/no_such_checkpoint.npz"),
    ),
    Bad(
        "checkpoint_missing_array",
        4,
        (r"{F}\.npz", "'bias'|bias"),
        _checkpoint(lambda c: _without(c, "bias")),
    ),
    Bad(
        "checkpoint_bias_length",
        4,
        (r"{F}\.npz", "bias"),
        _checkpoint(lambda c: {**c, "bias": np.zeros(3)}),
    ),
    Bad(
        "checkpoint_unknown_kind",
        4,
        (r"{F}\.npz", "kind", "transformer"),
        _checkpoint(lambda c: {**c, "kind": "transformer"}),
    ),
    Bad(
        "checkpoint_pickled_object",
        4,
        (r"{F}\.npz", "pickle"),
        _pickled_checkpoint,
    ),
    # np.load(allow_pickle=False) reports any non-zip, non-.npy file as pickled data
    Bad(
        "checkpoint_text_file",
        4,
        (
            r"{F}\.npz",
            "not a|zip|corrupt|unreadable|cannot read|unrecognised|unknown format",
        ),
        _text_checkpoint,
        forbidden=("pickle",),
    ),
    Bad(
        "entry_point_no_module",
        4,
        ("ope_cli_test_missing_module",),
        _args("data.parquet", "-p", "ope_cli_test_missing_module:policy"),
    ),
    Bad(
        "entry_point_import_fails",
        4,
        ("ope_cli_test_broken", "import"),
        _args("data.parquet", "-p", "ope_cli_test_broken:log_prob"),
    ),
    Bad(
        "entry_point_no_attribute",
        4,
        ("no_such_name",),
        _args("data.parquet", "-p", f"{POLICY_MODULE}:no_such_name"),
    ),
    Bad(
        "entry_point_float_of_tracer",
        4,
        ("ope_cli_test_untraceable:with_float", "trac|jit"),
        _args("data.parquet", "-p", "ope_cli_test_untraceable:with_float"),
    ),
    Bad(
        "entry_point_python_if",
        4,
        ("ope_cli_test_untraceable:with_if", "trac|jit"),
        _args("data.parquet", "-p", "ope_cli_test_untraceable:with_if"),
    ),
    # usage
    Bad(
        "gamma_above_one",
        2,
        ("gamma", r"1\.5"),
        _args("data.parquet", "-p", "a.npz", "--gamma", "1.5"),
    ),
    Bad(
        "unknown_option",
        2,
        ("--no-such-option",),
        _args("data.parquet", "-p", "a.npz", "--no-such-option"),
    ),
    Bad(
        "unknown_estimator",
        2,
        ("estimator", "foo"),
        _args("data.parquet", "-p", "a.npz", "--estimator", "foo"),
    ),
    Bad(
        "unknown_format",
        2,
        ("format", "xml"),
        _args("data.parquet", "-p", "a.npz", "--format", "xml"),
    ),
    # no policy and nothing logged to evaluate: invalid data (the tool's choice)
    Bad("no_policy_no_target_column", 3, ("target", "--policy"), _args("data.parquet")),
    # bounds of betting intervals
    Bad(
        "reward_outside_declared_range",
        3,
        ("episode {E}", "step {S}", "reward", r"\[-3, 3\]"),
        lambda w, name: [
            *_set_value("reward", 5.0)(w, name),
            "--reward-range",
            "-3",
            "3",
            "--horizon",
            "1000",
        ],
    ),
    Bad(
        "reward_range_without_horizon_at_gamma_one",
        2,
        ("--reward-range", "--horizon"),
        _args("data.parquet", "-p", "a.npz", "--reward-range", "-3", "3"),
    ),
    Bad(
        "episode_longer_than_horizon",
        3,
        ("episode", "horizon of 2 steps"),
        _args("data.parquet", "-p", "a.npz", "--reward-range", "-3", "3", "--horizon", "2"),
    ),
    Bad(
        "betting_without_reward_range",
        2,
        ("--ci betting", "--reward-range"),
        _args("data.parquet", "-p", "a.npz", "--ci", "betting"),
    ),
    Bad(
        "betting_gamma_one_without_horizon",
        2,
        ("--horizon",),
        _args("data.parquet", "-p", "a.npz", "--ci", "betting", "--reward-range", "-3", "3"),
    ),
    Bad(
        "reward_range_reversed",
        2,
        ("--reward-range", "LOW < HIGH"),
        _args("data.parquet", "-p", "a.npz", "--reward-range", "1", "0"),
    ),
    Bad(
        "horizon_not_positive",
        2,
        ("--horizon", "positive"),
        _args("data.parquet", "-p", "a.npz", "--horizon", "0"),
    ),
    Bad(
        "declared_bounds_malformed",
        3,
        ("metadata", "reward_range"),
        lambda w, name: _with_policy(
            w.write(
                f"{name}.parquet", w.table.replace_schema_metadata({"ope": '{"reward_range": [1]}'})
            )
        ),
    ),
]


def _input_name(case: Bad) -> str:
    """A neutral file name for the case's input, so that no pattern matches the name alone."""
    return f"input{BAD.index(case):02d}"


def _bad_calls(world: World) -> dict[str, dict]:
    calls = {}
    for case in BAD:
        args = case.make(world, _input_name(case))
        calls[case.id] = {"args": [*EVAL, *args], "cwd": world.root}
    return calls


@pytest.fixture(scope="module")
def bad_calls(world) -> dict[str, dict]:
    """{case id: run_ope kwargs}; writes every case's input files once."""
    return _bad_calls(world)


@pytest.fixture(scope="module")
def bad(bad_calls, ope_many_in_process) -> dict:
    return ope_many_in_process(bad_calls)


@pytest.mark.parametrize("case", BAD, ids=[case.id for case in BAD])
def test_bad_input_is_one_clear_error_line(world, bad, case):
    _check_bad_run(world, bad[case.id], case)


def _check_bad_run(world: World, run, case: Bad) -> None:
    assert run.returncode == case.code, run
    assert run.stdout == "", run
    assert "Traceback" not in run.stderr, run
    lines = run.stderr.splitlines()
    assert len(lines) == 1, run
    (line,) = lines
    assert line.startswith("ope: "), run
    assert "internal error" not in line, run
    values = {
        "F": _input_name(case),
        "E": world.bad_episode,
        "S": 2,
        "L": len(world.episodes[world.bad_episode]["reward"]) - 1,
    }
    for pattern in case.patterns:
        pattern = pattern.format(**values) if "{" in pattern and "}" in pattern else pattern
        assert re.search(pattern, line, re.IGNORECASE), f"{pattern!r} not in: {line}"
    for pattern in case.forbidden:
        assert not re.search(pattern, line, re.IGNORECASE), f"{pattern!r} misstates: {line}"


# ------------------------------------------------- help, ranking option, progress display


def test_every_command_and_option_has_help_and_an_example():
    import typer.main

    from ope_cli.cli import app

    root = typer.main.get_command(app)
    assert all(getattr(p, "help", None) for p in root.params), root.params
    for name, command in root.commands.items():
        assert command.help and "ope " + name in command.help, f"{name}: no example in its help"
        # help is rich markup: an unescaped "[word ...]" would vanish from --help
        assert _shown(command.help) == command.help.replace("\\[", "["), name
        for param in command.params:
            assert getattr(param, "help", None), f"ope {name}: {param.name} has no help text"
            assert _shown(param.help) == param.help.replace("\\[", "["), (name, param.name)


def test_every_help_example_fits_an_80_column_terminal():
    """Examples longer than the help's 78 columns wrapped mid-command ("--behavior" over
    "estimate"): a line copied from the help was then an incomplete command."""
    import typer.main

    from ope_cli.cli import app

    for name, command in typer.main.get_command(app).commands.items():
        for paragraph in command.help.split("\n\n"):
            example = paragraph.strip().removeprefix("Example: ")
            if example.startswith("ope "):
                assert len(example) <= 77, (name, example)


def _shown(markup: str) -> str:
    from rich.text import Text

    return Text.from_markup(markup).plain


# ope evaluate's options in --help order: option groups (cli/groups.py) must keep each
# option where it stood when the command declared them one by one.
EVALUATE_OPTIONS = (
    "data policy behavior min_propensity behavior_cross_fit q cross_fit v_samples gamma "
    "estimator output_format confidence ci reward_range horizon bootstrap_samples seed "
    "baseline truth top_k "
    "precision devices quiet on_invalid rank_by plot overwrite coordinator num_processes "
    "process_id distributed timeout read_rows batch_steps min_bucket episode_col step_col obs_col "
    "action_col reward_col behavior_prob_col behavior_log_prob_col target_prob_col "
    "target_log_prob_col q_col v_col"
).split()


def test_every_command_accepts_quiet(world, ope_many_in_process):
    """SPEC 1 lists --quiet among the common options: every command takes it (-q too), so
    a script can pass it everywhere; the commands without progress output ignore it."""
    import typer.main

    from ope_cli.cli import app

    commands = typer.main.get_command(app).commands
    for name, command in commands.items():
        assert "quiet" in [p.name for p in command.params], name
    out = world.root / "quiet.parquet"
    runs = ope_many_in_process(
        {
            "inspect": {"args": ["inspect", "data.parquet", "-q", "-f", "json"], "cwd": world.root},
            "convert": {"args": ["convert", "data.parquet", out, "--quiet"], "cwd": world.root},
        }
    )
    for name, run in runs.items():
        assert run.returncode == 0 and run.stderr == "", (name, run)


def test_option_groups_keep_every_option_in_its_place():
    import typer.main

    from ope_cli.cli import app

    commands = typer.main.get_command(app).commands
    assert [p.name for p in commands["evaluate"].params] == EVALUATE_OPTIONS
    bench = [p.name for p in commands["bench"].params]
    assert bench[4:6] == ["precision", "output_format"]
    assert bench[-5:] == ["read_rows", "batch_steps", "min_bucket", "processes", "rounds"]


def test_an_option_group_reaches_the_command_as_one_object():
    from typer.testing import CliRunner

    from ope_cli.cli.groups import BATCHING, TABLE_OR_JSON
    from ope_cli.cli.options import InspectFormat, option_groups
    from ope_cli.config import BatchingConfig

    received = {}
    app = typer.Typer(add_completion=False)

    @app.command()
    @option_groups(batching=BATCHING, output=TABLE_OR_JSON)
    def command(
        *,
        first: Annotated[int, typer.Option(help="First.")] = 1,
        batching: BatchingConfig,
        output: InspectFormat,
    ) -> None:
        """ope command"""
        received.update(first=first, batching=batching, output=output)

    done = CliRunner().invoke(app, ["--read-rows", "7", "--min-bucket", "3", "-f", "json"])
    assert done.exit_code == 0, done.output
    assert received == {
        "first": 1,
        "batching": BatchingConfig(read_rows=7, min_bucket=3),
        "output": InspectFormat.json,
    }
    names = [p.name for p in typer.main.get_command(app).params]
    assert names == ["first", "read_rows", "batch_steps", "min_bucket", "output_format"]


def test_merged_and_plain_option_groups_reach_the_command_as_dicts():
    """``merged_group`` hands the command {name: each group's object}, ``options_group`` its
    options' values, both in the declared --help order."""
    from typer.testing import CliRunner

    from ope_cli.cli.groups import BATCHING, TABLE_OR_JSON
    from ope_cli.cli.options import InspectFormat, merged_group, option_groups, options_group
    from ope_cli.config import BatchingConfig

    received = {}
    app = typer.Typer(add_completion=False)
    first = Annotated[int, typer.Option(help="First.")]
    second = Annotated[str, typer.Option(help="Second.")]

    @app.command()
    @option_groups(
        both=merged_group(batching=BATCHING, output=TABLE_OR_JSON),
        own=options_group(("first", first, 1), ("second", second, "b")),
    )
    def command(*, own: dict, both: dict) -> None:
        """ope command"""
        received.update(own=own, both=both)

    done = CliRunner().invoke(app, ["--read-rows", "7", "-f", "json", "--second", "x"])
    assert done.exit_code == 0, done.output
    assert received == {
        "own": {"first": 1, "second": "x"},
        "both": {"batching": BatchingConfig(read_rows=7), "output": InspectFormat.json},
    }
    names = [p.name for p in typer.main.get_command(app).params]
    assert names == ["first", "second", "read_rows", "batch_steps", "min_bucket", "output_format"]


def test_shell_completion_stays_enabled(good):
    assert "--install-completion" in good["help"].stdout, good["help"]


def test_rank_by_must_be_a_reported_estimator(world, ope_many_in_process):
    base = [*EVAL, "data.parquet", "-p", "a.npz", "-p", "b.npz", "--format", "table"]
    runs = ope_many_in_process(
        {
            "unknown": {"args": [*base, "--rank-by", "dr"], "cwd": world.root},
            "not_reported": {"args": [*base, "--rank-by", "pdis", "-e", "wis"], "cwd": world.root},
            "default_without_wis": {"args": [*base, "-e", "pdis", "-e", "is"], "cwd": world.root},
            # given, wis is refused as pdis is (it ranked by is without a word)
            "wis_not_reported": {
                "args": [*base, "--rank-by", "wis", "-e", "is"],
                "cwd": world.root,
            },
        }
    )
    for name in ("unknown", "not_reported", "wis_not_reported"):
        run = runs[name]
        assert run.returncode == 2 and run.stdout == "", run
        assert run.stderr.startswith("ope: usage error: --rank-by"), run
    run = runs["default_without_wis"]  # the default falls back to the first estimator shown
    assert run.returncode == 0, run
    assert "rank: by PDIS" in run.stdout, run


def test_progress_shows_status_rows_and_rate_on_a_terminal():
    import time

    from rich.console import Console

    from ope_cli.cli.progress import ProgressDisplay

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=140)
    with ProgressDisplay(quiet=False, console=console, delay=0.0) as (on_progress, on_status):
        time.sleep(0.2)  # the delayed start
        on_progress(0, 1_000_000)
        on_status("compiling kernel for [1024, 64] ...")
        time.sleep(0.3)  # rich refreshes while the caller is busy
        for rows in (250_000, 500_000):  # a rate needs two advances
            on_progress(rows, 1_000_000)
            time.sleep(0.3)
    text = out.getvalue()
    assert "compiling kernel for [1024, 64] ..." in text
    assert "500,000/1,000,000 rows" in text and "rows/s" in text


def test_progress_counts_reading_time_alone_and_no_full_bar_while_work_remains(monkeypatch):
    """After a compile the rate and ETA averaged over it (an ETA of 0:28 for a read of a
    second); with every row read the bar stood full with "eta 0:00:00" for the seconds the
    last batches took."""
    from rich.console import Console

    from ope_cli.cli import progress

    clock = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    console = Console(file=io.StringIO(), force_terminal=True, width=140)
    display = progress.ProgressDisplay(quiet=False, console=console, delay=3600.0)
    with display as (on_progress, on_status):
        on_progress(0, 1000)
        on_status("compiling the kernel for window shape 1 ...")
        clock[0] += 30.0  # compiling: not reading
        on_status("evaluating")
        clock[0] += 1.0
        on_progress(500, 1000)
        task = display._progress.tasks[0]
        assert task.fields["rate"] == "500 rows/s" and task.fields["eta"] == "eta 0:01"
        clock[0] += 1.0
        on_progress(1000, 1000)
        assert (task.description, task.total, task.fields["eta"]) == (progress.ALL_READ, None, "")
        on_status("evaluating")  # a new shape's kernel, after the last rows
        assert task.description == progress.ALL_READ and task.total is None
        on_status("evaluating again with the logged propensities, to compare (pass 4 of 4)")
        clock[0] += 5.0  # not reading
        on_progress(0, 1000)  # a new pass: its own count, rate and bar
        clock[0] += 1.0
        on_progress(250, 1000)
        assert (task.completed, task.total, task.fields["rate"]) == (250, 1000, "250 rows/s")


def test_progress_keeps_saying_which_pass_it_is_in(monkeypatch):
    """The rows' "reading" and "evaluating the last batches" replaced "evaluating (pass 3 of
    4)" at once: a file read in one batch never showed the passes it was read in."""
    from rich.console import Console

    from ope_cli.cli import progress

    console = Console(file=io.StringIO(), force_terminal=True, width=140)
    display = progress.ProgressDisplay(quiet=False, console=console, delay=3600.0)
    with display as (on_progress, on_status):
        task = display._progress.tasks[0]
        on_status("fitting Q-hat (pass 1 of 3) ...")
        on_progress(400, 1000)
        assert task.description == "fitting Q-hat (pass 1 of 3)"
        on_progress(1000, 1000)
        assert task.description == "fitting Q-hat (pass 1 of 3), every row read"
        on_status("evaluating (pass 2 of 3)")
        on_progress(1000, 1000)  # one record batch: every row at once
        assert task.description == "evaluating (pass 2 of 3), every row read"
        on_status("compiling the kernel for window shape 2 of at most 4, [128, 64] ...")
        on_status("evaluating")
        assert task.description == "evaluating (pass 2 of 3), every row read"
        compare = "evaluating again with the logged propensities, to compare (pass 3 of 3)"
        on_status(compare)
        on_progress(10, 1000)
        assert task.description == compare


@pytest.mark.parametrize("width", [80, 100, 160])
def test_progress_keeps_its_numbers_whole_on_a_narrow_terminal(monkeypatch, width):
    """At 100 columns the line was cut at its end: a rate of 619,000 rows/s read "6,19"."""
    from rich.console import Console

    from ope_cli.cli import progress

    clock = [100.0]
    monkeypatch.setattr(progress.time, "monotonic", lambda: clock[0])
    console = Console(file=io.StringIO(), force_terminal=True, width=width, color_system=None)
    display = progress.ProgressDisplay(quiet=False, console=console, delay=3600.0)
    with display as (on_progress, on_status):
        on_progress(0, 20_283)
        clock[0] += 0.05
        on_progress(10_000, 20_283)
        on_status("tracing the kernel for window shape [128, 64] (compiled unless cached) ...")
        console.print(display._progress.get_renderable())
    line = console.file.getvalue().splitlines()[-1]
    assert "10,000/20,283 rows 200,000 rows/s" in line, line
    assert len(line.rstrip()) <= width


def test_the_result_stays_on_stdout_after_progress_was_shown():
    """Progress started inside the block that sends user code's prints to stderr swapped
    sys.stdout itself and, stopped after it, put stderr back as stdout: a long run's JSON
    went to the terminal and ``> out.json`` got 0 bytes, exit 0."""
    import sys
    import time

    from rich.console import Console

    from ope_cli.cli.console import stdout_kept_for_the_result
    from ope_cli.cli.progress import ProgressDisplay

    stdout = sys.stdout
    console = Console(file=io.StringIO(), force_terminal=True, width=140)
    with (
        ProgressDisplay(False, console=console, delay=0.05) as (on_progress, _),
        stdout_kept_for_the_result(),
    ):
        time.sleep(0.3)  # the delayed start, within the block, as after a second of a run
        on_progress(10, 100)
    assert sys.stdout is stdout


def test_progress_stays_hidden_when_quiet_off_a_terminal_or_fast():
    from rich.console import Console

    from ope_cli.cli.progress import ProgressDisplay

    with ProgressDisplay(quiet=True, console=Console(force_terminal=True)) as callbacks:
        assert callbacks == (None, None)
    with ProgressDisplay(quiet=False, console=Console(file=io.StringIO())) as callbacks:
        assert callbacks == (None, None)  # not a terminal
    out = io.StringIO()
    with ProgressDisplay(quiet=False, console=Console(file=out, force_terminal=True), delay=5) as (
        on_progress,
        on_status,
    ):
        on_progress(10, 10)  # done before the delay: nothing is ever drawn
    assert out.getvalue() == ""


# ------------------------------------------ smoke tests across the real process boundary

SMOKE_GOOD = ("a", "table", "version")  # exit 0
SMOKE_BAD = (  # exit 2, 2, 3, 3, 4, 4
    "gamma_above_one",
    "unknown_option",
    "missing_reward",
    "nan_reward",
    "checkpoint_text_file",
    "entry_point_no_module",
)


@pytest.fixture(scope="module")
def smoke(world, good_calls, bad_calls, ope_many) -> dict:
    """A few of the cases above, run by the real ``ope`` entry point in subprocesses."""
    calls = {name: {"args": good_calls[name], "cwd": world.root} for name in SMOKE_GOOD}
    calls.update({name: bad_calls[name] for name in SMOKE_BAD})
    missing = bad_calls["missing_reward"]
    calls["missing_reward/json"] = {**missing, "args": [*missing["args"], "--format", "json"]}
    return ope_many(calls)


def test_smoke_cases_cover_every_exit_code():
    codes = {case.code for case in BAD if case.id in SMOKE_BAD}
    assert codes == {2, 3, 4}


@pytest.mark.slow  # real processes: the full suite's
@pytest.mark.parametrize("name", SMOKE_BAD)
def test_real_process_error_is_the_same_one_line(world, bad, smoke, name):
    """Exit code, one stderr line and an empty stdout hold across the process boundary,
    and equal what the in-process run gave."""
    case = next(case for case in BAD if case.id == name)
    run = smoke[name]
    _check_bad_run(world, run, case)
    assert (run.returncode, run.stdout, run.stderr) == (
        bad[name].returncode,
        bad[name].stdout,
        bad[name].stderr,
    ), (run, bad[name])


@pytest.mark.slow  # real processes: the full suite's
def test_real_process_json_error_leaves_stdout_empty(bad, smoke):
    run = smoke["missing_reward/json"]
    assert run.returncode == 3 and run.stdout == "", run
    assert run.stderr == bad["missing_reward"].stderr, run


@pytest.mark.slow  # real processes: the full suite's
def test_real_process_results_equal_the_in_process_ones(good, smoke):
    run = smoke["a"]
    assert run.returncode == 0, run
    assert_quiet_stderr(run)
    assert_same_numbers(parse_json(run)["results"][0], parse_json(good["a"])["results"][0])
    for name in ("table", "version"):
        assert smoke[name].returncode == 0, smoke[name]
        assert smoke[name].stdout == good[name].stdout, (smoke[name], good[name])


@pytest.mark.slow
def test_shipped_optimisation_level_gives_the_reference_numbers(world, good_calls, ope):
    """The suite compiles at XLA's backend optimisation level 0 (``conftest``); a real
    process at the shipped level (no XLA_FLAGS) gives the reference numbers too."""
    run = ope(good_calls["a"], cwd=world.root, env={"XLA_FLAGS": ""})
    assert run.returncode == 0, run
    assert_quiet_stderr(run)
    assert_matches_reference(parse_json(run)["results"][0], world.ref_a, world.stderr_a)


def test_error_lines_print_names_as_given(capsys):
    """rich turns ':robot:' into an emoji unless told not to: an entry point
    agents:robot: was printed as 'agents🤖'."""
    from ope_cli.cli.console import say

    line = "ope: invalid policy: agents:robot: log_prob must return a scalar; agents:x:one:"
    say(line)
    assert capsys.readouterr().err == line + "\n"


def test_what_an_entry_point_prints_goes_to_stderr(world, ope_in_process, monkeypatch):
    """A user's module that prints on import (and when traced) leaves stdout to the result:
    ``| jq`` would fail on its line. What it printed is on stderr."""
    (world.root / "ope_cli_test_noisy.py").write_text(
        textwrap.dedent("""\
        import jax.numpy as jnp

        print("hello from import")


        def log_prob(observation, action):
            print("hello from the trace")
            return jnp.log(0.25)
        """)
    )
    policy = ["-p", "ope_cli_test_noisy:log_prob"]
    for command in (["evaluate", "data.parquet", *policy], ["inspect", "data.parquet", *policy]):
        monkeypatch.delitem(sys.modules, "ope_cli_test_noisy", raising=False)  # imported anew
        done = ope_in_process([*command, "-f", "json"], cwd=world.root)
        assert done.returncode == 0, done
        assert json.loads(done.stdout)["schema_version"] == 1  # stdout: the document alone
        assert "hello from import" in done.stderr


@pytest.mark.parametrize(
    ("cluster", "words"),
    [
        (["--num-processes", "0", "--process-id", "0"], "--num-processes must be at least 1"),
        (["--num-processes", "2", "--process-id", "2"], "--process-id must be in [0, 2), got 2"),
        (["--num-processes", "2"], "a multi-process run needs --process-id"),
    ],
)
def test_cluster_options_that_cannot_join_are_usage_errors(world, ope_in_process, cluster, words):
    args = ["evaluate", "data.parquet", "-p", "a.npz", "--coordinator", "127.0.0.1:1", *cluster]
    done = ope_in_process(args, cwd=world.root)
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.startswith("ope: usage error: ") and words in done.stderr


def test_the_supervisor_knows_process_0_from_the_command_line_or_the_launcher(monkeypatch):
    """Process 0 is the coordinator: when its peers do not join, it says so rather than
    that the coordinator did not answer (under --distributed, the launcher's rank says)."""
    from ope_cli.cli.supervisor import RANK_VARIABLES, _process_id

    for name in RANK_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert _process_id(["evaluate", "d", "--process-id", "0"]) == 0
    assert _process_id(["evaluate", "d", "--process-id=3"]) == 3
    assert _process_id(["evaluate", "d", "--distributed"]) is None
    monkeypatch.setenv("SLURM_PROCID", "0")
    assert _process_id(["evaluate", "d", "--distributed"]) == 0
    assert _process_id(["evaluate", "d", "--process-id", "2"]) == 2  # the option wins


def test_a_lonely_coordinator_names_the_processes_it_waited_for(monkeypatch):
    """Process 0 started with a larger --num-processes than were started waits out its
    timeout: its one line says how many it waited for."""
    from ope_cli.cli.supervisor import RANK_VARIABLES, SIZE_VARIABLES, _abort_reason

    for name in RANK_VARIABLES + SIZE_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    log = "RegisterTask: Deadline Exceeded"
    argv = ["evaluate", "d", "--process-id", "0", "--num-processes", "3"]
    assert "not all 3 processes joined the run in time" in _abort_reason(log, argv)
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "4")
    assert "not all 4 processes joined" in _abort_reason(log, ["evaluate", "d", "--distributed"])


def test_float32_beyond_its_range_warns_and_stderr_stays_quiet(tmp_path, ope_in_process):
    """Rewards of 1e39 overflow float32: the JSON warns float32_range, and no NumPy
    RuntimeWarning line reaches stderr (the narrowing cast and the merges printed them)."""
    rng = np.random.default_rng(12)
    behavior = random_checkpoint("linear_softmax", rng, obs_dim=3, n_actions=3)
    episodes = random_episodes(rng, 40, behavior=behavior, median_length=5, max_length=12)
    huge = [dict(e, reward=e["reward"] * 1e39) for e in episodes]
    data = write_step_layout(huge, tmp_path / "huge.parquet")
    save_checkpoint(tmp_path / "p.npz", behavior)
    args = ["evaluate", data, "-p", tmp_path / "p.npz", "--precision", "float32", "-q", "-f"]
    with warnings.catch_warnings():  # one would be an error (pytest would hide its line)
        warnings.simplefilter("error", RuntimeWarning)
        done = ope_in_process([*args, "json"])
    assert done.returncode == 0 and done.stderr == "", done
    codes = [w["code"] for w in json.loads(done.stdout)["warnings"]]
    assert "float32_range" in codes


@pytest.mark.parametrize("command", ["inspect", "fit-behavior", "convert"])
def test_a_probability_and_its_log_both_named_are_refused_by_every_command(
    world, ope_in_process, command
):
    """One of the two options was dropped without a word (the probability's was read)."""
    both = ["--behavior-prob-col", "behavior_prob", "--behavior-log-prob-col", "logp"]
    out = {"convert": ["out.parquet"], "fit-behavior": ["--out", "b.npz"]}.get(command, [])
    done = ope_in_process([command, "data.parquet", *out, *both], cwd=world.root)
    assert done.returncode == 2 and done.stdout == "", done
    assert done.stderr.startswith("ope: usage error: --behavior-prob-col and --behavior-log")


def test_ctrl_c_is_one_line_and_exit_130(world, ope_in_process, monkeypatch):
    """typer turns Ctrl-C into exit code 130 and returns it without a word: ope exited 130
    with an empty stderr (and could end in a segfault tearing down under XLA's threads)."""
    import ope_cli.cli.evaluate as evaluate_command

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluate_command, "run_and_report", interrupted)
    done = ope_in_process(["evaluate", "data.parquet", "-p", "pi.npz"], cwd=world.root)
    assert (done.returncode, done.stdout, done.stderr) == (130, "", "ope: interrupted\n")


@pytest.mark.slow  # a real process
def test_ctrl_c_in_a_real_process_is_one_line(world):
    """SIGINT while the modules load or the command runs: one line, exit 130 (while they
    loaded it printed a traceback and ended by the signal); SIGTERM (a scheduler's): one
    line, exit 143 (it ended by the signal without a word, leaving partial outputs)."""
    import signal
    import time

    from conftest import interruptible, ope_command, subprocess_env, wait_until_started

    (world.root / "slow_to_import.py").write_text("import time\ntime.sleep(120)\n")
    command = [*interruptible(ope_command()), "evaluate", "data.parquet"]
    interrupted, terminated = (130, "", "ope: interrupted\n"), (143, "", "ope: terminated\n")
    cases = ((0.4, signal.SIGINT, interrupted), (4.0, signal.SIGINT, interrupted))
    for delay, number, expected in (*cases, (4.0, signal.SIGTERM, terminated)):
        # the entry point's import holds the command up
        child = subprocess.Popen(
            [*command, "-p", "slow_to_import:log_prob"],
            cwd=world.root,
            env=subprocess_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        wait_until_started(child)
        time.sleep(delay)
        child.send_signal(number)
        stdout, stderr = child.communicate(timeout=60)
        assert (child.returncode, stdout, stderr) == expected, (delay, number)


@pytest.mark.parametrize(
    "command",
    [
        ["evaluate", "data.parquet", "-p", "pi.npz"],
        ["inspect", "data.parquet"],
        ["convert", "data.parquet", "rows0.parquet"],
        ["fit-q", "data.parquet", "-p", "pi.npz", "-o", "rows0_q.npz"],
        ["fit-behavior", "data.parquet", "-o", "rows0_b.npz"],
    ],
    ids=lambda command: command[0],
)
def test_read_rows_below_one_is_a_usage_error_in_every_command(world, ope_in_process, command):
    """fit-q and fit-behavior ended in an internal error (pyarrow's "batch_size must be
    greater than zero", exit 1); every command reads through one entry that checks it."""
    done = ope_in_process([*command, "--read-rows", "0"], cwd=world.root)
    assert (done.returncode, done.stdout) == (2, ""), done
    assert done.stderr == "ope: usage error: --read-rows must be at least 1, got 0\n", done


def test_a_nan_in_a_critic_column_sends_no_one_to_inspect(tmp_path, ope_in_process):
    """ "every problem: ope inspect DATA" followed a NaN in the --q-col, where inspect (which
    has no --q-col) said the data was valid."""
    n = 8
    table = pa.table(
        {
            "episode_id": np.arange(n),
            "action": np.zeros(n, np.int64),
            "reward": np.ones(n),
            "behavior_prob": np.full(n, 0.5),
            "target_prob": np.full(n, 0.5),
            "q": np.where(np.arange(n) == 3, np.nan, 1.0),
            "v": np.ones(n),
        }
    )
    pq.write_table(table, tmp_path / "critic.parquet")
    args = ["evaluate", "critic.parquet", "--q-col", "q", "--v-col", "v", "--gamma", "0.9"]
    done = ope_in_process(args, cwd=tmp_path)
    assert (done.returncode, done.stdout) == (3, ""), done
    assert "the --q-col value is NaN or infinite" in done.stderr
    assert "ope inspect" not in done.stderr and "--on-invalid drop" in done.stderr


def test_a_seed_that_draws_nothing_is_refused_before_the_run(world, ope_in_process):
    """--seed with normal intervals, no fitted MLP and discrete actions changed nothing."""
    args = ["evaluate", "data.parquet", "-p", "a.npz", "--seed", "3"]
    done = ope_in_process([*args, "-f", "json"], cwd=world.root)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("ope: usage error: --seed applies to --ci percentile")
    done = ope_in_process([*args, "--ci", "percentile", "-f", "json"], cwd=world.root)
    assert done.returncode == 0, done.stderr
