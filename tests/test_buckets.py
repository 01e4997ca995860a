"""Episodes -> fixed-shape padded [B, T] batches by length bucket (ope_cli/buckets.py)."""

from __future__ import annotations

import dataclasses
import gc
import math
import weakref

import numpy as np
import pytest

from ope_cli.buckets import (
    RESAMPLING_GROUPS,
    TAIL_DIVISOR,
    Bucketer,
    bucket_lengths_upto,
    empty_batch,
    episodes_per_batch,
    episodes_per_tail_batch,
    pad,
    place_episodes,
    row_range,
    widened,
)
from ope_cli.config import BatchingConfig
from ope_cli.episodes import EpisodeChunk, concat_chunks, take_episodes
from ope_cli.ids import mix64
from ope_cli.steps import Steps

CHUNK_FIELDS = (
    "ids",
    "keys",
    "lengths",
    "observation",
    "action",
    "reward",
    "log_behavior",
    "log_target",
)


def make_chunk(
    lengths, first_id: int = 0, obs_dim: int | None = 3, seed: int = 0, with_target: bool = True
) -> EpisodeChunk:
    """Episodes whose every per-step value identifies (episode id, step):
    reward = id + step / 1000, action = step, observation[..., 0] = id."""
    rng = np.random.default_rng(seed)
    lengths = np.asarray(lengths, np.int64)
    ids = np.arange(first_id, first_id + lengths.size, dtype=np.int64)
    id_of_row = np.repeat(ids, lengths)
    step_of_row = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    if obs_dim is None:
        observation = id_of_row.astype(np.float64)
    else:
        observation = np.concatenate(
            [id_of_row[:, None].astype(np.float64), rng.normal(size=(id_of_row.size, obs_dim - 1))],
            axis=1,
        )
    return EpisodeChunk(
        file="test.parquet",
        ids=ids,
        keys=mix64(ids.view(np.uint64)),
        lengths=lengths,
        steps=Steps(
            observation=observation,
            action=step_of_row.astype(np.int64),
            reward=id_of_row + step_of_row / 1000.0,
            log_behavior=np.log(rng.uniform(0.1, 1.0, size=id_of_row.size)),
            log_target=np.log(rng.uniform(0.1, 1.0, size=id_of_row.size)) if with_target else None,
        ),
    )


def assert_chunks_equal(a: EpisodeChunk, b: EpisodeChunk) -> None:
    for name in CHUNK_FIELDS:
        x, y = getattr(a, name), getattr(b, name)
        if x is None or y is None:
            assert x is None and y is None, name
        else:
            np.testing.assert_array_equal(x, y, err_msg=name)


# --------------------------------------------------------------------- bucket lengths


def test_bucket_lengths_geometric():
    np.testing.assert_array_equal(bucket_lengths_upto(100, 8, 2.0), [1, 8, 16, 32, 64, 128])
    np.testing.assert_array_equal(bucket_lengths_upto(128, 8, 2.0), [1, 8, 16, 32, 64, 128])
    np.testing.assert_array_equal(bucket_lengths_upto(129, 8, 2.0), [1, 8, 16, 32, 64, 128, 256])
    np.testing.assert_array_equal(bucket_lengths_upto(1, 8, 2.0), [1])
    np.testing.assert_array_equal(bucket_lengths_upto(2, 8, 2.0), [1, 8])
    np.testing.assert_array_equal(bucket_lengths_upto(8, 8, 2.0), [1, 8])
    # the default family: 1, then ceil(8 * sqrt(2)**k)
    defaults = BatchingConfig()
    np.testing.assert_array_equal(
        bucket_lengths_upto(40, defaults.min_bucket, defaults.bucket_growth),
        [1, 8, 12, 16, 23, 32, 46],
    )
    # from 1, the distinct values of ceil(sqrt(2)**k)
    np.testing.assert_array_equal(
        bucket_lengths_upto(40, 1, 2**0.5), [1, 2, 3, 4, 6, 8, 12, 16, 23, 32, 46]
    )


def test_bucket_lengths_have_no_cap():
    lengths = bucket_lengths_upto(10_000, 8, 2.0)
    assert lengths[-1] == 16_384
    assert lengths[-2] < 10_000
    lengths = bucket_lengths_upto(10**7, 8, 2.0)
    assert lengths[-1] >= 10**7


@pytest.mark.parametrize("growth", [1.1, 1.5, 2.0, 3.0])
@pytest.mark.parametrize("min_bucket", [1, 5, 8])
@pytest.mark.parametrize("max_length", [1, 7, 100, 10_000])
def test_bucket_lengths_cover_and_grow(growth, min_bucket, max_length):
    lengths = bucket_lengths_upto(max_length, min_bucket, growth)
    assert lengths[0] == 1  # one-step episodes always have a bucket of their own
    assert lengths[-1] >= max_length
    assert len(lengths) == 1 or lengths[-2] < max_length  # no bucket more than needed
    assert np.all(np.diff(lengths) >= 1)
    family = lengths if min_bucket == 1 else lengths[1:]
    for k, length in enumerate(family):
        assert length >= math.ceil(min_bucket * growth**k) - 1e-9
    # a bounded number of buckets: about log(max / min) / log(growth)
    bound = math.log(max(max_length, min_bucket) / min_bucket) / math.log(growth) + 3
    assert len(lengths) <= bound


def test_bucket_lengths_prefix_is_stable():
    short = bucket_lengths_upto(100, 8, 1.5)
    long = bucket_lengths_upto(100_000, 8, 1.5)
    np.testing.assert_array_equal(long[: short.size], short)


def test_episodes_per_batch():
    assert episodes_per_batch(8, 65_536) == 8192
    assert episodes_per_batch(16_384, 65_536) == 4
    assert episodes_per_batch(100_000, 65_536) == 1  # never zero
    assert episodes_per_batch(10, 100) == 8  # the largest power of two <= 100 // 10
    assert episodes_per_batch(10, 100, multiple_of=3) == 9  # then up to a multiple of 3
    assert episodes_per_batch(10, 80, multiple_of=4) == 8
    assert episodes_per_batch(100_000, 65_536, multiple_of=8) == 8
    for length in (1, 3, 8, 100, 1000):
        for multiple in (1, 2, 8):
            b = episodes_per_batch(length, 4096, multiple)
            assert b >= 1 and b % multiple == 0
            assert b & (b - 1) == 0 or multiple > 1  # a power of two unless rounded up


# ---------------------------------------------------------------------- chunk helpers


def test_take_episodes_gathers_the_right_steps():
    chunk = make_chunk([3, 1, 4, 1, 5])
    part = take_episodes(chunk, np.array([4, 0, 2]))
    np.testing.assert_array_equal(part.ids, [4, 0, 2])
    np.testing.assert_array_equal(part.lengths, [5, 3, 4])
    np.testing.assert_array_equal(
        part.reward,
        np.concatenate(
            [
                4 + np.arange(5) / 1000,
                0 + np.arange(3) / 1000,
                2 + np.arange(4) / 1000,
            ]
        ),
    )
    np.testing.assert_array_equal(part.observation[:, 0], np.repeat([4, 0, 2], [5, 3, 4]))
    assert part.observation.shape == (12, 3)
    assert part.file == chunk.file


def test_take_episodes_empty_selection():
    part = take_episodes(make_chunk([2, 3]), np.array([], np.int64))
    assert part.num_episodes == 0
    assert part.num_steps == 0


@pytest.mark.parametrize("seed", range(5))
def test_take_and_concat_round_trip(seed):
    rng = np.random.default_rng(seed)
    chunk = make_chunk(rng.integers(1, 20, size=40), seed=seed)
    cuts = np.sort(rng.choice(np.arange(1, 40), size=rng.integers(1, 8), replace=False))
    parts = [take_episodes(chunk, idx) for idx in np.split(np.arange(40), cuts)]
    assert_chunks_equal(concat_chunks(parts), chunk)
    assert concat_chunks([chunk]) is chunk


def test_concat_without_optional_arrays():
    parts = [
        make_chunk([2, 3], obs_dim=None, with_target=False),
        make_chunk([4], first_id=2, obs_dim=None, with_target=False),
    ]
    joined = concat_chunks(parts)
    assert joined.log_target is None
    np.testing.assert_array_equal(joined.ids, [0, 1, 2])
    np.testing.assert_array_equal(joined.lengths, [2, 3, 4])


# ---------------------------------------------------------------------------- pad


@pytest.mark.parametrize("obs_dim", [None, 3])
def test_pad_places_values_and_masks(obs_dim):
    chunk = make_chunk([3, 1, 8, 5], obs_dim=obs_dim)
    batch = pad(chunk, length=8, batch=6)
    assert batch.shape == (6, 8)
    assert batch.reward.shape == (6, 8)
    assert batch.observation.shape == ((6, 8) if obs_dim is None else (6, 8, 3))
    np.testing.assert_array_equal(batch.episode_mask, [True] * 4 + [False] * 2)
    for e, (lo, hi) in enumerate(zip(chunk.offsets[:-1], chunk.offsets[1:], strict=True)):
        t = hi - lo
        np.testing.assert_array_equal(batch.step_mask[e], np.arange(8) < t)
        for name in ("reward", "action", "log_behavior", "log_target", "observation"):
            padded, flat = getattr(batch, name), getattr(chunk, name)
            np.testing.assert_array_equal(padded[e, :t], flat[lo:hi], err_msg=name)
            assert np.all(padded[e, t:] == 0), name
    for name in ("reward", "action", "log_behavior", "log_target", "observation"):
        assert np.all(getattr(batch, name)[4:] == 0), name
    assert not batch.step_mask[4:].any()
    assert batch.step_mask.sum() == chunk.num_steps
    assert batch.action.dtype == chunk.action.dtype
    assert batch.reward.dtype == np.float64


def test_pad_groups():
    chunk = make_chunk(np.ones(100, np.int64))
    batch = pad(chunk, length=8, batch=128)
    assert batch.group.dtype == np.int32
    real = batch.group[:100]
    assert np.all((real >= 0) & (real < RESAMPLING_GROUPS))
    np.testing.assert_array_equal(
        real, (chunk.keys % np.uint64(RESAMPLING_GROUPS)).astype(np.int32)
    )
    np.testing.assert_array_equal(batch.group[100:], 0)
    assert np.unique(real).size > RESAMPLING_GROUPS // 2  # hashed ids spread over the groups


def test_pad_without_target():
    batch = pad(make_chunk([2], with_target=False), length=8, batch=1)
    assert batch.log_target is None


# ------------------------------------------------------------------------- Bucketer


def run_bucketer(chunks, batching: BatchingConfig, multiple_of: int = 1):
    bucketer = Bucketer(batching, multiple_of=multiple_of)
    batches = []
    for chunk in chunks:
        batches.extend(bucketer.add(chunk))
    batches.extend(bucketer.flush())
    return bucketer, batches


def skewed_chunks(seed: int, n_chunks: int = 12, max_length: int = 700):
    rng = np.random.default_rng(seed)
    chunks, next_id = [], 0
    for _ in range(n_chunks):
        n = int(rng.integers(1, 60))
        lengths = np.clip(np.rint(rng.lognormal(np.log(15), 1.2, size=n)), 1, max_length).astype(
            np.int64
        )
        chunks.append(make_chunk(lengths, first_id=next_id, seed=int(rng.integers(1 << 30))))
        next_id += n
    return chunks


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("multiple_of", [1, 4])
def test_bucketer_emits_every_episode_once_with_its_steps(seed, multiple_of):
    batching = BatchingConfig(batch_steps=512, min_bucket=8, bucket_growth=2.0)
    chunks = skewed_chunks(seed)
    all_episodes = concat_chunks(chunks)
    bucketer, batches = run_bucketer(chunks, batching, multiple_of)
    lengths_table = bucket_lengths_upto(int(all_episodes.lengths.max()), 8, 2.0)

    seen_ids = []
    for batch in batches:
        b, t = batch.shape
        assert t in lengths_table
        assert b % multiple_of == 0
        assert batch.episode_mask.sum() >= 1
        # real rows first, then filler
        n_real = int(batch.episode_mask.sum())
        assert batch.episode_mask[:n_real].all() and not batch.episode_mask[n_real:].any()
        assert not batch.step_mask[n_real:].any()
        for row in range(n_real):
            episode_id = int(batch.observation[row, 0, 0])
            index = int(np.flatnonzero(all_episodes.ids == episode_id)[0])
            length = int(all_episodes.lengths[index])
            # the smallest bucket that holds the episode
            assert t == lengths_table[np.searchsorted(lengths_table, length)]
            np.testing.assert_array_equal(batch.step_mask[row], np.arange(t) < length)
            lo = all_episodes.offsets[index]
            np.testing.assert_array_equal(
                batch.reward[row, :length], all_episodes.reward[lo : lo + length]
            )
            np.testing.assert_array_equal(
                batch.log_target[row, :length], all_episodes.log_target[lo : lo + length]
            )
            assert np.all(batch.reward[row, length:] == 0)
            seen_ids.append(episode_id)
    np.testing.assert_array_equal(np.sort(seen_ids), np.sort(all_episodes.ids))

    assert bucketer.real_steps == all_episodes.num_steps
    assert bucketer.padded_steps == sum(b * t for b, t in (batch.shape for batch in batches))
    assert bucketer.shapes == {batch.shape for batch in batches}


def allowed_shapes(buckets, batch_steps, multiple_of=1):
    """The two shapes of each bucket: full batches and tail batches."""
    return {
        (rows(int(t), batch_steps, multiple_of), int(t))
        for t in buckets
        for rows in (episodes_per_batch, episodes_per_tail_batch)
    }


def test_bucketer_bounded_shapes():
    batching = BatchingConfig(batch_steps=1024, min_bucket=8, bucket_growth=2.0)
    rng = np.random.default_rng(11)
    chunks = [make_chunk(rng.integers(1, 1000, size=50), first_id=50 * k) for k in range(40)]
    bucketer, batches = run_bucketer(chunks, batching)
    buckets = bucket_lengths_upto(1000, 8, 2.0)
    assert {batch.shape for batch in batches} <= allowed_shapes(buckets, 1024)
    # full batches are full; tail batches hold fewer than a full batch in all, and only the
    # last tail batch of a bucket has filler rows
    for t in buckets:
        full = episodes_per_batch(int(t), 1024)
        filler = [
            batch for batch in batches if batch.shape[1] == t and not batch.episode_mask.all()
        ]
        assert len(filler) <= 1
        tails = [batch for batch in batches if batch.shape[1] == t and batch.shape[0] != full]
        assert sum(int(batch.episode_mask.sum()) for batch in tails) < max(full, 1) or not tails


def test_bucketer_shapes_do_not_depend_on_the_data():
    """Two datasets with different length distributions and sizes use shapes of one fixed
    family: two per bucket, whatever the data."""
    batching = BatchingConfig(batch_steps=512, min_bucket=1, bucket_growth=2**0.5)
    few = run_bucketer(skewed_chunks(0, n_chunks=5), batching)[0].shapes
    many = run_bucketer(skewed_chunks(1, n_chunks=200), batching)[0].shapes
    uniform = [make_chunk(np.random.default_rng(2).integers(1, 60, 300), first_id=0)]
    other = run_bucketer(uniform, batching)[0].shapes
    family = allowed_shapes(bucket_lengths_upto(10_000, 1, 2**0.5), 512)
    assert few <= family and many <= family and other <= family
    assert len(many) <= 2 * len(bucket_lengths_upto(700, 1, 2**0.5))


def test_a_large_dataset_covers_the_shapes_of_smaller_ones():
    """A dataset with full batches and leftovers in every bucket uses both shapes of each,
    so any other dataset with lengths in those buckets, however many episodes, needs no
    shape it did not (on a warm cache: no compilation). The shapes a bucket uses must not
    depend on how full its leftover is."""
    batching = BatchingConfig(batch_steps=512, min_bucket=8, bucket_growth=2**0.5)
    buckets = bucket_lengths_upto(90, 8, 2**0.5)
    big_lengths = np.concatenate([np.repeat(np.arange(1, 91), 37), np.ones(600, np.int64)])
    big = run_bucketer([make_chunk(big_lengths)], batching)[0].shapes
    assert big == allowed_shapes(buckets, 512)  # both shapes of every bucket
    rng = np.random.default_rng(5)
    for seed in range(20):
        counts = rng.integers(0, 80, 90)  # episodes of each length 1..90
        lengths = np.repeat(np.arange(1, 91), counts)
        small = run_bucketer([make_chunk(lengths, first_id=10_000 * (seed + 1))], batching)
        assert small[0].shapes <= big


@pytest.mark.parametrize("n_episodes", [1, 3, 5])
def test_tail_batch_is_small_for_a_nearly_empty_bucket(n_episodes):
    batching = BatchingConfig(batch_steps=1024, min_bucket=8, bucket_growth=2.0)
    full = episodes_per_batch(8, 1024)  # 128 episodes per batch of bucket 8
    bucketer = Bucketer(batching)
    lengths = np.arange(n_episodes) % 7 + 2  # all in bucket 8
    assert list(bucketer.add(make_chunk(lengths))) == []
    batches = list(bucketer.flush())
    tail = episodes_per_tail_batch(8, 1024)
    assert tail == max(1, full // TAIL_DIVISOR) == 2
    assert [b.shape for b in batches] == [(tail, 8)] * -(-n_episodes // tail)
    assert sum(int(b.episode_mask.sum()) for b in batches) == n_episodes
    assert bucketer.padded_steps == len(batches) * tail * 8
    assert bucketer.real_steps == int(lengths.sum())


def test_one_step_episodes_waste_little_padding():
    """A bandit log (every episode one step) with the default batching: bucket 1, and the
    tail calls keep the padding within a few percent of the real steps."""
    bucketer, batches = run_bucketer([make_chunk(np.ones(10_000, np.int64))], BatchingConfig())
    assert bucketer.shapes == {(episodes_per_tail_batch(1, BatchingConfig().batch_steps), 1)}
    assert bucketer.padded_steps / bucketer.real_steps - 1 <= 0.10


def test_tail_batch_respects_multiple_of():
    batching = BatchingConfig(batch_steps=256, min_bucket=8, bucket_growth=2.0)
    bucketer = Bucketer(batching, multiple_of=8)
    list(bucketer.add(make_chunk([2])))
    (batch,) = list(bucketer.flush())
    assert batch.shape == (8, 8)


@pytest.mark.parametrize("multiple_of", [3, 5])
def test_tail_batches_of_a_non_power_of_two_device_count(multiple_of):
    """B(T) is then not a multiple of the tail size: the last tail batch is topped up."""
    batching = BatchingConfig(batch_steps=64, min_bucket=8, bucket_growth=2.0)
    bucketer = Bucketer(batching, multiple_of=multiple_of)
    full = episodes_per_batch(8, 64, multiple_of)
    tail = episodes_per_tail_batch(8, 64, multiple_of)
    emitted = list(bucketer.add(make_chunk(np.full(full - 1, 3))))
    emitted += list(bucketer.flush())
    assert {b.shape for b in emitted} == {(tail, 8)}
    assert all(b.shape[0] % multiple_of == 0 for b in emitted)
    assert sum(int(b.episode_mask.sum()) for b in emitted) == full - 1


def test_full_batches_are_emitted_before_flush():
    batching = BatchingConfig(batch_steps=64, min_bucket=8, bucket_growth=2.0)  # B = 8 for T = 8
    bucketer = Bucketer(batching)
    emitted = list(bucketer.add(make_chunk(np.full(19, 4))))
    assert [b.shape for b in emitted] == [(8, 8), (8, 8)]
    assert all(b.episode_mask.all() for b in emitted)
    tails = list(bucketer.flush())
    assert [b.shape for b in tails] == [(1, 8)] * 3  # B / TAIL_DIVISOR, at least 1
    assert all(b.episode_mask.all() for b in tails)
    assert list(bucketer.flush()) == []


def test_ten_thousand_step_episode_fits():
    batching = BatchingConfig(bucket_growth=2.0)  # lengths 8, 16, ..., 16384
    bucketer, batches = run_bucketer([make_chunk([10_000, 3], obs_dim=None)], batching)
    shapes = sorted(batch.shape for batch in batches)
    assert (1, 16_384) in shapes
    (long,) = [batch for batch in batches if batch.shape[1] == 16_384]
    assert long.step_mask.sum() == 10_000
    np.testing.assert_array_equal(long.reward[0, :10_000], np.arange(10_000) / 1000.0)
    assert bucketer.real_steps == 10_003


def test_pending_episodes_do_not_keep_whole_chunks_alive():
    """A rarely filled bucket (long episodes) holds a few episodes for a long time: it must
    hold copies of them, not views that keep every chunk they came from in memory (memory
    would then grow with the data)."""
    bucketer = Bucketer(BatchingConfig(batch_steps=4096))
    chunks = [make_chunk([3] * 200 + [900], first_id=1000 * i, seed=i) for i in range(3)]
    for chunk in chunks:
        list(bucketer.add(chunk))
    long_bucket = max(bucketer._open)  # the 900-step episodes' bucket, not yet full
    held = bucketer._open[long_bucket]
    assert held.rows == 3  # a batch of that bucket holds 4
    assert int(held.batch.step_mask.sum()) == 3 * 900
    chunk_arrays = [
        getattr(chunk, name)
        for chunk in chunks
        for name in CHUNK_FIELDS
        if getattr(chunk, name) is not None
    ]
    for open_batch in bucketer._open.values():
        for array in (
            open_batch.batch.reward,
            open_batch.batch.observation,
            open_batch.batch.action,
            open_batch.batch.log_behavior,
            open_batch.batch.key_hi,
        ):
            # Its own memory (64 bytes of slack for alignment), no view of any chunk.
            assert array.base is None or np.asarray(array.base).nbytes <= array.nbytes + 64
            assert not any(np.shares_memory(array, other) for other in chunk_arrays)
    alive = [weakref.ref(array) for array in chunk_arrays if array.base is None]
    del chunk_arrays, chunks, chunk
    gc.collect()
    assert alive and not any(ref() is not None for ref in alive)  # the chunks were freed


@pytest.mark.parametrize("seed", range(3))
def test_place_episodes_in_parts_equals_pad_at_once(seed):
    """Filling a batch from several chunks, a few episodes at a time and in any order of
    rows, gives the same arrays as padding the concatenated episodes in one go."""
    rng = np.random.default_rng(seed)
    chunks = [
        make_chunk(rng.integers(1, 17, size=n), first_id=100 * k, seed=seed + k)
        for k, n in enumerate(rng.integers(1, 9, size=4))
    ]
    joined = concat_chunks(chunks)
    expected = pad(joined, length=16, batch=40)
    batch = empty_batch(chunks[0], 16, 40)
    row = 0
    for chunk in chunks:
        cut = int(rng.integers(0, chunk.num_episodes + 1))
        for episodes in (np.arange(cut), np.arange(cut, chunk.num_episodes)):
            steps = place_episodes(batch, row, chunk, episodes)
            assert steps == int(chunk.lengths[episodes].sum())
            row += episodes.size
    for name in (
        "observation",
        "action",
        "reward",
        "log_behavior",
        "log_target",
        "step_mask",
        "episode_mask",
        "group",
        "key_hi",
        "key_lo",
    ):
        np.testing.assert_array_equal(getattr(batch, name), getattr(expected, name), err_msg=name)
        assert getattr(batch, name).dtype == getattr(expected, name).dtype, name


def test_widened_promotes_only_when_a_chunk_is_wider():
    chunk32 = make_chunk([2, 3])
    chunk32 = dataclasses.replace(
        chunk32, steps=chunk32.steps._replace(observation=chunk32.observation.astype(np.float32))
    )
    batch = empty_batch(chunk32, 8, 4)
    place_episodes(batch, 0, chunk32, np.arange(2))
    assert widened(batch, chunk32) is batch
    wide = widened(batch, make_chunk([4], first_id=2))
    assert wide.observation.dtype == np.float64 and batch.observation.dtype == np.float32
    np.testing.assert_array_equal(wide.observation, batch.observation)
    assert wide.reward is batch.reward  # unchanged arrays are shared, not copied


def test_row_ranges_are_aligned():
    batch = pad(make_chunk([3, 1, 2]), length=8, batch=8)
    head = row_range(batch, 0, 4)
    assert head.shape == (4, 8)
    assert np.shares_memory(head.reward, batch.reward)
    assert head.reward.ctypes.data % 64 == 0 and head.observation.ctypes.data % 64 == 0
    np.testing.assert_array_equal(head.episode_mask, [True] * 3 + [False])
    middle = row_range(batch, 1, 3)  # 64 bytes of float64 per row: a view is aligned
    assert np.shares_memory(middle.reward, batch.reward)
    odd = row_range(batch, 1, 2)  # one bool row (8 bytes in): copied to stay aligned
    assert odd.step_mask.ctypes.data % 64 == 0
    np.testing.assert_array_equal(odd.step_mask, batch.step_mask[1:2])
