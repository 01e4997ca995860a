"""``linear_gaussian``: least squares for the mean action, residual spread for ``log_std``.

Per fold of episodes, the normal equations are accumulated as steps stream in (x = [s, 1]):
X'X [d+1, d+1], X'Y [d+1, k], the per-dimension sums of y^2 [k] and the step count; the
observations are taken relative to a pivot (the first step's; processes agree on the first
process's at the gather) so that a large common offset does not swamp the sums, and the
actions relative to a pilot line fitted to the first steps added (their least squares,
once there are PILOT_ROWS_PER_PARAMETER times as many as parameters, keeping only the
slopes at least PILOT_T standard errors from 0), so that the sums of squares are of
residuals: an action that follows the observations far more closely than it spreads (a
spread 1e5 times its noise) does not lose its noise to cancellation (std_j came out 3
times too wide). A slope kept is known to 1/PILOT_T of itself, so along it the residuals
are smaller than the actions by that much whatever the later observations' spread; one
not kept leaves the actions as they are (a first block whose observations hardly moved
gave slopes of 1e8 that later observations turned into residuals 1e8 times the noise).
The fit solves the sums centred on the means (least squares of the centred system,
minimum-norm where it is singular) and sets
std_j = sqrt(RSS_j / n) (maximum likelihood). Memory is flat: O(folds * d * (d + k)),
whatever the data's size.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from ope_cli.errors import DataError
from ope_cli.models.behavior_models.base import Gather, features, largest, summed

MIN_VARIANCE = 1e-12
PILOT_ROWS_PER_PARAMETER = 16  # steps per parameter the pilot line waits for
PILOT_T = 1e3  # the pilot keeps a slope this many of its standard errors from 0


class LinearGaussianModel:
    """Normal equations per fold: xtx [K, d+1, d+1], xty [K, d+1, k], yy [K, k], n [K]."""

    name = "linear_gaussian"
    stopped_short = None  # closed form: no iterations to stop short

    def __init__(self, folds: int = 1):
        self.folds = folds
        self.xtx = self.xty = self.yy = None
        self.n = np.zeros(folds, np.int64)
        self.pivot: np.ndarray | None = None  # [d] subtracted from every observation
        # the pilot line subtracted from every action: pivot_y + (s - pivot) @ slope
        self.pivot_y: np.ndarray | None = None  # [k]
        self.slope: np.ndarray | None = None  # [d, k]
        self._waiting: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # before a pilot

    def add(self, observation: np.ndarray, action: np.ndarray, fold: np.ndarray) -> None:
        """Accumulates steps: observation [N] or [N, d], action [N] or [N, k], fold [N]."""
        x = features(observation)
        if x.shape[0] == 0:
            return
        y = features(action)
        if self.pivot is None:  # the first steps wait for enough of them to pilot the sums
            if (
                self._waiting
                and self._waiting[0][0].shape[1:] + self._waiting[0][1].shape[1:]
                != x.shape[1:] + y.shape[1:]
            ):  # here, where a process's pass can fail
                raise DataError("observations or actions change size between steps")
            self._waiting.append((x, y, np.asarray(fold)))
            if sum(part[0].shape[0] for part in self._waiting) >= PILOT_ROWS_PER_PARAMETER * (
                x.shape[1] + 1
            ):
                self._start()
            return
        if self.slope.shape != (x.shape[1], y.shape[1]):
            raise DataError("observations or actions change size between steps")
        self._accumulate(x, y, fold)

    def _start(self) -> None:
        """Pilots the sums with the steps waiting (any number), and adds them."""
        if not self._waiting:
            return
        x, y, fold = (np.concatenate(parts) for parts in zip(*self._waiting, strict=True))
        self._waiting = []
        self.pivot = np.array(x[0], np.float64)
        self.pivot_y, self.slope = _pilot(x - self.pivot, y)
        self._accumulate(x, y, fold)

    def _accumulate(self, x: np.ndarray, y: np.ndarray, fold: np.ndarray) -> None:
        """Adds steps ([N, d] observations, [N, k] actions) about the pivot and pilot."""
        x = np.concatenate([x - self.pivot, np.ones((x.shape[0], 1))], axis=1)
        y = y - self.pivot_y - x[:, :-1] @ self.slope
        if self.xtx is None:
            d, k = x.shape[1], y.shape[1]
            self.xtx = np.zeros((self.folds, d, d))
            self.xty = np.zeros((self.folds, d, y.shape[1]))
            self.yy = np.zeros((self.folds, k))
        for k in np.unique(fold):  # a handful of folds, not a loop over steps
            rows = fold == k
            xk, yk = x[rows], y[rows]
            self.xtx[k] += xk.T @ xk
            self.xty[k] += xk.T @ yk
            self.yy[k] += np.sum(yk * yk, axis=0)
            self.n[k] += int(rows.sum())

    def gather_processes(self, gather: Gather) -> None:
        """Every process's normal equations, summed (a process without steps adds zeros)."""
        self._start()
        shape = (0, 0) if self.xtx is None else (self.xtx.shape[1], self.xty.shape[2])
        d, k = largest(gather, shape)
        if d == 0:
            return  # no process has a step: fit() says so
        has_steps = self.xtx is not None
        if not has_steps:
            self.xtx, self.xty = np.zeros((self.folds, d, d)), np.zeros((self.folds, d, k))
            self.yy = np.zeros((self.folds, k))
            self.pivot, self.pivot_y, self.slope = (
                np.zeros(d - 1),
                np.zeros(k),
                np.zeros((d - 1, k)),
            )
        self._move_to(_first_of(gather, has_steps, self.pivot, self.pivot_y, self.slope))
        self.xtx, self.xty = summed(gather, self.xtx), summed(gather, self.xty)
        self.yy, self.n = summed(gather, self.yy), summed(gather, self.n)

    def _move_to(self, pivots: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        """The sums about other pivots and pilot line (the first process's: p', q', b'):
        with z = [x - p, 1] and y'' = y - q' - (x - p') b' = y' + z u, where y' is the
        action about this model's pilot and u = [b - b'; q - q' - (p - p') b'], the sums
        of (z, y'') follow from those of (z, y'); then [x - p', 1] = M z."""
        common_x, common_y, common_slope = pivots
        offset = self.pivot - common_x
        u = np.concatenate(
            [self.slope - common_slope, (self.pivot_y - common_y - offset @ common_slope)[None]]
        )  # [d + 1, k]
        xtx, xty = self.xtx, self.xty
        self.yy = (
            self.yy + 2 * np.einsum("fik,ik->fk", xty, u) + np.einsum("ik,fij,jk->fk", u, xtx, u)
        )
        xty = xty + xtx @ u
        move = np.eye(xtx.shape[1])
        move[:-1, -1] = offset
        self.xtx = np.einsum("ij,fjk,lk->fil", move, xtx, move)
        self.xty = np.einsum("ij,fjk->fik", move, xty)
        self.pivot, self.pivot_y, self.slope = common_x, common_y, common_slope

    def _pooled(self, exclude: int | None):
        parts = (self.xtx, self.xty, self.yy, self.n)
        totals = [p.sum(axis=0) for p in parts]
        if exclude is not None:
            totals = [t - p[exclude] for t, p in zip(totals, parts, strict=True)]
        return totals

    def fit(self, exclude: int | None = None) -> dict[str, np.ndarray]:
        """{"weight" [d, k], "bias" [k], "log_std" [k]} from every fold but ``exclude``."""
        self._start()
        if self.xtx is None:
            raise DataError("no steps to fit the linear_gaussian behavior model on")
        xtx, xty, yy, n = self._pooled(exclude)
        if n == 0:
            raise DataError("no steps to fit the linear_gaussian behavior model on")
        if n <= xtx.shape[0]:  # residuals of 0 would make the spread the variance floor
            raise DataError(
                f"too few steps to fit the linear_gaussian behavior model: {int(n)} step(s) "
                f"for {xtx.shape[0]} parameters per action dimension (it needs more steps "
                "than parameters to measure the spread)"
            )
        centred = _centred(xtx, xty, yy, n, (self.pivot, self.pivot_y, self.slope))
        # least squares of the centred system: its minimum-norm solution where it is
        # singular (a constant observation feature), exact elsewhere (a guard ridge, even
        # 1e-10 of the diagonal, moved the bias by 1e-10 times the observations' offset)
        w = self.slope + np.linalg.lstsq(centred.sxx, centred.sxy, rcond=None)[0]
        bias = centred.mean_y - centred.mean_x @ w
        rss = _residual_sums(w, bias, centred)
        variance = np.maximum(rss / n, MIN_VARIANCE)
        return {"weight": w, "bias": bias, "log_std": 0.5 * np.log(variance)}

    def log_likelihood(
        self, arrays: dict[str, np.ndarray], fold: int | None = None
    ) -> tuple[float, int]:
        """Sum of the diagonal Gaussian log-densities over one fold's steps (None: all)."""
        self._start()
        if fold is None:
            xtx, xty, yy, n = self._pooled(None)
        else:
            xtx, xty, yy, n = self.xtx[fold], self.xty[fold], self.yy[fold], self.n[fold]
        centred = _centred(xtx, xty, yy, n, (self.pivot, self.pivot_y, self.slope))
        rss = _residual_sums(arrays["weight"], arrays["bias"], centred)
        log_std = arrays["log_std"]
        total = -0.5 * rss * np.exp(-2 * log_std) - n * (log_std + 0.5 * math.log(2 * math.pi))
        return float(total.sum()), int(n)

    def floored(self, arrays: dict[str, np.ndarray], fold: int | None, floor: float) -> int:
        """Densities are not probabilities: the floor does not apply (0)."""
        return 0


class Centred(NamedTuple):
    """The normal-equation sums about the means: mean_x [d], mean_y [k] (of the actions),
    sxx [d, d], sxy [d, k], syy [k] (sums of products of deviations; y about the pilot
    line of slope ``slope`` [d, k]), n steps."""

    mean_x: np.ndarray
    mean_y: np.ndarray
    sxx: np.ndarray
    sxy: np.ndarray
    syy: np.ndarray
    n: float
    slope: np.ndarray


def _pilot(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(intercept [k], slope [d, k]): the least squares of actions ``y`` [N, k] on
    observations ``x`` [N, d] (about the pivot), each slope kept only where it is at least
    PILOT_T of its standard errors from 0 (else 0); a flat line through the actions' mean
    where there are no more steps than parameters."""
    n, d = x.shape
    slope = np.zeros((d, y.shape[1]))
    if n > d + 1:
        mean_x, mean_y = x.mean(axis=0), y.mean(axis=0)
        u, s, vt = np.linalg.svd(x - mean_x, full_matrices=False)
        kept = s > s.max(initial=0.0) * n * np.finfo(np.float64).eps
        inverse = vt[kept].T / s[kept]  # [d, r]: the centred design's pseudo-inverse, V S^-1
        fitted = inverse @ (u[:, kept].T @ (y - mean_y))  # [d, k]
        residual = (y - mean_y) - (x - mean_x) @ fitted
        variance = np.sum(residual * residual, axis=0) / (n - d - 1)  # [k]
        stderr = np.sqrt(np.outer(np.sum(inverse * inverse, axis=1), variance))  # [d, k]
        slope = np.where(np.abs(fitted) >= PILOT_T * stderr, fitted, 0.0)
        return mean_y - mean_x @ slope, slope
    return y.mean(axis=0), slope


def _first_of(gather, has_steps: bool, pivot, pivot_y, slope):
    """The (observation pivot, action pivot, slope) of the first process that has steps."""
    table = gather(np.concatenate([[float(has_steps)], pivot, pivot_y, slope.ravel()])[None])
    first = table[int(np.flatnonzero(table[:, 0] > 0)[0]), 1:]
    d, k = pivot.size, pivot_y.size
    return first[:d], first[d : d + k], first[d + k :].reshape(d, k)


def _centred(xtx: np.ndarray, xty: np.ndarray, yy: np.ndarray, n, pivots) -> Centred:
    """The sums of x = [s - p, 1] and y' = y - q - (s - p) b (X'X, X'Y', y'^2; ``pivots``
    = (p, q, b)) centred on the means of s and y'."""
    n = float(n)
    pivot, pivot_y, slope = pivots
    sum_x, sum_y = xtx[:-1, -1], xty[-1]
    mean_x, mean_y = sum_x / max(n, 1.0), sum_y / max(n, 1.0)
    return Centred(
        mean_x + pivot,
        mean_y + pivot_y + mean_x @ slope,
        xtx[:-1, :-1] - np.outer(sum_x, mean_x),
        xty[:-1] - np.outer(sum_x, mean_y),
        yy - sum_y * mean_y,
        n,
        slope,
    )


def _residual_sums(w: np.ndarray, bias: np.ndarray, c: Centred) -> np.ndarray:
    """[k] sum over steps of (y_j - s w_j - bias_j)^2, from the centred sums: the spread
    about the fitted line through the means (its slope relative to the pilot's: the sums
    are of the actions about it), plus n times the offset of ``bias`` from it."""
    offset = c.mean_y - c.mean_x @ w - bias
    relative = w - c.slope
    spread = (
        c.syy
        - 2 * np.sum(relative * c.sxy, axis=0)
        + np.einsum("ik,ij,jk->k", relative, c.sxx, relative)
    )
    return np.maximum(spread + c.n * offset * offset, 0.0)
