"""Property-based tests (hypothesis): however valid data is laid out and cut, the estimates
are the reference's; however a Parquet file is corrupted, reading it ends cleanly.

1. Random valid datasets in both layouts - random episode lengths, column order, id type,
   step order, row-group and record-batch sizes, file splits, batch_steps and min_bucket -
   agree with the float64 reference to a relative 1e-6 (SPEC 4: results do not depend on
   how the data is cut). Shapes are kept few (lengths <= 16, two batch_steps, three
   min_bucket values, one policy shape) because JAX compiles once per shape.
2. Random byte corruption (overwritten bytes, overwritten ranges, truncation) of valid
   Parquet files ends in a DataError or, when the damage only changed values into other
   valid values (Parquet pages carry no checksum by default), in a normal read - never
   another exception, a crash or a hang. Each case runs in a separate worker process with
   a time limit, so a crash or a hang fails the test instead of killing the session.
"""

from __future__ import annotations

import concurrent.futures
import multiprocessing
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasets import (
    episode_layout_table,
    perturb_checkpoint,
    random_checkpoint,
    random_episodes,
    save_checkpoint,
    step_layout_table,
    to_reference_input,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from reference import DIAGNOSTICS, ESTIMATORS, reference_estimates, reference_stderr

from ope_cli.config import BatchingConfig, ColumnMapping, EvaluationConfig, RuntimeConfig
from ope_cli.errors import DataError
from ope_cli.estimation.pipeline import evaluate

pytestmark = pytest.mark.slow

GAMMA = 0.95
SECONDS_PER_CORRUPT_FILE = 20  # generous on a loaded 2-core machine; a read takes ~10 ms


@pytest.fixture(scope="module")
def policies(tmp_path_factory):
    """One behavior and one target checkpoint for every example (one kernel shape)."""
    root = tmp_path_factory.mktemp("properties")
    rng = np.random.default_rng(0)
    behavior = random_checkpoint("linear_softmax", rng, obs_dim=3, n_actions=3)
    target = perturb_checkpoint(behavior, rng, 0.5)
    return behavior, target, save_checkpoint(root / "target.npz", target)


def _close(actual, expected, what):
    if expected is None:
        assert actual is None, what
    else:
        assert actual == pytest.approx(expected, rel=1e-6, abs=1e-12), what


def _split(table: pa.Table, bounds: list[int]) -> list[pa.Table]:
    return [table.slice(lo, hi - lo) for lo, hi in zip(bounds[:-1], bounds[1:], strict=True)]


@st.composite
def layouts(draw):
    """How a dataset is written and read (everything except the episodes themselves)."""
    return {
        "seed": draw(st.integers(0, 2**32 - 1)),
        "episodes": draw(st.integers(1, 40)),
        "max_length": draw(st.sampled_from([1, 3, 9, 16])),
        "length_dist": draw(st.sampled_from(["skewed", "uniform", "fixed"])),
        "layout": draw(st.sampled_from(["step", "episode"])),
        "column_order": draw(st.randoms(use_true_random=False)),
        "string_ids": draw(st.booleans()),
        "shuffle_steps": draw(st.booleans()),
        "with_step": draw(st.booleans()),
        "files": draw(st.integers(1, 4)),
        "row_group": draw(st.integers(1, 64)),
        "read_rows": draw(st.integers(1, 80)),
        "batch_steps": draw(st.sampled_from([64, 128])),
        "min_bucket": draw(st.sampled_from([2, 4, 8])),  # at least 2 (--min-bucket)
    }


@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=layouts())
def test_any_valid_layout_gives_the_reference(policies, case):
    behavior, target, target_path = policies
    rng = np.random.default_rng(case["seed"])
    episodes = random_episodes(
        rng,
        case["episodes"],
        behavior=behavior,
        median_length=4,
        max_length=case["max_length"],
        length_dist=case["length_dist"],
    )
    id_type = str if case["string_ids"] else int
    if case["layout"] == "step":
        table = step_layout_table(
            episodes,
            id_type=id_type,
            include_step=case["with_step"],
            shuffle_steps_within_episode=case["shuffle_steps"] and case["with_step"],
            seed=case["seed"] % 1000,
        )
        row_of_episode = np.concatenate([[0], np.cumsum([len(e["reward"]) for e in episodes])])
    else:
        table = episode_layout_table(episodes, id_type=id_type)
        row_of_episode = np.arange(len(episodes) + 1)
    names = list(table.column_names)
    case["column_order"].shuffle(names)
    table = table.select(names)
    files = min(case["files"], len(episodes))
    cuts = (
        sorted(case["column_order"].sample(range(1, len(episodes)), files - 1)) if files > 1 else []
    )
    bounds = [0, *(int(row_of_episode[c]) for c in cuts), table.num_rows]

    with tempfile.TemporaryDirectory() as directory:
        for k, part in enumerate(_split(table, bounds)):
            pq.write_table(
                part, Path(directory) / f"part-{k:03d}.parquet", row_group_size=case["row_group"]
            )
        config = EvaluationConfig(
            data=directory,
            policies=(str(target_path),),
            gamma=GAMMA,
            batching=BatchingConfig(
                read_rows=case["read_rows"],
                batch_steps=case["batch_steps"],
                min_bucket=case["min_bucket"],
            ),
            runtime=RuntimeConfig(precision="float64"),
        )
        result = evaluate(config)

    assert result.dataset.episodes == len(episodes)
    assert result.dataset.steps == sum(len(e["reward"]) for e in episodes)
    reference_input = to_reference_input(episodes, target)
    expected = reference_estimates(reference_input, GAMMA)
    expected_stderr = reference_stderr(reference_input, GAMMA)
    (policy,) = result.results
    for name in ESTIMATORS:
        _close(policy.estimates[name].value, expected[name], name)
    for name in ("is", "pdis") if len(episodes) > 1 else ():
        _close(policy.estimates[name].stderr, expected_stderr[name], f"{name}.stderr")
    for name in DIAGNOSTICS:
        _close(getattr(policy.diagnostics, name), expected[name], name)


# ----------------------------------------------------------------------- corruption


def read_everything(path: str) -> str:
    """Opens, validates and assembles every episode of ``path`` (no JAX): ``ok``, or
    ``DataError: ...``, or ``BUG <type>: ...`` for any other exception. Runs in a worker."""
    from ope_cli.data.columns import resolve_schema
    from ope_cli.data.episodes import EpisodeAssembler
    from ope_cli.data.sources import iter_batches, open_dataset

    try:
        data = open_dataset(path)
        schema = resolve_schema(data.schema, ColumnMapping(), logged_target=False, source=path)
        assembler = EpisodeAssembler(schema)
        for _ in assembler.chunks(iter_batches(data, schema.read_columns, 37)):
            pass
        return "ok"
    except DataError as error:
        return f"DataError: {error}"
    except Exception as error:  # noqa: BLE001 - what the test looks for
        return f"BUG {type(error).__name__}: {error}"


class _Files(list):
    """The valid files' bytes, with a short repr for hypothesis's failure reports."""

    def __repr__(self) -> str:
        return f"<{len(self)} valid Parquet files>"


@pytest.fixture(scope="module")
def valid_files(policies, tmp_path_factory) -> list[bytes]:
    """A few valid Parquet files (both layouts, several encodings) as bytes."""
    behavior, _, _ = policies
    root = tmp_path_factory.mktemp("corrupt")
    episodes = random_episodes(
        np.random.default_rng(1), 30, behavior=behavior, median_length=5, max_length=16
    )
    variants = [
        (step_layout_table(episodes), {"compression": "snappy", "row_group_size": 40}),
        (step_layout_table(episodes, id_type=str), {"compression": "none", "use_dictionary": True}),
        (episode_layout_table(episodes), {"compression": "zstd", "row_group_size": 7}),
        (
            step_layout_table(episodes, obs_type="fixed_size_list"),
            {"compression": "gzip", "data_page_size": 256},
        ),
    ]
    out = []
    for k, (table, options) in enumerate(variants):
        path = root / f"valid{k}.parquet"
        pq.write_table(table, path, **options)
        assert read_everything(str(path)) == "ok"
        out.append(path.read_bytes())
    return _Files(out)


@pytest.fixture(scope="module")
def worker():
    """One reading process, reused across examples (replaced after a failure)."""
    state = {"pool": None}

    def run(path: str) -> str:
        if state["pool"] is None:
            state["pool"] = concurrent.futures.ProcessPoolExecutor(
                1, mp_context=multiprocessing.get_context("spawn")
            )
        future = state["pool"].submit(read_everything, path)
        try:
            return future.result(timeout=SECONDS_PER_CORRUPT_FILE)
        except concurrent.futures.TimeoutError:
            _kill(state)
            return f"HANG: no answer in {SECONDS_PER_CORRUPT_FILE} s"
        except concurrent.futures.process.BrokenProcessPool:
            _kill(state)
            return "CRASH: the reading process died"

    yield run
    _kill(state)


def _kill(state) -> None:
    pool, state["pool"] = state["pool"], None
    if pool is not None:
        for process in list(getattr(pool, "_processes", {}).values()):
            process.kill()
        pool.shutdown(wait=False, cancel_futures=True)


@st.composite
def corruptions(draw):
    """(file index, how): overwritten bytes, an overwritten range, or a truncation."""
    kind = draw(st.sampled_from(["bytes", "range", "truncate", "footer"]))
    if kind == "bytes":
        how = draw(
            st.lists(
                st.tuples(st.floats(0, 1, exclude_max=True), st.integers(0, 255)),
                min_size=1,
                max_size=8,
            )
        )
    elif kind == "range":
        how = (
            draw(st.floats(0, 1, exclude_max=True)),
            draw(st.integers(1, 200)),
            draw(st.binary(min_size=1, max_size=16)),
        )
    elif kind == "truncate":
        how = draw(st.floats(0, 1, exclude_max=True))
    else:  # the footer (metadata and its length) is where a reader is most exposed
        how = draw(
            st.lists(st.tuples(st.integers(1, 400), st.integers(0, 255)), min_size=1, max_size=4)
        )
    return draw(st.integers(0, 3)), kind, how


def _corrupt(data: bytes, kind: str, how) -> bytes:
    out = bytearray(data)
    if kind == "bytes":
        for position, value in how:
            out[int(position * len(out))] = value
    elif kind == "range":
        start = int(how[0] * len(out))
        filler = (how[2] * (how[1] // len(how[2]) + 1))[: how[1]]
        out[start : start + len(filler)] = filler
        del out[len(data) :]
    elif kind == "truncate":
        del out[int(how * len(out)) :]
    else:
        for back, value in how:
            out[max(0, len(out) - back)] = value
    return bytes(out)


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(corruption=corruptions())
def test_corrupt_parquet_ends_in_a_clean_data_error(valid_files, worker, corruption):
    index, kind, how = corruption
    broken = _corrupt(valid_files[index], kind, how)
    with tempfile.TemporaryDirectory() as directory:
        path = Path(directory) / "broken.parquet"
        path.write_bytes(broken)
        outcome = worker(str(path))
    assert outcome == "ok" or outcome.startswith("DataError: "), outcome
    if outcome.startswith("DataError: "):
        assert str(path) in outcome  # the message names the file


def test_corrupt_parquet_through_the_cli(valid_files, tmp_path, ope_many, policies):
    """A few corrupt files through ``ope evaluate``: exit 0 or 3, one line, no traceback."""
    _, _, target_path = policies
    rng = np.random.default_rng(11)
    calls = {}
    for k in range(4):
        data = bytearray(valid_files[k % len(valid_files)])
        for position in rng.integers(0, len(data), size=1 + k):
            data[position] = int(rng.integers(0, 256))
        (tmp_path / f"broken{k}.parquet").write_bytes(bytes(data))
        calls[str(k)] = {
            "args": ["evaluate", f"broken{k}.parquet", "-p", str(target_path), "--format", "json"],
            "cwd": tmp_path,
        }
    calls["truncated"] = {
        "args": ["evaluate", "truncated.parquet", "-p", str(target_path)],
        "cwd": tmp_path,
    }
    (tmp_path / "truncated.parquet").write_bytes(valid_files[0][: len(valid_files[0]) * 2 // 3])
    runs = ope_many(calls)
    for name, run in runs.items():
        assert run.returncode in (0, 3), (name, run)
        assert "Traceback" not in run.stderr, run
        if run.returncode == 3:
            assert run.stdout == "" and len(run.stderr.splitlines()) == 1, run
            assert run.stderr.startswith("ope: invalid data: "), run
    assert runs["truncated"].returncode == 3, runs["truncated"]
