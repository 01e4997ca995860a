"""``ope bench``'s configuration and the constants every bench module shares."""

from __future__ import annotations

import dataclasses
import os
import sys
from collections.abc import Callable
from pathlib import Path

from ope_cli.config import BatchingConfig

BENCH_SCHEMA_VERSION = 1
GAMMA = 0.99  # the discount of every bench measurement
DEFAULT_EPISODES = 6_000  # ~0.5M steps: about a minute; --episodes 24000 (2M) for the full study
DEFAULT_LOOP_EPISODES = 300
DEFAULT_MEMORY_STEPS = 200_000
MEMORY_FACTOR = 10
SCRIPT_STEPS = (3_000_000, 10_000_000)  # SPEC 6: no slower at the first, 2x faster at the second
ROUNDS = 3  # interleaved timed runs of every measurement; the fastest of each counts

Progress = Callable[[str], None]


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """Everything ``ope bench`` needs, independent of the terminal.

    Attributes:
      data: a step-layout Parquet file/directory to measure instead of generated data.
      episodes: episodes to generate (about 83 steps each).
      seed: seed of the generated data and checkpoints.
      policies: K, the linear_softmax checkpoints of the many-policies measurements (whole
        ``ope evaluate`` processes with K beside one, and the kernel alone with K stacked).
      precision: the kernel precision of the main measurements (None: as ``ope evaluate``).
      memory: also measure peak memory of ``ope evaluate`` subprocesses on 1x and 10x data.
      memory_steps: steps of the 1x memory dataset.
      script: also time whole ``ope evaluate`` processes against a plain NumPy script
        (``bench.script``) on generated data of ``script_steps`` steps.
      script_steps: the two sizes of the script comparison (SPEC 6: 3M and 10M steps).
      processes: also time whole processes (``bench.processes``): the import-jax floor,
        ``ope evaluate`` with an empty and a warm compilation cache, other data.
      loop_episodes: episodes the Python loop runs on (then extrapolated).
      out: directory for generated files (default: a temporary directory, removed after).
      batching: read and batch sizes, as ``ope evaluate``'s.
      rounds: timed runs of every measurement (in process, and whole warm processes and
        floors); the fastest of each counts.
    """

    data: str | None = None
    episodes: int = DEFAULT_EPISODES
    seed: int = 0
    policies: int = 4
    precision: str | None = None
    memory: bool = False
    memory_steps: int = DEFAULT_MEMORY_STEPS
    script: bool = False
    script_steps: tuple[int, int] = SCRIPT_STEPS
    processes: bool = True
    loop_episodes: int = DEFAULT_LOOP_EPISODES
    out: str | None = None
    batching: BatchingConfig = BatchingConfig()
    rounds: int = ROUNDS


def evaluate_command(data: str, checkpoint: str, batching: BatchingConfig) -> list[str]:
    """``ope evaluate DATA --policy CHECKPOINT`` with ``batching``, JSON on stdout, quiet,
    as a subprocess of this interpreter."""
    return [
        *(sys.executable, "-m", "ope_cli", "evaluate", str(data), "--policy", checkpoint),
        *("--format", "json", "--quiet", "--read-rows", str(batching.read_rows)),
        *("--batch-steps", str(batching.batch_steps), "--min-bucket", str(batching.min_bucket)),
    ]


def process_environment(directory: Path, **values: str) -> dict[str, str]:
    """The environment of the bench's whole processes: this one's with ``values``, Python
    bytecode read from and written to ``directory``/bytecode also where this environment
    writes none (PYTHONDONTWRITEBYTECODE): an installed package has its bytecode, and a
    process without it compiles ope's modules from source (about 0.1 s) every time."""
    env = dict(os.environ, PYTHONPYCACHEPREFIX=str(directory / "bytecode"), **values)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env
