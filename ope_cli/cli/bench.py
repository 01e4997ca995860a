"""``ope bench``: measurements of the tool on generated or given data.

The command itself (options and rendering) is declared by ``ope_cli.bench.register``.
"""

from __future__ import annotations

import typer

from ope_cli import bench


def register(app: typer.Typer) -> None:
    """Adds the ``bench`` command to ``app``."""
    bench.register(app)
