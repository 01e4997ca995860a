"""PNG figures of an evaluation result (``ope evaluate --plot DIR``).

matplotlib is an optional extra (``pip install 'ope-cli[plot]'``): it is imported only
here, lazily, with the non-interactive Agg backend, so the rest of the tool never needs
it and no window ever opens. Every figure is drawn from the result object alone.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ope_cli.errors import UsageError
from ope_cli.report.formatting import estimator_title
from ope_cli.results import EvaluationResult

FIGURES = ("weights.png", "horizon.png", "estimates.png")
ESTIMATE_MARGIN = 4.0  # standard errors of room around the estimates on their axis
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


def write_plots(result: EvaluationResult, directory: str | Path) -> list[Path]:
    """Writes weights.png, horizon.png and estimates.png into ``directory`` (created if
    needed) and returns their paths."""
    plt = _pyplot()
    out = Path(directory)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise UsageError(
            f"--plot {directory}: cannot create the directory: {error.strerror}"
        ) from None
    written = []
    for name, draw in zip(FIGURES, (_weights, _horizon, _estimates), strict=True):
        figure = draw(plt, result)
        path = out / name
        try:
            figure.savefig(path, dpi=DPI)
        except OSError as error:
            raise UsageError(f"--plot {directory}: cannot write {name}: {error.strerror}") from None
        finally:
            plt.close(figure)
        written.append(path)
    return written


def _label(name: str, limit: int = 48) -> str:
    """A legend label: long checkpoint paths keep their informative end."""
    return name if len(name) <= limit else "…" + name[-(limit - 1) :]


def _weights(plt, result: EvaluationResult):
    """The distribution of log10 trajectory weights, one outline per policy."""
    figure, axes = plt.subplots(figsize=(8, 4.5), layout="constrained")
    occupied = []
    for policy in result.results:
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
        axes.stairs(inside / max(result.episodes, 1), p.histogram_edges, label=label, linewidth=1.5)
    low, high = (min(occupied), max(occupied)) if occupied else (-1.0, 1.0)
    axes.set_xlim(min(low, -0.5) - 0.25, max(high, 0.5) + 0.25)
    if occupied:  # a log axis: the tail of few heavy weights stays visible beside the bulk
        axes.set_yscale("log")
    axes.axvline(0.0, color="grey", linestyle="--", linewidth=1, label="weight 1")
    axes.set_xlabel("log10 trajectory weight  W = prod_t pi_e / pi_b")
    axes.set_ylabel("share of episodes")
    axes.set_title("Trajectory importance weights")
    axes.legend(fontsize="small")
    return figure


def _horizon(plt, result: EvaluationResult):
    """The WPDIS estimate summed up to each step, and the mean weight per step."""
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True, layout="constrained")
    for policy in result.results:
        p = policy.profile
        steps = np.arange(p.wpdis_partial_t.size)
        top.plot(steps, p.wpdis_partial_t, label=_label(policy.shown), linewidth=1.5)
        mean_weight = np.where(p.mean_weight_t > 0, p.mean_weight_t, np.nan)
        bottom.plot(steps, mean_weight, linewidth=1.5)
    top.set_ylabel("WPDIS up to step t")
    top.set_title(f"Per-decision estimate over the horizon (gamma = {result.gamma:g})")
    top.legend(fontsize="small")
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
    values = [e.value for p in result.results for e in p.estimates.values() if e.value is not None]
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
    limits = estimate_limits(result)
    bottom, top = limits if limits is not None else (-np.inf, np.inf)
    clipped = False
    for i, policy in enumerate(result.results):
        xs, values, low, high, cut_low, cut_high = [], [], [], [], [], []
        for j, name in enumerate(names):
            e = policy.estimates.get(name)
            if e is None or e.value is None:
                continue
            x = j - 0.4 + width * (i + 0.5)
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
        bars = axes.errorbar(
            xs, values, yerr=[low, high], fmt="o", capsize=4, label=_label(policy.shown)
        )
        colour = bars[0].get_color()
        axes.plot(cut_low, [bottom] * len(cut_low), "v", color=colour, clip_on=False)
        axes.plot(cut_high, [top] * len(cut_high), "^", color=colour, clip_on=False)
        clipped = clipped or bool(cut_low or cut_high)
    if limits is not None:
        axes.set_ylim(*limits)
    axes.set_xticks(range(len(names)), [estimator_title(n) for n in names])
    axes.set_ylabel("estimated value")
    title = f"Estimates with {result.confidence_level:.0%} intervals ({result.episodes:,} episodes)"
    axes.set_title(
        title + ("\n(triangles: an interval goes on beyond the axis)" if clipped else "")
    )
    axes.grid(axis="y", alpha=0.3)
    if count:
        axes.legend(fontsize="small")
    return figure
