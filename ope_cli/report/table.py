"""``ope evaluate --format table``: rich tables of the estimates (ranked when there are
several policies), the weight diagnostics, an in-terminal histogram of the log10
trajectory weights, and plain-words warnings."""

from __future__ import annotations

import math

import numpy as np
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ope_cli.choosing import selection
from ope_cli.errors import UsageError
from ope_cli.estimation.estimators import get as get_estimator
from ope_cli.estimation.estimators import names
from ope_cli.report.formatting import (
    count,
    discount,
    estimator_title,
    level,
    percent,
    resolved,
    significant,
    weight_label,
)
from ope_cli.report.layout import print_whole
from ope_cli.report.warnings import (
    ASYMPTOTIC_INTERVALS,
    BETTING_FITTED_BEHAVIOR,
    DROPPED,
    ESS_FRACTION_WARNING,
    MAX_SHARE_WARNING,
    dropped_line,
    ess_count,
    mean_weight,
    mean_weight_off,
    policy_warnings,
    propensity_source,
    replaced_gamma,
    run_warnings,
    underflowed,
)
from ope_cli.results import EvaluationResult, PolicyResult, estimated

GAMMA_SOURCES = {  # the title line's word on where gamma comes from
    "option": "--gamma",
    "data": "declared by the data",
    "default": "the default: no --gamma, none declared by the data",
}
CI_METHODS = {
    "betting": "betting",
    "normal": "normal",
    "percentile": "pctl",
    "bootstrap-t": "boot-t",
}

SPARK = " ▁▂▃▄▅▆▇█"
HISTOGRAM_WIDTH = (12, 48)  # characters of the in-terminal weight histogram, least and most
DIAGNOSTIC_COLUMNS = (
    "policy",
    "ESS",
    "ESS / n",
    "mean weight",
    "max weight",
    "max share",
    "zero weights",
)


def resolve_rank_by(result: EvaluationResult, rank_by: str | None = None) -> str:
    """The estimator that ranks policies: ``rank_by`` (checked, ``check_rank_by``), else
    WIS if reported, else the first."""
    if rank_by is not None:
        return check_rank_by(rank_by, tuple(result.estimators))
    return "wis" if "wis" in result.estimators else result.estimators[0]


def check_rank_by(rank_by: str, estimators: tuple[str, ...]) -> str:
    """A given --rank-by as an estimator the run reports (an explicit --rank-by wis with
    -e is ranked by is without a word: the default's fallback, ``resolve_rank_by``)."""
    if isinstance(rank_by, str):  # else (the API's rank_by=3) no name: refused below
        rank_by = rank_by.lower()
    if rank_by not in names():
        raise UsageError(f"--rank-by must be one of {', '.join(names())}, got {rank_by!r}")
    if rank_by in estimators:
        return rank_by
    if get_estimator(rank_by).needs and not any(get_estimator(e).needs for e in estimators):
        raise UsageError(
            f"--rank-by {rank_by} ranks by an estimator that needs a Q source: add --q "
            "Q.npz|package.module:name|fit (once per --policy), or --q-col with --v-col"
        )
    raise UsageError(
        f"--rank-by {rank_by}: not among the reported estimators "
        f"({', '.join(estimators)}); add --estimator {rank_by}"
    )


def _own_value(result: EvaluationResult) -> str:
    """The behavior baseline's own value, the mean discounted return, for its title: to the
    finest standard error of the rows beside it, and to 10 digits at least (on rewards of
    1e8 + N(0, 1) it read "mean return 100000000" beside a WIS of 100000000.032 and a
    difference of -0.0008: subtracted, the wrong sign)."""
    if result.baseline != "behavior" or result.behavior_value is None:
        return ""
    finest = _finest_spread(e for p in result.results for e in p.estimates.values())
    return f", mean return {resolved(result.behavior_value, finest, 10)}"


def rank_policies(result: EvaluationResult, estimator: str) -> list[int | None]:
    """Each policy's rank, 1 for the highest ``estimator`` value; None where it is undefined
    or rests on weights that are all zero.
    Values equal to float64 rounding (``selection.above``) share a rank, the next one
    skipping theirs (1, 1, 3): two identical checkpoints were ranked 1 and 2 by their
    command-line order, only the first the best."""
    values = [estimated(p, estimator) for p in result.results]
    defined = [v for v in values if v is not None]
    share = selection.tie_share(estimator)
    return [
        None if v is None else 1 + sum(selection.above(o, v, share) for o in defined)
        for v in values
    ]


def diagnostic_warnings(result: EvaluationResult) -> list[str]:
    """Plain-words warnings about weight diagnostics that make an estimate hard to trust."""
    propensities = propensity_source(result)
    return [
        w.message
        for policy in result.results
        for w in policy_warnings(policy, result.dataset.episodes, propensities)
    ]


def weight_sparklines(result: EvaluationResult) -> tuple[list[str], str, str]:
    """One sparkline per policy of its log10 trajectory-weight histogram, on a common window
    around the occupied bins and weight 1, plus a tick line (``┬`` at weight 1) and a label
    line for the window's ends. Each policy's bars are scaled to its own fullest bin."""
    counts = np.array([p.profile.histogram_counts[1:-1] for p in result.results])  # [P, bins]
    edges = result.results[0].profile.histogram_edges
    bins = counts.shape[1]
    one = int(np.clip(np.searchsorted(edges, 0.0, side="right") - 1, 0, bins - 1))  # bin of w = 1
    occupied = np.flatnonzero(counts.sum(axis=0))
    low = min(int(occupied[0]), one) if occupied.size else one
    high = max(int(occupied[-1]), one) if occupied.size else one
    least, most = HISTOGRAM_WIDTH
    while high - low + 1 < least and (low > 0 or high < bins - 1):
        low, high = max(low - 1, 0), min(high + 1, bins - 1)
    group = math.ceil((high - low + 1) / most)  # bins per character
    width = math.ceil((high - low + 1) / group)
    padded = np.zeros((counts.shape[0], width * group))
    padded[:, : high - low + 1] = counts[:, low : high + 1]
    merged = padded.reshape(counts.shape[0], width, group).sum(axis=2)  # [P, width]
    lines = []
    for row in merged:
        top = row.max()
        levels = np.where(row > 0, np.ceil(row / top * (len(SPARK) - 1)) if top > 0 else 0, 0)
        lines.append("".join(SPARK[int(level)] for level in levels))
    at_one = (one - low) // group
    ticks = "─" * at_one + "┬" + "─" * (width - at_one - 1)
    left = weight_label(edges[low])
    right = weight_label(edges[min(low + width * group, bins)])
    labels = [" "] * width
    # the ends first; each label a space apart from the others ("1" beside "17.8" read
    # "117.8"), or left out (the ┬ still marks weight 1)
    for text, start in ((left, 0), (right, width - len(right)), ("1", at_one)):
        end = start + len(text)
        if (
            start >= 0
            and end <= width
            and all(c == " " for c in labels[max(start - 1, 0) : end + 1])
        ):
            labels[start:end] = text
    return lines, ticks, "".join(labels)


def _off_scale(policy: PolicyResult) -> str:
    p = policy.profile
    parts = []
    if p.zero_weights:
        parts.append(f"{count(p.zero_weights)} zero")
    if p.histogram_counts[0]:
        parts.append(f"{count(int(p.histogram_counts[0]))} < {weight_label(p.histogram_edges[0])}")
    if p.histogram_counts[-1]:
        parts.append(
            f"{count(int(p.histogram_counts[-1]))} > {weight_label(p.histogram_edges[-1])}"
        )
    return ", ".join(parts)


def _value_cell(e, beside: float | None = None) -> str:
    """ "value ± stderr", or the value (or n/a) with the estimate's note; a note the
    interval cell refers to (a null interval's, listed under the table) is said there. A
    value without a spread of its own is shown to ``beside`` (its row's finest: a dm whose
    standard error float64 did not resolve read "1e+08" beside a WIS of 100000000.4645)."""
    said = e.note if e.note and e.ci_low is not None and e.ci_high is not None else None
    if e.value is None:
        return f"n/a ({e.note})" if e.note else "n/a"
    value = _shown(e.value, _spread(e) or beside)
    if e.stderr is None:
        return value + (f" ({said})" if said else "")
    return f"{value} ± {significant(e.stderr)}" + (f" ({said})" if said else "")


def _shown(x: float | None, spread: float | None) -> str:
    """``x`` to ``spread`` (``resolved``); without one, to the digits of its whole part (4
    at least): a value with nothing to go by keeps its units (2.00000000115e8 read
    "2e+08" beside a WIS of 200000000.115 +- 0.046)."""
    if spread or x is None or not math.isfinite(x) or x == 0:
        return resolved(x, spread)
    return resolved(x, None, min(17, max(4, math.floor(math.log10(abs(x))) + 1)))


def _finest_spread(estimates) -> float | None:
    """The smallest positive finite ``_spread`` of ``estimates``; None if none has one."""
    spreads = (_spread(e) for e in estimates)
    return min((s for s in spreads if s and math.isfinite(s) and s > 0), default=None)


def _spread(e) -> float | None:
    """How finely an estimate's (or a difference's) numbers are shown: to its standard
    error, else to its interval's width."""
    if e.stderr:
        return e.stderr
    if e.ci_low is not None and e.ci_high is not None:
        return e.ci_high - e.ci_low
    return None


def _interval(e, beside: float | None = None) -> str:
    """ "[low, high]" to the estimate's spread (``resolved``), else to ``beside``."""
    spread = _spread(e) or beside
    return f"[{_shown(e.ci_low, spread)}, {_shown(e.ci_high, spread)}]"


def title_line(result: EvaluationResult) -> str:
    """The data, its size, and the discount with where it comes from."""
    dataset = result.dataset
    source = GAMMA_SOURCES.get(result.gamma_source, result.gamma_source)
    declared = replaced_gamma(result)
    if declared is not None:
        source += f"; the data declares {discount(declared)}"
    return (
        f"{dataset.source}: {dataset.episodes:,} episodes, {dataset.steps:,} steps "
        f"({dataset.layout} layout), gamma={discount(result.gamma)} ({source})"
    )


def interval_notes(result: EvaluationResult) -> list[str]:
    """The reasons of the null intervals, each once, in order; the table refers to them
    by number."""
    notes = (e.note for p in result.results for e in p.estimates.values() if e.ci_low is None)
    return list(dict.fromkeys(note for note in notes if note))


def _interval_cell(e, notes: list[str], beside: float | None = None) -> str:
    if e.ci_low is not None and e.ci_high is not None:
        return _interval(e, beside)
    return f"n/a ({notes.index(e.note) + 1})" if e.note in notes else "n/a"


def _estimates_table(result: EvaluationResult, rank_by: str) -> Table:
    several = len(result.results) > 1
    ranks = rank_policies(result, rank_by) if several else [None]
    notes = interval_notes(result)
    sets = all(p.could_be_best is not None for p in result.results) and several
    legend = (
        "paired intervals, Bonferroni; betting's are not paired"
        if result.confidence.interval == "betting"
        else "paired intervals, Bonferroni"
    )
    caption = (
        f"rank: by {estimator_title(rank_by)} (underlined), highest first; ★ best"
        + (f"; ◆ could be the best ({legend})" if sets else "")
        if several
        else None
    )
    table = Table(caption=caption, caption_justify="left")
    if several:
        table.add_column("rank", justify="right", overflow="fold")
    table.add_column("policy", style="bold", overflow="fold")
    table.add_column("estimator", overflow="fold")
    table.add_column("value ± std. err.", justify="right", overflow="fold")
    table.add_column(f"{level(result.confidence.level)} interval", justify="right", overflow="fold")
    table.add_column("method", overflow="fold")
    if sets:
        table.add_column("best?", justify="center", overflow="fold")
    for i, policy in enumerate(result.results):
        best = several and ranks[i] == 1
        finest = _finest_spread(policy.estimates.values())
        for j, (name, e) in enumerate(policy.estimates.items()):
            ranking = several and name == rank_by
            label = Text(estimator_title(name), style="underline" if ranking else "")
            method = CI_METHODS.get(policy.ci_methods.get(name) or "", "")
            cells = [
                policy.shown if j == 0 else "",
                label,
                _value_cell(e, finest),
                _interval_cell(e, notes, finest),
                method,
            ]
            if several:
                rank = "" if j else ("★ 1" if best else "–" if ranks[i] is None else str(ranks[i]))
                cells.insert(0, rank)
            if sets:
                flag = policy.could_be_best.get(name, False)
                cells.append("n/a" if flag is None else "◆" if flag else "")
            last = j == len(policy.estimates) - 1 and i < len(result.results) - 1
            table.add_row(*cells, style="green" if best else None, end_section=last)
    return table


# what a betting interval of a difference is (``choosing.comparison.Pairing.interval``)
BETTING_DIFFERENCES = (
    "betting intervals of a difference: each policy's own at 1 - alpha/2, combined (Hoeffding's "
    "bound for behavior), not paired: valid for any number of episodes, and wide; --ci "
    "percentile, bootstrap-t or normal gives paired ones"
)


def ranked_warnings(result: EvaluationResult, rank_by: str | None = None) -> list:
    """The run's warnings as the JSON and CSV carry them (``rank_by`` resolved as they do)."""
    rank_by = resolve_rank_by(result, rank_by)
    return run_warnings(result, rank_policies(result, rank_by), rank_by)


def _comparison_table(result: EvaluationResult) -> Table:
    """Each policy minus the baseline, per estimator, paired on the same episodes."""
    compared = [p for p in result.results if p.comparison is not None]
    without_replicates = all(
        c.p_improvement is None for p in compared for c in p.comparison.values()
    )
    betting = result.confidence.interval == "betting"  # the differences are paired, not these
    captions = [BETTING_DIFFERENCES] if betting else []
    if without_replicates:
        captions.append("P(better): bootstrap replicates, with --ci percentile or bootstrap-t")
    elif result.confidence.replicates:  # 100% is every replicate, not a certainty
        captions.append(
            f"P(better): the share of the {result.confidence.replicates:,} bootstrap "
            "replicates in which the policy does better"
        )
    paired = (
        "the differences paired on the same episodes, their betting intervals not"
        if betting
        else "paired on the same episodes"
    )
    table = Table(
        title=f"against the baseline {result.baseline}{_own_value(result)} ({paired})",
        title_justify="left",
        caption="; ".join(captions) or None,
        caption_justify="left",
    )
    table.add_column("policy", style="bold", overflow="fold")
    table.add_column("estimator", overflow="fold")
    table.add_column("difference ± std. err.", justify="right", overflow="fold")
    table.add_column(f"{level(result.confidence.level)} interval", justify="right", overflow="fold")
    table.add_column("P(better)", justify="right", overflow="fold")
    for i, policy in enumerate(compared):
        for j, (name, c) in enumerate(policy.comparison.items()):
            interval = _interval(c) if c.ci_low is not None and c.ci_high is not None else "n/a"
            if c.note:  # why it is missing, or what it is (a tie, a percentile fallback)
                interval += f" ({c.note})"
            above = c.ci_low is not None and c.ci_low > 0
            below = c.ci_high is not None and c.ci_high < 0
            table.add_row(
                policy.shown if j == 0 else "",
                estimator_title(name),
                "n/a" if c.delta is None else _plus_minus(c.delta, c.stderr),
                Text(interval, style="green" if above else "red" if below else ""),
                percent(c.p_improvement),
                end_section=j == len(policy.comparison) - 1 and i < len(compared) - 1,
            )
    return table


def _plus_minus(value: float, stderr: float | None) -> str:
    signed = ("+" if value > 0 else "") + resolved(value, stderr)
    return signed if stderr is None else f"{signed} ± {significant(stderr)}"


def _selection_table(result: EvaluationResult) -> Table:
    """The selection metrics against --truth: a row per metric, a column per estimator."""
    metrics = list(next(iter(result.selection.values())))
    undefined_sharpe = any(
        v is None
        for values in result.selection.values()
        for m, v in values.items()
        if "sharpe" in m
    )
    table = Table(
        title="selection against the true values (--truth)",
        title_justify="left",
        # sharpe@1 is n/a in every run (one true value has no spread): the table says why
        caption="sharpe@k: n/a where the top k's true values have no spread (always for k = "
        "1)" + (" or the baseline has no true value" if result.baseline is not None else "")
        if undefined_sharpe
        else None,
        caption_justify="left",
    )
    table.add_column("metric")
    for name in result.selection:
        table.add_column(estimator_title(name), justify="right", overflow="fold")
    for metric in metrics:
        table.add_row(metric, *(significant(v[metric]) for v in result.selection.values()))
    return table


def _flag(text: str, bad: bool) -> Text:
    return Text(text, style="bold yellow" if bad else "")


def _diagnostics_table(result: EvaluationResult) -> Table:
    diagnostics = Table(title="weight diagnostics (trajectory weights)", title_justify="left")
    for column in DIAGNOSTIC_COLUMNS:
        diagnostics.add_column(
            column, justify="left" if column == "policy" else "right", overflow="fold"
        )
    propensities = propensity_source(result)
    for policy in result.results:
        d = policy.diagnostics
        diagnostics.add_row(
            policy.shown,
            ess_count(d.ess, result.dataset.episodes),
            _flag(
                percent(d.ess_fraction, limit=ESS_FRACTION_WARNING),
                d.ess_fraction is not None and d.ess_fraction < ESS_FRACTION_WARNING,
            ),
            _flag(
                underflowed(d, d.mean_weight) or mean_weight(d.mean_weight, 4),
                # as the warning: outside [0.5, 2], or many standard errors above 1
                d.mean_weight is None
                or mean_weight_off(d, result.dataset.episodes, propensities) is not None,
            ),
            underflowed(d, d.max_weight) or significant(d.max_weight),
            _flag(
                percent(d.max_weight_share, limit=MAX_SHARE_WARNING),
                d.max_weight_share is not None and d.max_weight_share > MAX_SHARE_WARNING,
            ),
            percent(d.zero_weight_fraction),
        )
    return diagnostics


def _histogram_table(result: EvaluationResult) -> Table:
    lines, ticks, labels = weight_sparklines(result)
    off_scale = [_off_scale(policy) for policy in result.results]
    histogram = Table(
        title="trajectory weights (log scale)", title_justify="left", box=box.SIMPLE_HEAD
    )
    histogram.add_column("policy", overflow="fold")
    histogram.add_column("distribution", no_wrap=True)
    extra_column = any(off_scale)
    if extra_column:
        histogram.add_column("zero / off scale")
    for policy, line, extra in zip(result.results, lines, off_scale, strict=True):
        histogram.add_row(policy.shown, Text(line, style="cyan"), *[extra][:extra_column])
    histogram.add_row("weight", Text(f"{ticks}\n{labels}", style="dim"), *[""][:extra_column])
    return histogram


def footer_lines(result: EvaluationResult, rank_by: str) -> list[tuple[str, str]]:
    """(text, style) lines under the tables: the reasons of null intervals, warnings, the
    interval method, where the behavior probabilities and each policy's Q-hat come from,
    and the path of each policy its label shortens."""
    lines = [(f"({k}) {note}", "dim") for k, note in enumerate(interval_notes(result), 1)]
    ranks = rank_policies(result, rank_by)
    labels = {p.policy: p.shown for p in result.results}
    for warning in run_warnings(result, ranks, rank_by):
        if warning.code == ASYMPTOTIC_INTERVALS and result.confidence.interval != "betting":
            continue  # the "intervals:" line says it
        if warning.code == BETTING_FITTED_BEHAVIOR:
            continue  # the "intervals:" line says it
        if warning.code == DROPPED:
            continue  # the line under the tables says it
        message = warning.message
        if warning.policy is not None:  # the policy as the tables call it
            message = message.replace(f"{warning.policy}: ", f"{labels[warning.policy]}: ", 1)
        lines.append((f"warning: {message}", "yellow"))
    lines.append((f"intervals: {result.confidence.method}", "dim"))
    if result.behavior is not None:
        lines.append((result.behavior.describe(labels), "dim"))
    several = len(result.results) > 1
    for policy in result.results:
        if policy.q is not None:
            prefix = f"{policy.shown}: " if several else ""
            lines.append((prefix + policy.q.describe(), "dim"))
    for policy in result.results:
        path = policy.source or policy.policy
        if policy.shown != path:
            lines.append((f"{policy.shown} = {path}", "dim"))
    return lines


def render_table(result: EvaluationResult, console: Console, rank_by: str | None = None) -> None:
    """Estimates grouped by policy (value ± standard error, interval and its method; with
    several policies a rank by ``rank_by`` and the best highlighted), weight diagnostics,
    an in-terminal histogram of the log10 trajectory weights, and the footer: warnings in
    plain words, the reasons of null intervals, and where every input comes from."""
    rank_by = resolve_rank_by(result, rank_by)
    console.print(Text(title_line(result), style="italic"), soft_wrap=True)  # never folded
    print_whole(console, _estimates_table(result, rank_by))
    if any(p.comparison is not None for p in result.results):
        print_whole(console, _comparison_table(result))
    if result.selection:
        print_whole(console, _selection_table(result))
    if result.dataset.on_invalid == "drop":
        console.print(dropped_line(result), markup=False, highlight=False, soft_wrap=True)
    print_whole(console, _diagnostics_table(result))
    print_whole(console, _histogram_table(result))
    for text, style in footer_lines(result, rank_by):
        console.print(Text(text, style=style))
