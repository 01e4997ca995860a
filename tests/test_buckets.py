"""Episodes -> padded [lanes, T] batches walked in windows of a fixed catalogue of shapes
(ope_cli/data/buckets.py)."""

from __future__ import annotations

import collections
import dataclasses
import gc
import itertools
import math
import weakref

import numpy as np
import pytest

from ope_cli.config import BatchingConfig
from ope_cli.data import buckets
from ope_cli.data.buckets import (
    CALL_CELLS,
    PADDING_TOLERANCE,
    Bucketer,
    WindowShape,
    batch_length,
    empty_batch,
    flush_plan,
    pad,
    place_episodes,
    plan_of_choices,
    row_range,
    shape_indices,
    widened,
    window_shapes,
)
from ope_cli.data.episodes import EpisodeChunk, concat_chunks, take_episodes
from ope_cli.data.ids import RESAMPLING_GROUPS, mix64
from ope_cli.data.steps import Steps

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


# --------------------------------------------------------------------- window shapes


def test_the_default_catalogue():
    shapes = window_shapes(BatchingConfig())
    cells = BatchingConfig().batch_steps
    assert shapes == (
        WindowShape(cells // 8, 1, 1),
        WindowShape(cells // 8, 8, 512),
        WindowShape(cells // 64, 64, cells),
        WindowShape(1, cells // 8, math.inf),
    )
    longest = np.array([1, 2, 512, 513, cells, cells + 1])
    assert [shapes[i].width for i in shape_indices(shapes, longest)] == [
        1,
        8,
        8,
        64,
        64,
        cells // 8,
    ]
    assert batch_length(shapes[1], 9) == 16 and batch_length(shapes[2], 64) == 64


@pytest.mark.parametrize("multiple_of", [1, 2, 3, 8])
@pytest.mark.parametrize("batch_steps, min_bucket", [(16_384, 8), (64, 8), (333, 5), (10, 1)])
def test_catalogue_lanes_divide_among_devices(batch_steps, min_bucket, multiple_of):
    batching = BatchingConfig(batch_steps=batch_steps, min_bucket=min_bucket)
    shapes = window_shapes(batching, multiple_of)
    assert len(shapes) == 4
    assert [shape.longest for shape in shapes] == sorted(shape.longest for shape in shapes)
    assert shapes[0].width == 1 and shapes[-1].longest == math.inf
    for shape in shapes:
        assert shape.lanes >= 1 and shape.lanes % multiple_of == 0 and shape.width >= 1


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
    batching = BatchingConfig(batch_steps=512, min_bucket=4)
    chunks = skewed_chunks(seed)
    all_episodes = concat_chunks(chunks)
    bucketer, batches = run_bucketer(chunks, batching, multiple_of)
    catalogue = window_shapes(batching, multiple_of)

    seen_ids = []
    for batch in batches:
        b, t = batch.shape
        width = bucketer.width_of(batch)
        assert (b, width) in {(shape.lanes, shape.width) for shape in catalogue}
        assert t % width == 0 and b % multiple_of == 0
        assert batch.episode_mask.sum() >= 1
        # real rows first, then filler
        n_real = int(batch.episode_mask.sum())
        assert batch.episode_mask[:n_real].all() and not batch.episode_mask[n_real:].any()
        assert not batch.step_mask[n_real:].any()
        longest = int(batch.step_mask.sum(axis=1).max())
        assert t == -(-longest // width) * width  # its longest episode in whole windows
        for row in range(n_real):
            episode_id = int(batch.observation[row, 0, 0])
            index = int(np.flatnonzero(all_episodes.ids == episode_id)[0])
            length = int(all_episodes.lengths[index])
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
    assert bucketer.shapes == {(batch.shape[0], bucketer.width_of(batch)) for batch in batches}


def fifty_length_distributions():
    """(name, [E] lengths) of 50 datasets: lognormal, uniform, fixed, bimodal, one-step,
    one long episode among short ones, at several scales."""
    rng = np.random.default_rng(50)
    out = []
    for k in range(50):
        kind, scale = k % 6, int(10 ** rng.uniform(0.3, 3.3))
        n = int(rng.integers(1, 3000))
        if kind == 0:
            lengths = np.rint(rng.lognormal(np.log(scale), 1.0, n))
        elif kind == 1:
            lengths = rng.integers(1, 2 * scale + 2, n)
        elif kind == 2:
            lengths = np.full(n, scale)
        elif kind == 3:
            lengths = np.where(rng.random(n) < 0.5, 3, 10 * scale)
        elif kind == 4:
            lengths = np.ones(n)
        else:
            lengths = np.concatenate([rng.integers(1, 30, n), [100 * scale]])
        out.append((f"{k}:{kind}", np.clip(lengths, 1, 200_000).astype(np.int64)))
    return out


@pytest.mark.slow  # a property over 50 generated datasets (~100M steps laid out)
def test_fifty_length_distributions_use_only_the_catalogue():
    """Whatever the lengths, the window shapes are those of the fixed catalogue: a warm
    compilation cache compiles nothing for new data."""
    batching = BatchingConfig()
    catalogue = {(shape.lanes, shape.width) for shape in window_shapes(batching)}
    used = set()
    for name, lengths in fifty_length_distributions():
        chunk = make_chunk(lengths, obs_dim=None)
        bucketer, batches = run_bucketer([chunk], batching)
        assert bucketer.shapes <= catalogue, name
        assert bucketer.real_steps == int(lengths.sum()), name
        used |= bucketer.shapes
    assert used == catalogue  # every shape serves some of them


def test_one_step_episodes_waste_little_padding():
    """A bandit log (every episode one step) with the default batching: the one-step
    shape, and its last batch keeps the padding within a few percent of the real steps."""
    bucketer, batches = run_bucketer([make_chunk(np.ones(10_000, np.int64))], BatchingConfig())
    assert bucketer.shapes == {(BatchingConfig().batch_steps // 8, 1)}
    assert bucketer.padded_steps / bucketer.real_steps - 1 <= 0.10


def test_skewed_lengths_pad_little():
    """Long-tailed lengths (lognormal, median 50, the bench's distribution) in chunks of a
    few hundred episodes: sorted in the pool, batches of similar lengths."""
    rng = np.random.default_rng(7)
    lengths = np.clip(np.rint(rng.lognormal(np.log(50), 1.0, 24_000)), 1, 2000).astype(np.int64)
    chunks = [make_chunk(part, first_id=1000 * k) for k, part in enumerate(np.split(lengths, 30))]
    bucketer, _ = run_bucketer(chunks, BatchingConfig())
    assert bucketer.padded_steps / bucketer.real_steps - 1 <= 0.25


def test_one_very_long_episode_takes_one_lane():
    bucketer, batches = run_bucketer([make_chunk([1_000_000], obs_dim=None)], BatchingConfig())
    (batch,) = batches
    lone = window_shapes(BatchingConfig())[-1]
    assert batch.shape[0] == 1 and bucketer.width_of(batch) == lone.width
    assert bucketer.padded_steps / bucketer.real_steps - 1 <= 0.05
    np.testing.assert_array_equal(batch.reward[0, :5], np.arange(5) / 1000.0)


def plan_cost(lengths: np.ndarray, plan) -> float:
    """Cells plus CALL_CELLS per window call of a flush plan (its batches' full lanes)."""
    total = 0
    for start, _, shape in plan:
        windows = -(-max(1, int(lengths[start])) // shape.width)
        total += shape.lanes * windows * shape.width + CALL_CELLS * windows
    return total


def cheapest_plan_cost(lengths: np.ndarray, shapes: tuple[WindowShape, ...]) -> float:
    """The least plan_cost over every way of cutting sorted ``lengths`` into consecutive
    batches of ``lanes`` (fewer for the last), by exhaustive recursion (tiny inputs)."""

    def best(i: int) -> float:
        if i == lengths.size:
            return 0
        options = []
        for k, shape in enumerate(shapes):
            if k == 0 and lengths[i] > 1:
                continue  # the one-step shape
            stop = min(i + shape.lanes, lengths.size)
            options.append(plan_cost(lengths, [(i, stop, shape)]) + best(stop))
        return min(options)

    return best(0)


@pytest.mark.parametrize("seed", range(6))
def test_flush_plan_is_the_cheapest_cut(seed):
    """The dynamic programme finds the least-cost plan that exhaustive search finds, and its
    batches cover every episode once, in order, each in a shape that takes it."""
    rng = np.random.default_rng(seed)
    shapes = (
        WindowShape(4, 1, 1),
        WindowShape(4, 2, 8),
        WindowShape(2, 4, 64),
        WindowShape(1, 16, math.inf),
    )
    lengths = np.sort(rng.choice([1, 1, 2, 3, 7, 9, 30, 70, 5000], size=int(rng.integers(1, 11))))
    lengths = lengths[::-1].astype(np.int64)
    plan = flush_plan(lengths, shapes)
    assert [start for start, _, _ in plan] == [0] + [stop for _, stop, _ in plan[:-1]]
    assert plan[-1][1] == lengths.size
    assert all(stop - start <= shape.lanes for start, stop, shape in plan)
    assert all(shape.width > 1 or lengths[start] == 1 for start, _, shape in plan)
    assert plan_cost(lengths, plan) == cheapest_plan_cost(lengths, shapes)


def sequential_plan(lengths: np.ndarray, shapes: tuple[WindowShape, ...]) -> list:
    """The flush plan by the plain dynamic programme, one position at a time from the end
    (the first of equal costs), with plan_cost's costs: the reference of the vectorised one
    (both follow their choices with ``plan_of_choices``)."""
    size = lengths.size
    cost, choice = [0] * (size + 1), [0] * size
    for i in range(size - 1, -1, -1):
        best = math.inf
        for k, shape in enumerate(shapes):
            if k == 0 and lengths[i] > 1:
                continue  # the one-step shape
            stop = min(i + shape.lanes, size)
            total = plan_cost(lengths, [(i, stop, shape)]) + cost[stop]
            if total < best:
                best, choice[i] = total, k
        cost[i] = best
    return plan_of_choices(choice, shapes)


@pytest.mark.parametrize(
    ("batching", "devices"),
    [
        (BatchingConfig(), 1),
        (BatchingConfig(), 3),
        (BatchingConfig(batch_steps=64, min_bucket=8), 1),
        (BatchingConfig(batch_steps=8, min_bucket=8), 1),  # one lane in every shape
        (BatchingConfig(batch_steps=512, min_bucket=4), 2),
    ],
)
def test_flush_plan_is_the_sequential_programmes_plan(batching, devices):
    """Block by block, with the one-lane shapes' chain as a running minimum, the plan is
    the one the plain dynamic programme makes, ties included, on thousands of episodes
    (one-step ones, runs of equal lengths, a long tail)."""
    shapes = window_shapes(batching, devices)
    rng = np.random.default_rng(devices + batching.batch_steps)
    for size in (0, 1, 7, 300, 3000):  # 0: a pool that every episode has left
        lengths = np.concatenate(
            [
                rng.choice([1, 2, 8, 9, 64, 65], size=size),
                rng.integers(1, 3000, size=size // 3),
                np.ones(size // 2, np.int64),
            ]
        )
        lengths = np.sort(lengths)[::-1].astype(np.int64)
        assert flush_plan(lengths, shapes) == sequential_plan(lengths, shapes)


def _copies_counted(monkeypatch) -> collections.Counter:
    """{episode id: times the pool copied it}, counted from here on."""
    copies: collections.Counter = collections.Counter()

    def take_counted(chunk, episodes):
        copies.update(chunk.ids[episodes].tolist())
        return take_episodes(chunk, episodes)

    monkeypatch.setattr(buckets, "take_episodes", take_counted)
    return copies


def _add_chunks(bucketer, count: int, short: int, longs: int, longest: int) -> None:
    """``count`` chunks of ``short`` 8-step episodes (which leave at once) and ``longs``
    of 300 to ``longest`` steps (which wait)."""
    rng = np.random.default_rng(4)
    for k in range(count):
        lengths = np.concatenate([np.full(short, 8), rng.integers(300, longest, longs)])
        list(bucketer.add(make_chunk(lengths, first_id=10_000 * k, seed=k)))


def test_a_batch_gathers_from_few_chunks_and_waiting_steps_are_rarely_copied(monkeypatch):
    """Episodes left over from many chunks are copied into chunks of copies, which merge
    only past COPY_CHUNKS of them: a batch of the long tail gathers from about that many,
    not from every chunk it came from, and a waiting step is copied fewer times than when
    they merged at once (6 times each here)."""
    copies = _copies_counted(monkeypatch)
    bucketer = Bucketer(BatchingConfig(batch_steps=4096))
    _add_chunks(bucketer, 40, 512, 3, 400)
    waiting = np.flatnonzero(bucketer._length >= 300)
    assert waiting.size == 120
    assert np.unique(bucketer._chunk[waiting]).size <= buckets.COPY_CHUNKS + 4 < 40
    copied = sum(copies.values())
    assert copied <= 4.5 * waiting.size  # episodes copied: 4.5 times each on average at most
    batches = list(bucketer.flush())
    assert sum(int(b.episode_mask.sum()) for b in batches) == bucketer._length.size + 120


def test_an_episode_waiting_through_many_chunks_is_copied_log_times(monkeypatch):
    """A long episode waits while hundreds of chunks pass: it is copied a logarithmic
    number of times (merging the two smallest chunks of copies instead re-copied one
    growing chunk at every step: 21 copies of one episode here)."""
    copies = _copies_counted(monkeypatch)
    _add_chunks(Bucketer(BatchingConfig(batch_steps=4096)), 300, 512, 1, 1300)
    assert max(copies.values()) <= np.log2(300) + 4


def test_full_batches_that_pad_little_leave_before_flush():
    batching = BatchingConfig(batch_steps=64, min_bucket=8)  # [8, 8] up to 512 steps
    bucketer = Bucketer(batching)
    emitted = list(bucketer.add(make_chunk(np.full(19, 8))))  # no padding: leave at once
    assert [b.shape for b in emitted] == [(8, 8), (8, 8)]
    assert all(b.episode_mask.all() for b in emitted)
    rest = list(bucketer.flush())
    assert [b.shape for b in rest] == [(8, 8)]
    assert int(rest[0].episode_mask.sum()) == 3
    assert list(bucketer.flush()) == []


def test_a_batch_that_would_pad_much_waits_for_similar_episodes():
    batching = BatchingConfig(batch_steps=64, min_bucket=8)
    bucketer = Bucketer(batching)
    spread = np.array([40, 4, 4, 4, 4, 4, 4, 4])  # one batch of 8 would pad to 40 steps
    assert list(bucketer.add(make_chunk(spread))) == []
    similar = list(bucketer.add(make_chunk(np.full(7, 38), first_id=100)))
    assert [b.shape for b in similar] == [(8, 40)]
    (batch,) = similar
    padding = batch.shape[0] * batch.shape[1] / batch.step_mask.sum() - 1
    assert padding <= PADDING_TOLERANCE


def test_the_pool_is_bounded():
    batching = BatchingConfig(batch_steps=64, min_bucket=8)
    bucketer = Bucketer(batching)
    rng = np.random.default_rng(3)
    for k in range(200):
        list(bucketer.add(make_chunk(rng.integers(1, 64, 50), first_id=100 * k)))
        assert int(bucketer._length.sum()) <= bucketer.capacity + 64 * 50


def test_a_full_pool_lets_out_the_batch_that_pads_least():
    """Over capacity, the full batch with the least padding leaves, not the longest
    episodes': these (64 steps and seven of 10) would pad 134 steps to 512, where the next
    eight (seven of 10 and one of 9) pad 79 to 128."""
    bucketer = Bucketer(BatchingConfig(batch_steps=64, min_bucket=8))  # [8, 8] to 512 steps
    bucketer.capacity = 100
    lengths = [64, *[10] * 7, 9, *[8] * 7]  # no batch pads under 10%: none leaves unless full
    emitted = list(bucketer.add(make_chunk(lengths)))
    assert [b.shape for b in emitted] == [(8, 16)]
    assert sorted(emitted[0].step_mask.sum(axis=1).tolist()) == [9, *[10] * 7]
    assert bucketer.padded_steps == 128
    rest = list(bucketer.flush())  # the long one and the seven 8-step ones, at the end
    assert sum(int(b.step_mask.sum()) for b in [*emitted, *rest]) == sum(lengths)


def test_a_pass_that_stops_early_loses_no_batch():
    """The batches a chunk makes ready are planned at once; a caller that takes one and
    adds the next chunk gets the others first, each episode exactly once."""
    bucketer = Bucketer(BatchingConfig(batch_steps=64, min_bucket=8))
    first = list(itertools.islice(bucketer.add(make_chunk([8] * 24)), 1))  # 3 batches ready
    rest = [*bucketer.add(make_chunk([8] * 8, first_id=100)), *bucketer.flush()]
    ids = [int(x) for b in first + rest for x in b.observation[b.episode_mask, 0, 0]]
    assert sorted(ids) == sorted(set(ids)) and len(ids) == 32


def test_the_pool_lets_go_of_a_chunk_before_its_batch_is_walked():
    """A long episode leaves at once, alone; the pool frees the chunk it was read in
    before handing out its padded batch, so the episode is not held twice (as read and
    as padded) while the kernel walks it."""
    bucketer = Bucketer(BatchingConfig(batch_steps=4096, min_bucket=8))
    chunk = make_chunk([5_000])  # past the [64, 64] shape's 4,096 steps: one lane
    read = weakref.ref(chunk)
    ready = bucketer.add(chunk)
    del chunk
    (batch,) = list(itertools.islice(ready, 1))
    gc.collect()
    assert read() is None
    assert batch.shape == (1, 5120) and int(batch.step_mask.sum()) == 5_000


def test_a_lone_long_episode_is_not_padded_with_empty_lanes():
    batching = BatchingConfig(batch_steps=4096, min_bucket=8)
    bucketer, batches = run_bucketer([make_chunk([3_000, 3, 3])], batching)
    long = [b for b in batches if b.step_mask.sum() == 3_000]
    assert [b.shape for b in long] == [(1, 3072)]  # alone in the one-lane shape, not with
    assert bucketer.padded_steps == 3072 + 512 * 8  # 63 empty lanes; the short ones apart


def test_pending_episodes_do_not_keep_whole_chunks_alive():
    """Long episodes wait in the pool for a long time: where they are a small part of
    their chunk (less than a quarter of its steps), it must hold copies of them, not views
    that keep every chunk they came from in memory (memory would then grow with the data)."""
    bucketer = Bucketer(BatchingConfig(batch_steps=4096))
    # full batches of the 8-step episodes leave at once; the 900-step ones wait
    chunks = [make_chunk([8] * 2000 + [900], first_id=10_000 * i, seed=i) for i in range(3)]
    for chunk in chunks:
        list(bucketer.add(chunk))
    assert int((bucketer._length == 900).sum()) == 3  # waiting for similar episodes
    chunk_arrays = [
        getattr(chunk, name)
        for chunk in chunks
        for name in CHUNK_FIELDS
        if getattr(chunk, name) is not None
    ]
    for held in bucketer._chunks.values():
        for array in (held.reward, held.observation, held.action, held.log_behavior, held.keys):
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
