"""``tabular``: counts of logged actions per integer state, per fold of episodes.

pi(a|s) = (n(s, a) + alpha) / (n(s) + alpha * A), additive (Laplace) smoothing with
``alpha = SMOOTHING`` pseudo-counts per action: a state never visited gets the uniform
law, and no logged action gets probability 0. Memory: [folds, states, actions] int64
counts, whatever the data's size (streaming, flat memory).
"""

from __future__ import annotations

import numpy as np

from ope_cli.errors import DataError, UsageError
from ope_cli.models.behavior_models.base import Gather, largest, summed
from ope_cli.models.behavior_models.softmax import MEMORY_ENV, memory_budget

SMOOTHING = 0.5  # pseudo-count per action (Krichevsky-Trofimov / Jeffreys prior)


class TabularModel:
    """Counts [K, S, A] of logged (state, action) pairs per fold; S and A grow with the
    largest state and action seen."""

    name = "tabular"
    stopped_short = None  # closed form: no iterations to stop short

    def __init__(self, folds: int = 1, smoothing: float = SMOOTHING):
        self.smoothing = smoothing
        self.counts = np.zeros((folds, 0, 0), np.int64)

    def add(self, observation: np.ndarray, action: np.ndarray, fold: np.ndarray) -> None:
        """Counts steps: observation [N] int states, action [N] int, fold [N] int."""
        if observation.size == 0:
            return
        if observation.min() < 0 or action.min() < 0:
            raise DataError("the tabular behavior model needs non-negative states and actions")
        folds, states, actions = self.counts.shape
        states = max(states, int(observation.max()) + 1)
        actions = max(actions, int(action.max()) + 1)
        self._grow(states, actions)
        cell = (fold * states + observation) * actions + action
        self.counts += np.bincount(cell, minlength=self.counts.size).reshape(self.counts.shape)

    def _grow(self, states: int, actions: int) -> None:
        folds = self.counts.shape[0]
        if (states, actions) != self.counts.shape[1:]:  # a table held is within the budget
            needed, budget = 8 * folds * states * actions, memory_budget()
            if needed > budget:  # a sparse state id of 2e9 was a MemoryError, "a bug"
                raise UsageError(
                    f"the tabular behavior model counts every action of every state up to "
                    f"the largest state, {states - 1:,}: {folds} table(s), one per fold of "
                    "episodes (fit-behavior's five, for its held-out fifth; "
                    f"--behavior-cross-fit's) x {states:,} states "
                    f"x {actions:,} actions need {needed / 2**30:.3g} GiB, more than "
                    f"{budget / 2**30:.3g} GiB ({MEMORY_ENV} raises the budget); number the "
                    "states 0, 1, ... or use linear_softmax"
                )
            grown = np.zeros((folds, states, actions), np.int64)
            grown[:, : self.counts.shape[1], : self.counts.shape[2]] = self.counts
            self.counts = grown

    def gather_processes(self, gather: Gather) -> None:
        """Every process's counts, summed (grown first to the largest state and action)."""
        self._grow(*largest(gather, self.counts.shape[1:]))
        self.counts = summed(gather, self.counts)

    def _pooled(self, exclude: int | None) -> np.ndarray:
        total = self.counts.sum(axis=0)
        return total if exclude is None else total - self.counts[exclude]

    def fit(self, exclude: int | None = None) -> dict[str, np.ndarray]:
        """{"logits": [S, A] log pi(a|s)} from the counts of every fold but ``exclude``."""
        counts = self._pooled(exclude) + self.smoothing
        return {"logits": np.log(counts / counts.sum(axis=1, keepdims=True))}

    def _fold_counts(self, fold: int | None) -> np.ndarray:
        return self.counts.sum(axis=0) if fold is None else self.counts[fold]

    def log_likelihood(
        self, arrays: dict[str, np.ndarray], fold: int | None = None
    ) -> tuple[float, int]:
        counts = self._fold_counts(fold)
        log_pi = arrays["logits"] - np.log(np.exp(arrays["logits"]).sum(axis=1, keepdims=True))
        return float(np.sum(counts * log_pi)), int(counts.sum())

    def floored(self, arrays: dict[str, np.ndarray], fold: int | None, floor: float) -> int:
        counts = self._fold_counts(fold)
        probs = np.exp(arrays["logits"])
        probs = probs / probs.sum(axis=1, keepdims=True)
        return int(counts[probs < floor].sum())
