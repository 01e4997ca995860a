"""The ``ope bench`` typer command: options -> BenchConfig -> ``bench`` -> table or JSON.

Heavy imports (NumPy, pyarrow, JAX) happen inside the command so that ``ope --help`` stays
instant.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from ope_cli.bench.config import (
    DEFAULT_EPISODES,
    DEFAULT_LOOP_EPISODES,
    DEFAULT_MEMORY_STEPS,
    MEMORY_FACTOR,
    ROUNDS,
    SCRIPT_STEPS,
    BenchConfig,
)
from ope_cli.cli.console import stderr_console, table_console
from ope_cli.cli.groups import BATCHING, TABLE_OR_JSON
from ope_cli.cli.options import InspectFormat as TableOrJson
from ope_cli.cli.options import PrecisionOption, Quiet, option_groups, options_group
from ope_cli.config import BatchingConfig

BENCH_WIDTH = 140  # columns of the bench table off a terminal

BenchData = Annotated[
    str | None,
    typer.Option(help="Step-layout Parquet data to measure instead of generated data."),
]
Episodes = Annotated[
    int,
    typer.Option(
        help="Episodes to generate (long-tailed lengths, ~83 steps each; 6,000: about a "
        "minute; 24,000: the 2M-step study of the README).",
    ),
]
Seed = Annotated[int, typer.Option(help="Seed of the generated data and policies.")]
Policies = Annotated[
    int,
    typer.Option(
        help="K linear_softmax checkpoints: whole ope evaluate processes with K policies "
        "beside one (the many_policies target; SPEC: K = 100, a few minutes), and the "
        "kernel alone with K stacked."
    ),
]
BenchPrecision = Annotated[
    PrecisionOption | None,
    typer.Option(help="Kernel precision of the main measurements. Default: as ope evaluate."),
]
Memory = Annotated[
    bool,
    typer.Option(
        "--memory",
        help=f"Also measure peak memory of ope evaluate on 1x and {MEMORY_FACTOR}x data, and "
        f"on as many steps as the {MEMORY_FACTOR}x data in one long episode among short ones.",
    ),
]
MemorySteps = Annotated[int, typer.Option(help="Steps of the 1x dataset of --memory.")]
Script = Annotated[
    bool,
    typer.Option(
        "--script",
        help="Also time whole ope evaluate processes against a plain NumPy script that reads "
        "the file and computes the four IS estimates, on generated data of --script-steps "
        "steps (SPEC: 3M and 10M; a few minutes).",
    ),
]
ScriptSteps = Annotated[
    tuple[int, int],
    typer.Option(metavar="SMALL LARGE", help="The two dataset sizes of --script, in steps."),
]
LoopEpisodes = Annotated[
    int, typer.Option(help="Episodes the Python loop runs on (its speed is extrapolated).")
]
Out = Annotated[
    str | None,
    typer.Option(
        help="Keep generated files in this directory (made if missing; files of the names "
        "bench writes there, bench.parquet and its checkpoints, are replaced). Default: a "
        "temporary one."
    ),
]
Rounds = Annotated[
    int,
    typer.Option(
        help="Timed runs of every measurement, in process and of whole warm processes; "
        "the fastest counts (1: quickest, noisiest).",
    ),
]
Processes = Annotated[
    bool,
    typer.Option(
        help="Also time whole ope evaluate processes (empty and warm compilation "
        "cache, other data, the import-jax floor)."
    ),
]


def register(app: typer.Typer) -> None:
    """Adds the ``bench`` command to the ``ope`` app."""
    app.command("bench")(bench_command)


# bench's own options, each run of them one parameter (BenchConfig's fields)
GENERATED = options_group(
    ("episodes", Episodes, DEFAULT_EPISODES), ("seed", Seed, 0), ("policies", Policies, 4)
)
MODES = options_group(
    ("memory", Memory, False),
    ("memory_steps", MemorySteps, DEFAULT_MEMORY_STEPS),
    ("script", Script, False),
    ("script_steps", ScriptSteps, SCRIPT_STEPS),
    ("loop_episodes", LoopEpisodes, DEFAULT_LOOP_EPISODES),
    ("out", Out, None),
)
MEASURING = options_group(("processes", Processes, True), ("rounds", Rounds, ROUNDS))


@option_groups(
    generated=GENERATED, output=TABLE_OR_JSON, modes=MODES, batching=BATCHING, measuring=MEASURING
)
def bench_command(
    *,
    data: BenchData = None,
    generated: dict,  # --episodes, --seed, --policies
    precision: BenchPrecision = None,
    output: TableOrJson,  # --format
    modes: dict,  # --memory ... --loop-episodes, --out
    quiet: Quiet = False,
    batching: BatchingConfig,  # the "Batching" panel
    measuring: dict,  # --processes, --rounds
) -> None:
    """Measure the performance targets: the Python loop, NumPy, the jitted kernel, ope
    evaluate end to end and the pyarrow read floor, on one long-tailed dataset.

    Examples:

      ope bench

      ope bench --format json | jq .targets

      ope bench --memory --policies 8

      ope bench --policies 100

      ope bench --script
    """
    config = BenchConfig(
        data=data,
        **generated,
        precision=precision.value if precision else None,
        **{**modes, "script_steps": tuple(modes["script_steps"])},
        batching=batching,
        **measuring,
    )
    write_bench(run_bench(config, quiet), output)


def run_bench(config: BenchConfig, quiet: bool) -> dict:
    """``bench(config)``, with a status line on stderr when it is a terminal and not quiet."""
    from ope_cli.bench.run import bench

    stderr = stderr_console()
    if quiet or not stderr.is_terminal:
        return bench(config)
    with stderr.status("ope bench") as status:
        return bench(config, on_progress=lambda text: status.update(f"ope bench: {text}"))


def write_bench(result: dict, chosen: TableOrJson) -> None:
    """The bench result on stdout, as JSON or a table."""
    from ope_cli.report.bench import render_bench, to_json

    if chosen is TableOrJson.json:
        sys.stdout.write(to_json(result) + "\n")
    else:
        render_bench(result, table_console(BENCH_WIDTH))
