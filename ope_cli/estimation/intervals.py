"""Confidence intervals from merged statistics: Poisson-bootstrap (percentile, bootstrap-t)
and finite-sample betting bounds. Plain NumPy; ``stats.finalize`` applies them."""

from __future__ import annotations

import functools
import math

import numpy as np

from ope_cli.estimation.estimators.base import BETTING_BIN_WIDTH, BETTING_BINS, BETTING_LOG_RANGE
from ope_cli.estimation.estimators.logspace import finite

INTERVALS = ("betting", "normal", "percentile", "bootstrap-t")
BOOTSTRAP_METHODS = ("percentile", "bootstrap-t")  # the methods that draw replicates
MIN_VALID_REPLICATES = 0.9  # below this share of defined replicates, no bootstrap interval
TOO_MANY_UNDEFINED = "too many bootstrap replicates are undefined"

Interval = tuple[float | None, float | None, str | None]  # (low, high, note)


def bootstrap_interval(
    value: float,
    stderr: float,
    replicates: np.ndarray,
    replicate_stderr: np.ndarray | None,
    confidence: float,
) -> Interval:
    """A Poisson-bootstrap interval: percentile, or studentized (bootstrap-t) when replicate
    standard errors are given. replicates, replicate_stderr: [R]."""
    low_q, high_q = (1 - confidence) / 2, (1 + confidence) / 2
    if replicate_stderr is None:
        valid = np.isfinite(replicates)
        if valid.mean() < MIN_VALID_REPLICATES:
            return None, None, TOO_MANY_UNDEFINED
        low, high = np.quantile(replicates[valid], [low_q, high_q])
        return float(low), float(high), None
    with np.errstate(divide="ignore", invalid="ignore"):
        t = (replicates - value) / replicate_stderr
    valid = np.isfinite(t)
    if valid.mean() < MIN_VALID_REPLICATES:
        return None, None, TOO_MANY_UNDEFINED
    t_low, t_high = np.quantile(t[valid], [low_q, high_q])
    return finite(value - t_high * stderr), finite(value - t_low * stderr), None


# Betting intervals: the gambler stakes these fractions of the largest bet that cannot go
# bankrupt, and the wealth averages over them (an equal-weight mixture of 20 fixed bets).
BETTING_FRACTIONS = 0.95 * 2.0 ** (-np.arange(20) / 2)


@functools.cache
def _betting_values() -> np.ndarray:
    """[BETTING_BINS + 1] the value each histogram bin stands for: its lower edge (0 below)."""
    low, _ = BETTING_LOG_RANGE
    return np.concatenate([[0.0], np.exp(low + BETTING_BIN_WIDTH * np.arange(BETTING_BINS))])


def betting_lower_bound(counts: np.ndarray, alpha: float) -> float | None:
    """Lower confidence bound, valid at level 1 - alpha for every sample size, on the mean
    mu in [0, 1] of a non-negative variable X, from the histogram of log X (``counts``
    [BETTING_BINS + 1], see estimators.base.BETTING_LOG_RANGE). None without data.

    To test mu = m, a gambler bets a fraction c of the largest stake 1/m that cannot go
    bankrupt, so each episode multiplies its wealth by 1 - c + c X_i / m. If mu = m that is a
    non-negative martingale started at 1 for every c, and so is the average over
    BETTING_FRACTIONS; by Markov's inequality it reaches 1/alpha with probability <= alpha.
    Every m whose wealth reaches 1/alpha is rejected. The wealth falls as m grows, so the
    rejected m form an interval [0, m*) that bisection finds; m* is the bound. Reading each
    bin as its lower edge understates X, hence the wealth, so the bound stays valid.
    """
    bins = np.flatnonzero(counts)
    if bins.size == 0:
        return None
    n_k, x_k = counts[bins], _betting_values()[bins]
    threshold = math.log(1.0 / alpha)
    fractions = BETTING_FRACTIONS[:, None]

    def rejected(m: float) -> bool:
        log_wealth_c = np.log1p(fractions * (x_k / m - 1.0)) @ n_k
        top = log_wealth_c.max()
        return top + math.log(np.mean(np.exp(log_wealth_c - top))) >= threshold

    if rejected(1.0):
        return 1.0
    low, high = 0.0, 1.0
    for _ in range(50):
        middle = 0.5 * (low + high)
        low, high = (middle, high) if rejected(middle) else (low, middle)
    return low


BETTING_ROWS = {"trajectory": 0, "decision": 2}  # rows of base.BETTING_VARIABLES (low, high)


def _percent(share: float) -> str:
    """A share in percent to 3 significant digits: 0.001 is 0.1%, not 0%, nor 1e-06%."""
    shown = np.format_float_positional(100.0 * share, 3, unique=False, fractional=False, trim="-")
    return f"{shown}%"


def crossed_bounds_note(confidence: float) -> str:
    """Why a betting interval is empty (its lower bound above its upper one): chance, at
    most 1 - confidence of datasets, before any fault (it named only faults, and on
    generated chain data with exact propensities and rewards in range, it was chance)."""
    return (
        "the lower betting bound exceeds the upper one: no value is consistent with these "
        f"episodes at this level, which happens by chance in at most {_percent(1.0 - confidence)} "
        "of datasets, and more often when the propensities are off (the weights' mean is "
        "not 1) or rewards leave the range"
    )


def betting_intervals(
    histogram: np.ndarray, betting_range: tuple[float, float, float], confidence: float
) -> dict[str, Interval]:
    """{"trajectory", "decision"}: betting intervals on the value from the histograms
    [4, BETTING_BINS + 1] of estimators.reduction.betting_variables, with 1 - confidence split
    over both sides."""
    low, high, horizon = betting_range
    alpha = (1.0 - confidence) / 2
    intervals: dict[str, Interval] = {}
    for kind, row in BETTING_ROWS.items():
        v_low = betting_lower_bound(histogram[row], alpha)
        v_high = betting_lower_bound(histogram[row + 1], alpha)
        if v_low is None or v_high is None:
            intervals[kind] = (None, None, None)
        elif v_low > 1.0 - v_high:
            intervals[kind] = (
                None,
                None,
                crossed_bounds_note(confidence),
            )
        else:
            intervals[kind] = (
                finite(low * horizon + (high - low) * horizon * v_low),
                finite(low * horizon + (high - low) * horizon * (1.0 - v_high)),
                None,
            )
    return intervals
