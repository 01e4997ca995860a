"""``linear``: LSTDQ, the fixed point of the projected Bellman equation in closed form.

Features phi(s, a): one block of x = [s - p, 1] per action (dimension D = A (d + 1); p the
pivot, the first steps' mean, so that the sums keep a feature of 1e8 +- 1's spread), the
block of a holding x; phibar(s') = sum_b pi_e(b|s') phi(s', b), 0 after the last step.
Per fold of episodes the sums stream in (flat memory, O(folds * D^2)):

  A = sum phi (phi - gamma phibar')^T,  b = sum phi r,
  C = sum psi psi^T, e = sum psi r, sum r^2 (psi = phi - gamma phibar': the residuals),
  the sums of phibar(s_0) and phibar(s_0) phibar(s_0)^T over initial states (dm),

and the fit solves (A + ridge P) w = b over every fold but one, in standardised features:
with the steps' mean m and spread v of each observation feature (sums of x and x^2 stream
in too), x~ = T x = [(s - m) / v, 1], so A~ = M A M^T, b~ = M b (M = I_A (x) T) and w =
M^T w~. The default ridge is ``RIDGE_PER_STEP`` times the number of steps fitted on: A~
grows with the steps, so this is a fixed, tiny relative regularisation whatever the
features' offsets and units (on raw features a reading of 10,000 +- 1 shrank the slopes
from 1 to 0.005). P penalises the slopes, not the intercept of a logged action, which a
reward offset makes large (``_penalized``); the intercepts of actions never logged are
penalised, which sets their weights to 0 (their rows of A are empty), as the tabular
model does.
"""

from __future__ import annotations

import numpy as np

from ope_cli.errors import DataError, UsageError
from ope_cli.models.behavior_models.base import Gather, features, largest, summed, usable_spread
from ope_cli.models.behavior_models.softmax import MEMORY_ENV, memory_budget
from ope_cli.models.q_models.base import FoldSums, InitialValues, Transitions

RIDGE_PER_STEP = 1e-6
ROWS = 2048  # steps per block of the feature matrices ([ROWS, D] each)
_SUMS = ("a_mat", "c_mat", "b", "e", "rr", "n", "s0", "s00", "n0", "sx", "sxx", "taken", "mass")


def mean_features(x: np.ndarray, probs: np.ndarray) -> np.ndarray:
    """[N, A (d + 1)] phibar(s) = sum_a pi(a|s) phi(s, a): x [N, d + 1], probs [N, A]."""
    return (probs[:, :, None] * x[:, None, :]).reshape(x.shape[0], probs.shape[1] * x.shape[1])


def with_bias(observation: np.ndarray) -> np.ndarray:
    """[N, d + 1] x = [s, 1] of observations [N] or [N, d]."""
    x = features(observation)
    return np.concatenate([x, np.ones((x.shape[0], 1))], axis=1)


class LinearQ(FoldSums):
    """LSTDQ sums per fold (K folds, D features): a_mat, c_mat, s00 [K, D, D]; b, e, s0
    [K, D]; rr, n, n0 [K]."""

    name = "linear"
    discrete = True

    def __init__(
        self,
        folds: int,
        gamma: float,
        n_actions: int,
        ridge: float | None = None,
        budget: int | None = None,
    ):
        self.folds, self.gamma, self.n_actions, self.ridge = folds, gamma, n_actions, ridge
        self.budget = memory_budget() if budget is None else budget
        self.dim = 0  # d + 1, set by the first steps
        self.pivot = np.zeros(0)  # [d] the sums' origin: x = [s - pivot, 1]
        self.last: dict = {}  # the last fit's ridge
        # the first episode's phibar(s_0) [D] (None: none yet), and whether another's differs:
        # V(s_0) is then not one value, whatever its sums of squares cancel to
        self.first_start: np.ndarray | None = None
        self.starts_vary = False

    def _start(self, width: int, pivot: np.ndarray) -> None:
        if self.dim == 0:
            size = self.n_actions * width
            # three [D, D] sums per fold, and the solve's copies: 256 features and 1,000
            # actions asked numpy for 492 GiB (an internal error)
            if (3 * self.folds + 2) * size * size * 8 > self.budget:
                raise UsageError(
                    f"the linear Q model keeps {size:,} x {size:,} sums per fold ({width} "
                    f"features for each of {self.n_actions} actions), more than "
                    f"{self.budget / 2**30:.3g} GiB ({MEMORY_ENV} raises the budget); fit the "
                    "mlp model instead (--q fit:mlp, or ope fit-q --model mlp)"
                )
            self.dim, self.pivot = width, pivot
            for name in _SUMS:
                shape = {"a_mat": 2, "c_mat": 2, "s00": 2, "b": 1, "e": 1, "s0": 1}.get(name, 0)
                sizes = (width,) if name in ("sx", "sxx") else (size,) * shape
                if name in ("taken", "mass"):  # per action: steps taking it, pi_e's mass
                    sizes = (self.n_actions,)
                setattr(self, name, np.zeros((self.folds, *sizes)))
        elif width != self.dim:
            raise DataError("observations change size between steps")

    def add(self, batch: Transitions) -> None:
        """Adds the sums of ``batch`` (with ``probs`` [N, A]) about the pivot (the first
        steps' mean: summed raw, a feature of 1e8 +- 1 lost its spread to rounding, and the
        fit then moved with the files, batches and processes). The steps go in (fold,
        action) order: a fold's steps are one slice, and phi(s, a) is x in the block of a,
        so A's and b's rows of a are sums over a's steps of x [d + 1] (a quarter of a
        [D, D] product with four actions)."""
        observation = features(batch.observation)
        width = observation.shape[1] + 1
        self._start(width, observation.mean(axis=0) if self.dim == 0 else self.pivot)
        actions = self.n_actions
        key = batch.fold * actions + batch.action
        groups = np.bincount(key, minlength=self.folds * actions)
        self.taken += groups.reshape(-1, actions)
        for a in range(actions):
            self.mass[:, a] += np.bincount(batch.fold, batch.probs[:, a], self.folds)
        x = with_bias(observation - self.pivot)
        x_next, probs_next = batch.next_of(x), batch.next_of(batch.probs)  # 0 where done
        order = np.argsort(key, kind="stable")
        # np.take, not x[order]: NumPy gathers the rows of a 2-d array 3-6x faster so
        x, x_next, probs_next = (np.take(v, order, axis=0) for v in (x, x_next, probs_next))
        reward, first = batch.reward[order], batch.first[order]
        bounds = np.concatenate([[0], np.cumsum(groups)])  # [folds * A + 1]
        for group in np.flatnonzero(groups):  # the (fold, action) pairs with steps here
            k, a = divmod(int(group), actions)
            for start in range(bounds[group], bounds[group + 1], ROWS):  # blocks, not steps
                rows = slice(start, min(start + ROWS, bounds[group + 1]))
                self._add_block(k, a, x[rows], x_next[rows], probs_next[rows], reward[rows])
        for k in range(self.folds):
            mine = slice(bounds[k * actions], bounds[(k + 1) * actions])
            xs, rs = x[mine], reward[mine]
            self.sx[k] += xs.sum(axis=0)
            self.sxx[k] += np.einsum("ij,ij->j", xs, xs)
            self.rr[k] += rs @ rs
            self.n[k] += rs.size
            # phibar(s_0) of the fold's initial states only
            starts = mine.start + np.flatnonzero(first[mine])
            start = mean_features(x[starts], np.take(batch.probs, order[starts], axis=0))
            self._note_starts(start)
            self.s0[k] += start.sum(axis=0)
            self.s00[k] += start.T @ start
            self.n0[k] += start.shape[0]

    def _note_starts(self, start: np.ndarray) -> None:
        """Keeps the first phibar(s_0) of ``start`` [m, D] and whether any other differs."""
        if start.shape[0] == 0:
            return
        if self.first_start is None:
            self.first_start = start[0].copy()
        self.starts_vary = self.starts_vary or bool((start != self.first_start).any())

    def _add_block(self, k: int, a: int, x, x_next, probs_next, reward) -> None:
        """The sums of fold ``k``'s steps ``x`` [n, d + 1] that took action ``a``: psi =
        phi(s, a) - gamma phibar(s') [n, D] their residual features."""
        psi = mean_features(x_next, probs_next)
        psi *= -self.gamma
        block = slice(a * self.dim, (a + 1) * self.dim)
        psi[:, block] += x  # + phi(s, a): x in the action's block, no [n, D] of zeros
        self.c_mat[k] += psi.T @ psi
        self.e[k] += psi.T @ reward
        self.a_mat[k][block] += x.T @ psi
        self.b[k][block] += x.T @ reward

    def gather_processes(self, gather: Gather) -> None:
        """Every process's sums, summed about the first pivot of a process with steps (a
        process without steps adds zeros)."""
        (width,) = largest(gather, (self.dim,))
        if width == 0:
            return  # no process has a step: fit() says so
        mine = self.pivot if self.dim else np.full(width - 1, np.nan)
        pivots = gather(mine[None])  # [processes, d]
        common = pivots[np.flatnonzero(np.isfinite(pivots).all(axis=1))[0]]
        self._start(width, common)
        self._move_pivot(common)
        for name in _SUMS:
            setattr(self, name, summed(gather, getattr(self, name)))
        # every process's first phibar(s_0), moved to the common pivot: V(s_0) is one value
        # only where none varies and they agree (rounding of the move counts as a difference)
        size = self.n_actions * width
        first = self.first_start if self.first_start is not None else np.full(size, np.nan)
        firsts = gather(first[None])  # [processes, D]
        firsts = firsts[np.isfinite(firsts).all(axis=1)]
        varies = gather(np.array([[int(self.starts_vary)]], np.int64))
        self.starts_vary = bool(varies.any()) or bool((firsts != firsts[:1]).any())
        self.first_start = firsts[0] if firsts.shape[0] else None

    def _move_pivot(self, pivot: np.ndarray) -> None:
        """The sums about ``pivot`` instead: x' = P x, P = [[I, old - new], [0, 1]]; every
        sum is linear or quadratic in the features of each action's block."""
        shift = self.pivot - pivot
        move = np.eye(self.dim)
        move[:-1, -1] = shift
        blocks = np.kron(np.eye(self.n_actions), move)
        for name in ("a_mat", "c_mat", "s00"):
            setattr(self, name, blocks @ getattr(self, name) @ blocks.T)
        for name in ("b", "e", "s0"):
            setattr(self, name, getattr(self, name) @ blocks.T)
        if self.first_start is not None:
            self.first_start = blocks @ self.first_start
        steps = self.sx[:, -1:]  # sum of the bias feature: the steps
        self.sxx[:, :-1] += 2 * shift * self.sx[:, :-1] + steps * shift**2
        self.sx = self.sx @ move.T
        self.pivot = pivot

    def fit(self, exclude: int | None = None) -> dict[str, np.ndarray]:
        """{"weight": [d, A], "bias": [A]}: w = (A + ridge P)^-1 b of every fold but
        ``exclude``."""
        steps = float(self._pooled("n", exclude)) if self.dim else 0.0
        if steps == 0:
            raise DataError("no steps to fit the linear Q model on")
        ridge = RIDGE_PER_STEP * steps if self.ridge is None else self.ridge
        to_standard = np.kron(np.eye(self.n_actions), self._standardizer(exclude))  # M
        raw = self._pooled("a_mat", exclude)
        a_mat = to_standard @ raw @ to_standard.T
        b = to_standard @ self._pooled("b", exclude)
        penalty = self._penalized(raw)
        try:
            w = to_standard.T @ np.linalg.solve(a_mat + ridge * np.diag(penalty), b)
        except np.linalg.LinAlgError:
            w = np.full(a_mat.shape[0], np.nan)
        if not np.isfinite(w).all():
            raise DataError(
                f"the LSTDQ system is singular (ridge {ridge:g}, on the slopes: not on a logged "
                "action's intercept); use --gamma < 1, or raise --ridge"
            )
        self.last = {"ridge": ridge}
        blocks = w.reshape(self.n_actions, self.dim)  # [A, d + 1] about the pivot
        weight = blocks[:, :-1].T.copy()
        return {"weight": weight, "bias": blocks[:, -1] - self.pivot @ weight}

    def _penalized(self, a_mat: np.ndarray) -> np.ndarray:
        """[A (d + 1)] 1 where the ridge applies: every slope, and the intercept of an action
        never logged (its rows of A are empty: its weights are then 0). Not a logged
        action's intercept: a reward offset makes it large, and the ridge shrank it (rewards
        of 1e6 + noise on one-step episodes: dm 3.0 below the LSTDQ's, bellman_rmse 3.0
        against 0.0098)."""
        penalty = np.ones(a_mat.shape[0])
        logged = np.any(a_mat.reshape(self.n_actions, -1) != 0, axis=1)  # [A] rows of a
        penalty[self.dim - 1 :: self.dim] = ~logged
        return penalty

    def unlogged_share(self, exclude: int | None = None) -> float:
        """The mean over every step of pi_e's probability of the actions the folds but
        ``exclude`` never logged: their weights are 0, and so is their Q-hat."""
        if self.dim == 0:
            return 0.0
        unlogged = self._pooled("taken", exclude) == 0
        return float(self._pooled("mass", None)[unlogged].sum() / max(self.n.sum(), 1.0))

    def _about_pivot(self, arrays: dict[str, np.ndarray]) -> np.ndarray:
        """[A (d + 1)] w of linear_q ``arrays`` (raw features) for features about the pivot."""
        moved = {**arrays, "bias": arrays["bias"] + self.pivot @ arrays["weight"]}
        return self.flat(moved)

    def _standardizer(self, exclude: int | None) -> np.ndarray:
        """[d + 1, d + 1] T: [s, 1] -> [(s - m) / v, 1], m and v the mean and spread of each
        observation feature over the steps fitted on (a constant feature's spread 1)."""
        n = float(self._pooled("n", exclude))
        mean = self._pooled("sx", exclude)[:-1] / n
        spread = np.sqrt(np.maximum(self._pooled("sxx", exclude)[:-1] / n - mean**2, 0.0))
        scale = 1.0 / usable_spread(spread, mean)
        transform = np.eye(self.dim)
        transform[:-1, :-1] = np.diag(scale)
        transform[:-1, -1] = -mean * scale
        return transform

    @staticmethod
    def flat(arrays: dict[str, np.ndarray]) -> np.ndarray:
        """[A (d + 1)] w of linear_q arrays (weight [d, A], bias [A])."""
        return np.concatenate([arrays["weight"], arrays["bias"][None]], axis=0).T.reshape(-1)

    def residual(self, arrays: dict[str, np.ndarray], fold: int | None = None):
        """(sum over steps of (r - psi^T w)^2, steps) from the sums."""
        return max(float(sum(self._residual_parts(arrays, fold))), 0.0), int(self._fold("n", fold))

    def residual_magnitude(self, arrays: dict[str, np.ndarray], fold: int | None = None):
        """The size of the parts ``residual`` adds up: its rounding error is float64's
        epsilon times about this (rewards of 1e6 + noise: parts of 1e15, and a sum of
        0.3 that came out 0.0)."""
        return float(sum(abs(part) for part in self._residual_parts(arrays, fold)))

    def _residual_parts(self, arrays, fold) -> tuple[float, float, float]:
        """sum r^2, -2 w^T e, w^T C w: their sum is the sum of squared residuals."""
        w = self._about_pivot(arrays)
        return (
            float(self._fold("rr", fold)),
            float(-2 * w @ self._fold("e", fold)),
            float(w @ self._fold("c_mat", fold) @ w),
        )

    def initial_centred(self, arrays: dict[str, np.ndarray], fold: int | None = None):
        """InitialValues of raw sums (pivot 0: the sums keep phibar(s_0) phibar(s_0)^T, not
        V(s_0) itself), saying whether V(s_0) varies."""
        total, total_sq, count = self.initial(arrays, fold)
        return InitialValues(0.0, total, total_sq, count, self.starts_vary)

    def initial(self, arrays: dict[str, np.ndarray], fold: int | None = None):
        """(sum of V(s_0), sum of V(s_0)^2, episodes) with V(s_0) = phibar(s_0)^T w."""
        w = self._about_pivot(arrays)
        return (
            float(self._fold("s0", fold) @ w),
            float(w @ self._fold("s00", fold) @ w),
            int(self._fold("n0", fold)),
        )
