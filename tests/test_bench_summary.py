"""``ope bench``'s summary (ratios, targets) and rendering, on made-up measurements: no timing,
no device, so they run in the quick loop."""

from __future__ import annotations

import json
import math
import re
from types import SimpleNamespace

import pytest

from ope_cli.bench.config import BenchConfig
from ope_cli.bench.summary import TARGET_LOOP_SPEEDUP, TARGETS, relative_difference, summary
from ope_cli.report.bench import render_bench, to_json

ESTIMATES = {"is": 1.0, "wis": 0.5, "pdis": 0.75, "wpdis": 0.6}


def _timing(seconds, steps=1000, **info):
    return {"seconds": seconds, "steps_per_second": steps / seconds, "runs": 3, **info}


@pytest.fixture
def measurements():
    kernel = dict(first_run_seconds=2.0, compiles=2, precision="float64", policies=1)
    return {
        "loop": {"steps_per_second": 10.0, "seconds": 1.0, "note": "run on the first episodes"},
        "numpy": _timing(0.5, precision="float64", estimates=ESTIMATES),
        "kernel": _timing(0.01, padded_steps=1200, estimates=ESTIMATES, **kernel),
        "kernel_float32": _timing(
            0.008, estimates={k: v * (1 + 1e-7) for k, v in ESTIMATES.items()}
        ),
        "kernel_many": _timing(0.03, compiles=2),
        "end_to_end": _timing(0.2, first_run_seconds=1.5, compiles=2, policies=1),
        "end_to_end_many": _timing(0.4),
        "many_processes": {
            "k": 3,
            "warm_cache_seconds_1": 2.0,
            "warm_cache_seconds_k": 6.0,
            "warm_cache_ratio": 3.0,
            "cold_cache_seconds_1": 5.0,
            "cold_cache_seconds_k": 10.0,
            "cold_cache_ratio": 2.0,
        },
        "end_to_end_behavior": _timing(0.24),
        "end_to_end_estimate": _timing(0.5),
        "end_to_end_q_fit": _timing(0.7),
        "kernel_dr": _timing(0.013, estimates=ESTIMATES),
        "io_floor": _timing(0.1, columns=["episode_id", "reward"]),
        "memory": None,
    }


def _document(measurements, policies=3, real_steps=1000, precision="float64"):
    padded = real_steps * 6 // 5
    shapes = [(1024, 8), (128, 64)]  # two of the default catalogue's four
    bucketer = SimpleNamespace(real_steps=real_steps, padded_steps=padded, shapes=set(shapes))
    result = SimpleNamespace(runtime=SimpleNamespace(compiles=2, batch_shapes=shapes))
    config = BenchConfig(policies=policies)
    return summary(config, measurements, result, bucketer, precision)


def test_summary_ratios_and_targets(measurements):
    document = _document(measurements)
    ratios, targets = document["ratios"], document["targets"]
    assert ratios["kernel_over_numpy"] == pytest.approx(50.0)
    assert ratios["kernel_over_loop"] == pytest.approx(1e5 / 10.0)
    assert ratios["end_to_end_over_io_floor"] == pytest.approx(2.0)
    assert targets["kernel_vs_loop"]["met"] is (ratios["kernel_over_loop"] >= TARGET_LOOP_SPEEDUP)
    assert targets["kernel_vs_numpy"]["met"] is True  # 50 >= 3
    assert "note" not in targets["kernel_vs_loop"]
    # data the loop cannot read (no step column): not measured, and the target says why
    measurements["loop"] = {"steps_per_second": None, "note": "the loop needs step and ..."}
    loop = _document(measurements)["targets"]["kernel_vs_loop"]
    assert loop["met"] is None and loop["note"] == "not measured: the loop needs step and ..."
    measurements["loop"] = {"steps_per_second": 10.0, "note": "run on every episode"}
    measurements["kernel"]["steps_per_second"] = None  # the loop ran: its note is no reason
    loop = _document(measurements)["targets"]["kernel_vs_loop"]
    assert loop["note"] == "not measured: the kernel's steps/s is unknown"
    assert targets["kernel_vs_numpy"]["threshold"].startswith(">= 3 ")
    assert targets["padding_waste"]["value"] == pytest.approx(0.2)
    # measured on the skewed bench data alone, and over 10% there: not met, whatever the
    # other distributions give (SPEC 6 asks it of each; it said "not judged")
    assert targets["padding_waste"]["met"] is False
    assert targets["padding_waste"]["note"].startswith("not measured on one-step episodes")
    # the fixed catalogue every configuration compiles, not the shapes this data happened
    # to use (2 of them: "2 <= 4" held whatever the catalogue held)
    assert targets["shapes_per_configuration"]["value"] == 4
    assert targets["shapes_per_configuration"]["met"] is True
    assert "this data used 2 of them" in targets["shapes_per_configuration"]["note"]
    # K = 3 is not SPEC 11's K = 100: the ratio is shown, not judged (it said "yes")
    assert targets["many_policies"]["value"] == pytest.approx(3.0)
    assert targets["many_policies"]["met"] is None
    assert "not judged: measured with K = 3" in targets["many_policies"]["note"]
    assert "first run (compiles) 2.00x" in targets["many_policies"]["note"]
    assert "kernel alone 3.0x" in targets["many_policies"]["note"]  # for information
    assert ratios["behavior_checkpoint_over_logged"] == pytest.approx(1.2)
    assert targets["behavior_checkpoint_vs_logged"]["met"] is True
    assert ratios["behavior_estimate_over_logged"] == pytest.approx(2.5)
    assert ratios["doubly_robust_kernel_over_kernel"] == pytest.approx(1.3)
    assert targets["doubly_robust_kernel"]["met"] is True
    assert ratios["q_fit_over_logged"] == pytest.approx(3.5)
    assert targets["q_fit_vs_logged"]["met"] is False
    assert (
        targets["memory_growth"]["met"] is None
        and "ope bench --memory" in (targets["memory_growth"]["note"])
    )
    assert document["policies"]["cost_ratio"] == pytest.approx(3.0)
    assert document["policies"]["cost_per_policy"] == pytest.approx(1.0)
    assert document["precision"]["max_relative_difference"] == pytest.approx(1e-7)
    assert document["precision"]["numpy_vs_kernel_max_relative_difference"] == 0.0
    assert "estimates" not in document["measurements"]["kernel"]
    assert document["measurements"]["kernel"]["compile_seconds"] == pytest.approx(1.99)


def test_many_policies_is_judged_on_whole_processes_at_k_100(measurements):
    default = 505_193  # the default data's steps
    target = _document(measurements, 100, default)["targets"]["many_policies"]
    assert target["value"] == pytest.approx(3.0) and target["met"] is True
    measurements["many_processes"]["warm_cache_ratio"] = 3.5  # the kernel alone stays 3x
    target = _document(measurements, 100, default)["targets"]["many_policies"]
    assert target["value"] == pytest.approx(3.5) and target["met"] is False
    # on little data a process is mostly its start-up: 2.5x was "met" where one pass cost 34x
    target = _document(measurements, 100, 20_000)["targets"]["many_policies"]
    assert target["met"] is None and "not judged: measured on 20,000 steps" in target["note"]
    measurements["many_processes"] = None  # --no-processes
    target = _document(measurements)["targets"]["many_policies"]
    assert target["value"] is None and target["met"] is None
    assert "not measured" in target["note"]


def test_kernel_ratio_counts_only_where_the_twin_agrees(measurements):
    """The kernel/twin ratio of a twin that computed other estimates is void."""
    measurements["numpy"]["estimates"] = {**ESTIMATES, "wis": 0.5 * (1 + 1e-4)}
    target = _document(measurements)["targets"]["kernel_vs_numpy"]
    assert target["met"] is None and target["value"] is None and "void" in target["note"]


def test_shapes_beyond_the_catalogue_fail_the_target(measurements):
    """The value was the catalogue's size, a check that could not fail: batches walked in
    a shape outside it count."""
    measurements["processes"] = _processes()
    padded = 1200
    bucketer = SimpleNamespace(real_steps=1000, padded_steps=padded, shapes={(8, 64)})
    shapes = [(1024, 8), (8, 64)]
    result = SimpleNamespace(runtime=SimpleNamespace(compiles=2, batch_shapes=shapes))
    document = summary(BenchConfig(policies=3), measurements, result, bucketer, "float64")
    target = document["targets"]["shapes_per_configuration"]
    assert target["value"] == 5 and target["met"] is False
    assert "and 1 beyond it: [(8, 64)]" in target["note"]


def test_padding_within_the_threshold_where_measured_is_not_judged(measurements):
    """Below 10% on the runs measured, with a distribution not measured: no verdict."""
    document = _document(measurements, real_steps=1000)
    measurements["kernel"]["padded_steps"] = 1050
    document = summary(
        BenchConfig(policies=3),
        measurements,
        SimpleNamespace(runtime=SimpleNamespace(compiles=2, batch_shapes=[(1024, 8)])),
        SimpleNamespace(real_steps=1000, padded_steps=1050, shapes={(1024, 8)}),
        "float64",
    )
    target = document["targets"]["padding_waste"]
    assert target["value"] == pytest.approx(0.05) and target["met"] is None
    assert target["note"].startswith("not judged: not measured on one-step episodes")


def test_memory_growth_is_judged_at_the_target_s_sizes_only(measurements):
    """From 200,000 steps (the default) the reader's allocator is still warming up; the
    target is defined from 2M to 20M steps, and the ratio said "not met" without saying
    it was measured at other sizes."""
    measurements["memory"] = {
        "1x": {"steps": 200_000, "padded_steps": 210_000},
        "one_episode": {"steps": 2_000_000, "padded_steps": 2_100_000, "longest": 1_800_000},
        "growth": 1.5,
        "one_episode_ratio": 1.0,
    }
    target = _document(measurements)["targets"]["memory_growth"]
    assert target["met"] is None and target["value"] == pytest.approx(1.5)
    assert target["note"].startswith("not judged: measured from 200,000 steps")
    measurements["memory"]["1x"]["steps"] = 198_958  # as generated: the note says these
    target = _document(measurements)["targets"]["memory_growth"]
    assert target["note"].startswith("not judged: measured from 198,958 steps")
    config = BenchConfig(policies=3, memory=True, memory_steps=2_000_000)
    result = SimpleNamespace(runtime=SimpleNamespace(compiles=2, batch_shapes=[(1024, 8)]))
    bucketer = SimpleNamespace(real_steps=1000, padded_steps=1200, shapes={(1024, 8)})
    target = summary(config, measurements, result, bucketer, "float64")["targets"]["memory_growth"]
    assert target["met"] is False


def test_padding_is_judged_on_every_run_that_reports_it(measurements):
    """SPEC 6: <= 10% on skewed lengths, one-step bandit logs and one very long episode:
    the largest of the bench data's, the bandit log's and the memory runs' waste."""
    measurements["processes"] = _processes()
    measurements["memory"] = {
        "1x": {"steps": 1000, "padded_steps": 1050},
        "one_episode": {"steps": 1000, "padded_steps": 1500, "longest": 900},
        "growth": 1.0,
        "one_episode_ratio": 1.0,
    }
    document = _document(measurements)
    # a 900-step "long" episode is not SPEC's millions: not measured on one, but the bench
    # data's 20% is over 10% already (it said "not judged")
    target = document["targets"]["padding_waste"]
    assert target["value"] == pytest.approx(0.5) and target["met"] is False
    assert target["note"].startswith("not measured on one very long episode")
    # --memory was given, its episode too short: the note says that, not "(--memory)"
    # (its long episode is the 10x data's steps less the 1x data's: about 9 times
    # --memory-steps, so 100,000 gave 900,000; 1,000,000 / 9 with room for the sizes' spread)
    assert (
        "(the --memory run's has under 1,000,000 steps: --memory-steps 120,000 or more)"
        in (target["note"])
    )
    one = document["targets"]["memory_one_episode"]
    assert one["met"] is None and "the long episode has 900 steps" in one["note"]
    measurements["memory"]["one_episode"]["longest"] = 1_800_000
    document = _document(measurements)
    # beside the 1x data's steps (as generated, not as asked), as memory_growth (it was
    # judged met)
    one = document["targets"]["memory_one_episode"]
    assert one["met"] is None and "beside 1,000 steps of 1x data" in one["note"], one
    config = BenchConfig(policies=3, memory=True, memory_steps=2_000_000)
    result = SimpleNamespace(runtime=SimpleNamespace(compiles=2, batch_shapes=[(1024, 8)]))
    bucketer = SimpleNamespace(real_steps=1000, padded_steps=1200, shapes={(1024, 8)})
    judged = summary(config, measurements, result, bucketer, "float64")["targets"]
    assert judged["memory_one_episode"]["met"] is True
    target = document["targets"]["padding_waste"]
    assert target["value"] == pytest.approx(0.5) and target["met"] is False
    assert "memory one_episode 50.0%" in target["note"] and "bandit log 2.4%" in target["note"]
    assert document["padding"]["by_data"]["bench data"] == pytest.approx(0.2)
    # the other dataset's (uniform lengths) padding counts too: it was measured, then left out
    other = measurements["processes"]["other_lengths_warm_cache"]
    other.update(padded_steps=1328, real_steps=1000)
    document = _document(measurements)
    assert document["padding"]["by_data"]["uniform lengths"] == pytest.approx(0.328)
    assert "uniform lengths 32.8%" in document["targets"]["padding_waste"]["note"]


def test_relative_difference_is_none_when_an_estimate_is_missing():
    assert relative_difference({"is": None}, {"is": 1.0}) is None
    assert relative_difference({"is": 2.0}, {"is": 1.0}) == 1.0


def test_render_and_json(measurements):
    from rich.console import Console

    document = {
        "dataset": {"steps": 1000, "episodes": 20, "lengths": {"median": 40, "p99": 90, "max": 99}},
        "runtime": {
            "backend": "cpu",
            "devices": 1,
            "precision": "float64",
            "cpus": 2,
            "load_average": {"start": 1.0, "end": 2.0},
        },
        "batching": {"batches": 3, "batch_steps": 4096, "shapes": [[8, 64]]},
        **_document(measurements),
    }
    document["measurements"]["loop"]["extrapolated_seconds"] = 100.0
    console = Console(record=True, width=160)
    render_bench(document, console)
    text = console.export_text()
    for expected in ("python loop", "numpy twin", "jitted kernel", "I/O floor", "padding waste"):
        assert expected in text
    document["ratios"]["kernel_over_loop"] = math.inf
    assert json.loads(to_json(document))["ratios"]["kernel_over_loop"] is None


def _processes(compile_seconds=2.5, other_compilations=0, bandit_seconds=1.3):
    def run(seconds, compilations=0, cache_hits=5, compile_s=0.1):
        return dict(
            seconds=seconds,
            compilations=compilations,
            compile_seconds=compile_s,
            cache_hits=cache_hits,
            batch_shapes=[[16, 64]],
        )

    return {
        "import_jax_floor_seconds": 1.0,
        "import_floor_seconds": 1.1,
        "pyarrow_read_seconds": 0.5,
        "import_pyarrow_floor_seconds": 0.3,
        "evaluate_cold_cache": run(6.0, compilations=7, cache_hits=0, compile_s=compile_seconds),
        "evaluate_cold_cache_q": run(7.0, compilations=9, cache_hits=0, compile_s=4.0),
        "evaluate_warm_cache": run(1.5),
        "other_lengths_warm_cache": {**run(1.4, compilations=other_compilations), "steps": 9},
        "bandit_warm_cache": {
            **run(bandit_seconds),
            "steps": 10_000,
            "padded_steps": 10_240,
            "real_steps": 10_000,
        },
        "bandit_over_floor_seconds": bandit_seconds - 1.0,
        "evaluate_over_pyarrow": 3.0,
        "method": "wall time",
    }


def test_process_targets(measurements):
    measurements["processes"] = _processes()
    targets = _document(measurements, real_steps=5_000_000)["targets"]
    assert targets["first_run_compile_seconds"]["met"] is True
    assert targets["first_run_compile_seconds_q"]["met"] is True  # 4 s <= 5 s
    assert targets["other_data_compilations_warm_cache"]["met"] is True
    assert targets["small_data_over_import_jax_floor"]["value"] == pytest.approx(0.3)
    assert targets["small_data_over_import_jax_floor"]["met"] is True
    assert targets["process_vs_pyarrow"]["met"] is False
    # defined on ~5M steps: on less data it is shown, not judged
    small = _document(measurements, real_steps=500_000)["targets"]["process_vs_pyarrow"]
    assert small["value"] == pytest.approx(3.0) and small["met"] is None
    assert "not judged: measured on 500,000 steps" in small["note"]
    measurements["processes"] = _processes(4.0, other_compilations=2, bandit_seconds=1.7)
    targets = _document(measurements)["targets"]
    assert targets["first_run_compile_seconds"]["met"] is False
    assert targets["other_data_compilations_warm_cache"]["met"] is False
    assert targets["other_data_compilations_warm_cache"]["value"] == 2
    assert targets["small_data_over_import_jax_floor"]["met"] is False
    # the bandit log's first run and the NumPy-script runs are other data on the warm cache
    measurements["processes"] = _processes()
    measurements["processes"]["other_lengths_warm_cache"]["bandit_compilations"] = 1
    measurements["script"] = _script()
    measurements["script"]["sizes"]["10000000"]["evaluate"]["compilations"] = 2
    other = _document(measurements)["targets"]["other_data_compilations_warm_cache"]
    assert other["value"] == 3 and other["met"] is False


def test_process_targets_say_when_no_bytecode_was_cached(measurements):
    measurements["processes"] = _processes()
    targets = _document(measurements)["targets"]
    assert "note" not in targets["small_data_over_import_jax_floor"]
    measurements["processes"]["bytecode_cached"] = False
    targets = _document(measurements)["targets"]
    for name in ("small_data_over_import_jax_floor", "process_vs_pyarrow"):
        assert "without cached bytecode" in targets[name]["note"]
    assert "note" not in targets["first_run_compile_seconds"]


def test_a_process_ratio_within_the_noise_is_not_judged(measurements):
    measurements["processes"] = {**_processes(), "evaluate_over_pyarrow": None}
    target = _document(measurements)["targets"]["process_vs_pyarrow"]
    assert target["met"] is None and target["value"] is None
    assert "noise" in target["note"]


def test_process_targets_unmeasured_say_how(measurements):
    targets = _document(measurements)["targets"]
    assert targets["first_run_compile_seconds"]["met"] is None
    assert "--no-processes" in targets["first_run_compile_seconds"]["note"]


def test_every_threshold_comes_from_the_one_table(measurements):
    measurements["processes"] = _processes()
    targets = _document(measurements)["targets"]
    assert list(targets) == [name for name in TARGETS if name in targets]
    assert set(targets) == set(TARGETS)
    for name, target in targets.items():
        assert target["threshold"] == TARGETS[name].threshold
        assert target["source"] == TARGETS[name].source


def _rendered(measurements) -> str:
    """The bench tables of a document around ``measurements``, as plain text."""
    from rich.console import Console

    document = {
        "dataset": {"steps": 1000, "episodes": 20, "lengths": {"median": 40, "p99": 90, "max": 99}},
        "runtime": {
            "backend": "cpu",
            "devices": 1,
            "precision": "float64",
            "cpus": 2,
            "load_average": {"start": None, "end": None},
        },
        "batching": {"batches": 3, "batch_steps": 4096, "shapes": [[8, 64]]},
        **_document(measurements),
    }
    console = Console(record=True, width=300)
    render_bench(document, console)
    return console.export_text()


def test_the_targets_table_says_which_targets_are_an_earlier_issue_s(measurements):
    """The table was titled "targets (SPEC section 6)" and dropped the JSON's source, so
    kernel vs loop >= 1000 read as a SPEC target."""
    lines = _rendered(measurements).splitlines()
    (loop,) = [line for line in lines if "kernel vs loop" in line]
    assert "(earlier issue)" in loop
    (numpy,) = [line for line in lines if "kernel vs numpy" in line]
    assert "earlier issue" not in numpy


def test_render_shows_processes(measurements):
    measurements["processes"] = _processes()
    text = _rendered(measurements)
    assert "import jax floor" in text and "bandit log" in text and "7 compilations" in text


def _script(small_ratio=0.9, large_ratio=0.6, steps=(3_000_000, 10_000_000), difference=1e-12):
    def size(n, ratio):
        return {
            "steps": n + 17,
            "script": {"seconds": 2.0, "peak_rss_mib": 900.0},
            "evaluate": {"seconds": 2.0 * ratio, "peak_rss_mib": 600.0, "compilations": 0},
            "evaluate_over_script": ratio,
            "estimates_relative_difference": difference,
            "estimates_agree": difference <= 1e-6,
        }

    return {
        "sizes": {
            str(n): size(n, r) for n, r in zip(steps, (small_ratio, large_ratio), strict=True)
        },
        "method": "wall time",
    }


def test_numpy_script_targets(measurements):
    targets = _document(measurements)["targets"]  # not asked for: --script says how
    for name in ("numpy_script_3m", "numpy_script_10m"):
        assert targets[name]["met"] is None and "ope bench --script" in targets[name]["note"]
    measurements["script"] = _script()
    targets = _document(measurements)["targets"]
    assert targets["numpy_script_3m"]["met"] is True  # 0.9 <= 1: no slower at 3M
    assert targets["numpy_script_10m"]["met"] is False  # 0.6 > 0.5: not twice as fast at 10M
    assert targets["numpy_script_10m"]["value"] == pytest.approx(0.6)
    # the data they are measured on, which is not the issue's fixed horizon of 200
    assert targets["numpy_script_3m"]["note"] == (
        "on the bench's long-tailed episode lengths, not a fixed horizon of 200"
    )


def test_numpy_script_targets_at_other_sizes_say_so(measurements):
    measurements["script"] = _script(steps=(2000, 6000))
    document = summary(
        BenchConfig(policies=3, script_steps=(2000, 6000)),
        measurements,
        SimpleNamespace(runtime=SimpleNamespace(compiles=2, batch_shapes=[(8, 64)])),
        SimpleNamespace(real_steps=1000, padded_steps=1200, shapes={(8, 64)}),
        "float64",
    )
    target = document["targets"]["numpy_script_10m"]
    assert (
        "not judged: measured at 6,017 steps" in target["note"] and "10,000,000" in target["note"]
    )
    assert target["met"] is None and target["value"] == pytest.approx(0.6)  # shown, not judged


def test_numpy_script_whose_estimates_differ_is_not_judged(measurements):
    measurements["script"] = _script(large_ratio=0.3, difference=1e-3)  # fast, but other work
    target = _document(measurements)["targets"]["numpy_script_10m"]
    assert target["met"] is None and target["value"] is None
    assert "void" in target["note"] and "0.001" in target["note"]


def test_render_shows_the_numpy_script(measurements):
    measurements["script"] = _script()
    text = _rendered(measurements)
    assert "numpy script: 3,000,017 steps: script 2.000 s (900 MiB)" in text
    assert "10,000,017 steps" in text


@pytest.mark.parametrize("steps", [(5, 5), (10, 3), (0, 4)])
def test_script_sizes_must_be_a_small_and_a_larger_one(steps):
    from ope_cli.bench.run import bench
    from ope_cli.errors import UsageError

    with pytest.raises(UsageError, match="--script-steps"):  # before any data is generated
        bench(BenchConfig(script=True, script_steps=steps))


def test_script_agreement_is_relative_to_the_largest_estimate():
    from ope_cli.bench.script import largest_difference

    theirs = {"is": 2.0, "wis": 1.0, "pdis": 1e-17, "wpdis": -0.5}
    ours = {**theirs, "pdis": 3e-17, "wis": 1.0 + 1e-12}  # rounding around a value near 0
    assert largest_difference(ours, theirs) == pytest.approx(0.5e-12)
    assert largest_difference({**ours, "is": None}, theirs) is None
    assert largest_difference({**theirs, "wpdis": 0.5}, theirs) == pytest.approx(0.5)


@pytest.mark.parametrize(
    ("config", "words"),
    [
        (BenchConfig(script_steps=(1000, 4000)), "--script-steps applies to --script only"),
        (BenchConfig(memory_steps=5000), "--memory-steps applies to --memory only"),
        (BenchConfig(data="x.parquet", episodes=100), "--episodes sizes generated data"),
    ],
)
def test_sizes_of_measurements_not_asked_for_are_refused(config, words):
    """They changed nothing: no script or memory measurement was run."""
    from ope_cli.bench.run import bench
    from ope_cli.errors import UsageError

    with pytest.raises(UsageError, match=words):  # before any data is generated
        bench(config)


@pytest.mark.parametrize(
    ("config", "words"),
    [
        (BenchConfig(seed=-1), "--seed must be an integer from 0 to 2^63 - 1, got -1"),
        (BenchConfig(episodes=10**20), "--episodes must be at most 4,294,967,296"),
    ],
)
def test_seeds_and_episodes_out_of_range_are_usage_errors(config, words):
    """NumPy's "expected non-negative integer" and "Maximum allowed dimension exceeded"
    came out as internal errors (exit 1); generate refuses the same values."""
    from ope_cli.bench.run import bench
    from ope_cli.errors import UsageError

    with pytest.raises(UsageError, match=re.escape(words)):
        bench(config)


def test_out_naming_a_file_is_a_usage_error(tmp_path):
    """mkdir's FileExistsError was reported as an internal error (exit 1)."""
    from ope_cli.bench.run import bench
    from ope_cli.errors import UsageError

    (tmp_path / "afile").write_text("")
    with pytest.raises(UsageError, match="--out .*afile: a file, where a directory is wanted"):
        bench(BenchConfig(out=str(tmp_path / "afile")))
    # a directory under a file: NotADirectoryError was an internal error too
    with pytest.raises(UsageError, match="--out .*afile/sub: cannot make the directory"):
        bench(BenchConfig(out=str(tmp_path / "afile" / "sub")))
    # "" wrote the generated data and caches into the working directory
    with pytest.raises(UsageError, match="--out needs a directory; an empty path names none"):
        bench(BenchConfig(out=""))


def test_a_q_fit_that_could_not_run_is_not_judged_and_says_why(measurements):
    """--data of one episode cannot be cross-fitted: the bench stopped with a usage error
    from its own --q fit:linear run, which no option of it can change. It is left out."""
    why = "not measured: cross-fitting over 2 folds: every one of the 1 episode(s) falls in"
    measurements["end_to_end_q_fit"] = {"seconds": None, "note": why}
    target = _document(measurements)["targets"]["q_fit_vs_logged"]
    assert target["met"] is None and target["value"] is None and target["note"] == why
    assert "q fit vs logged" in _rendered(measurements)


def test_the_empty_cache_runs_start_from_an_empty_cache(tmp_path):
    """A second bench with the same --out found the first one's kernels in its "empty"
    caches: 0 compilations, 0.0 s, judged met. Each cache is emptied before its run."""
    from ope_cli.bench.processes import emptied

    cache = tmp_path / "process-cache"
    (cache / "kernels").mkdir(parents=True)
    (cache / "kernels" / "kept.bin").write_bytes(b"x")
    assert emptied(cache) == str(cache) and not cache.exists()
    assert emptied(cache) == str(cache)  # nothing there: nothing to do


def test_a_target_value_is_never_rounded_onto_its_threshold(measurements):
    """The table showed values to 3 significant digits: 999.6 as "1e+03" beside ">= 1000
    ... no", 3.0004 as "3" beside "<= 3 ... no". The loop that ran on every episode shows
    its own time, not "-" (it is not extrapolated)."""
    measurements["kernel"]["steps_per_second"] = 9_996.0  # / the loop's 10 steps/s: 999.6
    text = " ".join(_rendered(measurements).split())
    assert "kernel vs loop (earlier issue) │ 999.6 │ >= 1000" in text, text
    measurements["loop"].update(extrapolated=False, extrapolated_seconds=None, seconds=0.21)
    assert "python loop (studies/is_loop.py) │ 10 │ 0.210 s │" in " ".join(
        _rendered(measurements).split()
    )


def test_a_float32_kernel_against_the_float64_twin_says_so(measurements):
    """Under --precision float32 (the accelerators' default) kernel_vs_numpy timed a
    float32 kernel against the float64 twin, with no word; the note says so and gives the
    float64 kernel's ratio."""
    assert "note" not in _document(measurements)["targets"]["kernel_vs_numpy"]
    measurements["kernel"]["precision"] = "float32"
    float32 = measurements.pop("kernel_float32")
    measurements["kernel_float64"] = _timing(0.1, estimates=float32["estimates"])
    target = _document(measurements, precision="float32")["targets"]["kernel_vs_numpy"]
    assert target["note"].startswith("a float32 kernel against the float64 twin")
    assert target["note"].endswith("the float64 kernel: 5"), target
