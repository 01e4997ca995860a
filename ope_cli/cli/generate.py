"""``ope generate ENV OUT``: a synthetic logged dataset with known policy values."""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Annotated

import typer

from ope_cli.cli.groups import quietly
from ope_cli.cli.options import OptionGroup, Overwrite, option_groups

if TYPE_CHECKING:  # imported with the run (JAX)
    from ope_cli.envs.generate import GenerateOptions

# the names of ope_cli.envs.registry.ENVIRONMENTS and ope_cli.envs.base's DEFAULT_POLICIES and
# MAX_POLICIES (modules that import JAX, which --help does not)
ENVIRONMENT_CHOICES = "bandit|chain|control|gaussian"
DEFAULT_POLICIES = 3
MAX_POLICIES = 1000


EpisodesOption = Annotated[int, typer.Option(help="Number of logged episodes.")]
SeedOption = Annotated[int, typer.Option(help="Random seed; the same seed gives identical files.")]
GammaOption = Annotated[float, typer.Option(help="Discount factor of the true values.")]
HorizonOption = Annotated[
    int | None, typer.Option(help="Maximum episode length, where it applies.")
]
ShiftOption = Annotated[
    float,
    typer.Option(
        help="How far the evaluation policies are from the behavior policy (0 = identical)."
    ),
]
FilesOption = Annotated[int, typer.Option(help="Split the logs into this many Parquet files.")]
PoliciesOption = Annotated[
    int,
    typer.Option(
        help=f"Number of evaluation policies (1 to {MAX_POLICIES}), for selection studies: "
        "their true values spread from below the behavior policy's to well above it "
        "(the default 3: at --shift, half of it, and minus it)."
    ),
]


def _options(**values: object):
    """``ope generate``'s options as ``envs.generate.GenerateOptions`` (imported with the
    run: JAX)."""
    from ope_cli.envs.generate import GenerateOptions

    return GenerateOptions(**values)


# every option of ope generate, one parameter: GenerateOptions
OPTIONS = OptionGroup(
    (
        ("episodes", EpisodesOption, 1000),
        ("seed", SeedOption, 0),
        ("gamma", GammaOption, 1.0),
        ("horizon", HorizonOption, None),
        ("shift", ShiftOption, 0.5),
        ("files", FilesOption, 1),
        ("policies", PoliciesOption, DEFAULT_POLICIES),
        ("overwrite", Overwrite, False),
    ),
    _options,
)


@option_groups(options=quietly(OPTIONS))  # --quiet accepted: generate writes no progress
def generate(
    env: Annotated[
        str, typer.Argument(metavar=ENVIRONMENT_CHOICES, help="The environment to simulate.")
    ],
    out: Annotated[
        str,
        typer.Argument(
            metavar="OUT",
            help="Output directory (an earlier run's files there need --overwrite).",
        ),
    ],
    options: GenerateOptions,  # --episodes ... --overwrite, --quiet
) -> None:
    """Write a synthetic logged dataset whose evaluation policies' values are known.

    Writes OUT/logs.parquet (or OUT/logs/ with --files > 1), OUT/behavior.npz,
    OUT/policies/eval_*.npz (eval_00 ... with --policies 11 or more), OUT/truth.json (each
    policy's true value) and, for chain without --horizon, OUT/q/*.npz (each policy's exact
    Q, a tabular_q checkpoint).

    Examples (evaluate reads the gamma that generate declares in the data):

      ope generate chain demo --episodes 5000 --gamma 0.99

      ope evaluate demo/logs.parquet -p 'demo/policies/*' --truth demo/truth.json
    """
    from ope_cli.envs.generate import generate as write_environment

    sys.stdout.write(json.dumps(write_environment(env, out, options), indent=2) + "\n")
