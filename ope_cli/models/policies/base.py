"""The policy record: what every policy (checkpoint, entry point, logged) becomes."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Callable
from typing import Any

import numpy as np

LogProbFn = Callable[[Any, Any, Any], Any]
SampleFn = Callable[[Any, Any, Any], Any]  # (params, key, observation) -> one action
LogitsFn = Callable[[Any, Any], Any]  # (params, observation) -> [n_actions] logits
LOGGED = "logged target probabilities"


def digest_arrays(digest, arrays) -> Any:
    """``digest`` (a hashlib object) updated with ``arrays`` {name: array}, by name: each
    one's name, dtype, shape and values, so that arrays saved twice (a zip archive records
    when it was written) digest alike; returns ``digest``."""
    for name, values in sorted(arrays.items()):
        values = np.ascontiguousarray(values)
        digest.update(repr((name, values.dtype.str, values.shape)).encode())
        digest.update(values.tobytes())
    return digest


@dataclasses.dataclass(frozen=True)
class Policy:
    """One evaluation policy.

    Attributes:
      name: as given on the command line (the report's ``policy`` field): the path or
        entry point, or NAME of ``--policy NAME=PATH``.
      kind: checkpoint kind, ``entry_point`` or ``logged``.
      params: dict of parameter arrays (checkpoints), else None.
      static: hashable settings that select the function (e.g. the MLP activation).
      log_prob: per-step ``(params, observation, action) -> log pi(a|s)``; None for logged.
      discrete: whether the policy is over integer actions (None: unknown, entry points).
      n_actions, n_states, obs_dim, act_dim: sizes to check the data against (None: unknown).
      actions_checked: False when nothing bounds the logged discrete actions this policy is
        given (an entry point that declares no ``n_actions``): JAX's gather clamps an index
        out of range instead of failing, so the report says they are unchecked.
      folds: 1, or the K folds of a cross-fitted behavior model (params [K, ...]).
      sample: per-step ``(params, key, observation) -> action`` drawing from the policy
        (continuous policies that can sample: ``linear_gaussian``, entry points with a
        ``sample(key, observation)`` method); None when it cannot.
      logits: per-step ``(params, observation) -> [n_actions]`` logits whose log-softmax is
        ``log_prob`` (the softmax checkpoints), so that pi(a|s) of every action (V-hat's)
        shares the log-probabilities' exponentials; None for the other policies.
    """

    name: str
    kind: str
    params: dict[str, np.ndarray] | None
    static: tuple
    log_prob: LogProbFn | None
    discrete: bool | None = None
    n_actions: int | None = None
    n_states: int | None = None
    obs_dim: int | None = None
    act_dim: int | None = None
    actions_checked: bool = True
    # cross-fitted (a behavior model of --behavior-cross-fit K): every params array has a
    # leading [folds] axis, and an episode uses the fold ids.fold_index gives its key
    folds: int = 1
    sample: SampleFn | None = None
    logits: LogitsFn | None = None
    # what tables and figures call it: NAME of --policy NAME=PATH, else the shortest
    # unambiguous suffix of its path among the run's policies (policies.label_policies)
    label: str | None = None
    # the checkpoint path or entry point it was loaded from, when ``name`` is a NAME given
    # with --policy NAME=PATH (None: ``name`` is the path itself)
    source: str | None = None

    def fingerprint(self) -> str | None:
        """sha256 (hex) of what the policy computes with: its kind, static settings and
        parameter arrays (names, dtypes, shapes, values); None without parameters (entry
        points, logged targets). The same checkpoint saved twice has one fingerprint,
        where the files' bytes differ (a zip archive records when it was written)."""
        if self.params is None:
            return None
        digest = hashlib.sha256(repr((self.kind, self.static)).encode())
        return digest_arrays(digest, self.params).hexdigest()

    @property
    def stack_key(self) -> tuple:
        """Policies with equal keys run as one vmapped, stacked kernel."""
        if self.params is None:
            return (self.kind, self.name)
        shapes = tuple((k, v.shape, v.dtype.str) for k, v in sorted(self.params.items()))
        return (self.kind, self.static, shapes)


def logged_policy() -> Policy:
    """The evaluation policy whose probabilities are logged in the data."""
    return Policy(LOGGED, "logged", None, (), None)
