"""``ope`` (the console script) and ``python -m ope_cli``: the command line, after the
process-wide settings that only a command line may make for its process."""

from __future__ import annotations

import os
import sys

# The host's NumPy work is many small matrix products (merging sums, jackknife leave-outs)
# while XLA's own thread pool runs the kernel: BLAS threads of their own only contend with
# it (a [32, 32] x [32, 1449] product took 29 ms instead of 0.4 ms on 2 busy cores). Set
# before NumPy loads; a user's own setting wins.
SINGLE_THREADED_BLAS = {"OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

# glibc's mallopt options and the values ope sets: arrays up to 64 MiB come from the heap,
# and up to 256 MiB of freed memory stays there (64 MiB of padding when it grows). Each
# batch's per-step sums of every policy are allocated and freed again; returned to the
# system at once, every reuse faulted its pages back in (100 policies on 0.5M steps:
# 0.8M page faults, 3-4 s of system time; 0.17M and about 1 s with these; peak RSS +8%).
KEEP_FREED_MEMORY = {-3: 64 << 20, -1: 256 << 20, -2: 64 << 20}  # MMAP_, TRIM_, TOP_PAD


def keep_freed_memory() -> bool:
    """Sets KEEP_FREED_MEMORY with glibc's ``mallopt``; False where there is none. (ctypes
    loads here, once Ctrl-C is handled: imported above, a signal in it was a traceback.)"""
    import ctypes

    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError, TypeError):  # not glibc, or no C library to open
        return False
    return all(mallopt(option, value) == 1 for option, value in KEEP_FREED_MEMORY.items())


class _Hidden:
    """A meta path finder under which the top-level package ``name`` cannot be imported."""

    def __init__(self, name: str):
        self.name = name

    def find_spec(self, fullname: str, path=None, target=None):
        if fullname == self.name:
            raise ModuleNotFoundError(f"{fullname} is hidden while pyarrow loads", name=fullname)
        return None


def load_pyarrow_without_pandas() -> None:
    """Loads pyarrow and pyarrow.dataset with pandas hidden.

    Where pandas is installed, pyarrow imports it (0.2 s, a sixth of a small run) when
    pyarrow.dataset loads and at its first conversion, only to recognise pandas objects,
    which the command line never hands it; it looks once per process. A user's code can
    still import pandas afterwards, and pyarrow's pandas functions (``to_pandas``) load it
    when called. Nothing is hidden where pandas or pyarrow is already loaded."""
    if "pandas" in sys.modules or "pyarrow" in sys.modules:
        return
    hidden = _Hidden("pandas")
    sys.meta_path.insert(0, hidden)
    try:
        import pyarrow.dataset  # noqa: F401 - loaded here, with pandas hidden
        import pyarrow.lib

        # pyarrow's look for pandas, made now if loading did not make it
        getattr(getattr(pyarrow.lib, "_pandas_api", None), "have_pandas", None)
    finally:
        sys.meta_path.remove(hidden)


def main() -> None:
    """Runs the ``ope`` command line with Ctrl-C handled (``interrupts``), single-threaded
    host BLAS, freed memory kept and pyarrow loaded without pandas."""
    from ope_cli import interrupts

    interrupts.install()
    for name, value in SINGLE_THREADED_BLAS.items():
        os.environ.setdefault(name, value)
    try:  # Ctrl-C while the modules load: one line, as later (it printed a traceback)
        keep_freed_memory()
        load_pyarrow_without_pandas()
        from ope_cli.cli import main as command_line
    except KeyboardInterrupt:
        interrupts.exit_interrupted()
    command_line()


if __name__ == "__main__":
    main()
