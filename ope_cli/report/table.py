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

from ope_cli.report.formatting import (
    count,
    estimator_title,
    fixed,
    percent,
    significant,
    weight_label,
)
from ope_cli.results import EvaluationResult, PolicyResult

# Plain-words warnings under the table: thresholds on the trajectory-weight diagnostics.
ESS_FRACTION_WARNING = 0.1  # fewer effective episodes than this share of n
MAX_SHARE_WARNING = 0.5  # one episode holds more than this share of the total weight
MEAN_WEIGHT_RANGE = (0.5, 2.0)  # the mean weight is 1 in expectation when propensities are right
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
    """The estimator that ranks policies: ``rank_by``, else WIS if reported, else the first."""
    if rank_by is not None:
        return rank_by
    return "wis" if "wis" in result.estimators else result.estimators[0]


def rank_policies(result: EvaluationResult, estimator: str) -> list[int | None]:
    """Each policy's rank, 1 for the highest ``estimator`` value; None where it is undefined.
    Equal values keep the command-line order."""
    values = [
        p.estimates[estimator].value if estimator in p.estimates else None for p in result.results
    ]
    order = sorted((i for i, v in enumerate(values) if v is not None), key=lambda i: -values[i])
    ranks: list[int | None] = [None] * len(values)
    for rank, index in enumerate(order, 1):
        ranks[index] = rank
    return ranks


def _policy_warnings(policy: PolicyResult, episodes: int) -> list[str]:
    d, name = policy.diagnostics, policy.policy
    if d.zero_weight_fraction == 1.0:
        return [
            f"{name}: every trajectory weight is zero: the policy gives "
            "probability 0 to a logged action in every episode, so these logs say "
            "nothing about it."
        ]
    warnings = []
    if not policy.actions_checked:
        warnings.append(
            f"{name}: the logged actions are not checked against this entry point's action "
            "count (it declares no n_actions attribute): an action beyond its range would be "
            "clamped to the last one, not reported."
        )
    if d.ess_fraction is not None and d.ess_fraction < ESS_FRACTION_WARNING:
        warnings.append(
            f"{name}: the effective sample size is {d.ess:,.1f} of {episodes:,} episodes "
            f"({d.ess_fraction:.1%}): the estimates rest on a few heavily weighted "
            "episodes; the policy is probably too far from the behavior policy for "
            "these logs (expect wide or overconfident intervals)."
        )
    if d.max_weight_share is not None and d.max_weight_share > MAX_SHARE_WARNING:
        warnings.append(
            f"{name}: one episode holds {d.max_weight_share:.0%} of the total "
            "weight: WIS and WPDIS are essentially that single episode's return."
        )
    low, high = MEAN_WEIGHT_RANGE
    if d.mean_weight is None:
        warnings.append(
            f"{name}: the trajectory weights overflow float64: the policy and the "
            "behavior probabilities disagree by orders of magnitude."
        )
    elif not low <= d.mean_weight <= high:
        warnings.append(
            f"{name}: the mean weight is {d.mean_weight:.3g}, far from 1 (its "
            "expected value when the behavior probabilities are right): check "
            "that the behavior probabilities are those of the logged actions "
            "(not log-probabilities, not of another action) and that the policy "
            "sees the observations it was trained on; with very heavy-tailed "
            "weights, too few episodes can also cause it."
        )
    return warnings


def diagnostic_warnings(result: EvaluationResult) -> list[str]:
    """Plain-words warnings about weight diagnostics that make an estimate hard to trust."""
    return [w for policy in result.results for w in _policy_warnings(policy, result.episodes)]


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
    for text, start in ((left, 0), ("1", at_one), (right, width - len(right))):
        end = start + len(text)
        if start >= 0 and end <= width and all(c == " " for c in labels[start:end]):
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


def dropped_line(result: EvaluationResult) -> str:
    """One line saying how many invalid episodes --on-invalid drop left out, and why."""
    if not result.episodes_dropped:
        return "--on-invalid drop: no invalid episodes, nothing dropped"
    reasons = "; ".join(
        f"{reason} {counts['episodes']:,} episode(s), {counts['steps']:,} step(s)"
        for reason, counts in result.dropped.items()
    )
    return (
        f"--on-invalid drop: dropped {result.episodes_dropped:,} invalid episode(s), "
        f"{result.steps_dropped:,} step(s), not in the estimates ({reasons})"
    )


def _value_cell(e) -> str:
    """ "value ± stderr", or the value (or n/a) with the estimate's note."""
    if e.value is None:
        return f"n/a ({e.note})" if e.note else "n/a"
    if e.stderr is None:
        return significant(e.value) + (f" ({e.note})" if e.note else "")
    return f"{significant(e.value)} ± {significant(e.stderr)}"


def _estimates_table(result: EvaluationResult, rank_by: str) -> Table:
    several = len(result.results) > 1
    ranks = rank_policies(result, rank_by) if several else [None]
    title = (
        f"{result.source}: {result.episodes:,} episodes, {result.steps:,} steps "
        f"({result.layout} layout), gamma={result.gamma:g}"
    )
    caption = (
        f"rank: by {estimator_title(rank_by)} (underlined), highest first; ★ best"
        if several
        else None
    )
    table = Table(title=title, title_justify="left", caption=caption, caption_justify="left")
    if several:
        table.add_column("rank", justify="right")
    table.add_column("policy", style="bold", overflow="fold")
    table.add_column("estimator")
    table.add_column("value ± std. err.", justify="right")
    table.add_column(f"{result.confidence_level:.0%} interval", justify="right")
    for i, policy in enumerate(result.results):
        best = several and ranks[i] == 1
        for j, (name, e) in enumerate(policy.estimates.items()):
            interval = (
                "n/a"
                if e.ci_low is None
                else f"[{significant(e.ci_low)}, {significant(e.ci_high)}]"
            )
            ranking = several and name == rank_by
            label = Text(estimator_title(name), style="underline" if ranking else "")
            cells = [policy.policy if j == 0 else "", label, _value_cell(e), interval]
            if several:
                rank = "" if j else ("★ 1" if best else "–" if ranks[i] is None else str(ranks[i]))
                cells.insert(0, rank)
            last = j == len(policy.estimates) - 1 and i < len(result.results) - 1
            table.add_row(*cells, style="green" if best else None, end_section=last)
    return table


def _flag(text: str, bad: bool) -> Text:
    return Text(text, style="bold yellow" if bad else "")


def _diagnostics_table(result: EvaluationResult) -> Table:
    diagnostics = Table(title="weight diagnostics (trajectory weights)", title_justify="left")
    for column in DIAGNOSTIC_COLUMNS:
        diagnostics.add_column(
            column, justify="left" if column == "policy" else "right", overflow="fold"
        )
    low, high = MEAN_WEIGHT_RANGE
    for policy in result.results:
        d = policy.diagnostics
        diagnostics.add_row(
            policy.policy,
            fixed(d.ess, 1),
            _flag(
                percent(d.ess_fraction),
                d.ess_fraction is not None and d.ess_fraction < ESS_FRACTION_WARNING,
            ),
            _flag(
                significant(d.mean_weight),
                d.mean_weight is None or not low <= d.mean_weight <= high,
            ),
            significant(d.max_weight),
            _flag(
                percent(d.max_weight_share),
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
        histogram.add_row(policy.policy, Text(line, style="cyan"), *[extra][:extra_column])
    histogram.add_row("weight", Text(f"{ticks}\n{labels}", style="dim"), *[""][:extra_column])
    return histogram


def render_table(result: EvaluationResult, console: Console, rank_by: str | None = None) -> None:
    """Estimates grouped by policy (value ± standard error, interval; with several policies a
    rank by ``rank_by`` and the best highlighted), weight diagnostics, an in-terminal
    histogram of the log10 trajectory weights, and warnings in plain words."""
    console.print(_estimates_table(result, resolve_rank_by(result, rank_by)))
    if result.on_invalid == "drop":
        console.print(dropped_line(result), markup=False, highlight=False, soft_wrap=True)
    console.print(_diagnostics_table(result))
    console.print(_histogram_table(result))
    for warning in diagnostic_warnings(result):
        console.print(Text(f"warning: {warning}", style="yellow"))
    console.print(Text(f"intervals: {result.confidence_method}", style="dim"))
    if result.behavior is not None:
        console.print(Text(result.behavior.describe(), style="dim"))
    for line in dict.fromkeys(r.q.describe() for r in result.results if r.q is not None):
        console.print(Text(line, style="dim"))
