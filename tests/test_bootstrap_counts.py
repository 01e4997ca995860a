"""``ope_cli.estimation.bootstrap_counts``: the kernel's bootstrap counts, drawn apart in fixed
chunks."""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from ope_cli.estimation.bootstrap_counts import REPLICATE_CHUNK, replicate_counts
from ope_cli.estimation.estimators.reduction import poisson_counts


@pytest.mark.parametrize("episodes", [0, 1, REPLICATE_CHUNK, REPLICATE_CHUNK + 3])
def test_replicate_counts_equal_the_in_kernel_draw(episodes):
    """The kernel's bootstrap counts, drawn apart in fixed chunks, are poisson_counts of the
    same episode keys and seed: chunking and padding change none of them."""
    rng = np.random.default_rng(episodes)
    key_hi, key_lo = (rng.integers(0, 2**32, episodes, dtype=np.uint32) for _ in range(2))
    seed = jnp.asarray(7, jnp.uint32)
    counts = replicate_counts(key_hi, key_lo, seed, 50)
    assert counts.shape == (episodes, 50) and counts.dtype == np.uint8
    if episodes:
        expected = np.asarray(poisson_counts(jnp.asarray(key_hi), jnp.asarray(key_lo), seed, 50))
        np.testing.assert_array_equal(counts, expected)
        assert counts.mean() == pytest.approx(1.0, abs=0.1)  # Poisson(1)
    assert replicate_counts(key_hi, key_lo, seed, 0).shape == (episodes, 0)
