"""Options shared by several commands, declared once as ``Annotated`` aliases.

A command declares ``gamma: Gamma = 1.0`` instead of repeating the ``typer.Option``; the
help text, panel and flags then agree everywhere. Options that go together reach a command
as one object (``OptionGroup``, ``option_groups``; the groups are in ``cli/groups.py``): the
column options are declared once (COLUMN_OPTIONS) and a command takes those of the roles it
reads through ``column_group(*roles)``, as one ``ColumnMapping``.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import inspect
from collections.abc import Callable
from typing import Annotated, Any

import typer

from ope_cli.cli.helpmap import one_of
from ope_cli.config import ESTIMATORS, ColumnMapping
from ope_cli.estimation.estimators import names
from ope_cli.models.behavior_models.base import MODELS as BEHAVIOR_MODELS

KEYWORD_ONLY = inspect.Parameter.KEYWORD_ONLY

COLUMNS_PANEL = "Columns"
BATCHING_PANEL = "Batching"
CLUSTER_PANEL = "Cluster"
FORMAT_HELP = "Output on stdout. Default: table on a terminal, json otherwise."


class OutputFormat(enum.StrEnum):
    """``ope evaluate --format``."""

    table = "table"
    json = "json"
    csv = "csv"


class InspectFormat(enum.StrEnum):
    """``ope inspect --format``."""

    table = "table"
    json = "json"


class OnInvalid(enum.StrEnum):
    error = "error"
    drop = "drop"


class PrecisionOption(enum.StrEnum):
    float32 = "float32"
    float64 = "float64"


def _column(role: str) -> typer.models.OptionInfo:
    """A column-mapping option: ``role`` is "what (default name)"; the option's column
    replaces the default name and its aliases."""
    what, default = role.rsplit(" (default ", 1)
    return typer.Option(
        help=f"Column holding {what}. Default: {default.rstrip(')')} or an alias.",
        rich_help_panel=COLUMNS_PANEL,
    )


# --- data and policies
Data = Annotated[
    str,
    typer.Argument(
        help="Parquet file, directory of Parquet files, glob, Arrow IPC/Feather file, "
        "D4RL-style HDF5 file or Minari dataset (directory or minari:ID); paths may be URIs "
        "(s3://, gs://, hdfs://, file://)."
    ),
]

Behavior = Annotated[
    str | None,
    typer.Option(
        "--behavior",
        "-b",
        metavar=one_of("CKPT", "package.module:name", "estimate[:MODEL]"),
        help="Behavior policy (checkpoint .npz or entry point, as for --policy) whose "
        "probabilities of the logged actions replace the data's propensity column, which "
        "is then not read; or estimate[:MODEL] to fit it to the logged actions first "
        "(MODEL: tabular, linear_softmax, mlp_softmax, linear_gaussian; default from the "
        "observation and action types).",
    ),
]
MinPropensity = Annotated[
    float,
    typer.Option(
        help="With --behavior estimate: estimated probabilities below this are raised to it "
        "(how many is reported)."
    ),
]
BehaviorCrossFit = Annotated[
    int,
    typer.Option(
        metavar="K",
        help="With --behavior estimate: split the episodes into K folds (by id hash) and "
        "evaluate each with the model fitted on the other K-1 (1: fit on all, in-sample).",
    ),
]
BehaviorModelOption = Annotated[
    str | None,
    typer.Option(
        "--model",
        "-m",
        metavar=one_of(*BEHAVIOR_MODELS),
        help="Behavior model: tabular, linear_softmax, mlp_softmax or linear_gaussian. "
        "Default: tabular for integer states and discrete actions, linear_softmax for other "
        "observations, linear_gaussian for continuous actions.",
    ),
]

# --- doubly robust (evaluate)
QOption = Annotated[
    list[str] | None,
    typer.Option(
        "--q",
        metavar=one_of("Q.npz", "package.module:name", "fit[:MODEL]"),
        help="Q-hat of the evaluation policy, for the doubly robust estimators dm, dr and "
        "wdr: a checkpoint (tabular_q, linear_q, mlp_q, mlp_q_sa), an entry point, or fit "
        "to fit it in this run (fitted Q evaluation; MODEL: tabular, linear, mlp). Once per "
        "--policy, in the same order (a quoted glob counts its files); fit once fits one "
        "for each policy. The output shows which Q-hat each policy got.",
    ),
]
CrossFit = Annotated[
    int,
    typer.Option(
        metavar="K",
        help="With --q fit: split the episodes into K folds (by id hash) and score each with "
        "the Q fitted on the other K-1 (1: fit on all, in-sample).",
    ),
]
VSamples = Annotated[
    int,
    typer.Option(
        metavar="N",
        help="Continuous actions: V-hat(s) averages Q-hat over N actions drawn from the "
        "policy (ope evaluate: with --q).",
    ),
]
QCol = Annotated[
    str | None,
    typer.Option(
        help="Column holding Q-hat of the logged action from your own critic (one policy; "
        "with --v-col). Read only when named.",
        rich_help_panel=COLUMNS_PANEL,
    ),
]
VCol = Annotated[
    str | None,
    typer.Option(
        help="Column holding V-hat of the state from your own critic (with --q-col). Read "
        "only when named.",
        rich_help_panel=COLUMNS_PANEL,
    ),
]

# --- column mapping (evaluate, inspect)
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
    _column("logged evaluation-policy probabilities (default target_prob)"),
]
TargetLogProbCol = Annotated[
    str | None, _column("logged evaluation-policy log-probabilities (default target_log_prob)")
]

# --- output
Overwrite = Annotated[
    bool,
    typer.Option("--overwrite", help="Replace the output when it exists (else: refused, exit 2)."),
]
EvaluateFormat = Annotated[OutputFormat | None, typer.Option("--format", "-f", help=FORMAT_HELP)]
InspectFormatOption = Annotated[
    InspectFormat | None, typer.Option("--format", "-f", help=FORMAT_HELP)
]
Quiet = Annotated[
    bool,
    typer.Option(
        "--quiet",
        "-q",
        help="No progress, status or warning lines on stderr (errors still print); the output "
        "itself, and any warnings it lists, are unchanged.",
    ),
]

# --- estimation
Gamma = Annotated[float, typer.Option(help="Discount factor in [0, 1].")]
DeclaredGamma = Annotated[
    float | None,
    typer.Option(
        "--gamma",
        metavar="FLOAT",
        help="Discount factor in [0, 1]. Default: the gamma the data declares in its ope "
        "schema metadata (ope generate and ope convert write it), else 1.0; the output says "
        "which.",
    ),
]
Estimators = Annotated[
    list[str] | None,
    typer.Option(
        "--estimator",
        "-e",
        metavar=one_of(*names()),
        help=f"Estimator to report; repeatable. Default: all that the inputs allow "
        f"({', '.join(ESTIMATORS)}; with a Q source also "
        f"{', '.join(n for n in names() if n not in ESTIMATORS)}).",
    ),
]
Precision = Annotated[
    PrecisionOption | None,
    typer.Option(help="Kernel precision. Default: float64 on CPU, float32 on accelerators."),
]
Devices = Annotated[
    int | None, typer.Option(help="Shard episodes over this many local devices. Default: all.")
]

# --- batching
ReadRows = Annotated[
    int, typer.Option(help="Rows per record batch read.", rich_help_panel=BATCHING_PANEL)
]
BatchSteps = Annotated[
    int,
    typer.Option(
        help="Cells (lanes × steps) of a kernel window; episodes are walked in windows of a "
        "few fixed shapes made from it. An episode longer than it is walked alone (about 3x "
        "slower a step): raise it past a log's usual episode length.",
        rich_help_panel=BATCHING_PANEL,
    ),
]
MinBucket = Annotated[
    int,
    typer.Option(
        help="Steps of the short window (at least 2); the long one has its square.",
        rich_help_panel=BATCHING_PANEL,
    ),
]

# --- multi-process runs
Coordinator = Annotated[
    str | None,
    typer.Option(
        help="HOST:PORT of process 0, for a multi-process run.", rich_help_panel=CLUSTER_PANEL
    ),
]
NumProcesses = Annotated[
    int | None,
    typer.Option(help="Number of processes in the run.", rich_help_panel=CLUSTER_PANEL),
]
ProcessId = Annotated[
    int | None,
    typer.Option(
        help="This process's index, 0 .. N-1; process 0 prints the result.",
        rich_help_panel=CLUSTER_PANEL,
    ),
]
Distributed = Annotated[
    bool,
    typer.Option(
        "--distributed",
        help="Join a multi-process run detected by JAX (e.g. under SLURM).",
        rich_help_panel=CLUSTER_PANEL,
    ),
]
Timeout = Annotated[
    int | None,
    typer.Option(
        help="Seconds to wait for the other processes to join or answer. Default: 60.",
        rich_help_panel=CLUSTER_PANEL,
    ),
]
CLUSTER_OPTIONS = ("--coordinator", "--num-processes", "--process-id", "--distributed")


# role (a ColumnMapping field) -> (the command's parameter, its option): the column
# options, declared once; a command reads the roles it names in ``column_group``.
COLUMN_OPTIONS: dict[str, tuple[str, Any]] = {
    "episode": ("episode_col", EpisodeCol),
    "step": ("step_col", StepCol),
    "observation": ("obs_col", ObsCol),
    "action": ("action_col", ActionCol),
    "reward": ("reward_col", RewardCol),
    "behavior_prob": ("behavior_prob_col", BehaviorProbCol),
    "behavior_log_prob": ("behavior_log_prob_col", BehaviorLogProbCol),
    "target_prob": ("target_prob_col", TargetProbCol),
    "target_log_prob": ("target_log_prob_col", TargetLogProbCol),
    "q_value": ("q_col", QCol),
    "v_value": ("v_col", VCol),
}
LOGGED_COLUMNS = tuple(role for role in COLUMN_OPTIONS if role not in ("q_value", "v_value"))


@dataclasses.dataclass(frozen=True)
class OptionGroup:
    """Options that reach a command as one object, declared once: ``options`` are
    (parameter, its ``Annotated`` option, default) in --help order; ``build(**values)``
    turns their values into the object the command receives."""

    options: tuple[tuple[str, Any, Any], ...]
    build: Callable[..., Any]


def options_group(*options: tuple[str, Any, Any]) -> OptionGroup:
    """Options (parameter, ``Annotated`` option, default) that reach a command as one
    ``{parameter: value}`` dict: a command's own options gathered, so that no command takes
    more parameters than a function should."""
    return OptionGroup(options, dict)


def merged_group(**groups: OptionGroup) -> OptionGroup:
    """Groups side by side as one parameter: the command receives ``{name: that group's
    object}``; their options keep their order."""
    names = {name: [option for option, *_ in group.options] for name, group in groups.items()}

    def build(**values: Any) -> dict[str, Any]:
        return {
            name: group.build(**{option: values[option] for option in names[name]})
            for name, group in groups.items()
        }

    return OptionGroup(tuple(o for group in groups.values() for o in group.options), build)


def option_groups(**groups: OptionGroup) -> Callable[[Callable], Callable]:
    """A typer command decorator: each parameter named like one of ``groups`` stands, where
    it is, for that group's options (their place in --help), and the command receives
    ``group.build(**their values)`` under the parameter's name."""

    def decorate(command: Callable) -> Callable:
        parameters = []
        for parameter in inspect.signature(command).parameters.values():
            if parameter.name in groups:
                parameters.extend(
                    inspect.Parameter(name, KEYWORD_ONLY, default=default, annotation=option)
                    for name, option, default in groups[parameter.name].options
                )
            else:  # the group parameters' own annotations may be names typer cannot see
                annotation = _evaluated(parameter.annotation, command)
                parameters.append(parameter.replace(kind=KEYWORD_ONLY, annotation=annotation))

        @functools.wraps(command)
        def with_groups(**values: Any) -> Any:
            for name, group in groups.items():
                values[name] = group.build(
                    **{option: values.pop(option) for option, *_ in group.options}
                )
            return command(**values)

        with_groups.__signature__ = inspect.Signature(parameters)
        with_groups.__annotations__ = {p.name: p.annotation for p in parameters}
        return with_groups

    return decorate


def _evaluated(annotation: Any, command: Callable) -> Any:
    """A string annotation (``from __future__ import annotations``) as its object."""
    if not isinstance(annotation, str):
        return annotation
    return eval(annotation, inspect.unwrap(command).__globals__)  # as inspect's eval_str does


def column_group(*roles: str) -> OptionGroup:
    """The column options of ``roles`` (the ``--episode-col`` ... options of COLUMN_OPTIONS,
    in their "Columns" help panel) as one ``ColumnMapping`` (None: default name or alias)."""

    def build(**values: str | None) -> ColumnMapping:
        mapping = ColumnMapping(**{role: values[COLUMN_OPTIONS[role][0]] for role in roles})
        mapping.check()
        return mapping

    return OptionGroup(tuple((*COLUMN_OPTIONS[role], None) for role in roles), build)
