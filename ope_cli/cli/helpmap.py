"""Help that reads like a map (SPEC 12): every command's options in named panels, choices
listed, and metavars a person reads (PATH, FLOAT, INT, a choice list), never a Python type.

``HelpMapGroup`` is the ``ope`` group's class: when typer builds the command tree, it gives
each option without a panel of its own the panel of ``PANELS`` and each parameter without a
metavar one from ``metavar``; options a command declares with a panel or metavar keep it.
"""

from __future__ import annotations

import enum
import inspect
from typing import Any, get_args, get_origin

from typer.core import TyperGroup

DATA = "Data and columns"
POLICIES = "Policies"
BEHAVIOR = "Behavior"
Q = "Q and doubly robust"
INTERVALS = "Intervals"
CHOOSING = "Choosing a policy"
OUTPUT = "Output"
PERFORMANCE = "Performance"
CLUSTER = "Cluster"
MEASUREMENTS = "Measurements"  # ope bench's

# option -> panel, across commands (an option of one name means one thing everywhere)
PANELS = {
    **dict.fromkeys(
        (
            "gamma",
            "on_invalid",
            "episode_col",
            "step_col",
            "obs_col",
            "action_col",
            "reward_col",
            "behavior_prob_col",
            "behavior_log_prob_col",
            "target_prob_col",
            "target_log_prob_col",
        ),
        DATA,
    ),
    "policy": POLICIES,
    **dict.fromkeys(("behavior", "min_propensity", "behavior_cross_fit"), BEHAVIOR),
    **dict.fromkeys(("q", "cross_fit", "v_samples", "q_col", "v_col"), Q),
    **dict.fromkeys(
        ("confidence", "ci", "reward_range", "horizon", "bootstrap_samples", "seed"), INTERVALS
    ),
    **dict.fromkeys(("baseline", "truth", "top_k"), CHOOSING),
    **dict.fromkeys(
        ("estimator", "rank_by", "output_format", "quiet", "plot", "overwrite"), OUTPUT
    ),
    **dict.fromkeys(
        ("precision", "devices", "read_rows", "batch_steps", "min_bucket"), PERFORMANCE
    ),
    **dict.fromkeys(
        ("coordinator", "num_processes", "process_id", "distributed", "timeout"), CLUSTER
    ),
}
# where a command's option of a shared name means something else (None: no panel)
COMMAND_PANELS: dict[str, dict[str, str | None]] = {
    "bench": {
        **dict.fromkeys(("data", "episodes", "seed", "policies"), DATA),
        **dict.fromkeys(("memory", "memory_steps", "script", "script_steps"), MEASUREMENTS),
        **dict.fromkeys(("loop_episodes", "processes", "rounds"), MEASUREMENTS),
        "out": OUTPUT,
    },
    "generate": dict.fromkeys(
        ("episodes", "seed", "gamma", "horizon", "shift", "files", "policies"), DATA
    ),
    "fit-q": {"model": Q, "ridge": Q, "seed": Q, "out": OUTPUT},
    "fit-behavior": {"model": BEHAVIOR, "out": OUTPUT},
}
# every command's panels, in the order --help shows them; ope evaluate has all but bench's
SHOWN_ORDER = (DATA, POLICIES, BEHAVIOR, Q, INTERVALS, CHOOSING)
SHOWN_ORDER += (MEASUREMENTS, OUTPUT, PERFORMANCE, CLUSTER)
PANEL_ORDER = tuple(panel for panel in SHOWN_ORDER if panel != MEASUREMENTS)  # evaluate's


def one_of(*choices: str) -> str:
    """A metavar of alternatives, spaced so that a narrow help wraps it between them (it
    folds a word without spaces mid-word: "mlp_s / oftmax")."""
    return " | ".join(choices)


# a str option's metavar by its name (else TEXT)
TEXT_METAVARS = {
    "data": "DATA",
    "out": "PATH",
    "env": "ENV",
    "coordinator": "HOST:PORT",
    "policy": one_of("CKPT", "package.module:name"),
}
SCALARS = {int: "INT", float: "FLOAT", bool: "BOOL"}


def _choices(annotation: Any) -> list[str] | None:
    if isinstance(annotation, type) and issubclass(annotation, enum.Enum):
        return [str(member.value) for member in annotation]
    return None


def _plain(annotation: Any) -> Any:
    """``X | None`` -> X; ``list[X]`` -> X (a repeatable option's value)."""
    if get_origin(annotation) is list:
        return _plain(get_args(annotation)[0])
    args = [a for a in get_args(annotation) if a is not type(None)]
    if args and get_origin(annotation) is not list and len(args) == 1:
        return _plain(args[0])
    return annotation


def metavar(param: Any) -> str:
    """What a person reads for ``param``'s value: INT, FLOAT, a choice list a | b | c, PATH,
    COLUMN, ... ("" for a flag, which takes no value)."""
    if getattr(param, "is_flag", False):
        return ""
    descriptor = getattr(param, "type_descriptor", None)
    annotation = _plain(getattr(descriptor, "annotation", str))
    choices = _choices(annotation)
    if choices:
        return one_of(*choices)
    if annotation in SCALARS:
        return SCALARS[annotation]
    name = param.name or ""
    if name.endswith("_col"):
        return "COLUMN"
    return TEXT_METAVARS.get(name, "TEXT")


def _no_type(ctx: Any) -> None:
    return None


def _map_param(param: Any, panels: dict[str, str | None]) -> None:
    if getattr(param, "metavar", None) is None:
        param.metavar = metavar(param)
    if param.param_type_name == "argument":
        param.display_type_rich = _no_type  # its metavar names it; no <str> beside it
        usage = param.metavar if param.required else f"[{param.metavar}]"
        param._usage_display_name = lambda: usage  # DATA, not typer's {DATA}
    elif param.name in panels and panels[param.name] is not None:
        param.rich_help_panel = panels[param.name]


def _panel_rank(param: Any) -> int:
    panel = getattr(param, "rich_help_panel", None)
    return SHOWN_ORDER.index(panel) if panel in SHOWN_ORDER else -1


def map_command(command: Any, name: str | None = None) -> None:
    """Gives the parameters of ``command`` (named ``name`` in the group) their panel and a
    readable metavar, in place, and has --help show the panels in SHOWN_ORDER (``params``
    keep their declared order); the one-line description in the command list is the
    first paragraph of its help, unwrapped."""
    panels = {**PANELS, **COMMAND_PANELS.get(name or "", {})}
    for param in command.params:
        _map_param(param, panels)
    declared = command.get_params

    def get_params(ctx: Any) -> list:
        params = declared(ctx)  # with --help, which click adds here
        for param in params:
            _map_param(param, panels)
        return sorted(params, key=_panel_rank)  # stable: declared order per panel

    command.get_params = get_params
    if command.help:
        command.help = unwrapped(command.help)
        if not command.short_help:
            command.short_help = command.help.split("\n\n")[0]


def unwrapped(help_text: str) -> str:
    """``help_text`` (a docstring) with each paragraph on one line, for the terminal to wrap:
    the help shows paragraphs after the first with the docstring's own line breaks, which
    at another width break lines in two. A paragraph marked ``\\b`` keeps its lines."""
    paragraphs = inspect.cleandoc(help_text).split("\n\n")
    return "\n\n".join(p if p.startswith("\b") else " ".join(p.split()) for p in paragraphs)


class HelpMapGroup(TyperGroup):
    """The ``ope`` group: its commands' options mapped (``map_command``) once built."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        map_command(self)
        for name, command in self.commands.items():
            map_command(command, name)
