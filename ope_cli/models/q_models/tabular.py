"""``tabular``: the empirical MDP of the logged transitions, solved exactly for pi_e.

Per fold of episodes, streamed counts: n(s, a, s') and the reward sums r(s, a, s') of the
transitions to s', the terminal counts and reward sums (the episode's last step), the sums
of r^2 per (s, a), and the count of initial states. The fit pools the folds but one and
solves V = r_pi + gamma P_pi V (an S x S dense system, equivalent to the S*A system
Q = rbar + gamma P pi Q), then Q = rbar + gamma P V; a pair (s, a) never logged has
rbar = 0 and P = 0, so Q = 0 there. Memory: O(folds * S^2 * A), whatever the data's size,
checked against ``OPE_FIT_MEMORY_GB``.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from ope_cli.errors import DataError, UsageError
from ope_cli.models.behavior_models.base import Gather, largest, summed
from ope_cli.models.behavior_models.softmax import MEMORY_ENV, memory_budget
from ope_cli.models.q_models.base import FoldSums, Transitions, centred

StateProbs = Callable[[int, int], np.ndarray]  # (n_states, n_actions) -> [S, A] pi_e(a|s)


class TabularQ(FoldSums):
    """Counts per fold: trans/rsum [K, S, A, S], term/rterm/rr [K, S, A], init [K, S]."""

    name = "tabular"
    discrete = True

    def __init__(
        self,
        folds: int,
        gamma: float,
        state_probs: StateProbs,
        n_actions: int | None = None,
        n_states: int | None = None,
        budget: int | None = None,
    ):
        self.folds, self.gamma, self.state_probs = folds, gamma, state_probs
        self.budget = memory_budget() if budget is None else budget
        self.trans = np.zeros((folds, 0, 0, 0))
        self.rsum = np.zeros((folds, 0, 0, 0))
        self.term = np.zeros((folds, 0, 0))
        self.rterm = np.zeros((folds, 0, 0))
        self.rr = np.zeros((folds, 0, 0))
        self.init = np.zeros((folds, 0))
        self._grow(n_states or 0, n_actions or 0)

    def _grow(self, states: int, actions: int) -> None:
        states, actions = max(states, self.init.shape[1]), max(actions, self.term.shape[2])
        if (states, actions) == self.term.shape[1:]:
            return
        if 2 * self.folds * states * states * max(actions, 1) * 8 > self.budget:
            raise UsageError(
                f"--model tabular keeps {states}^2 x {actions} transition counts per fold, more "
                f"than {self.budget / 2**30:.3g} GiB ({MEMORY_ENV} raises the budget); use "
                "--model linear"
            )

        def grown(array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
            out = np.zeros((self.folds, *shape))
            out[tuple(slice(0, n) for n in array.shape)] = array
            return out

        self.trans = grown(self.trans, (states, actions, states))
        self.rsum = grown(self.rsum, (states, actions, states))
        self.term, self.rterm, self.rr = (
            grown(a, (states, actions)) for a in (self.term, self.rterm, self.rr)
        )
        self.init = grown(self.init, (states,))

    def add(self, batch: Transitions) -> None:
        """Counts transitions: observation [N] int states, action [N] int."""
        s, a, r = batch.observation, batch.action, batch.reward
        if s.size == 0:
            return
        if s.min() < 0 or a.min() < 0:
            raise DataError("the tabular Q model needs non-negative states and actions")
        self._grow(int(s.max()) + 1, int(a.max()) + 1)
        _, n_s, n_a = self.term.shape
        pair = (batch.fold * n_s + s) * n_a + a  # [N] cell of (fold, s, a)
        cells = self.term.size
        self.rr += np.bincount(pair, r * r, cells).reshape(self.rr.shape)
        done = batch.done
        self.term += np.bincount(pair[done], minlength=cells).reshape(self.term.shape)
        self.rterm += np.bincount(pair[done], r[done], cells).reshape(self.term.shape)
        going = ~done
        cell = pair[going] * n_s + s[batch.next_row[going]]
        self.trans += np.bincount(cell, minlength=self.trans.size).reshape(self.trans.shape)
        self.rsum += np.bincount(cell, r[going], self.trans.size).reshape(self.trans.shape)
        start = batch.fold[batch.first] * n_s + s[batch.first]
        self.init += np.bincount(start, minlength=self.init.size).reshape(self.init.shape)

    def gather_processes(self, gather: Gather) -> None:
        """Every process's counts, summed (grown first to the largest state and action)."""
        self._grow(*largest(gather, self.term.shape[1:]))
        for name in ("trans", "rsum", "term", "rterm", "rr", "init"):
            setattr(self, name, summed(gather, getattr(self, name)))

    def policy(self) -> np.ndarray:
        """[S, A] pi_e(a|s) over every state of the table."""
        return self.state_probs(*self.term.shape[1:])

    def fit(self, exclude: int | None = None) -> dict[str, np.ndarray]:
        """{"q": [S, A]}: the exact Q of pi_e in the empirical MDP of every fold but
        ``exclude``."""
        trans, term = self._pooled("trans", exclude), self._pooled("term", exclude)
        visits = trans.sum(axis=2) + term  # [S, A]
        if not visits.any():
            raise DataError("no steps to fit the tabular Q model on")
        safe = np.where(visits > 0, visits, 1.0)
        rbar = (self._pooled("rsum", exclude).sum(axis=2) + self._pooled("rterm", exclude)) / safe
        p = trans / safe[..., None]  # [S, A, S]
        pi = self.policy()
        p_pi = np.einsum("sa,sat->st", pi, p)
        r_pi = np.sum(pi * rbar, axis=1)
        system = np.eye(p_pi.shape[0]) - self.gamma * p_pi
        try:
            v = np.linalg.solve(system, r_pi)
        except np.linalg.LinAlgError:
            v = np.full_like(r_pi, np.nan)
        if not np.isfinite(v).all() or np.linalg.cond(system) > 1e12:
            raise DataError(
                f"the empirical MDP has no solution at gamma {self.gamma}: pi_e can loop "
                "forever among logged transitions that never end an episode; use --gamma < 1"
            )
        return {"q": rbar + self.gamma * p @ v}

    def unlogged_share(self, exclude: int | None = None) -> float:
        """The mean over every step's state of pi_e's probability of the actions never
        logged in that state by the folds but ``exclude``: their Q-hat is 0."""
        visits = self.trans.sum(axis=3) + self.term  # [K, S, A]
        trained = visits.sum(axis=0) - (0.0 if exclude is None else visits[exclude])
        states = visits.sum(axis=(0, 2))  # [S] steps in each state
        unlogged = np.sum(self.policy() * (trained <= 0), axis=1)  # [S]
        return float(states @ unlogged / max(states.sum(), 1.0))

    def _values(self, q: np.ndarray) -> np.ndarray:
        return np.sum(self.policy() * q, axis=1)

    def residual(self, arrays: dict[str, np.ndarray], fold: int | None = None):
        """(sum over steps of (r + gamma V(s') - Q(s, a))^2, steps) from the counts."""
        steps = self._fold("trans", fold).sum() + self._fold("term", fold).sum()
        return max(float(sum(self._residual_parts(arrays, fold))), 0.0), int(round(steps))

    def residual_magnitude(self, arrays: dict[str, np.ndarray], fold: int | None = None):
        """The size of the parts ``residual`` adds up (``LinearQ.residual_magnitude``)."""
        return float(sum(abs(part) for part in self._residual_parts(arrays, fold)))

    def _residual_parts(self, arrays, fold) -> tuple[float, float, float]:
        """sum r^2, the cross terms, the squares of Q - gamma V(s'): their sum is the sum of
        squared residuals."""
        q = arrays["q"]
        gap = q[:, :, None] - self.gamma * self._values(q)[None, None, :]  # Q - gamma V(s')
        trans, rsum = self._fold("trans", fold), self._fold("rsum", fold)
        term, rterm = self._fold("term", fold), self._fold("rterm", fold)
        return (
            float(self._fold("rr", fold).sum()),
            float(-2 * (np.sum(rsum * gap) + np.sum(rterm * q))),
            float(np.sum(trans * gap * gap) + np.sum(term * q * q)),
        )

    def initial_centred(self, arrays: dict[str, np.ndarray], fold: int | None = None):
        """InitialValues of one fold's episodes (counts of initial states), about the V of
        the first initial state."""
        v, init = self._values(arrays["q"]), self._fold("init", fold)
        return centred(v, init)
