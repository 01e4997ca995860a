"""The ``ope`` command line: typer options -> config -> core -> formatter -> exit code.

Heavy imports (jax, the pipeline) happen inside commands so ``ope --help`` is instant.
"""

from __future__ import annotations

import enum
import os
import sys
import threading
import time
import traceback
from typing import Annotated

import typer
from rich.console import Console

from ope_cli import __version__, bench
from ope_cli.config import ESTIMATORS, BatchingConfig, ColumnMapping, EvaluationConfig
from ope_cli.errors import OpeError, UsageError
from ope_cli.estimators import names as estimator_names

app = typer.Typer(
    name="ope",
    help="Offline policy evaluation (IS, WIS, PDIS, WPDIS) over logged Parquet/Arrow episodes.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)
stderr = Console(stderr=True)
_state = {"debug": False}


class OutputFormat(str, enum.Enum):
    table = "table"
    json = "json"
    csv = "csv"


class OnInvalid(str, enum.Enum):
    error = "error"
    drop = "drop"


class PrecisionOption(str, enum.Enum):
    float32 = "float32"
    float64 = "float64"


def _version(value: bool) -> None:
    if value:
        print(f"ope {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    debug: Annotated[bool, typer.Option("--debug", help="Show tracebacks for errors.")] = False,
    version: Annotated[
        bool | None,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print the version and exit."
        ),
    ] = None,
) -> None:
    """Estimate how well evaluation policies would do, from episodes logged by another policy.

    Example: [bold]ope evaluate logs.parquet --policy ckpt.npz --gamma 0.99[/bold]
    """
    _state["debug"] = debug


def _column(role: str) -> typer.models.OptionInfo:
    """A column-mapping option: ``role`` is "what (default name)"; the option's column
    replaces the default name and its aliases."""
    what, default = role.rsplit(" (default ", 1)
    return typer.Option(
        help=f"Column holding {what}. Default: {default.rstrip(')')} or an alias.",
        rich_help_panel="Columns",
    )


EpisodeCol = Annotated[str | None, _column("the episode id (default episode_id)")]
StepCol = Annotated[str | None, _column("the 0-based step in its episode (default step)")]
ObsCol = Annotated[str | None, _column("the observation (default observation)")]
ActionCol = Annotated[str | None, _column("the logged action (default action)")]
RewardCol = Annotated[str | None, _column("the reward (default reward)")]
BehaviorProbCol = Annotated[
    str | None,
    _column("the behavior policy's probability of the logged action (default behavior_prob)"),
]
BehaviorLogProbCol = Annotated[
    str | None,
    _column(
        "the behavior policy's log-probability of the logged action (default behavior_log_prob)"
    ),
]
TargetProbCol = Annotated[
    str | None,
    _column("logged evaluation-policy probabilities, used without --policy (default target_prob)"),
]
TargetLogProbCol = Annotated[
    str | None, _column("logged evaluation-policy log-probabilities (default target_log_prob)")
]


def _columns(
    episode_col,
    step_col,
    obs_col,
    action_col,
    reward_col,
    behavior_prob_col,
    behavior_log_prob_col,
    target_prob_col,
    target_log_prob_col,
) -> ColumnMapping:
    return ColumnMapping(
        episode=episode_col,
        step=step_col,
        observation=obs_col,
        action=action_col,
        reward=reward_col,
        behavior_prob=behavior_prob_col,
        behavior_log_prob=behavior_log_prob_col,
        target_prob=target_prob_col,
        target_log_prob=target_log_prob_col,
    )


@app.command()
def evaluate(
    data: Annotated[
        str,
        typer.Argument(
            help="Parquet file, directory of Parquet files, glob, or Arrow IPC/Feather file."
        ),
    ],
    policy: Annotated[
        list[str] | None,
        typer.Option(
            "--policy",
            "-p",
            help="Checkpoint .npz or entry point package.module:name; repeat for several "
            "policies (one pass). Omit to use target probabilities logged in the data.",
        ),
    ] = None,
    gamma: Annotated[float, typer.Option(help="Discount factor in [0, 1].")] = 1.0,
    estimator: Annotated[
        list[str] | None,
        typer.Option(
            "--estimator",
            "-e",
            help=f"Estimator to report ({', '.join(ESTIMATORS)}); repeatable. Default: all.",
        ),
    ] = None,
    output_format: Annotated[
        OutputFormat | None,
        typer.Option(
            "--format", "-f", help="Output on stdout. Default: table on a terminal, json otherwise."
        ),
    ] = None,
    confidence: Annotated[float, typer.Option(help="Confidence level of the intervals.")] = 0.95,
    ci: Annotated[
        str,
        typer.Option(
            "--ci",
            help="Interval method: betting (finite-sample, needs bounded rewards), normal, "
            "percentile (Poisson bootstrap) or bootstrap-t (studentized Poisson bootstrap). auto: "
            "betting when the reward range is known (--reward-range or the data's metadata), else "
            "normal.",
        ),
    ] = "auto",
    reward_range: Annotated[
        tuple[float, float] | None,
        typer.Option(
            metavar="LOW HIGH",
            help="Every reward lies in [LOW, HIGH]; enables betting intervals. "
            "Checked against the data.",
        ),
    ] = None,
    horizon: Annotated[
        int | None,
        typer.Option(
            metavar="STEPS",
            help="No episode is longer than STEPS; betting intervals need it when "
            "--gamma is 1. Checked against the data.",
        ),
    ] = None,
    bootstrap_samples: Annotated[int, typer.Option(help="Bootstrap replicates.")] = 200,
    seed: Annotated[int, typer.Option(help="Seed of the bootstrap's random streams.")] = 0,
    precision: Annotated[
        PrecisionOption | None,
        typer.Option(help="Kernel precision. Default: float64 on CPU, float32 on accelerators."),
    ] = None,
    devices: Annotated[
        int | None, typer.Option(help="Shard episodes over this many local devices. Default: all.")
    ] = None,
    quiet: Annotated[
        bool, typer.Option("--quiet", "-q", help="No progress output on stderr.")
    ] = False,
    on_invalid: Annotated[
        OnInvalid,
        typer.Option(
            help="error: stop at the first invalid value; drop: leave out the episodes with invalid "
            "values (NaN/inf, bad probabilities, out-of-range actions or states, duplicate or missing "
            "steps, nulls) and report how many were dropped, and why."
        ),
    ] = OnInvalid.error,
    rank_by: Annotated[
        str,
        typer.Option(
            help=f"Estimator that ranks several policies in the table, highest first "
            f"({', '.join(ESTIMATORS)}); the best is highlighted."
        ),
    ] = "wis",
    plot: Annotated[
        str | None,
        typer.Option(
            metavar="DIR",
            help="Also write PNG figures into DIR: log10 weight histogram, per-step "
            "WPDIS and mean weight, estimates with intervals. Needs matplotlib: "
            "pip install 'ope-cli\\[plot]'.",
        ),
    ] = None,  # \[ : not rich markup
    episode_col: EpisodeCol = None,
    step_col: StepCol = None,
    obs_col: ObsCol = None,
    action_col: ActionCol = None,
    reward_col: RewardCol = None,
    behavior_prob_col: BehaviorProbCol = None,
    behavior_log_prob_col: BehaviorLogProbCol = None,
    target_prob_col: TargetProbCol = None,
    target_log_prob_col: TargetLogProbCol = None,
    coordinator: Annotated[
        str | None,
        typer.Option(
            help="HOST:PORT of process 0, for a multi-process run.", rich_help_panel="Cluster"
        ),
    ] = None,
    num_processes: Annotated[
        int | None, typer.Option(help="Number of processes in the run.", rich_help_panel="Cluster")
    ] = None,
    process_id: Annotated[
        int | None,
        typer.Option(
            help="This process's index, 0 .. N-1; process 0 prints the result.",
            rich_help_panel="Cluster",
        ),
    ] = None,
    distributed: Annotated[
        bool,
        typer.Option(
            "--distributed",
            help="Join a multi-process run detected by JAX (e.g. under SLURM).",
            rich_help_panel="Cluster",
        ),
    ] = False,
    timeout: Annotated[
        int,
        typer.Option(
            help="Seconds to wait for the other processes to join or answer.",
            rich_help_panel="Cluster",
        ),
    ] = 60,
    read_rows: Annotated[
        int, typer.Option(help="Rows per record batch read.", rich_help_panel="Batching")
    ] = BatchingConfig.read_rows,
    batch_steps: Annotated[
        int, typer.Option(help="Padded steps per kernel call.", rich_help_panel="Batching")
    ] = BatchingConfig.batch_steps,
    min_bucket: Annotated[
        int,
        typer.Option(
            help="Shortest episode-length bucket; lengths double.", rich_help_panel="Batching"
        ),
    ] = BatchingConfig.min_bucket,
) -> None:
    """Estimate each policy's value from the logged episodes in DATA.

    Examples:

      ope evaluate logs.parquet --policy ckpt.npz --gamma 0.99

      ope evaluate logs/ -p a.npz -p b.npz --format json | jq '.results[0].estimates.wis.value'

      ope evaluate episodes.parquet --policy mypkg.models:policy --obs-col state --behavior-prob-col pscore
    """
    from ope_cli.distributed import DistributedConfig
    from ope_cli.pipeline import evaluate as run_evaluation
    from ope_cli.report import render_table, to_csv, to_json

    config = EvaluationConfig(
        data=data,
        policies=tuple(policy or ()),
        gamma=gamma,
        estimators=tuple(dict.fromkeys(e.lower() for e in estimator)) if estimator else ESTIMATORS,
        confidence=confidence,
        interval=ci,
        reward_range=reward_range,
        horizon=horizon,
        bootstrap_samples=bootstrap_samples,
        seed=seed,
        columns=_columns(
            episode_col,
            step_col,
            obs_col,
            action_col,
            reward_col,
            behavior_prob_col,
            behavior_log_prob_col,
            target_prob_col,
            target_log_prob_col,
        ),
        batching=BatchingConfig(
            read_rows=read_rows, batch_steps=batch_steps, min_bucket=min_bucket
        ),
        precision=precision.value if precision else None,
        devices=devices,
        on_invalid=on_invalid.value,
    )
    rank_by = _check_rank_by(rank_by, config.estimators)
    if plot is not None:
        from ope_cli.plots import require_matplotlib

        require_matplotlib()  # before the run, not after it
    chosen = output_format or (OutputFormat.table if sys.stdout.isatty() else OutputFormat.json)
    cluster = DistributedConfig(
        coordinator=coordinator,
        num_processes=num_processes,
        process_id=process_id,
        auto=distributed,
        timeout_seconds=timeout,
    )
    with _progress(quiet) as (on_progress, on_status):
        result = run_evaluation(
            config, on_progress=on_progress, distributed=cluster, on_status=on_status
        )
    if result.process_id != 0:
        return  # every process holds the reduced result; process 0 prints it
    if plot is not None:  # before the result: a figure that cannot be written leaves stdout empty
        from ope_cli.plots import write_plots

        written = write_plots(result, plot)
        if not quiet:
            stderr.print(
                f"figures: {', '.join(str(p) for p in written)}",
                markup=False,
                highlight=False,
                soft_wrap=True,
            )
    if chosen is OutputFormat.json:
        sys.stdout.write(to_json(result) + "\n")
    elif chosen is OutputFormat.csv:
        sys.stdout.write(to_csv(result))
    else:
        render_table(result, _stdout_console(result), rank_by=rank_by)


def _check_rank_by(rank_by: str, estimators: tuple[str, ...]) -> str:
    """--rank-by as an estimator the run reports; the default (wis) falls back to the first
    reported estimator when --estimator leaves WIS out."""
    rank_by = rank_by.lower()
    if rank_by not in estimator_names():
        raise UsageError(
            f"--rank-by must be one of {', '.join(estimator_names())}, got {rank_by!r}"
        )
    if rank_by in estimators:
        return rank_by
    if rank_by == "wis":
        return estimators[0]
    raise UsageError(
        f"--rank-by {rank_by}: not among the reported estimators "
        f"({', '.join(estimators)}); add --estimator {rank_by}"
    )


def _stdout_console(result) -> Console:
    """A console for the table: the terminal's width on a terminal; in a file or pipe wide
    enough that no policy name is cut (the 80 columns rich assumes would fold paths)."""
    console = Console()
    if console.is_terminal:
        return console
    longest = max(len(r.policy) for r in result.results)
    return Console(width=max(100, longest + 90))


@app.command()
def generate(
    env: Annotated[str, typer.Argument(help="Environment: bandit, chain, control or gaussian.")],
    out: Annotated[str, typer.Argument(help="Output directory.")],
    episodes: Annotated[int, typer.Option(help="Number of logged episodes.")] = 1000,
    seed: Annotated[
        int, typer.Option(help="Random seed; the same seed gives identical files.")
    ] = 0,
    gamma: Annotated[float, typer.Option(help="Discount factor of the true values.")] = 1.0,
    horizon: Annotated[
        int | None, typer.Option(help="Maximum episode length, where it applies.")
    ] = None,
    shift: Annotated[
        float,
        typer.Option(
            help="How far the evaluation policies are from the behavior policy (0 = identical)."
        ),
    ] = 0.5,
    files: Annotated[int, typer.Option(help="Split the logs into this many Parquet files.")] = 1,
) -> None:
    """Write a synthetic logged dataset whose evaluation policies' values are known.

    Writes OUT/logs.parquet (or OUT/logs/ with --files > 1), OUT/behavior.npz,
    OUT/policies/eval_*.npz and OUT/truth.json (each policy's true value).

    Example: ope generate chain demo --episodes 5000 --gamma 0.99 && ope evaluate demo/logs.parquet -p demo/policies/eval_0.npz --gamma 0.99
    """
    from ope_cli.generate import generate as write_environment

    try:
        truth = write_environment(
            env,
            out,
            episodes=episodes,
            seed=seed,
            gamma=gamma,
            horizon=horizon,
            shift=shift,
            files=files,
        )
    except ValueError as error:
        raise UsageError(str(error)) from None
    except OSError as error:  # an output path that cannot be written: say which, no traceback
        raise UsageError(
            f"{error.filename or out}: cannot write the output ({error.strerror or error})"
        ) from None
    import json

    sys.stdout.write(json.dumps(truth, indent=2) + "\n")


class InspectFormat(str, enum.Enum):
    table = "table"
    json = "json"


@app.command("inspect")
def inspect_command(
    data: Annotated[
        str,
        typer.Argument(
            help="Parquet file, directory of Parquet files, glob, or Arrow IPC/Feather file."
        ),
    ],
    policy: Annotated[
        list[str] | None,
        typer.Option(
            "--policy",
            "-p",
            help="Also check actions and states against this policy's ranges; repeatable.",
        ),
    ] = None,
    output_format: Annotated[
        InspectFormat | None,
        typer.Option(
            "--format", "-f", help="Output on stdout. Default: table on a terminal, json otherwise."
        ),
    ] = None,
    read_rows: Annotated[
        int, typer.Option(help="Rows per record batch read.", rich_help_panel="Batching")
    ] = BatchingConfig.read_rows,
    episode_col: EpisodeCol = None,
    step_col: StepCol = None,
    obs_col: ObsCol = None,
    action_col: ActionCol = None,
    reward_col: RewardCol = None,
    behavior_prob_col: BehaviorProbCol = None,
    behavior_log_prob_col: BehaviorLogProbCol = None,
    target_prob_col: TargetProbCol = None,
    target_log_prob_col: TargetLogProbCol = None,
) -> None:
    """Show DATA's schema, episodes, lengths, propensities and actions, and every validation
    problem in it. Exits 3 when there are problems (the report still goes to stdout).

    Example: ope inspect logs.parquet --format json | jq '.problems'
    """
    from ope_cli.inspect import InspectConfig, inspect, render_table, to_json

    config = InspectConfig(
        data=data,
        columns=_columns(
            episode_col,
            step_col,
            obs_col,
            action_col,
            reward_col,
            behavior_prob_col,
            behavior_log_prob_col,
            target_prob_col,
            target_log_prob_col,
        ),
        read_rows=read_rows,
        policies=tuple(policy or ()),
    )
    report = inspect(config)
    chosen = output_format or (InspectFormat.table if sys.stdout.isatty() else InspectFormat.json)
    if chosen is InspectFormat.json:
        sys.stdout.write(to_json(report) + "\n")
    else:
        console = Console()
        render_table(report, console if console.is_terminal else Console(width=120))
    if not report.ok:
        sys.stdout.flush()
        count = sum(p.episodes for p in report.problems)
        stderr.print(
            f"ope: invalid data: {data}: {len(report.problems)} kind(s) of validation "
            f"problem, in {count:,} episode(s) (see the report)",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        raise typer.Exit(3)


class _progress:
    """Progress of ``ope evaluate`` on stderr: a status ("compiling kernel for [B, T] ...",
    "reading") with a spinner, and a bar of rows read out of the total known from the Parquet
    metadata, with throughput, elapsed time and ETA.

    It appears only when stderr is a terminal and not ``--quiet``, and only for runs longer
    than ``delay`` seconds (a timer starts the display; rich's own refresh thread keeps the
    spinner and clock moving while the main thread is busy compiling). ``with _progress(q) as
    (on_progress, on_status)``: both None when disabled.
    """

    def __init__(self, quiet: bool, console: Console | None = None, delay: float = 1.0):
        self.console = console or stderr
        self.enabled = not quiet and self.console.is_terminal
        self.delay = delay
        self._progress = None
        self._task = None
        self._timer = None
        self._lock = threading.Lock()
        self._started = self._closed = False
        self._reading_since: float | None = None

    def __enter__(self):
        if not self.enabled:
            return None, None
        from rich.progress import (
            BarColumn,
            Progress,
            SpinnerColumn,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self._progress = Progress(
            SpinnerColumn(),
            TextColumn("{task.description}"),
            BarColumn(),
            TextColumn("{task.fields[rows]}"),
            TextColumn("{task.fields[rate]}", style="cyan"),
            TimeElapsedColumn(),
            TextColumn("eta"),
            TimeRemainingColumn(),
            console=self.console,
            transient=True,
        )
        self._task = self._progress.add_task("starting", total=None, rows="", rate="")
        self._timer = threading.Timer(self.delay, self._start)
        self._timer.daemon = True
        self._timer.start()
        return self.update, self.status

    def _start(self) -> None:
        with self._lock:
            if not self._closed:
                self._progress.start()
                self._started = True

    def update(self, rows: int, total: int | None) -> None:
        """Rows read so far, of ``total`` (None when unknown)."""
        now = time.monotonic()
        if self._reading_since is None:
            self._reading_since = now
        elapsed = now - self._reading_since
        rate = f"{rows / elapsed:,.0f} rows/s" if rows and elapsed > 0 else ""  # average so far
        self._progress.update(
            self._task,
            completed=rows,
            total=total,
            description="reading",
            rows=f"{rows:,}" + (f"/{total:,}" if total else "") + " rows",
            rate=rate,
        )

    def status(self, text: str) -> None:
        """A step without row progress, e.g. the first compilation of a batch shape."""
        self._progress.update(self._task, description=text)

    def __exit__(self, *exc_info):
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            self._closed = True
            if self._started:
                self._progress.stop()
        return False


def _error_line(error: BaseException) -> str:
    return str(error).strip().replace("\n", " ")


bench.register(app)

_RUNTIME_EXIT_CODE = 5


def _wants_cluster(argv: list[str]) -> bool:
    return any(
        a.split("=")[0] in ("--coordinator", "--num-processes", "--process-id", "--distributed")
        for a in argv
    )


def _die_with_parent() -> None:
    """In the worker: ask Linux to kill it when its supervisor dies, even by SIGKILL, so a
    killed ``ope`` never leaves a worker behind that its peers keep waiting for."""
    if sys.platform.startswith("linux"):
        import ctypes
        import signal

        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)


def _supervise(argv: list[str]) -> int:
    """Runs this command in a child process and reports how it ended.

    JAX's distributed runtime aborts a process (SIGABRT, with C++ logs) when a peer dies
    or stops answering; the child takes that fall, and this parent turns it into one clear
    line and exit code 5. Only the child's own ``ope:`` lines reach stderr (all of it with
    --debug); stdout passes straight through.
    """
    import signal
    import subprocess

    env = dict(os.environ, OPE_CLUSTER_WORKER="1", PYTHONUNBUFFERED="1")
    child = subprocess.Popen(
        [sys.executable, "-m", "ope_cli.cli", *argv],
        stdin=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        preexec_fn=_die_with_parent,
    )
    for forwarded in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(forwarded, lambda number, frame: child.send_signal(number))
    debug = "--debug" in argv
    runtime_log = []  # the runtime's own fatal-error lines, to say what went wrong
    try:
        for raw in child.stderr:
            line = raw.decode(errors="replace")
            if debug or line.startswith("ope:"):
                sys.stderr.write(line)
            elif "absl::Status" in line or line.startswith("RPC:"):
                runtime_log.append(line)
        code = child.wait()
    except KeyboardInterrupt:
        child.send_signal(signal.SIGINT)
        child.wait()
        raise
    if code < 0:
        log = "".join(runtime_log)
        if "RegisterTask" in log or "Deadline" in log and "heartbeat" not in log:
            reason = (
                "could not join the run: the coordinator did not answer in time (is process 0 "
                "running, and is --coordinator its reachable HOST:PORT?)"
            )
        else:
            reason = "another process died or stopped answering; see that process's error"
        stderr.print(
            f"ope: distributed run failed: stopped by the JAX runtime "
            f"({signal.Signals(-code).name}): {reason}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        return _RUNTIME_EXIT_CODE
    return code


def main() -> None:
    """Console entry point: runs the app and maps errors to one stderr line and an exit code."""
    argv = sys.argv[1:]
    debug = "--debug" in argv
    if debug:  # accepted anywhere on the line, not only before the command
        argv = ["--debug", *(a for a in argv if a != "--debug")]
    if _wants_cluster(argv):
        if not os.environ.get("OPE_CLUSTER_WORKER"):
            sys.exit(_supervise(argv))
        # The collectives library prints to the C-level stdout; keep stdout for the result.
        result_fd = os.dup(1)
        os.dup2(2, 1)
        sys.stdout = os.fdopen(result_fd, "w")
    try:
        code = app(args=argv, standalone_mode=False)
    except OpeError as error:
        if debug:
            traceback.print_exc()
        stderr.print(
            f"ope: {error.kind}: {_error_line(error)}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(error.exit_code)
    except typer.Abort:
        stderr.print("ope: aborted", markup=False)
        sys.exit(130)
    except typer.TyperException as error:  # usage errors from option parsing
        stderr.print(
            f"ope: usage error: {_error_line(error.format_message())}",
            markup=False,
            highlight=False,
            soft_wrap=True,
        )
        sys.exit(UsageError.exit_code)
    except KeyboardInterrupt:
        stderr.print("ope: interrupted", markup=False)
        sys.exit(130)
    except Exception as error:  # noqa: BLE001 - anything else is a bug: say so, exit 1
        if debug:
            traceback.print_exc()
        stderr.print(
            f"ope: internal error (a bug; rerun with --debug for the traceback): "
            f"{type(error).__name__}: {_error_line(error)}",
            markup=False,
            soft_wrap=True,
        )
        sys.exit(1)
    sys.exit(code if isinstance(code, int) else 0)


if __name__ == "__main__":
    main()
