"""``ope bench``: the performance targets of SPEC section 6, measured as ratios in one run.

Modules: ``config`` (BenchConfig, shared constants), ``data`` (generated long-tailed data
and checkpoints), ``batches`` (the data opened once and padded as ``ope evaluate`` pads it),
``twin`` (the vectorised NumPy twin of the estimators), ``loop`` (the per-episode Python
loop baseline), ``measure`` and ``memory`` (timed trials, peak RSS), ``summary`` (ratios
and targets), ``run`` (``bench(config)``: everything, as one JSON-ready dict). The command is
``ope_cli.cli.bench``; ``ope_cli.report.bench`` renders the table and JSON.

Importing the package stays light (no NumPy, pyarrow or JAX): ``bench`` loads the
measuring modules when it is called.
"""

from __future__ import annotations

from ope_cli.bench.config import BenchConfig, Progress

__all__ = ["BenchConfig", "bench"]


def bench(config: BenchConfig, on_progress: Progress | None = None) -> dict:
    """Runs every measurement on one dataset and returns the JSON-ready result
    (``ope_cli.bench.run.bench``; imported here on first call, it pulls in JAX)."""
    from ope_cli.bench.run import bench as run_bench

    return run_bench(config, on_progress)
