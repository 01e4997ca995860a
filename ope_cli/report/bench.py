"""``ope bench``'s result drawn for people (rich tables) or written as one JSON document.

Rendering only: every number comes from the dict ``bench`` returns.
"""

from __future__ import annotations

import json
import math

from rich.console import Console
from rich.table import Table

from ope_cli.bench.summary import TARGETS
from ope_cli.report import formatting


def _si(x: float | None, unit: str = "") -> str:
    return formatting.si(x, unit, missing="-")


def _seconds(x: float | None) -> str:
    return formatting.seconds(x, missing="-")


def _times(x: float | None) -> str:
    return formatting.times(x, missing="-")


def render_bench(result: dict, console: Console) -> None:
    """The bench result as rich tables: measurements, then targets, then the details."""
    console.print(_measurements_table(result))
    console.print(_targets_table(result["targets"]))
    for line in _detail_lines(result):
        console.print(line, highlight=False)


def _measurements_table(result: dict) -> Table:
    data, runtime, m = result["dataset"], result["runtime"], result["measurements"]
    lengths = data["lengths"]
    title = (
        f"ope bench: {data['steps']:,} steps, {data['episodes']:,} episodes (length median "
        f"{lengths['median']:g}, p99 {lengths['p99']:g}, max {lengths['max']:,}); "
        f"{runtime['backend']}, {runtime['devices']} device(s), {runtime['precision']}"
    )
    table = Table(title=title, title_justify="left")
    table.add_column("measurement")
    table.add_column("steps/s", justify="right")
    table.add_column("time", justify="right")
    table.add_column("notes")
    loop, kernel, e2e = m["loop"], m["kernel"], m["end_to_end"]
    if loop.get("extrapolated_seconds"):
        loop_time = f"{_seconds(loop['extrapolated_seconds'])} (extrapolated)"
    else:  # run on every episode: its own time
        loop_time = _seconds(loop["seconds"]) if loop.get("seconds") is not None else "-"
    rows = [
        ("python loop (studies/is_loop.py)", loop, loop_time, loop.get("note", "")),
        (
            "numpy twin, float64",
            m["numpy"],
            _seconds(m["numpy"]["seconds"]),
            "padded batches, log space",
        ),
        (
            f"jitted kernel, {kernel['precision']}",
            kernel,
            _seconds(kernel["seconds"]),
            f"data on the device, steady state; {kernel['compiles']} compiles took "
            f"{_seconds(kernel['compile_seconds'])} more",
        ),
        (
            "ope evaluate, end to end",
            e2e,
            _seconds(e2e["seconds"]),
            f"Parquet -> report, after a compile run of {_seconds(e2e['first_run_seconds'])}",
        ),
        (
            "pyarrow read (I/O floor)",
            m["io_floor"],
            _seconds(m["io_floor"]["seconds"]),
            f"{len(m['io_floor']['columns'])} projected columns to NumPy",
        ),
    ]
    for name, entry, seconds, note in rows:
        table.add_row(name, _si(entry.get("steps_per_second")), seconds, note)
    return table


def _targets_table(targets_by_name: dict) -> Table:
    targets = Table(
        title="targets (SPEC section 6; an earlier issue's where the target says so)",
        title_justify="left",
    )
    for column, justify in (
        ("target", "left"),
        ("value", "right"),
        ("threshold", "left"),
        ("met", "center"),
    ):
        targets.add_column(column, justify=justify)
    for name, target in targets_by_name.items():
        value, limit = target["value"], TARGETS[name].limit if name in TARGETS else None
        # never rounded onto or across the threshold: 999.6 read "1e+03" beside ">= 1000: no"
        shown = (
            f"{value:,}" if isinstance(value, int) else formatting.significant(value, 3, "-", limit)
        )
        met = {True: "[green]yes[/green]", False: "[red]no[/red]", None: "-"}[target["met"]]
        source = target.get("source", "SPEC section 6")
        targets.add_row(
            name.replace("_", " ") + ("" if source.startswith("SPEC") else f" ({source})"),
            shown,
            target["threshold"] + (f" ({target['note']})" if target.get("note") else ""),
            met,
        )
    return targets


def _detail_lines(result: dict) -> list[str]:
    runtime = result["runtime"]
    padding, compiles, policies = result["padding"], result["compiles"], result["policies"]
    precision, batching = result["precision"], result["batching"]
    lines = [
        f"padding: {padding['padded_steps']:,} padded / {padding['real_steps']:,} real steps "
        f"(waste {padding['waste']:.1%}), {batching['batches']} batches walked in windows of "
        f"{batching['batch_steps']:,} cells, {len(batching['shapes'])} window shapes",
        f"compiles: ope evaluate {compiles['end_to_end']} "
        f"({_seconds(compiles['end_to_end_seconds'])}), kernel alone {compiles['kernel']} "
        f"({_seconds(compiles['kernel_seconds'])}), {compiles['window_shapes']} window shapes; "
        f"persistent cache {compiles['persistent_cache']}",
        f"precision: float32 {_si(precision['float32']['steps_per_second'])} steps/s, float64 "
        f"{_si(precision['float64']['steps_per_second'])} steps/s, max relative difference of "
        f"the estimates {_number(precision['max_relative_difference'])}; numpy twin vs float64 "
        f"kernel {_number(precision['numpy_vs_kernel_max_relative_difference'])}",
    ]
    ratios = result["ratios"]
    lines.append(
        f"behavior: --behavior CKPT {_times(ratios.get('behavior_checkpoint_over_logged'))} "
        f"and --behavior estimate:linear_softmax "
        f"{_times(ratios.get('behavior_estimate_over_logged'))} the time of the logged column"
    )
    lines.append(
        f"doubly robust: the kernel with a Q source (dm, dr, wdr too) "
        f"{_times(ratios.get('doubly_robust_kernel_over_kernel'))} the four IS estimators'; "
        f"ope evaluate --q fit:linear {_times(ratios.get('q_fit_over_logged'))} the time "
        "without Q"
    )
    if "cost_ratio" in policies:
        lines.append(
            f"policies: {policies['k']} stacked cost {_times(policies['cost_ratio'])} of one in "
            f"the kernel, {_times(policies['end_to_end_cost_ratio'])} end to end"
        )
    memory = result.get("memory")
    if memory:
        small, large = memory["1x"], memory[f"{memory['factor']}x"]
        lines.append(
            f"memory: peak RSS {small['peak_rss_mib']:,.0f} MiB on {small['steps']:,} steps, "
            f"{large['peak_rss_mib']:,.0f} MiB on {large['steps']:,} steps "
            f"(growth {_times(memory['growth'])}), "
            f"{memory['one_episode']['peak_rss_mib']:,.0f} MiB with one episode of "
            f"{memory['one_episode']['longest']:,} steps ({_times(memory['one_episode_ratio'])})"
        )
    processes = result.get("processes")
    if processes:
        lines.append(_processes_line(processes))
    script = result.get("script")
    if script:
        lines.append(_script_line(script))
    load = runtime["load_average"]
    if load["start"] is not None:
        lines.append(
            f"load average {load['start']:.2f} at the start, {load['end']:.2f} at the "
            f"end, on {runtime['cpus']} CPUs (a busy machine makes timings noisy)"
        )
    return lines


def _processes_line(processes: dict) -> str:
    """The detail line of the whole-process measurements."""
    cold, warm = processes["evaluate_cold_cache"], processes["evaluate_warm_cache"]
    other, bandit = processes["other_lengths_warm_cache"], processes["bandit_warm_cache"]
    return (
        f"processes: import jax floor {_seconds(processes['import_jax_floor_seconds'])} "
        f"(with numpy and pyarrow {_seconds(processes['import_floor_seconds'])}), "
        f"pyarrow read {_seconds(processes['pyarrow_read_seconds'])}; ope evaluate "
        f"{_seconds(cold['seconds'])} with an empty cache ({cold['compilations']} "
        f"compilations, {_seconds(cold['compile_seconds'])}), {_seconds(warm['seconds'])} "
        f"warm; other lengths warm {_seconds(other['seconds'])} "
        f"({other['compilations']} compilations); {bandit['steps']:,}-step bandit log "
        f"{_seconds(bandit['seconds'])} warm"
    )


def _script_line(script: dict) -> str:
    """The detail line of the plain NumPy script against ``ope evaluate``."""
    sizes = [
        f"{size['steps']:,} steps: script {_seconds(size['script']['seconds'])} "
        f"({size['script']['peak_rss_mib']:,.0f} MiB), ope evaluate "
        f"{_seconds(size['evaluate']['seconds'])} ({size['evaluate']['peak_rss_mib']:,.0f} MiB, "
        f"{_times(size['evaluate_over_script'])}), estimates within "
        f"{_number(size['estimates_relative_difference'])}"
        for size in script["sizes"].values()
    ]
    return "numpy script: " + "; ".join(sizes)


def _number(x: float | None) -> str:
    return formatting.scientific(x, missing="-")


def to_json(result: dict) -> str:
    def clean(value):  # NaN/inf are not JSON numbers; the spec's rule: null
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [clean(v) for v in value]
        return value

    return json.dumps(clean(result), indent=2, allow_nan=False)
