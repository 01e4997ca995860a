"""The per-step fields of the data path, declared once (``Steps``), and ``map_arrays``,
the NumPy-only way to map over them. Episode chunks hold them flat ([N, ...]), padded
batches padded ([B, T, ...]); a new per-step field is one new line here."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np


class Steps(NamedTuple):
    """The per-step fields, declared once: flat [N, ...] in an EpisodeChunk, padded
    [B, T, ...] in a PaddedBatch. A field that was not read (no observation column, no
    logged target) is None; every function here maps over the fields that are present.

      observation: (index or scalar) or [..., obs_dim]; None when not read.
      action: int64 (discrete), float64 (scalar continuous) or [..., act_dim] float64.
      reward: float64; None when not read (``ope fit-behavior``, which fits actions only).
      log_behavior: float64 logged log pi_b(a|s), or None with a ``--behavior`` policy
        (the kernel computes it).
      log_target: float64 logged log pi_e(a|s), or None.
      q_value: float64 Q-hat(s, a) of the logged action from the user's critic
        (``--q-col``), or None.
      v_value: float64 V-hat(s) from the user's critic (``--v-col``), or None.
    """

    observation: np.ndarray | None
    action: np.ndarray
    reward: np.ndarray | None
    log_behavior: np.ndarray | None
    log_target: np.ndarray | None
    q_value: np.ndarray | None = None
    v_value: np.ndarray | None = None


STEP_FIELDS = Steps._fields


def map_arrays(fn: Callable[..., Any], first: Any, *rest: Any) -> Any:
    """``fn`` over the arrays of (nested) NamedTuples of the same structure, field by field;
    a None field stays None. The NumPy-only twin of ``jax.tree.map`` for these records."""
    if first is None:
        return None
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(map_arrays(fn, *parts) for parts in zip(first, *rest, strict=True)))
    return fn(first, *rest)


def step_field(record: Any, name: str) -> np.ndarray | None:
    """``record.steps.<name>`` for the per-step field ``name`` (``__getattr__`` helper)."""
    if name in STEP_FIELDS:
        return getattr(object.__getattribute__(record, "steps"), name)
    raise AttributeError(f"{type(record).__name__!r} object has no attribute {name!r}")
