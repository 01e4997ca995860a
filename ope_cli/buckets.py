"""Episodes -> fixed-shape padded [batch, time] arrays, grouped by length bucket.

Bucket lengths grow geometrically (8, 16, 32, ... by default) without a cap, so a
10,000-step episode gets a 16,384-step bucket rather than being dropped. A bucket of
length T is always cut into batches of the same number of episodes B(T), so the
kernel sees one shape per bucket and compiles once for it.
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
    """Increasing bucket lengths, ceil(min_bucket * growth**k), until one is >= max_length."""
    lengths = [max(1, min_bucket)]
    while lengths[-1] < max_length:
        # The tolerance keeps sqrt(2)**4 * 8 at 32, not 33, despite rounding in the power.
        lengths.append(max(lengths[-1] + 1, math.ceil(min_bucket * growth ** len(lengths) - 1e-9)))
    return np.asarray(lengths, np.int64)


def episodes_per_batch(length: int, batch_steps: int, multiple_of: int = 1) -> int:
    """B for a bucket of ``length`` steps: the largest power of two with at most
    ``batch_steps`` cells (at least 1), rounded up to a multiple of ``multiple_of``. Powers of
    two let a bucket's last batch shrink by halves (``Bucketer._tail_batch``)."""
    episodes = 1 << max(0, (batch_steps // length).bit_length() - 1)
    return -(-episodes // multiple_of) * multiple_of


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


def first_rows(batch: PaddedBatch, rows: int) -> PaddedBatch:
    """Rows ``:rows`` of ``batch`` as views (still 64-byte aligned: same start)."""
    return map_arrays(lambda values: values[:rows], batch)


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
                    yield self._emit(open_batch, batch)

    def flush(self) -> Iterator[PaddedBatch]:
        """Yields the remaining, partly filled batches (filler rows masked out)."""
        for length in sorted(self._open):
            open_batch = self._open.pop(length)
            batch = episodes_per_batch(length, self.batching.batch_steps, self.multiple_of)
            yield self._emit(open_batch, self._tail_batch(batch, open_batch.rows))

    def _tail_batch(self, batch: int, episodes: int) -> int:
        """Rows for a bucket's last, partial batch: the full size halved while the episodes
        still fit, so a nearly empty bucket does not pay for a full batch of filler rows."""
        rows = batch
        while rows % 2 == 0 and rows // 2 >= episodes and (rows // 2) % self.multiple_of == 0:
            rows //= 2
        return rows

    def _emit(self, open_batch: _OpenBatch, rows: int) -> PaddedBatch:
        """The first ``rows`` rows of a filled (or final) batch, counted in the statistics."""
        padded = open_batch.batch
        if rows < padded.shape[0]:
            padded = first_rows(padded, rows)
        self.real_steps += open_batch.steps
        self.padded_steps += padded.shape[0] * padded.shape[1]
        self.shapes.add(padded.shape)
        return padded
