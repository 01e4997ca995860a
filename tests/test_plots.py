"""``ope evaluate --plot DIR``: real PNG files, and a usage error without matplotlib (a real
process, whose imports a stub can break; the other runs are in process)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
FIGURES = ("weights.png", "horizon.png", "estimates.png", "ranking.png")


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


def test_plot_writes_png_figures(tmp_path, ope_in_process):
    pytest.importorskip("matplotlib")
    out = tmp_path / "figures" / "run-1"  # created, parents included
    run = ope_in_process(_args("--plot", out, "--format", "json"), cwd=tmp_path)
    assert run.returncode == 0, run
    assert len(json.loads(run.stdout)["results"]) == 2  # stdout still carries only the result
    for name in FIGURES:
        data = (out / name).read_bytes()
        assert data.startswith(PNG_MAGIC), name
        assert len(data) > 10_000, (name, len(data))  # axes, lines and text, not an empty canvas
    lines = run.stderr.splitlines()  # the figures' line, and the run's warnings
    assert all(line.startswith(("figures: ", "warning: ")) for line in lines), run
    assert any(line.startswith("figures: ") for line in lines), run


@pytest.mark.slow  # a process start: imports and JAX
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


def test_unwritable_plot_directory_is_a_usage_error(tmp_path, ope_in_process):
    pytest.importorskip("matplotlib")
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    run = ope_in_process(_args("--plot", blocker / "figures"), cwd=tmp_path)
    assert run.returncode == 2, run
    assert run.stdout == "" and "--plot" in run.stderr and "Traceback" not in run.stderr


def test_the_estimates_axis_is_set_by_the_estimates():
    """One very wide interval (a betting bound) does not set the axis: the values, with a
    few standard errors of room, do; the cut interval is marked in the figure."""
    from types import SimpleNamespace

    from ope_cli.estimation.stats import Estimate
    from ope_cli.report.plots import ESTIMATE_MARGIN, estimate_limits

    estimates = {
        "is": Estimate(1.0, 0.1, -50.0, 100.0),
        "wis": Estimate(2.0, 0.2, 1.5, 2.5),
        "wdr": Estimate(None, None, None, None, "undefined"),
    }
    result = SimpleNamespace(results=[SimpleNamespace(estimates=estimates, weightless=())])
    low, high = estimate_limits(result)
    assert low == pytest.approx(1.0 - ESTIMATE_MARGIN * 0.2)
    assert high == pytest.approx(2.0 + ESTIMATE_MARGIN * 0.2)
    nothing = SimpleNamespace(
        results=[SimpleNamespace(estimates={"wdr": estimates["wdr"]}, weightless=())]
    )
    assert estimate_limits(nothing) is None


def test_a_policy_without_weight_is_no_point_in_the_figures(tmp_path, monkeypatch):
    """Every weight zero: IS and PDIS are 0, the formula's value, which the table ranks
    with nothing and notes; the estimates and ranking figures drew them as points at 0,
    with no interval and no word. They are n/a there now, as WIS's undefined value is."""
    pytest.importorskip("matplotlib")
    from ope_cli.config import EvaluationConfig
    from ope_cli.estimation.pipeline import evaluate
    from ope_cli.report import plots

    (tmp_path / "ope_test_plot_never.py").write_text(
        "import jax.numpy as jnp\n\n\ndef never(observation, action):\n"
        "    return jnp.full((), -jnp.inf)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    config = EvaluationConfig(
        data=str(EXAMPLES / "data" / "logs.parquet"),
        policies=("never=ope_test_plot_never:never",),
        gamma=0.9,
        estimators=("is", "wis", "pdis"),
    )
    result = evaluate(config)
    (policy,) = result.results
    assert policy.estimates["is"].value == 0.0 and set(policy.weightless) >= {"is", "wis"}
    drawn = {}
    monkeypatch.setattr(
        plots, "_save", lambda plt, figure, out, shown: drawn.setdefault(out.name, figure)
    )
    plots.write_plots(result, tmp_path / "figures", rank_by="is")
    (axes,) = drawn["estimates.png"].axes
    points = [line for line in axes.get_lines() if line.get_marker() == "o"]
    assert all(len(line.get_xdata()) == 0 for line in points)  # nothing drawn at 0
    assert [t.get_text() for t in axes.texts] == ["n/a"] * 3
    (ranking,) = drawn["ranking.png"].axes
    assert [t.get_text() for t in ranking.texts] == ["n/a (no estimate)"]
    # every figure says the discount and its source, and the run's warnings (a figure shown
    # alone said neither)
    for name in plots.FIGURES:
        caption = drawn[name].get_supxlabel()
        assert caption.startswith("gamma = 0.9 (--gamma); warnings: "), name
        assert "all_weights_zero" in caption and "asymptotic_intervals" in caption, name


def _ranked_rows(count: int, truth: bool = True):
    """`count` RankedPolicy rows with estimates 0, 1, ... given in a shuffled order; the
    first could be the best, the rest are worse."""
    from ope_cli.report.plots import RankedPolicy

    order = np.random.default_rng(0).permutation(count)
    return [
        RankedPolicy(
            f"checkpoints/run/step_{k:04d}.npz",
            float(k),
            k - 0.4,
            k + 0.4,
            truth=k + 0.1 if truth else None,
            could_be_best=k == count - 1,
        )
        for k in order
    ]


def _png_size(path: Path) -> tuple[int, int]:
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC)
    return int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")


@pytest.mark.parametrize(
    ("count", "truth"),
    [
        (1, True),
        (1, False),
        (3, True),
        (3, False),
        (100, True),  # a tall figure takes about a second to draw and encode
        pytest.param(100, False, marks=pytest.mark.slow),
    ],
)
def test_ranking_figure_writes_a_png(count, truth, tmp_path):
    pytest.importorskip("matplotlib")
    from ope_cli.report.plots import ranking_figure

    rows = _ranked_rows(count, truth)
    path = tmp_path / "figures" / "ranking.png"  # its directory created
    written = ranking_figure(rows, path, estimator="wis", baseline=rows[0].name, confidence=0.95)
    assert written == path and path.stat().st_size > 5_000
    width, height = _png_size(path)
    assert width == 960 and height > (3000 if count == 100 else 200)  # a row per policy


def test_ranking_figure_draws_the_ranking(tmp_path, monkeypatch):
    """Best estimate at the top, the policies without one last (n/a), the baseline bold with
    a line at its estimate, a cross per true value, a triangle where an interval is cut."""
    pytest.importorskip("matplotlib")
    from ope_cli.report import plots
    from ope_cli.report.plots import RankedPolicy

    drawn = []
    monkeypatch.setattr(plots, "_save", lambda plt, figure, out, shown: drawn.append(figure))
    rows = [
        RankedPolicy("behavior", 1.0, 0.9, 1.1, truth=1.0),
        RankedPolicy("eval_0", 2.0, 1.5, 2.5, truth=1.8, could_be_best=True),
        RankedPolicy("broken", None, truth=0.5),
        RankedPolicy("eval_1", 1.5, 1.2, 1e6, could_be_best=True),  # a betting bound
        RankedPolicy("nan", float("nan")),
        RankedPolicy("eval_2", 0.2, 0.0, 0.4, truth=0.1, could_be_best=False),
    ]
    plots.ranking_figure(rows, tmp_path / "r.png", estimator="wis", baseline="behavior")
    (axes,) = drawn[0].axes
    labels = [t.get_text() for t in axes.get_yticklabels()]
    assert labels == ["eval_0", "eval_1", "behavior", "eval_2", "broken", "nan"]
    bold = [t.get_text() for t in axes.get_yticklabels() if t.get_fontweight() == "bold"]
    assert bold == ["behavior"]
    assert [t.get_text() for t in axes.texts] == ["n/a (no estimate)"] * 2
    lines = {line.get_marker(): line for line in axes.get_lines()}
    assert list(lines["x"].get_xdata()) == [1.8, 1.0, 0.1, 0.5]  # truths, by row
    assert list(lines["x"].get_ydata()) == [0, 2, 3, 4]
    assert list(lines[">"].get_ydata()) == [1]  # eval_1's interval is cut at the axis
    assert axes.get_xlim()[1] < 10 and "triangles" in axes.get_title()
    dashed = [line for line in axes.get_lines() if line.get_linestyle() == "--"]
    assert [line.get_xdata()[0] for line in dashed] == [1.0]  # the baseline's estimate
    legend = [t.get_text() for t in drawn[0].legends[0].get_texts()]
    assert {"could be the best", "confidently worse", "baseline: behavior", "true value"} <= set(
        legend
    )


def test_ranking_limits_are_set_by_the_values():
    from ope_cli.report.plots import RANKING_MARGIN, RankedPolicy, ranking_limits

    rows = [RankedPolicy("a", 1.0, 0.8, 1.2), RankedPolicy("b", 2.0, -50.0, 100.0, truth=3.0)]
    low, high = ranking_limits(rows)
    typical = float(np.median([0.2, 75.0]))
    assert (low, high) == pytest.approx(
        (1.0 - RANKING_MARGIN * typical, 3.0 + RANKING_MARGIN * typical)
    )
    assert ranking_limits([RankedPolicy("a", None), RankedPolicy("b", float("inf"))]) is None
    assert ranking_limits([RankedPolicy("one", 0.3)]) == pytest.approx((-0.7, 1.3))


def test_ranking_figure_without_any_estimate(tmp_path):
    pytest.importorskip("matplotlib")
    from ope_cli.report.plots import RankedPolicy, ranking_figure

    path = ranking_figure([RankedPolicy("a", None)], tmp_path / "r.png", estimator="is")
    assert _png_size(path)[1] > 100
    assert ranking_figure([], tmp_path / "empty.png", estimator="is").is_file()


def test_the_ranking_marks_a_baseline_only_when_one_is_chosen():
    """Without --baseline the ranking has no baseline row (a policy without a label matched
    the absent baseline: the first one was drawn as "baseline" while JSON said null); with
    one, that policy's row."""
    import ope_cli
    from ope_cli.report.plots import ranked_rows

    data = str(EXAMPLES / "data" / "logs.parquet")
    policies = [str(EXAMPLES / "policies" / name) for name in ("ckpt.npz", "other.npz")]
    plain = ope_cli.evaluate(data, policies=policies, gamma=0.99)
    rows, baseline = ranked_rows(plain, "wis")
    assert baseline is None and len(rows) == 2
    compared = ope_cli.evaluate(data, policies=policies, gamma=0.99, baseline=policies[1])
    rows, baseline = ranked_rows(compared, "wis")
    assert baseline == compared.results[1].shown and baseline in [r.name for r in rows]


def test_the_horizon_of_one_step_episodes_is_drawn(tmp_path, monkeypatch):
    """One-step episodes (a bandit log): each per-step curve is one point, which a line
    without a marker does not draw, so both panels of horizon.png were empty."""
    pytest.importorskip("matplotlib")
    import pyarrow as pa
    import pyarrow.parquet as pq

    from ope_cli.config import EvaluationConfig
    from ope_cli.estimation.pipeline import evaluate
    from ope_cli.report import plots

    rng = np.random.default_rng(0)
    pq.write_table(
        pa.table(
            {
                "episode_id": np.arange(50),
                "action": rng.integers(0, 2, 50),
                "reward": rng.uniform(size=50),
                "behavior_prob": np.full(50, 0.5),
                "target_prob": rng.uniform(0.2, 0.8, 50),
            }
        ),
        tmp_path / "bandit.parquet",
    )
    result = evaluate(EvaluationConfig(data=str(tmp_path / "bandit.parquet"), gamma=0.9))
    drawn = {}
    monkeypatch.setattr(
        plots, "_save", lambda plt, figure, out, shown: drawn.setdefault(out.name, figure)
    )
    plots.write_plots(result, tmp_path / "figures")
    for axes in drawn["horizon.png"].axes:
        (curve,) = [line for line in axes.get_lines() if line.get_linestyle() != "--"]
        assert len(curve.get_xdata()) == 1 and curve.get_marker() == "o"


@pytest.fixture(scope="module")
def one_policy():
    """The shipped example evaluated for one policy (gamma 0.9): copied into many."""
    from ope_cli.config import EvaluationConfig
    from ope_cli.estimation.pipeline import evaluate

    return evaluate(
        EvaluationConfig(
            data=str(EXAMPLES / "data" / "logs.parquet"),
            policies=(str(EXAMPLES / "policies" / "ckpt.npz"),),
            gamma=0.9,
        )
    )


def test_many_policies_get_their_own_colours_and_a_missing_interval_is_hollow(
    tmp_path, monkeypatch, one_policy
):
    """With 20 policies the estimates figure gave eval_00 and eval_10 one colour (the
    default cycle of 10) and its legend covered the estimates; an estimate without an
    interval was a bare dot, as a zero-width interval is drawn."""
    pytest.importorskip("matplotlib")
    import dataclasses

    from matplotlib.colors import to_hex

    from ope_cli.report import plots

    one = one_policy
    (base,) = one.results
    bare = {
        name: dataclasses.replace(e, ci_low=None, ci_high=None)
        for name, e in base.estimates.items()
    }
    results = [dataclasses.replace(base, policy=f"p{i:02d}", label=None) for i in range(20)]
    results[3] = dataclasses.replace(results[3], estimates=bare)
    result = dataclasses.replace(one, results=results)
    drawn = {}
    monkeypatch.setattr(
        plots, "_save", lambda plt, figure, out, shown: drawn.setdefault(out.name, figure)
    )
    plots.write_plots(result, tmp_path / "figures")
    (axes,) = drawn["estimates.png"].axes
    legend = axes.get_legend()
    colours = {to_hex(bars.lines[0].get_color()) for bars in axes.containers}
    assert len(colours) == 20
    drawn["estimates.png"].canvas.draw()  # beside the axes, not over the estimates
    assert legend.get_window_extent().x0 >= axes.get_window_extent().x1
    hollow = [line for line in axes.get_lines() if line.get_markerfacecolor() == "none"]
    assert len(hollow) == 1 and len(hollow[0].get_xdata()) == len(result.estimators)
    assert "hollow: no interval" in axes.get_title()


def test_a_plot_directory_that_is_a_file_is_refused_before_the_run(tmp_path):
    """--plot FILE ran the whole evaluation, then said "cannot create the directory: File
    exists"."""
    from ope_cli.errors import UsageError
    from ope_cli.report.plots import check_plot_directory

    blocker = tmp_path / "afile"
    blocker.write_text("")
    with pytest.raises(UsageError, match=r"--plot .*afile: a file, where a directory is wanted"):
        check_plot_directory(blocker)
    check_plot_directory(tmp_path)  # a directory, or
    check_plot_directory(tmp_path / "new")  # one to be made: fine


def test_a_figure_of_many_policies_names_them_elsewhere_rather_than_breaking(tmp_path, one_policy):
    """With 100 policies each figure's legend ran off it, cut, and collapsed its axes (the
    plotting library's warning said so on stderr, then was silenced): past 20 a line says
    ranking.png names each, and no figure warns."""
    pytest.importorskip("matplotlib")
    import dataclasses
    import warnings

    from ope_cli.report import plots

    many = [dataclasses.replace(one_policy.results[0], policy=f"p{i:03d}") for i in range(100)]
    result = dataclasses.replace(one_policy, results=many)
    drawn = {}

    def keep(plt, figure, out, shown):
        figure.canvas.draw()  # lays it out, as saving does
        drawn[out.name] = figure
        return out

    with pytest.MonkeyPatch.context() as patch, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        patch.setattr(plots, "_save", keep)
        plots.write_plots(result, tmp_path / "figures")
    assert [str(w.message) for w in caught] == []
    for name in ("weights.png", "horizon.png", "estimates.png"):
        axes = drawn[name].axes[0]
        assert axes.get_legend() is None, name
        assert "(100 policies, too many to name by colour: ranking.png lists each)" in (
            axes.get_title()
        ), name
        assert axes.get_position().width > 0.5, name  # not collapsed by a legend beside it


@pytest.mark.parametrize("existed", [False, True])
def test_an_interrupted_plot_leaves_no_figure(tmp_path, monkeypatch, one_policy, existed):
    """Ctrl-C while the figures were written left one to three of them, one cut short
    (and the next run refused them as existing): they go, and a directory made for them."""
    pytest.importorskip("matplotlib")
    from ope_cli.report import plots

    save = plots._save
    saved = []

    def interrupted_at_the_third(plt, figure, path, shown):
        if len(saved) == 2:
            path.write_bytes(b"\x89PNG cut short")
            raise KeyboardInterrupt
        saved.append(save(plt, figure, path, shown))
        return saved[-1]

    monkeypatch.setattr(plots, "_save", interrupted_at_the_third)
    out = tmp_path / "figures"
    if existed:
        out.mkdir()
        (out / "notes.txt").write_text("mine")
    with pytest.raises(KeyboardInterrupt):
        plots.write_plots(one_policy, out)
    assert len(saved) == 2
    assert (sorted(p.name for p in out.iterdir()) == ["notes.txt"]) if existed else not out.exists()


def test_a_cleanup_that_fails_leaves_the_error_that_stopped_the_plots(
    tmp_path, monkeypatch, one_policy
):
    """A figure that could not be written (a usage error) in a folder whose older figures
    cannot be removed either ended as an internal error, the cleanup's."""
    pytest.importorskip("matplotlib")
    from ope_cli.errors import UsageError
    from ope_cli.report import plots

    def unwritable(plt, figure, path, shown):
        plt.close(figure)
        raise UsageError(f"--plot {shown}: cannot write {path.name}: Permission denied")

    def refused(self, missing_ok=False):
        raise PermissionError("Permission denied")

    monkeypatch.setattr(plots, "_save", unwritable)
    monkeypatch.setattr(plots.Path, "unlink", refused)
    with pytest.raises(UsageError, match="cannot write weights.png"):
        plots.write_plots(one_policy, tmp_path / "figures")
