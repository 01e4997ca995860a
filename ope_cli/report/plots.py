"""PNG figures of an evaluation result (``ope evaluate --plot DIR``).

matplotlib is an optional extra (``pip install 'ope-cli[plot]'``): it is imported only
here, lazily, with the non-interactive Agg backend, so the rest of the tool never needs
it and no window ever opens. Every figure is drawn from the result object alone, except
the ranking figure (``ranking_figure``), drawn from ``RankedPolicy`` rows: one estimator's
estimates and intervals of every policy, with a baseline, true values and the set of
policies that could be the best where they are known (SPEC section 11).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from ope_cli.errors import UsageError
from ope_cli.estimation.run_plan import GAMMA_SOURCES
from ope_cli.report.formatting import discount, estimator_title, level
from ope_cli.report.table import ranked_warnings, resolve_rank_by
from ope_cli.results import EvaluationResult, estimated

FIGURES = ("weights.png", "horizon.png", "estimates.png", "ranking.png")
ESTIMATE_MARGIN = 4.0  # standard errors of room around the estimates on their axis
RANKING_MARGIN = 2.0  # median interval half-widths of room around the ranked values
RANKING_ROW_INCHES = 0.28  # the ranking figure grows by this much per policy
DPI = 120


def require_matplotlib():
    """The matplotlib module, or a usage error (exit 2) that names the extra to install."""
    try:
        import matplotlib
    except ImportError:
        raise UsageError(
            "--plot needs matplotlib, an optional extra: pip install 'ope-cli[plot]' "
            "(or pip install matplotlib)"
        ) from None
    return matplotlib


def _pyplot():
    matplotlib = require_matplotlib()
    matplotlib.use("Agg", force=True)  # files only: no display, no GUI toolkit
    import matplotlib.pyplot as plt

    return plt


def check_plot_directory(directory: str | Path) -> None:
    """A usage error where ``directory`` is an existing file: said before the run (after it,
    as "cannot create the directory: File exists")."""
    if not str(directory):  # the working directory, which "--plot ." names plainly
        raise UsageError("--plot needs a directory; an empty path names none")
    if Path(directory).exists() and not Path(directory).is_dir():
        raise UsageError(f"--plot {directory}: a file, where a directory is wanted")


def _create(directory: str | Path) -> Path:
    """``directory``, created with its parents if needed (a usage error if it cannot be)."""
    out = Path(directory)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(
            f"--plot {directory}: cannot create the directory: {error.strerror}"
        ) from None
    return out


def _save(plt, figure, path: Path, shown: str | Path) -> Path:
    """Writes ``figure`` to ``path`` as PNG and closes it; a usage error naming ``shown`` (the
    --plot value) if it cannot be written."""
    try:
        figure.savefig(path, dpi=DPI)
    except OSError as error:
        raise UsageError(f"--plot {shown}: cannot write {path.name}: {error.strerror}") from None
    finally:
        plt.close(figure)
    return path


def write_plots(
    result: EvaluationResult, directory: str | Path, rank_by: str | None = None
) -> list[Path]:
    """Writes weights.png, horizon.png, estimates.png and ranking.png (by ``rank_by``, the
    table's ranking estimator) into ``directory`` (created if needed) and returns their
    paths. Interrupted or failed part way, it removes the four (a Ctrl-C left one to three
    figures, one of them cut short) and the directory it created."""
    plt = _pyplot()
    existed = Path(directory).is_dir()
    out = _create(directory)
    try:
        with warnings.catch_warnings():
            # the plotting library's line for a glyph missing from its font (a box in the
            # figure) reached stderr, --quiet or not
            warnings.filterwarnings("ignore", message="Glyph .* missing from")
            return _write_all(plt, result, out, directory, rank_by)
    except BaseException:
        for name in FIGURES:
            with contextlib.suppress(OSError):  # the error that stopped it is the one to say
                (out / name).unlink()
        if not existed:
            with contextlib.suppress(OSError):
                out.rmdir()
        raise


def _write_all(plt, result: EvaluationResult, out: Path, directory, rank_by) -> list[Path]:
    caption = run_caption(result, rank_by)
    drawn = zip(FIGURES, (_weights, _horizon, _estimates), strict=False)
    written = []
    for name, draw in drawn:
        figure = draw(plt, result)
        _caption(figure, caption)
        written.append(_save(plt, figure, out / name, directory))
    estimator = resolve_rank_by(result, rank_by)
    rows, baseline = ranked_rows(result, estimator)
    ranking = ranking_figure(
        rows,
        out / FIGURES[-1],
        estimator=estimator,
        baseline=baseline,
        confidence=result.confidence.level,
        caption=caption,
    )
    return [*written, ranking]


def run_caption(result: EvaluationResult, rank_by: str | None = None) -> str:
    """What every figure of a run says below it: the discount and where it comes from, and
    the codes of the run's warnings, as JSON lists them (a figure shown alone hid both: a
    WIS interval on an effective sample size of 1.5% was drawn as tight, with no word)."""
    words = f"gamma = {discount(result.gamma)} ({GAMMA_SOURCES.get(result.gamma_source, '')})"
    codes = list(dict.fromkeys(w.code for w in ranked_warnings(result, rank_by)))
    if codes:
        words += f"; warnings: {', '.join(codes)} (the report says what each means)"
    return words


def _caption(figure, caption: str | None) -> None:
    if caption:
        figure.supxlabel(caption, fontsize="small", wrap=True)


def ranked_rows(result: EvaluationResult, estimator: str) -> tuple[list[RankedPolicy], str | None]:
    """(the ranking figure's rows of ``estimator``, the baseline's row name or None): every
    policy, and with ``--baseline behavior`` the logging policy (its mean return)."""
    truth = result.truth or {}
    rows = []
    for policy in result.results:
        e = policy.estimates[estimator]
        rows.append(
            RankedPolicy(
                policy.shown,
                estimated(policy, estimator),
                e.ci_low,
                e.ci_high,
                truth.get(policy.source or policy.policy),
                (policy.could_be_best or {}).get(estimator),
            )
        )
    baseline = result.baseline
    if baseline == "behavior" and result.behavior_value is not None:
        rows.append(RankedPolicy("behavior", result.behavior_value, truth=truth.get("behavior")))
        return rows, "behavior"
    for policy in result.results:
        if baseline is not None and baseline in (policy.policy, policy.label, policy.source):
            return rows, policy.shown  # (a policy without a label has None there)
    return rows, None


def _label(name: str, limit: int = 48) -> str:
    """A legend label: long checkpoint paths keep their informative end."""
    return name if len(name) <= limit else "…" + name[-(limit - 1) :]


def _weights(plt, result: EvaluationResult):
    """The distribution of log10 trajectory weights, one outline per policy."""
    figure, axes = plt.subplots(figsize=(8, 4.5), layout="constrained")
    occupied = []
    colours = policy_colours(plt, len(result.results))
    for colour, policy in zip(colours, result.results, strict=True):
        p = policy.profile
        inside = p.histogram_counts[1:-1]
        if inside.any():
            nonzero = np.flatnonzero(inside)
            occupied += [p.histogram_edges[nonzero[0]], p.histogram_edges[nonzero[-1] + 1]]
        extra = []
        if p.histogram_counts[0]:
            extra.append(f"{int(p.histogram_counts[0])} below 1e{p.histogram_edges[0]:g}")
        if p.histogram_counts[-1]:
            extra.append(f"{int(p.histogram_counts[-1])} above 1e{p.histogram_edges[-1]:g}")
        if p.zero_weights:
            extra.append(f"{p.zero_weights} zero")
        label = _label(policy.shown) + (f" ({', '.join(extra)})" if extra else "")
        axes.stairs(
            inside / max(result.dataset.episodes, 1),
            p.histogram_edges,
            label=label,
            linewidth=1.5,
            color=colour,
        )
    low, high = (min(occupied), max(occupied)) if occupied else (-1.0, 1.0)
    axes.set_xlim(min(low, -0.5) - 0.25, max(high, 0.5) + 0.25)
    if occupied:  # a log axis: the tail of few heavy weights stays visible beside the bulk
        axes.set_yscale("log")
    axes.axvline(0.0, color="grey", linestyle="--", linewidth=1, label="weight 1")
    axes.set_xlabel("log10 trajectory weight  W = prod_t pi_e / pi_b")
    axes.set_ylabel("share of episodes")
    axes.set_title("Trajectory importance weights")
    policy_legend(axes, len(result.results))
    return figure


def _horizon(plt, result: EvaluationResult):
    """The WPDIS estimate summed up to each step, and the mean weight per step."""
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True, layout="constrained")
    colours = policy_colours(plt, len(result.results))
    for colour, policy in zip(colours, result.results, strict=True):
        p = policy.profile
        steps = np.arange(p.wpdis_partial_t.size)
        # a line of one point (one-step episodes: a bandit log) is not drawn without a marker
        marker = "o" if steps.size == 1 else ""
        label = _label(policy.shown)
        top.plot(steps, p.wpdis_partial_t, marker, label=label, linewidth=1.5, color=colour)
        mean_weight = np.where(p.mean_weight_t > 0, p.mean_weight_t, np.nan)
        bottom.plot(steps, mean_weight, marker, linewidth=1.5, color=colour)
    top.set_ylabel("WPDIS up to step t")
    top.set_title(f"Per-decision estimate over the horizon (gamma = {discount(result.gamma)})")
    policy_legend(top, len(result.results))
    bottom.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    positive = np.concatenate(
        [
            r.profile.mean_weight_t[
                np.isfinite(r.profile.mean_weight_t) & (r.profile.mean_weight_t > 0)
            ]
            for r in result.results
        ]
    )
    if positive.size and positive.max() / positive.min() > 10:
        bottom.set_yscale("log")  # weights are multiplicative: a log axis shows drift both ways
    bottom.set_xlabel("step t")
    bottom.set_ylabel("mean weight (1/n) sum_i W_it")
    bottom.set_title("Mean cumulative weight per step (about 1 when propensities are right)")
    return figure


def estimate_limits(result: EvaluationResult) -> tuple[float, float] | None:
    """The estimates axis: the values with room for a few standard errors, so one wide
    interval (a betting bound near the largest possible return) does not flatten the rest;
    None without any value."""
    values = [
        value
        for p in result.results
        for name in p.estimates
        if (value := estimated(p, name)) is not None
    ]
    if not values:
        return None
    stderrs = [
        e.stderr for p in result.results for e in p.estimates.values() if e.stderr is not None
    ]
    low, high = min(values), max(values)
    margin = max(ESTIMATE_MARGIN * max(stderrs, default=0.0), 0.1 * (high - low), 1e-9)
    return low - margin, high + margin


def _estimates(plt, result: EvaluationResult):
    """Every estimate with its confidence interval, grouped by estimator, one colour per
    policy; interval ends beyond the axis (set by the estimates) are cut there and marked
    with a triangle."""
    figure, axes = plt.subplots(figsize=(8, 4.5), layout="constrained")
    names = list(result.estimators)
    count = len(result.results)
    width = 0.8 / max(count, 1)
    colours = policy_colours(plt, count)
    limits = estimate_limits(result)
    drawn = [
        _policy_estimates(
            axes,
            policy,
            dict(zip(names, (j - 0.4 + width * (i + 0.5) for j in range(len(names))), strict=True)),
            colours[i],
            limits,
        )
        for i, policy in enumerate(result.results)
    ]
    if limits is not None:
        axes.set_ylim(*limits)
    axes.set_xticks(range(len(names)), [estimator_title(n) for n in names])
    axes.set_ylabel("estimated value")
    clipped, bare = (any(flags) for flags in zip(*drawn, strict=True)) if drawn else (False, False)
    _title_and_legend(axes, result, clipped, bare)
    return figure


def _policy_estimates(axes, policy, positions, colour, limits) -> tuple[bool, bool]:
    """One policy's estimates at x ``positions`` ({estimator: x} of the run's): points with
    their intervals, cut at the axis ``limits`` (triangles), hollow without an interval,
    "n/a" without an estimate. Returns (an interval was cut, a point is hollow)."""
    bottom, top = limits if limits is not None else (-np.inf, np.inf)
    xs, values, low, high, cut_low, cut_high, missing, no_interval = ([] for _ in range(8))
    for name, x in positions.items():
        e = policy.estimates.get(name)
        if estimated(policy, name) is None:
            missing.append(x)
            continue
        if e.ci_low is None and e.ci_high is None:  # hollow: not a zero-width interval
            no_interval.append((x, e.value))
            continue
        xs.append(x)
        values.append(e.value)
        ci_low = max(e.ci_low, bottom) if e.ci_low is not None else e.value
        ci_high = min(e.ci_high, top) if e.ci_high is not None else e.value
        low.append(e.value - ci_low)
        high.append(ci_high - e.value)
        if e.ci_low is not None and e.ci_low < bottom:
            cut_low.append(x)
        if e.ci_high is not None and e.ci_high > top:
            cut_high.append(x)
    label = _label(policy.shown)
    axes.errorbar(xs, values, yerr=[low, high], fmt="o", capsize=4, color=colour, label=label)
    if no_interval:
        axes.plot(*zip(*no_interval, strict=True), "o", mfc="none", color=colour)
    axes.plot(cut_low, [bottom] * len(cut_low), "v", color=colour, clip_on=False)
    axes.plot(cut_high, [top] * len(cut_high), "^", color=colour, clip_on=False)
    for x in missing:  # as the table's n/a: no estimate (undefined, or no weight)
        axes.annotate(
            "n/a",
            (x, 0.02),
            xycoords=("data", "axes fraction"),
            ha="center",
            color=colour,
            fontsize="small",
            rotation=90,
        )
    return bool(cut_low or cut_high), bool(no_interval)


LEGEND_INSIDE = 5  # policies whose legend a figure keeps over its axes
LEGEND_MOST = 20  # policies a figure's legend names


def _title_and_legend(axes, result: EvaluationResult, clipped: bool, bare: bool) -> None:
    """The estimates figure's title (with what its triangles and hollow points mean) and its
    legend (``policy_legend``)."""
    count = len(result.results)
    episodes = result.dataset.episodes
    title = (
        f"Estimates with {level(result.confidence.level)} intervals ({episodes:,} "
        f"episode{'' if episodes == 1 else 's'})"
    )
    notes = [
        *(["triangles: an interval goes on beyond the axis"] if clipped else []),
        *(["hollow: no interval"] if bare else []),
    ]
    axes.set_title(title + (f"\n({'; '.join(notes)})" if notes else ""))
    axes.grid(axis="y", alpha=0.3)
    policy_legend(axes, count)


def policy_legend(axes, count: int) -> None:
    """The legend of ``count`` policies' colours: over the axes for a few, beside them for
    more (over them it hid the data), and past LEGEND_MOST a line under the title instead,
    which takes no width (a legend of 100 ran off the figure, cut, and collapsed the axes;
    so many colours cannot be told apart anyway)."""
    if count > LEGEND_MOST:
        axes.set_title(
            f"{axes.get_title()}\n({count} policies, too many to name by colour: ranking.png "
            "lists each)"
        )
    elif count > LEGEND_INSIDE:
        axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    elif count:
        axes.legend(fontsize="small")


def policy_colours(plt, count: int) -> list:
    """One colour per policy, ``count`` of them all different: the default cycle repeats
    after 10 (eval_00 and eval_10 were one colour)."""
    if count <= 10:
        return [plt.get_cmap("tab10")(i) for i in range(count)]
    if count <= 20:
        return [plt.get_cmap("tab20")(i) for i in range(count)]
    return [plt.get_cmap("turbo")(x) for x in np.linspace(0.0, 1.0, count)]


@dataclasses.dataclass(frozen=True)
class RankedPolicy:
    """One policy of the ranking figure, for one estimator: its estimate and interval (None
    where undefined), its true value where known, and whether it could be the best (None
    where no could-be-best set was computed)."""

    name: str
    estimate: float | None
    ci_low: float | None = None
    ci_high: float | None = None
    truth: float | None = None
    could_be_best: bool | None = None


# how each kind of row is drawn: (legend label, marker, colour)
_RANKING_STYLES = {
    "could be best": ("could be the best", "o", "tab:green"),
    "worse": ("confidently worse", "o", "tab:grey"),
    "ranked": ("estimate", "o", "tab:blue"),
    "baseline": ("baseline", "D", "black"),
}


def ranking_figure(
    rows: Sequence[RankedPolicy],
    path: str | Path,
    *,
    estimator: str,
    baseline: str | None = None,
    confidence: float | None = None,
    caption: str | None = None,
) -> Path:
    """Writes the ranking figure of one estimator to ``path`` (PNG; its directory created if
    needed) and returns the path.

    One row per policy, best estimate at the top: the estimate with its interval
    (``confidence`` names its level in the title), green where the policy could be the best,
    grey where it is confidently worse; the ``baseline`` policy (a name among ``rows``) as a
    black diamond with a dashed line at its estimate; true values as red crosses. Policies
    without an estimate (None or not finite) come last, marked n/a. The axis is set by the
    estimates and true values, with room for a few typical intervals: an interval that goes
    on beyond it is cut there and marked with a triangle. The figure grows by
    RANKING_ROW_INCHES per policy. ``caption`` (``run_caption``) goes below it.
    """
    plt = _pyplot()
    out = Path(path)
    _create(out.parent)
    ranked = sorted((r for r in rows if _finite(r.estimate)), key=lambda r: -r.estimate)
    ordered = [*ranked, *(r for r in rows if not _finite(r.estimate))]
    figure, axes = plt.subplots(
        figsize=(8, 1.6 + RANKING_ROW_INCHES * max(len(ordered), 1)), layout="constrained"
    )
    limits = ranking_limits(ordered)
    clipped = _draw_ranked(axes, ranked, baseline, limits)
    _draw_truths_and_gaps(axes, ordered)
    base = next((r for r in ranked if r.name == baseline), None)
    if base is not None:
        axes.axvline(base.estimate, color="black", linestyle="--", linewidth=1)
    axes.set_yticks(range(len(ordered)), [_label(r.name) for r in ordered], fontsize="small")
    for tick, row in zip(axes.get_yticklabels(), ordered, strict=True):
        if row.name == baseline:
            tick.set_fontweight("bold")
    axes.set_ylim(max(len(ordered), 1) - 0.5, -0.5)  # the best at the top
    if limits is not None:
        axes.set_xlim(*limits)
    title = f"Policies ranked by {estimator_title(estimator)}"
    if confidence is not None:
        title += f", {confidence:.0%} intervals"
    axes.set_title(
        title + ("\n(triangles: an interval goes on beyond the axis)" if clipped else "")
    )
    axes.set_xlabel("estimated value")
    axes.grid(axis="x", alpha=0.3)
    handles, labels = axes.get_legend_handles_labels()
    if handles:  # above the rows, which fill the axes
        figure.legend(handles, labels, loc="outside upper center", ncols=3, fontsize="small")
    _caption(figure, caption)
    return _save(plt, figure, out, path)


def ranking_limits(rows: Sequence[RankedPolicy]) -> tuple[float, float] | None:
    """The value axis [low, high]: the estimates and true values with RANKING_MARGIN median
    interval half-widths of room (at least a tenth of their range), so that one very wide
    interval does not flatten the rest; None without any value."""
    values = [v for r in rows for v in (r.estimate, r.truth) if _finite(v)]
    if not values:
        return None
    half_widths = [
        (r.ci_high - r.ci_low) / 2.0
        for r in rows
        if _finite(r.estimate) and _finite(r.ci_low) and _finite(r.ci_high)
    ]
    low, high = min(values), max(values)
    typical = float(np.median(half_widths)) if half_widths else 0.0
    # one value without an interval: room in proportion to it (at least 1), not a hair's width
    margin = max(RANKING_MARGIN * typical, 0.1 * (high - low)) or max(0.1 * abs(low), 1.0)
    return low - margin, high + margin


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def _ranking_kind(row: RankedPolicy, baseline: str | None) -> str:
    if row.name == baseline:
        return "baseline"
    if row.could_be_best is None:
        return "ranked"
    return "could be best" if row.could_be_best else "worse"


def _draw_ranked(
    axes, ranked: Sequence[RankedPolicy], baseline: str | None, limits: tuple[float, float] | None
) -> bool:
    """The estimates with their intervals (rows 0 .. len(ranked) - 1), one series per kind;
    returns whether an interval was cut at the axis."""
    bottom, top = limits if limits is not None else (-np.inf, np.inf)
    clipped = False
    for kind, (label, marker, colour) in _RANKING_STYLES.items():
        ys = [y for y, r in enumerate(ranked) if _ranking_kind(r, baseline) == kind]
        if not ys:
            continue
        rows = [ranked[y] for y in ys]
        values = np.array([r.estimate for r in rows])
        low = np.array(
            [max(r.ci_low, bottom) if r.ci_low is not None else r.estimate for r in rows]
        )
        high = np.array(
            [min(r.ci_high, top) if r.ci_high is not None else r.estimate for r in rows]
        )
        axes.errorbar(
            values,
            ys,
            xerr=[values - low, high - values],
            fmt=marker,
            color=colour,
            capsize=3,
            label=label if kind != "baseline" else f"baseline: {_label(baseline)}",
        )
        cut_low = [y for y in ys if ranked[y].ci_low is not None and ranked[y].ci_low < bottom]
        cut_high = [y for y in ys if ranked[y].ci_high is not None and ranked[y].ci_high > top]
        for edge, cut, triangle in ((bottom, cut_low, "<"), (top, cut_high, ">")):
            if cut:  # an empty unclipped line would count as an artist at (0, 0) in the layout
                axes.plot([edge] * len(cut), cut, triangle, color=colour, clip_on=False)
        clipped = clipped or bool(cut_low or cut_high)
    return clipped


def _draw_truths_and_gaps(axes, ordered: Sequence[RankedPolicy]) -> None:
    """True values as red crosses on their rows, and "n/a" beside the policies without an
    estimate (at the left edge of the axes)."""
    truths = [(r.truth, y) for y, r in enumerate(ordered) if _finite(r.truth)]
    if truths:
        xs, ys = zip(*truths, strict=True)
        axes.plot(xs, ys, "x", color="tab:red", markersize=8, mew=2, label="true value")
    for y, row in enumerate(ordered):
        if not _finite(row.estimate):
            axes.text(
                0.01,
                y,
                "n/a (no estimate)",
                transform=axes.get_yaxis_transform(),
                va="center",
                fontsize="small",
                color="tab:grey",
            )
