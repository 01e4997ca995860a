"""Episodes -> fixed-shape padded [batch, time] arrays, grouped by length bucket.

The compiled shapes do not depend on the data, so a compilation (in memory or in the
persistent cache) serves every later dataset. Bucket lengths are 1 and the geometric
family ceil(min_bucket * growth**k) (1, 8, 12, 16, 23, 32, 46, ... by default), without a
cap, so a 10,000-step episode gets a 16,384-step bucket rather than being dropped. A bucket
of length T has exactly two shapes: full batches of B(T) episodes (the largest power of two
with B * T <= batch_steps), and the rows left at the end, run as calls of TAIL_DIVISOR
times fewer episodes, the last one topped up with masked rows. Compiling costs about a
second per shape and a call a few milliseconds, so the tail is padded rather than given
a shape of its own; the small tail shape keeps the padding of a one-step (bandit) log or
of a small dataset within a few percent.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np

from ope_cli.config import BatchingConfig
from ope_cli.episodes import EpisodeChunk
from ope_cli.steps import Steps, map_arrays, step_field

RESAMPLING_GROUPS = 32  # episodes are hashed into this many groups for the grouped jackknife
TAIL_DIVISOR = 64  # a bucket's last episodes run in calls of B(T) / TAIL_DIVISOR episodes


class PaddedBatch(NamedTuple):
    """B episodes of one bucket, padded to T steps. Padding is absorbing: no reward, ratio 1.
    A NamedTuple, hence a JAX pytree as it is: the kernel takes and shards it whole.

    Attributes:
      steps: Steps of [B, T, ...] arrays, 0 on padding (``batch.reward`` reads
        ``batch.steps.reward``); a field that was not read is None.
      step_mask: [B, T] bool, True on real steps.
      episode_mask: [B] bool, True on real episodes (False on rows that only fill the batch).
      group: [B] int32 resampling group of each episode, from its id.
      key_hi, key_lo: [B] uint32 halves of each episode's id hash (bootstrap streams).
    """

    steps: Steps
    step_mask: np.ndarray
    episode_mask: np.ndarray
    group: np.ndarray
    key_hi: np.ndarray
    key_lo: np.ndarray

    def __getattr__(self, name: str) -> np.ndarray | None:
        return step_field(self, name)

    @property
    def shape(self) -> tuple[int, int]:
        return self.step_mask.shape


def bucket_lengths_upto(max_length: int, min_bucket: int, growth: float) -> np.ndarray:
    """Increasing bucket lengths until one is >= max_length: 1, then the distinct values of
    ceil(min_bucket * growth**k). The family depends only on (min_bucket, growth). One-step
    episodes (bandit logs) get a bucket of their own; other short episodes share the
    min_bucket one, as each further bucket costs a compilation."""
    min_bucket = max(1, min_bucket)
    lengths, power = [1] if min_bucket == 1 else [1, min_bucket], 1
    while lengths[-1] < max_length:
        # The tolerance keeps sqrt(2)**4 * 8 at 32, not 33, despite rounding in the power.
        length = math.ceil(min_bucket * growth**power - 1e-9)
        power += 1
        if length > lengths[-1]:
            lengths.append(length)
    return np.asarray(lengths if max_length > 1 else lengths[:1], np.int64)


def _round_up(count: int, multiple_of: int) -> int:
    return -(-count // multiple_of) * multiple_of


def episodes_per_batch(length: int, batch_steps: int, multiple_of: int = 1) -> int:
    """B(T) for a bucket of ``length`` steps: the largest power of two with at most
    ``batch_steps`` cells (at least 1), rounded up to a multiple of ``multiple_of``."""
    episodes = 1 << max(0, (batch_steps // length).bit_length() - 1)
    return _round_up(episodes, multiple_of)


def episodes_per_tail_batch(length: int, batch_steps: int, multiple_of: int = 1) -> int:
    """Episodes per call for a bucket's remaining episodes: B(T) / TAIL_DIVISOR (at least 1),
    rounded up to a multiple of ``multiple_of``; never more than B(T)."""
    episodes = 1 << max(0, (batch_steps // length).bit_length() - 1)
    return min(
        _round_up(max(1, episodes // TAIL_DIVISOR), multiple_of),
        episodes_per_batch(length, batch_steps, multiple_of),
    )


def _zeros(shape: tuple[int, ...], dtype) -> np.ndarray:
    """np.zeros with 64-byte alignment, so handing the array to XLA on CPU needs no copy."""
    dtype = np.dtype(dtype)
    size = int(np.prod(shape)) * dtype.itemsize
    raw = np.zeros(size + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start : start + size].view(dtype).reshape(shape)


def empty_batch(chunk: EpisodeChunk, length: int, batch: int) -> PaddedBatch:
    """An all-padding [batch, length] PaddedBatch with the dtypes and trailing shapes of
    ``chunk``'s arrays, ready for ``place_episodes``."""
    return PaddedBatch(
        steps=map_arrays(
            lambda values: _zeros((batch, length, *values.shape[1:]), values.dtype), chunk.steps
        ),
        step_mask=_zeros((batch, length), bool),
        episode_mask=np.zeros(batch, bool),
        group=np.zeros(batch, np.int32),
        key_hi=np.zeros(batch, np.uint32),
        key_lo=np.zeros(batch, np.uint32),
    )


def place_episodes(
    batch: PaddedBatch,
    row: int,
    chunk: EpisodeChunk,
    episodes: np.ndarray,
    offsets: np.ndarray | None = None,
) -> int:
    """Copies episodes ``episodes`` ([k] indices into ``chunk``, each <= T steps) into rows
    ``row:row + k`` of ``batch`` ([B, T]). Each array is gathered straight into its [k, T]
    block (cell t of an episode reads its step min(t, length - 1)), then the padding cells
    are zeroed. ``offsets`` is ``chunk.offsets`` when the caller has it. Returns the steps."""
    offsets = chunk.offsets if offsets is None else offsets
    length = batch.shape[1]
    lengths = chunk.lengths[episodes]
    time = np.arange(length)
    real = time < lengths[:, None]  # [k, T]
    source = offsets[episodes][:, None] + np.minimum(time, lengths[:, None] - 1)
    padding = np.flatnonzero(~real)  # in the [k * T] flattening of the block
    rows = slice(row, row + episodes.size)
    for padded, values in zip(batch.steps, chunk.steps, strict=True):
        if padded is None:
            continue
        block = padded[rows]
        if block.dtype == values.dtype:  # indices are in range: "clip" skips the checks
            np.take(values, source, axis=0, out=block, mode="clip")
        else:  # a batch widened for another file's wider column
            block[...] = values[source]
        block.reshape(-1, *block.shape[2:])[padding] = 0
    batch.step_mask[rows] = real
    keys = chunk.keys[episodes]
    batch.episode_mask[rows] = True
    batch.group[rows] = (keys % np.uint64(RESAMPLING_GROUPS)).astype(np.int32)
    batch.key_hi[rows] = (keys >> np.uint64(32)).astype(np.uint32)
    batch.key_lo[rows] = (keys & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    return int(lengths.sum())


def widened(batch: PaddedBatch, chunk: EpisodeChunk) -> PaddedBatch:
    """``batch``, its per-step arrays copied to a wider dtype where ``chunk``'s is wider
    (files may store a column as float32 in one and float64 in another); usually itself."""

    def wider(padded: np.ndarray, values: np.ndarray | None) -> np.ndarray:
        dtype = padded.dtype if values is None else np.result_type(padded.dtype, values.dtype)
        if dtype == padded.dtype:
            return padded
        copy = _zeros(padded.shape, dtype)
        copy[...] = padded
        return copy

    steps = map_arrays(wider, batch.steps, chunk.steps)
    changed = any(a is not b for a, b in zip(steps, batch.steps, strict=True))
    return batch._replace(steps=steps) if changed else batch


def row_range(batch: PaddedBatch, start: int, stop: int) -> PaddedBatch:
    """Rows ``start:stop`` of ``batch`` as views (copied where a view would not start on a
    64-byte boundary, so that handing it to XLA on CPU needs no copy there)."""

    def rows(values: np.ndarray) -> np.ndarray:
        part = values[start:stop]
        if part.ctypes.data % 64 == 0:
            return part
        aligned = _zeros(part.shape, part.dtype)
        aligned[...] = part
        return aligned

    return map_arrays(rows, batch)


def _topped_up(batch: PaddedBatch, rows: int) -> PaddedBatch:
    """``batch`` with all-padding rows appended up to ``rows`` episodes."""

    def grown(values: np.ndarray) -> np.ndarray:
        out = _zeros((rows, *values.shape[1:]), values.dtype)
        out[: values.shape[0]] = values
        return out

    return map_arrays(grown, batch)


def pad(
    chunk: EpisodeChunk, length: int, batch: int, start: int = 0, stop: int | None = None
) -> PaddedBatch:
    """Pads episodes ``start:stop`` of ``chunk`` (<= ``batch`` of them, each <= ``length``
    steps) into a [batch, length] PaddedBatch."""
    stop = chunk.num_episodes if stop is None else stop
    padded = empty_batch(chunk, length, batch)
    place_episodes(padded, 0, chunk, np.arange(start, stop))
    return padded


@dataclasses.dataclass
class _OpenBatch:
    """A bucket's batch being filled: ``rows`` episodes with ``steps`` real steps so far.
    Its arrays are its own (episodes are copied in), so no chunk outlives its ``add``."""

    batch: PaddedBatch
    rows: int = 0
    steps: int = 0


class Bucketer:
    """Collects episodes per length bucket and emits full fixed-shape batches.

    Attributes (for reports): ``real_steps`` and ``padded_steps`` (cells of emitted
    batches, filler rows included) and ``shapes`` (the distinct [B, T] shapes emitted).
    """

    def __init__(self, batching: BatchingConfig, multiple_of: int = 1):
        self.batching = batching
        self.multiple_of = multiple_of
        self._lengths = bucket_lengths_upto(1, batching.min_bucket, batching.bucket_growth)
        self._open: dict[int, _OpenBatch] = {}  # bucket length -> its partly filled batch
        self.real_steps = 0
        self.padded_steps = 0
        self.shapes: set[tuple[int, int]] = set()

    def add(self, chunk: EpisodeChunk) -> Iterator[PaddedBatch]:
        """Files the chunk's episodes into buckets; yields every batch that became full."""
        longest = int(chunk.lengths.max())
        if longest > self._lengths[-1]:
            self._lengths = bucket_lengths_upto(
                longest, self.batching.min_bucket, self.batching.bucket_growth
            )
        offsets = chunk.offsets
        bucket_of = np.searchsorted(self._lengths, chunk.lengths, side="left")
        for bucket in np.unique(bucket_of):
            length = int(self._lengths[bucket])
            batch = episodes_per_batch(length, self.batching.batch_steps, self.multiple_of)
            members = np.flatnonzero(bucket_of == bucket)
            while members.size:
                open_batch = self._open.get(length)
                if open_batch is None:
                    open_batch = self._open[length] = _OpenBatch(empty_batch(chunk, length, batch))
                else:
                    open_batch.batch = widened(open_batch.batch, chunk)
                placed = members[: batch - open_batch.rows]
                open_batch.steps += place_episodes(
                    open_batch.batch, open_batch.rows, chunk, placed, offsets
                )
                open_batch.rows += placed.size
                members = members[placed.size :]
                if open_batch.rows == batch:
                    del self._open[length]
                    yield self._emit(open_batch.batch, open_batch.steps)

    def flush(self) -> Iterator[PaddedBatch]:
        """Yields the remaining episodes of each bucket in tail batches (the last one topped
        up with masked rows)."""
        for length in sorted(self._open):
            open_batch = self._open.pop(length)
            rows = episodes_per_tail_batch(length, self.batching.batch_steps, self.multiple_of)
            padded, real = open_batch.batch, open_batch.rows
            for start in range(0, real, rows):
                if start + rows <= padded.shape[0]:
                    part = row_range(padded, start, start + rows)
                else:  # B(T) is not a multiple of the tail size (devices not a power of 2)
                    part = _topped_up(row_range(padded, start, padded.shape[0]), rows)
                yield self._emit(part, int(part.step_mask.sum()))

    def _emit(self, padded: PaddedBatch, real_steps: int) -> PaddedBatch:
        """``padded`` (a filled batch or a tail part of one), counted in the statistics."""
        self.real_steps += real_steps
        self.padded_steps += padded.shape[0] * padded.shape[1]
        self.shapes.add(padded.shape)
        return padded
