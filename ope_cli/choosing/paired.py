"""Paired sums of several policies on the same episodes (SPEC 11): mergeable float64 sums from
which the difference of any two policies' mean-of-terms estimators (is, pdis, dm, dr:
``Estimator.term``), and its standard error, follow exactly.

Rows p = 0..P-1 are the policies in command-line order and row P the logged episodes'
discounted return G, the behavior policy's own term (``--baseline behavior``). Each row's
terms x_pi are kept relative to exp(S_p), S_p the largest own log scale of the row so far,
so weights that overflow as plain numbers still pair exactly. Per mean-of-terms estimator,
with d_pi = x_pi - x_bi each episode's difference from the baseline's row b
(``differences_from``: the first policy's without ``--baseline``):

  means [P+1]                 (1/n) sum_i x_pi                     (relative to exp(S_p))
  comoments [P+1, P+1]        sum_i (x_pi - mean_p)(x_qi - mean_q)  (exp(S_p + S_q))
  diff_means [P+1]            (1/n) sum_i d_pi                     (relative to exp(D_p))
  diff_comoments [P+1, P+1]   sum_i (d_pi - diff_mean_p)(d_qi - diff_mean_q)  (exp(D_p + D_q))
  replicate_sums [R, P+1]     sum_i c_ri d_pi                      (relative to exp(D_p))
  replicate_squares [R, P+1]  sum_i c_ri d_pi^2                    (relative to exp(2 D_p))

with D_p = max(S_p, S_b) and c_ri the Poisson bootstrap counts (the same for every policy,
since they come from the episode ids). Moments are kept centred and merged by Chan's
formulas. A pair with the baseline reads the differences taken per episode, so a policy
close to the baseline, as consecutive checkpoints are, gets its paired standard error to
full precision (from the terms' own moments, C_kk + C_bb - 2 C_kb, nearly equal numbers
would cancel). Any other pair (could-be-best sets) reads C_kk + C_jj - 2 C_kj of the
co-moments that cancel least: the differences' (d_k - d_j = x_k - x_j), when both
policies are close to the baseline (consecutive checkpoints), else the terms' (when the
baseline's terms dwarf theirs); a spread that rounding cannot resolve is left undefined.
``init -> merge(acc, from_terms(...)) -> difference`` serves batches, devices and processes
alike. Plain NumPy: the host turns each batch's per-episode terms
(``estimators.reduction.episode_terms``) into these sums.
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
    means: dict[str, np.ndarray]  # [P+1]
    comoments: dict[str, np.ndarray]  # [P+1, P+1]
    pair_log_scales: dict[str, np.ndarray]  # [P+1] D_p
    diff_means: dict[str, np.ndarray]  # [P+1]
    diff_comoments: dict[str, np.ndarray]  # [P+1, P+1]
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
        means={name: np.zeros(rows) for name in estimators},
        comoments={name: np.zeros((rows, rows)) for name in estimators},
        pair_log_scales={name: np.full(rows, -np.inf) for name in estimators},
        diff_means={name: np.zeros(rows) for name in estimators},
        diff_comoments={name: np.zeros((rows, rows)) for name in estimators},
        replicate_sums={name: np.zeros((replicates, rows)) for name in estimators},
        replicate_squares={name: np.zeros((replicates, rows)) for name in estimators},
    )


def _factor(old: np.ndarray, new: np.ndarray) -> np.ndarray:
    """exp(old - new) elementwise, 0 where ``old`` is -inf (nothing there yet)."""
    with np.errstate(invalid="ignore"):
        return np.where(np.isfinite(old), np.exp(old - np.where(np.isfinite(new), new, 0.0)), 0.0)


def differences_from(baseline: int | None) -> int:
    """The row whose per-episode differences the paired sums keep: the ``--baseline`` row,
    else the first policy's."""
    return 0 if baseline is None else baseline


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
        out.means[name], out.comoments[name] = _moments(x_pb[:, mask])
        out.pair_log_scales[name] = pair_p
        out.diff_means[name], out.diff_comoments[name] = _moments(d_pb[:, mask])
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
        fa, fb = _factor(la, scale), _factor(lb, scale)
        pair = _pair_scales(scale, baseline)
        da = _factor(_pair_scales(la, baseline), pair)
        db = _factor(_pair_scales(lb, baseline), pair)
        out.log_scales[name] = scale
        out.means[name], out.comoments[name] = _chan(
            (a.count, a.means[name] * fa, a.comoments[name] * np.outer(fa, fa)),
            (b.count, b.means[name] * fb, b.comoments[name] * np.outer(fb, fb)),
        )
        out.pair_log_scales[name] = pair
        out.diff_means[name], out.diff_comoments[name] = _chan(
            (a.count, a.diff_means[name] * da, a.diff_comoments[name] * np.outer(da, da)),
            (b.count, b.diff_means[name] * db, b.diff_comoments[name] * np.outer(db, db)),
        )
        out.replicate_sums[name] = a.replicate_sums[name] * da + b.replicate_sums[name] * db
        out.replicate_squares[name] = (
            a.replicate_squares[name] * da**2 + b.replicate_squares[name] * db**2
        )
    return out


def _moments(values_pb: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(means [P], centred co-moments [P, P]) of the rows of ``values_pb`` [P, B] (zeros
    for no episode)."""
    rows, episodes = values_pb.shape
    mean_p = values_pb.mean(axis=1) if episodes else np.zeros(rows)
    with np.errstate(over="ignore", invalid="ignore"):
        centred_pb = values_pb - mean_p[:, None]
        return mean_p, centred_pb @ centred_pb.T


def _chan(a: tuple, b: tuple) -> tuple[np.ndarray, np.ndarray]:
    """(means, centred co-moments) of the union of two sets of episodes, each (count,
    means [P], co-moments [P, P]) on the same scale (Chan, Golub and LeVeque's pairwise
    update)."""
    (count_a, mean_a, moment_a), (count_b, mean_b, moment_b) = a, b
    count = count_a + count_b
    if count == 0:
        return mean_a + mean_b, moment_a + moment_b
    with np.errstate(over="ignore", invalid="ignore"):
        delta = mean_b - mean_a
        mean = mean_a + delta * (count_b / count)
        return mean, moment_a + moment_b + np.outer(delta, delta) * (count_a * count_b / count)


# A pair's spread below this share of its rows' own co-moments is not resolved. Rounding
# leaves a co-moment about 1e-16 of itself off, hence the spread about 1e-16 / share of
# itself: on 20,000 episodes in 40 merged batches, standard errors came out 4e-8 off at a
# share of 5e-9, 6e-6 at 1e-11, 4e-4 at 5e-13 and 5e-2 at 5e-15 (at 1e-8, checkpoints 1e-5
# apart, 4.9 standard errors apart, were left undefined: every one could be the best)
LOST_PRECISION = 1e-11


# Where the terms come from arithmetic coarser than float64 (float32 kernels), each is good
# to about its epsilon per step (a random walk over the steps: sqrt of the longest episode)
# of itself: a bound on what that rounding can shift a difference by is term_noise times
# the terms' root mean square (not the estimates: rewards centred at 0 leave estimates near
# 0 and terms near 1, and float32 shifted a difference by 2 of its standard errors). A
# difference is resolved where its standard error is at least this share of the bound. On
# generated chain data (2,000 and 50,000 episodes, checkpoints 1e-7 to 1e-3 apart, rewards
# as logged and centred), the differences it kept were shifted by float32 by 0.17 of their
# standard error at most, the ones it left without one by 0.15 to 30 (at 1e-7 apart, two
# checkpoints were called 11 standard errors apart: their difference was that rounding)
TERM_NOISE_MARGIN = 1 / 3


def below_rounding(log_stderr: float, log_size: float, term_noise: float) -> bool:
    """Whether a standard error (its log) is below what rounding of ``term_noise`` of
    every term, of root mean square exp(``log_size``), can shift a difference by."""
    if term_noise == 0.0:
        return False
    return log_stderr < math.log(TERM_NOISE_MARGIN * term_noise) + log_size


def term_noise(epsilon: float, longest: int) -> float:
    """The relative rounding of a per-episode term computed in arithmetic of machine
    ``epsilon`` over episodes of at most ``longest`` steps (``difference``'s
    ``term_noise``)."""
    return epsilon * math.sqrt(max(longest, 1))


class _Route(NamedTuple):
    """A pair's difference read from one set of co-moments, relative to exp(``pair``)."""

    pair: float  # the log scale
    delta: float  # Δ
    spread: float  # C_kk + C_jj - 2 C_kj: the centred sum of squares of the differences
    own: float  # C_kk + C_jj: what the spread is taken from, hence how much cancels
    log_size: float  # log of the larger root mean square of the two rows' values


def difference(
    paired: PairedSums, name: str, k: int, j: int, baseline: int, term_noise: float = 0.0
) -> tuple[float | None, float | None]:
    """(Δ, stderr) of V̂(k) - V̂(j) for mean-of-terms estimator ``name``: the mean of the
    per-episode differences and their sample standard deviation / sqrt(n) (None where
    undefined or not finite). ``baseline``: the row whose differences the sums keep
    (``differences_from``); a pair with it reads them, any other pair C_kk + C_jj - 2 C_kj
    of the terms' or the differences' co-moments, whichever cancels less. Its standard
    error is None where that spread is below what the co-moments' rounding resolves
    (``LOST_PRECISION``), or where the standard error is below what the terms' own
    rounding (``term_noise`` of each: 0 for float64 terms) can shift Δ by
    (``below_rounding``): not a wrong number."""
    n = float(paired.count)
    if n == 0:
        return None, None
    if k == j:
        return 0.0, 0.0
    terms = _route(paired.log_scales[name], paired.means[name], paired.comoments[name], k, j, n)
    differences = _route(
        paired.pair_log_scales[name], paired.diff_means[name], paired.diff_comoments[name], k, j, n
    )
    # with the baseline, the differences were taken per episode (d_b = 0): never cancelled
    route = differences if baseline in (k, j) else min((terms, differences), key=_cancelled)
    resolved = route.own == 0.0 or (  # own 0: the rows differ by a constant, if at all
        route.spread >= LOST_PRECISION * route.own and _above_noise(route, terms, n, term_noise)
    )
    with np.errstate(over="ignore", invalid="ignore"):
        spread = max(route.spread, 0.0)
        stderr = math.sqrt(spread / (n - 1) / n) if n > 1 and resolved else math.nan
    pair = route.pair if np.isfinite(route.pair) else 0.0
    return scaled(float(route.delta), pair), scaled(stderr, pair)


def _route(log_scale_p, mean_p, comoment_pq, k: int, j: int, n: float) -> _Route:
    """Rows k and j of one set of co-moments (``log_scale_p`` [P+1], ``mean_p`` [P+1],
    ``comoment_pq`` [P+1, P+1]) of ``n`` episodes, on their larger scale."""
    pair = max(log_scale_p[k], log_scale_p[j])
    fk, fj = _factor(log_scale_p[k], pair), _factor(log_scale_p[j], pair)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        own = comoment_pq[k, k] * fk * fk + comoment_pq[j, j] * fj * fj
        spread = own - 2.0 * comoment_pq[k, j] * fk * fj
        mean_k, mean_j = mean_p[k] * fk, mean_p[j] * fj
        squares = max(
            comoment_pq[k, k] * fk * fk / n + mean_k**2, comoment_pq[j, j] * fj * fj / n + mean_j**2
        )
        if math.isnan(squares):  # beyond float64: nothing is resolved against it
            log_size = math.inf
        else:
            log_size = 0.5 * math.log(squares) + pair if squares > 0 else -math.inf
        return _Route(pair, mean_k - mean_j, spread, own, log_size)


def log_term_size(paired: PairedSums, name: str, k: int, j: int) -> float:
    """log of the larger root mean square of rows k and j's terms of ``name`` (what their
    rounding scales with), their scale included."""
    n = float(paired.count)
    if n == 0:
        return -math.inf
    return _route(
        paired.log_scales[name], paired.means[name], paired.comoments[name], k, j, n
    ).log_size


def _above_noise(route: _Route, terms: _Route, n: float, term_noise: float) -> bool:
    """Whether the standard error of ``route`` is at least what rounding of the terms
    (``terms``: their own route) can shift it by (``below_rounding``), compared in logs
    (each on its own scale: weights far beyond float64 pair too)."""
    if term_noise == 0.0:
        return True
    if not (route.spread > 0 and n > 1):
        return False
    with np.errstate(divide="ignore", invalid="ignore"):
        log_stderr = 0.5 * (math.log(route.spread) - math.log(n - 1) - math.log(n)) + route.pair
    return not below_rounding(log_stderr, terms.log_size, term_noise)


def _cancelled(route: _Route) -> float:
    """log of what a route's spread is taken from (its own moments), on one scale for
    every route: the smaller, the less rounding cancels (NaN routes last)."""
    if route.own == 0:  # rows equal on every episode: nothing to cancel
        return -math.inf
    if not (route.own > 0 and math.isfinite(route.own) and math.isfinite(route.pair)):
        return math.inf
    return math.log(route.own) + 2.0 * route.pair


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
