"""From measurements to ``ope bench``'s summary: ratios, padding, compiles, policies, precision
and the targets of SPEC section 6 (met, value, threshold)."""

from __future__ import annotations

import numpy as np

from ope_cli.bench.config import MEMORY_FACTOR, BenchConfig
from ope_cli.bench.measure import ratio
from ope_cli.buckets import Bucketer

# SPEC section 6.
TARGET_LOOP_SPEEDUP = 1000.0
TARGET_END_TO_END_OVER_IO = 1.5
TARGET_PADDING_WASTE = 0.25
TARGET_MEMORY_GROWTH = 1.2
TARGET_FIRST_RUN_COMPILE_SECONDS = 3.0
TARGET_COLD_START_OVER_FLOOR_SECONDS = 0.5
TARGET_PROCESS_OVER_PYARROW = 2.0
TARGET_BEHAVIOR_OVER_LOGGED = 1.3
TARGET_DOUBLY_ROBUST_KERNEL = 1.5  # the kernel with dm, dr, wdr / the four IS estimators
TARGET_Q_FIT_OVER_LOGGED = 3.0  # ope evaluate --q fit:linear / without Q, end to end


def relative_difference(a: dict, b: dict) -> float | None:
    """max over estimators of |a - b| / |b| (None when an estimate is missing)."""
    differences = []
    for name, reference in b.items():
        value = a.get(name)
        if value is None or reference is None:
            return None
        differences.append(abs(value - reference) / max(abs(reference), 1e-300))
    return max(differences) if differences else None


def quantiles(lengths: np.ndarray) -> dict:
    """Median, p90, p99, max, mean of [E] episode lengths, and how many reach 1,000 steps."""
    return {
        "median": float(np.median(lengths)),
        "p90": float(np.quantile(lengths, 0.9)),
        "p99": float(np.quantile(lengths, 0.99)),
        "max": int(lengths.max()),
        "mean": float(lengths.mean()),
        "at_least_1000": int(np.count_nonzero(lengths >= 1000)),
    }


def _target(met: bool | None, value: float | int | None, threshold: str, note: str | None = None):
    entry = {"met": met, "value": value, "threshold": threshold}
    if note:
        entry["note"] = note
    return entry


def _at_most(value: float | None, limit: float) -> bool | None:
    return None if value is None else value <= limit


def _ratios(m: dict) -> dict:
    kernel, numpy_run, loop = m["kernel"], m["numpy"], m["loop"]
    e2e, io_floor = m["end_to_end"], m["io_floor"]
    return {
        "kernel_over_numpy": ratio(kernel["steps_per_second"], numpy_run["steps_per_second"]),
        "kernel_over_loop": ratio(kernel["steps_per_second"], loop["steps_per_second"]),
        "end_to_end_over_io_floor": ratio(e2e["seconds"], io_floor["seconds"]),
        "behavior_checkpoint_over_logged": ratio(
            m["end_to_end_behavior"]["seconds"], e2e["seconds"]
        ),
        "behavior_estimate_over_logged": ratio(m["end_to_end_estimate"]["seconds"], e2e["seconds"]),
        "kernel_over_end_to_end": ratio(kernel["steps_per_second"], e2e["steps_per_second"]),
        "doubly_robust_kernel_over_kernel": ratio(m["kernel_dr"]["seconds"], kernel["seconds"]),
        "q_fit_over_logged": ratio(m["end_to_end_q_fit"]["seconds"], e2e["seconds"]),
    }


def _precisions(m: dict, precision: str) -> dict:
    other = "float32" if precision == "float64" else "float64"
    kernels = {precision: m["kernel"], other: m[f"kernel_{other}"]}
    precisions = {
        name: {
            "steps_per_second": run["steps_per_second"],
            "seconds": run["seconds"],
            "estimates": run["estimates"],
        }
        for name, run in sorted(kernels.items())
    }
    precisions["numpy_float64"] = {"estimates": m["numpy"]["estimates"]}
    precisions["max_relative_difference"] = relative_difference(
        kernels["float32"]["estimates"], kernels["float64"]["estimates"]
    )
    precisions["numpy_vs_kernel_max_relative_difference"] = relative_difference(
        m["numpy"]["estimates"], kernels["float64"]["estimates"]
    )
    return precisions


def _policies(m: dict, k: int) -> dict:
    policies = {"k": k}
    if k > 1:
        kernel, e2e = m["kernel"], m["end_to_end"]
        many, e2e_many = m["kernel_many"], m["end_to_end_many"]
        policies.update(
            steps_per_second_1=kernel["steps_per_second"],
            steps_per_second_k=many["steps_per_second"],
            cost_ratio=ratio(many["seconds"], kernel["seconds"]),
            cost_per_policy=ratio(many["seconds"], kernel["seconds"] * k),
            compiles=many["compiles"],
            end_to_end_seconds_1=e2e["seconds"],
            end_to_end_seconds_k=e2e_many["seconds"],
            end_to_end_cost_ratio=ratio(e2e_many["seconds"], e2e["seconds"]),
        )
    return policies


def _process_targets(processes: dict | None) -> dict:
    """The targets on whole processes (issue: fast the first time), when measured."""
    if processes is None:
        note = "not measured; run `ope bench` without --no-processes"
        return {
            name: _target(None, None, threshold, note)
            for name, threshold in (
                ("first_run_compile_seconds", f"<= {TARGET_FIRST_RUN_COMPILE_SECONDS:g} s"),
                ("other_data_compilations_warm_cache", "0"),
                ("bandit_over_import_jax_floor", "<= 0.5 s"),
                ("process_vs_pyarrow_process", f"<= {TARGET_PROCESS_OVER_PYARROW:g}"),
            )
        }
    cold, other = processes["evaluate_cold_cache"], processes["other_lengths_warm_cache"]
    over_floor, over_pyarrow = (
        processes["bandit_over_floor_seconds"],
        processes["evaluate_over_pyarrow"],
    )
    return {
        "first_run_compile_seconds": _target(
            _at_most(cold["compile_seconds"], TARGET_FIRST_RUN_COMPILE_SECONDS),
            cold["compile_seconds"],
            f"<= {TARGET_FIRST_RUN_COMPILE_SECONDS:g} s (XLA compile time, empty cache)",
        ),
        "other_data_compilations_warm_cache": _target(
            other["compilations"] == 0,
            other["compilations"],
            "0 (XLA compilations for a dataset with other lengths, warm cache)",
        ),
        "bandit_over_import_jax_floor": _target(
            _at_most(over_floor, TARGET_COLD_START_OVER_FLOOR_SECONDS),
            over_floor,
            f"<= {TARGET_COLD_START_OVER_FLOOR_SECONDS:g} s (10,000-step bandit log, warm cache)",
        ),
        "process_vs_pyarrow_process": _target(
            _at_most(over_pyarrow, TARGET_PROCESS_OVER_PYARROW),
            over_pyarrow,
            f"<= {TARGET_PROCESS_OVER_PYARROW:g} (ope evaluate, warm cache / pyarrow read)",
        ),
    }


def _targets(ratios: dict, waste: float | None, compiles: dict, result, memory) -> dict:
    over_numpy, over_loop = ratios["kernel_over_numpy"], ratios["kernel_over_loop"]
    over_io = ratios["end_to_end_over_io_floor"]
    growth = None if memory is None else memory["growth"]
    shapes_used = len(result.batch_shapes)
    return {
        "kernel_faster_than_numpy": _target(
            None if over_numpy is None else over_numpy > 1, over_numpy, "> 1 (steps/s ratio)"
        ),
        "kernel_vs_loop": _target(
            None if over_loop is None else over_loop >= TARGET_LOOP_SPEEDUP,
            over_loop,
            f">= {TARGET_LOOP_SPEEDUP:g} (steps/s ratio)",
        ),
        "end_to_end_vs_io_floor": _target(
            _at_most(over_io, TARGET_END_TO_END_OVER_IO),
            over_io,
            f"<= {TARGET_END_TO_END_OVER_IO} (time ratio)",
        ),
        "padding_waste": _target(
            _at_most(waste, TARGET_PADDING_WASTE),
            waste,
            f"<= {TARGET_PADDING_WASTE} ((padded - real) / real steps)",
        ),
        "compiles_per_shape": _target(
            result.compiles <= shapes_used and compiles["kernel"] <= compiles["bucket_shapes"],
            result.compiles,
            f"<= {shapes_used} (bucket shapes used)",
        ),
        "behavior_checkpoint_vs_logged": _target(
            _at_most(ratios["behavior_checkpoint_over_logged"], TARGET_BEHAVIOR_OVER_LOGGED),
            ratios["behavior_checkpoint_over_logged"],
            f"<= {TARGET_BEHAVIOR_OVER_LOGGED} (time ratio, --behavior CKPT / logged column)",
        ),
        "doubly_robust_kernel": _target(
            _at_most(ratios["doubly_robust_kernel_over_kernel"], TARGET_DOUBLY_ROBUST_KERNEL),
            ratios["doubly_robust_kernel_over_kernel"],
            f"<= {TARGET_DOUBLY_ROBUST_KERNEL} (kernel time with a linear_q Q source, adding "
            "dm, dr and wdr / the four IS estimators)",
        ),
        "q_fit_vs_logged": _target(
            _at_most(ratios["q_fit_over_logged"], TARGET_Q_FIT_OVER_LOGGED),
            ratios["q_fit_over_logged"],
            f"<= {TARGET_Q_FIT_OVER_LOGGED} (time ratio, ope evaluate --q fit:linear / "
            "without Q, end to end)",
        ),
        "memory_growth": _target(
            _at_most(growth, TARGET_MEMORY_GROWTH),
            growth,
            f"<= {TARGET_MEMORY_GROWTH} (peak RSS, {MEMORY_FACTOR}x data / 1x)",
            None if memory is not None else "not measured; run `ope bench --memory`",
        ),
    }


def summary(config: BenchConfig, m: dict, result, bucketer: Bucketer, precision: str) -> dict:
    """Measurements, ratios, padding, compiles, policies, precision and targets.

    ``m`` maps measurement names to their timings; ``result`` is the first ``ope evaluate``
    EvaluationResult (its compiles and bucket shapes).
    """
    e2e, kernel = m["end_to_end"], m["kernel"]
    for entry in (e2e, kernel):
        entry["compile_seconds"] = max(entry["first_run_seconds"] - entry["seconds"], 0.0)
    waste = ratio(bucketer.padded_steps - bucketer.real_steps, bucketer.real_steps)
    padding = {
        "real_steps": bucketer.real_steps,
        "padded_steps": bucketer.padded_steps,
        "ratio": ratio(bucketer.padded_steps, bucketer.real_steps),
        "waste": waste,
    }
    compiles = {
        "end_to_end": result.compiles,
        "end_to_end_seconds": e2e["compile_seconds"],
        "kernel": kernel["compiles"],
        "kernel_seconds": kernel["compile_seconds"],
        "bucket_shapes": len(bucketer.shapes),
        "persistent_cache": "off (cold compiles, measured the same way every run)",
    }
    ratios = _ratios(m)
    return {
        "measurements": {
            "loop": m["loop"],
            "numpy": {k: v for k, v in m["numpy"].items() if k != "estimates"},
            "kernel": {k: v for k, v in kernel.items() if k != "estimates"},
            "end_to_end": e2e,
            "end_to_end_behavior": m["end_to_end_behavior"],
            "end_to_end_estimate": m["end_to_end_estimate"],
            "end_to_end_q_fit": m["end_to_end_q_fit"],
            "kernel_dr": {k: v for k, v in m["kernel_dr"].items() if k != "estimates"},
            "io_floor": m["io_floor"],
        },
        "ratios": ratios,
        "compiles": compiles,
        "padding": padding,
        "policies": _policies(m, config.policies),
        "precision": _precisions(m, precision),
        "memory": m["memory"],
        "processes": m.get("processes"),
        "targets": {
            **_targets(ratios, waste, compiles, result, m["memory"]),
            **_process_targets(m.get("processes")),
        },
    }
