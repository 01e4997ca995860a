"""``ope`` (the console script) and ``python -m ope_cli``: the command line, after the
process-wide settings that only a command line may make for its process."""

from __future__ import annotations

import os

# The host's NumPy work is many small matrix products (merging sums, jackknife leave-outs)
# while XLA's own thread pool runs the kernel: BLAS threads of their own only contend with
# it (a [32, 32] x [32, 1449] product took 29 ms instead of 0.4 ms on 2 busy cores). Set
# before NumPy loads; a user's own setting wins.
SINGLE_THREADED_BLAS = {"OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def main() -> None:
    """Runs the ``ope`` command line with single-threaded host BLAS."""
    for name, value in SINGLE_THREADED_BLAS.items():
        os.environ.setdefault(name, value)
    from ope_cli.cli import main as command_line

    command_line()


if __name__ == "__main__":
    main()
