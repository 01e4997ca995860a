"""Paired sums of several policies on the same episodes (SPEC 11): mergeable float64 sums from
which the difference of any two policies' mean-of-terms estimators (is, pdis, dm, dr:
``Estimator.term``), and its standard error, follow exactly.

Rows p = 0..P-1 are the policies in command-line order and row P the logged episodes'
discounted return G, the behavior policy's own term (``--baseline behavior``). Each row's
terms x_pi are kept relative to exp(S_p), S_p the largest own log scale of the row so far,
so weights that overflow as plain numbers still pair exactly. Per mean-of-terms estimator:

  sums [P+1]            sum_i x_pi                          (relative to exp(S_p))
  gram [P+1, P+1]       sum_i x_pi x_qi                     (relative to exp(S_p + S_q))
  replicate_sums [R, P+1]     sum_i c_ri d_pi, d_pi = x_pi - x_bi  (relative to exp(D_p))
  replicate_squares [R, P+1]  sum_i c_ri d_pi^2                    (relative to exp(2 D_p))

with b the baseline's row, D_p = max(S_p, S_b) and c_ri the Poisson bootstrap counts (the
same for every policy, since they come from the episode ids). ``init -> merge(acc,
from_terms(...)) -> difference`` serves batches, devices and processes alike. Plain NumPy:
the host turns each batch's per-episode terms (``estimators.reduction.episode_terms``) into
these sums.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ope_cli.estimation.estimators.importance import mean_and_sem
from ope_cli.estimation.estimators.logspace import finite

RETURN = "return"  # the per-episode terms of the behavior row (``episode_terms``)


class PairedSums(NamedTuple):
    """Paired sums of P policies and the behavior row (a pytree of float64 arrays, keyed by
    estimator); see the module docstring for each field's meaning and scale."""

    count: np.ndarray  # [] episodes
    replicate_counts: np.ndarray  # [R] sum_i c_ri
    log_scales: dict[str, np.ndarray]  # [P+1] S_p
    sums: dict[str, np.ndarray]  # [P+1]
    gram: dict[str, np.ndarray]  # [P+1, P+1]
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
        sums={name: np.zeros(rows) for name in estimators},
        gram={name: np.zeros((rows, rows)) for name in estimators},
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
        out.log_scales[name] = log_scale_p
        out.sums[name] = x_pb.sum(axis=1)
        out.gram[name] = x_pb @ x_pb.T
        out.replicate_sums[name] = counts_rb @ d_pb.T
        out.replicate_squares[name] = counts_rb @ (d_pb * d_pb).T
    return out


def merge(a: PairedSums, b: PairedSums, baseline: int) -> PairedSums:
    """The paired sums of the union of the episodes behind ``a`` and ``b``."""
    out = init((), 0, 0)._replace(
        count=a.count + b.count, replicate_counts=a.replicate_counts + b.replicate_counts
    )
    for name in a.sums:
        la, lb = a.log_scales[name], b.log_scales[name]
        scale = np.maximum(la, lb)
        fa, fb = _factor(la, scale), _factor(lb, scale)
        pair = _pair_scales(scale, baseline)
        da = _factor(_pair_scales(la, baseline), pair)
        db = _factor(_pair_scales(lb, baseline), pair)
        out.log_scales[name] = scale
        out.sums[name] = a.sums[name] * fa + b.sums[name] * fb
        out.gram[name] = a.gram[name] * np.outer(fa, fa) + b.gram[name] * np.outer(fb, fb)
        out.replicate_sums[name] = a.replicate_sums[name] * da + b.replicate_sums[name] * db
        out.replicate_squares[name] = (
            a.replicate_squares[name] * da**2 + b.replicate_squares[name] * db**2
        )
    return out


def difference(paired: PairedSums, name: str, k: int, b: int) -> tuple[float | None, float | None]:
    """(Δ, stderr) of V̂(k) - V̂(b) for mean-of-terms estimator ``name``: the mean of the
    per-episode differences and their sample standard deviation / sqrt(n) (None where
    undefined or not finite)."""
    scale = paired.log_scales[name]
    pair = max(scale[k], scale[b])
    fk, fb = _factor(scale[k], pair), _factor(scale[b], pair)
    sums, gram = paired.sums[name], paired.gram[name]
    with np.errstate(over="ignore", invalid="ignore"):
        total = sums[k] * fk - sums[b] * fb
        squares = gram[k, k] * fk * fk + gram[b, b] * fb * fb - 2.0 * gram[k, b] * fk * fb
    pair = pair if np.isfinite(pair) else 0.0
    delta, stderr = mean_and_sem(total, squares, paired.count, pair)
    return finite(float(delta)), finite(float(stderr))


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
