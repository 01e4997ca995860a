"""``ope evaluate --plot DIR``: real PNG files, and a usage error without matplotlib."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FIGURES = ("weights.png", "horizon.png", "estimates.png")


def _args(*extra):
    return [
        "evaluate",
        str(EXAMPLES / "data" / "logs.parquet"),
        "-p",
        str(EXAMPLES / "policies" / "ckpt.npz"),
        "-p",
        str(EXAMPLES / "policies" / "other.npz"),
        *extra,
    ]


def test_plot_writes_png_figures(tmp_path, ope):
    pytest.importorskip("matplotlib")
    out = tmp_path / "figures" / "run-1"  # created, parents included
    run = ope(_args("--plot", out, "--format", "json"), cwd=tmp_path)
    assert run.returncode == 0, run
    assert len(json.loads(run.stdout)["results"]) == 2  # stdout still carries only the result
    for name in FIGURES:
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC), name
        assert len(data) > 10_000, (name, len(data))  # axes, lines and text, not an empty canvas
    assert "error" not in run.stderr.lower(), run


def test_plot_without_matplotlib_is_a_usage_error(tmp_path, ope):
    """A stub ``matplotlib`` that fails to import, first on the path, stands in for a
    missing install: exit 2, one line naming the extra, nothing on stdout, no run."""
    stub = tmp_path / "stub" / "matplotlib"
    stub.mkdir(parents=True)
    (stub / "__init__.py").write_text("raise ImportError('No module named matplotlib')\n")
    run = ope(
        _args("--plot", tmp_path / "figures"),
        cwd=tmp_path,
        env={"PYTHONPATH": str(tmp_path / "stub")},
    )
    assert run.returncode == 2, run
    assert run.stdout == ""
    assert "ope: usage error: --plot needs matplotlib" in run.stderr
    assert "ope-cli[plot]" in run.stderr and "Traceback" not in run.stderr
    assert not (tmp_path / "figures").exists()


def test_unwritable_plot_directory_is_a_usage_error(tmp_path, ope):
    pytest.importorskip("matplotlib")
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    run = ope(_args("--plot", blocker / "figures"), cwd=tmp_path)
    assert run.returncode == 2, run
    assert run.stdout == "" and "--plot" in run.stderr and "Traceback" not in run.stderr


def test_the_estimates_axis_is_set_by_the_estimates():
    """One very wide interval (a betting bound) does not set the axis: the values, with a
    few standard errors of room, do; the cut interval is marked in the figure."""
    from types import SimpleNamespace

    from ope_cli.report.plots import ESTIMATE_MARGIN, estimate_limits
    from ope_cli.stats import Estimate

    estimates = {
        "is": Estimate(1.0, 0.1, -50.0, 100.0),
        "wis": Estimate(2.0, 0.2, 1.5, 2.5),
        "wdr": Estimate(None, None, None, None, "undefined"),
    }
    result = SimpleNamespace(results=[SimpleNamespace(estimates=estimates)])
    low, high = estimate_limits(result)
    assert low == pytest.approx(1.0 - ESTIMATE_MARGIN * 0.2)
    assert high == pytest.approx(2.0 + ESTIMATE_MARGIN * 0.2)
    nothing = SimpleNamespace(results=[SimpleNamespace(estimates={"wdr": estimates["wdr"]})])
    assert estimate_limits(nothing) is None
