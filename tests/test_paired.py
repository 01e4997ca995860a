"""Paired sums (ope_cli.choosing.paired): against per-episode NumPy differences, split into batches
in any way, and with weights whose logs are far beyond float64's range."""

from __future__ import annotations

import numpy as np
import pytest

from ope_cli.choosing import paired
from ope_cli.choosing.selection import paired_mean_difference
from ope_cli.estimation.estimators.importance import mean_and_sem

R = 7


def _batch(values_pb, scales_pb, counts_br, baseline, mask=None):
    mask = np.ones(values_pb.shape[1], bool) if mask is None else mask
    return paired.from_terms({"is": (values_pb, scales_pb)}, mask, counts_br, baseline)


def _random(rng, rows=4, n=50, spread=3.0):
    values = rng.normal(size=(rows, n))
    scales = rng.normal(scale=spread, size=(rows, n))
    scales[-1] = 0.0  # the behavior row is not scaled
    counts = rng.poisson(1.0, size=(n, R))
    return values, scales, counts


@pytest.mark.parametrize("baseline", [0, 3])
def test_difference_is_the_mean_of_per_episode_differences(baseline):
    rng = np.random.default_rng(0)
    values, scales, counts = _random(rng)
    sums = _batch(values, scales, counts, baseline)
    terms = values * np.exp(scales)  # [P+1, n] as plain numbers
    for k in range(4):
        delta, stderr = paired.difference(sums, "is", k, baseline, baseline)
        expected = paired_mean_difference(terms[k], terms[baseline])
        if k == baseline:
            assert delta == pytest.approx(0.0, abs=1e-12) and stderr == pytest.approx(0.0)
            continue
        assert delta == pytest.approx(expected[0], rel=1e-10)
        assert stderr == pytest.approx(expected[1], rel=1e-10)
    # the replicates' standard errors: each replicate's counts weigh the differences
    for k in range(4):
        d = terms[k] - terms[baseline]
        total, squares, n = counts.T @ d, counts.T @ (d * d), counts.sum(0)
        _, expected = mean_and_sem(total, squares, n, 0.0)
        got = paired.replicate_stderrs(sums, "is", k, baseline)
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-300)


def test_merging_batches_equals_one_batch():
    rng = np.random.default_rng(1)
    values, scales, counts = _random(rng, n=60)
    whole = _batch(values, scales, counts, 1)
    total = paired.init(("is",), 3, R)
    for part in np.array_split(rng.permutation(60), 5):
        mask = rng.random(part.size) < 0.9  # filler lanes in a batch are masked out
        one = _batch(values[:, part], scales[:, part], counts[part], 1, mask)
        total = paired.merge(total, one, 1)
        # the masked-out episodes again, in a batch of their own
        extra = _batch(values[:, part[~mask]], scales[:, part[~mask]], counts[part[~mask]], 1)
        total = paired.merge(total, extra, 1)
    for k in range(4):
        assert paired.difference(total, "is", k, 1, 1) == pytest.approx(
            paired.difference(whole, "is", k, 1, 1), rel=1e-10
        )
        np.testing.assert_allclose(
            paired.replicate_stderrs(total, "is", k, 1),
            paired.replicate_stderrs(whole, "is", k, 1),
            rtol=1e-9,
        )


def test_weights_beyond_float64_pair_exactly():
    """Terms of scale e^800 (overflowing as numbers): the difference of two policies whose
    weights are equally far out is what the same terms give at scale e^0, times e^800."""
    rng = np.random.default_rng(2)
    values, scales, counts = _random(rng, rows=3, n=40, spread=0.5)
    near = _batch(values, scales, counts, 0)
    far_scales = scales + np.array([[800.0], [800.0], [0.0]])
    far = _batch(values, far_scales, counts, 0)
    delta_near, stderr_near = paired.difference(near, "is", 1, 0, 0)
    assert far.log_scales["is"][0] > 790
    # e^800 overflows: the difference is not finite, so None, never inf
    assert paired.difference(far, "is", 1, 0, 0) == (None, None)
    shifted = far._replace(
        log_scales={"is": far.log_scales["is"] - np.array([800, 800, 0])},
        pair_log_scales={"is": far.pair_log_scales["is"] - 800},  # D_p = max(S_p, S_0)
    )
    delta, stderr = paired.difference(shifted, "is", 1, 0, 0)
    assert delta == pytest.approx(delta_near, rel=1e-10)
    assert stderr == pytest.approx(stderr_near, rel=1e-10)


def test_rows_of_puts_every_group_in_command_line_order():
    first = {"return": np.array([[5.0, 6.0]]), "is": np.array([[1.0, 2.0]])}
    first["is/scale"] = np.zeros((1, 2))
    second = {"return": np.array([[5.0, 6.0]] * 2), "is": np.array([[3.0, 4.0], [7.0, 8.0]])}
    second["is/scale"] = np.ones((2, 2))
    rows = paired.rows_of([([1], first), ([0, 2], second)], 3)
    values, scales = rows["is"]
    np.testing.assert_array_equal(values, [[3, 4], [1, 2], [7, 8], [5, 6]])
    np.testing.assert_array_equal(scales, [[1, 1], [0, 0], [1, 1], [0, 0]])


def test_close_policies_get_their_paired_standard_error_to_full_precision():
    """Consecutive checkpoints: terms near 100 (a bonus per step) that differ from the
    baseline's by 1e-10 of themselves. Sums of x and x^2 would lose every digit of the
    spread of the differences; the centred differences keep it, across merged batches."""
    rng = np.random.default_rng(5)
    n = 900
    base = 100.0 + rng.normal(size=n)
    values = np.stack(
        [base, base * (1 + 1e-10 * rng.normal(size=n)), base + 1e-3 * rng.normal(size=n)]
    )
    scales, counts = np.zeros_like(values), rng.poisson(1.0, size=(n, R))
    total = paired.init(("is",), 2, R)
    for part in np.array_split(np.arange(n), 4):
        total = paired.merge(total, _batch(values[:, part], scales[:, part], counts[part], 0), 0)
    for k in (1, 2):
        delta, stderr = paired.difference(total, "is", k, 0, 0)
        d = values[k] - values[0]  # what the per-episode differences are, as numbers
        assert delta == pytest.approx(d.mean(), rel=1e-9, abs=1e-18)
        assert stderr == pytest.approx(d.std(ddof=1) / np.sqrt(n), rel=1e-9)
        assert paired.difference(total, "is", 0, k, 0) == pytest.approx((-delta, stderr), rel=1e-12)


def test_pairs_without_the_baseline_follow_or_are_left_undefined():
    rng = np.random.default_rng(6)
    values, scales, counts = _random(rng, rows=4, n=70, spread=1.0)
    sums = _batch(values, scales, counts, 3)
    terms = values * np.exp(scales)
    for k, j in ((0, 1), (2, 0), (1, 2)):  # neither is the baseline's row (3)
        expected = paired_mean_difference(terms[k], terms[j])
        assert paired.difference(sums, "is", k, j, 3) == pytest.approx(expected, rel=1e-9)
    # two rows equal up to 1e-13 of themselves, far from the baseline: their spread is
    # below what the rounding of d_k - d_j resolves, so no standard error rather than noise
    values[1] = values[0] * (1 + 1e-13 * rng.normal(size=70))
    scales[1] = scales[0]
    sums = _batch(values, scales, counts, 3)
    delta, stderr = paired.difference(sums, "is", 1, 0, 3)
    assert stderr is None and abs(delta) < 1e-9


@pytest.mark.parametrize("case", ["scale", "spread"])
def test_a_pair_without_the_baseline_does_not_depend_on_the_baseline_row(case):
    """Without --baseline the differences are kept from the first policy's row; a
    could-be-best pair of two other policies must not lose its precision when that row's
    terms dwarf theirs (weights near e^40, or a heavy-tailed row of plain numbers)."""
    rng = np.random.default_rng(12)
    n = 1000
    values = np.stack([rng.normal(size=n), 1.0 + rng.normal(size=n), rng.normal(size=n)])
    scales = np.zeros_like(values)
    if case == "scale":
        scales[0] = rng.normal(scale=10, size=n)
    else:
        values[0] = rng.lognormal(0, 4, size=n)
        values[2] = values[1] - 0.05 + 1e-3 * rng.normal(size=n)
    values = np.concatenate([values, rng.normal(size=(1, n))])  # the behavior row
    scales = np.concatenate([scales, np.zeros((1, n))])
    sums = _batch(values, scales, rng.poisson(1.0, size=(n, R)), 0)
    terms = values * np.exp(scales)
    expected = paired_mean_difference(terms[1], terms[2])
    assert paired.difference(sums, "is", 1, 2, 0) == pytest.approx(expected, rel=1e-9)


def _merged(values, rng, baseline, parts=8):
    """The paired sums of ``values`` [P+1, n] (scale 0) merged from ``parts`` batches."""
    n = values.shape[1]
    total = paired.init(("is",), values.shape[0] - 1, R)
    for part in np.array_split(rng.permutation(n), parts):
        one = _batch(
            values[:, part],
            np.zeros((values.shape[0], part.size)),
            rng.poisson(1.0, size=(part.size, R)),
            baseline,
        )
        total = paired.merge(total, one, baseline)
    return total


def test_close_checkpoints_far_from_the_baseline_are_resolved():
    """Two checkpoints 1e-5 apart, far from the first policy's row (the differences' row
    without --baseline): their spread is 5e-11 of their own co-moments, which a threshold of
    1e-8 left undefined (a QA run: 100 such checkpoints all "could be the best", where 11
    could). The co-moments resolve it to 1e-5."""
    rng = np.random.default_rng(21)
    n = 20_000
    base = 3.0 + 10.0 * rng.normal(size=n)
    near = base * (1 + 1e-5 * rng.normal(size=n)) + 1e-5 * rng.normal(size=n)
    values = np.stack([50.0 * rng.normal(size=n), base, near, rng.normal(size=n)])
    total = _merged(values, rng, baseline=0)
    expected = paired_mean_difference(values[2], values[1])
    delta, stderr = paired.difference(total, "is", 2, 1, 0)
    assert stderr is not None
    assert delta == pytest.approx(expected[0], rel=1e-6)
    assert stderr == pytest.approx(expected[1], rel=1e-5)


def test_checkpoints_close_to_the_baseline_pair_through_their_differences():
    """Two checkpoints each 1e-8 of themselves from the baseline: the terms' co-moments
    leave 1e-16 of their own as the pair's spread (beyond resolving), the differences' from
    the baseline keep it whole."""
    rng = np.random.default_rng(22)
    n = 5_000
    base = 100.0 + rng.normal(size=n)
    values = np.stack(
        [
            base,
            base * (1 + 1e-8 * rng.normal(size=n)),
            base * (1 + 1e-8 * rng.normal(size=n)),
            rng.normal(size=n),
        ]
    )
    total = _merged(values, rng, baseline=0)
    expected = paired_mean_difference(values[2], values[1])
    assert paired.difference(total, "is", 2, 1, 0) == pytest.approx(expected, rel=1e-6)


def test_differences_below_the_terms_rounding_are_not_resolved():
    """float32 terms (a float32 kernel) are each good to about 1e-7 of themselves: two
    checkpoints whose terms differ by 1e-9 get a difference that is that rounding, with a
    standard error that says nothing of it (a QA run: -6.1e-7 +- 5.5e-8 where float64
    gives +2.9e-8 +- 1.06e-8). Given the terms' rounding, the pair has no standard error,
    with the baseline or without; policies far enough apart keep theirs."""
    rng = np.random.default_rng(23)
    n = 3_000
    base = 2.0 + rng.lognormal(0.0, 1.0, size=n)
    rows = [base, base * (1 + 1e-9 * rng.normal(size=n)), base * (1 + 0.05 * rng.normal(size=n))]
    exact = np.stack([*rows, rng.normal(size=n)])
    rounded = exact.astype(np.float32).astype(np.float64)
    noise = paired.term_noise(float(np.finfo(np.float32).eps), 30)
    total = _merged(rounded, rng, baseline=0)
    for k, j in ((1, 0), (0, 1), (1, 2), (2, 1)):
        close = {k, j} == {0, 1}
        delta, stderr = paired.difference(total, "is", k, j, 0, noise)
        assert (stderr is None) == close, (k, j, stderr)
        if not close:  # resolved: as the exact terms give it, to the terms' rounding
            expected = paired_mean_difference(exact[k], exact[j])
            assert delta == pytest.approx(expected[0], rel=1e-4)
            assert stderr == pytest.approx(expected[1], rel=1e-4)
    # without the terms' rounding taken into account: a standard error of the rounding
    assert paired.difference(total, "is", 1, 0, 0)[1] is not None


def test_terms_centred_at_zero_are_judged_by_their_size_not_the_estimate():
    """Rewards centred at 0: estimates near 0, terms near 1. A bound on float32's rounding
    scaled by the estimates let a difference that rounding made stand with a standard
    error (float32 shifted it by 2 of them); scaled by the terms, it has none."""
    rng = np.random.default_rng(24)
    n = 3_000
    base = rng.normal(size=n)
    base -= base.mean()
    rows = [base, base + 2e-8 * rng.normal(size=n), rng.normal(size=n)]
    rounded = np.stack(rows).astype(np.float32).astype(np.float64)
    noise = paired.term_noise(float(np.finfo(np.float32).eps), 30)
    total = _merged(rounded, rng, baseline=0)
    assert abs(rounded[0].mean()) < 1e-6  # the estimate, near 0
    assert paired.difference(total, "is", 1, 0, 0, noise)[1] is None
    assert paired.difference(total, "is", 2, 0, 0, noise)[1] is not None  # far apart
