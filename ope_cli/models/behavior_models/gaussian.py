"""``linear_gaussian``: least squares for the mean action, residual spread for ``log_std``.

Per fold of episodes, the normal equations are accumulated as steps stream in (x = [s, 1]):
X'X [d+1, d+1], X'Y [d+1, k], the per-dimension sums of y^2 [k] and the step count; the
fit solves (X'X) W = X'Y and sets std_j = sqrt(RSS_j / n) (maximum likelihood). Memory is
flat: O(folds * d * (d + k)), whatever the data's size.
"""

from __future__ import annotations

import math

import numpy as np

from ope_cli.errors import DataError
from ope_cli.models.behavior_models.base import Gather, features, largest, summed

RIDGE = 1e-10  # relative to the mean diagonal of X'X: only guards an exactly singular system
MIN_VARIANCE = 1e-12


class LinearGaussianModel:
    """Normal equations per fold: xtx [K, d+1, d+1], xty [K, d+1, k], yy [K, k], n [K]."""

    name = "linear_gaussian"

    def __init__(self, folds: int = 1):
        self.folds = folds
        self.xtx = self.xty = self.yy = None
        self.n = np.zeros(folds, np.int64)

    def add(self, observation: np.ndarray, action: np.ndarray, fold: np.ndarray) -> None:
        """Accumulates steps: observation [N] or [N, d], action [N] or [N, k], fold [N]."""
        x = features(observation)
        x = np.concatenate([x, np.ones((x.shape[0], 1))], axis=1)
        y = features(action)
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
        if self.xtx is None:
            self.xtx, self.xty = np.zeros((self.folds, d, d)), np.zeros((self.folds, d, k))
            self.yy = np.zeros((self.folds, k))
        self.xtx, self.xty = summed(gather, self.xtx), summed(gather, self.xty)
        self.yy, self.n = summed(gather, self.yy), summed(gather, self.n)

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
        ridge = RIDGE * max(float(np.trace(xtx)) / xtx.shape[0], 1.0)
        w = np.linalg.solve(xtx + ridge * np.eye(xtx.shape[0]), xty)
        rss = _residual_sums(w, xtx, xty, yy)
        variance = np.maximum(rss / n, MIN_VARIANCE)
        return {"weight": w[:-1], "bias": w[-1], "log_std": 0.5 * np.log(variance)}

    def log_likelihood(
        self, arrays: dict[str, np.ndarray], fold: int | None = None
    ) -> tuple[float, int]:
        """Sum of the diagonal Gaussian log-densities over one fold's steps (None: all)."""
        if fold is None:
            xtx, xty, yy, n = self._pooled(None)
        else:
            xtx, xty, yy, n = self.xtx[fold], self.xty[fold], self.yy[fold], self.n[fold]
        w = np.concatenate([arrays["weight"], arrays["bias"][None]], axis=0)
        rss = _residual_sums(w, xtx, xty, yy)
        log_std = arrays["log_std"]
        total = -0.5 * rss * np.exp(-2 * log_std) - n * (log_std + 0.5 * math.log(2 * math.pi))
        return float(total.sum()), int(n)

    def floored(self, arrays: dict[str, np.ndarray], fold: int | None, floor: float) -> int:
        """Densities are not probabilities: the floor does not apply (0)."""
        return 0


def _residual_sums(w: np.ndarray, xtx: np.ndarray, xty: np.ndarray, yy: np.ndarray) -> np.ndarray:
    """[k] sum over steps of (y_j - x w_j)^2 from the normal-equation sums."""
    return np.maximum(yy - 2 * np.sum(w * xty, axis=0) + np.einsum("ik,ij,jk->k", w, xtx, w), 0.0)
