"""The public API of ``ope_cli`` (``__all__``), loaded lazily."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import ope_cli

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def test_all_lists_the_api_and_every_name_resolves():
    for name in ("evaluate", "inspect", "generate", "EvaluationConfig", "EvaluationResult"):
        assert name in ope_cli.__all__
    for name in ("InspectConfig", "InspectReport", "PolicyResult", "OpeError"):
        assert name in ope_cli.__all__
    for name in ope_cli.__all__:
        assert getattr(ope_cli, name) is not None, name
    assert set(ope_cli.__all__) <= set(dir(ope_cli))


def test_names_are_the_core_objects():
    from ope_cli import config, errors, pipeline, results

    assert ope_cli.evaluate is pipeline.evaluate
    assert ope_cli.EvaluationConfig is config.EvaluationConfig
    assert ope_cli.EvaluationResult is results.EvaluationResult
    assert ope_cli.DataError is errors.DataError


def test_functions_keep_their_names_next_to_same_named_modules():
    """ope_cli.inspect and ope_cli.generate are also modules; the package keeps the
    functions however the modules were imported."""
    import ope_cli.generate  # noqa: F401
    import ope_cli.inspect  # noqa: F401
    from ope_cli import generate, inspect

    assert callable(inspect) and inspect.__module__ == "ope_cli.inspect"
    assert callable(generate) and generate.__module__ == "ope_cli.generate"
    assert ope_cli.inspect is inspect


def test_unknown_names_raise_attribute_error():
    with pytest.raises(AttributeError, match="no_such_name"):
        ope_cli.no_such_name  # noqa: B018


def test_evaluate_through_the_public_api():
    config = ope_cli.EvaluationConfig(
        data=str(EXAMPLES / "data" / "logs.parquet"),
        policies=(str(EXAMPLES / "policies" / "ckpt.npz"),),
    )
    result = ope_cli.evaluate(config)
    assert isinstance(result, ope_cli.EvaluationResult)
    assert result.precision == "float64"  # the runtime is configured without the CLI
    assert set(result.results[0].estimates) == {"is", "wis", "pdis", "wpdis"}


def _modules_after(code: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return done.stdout


def test_importing_the_package_and_the_cli_does_not_import_jax():
    code = "import sys, ope_cli, ope_cli.cli; print(sorted(m for m in sys.modules if 'jax' in m))"
    assert _modules_after(code).strip() == "[]"


def test_help_does_not_import_jax():
    code = (
        "import contextlib, io, sys\n"
        "from ope_cli.cli import run\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    for argv in (['--help'], ['evaluate', '--help'], ['--version']):\n"
        "        assert run(argv) == 0\n"
        "print('jax' in sys.modules)\n"
    )
    assert _modules_after(code).strip() == "False"
