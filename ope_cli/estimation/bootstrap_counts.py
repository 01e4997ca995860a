"""Bootstrap counts drawn apart from the kernel: Poisson(1) counts of each episode in each
replicate, from its id key and the seed (``estimators.reduction.poisson_counts``), drawn by one
function compiled once per process instead of inside every batch shape's kernel."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from ope_cli.estimation.estimators.reduction import poisson_counts
from ope_cli.estimation.kernel_cache import COMPILER_OPTIONS

REPLICATE_CHUNK = 256  # episodes per call of the bootstrap-count function


@functools.partial(jax.jit, static_argnames=("num_replicates",), compiler_options=COMPILER_OPTIONS)
def _replicate_counts_chunk(key_hi, key_lo, seed, *, num_replicates):
    """[REPLICATE_CHUNK, R] uint8 ``poisson_counts`` (at most 21: a byte holds them)."""
    return poisson_counts(key_hi, key_lo, seed, num_replicates).astype(jnp.uint8)


def replicate_counts(
    key_hi: np.ndarray, key_lo: np.ndarray, seed: jax.Array, num_replicates: int
) -> np.ndarray:
    """[B, R] uint8 Poisson(1) bootstrap counts of a batch's episodes (``poisson_counts``
    of their id keys [B]), drawn REPLICATE_CHUNK episodes per call of one function.

    Drawing them costs a third of the kernel's compilation (the random number generator),
    yet they depend on the episode ids alone: drawn apart, they compile once per process
    (or come from the persistent cache) instead of once per batch shape."""
    size = key_hi.shape[0]
    if size == 0 or num_replicates == 0:
        return np.zeros((size, num_replicates), np.uint8)
    padded = -(-size // REPLICATE_CHUNK) * REPLICATE_CHUNK
    keys = np.zeros((2, padded), np.uint32)
    keys[0, :size], keys[1, :size] = key_hi, key_lo
    parts = [
        _replicate_counts_chunk(
            keys[0, start : start + REPLICATE_CHUNK],
            keys[1, start : start + REPLICATE_CHUNK],
            seed,
            num_replicates=num_replicates,
        )
        for start in range(0, padded, REPLICATE_CHUNK)
    ]
    return np.concatenate([np.asarray(part) for part in parts])[:size]
