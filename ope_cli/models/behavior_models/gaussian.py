"""``linear_gaussian``: least squares for the mean action, residual spread for ``log_std``.

Per fold of episodes, the normal equations are accumulated as steps stream in (x = [s, 1]):
X'X [d+1, d+1], X'Y [d+1, k], the per-dimension sums of y^2 [k] and the step count; the
observations are taken relative to a pivot (the first step's; processes agree on the first
process's at the gather) so that a large common offset does not swamp the sums, and the
fit solves them centred on the means (least squares of the centred system, minimum-norm
where it is singular) and sets
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


class LinearGaussianModel:
    """Normal equations per fold: xtx [K, d+1, d+1], xty [K, d+1, k], yy [K, k], n [K]."""

    name = "linear_gaussian"

    def __init__(self, folds: int = 1):
        self.folds = folds
        self.xtx = self.xty = self.yy = None
        self.n = np.zeros(folds, np.int64)
        self.pivot: np.ndarray | None = None  # [d] subtracted from every observation
        self.pivot_y: np.ndarray | None = None  # [k] subtracted from every action

    def add(self, observation: np.ndarray, action: np.ndarray, fold: np.ndarray) -> None:
        """Accumulates steps: observation [N] or [N, d], action [N] or [N, k], fold [N]."""
        x = features(observation)
        if x.shape[0] == 0:
            return
        y = features(action)
        if self.pivot is None:
            self.pivot, self.pivot_y = np.array(x[0], np.float64), np.array(y[0], np.float64)
        x = np.concatenate([x - self.pivot, np.ones((x.shape[0], 1))], axis=1)
        y = y - self.pivot_y
        if self.xtx is None:
            d, k = x.shape[1], y.shape[1]
            self.xtx = np.zeros((self.folds, d, d))
            self.xty = np.zeros((self.folds, d, y.shape[1]))
            self.yy = np.zeros((self.folds, k))
        elif x.shape[1] != self.xtx.shape[1] or y.shape[1] != self.xty.shape[2]:
            raise DataError("observations or actions change size between steps")
        for k in np.unique(fold):  # a handful of folds, not a loop over steps
            rows = fold == k
            xk, yk = x[rows], y[rows]
            self.xtx[k] += xk.T @ xk
            self.xty[k] += xk.T @ yk
            self.yy[k] += np.sum(yk * yk, axis=0)
            self.n[k] += int(rows.sum())

    def gather_processes(self, gather: Gather) -> None:
        """Every process's normal equations, summed (a process without steps adds zeros)."""
        shape = (0, 0) if self.xtx is None else (self.xtx.shape[1], self.xty.shape[2])
        d, k = largest(gather, shape)
        if d == 0:
            return  # no process has a step: fit() says so
        has_steps = self.xtx is not None
        if not has_steps:
            self.xtx, self.xty = np.zeros((self.folds, d, d)), np.zeros((self.folds, d, k))
            self.yy = np.zeros((self.folds, k))
            self.pivot, self.pivot_y = np.zeros(d - 1), np.zeros(k)
        self._move_to(_first_of(gather, has_steps, self.pivot, self.pivot_y))
        self.xtx, self.xty = summed(gather, self.xtx), summed(gather, self.xty)
        self.yy, self.n = summed(gather, self.yy), summed(gather, self.n)

    def _move_to(self, pivots: tuple[np.ndarray, np.ndarray]) -> None:
        """The sums about other pivots (the first process's): with x' = x - p' and
        y' = y - q', [x', 1] = M [x - p, 1] and y' = (y - q) + (q - q')."""
        common_x, common_y = pivots
        move = np.eye(self.xtx.shape[1])
        move[:-1, -1] = self.pivot - common_x
        shift = self.pivot_y - common_y  # [k]
        xtx = np.einsum("ij,fjk,lk->fil", move, self.xtx, move)
        xty = np.einsum("ij,fjk->fik", move, self.xty)
        sum_y = xty[:, -1, :]  # [folds, k] (the ones row: y's sums)
        self.yy = self.yy + 2 * shift * sum_y + self.n[:, None] * shift * shift
        self.xty = xty + xtx[:, :, -1:] * shift
        self.xtx, self.pivot, self.pivot_y = xtx, common_x, common_y

    def _pooled(self, exclude: int | None):
        parts = (self.xtx, self.xty, self.yy, self.n)
        totals = [p.sum(axis=0) for p in parts]
        if exclude is not None:
            totals = [t - p[exclude] for t, p in zip(totals, parts, strict=True)]
        return totals

    def fit(self, exclude: int | None = None) -> dict[str, np.ndarray]:
        """{"weight" [d, k], "bias" [k], "log_std" [k]} from every fold but ``exclude``."""
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
        centred = _centred(xtx, xty, yy, n, (self.pivot, self.pivot_y))
        # least squares of the centred system: its minimum-norm solution where it is
        # singular (a constant observation feature), exact elsewhere (a guard ridge, even
        # 1e-10 of the diagonal, moved the bias by 1e-10 times the observations' offset)
        w = np.linalg.lstsq(centred.sxx, centred.sxy, rcond=None)[0]
        bias = centred.mean_y - centred.mean_x @ w
        rss = _residual_sums(w, bias, centred)
        variance = np.maximum(rss / n, MIN_VARIANCE)
        return {"weight": w, "bias": bias, "log_std": 0.5 * np.log(variance)}

    def log_likelihood(
        self, arrays: dict[str, np.ndarray], fold: int | None = None
    ) -> tuple[float, int]:
        """Sum of the diagonal Gaussian log-densities over one fold's steps (None: all)."""
        if fold is None:
            xtx, xty, yy, n = self._pooled(None)
        else:
            xtx, xty, yy, n = self.xtx[fold], self.xty[fold], self.yy[fold], self.n[fold]
        centred = _centred(xtx, xty, yy, n, (self.pivot, self.pivot_y))
        rss = _residual_sums(arrays["weight"], arrays["bias"], centred)
        log_std = arrays["log_std"]
        total = -0.5 * rss * np.exp(-2 * log_std) - n * (log_std + 0.5 * math.log(2 * math.pi))
        return float(total.sum()), int(n)

    def floored(self, arrays: dict[str, np.ndarray], fold: int | None, floor: float) -> int:
        """Densities are not probabilities: the floor does not apply (0)."""
        return 0


class Centred(NamedTuple):
    """The normal-equation sums about the means: mean_x [d], mean_y [k], sxx [d, d],
    sxy [d, k], syy [k] (sums of products of deviations), n steps."""

    mean_x: np.ndarray
    mean_y: np.ndarray
    sxx: np.ndarray
    sxy: np.ndarray
    syy: np.ndarray
    n: float


def _first_of(gather, has_steps: bool, pivot: np.ndarray, pivot_y: np.ndarray):
    """The (observation, action) pivots of the first process that has steps."""
    table = gather(np.concatenate([[float(has_steps)], pivot, pivot_y])[None])
    first = table[int(np.flatnonzero(table[:, 0] > 0)[0]), 1:]
    return first[: pivot.size], first[pivot.size :]


def _centred(xtx: np.ndarray, xty: np.ndarray, yy: np.ndarray, n, pivots) -> Centred:
    """The sums of x = [s - p, 1] and y - q (X'X, X'Y, y^2; ``pivots`` = (p, q)) centred
    on the means of s and y."""
    n = float(n)
    sum_x, sum_y = xtx[:-1, -1], xty[-1]
    mean_x, mean_y = sum_x / max(n, 1.0), sum_y / max(n, 1.0)
    return Centred(
        mean_x + pivots[0],
        mean_y + pivots[1],
        xtx[:-1, :-1] - np.outer(sum_x, mean_x),
        xty[:-1] - np.outer(sum_x, mean_y),
        yy - sum_y * mean_y,
        n,
    )


def _residual_sums(w: np.ndarray, bias: np.ndarray, c: Centred) -> np.ndarray:
    """[k] sum over steps of (y_j - s w_j - bias_j)^2, from the centred sums: the spread
    about the fitted line through the means, plus n times the offset of ``bias`` from it."""
    offset = c.mean_y - c.mean_x @ w - bias
    spread = c.syy - 2 * np.sum(w * c.sxy, axis=0) + np.einsum("ik,ij,jk->k", w, c.sxx, w)
    return np.maximum(spread + c.n * offset * offset, 0.0)
