"""Paired sums of several policies on the same episodes (SPEC 11): mergeable float64 sums from
which the difference of any two policies' mean-of-terms estimators (is, pdis, dm, dr:
``Estimator.term``), and its standard error, follow exactly.

Rows p = 0..P-1 are the policies in command-line order and row P the logged episodes'
discounted return G, the behavior policy's own term (``--baseline behavior``). Each row's
terms x_pi are kept relative to exp(S_p), S_p the largest own log scale of the row so far,
so weights that overflow as plain numbers still pair exactly. Per mean-of-terms estimator,
with d_pi = x_pi - x_bi each episode's difference from the baseline's row b:

  means [P+1]                 (1/n) sum_i d_pi                     (relative to exp(D_p))
  comoments [P+1, P+1]        sum_i (d_pi - mean_p)(d_qi - mean_q)  (exp(D_p + D_q))
  replicate_sums [R, P+1]     sum_i c_ri d_pi                      (relative to exp(D_p))
  replicate_squares [R, P+1]  sum_i c_ri d_pi^2                    (relative to exp(2 D_p))

with D_p = max(S_p, S_b) and c_ri the Poisson bootstrap counts (the same for every policy,
since they come from the episode ids). The differences are taken per episode and their
moments kept centred (merged by Chan's formulas), so a policy close to the baseline, as
consecutive checkpoints are, gets its paired standard error to full precision: sums of
x and x^2 would subtract nearly equal large numbers and lose it. Any other pair (k, j)
follows from d_k - d_j, exactly where j is b. ``init -> merge(acc, from_terms(...)) ->
difference`` serves batches, devices and processes alike. Plain NumPy: the host turns
each batch's per-episode terms (``estimators.reduction.episode_terms``) into these sums.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ope_cli.estimation.estimators.importance import mean_and_sem
from ope_cli.estimation.estimators.logspace import scaled

RETURN = "return"  # the per-episode terms of the behavior row (``episode_terms``)


class PairedSums(NamedTuple):
    """Paired sums of P policies and the behavior row (a pytree of float64 arrays, keyed by
    estimator); see the module docstring for each field's meaning and scale."""

    count: np.ndarray  # [] episodes
    replicate_counts: np.ndarray  # [R] sum_i c_ri
    log_scales: dict[str, np.ndarray]  # [P+1] S_p
    pair_log_scales: dict[str, np.ndarray]  # [P+1] D_p
    means: dict[str, np.ndarray]  # [P+1]
    comoments: dict[str, np.ndarray]  # [P+1, P+1]
    replicate_sums: dict[str, np.ndarray]  # [R, P+1]
    replicate_squares: dict[str, np.ndarray]  # [R, P+1]


def init(estimators: tuple[str, ...], policies: int, replicates: int) -> PairedSums:
    """The paired sums of no episodes (the identity of ``merge``) for the mean-of-terms
    ``estimators`` and ``policies`` policies (plus the behavior row)."""
    rows = policies + 1
    return PairedSums(
        count=np.zeros(()),
        replicate_counts=np.zeros(replicates),
        log_scales={name: np.full(rows, -np.inf) for name in estimators},
        pair_log_scales={name: np.full(rows, -np.inf) for name in estimators},
        means={name: np.zeros(rows) for name in estimators},
        comoments={name: np.zeros((rows, rows)) for name in estimators},
        replicate_sums={name: np.zeros((replicates, rows)) for name in estimators},
        replicate_squares={name: np.zeros((replicates, rows)) for name in estimators},
    )


def _factor(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """exp(old - new) elementwise, 0 where ``old`` is -inf (nothing there yet)."""
    with np.errstate(invalid="ignore"):
        return np.where(np.isfinite(old), np.exp(old - np.where(np.isfinite(new), new, 0.0)), 0.0)


def _pair_scales(log_scale_p: np.ndarray, baseline: int) -> np.ndarray:
    """[P+1] D_p = max(S_p, S_b): the scale of the differences from the baseline's row."""
    return np.maximum(log_scale_p, log_scale_p[baseline])


def from_terms(
    terms: dict[str, tuple[np.ndarray, np.ndarray]],
    episode_mask_b: np.ndarray,
    counts_br: np.ndarray,
    baseline: int,
) -> PairedSums:
    """The paired sums of one batch.

    Args:
      terms: {estimator: (values [P+1, B], own log scales [P+1, B])}: each episode's term
        relative to exp(its own log scale), the behavior row last (scale 0).
      episode_mask_b: [B] True on real episodes.
      counts_br: [B, R] bootstrap counts.
      baseline: the baseline's row b.
    """
    mask = np.asarray(episode_mask_b, bool)
    counts_rb = (np.asarray(counts_br, np.float64) * mask[:, None]).T
    out = init(tuple(terms), 0, counts_rb.shape[0])._replace(
        count=np.asarray(float(mask.sum())), replicate_counts=counts_rb.sum(axis=1)
    )
    for name, (value_pb, scale_pb) in terms.items():
        value_pb = np.asarray(value_pb, np.float64)
        scale_pb = np.where(mask[None, :], np.asarray(scale_pb, np.float64), -np.inf)
        log_scale_p = np.max(scale_pb, axis=1, initial=-np.inf)
        factor_pb = _factor(scale_pb, log_scale_p[:, None])
        with np.errstate(invalid="ignore", over="ignore"):
            x_pb = np.where(factor_pb > 0, value_pb * factor_pb, 0.0)
            pair_p = _pair_scales(log_scale_p, baseline)
            own = _factor(log_scale_p, pair_p)[:, None] * x_pb
            base = _factor(log_scale_p[baseline], pair_p)[:, None] * x_pb[baseline][None, :]
            d_pb = own - base
        real_pb = d_pb[:, mask]
        mean_p = real_pb.mean(axis=1) if mask.any() else np.zeros(len(d_pb))
        centred_pb = real_pb - mean_p[:, None]
        out.log_scales[name] = log_scale_p
        out.pair_log_scales[name] = pair_p
        out.means[name] = mean_p
        out.comoments[name] = centred_pb @ centred_pb.T
        out.replicate_sums[name] = counts_rb @ d_pb.T
        out.replicate_squares[name] = counts_rb @ (d_pb * d_pb).T
    return out


def merge(a: PairedSums, b: PairedSums, baseline: int) -> PairedSums:
    """The paired sums of the union of the episodes behind ``a`` and ``b``."""
    out = init((), 0, 0)._replace(
        count=a.count + b.count, replicate_counts=a.replicate_counts + b.replicate_counts
    )
    for name in a.means:
        la, lb = a.log_scales[name], b.log_scales[name]
        scale = np.maximum(la, lb)
        pair = _pair_scales(scale, baseline)
        da = _factor(_pair_scales(la, baseline), pair)
        db = _factor(_pair_scales(lb, baseline), pair)
        out.log_scales[name] = scale
        out.pair_log_scales[name] = pair
        out.means[name], out.comoments[name] = _chan(
            (a.count, a.means[name] * da, a.comoments[name] * np.outer(da, da)),
            (b.count, b.means[name] * db, b.comoments[name] * np.outer(db, db)),
        )
        out.replicate_sums[name] = a.replicate_sums[name] * da + b.replicate_sums[name] * db
        out.replicate_squares[name] = (
            a.replicate_squares[name] * da**2 + b.replicate_squares[name] * db**2
        )
    return out


def _chan(a: tuple, b: tuple) -> tuple[np.ndarray, np.ndarray]:
    """(means, comoments) of the union of two sets of episodes, each (count, means [P],
    comoments [P, P]) on the same scale (Chan, Golub and LeVeque's pairwise update)."""
    (count_a, mean_a, comoment_a), (count_b, mean_b, comoment_b) = a, b
    count = count_a + count_b
    if count == 0:
        return mean_a + mean_b, comoment_a + comoment_b
    with np.errstate(over="ignore", invalid="ignore"):
        delta = mean_b - mean_a
        mean = mean_a + delta * (count_b / count)
        comoment = comoment_a + comoment_b + np.outer(delta, delta) * (count_a * count_b / count)
    return mean, comoment


LOST_PRECISION = 1e-9  # a pair's spread below this share of its rows' own: not resolved


def difference(paired: PairedSums, name: str, k: int, j: int) -> tuple[float | None, float | None]:
    """(Δ, stderr) of V̂(k) - V̂(j) for mean-of-terms estimator ``name``: the mean of the
    per-episode differences and their sample standard deviation / sqrt(n) (None where
    undefined or not finite). To full precision when either row is the baseline's; for
    two other rows the spread of d_k - d_j comes from the co-moments, and a standard error
    below what their rounding resolves (``LOST_PRECISION``) is None, not a wrong number."""
    pair_k, pair_j = paired.pair_log_scales[name][k], paired.pair_log_scales[name][j]
    pair = max(pair_k, pair_j)
    fk, fj = _factor(pair_k, pair), _factor(pair_j, pair)
    means, comoments, n = paired.means[name], paired.comoments[name], float(paired.count)
    if n == 0:
        return None, None
    with np.errstate(over="ignore", invalid="ignore"):
        delta = means[k] * fk - means[j] * fj
        own = comoments[k, k] * fk * fk + comoments[j, j] * fj * fj
        spread = own - 2.0 * comoments[k, j] * fk * fj
        resolved = spread >= LOST_PRECISION * own
        stderr = math.sqrt(max(spread, 0.0) / (n - 1) / n) if n > 1 and resolved else math.nan
    pair = pair if np.isfinite(pair) else 0.0
    return scaled(float(delta), pair), scaled(stderr, pair)


def replicate_stderrs(paired: PairedSums, name: str, k: int, baseline: int) -> np.ndarray:
    """[R] the standard error of each bootstrap replicate's Δ = V̂_r(k) - V̂_r(baseline)
    (NaN where undefined): what studentizes the paired bootstrap-t interval."""
    pair = _pair_scales(paired.log_scales[name], baseline)[k]
    _, stderr = mean_and_sem(
        paired.replicate_sums[name][:, k],
        paired.replicate_squares[name][:, k],
        paired.replicate_counts,
        pair if np.isfinite(pair) else 0.0,
    )
    return np.asarray(stderr, np.float64)


def rows_of(
    groups: list[tuple[list[int], dict[str, np.ndarray]]], policies: int
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``from_terms``' rows from each policy group's episode terms: (the group's policy
    indices, {name: [P_g, B]} of ``estimators.reduction.episode_terms``) -> {estimator: (values
    [P+1, B], own log scales [P+1, B])}, the behavior row (the return G, scale 0) last."""
    by_row: dict[int, dict[str, np.ndarray]] = {}
    for indices, terms in groups:
        for position, index in enumerate(indices):
            by_row[index] = {name: np.asarray(x[position]) for name, x in terms.items()}
    returns = by_row[0][RETURN]
    names = [name for name in by_row[0] if name != RETURN and not name.endswith("/scale")]
    rows = {}
    for name in names:
        values = [by_row[p][name] for p in range(policies)] + [returns]
        scales = [by_row[p][name + "/scale"] for p in range(policies)] + [np.zeros_like(returns)]
        rows[name] = (np.stack(values), np.stack(scales))
    return rows
