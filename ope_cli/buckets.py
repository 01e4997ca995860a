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

import numpy as np

from ope_cli.config import BatchingConfig
from ope_cli.episodes import EpisodeChunk

RESAMPLING_GROUPS = 32  # episodes are hashed into this many groups for the grouped jackknife


@dataclasses.dataclass(frozen=True)
class PaddedBatch:
    """B episodes of one bucket, padded to T steps. Padding is absorbing: no reward, ratio 1.

    Attributes:
      observation: [B, T] (index or scalar) or [B, T, obs_dim]; None when not read.
      action: [B, T] int64 (discrete) or [B, T, act_dim] float64.
      reward: [B, T] float64, 0 on padding.
      log_behavior: [B, T] float64 log pi_b(a|s), 0 on padding.
      log_target: [B, T] float64 logged log pi_e(a|s), 0 on padding; None when not logged.
      step_mask: [B, T] bool, True on real steps.
      episode_mask: [B] bool, True on real episodes (False on rows that only fill the batch).
      group: [B] int32 resampling group of each episode, from its id.
      key_hi, key_lo: [B] uint32 halves of each episode's id hash (bootstrap streams).
    """

    observation: np.ndarray | None
    action: np.ndarray
    reward: np.ndarray
    log_behavior: np.ndarray
    log_target: np.ndarray | None
    step_mask: np.ndarray
    episode_mask: np.ndarray
    group: np.ndarray
    key_hi: np.ndarray
    key_lo: np.ndarray

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


def take_episodes(chunk: EpisodeChunk, episodes: np.ndarray) -> EpisodeChunk:
    """The sub-chunk of the given episode indices ([k] int), steps gathered in one go."""
    offsets = chunk.offsets
    lengths = chunk.lengths[episodes]
    rows = np.repeat(offsets[episodes], lengths) + (
        np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    )

    def rows_of(array: np.ndarray | None) -> np.ndarray | None:
        return None if array is None else array[rows]

    return dataclasses.replace(
        chunk,
        ids=chunk.ids[episodes],
        keys=chunk.keys[episodes],
        lengths=lengths,
        observation=rows_of(chunk.observation),
        action=rows_of(chunk.action),
        reward=rows_of(chunk.reward),
        log_behavior=rows_of(chunk.log_behavior),
        log_target=rows_of(chunk.log_target),
    )


def slice_episodes(chunk: EpisodeChunk, start: int, stop: int) -> EpisodeChunk:
    """Episodes ``start:stop`` of ``chunk`` as views (no copy)."""
    offsets = chunk.offsets
    first, last = int(offsets[start]), int(offsets[stop])

    def rows_of(array: np.ndarray | None) -> np.ndarray | None:
        return None if array is None else array[first:last]

    return dataclasses.replace(
        chunk,
        ids=chunk.ids[start:stop],
        keys=chunk.keys[start:stop],
        lengths=chunk.lengths[start:stop],
        observation=rows_of(chunk.observation),
        action=rows_of(chunk.action),
        reward=rows_of(chunk.reward),
        log_behavior=rows_of(chunk.log_behavior),
        log_target=rows_of(chunk.log_target),
    )


def concat_chunks(chunks: list[EpisodeChunk]) -> EpisodeChunk:
    """One chunk holding the episodes of ``chunks`` in order (file of the first)."""
    if len(chunks) == 1:
        return chunks[0]

    def joined(name: str) -> np.ndarray | None:
        parts = [getattr(c, name) for c in chunks]
        return None if parts[0] is None else np.concatenate(parts)

    return dataclasses.replace(chunks[0], **{
        name: joined(name)
        for name in ("ids", "keys", "lengths", "observation", "action", "reward", "log_behavior",
                     "log_target")
    })


def pad(chunk: EpisodeChunk, length: int, batch: int, start: int = 0, stop: int | None = None
        ) -> PaddedBatch:
    """Pads episodes ``start:stop`` of ``chunk`` (<= ``batch`` of them, each <= ``length``
    steps) into a [batch, length] PaddedBatch, scattering straight from the chunk's arrays."""
    stop = chunk.num_episodes if stop is None else stop
    offsets = chunk.offsets
    lengths = chunk.lengths[start:stop]
    keys = chunk.keys[start:stop]
    first, last = int(offsets[start]), int(offsets[stop])
    episode_of_row = np.repeat(np.arange(lengths.size), lengths)
    time_of_row = np.arange(last - first) - np.repeat(offsets[start:stop] - first, lengths)

    def padded(values: np.ndarray | None) -> np.ndarray | None:
        if values is None:
            return None
        out = _zeros((batch, length, *values.shape[1:]), values.dtype)
        out[episode_of_row, time_of_row] = values[first:last]
        return out

    step_mask = _zeros((batch, length), bool)
    step_mask[episode_of_row, time_of_row] = True
    episode_mask = np.zeros(batch, bool)
    episode_mask[: lengths.size] = True
    group = np.zeros(batch, np.int32)
    group[: lengths.size] = (keys % np.uint64(RESAMPLING_GROUPS)).astype(np.int32)
    key_hi = np.zeros(batch, np.uint32)
    key_lo = np.zeros(batch, np.uint32)
    key_hi[: lengths.size] = (keys >> np.uint64(32)).astype(np.uint32)
    key_lo[: lengths.size] = (keys & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    return PaddedBatch(
        observation=padded(chunk.observation),
        action=padded(chunk.action),
        reward=padded(chunk.reward),
        log_behavior=padded(chunk.log_behavior),
        log_target=padded(chunk.log_target),
        step_mask=step_mask,
        episode_mask=episode_mask,
        group=group,
        key_hi=key_hi,
        key_lo=key_lo,
    )


class Bucketer:
    """Collects episodes per length bucket and emits full fixed-shape batches.

    Attributes (for reports): ``real_steps`` and ``padded_steps`` (cells of emitted
    batches, filler rows included) and ``shapes`` (the distinct [B, T] shapes emitted).
    """

    def __init__(self, batching: BatchingConfig, multiple_of: int = 1):
        self.batching = batching
        self.multiple_of = multiple_of
        self._lengths = bucket_lengths_upto(1, batching.min_bucket, batching.bucket_growth)
        self._pending: dict[int, list[EpisodeChunk]] = {}
        self._pending_count: dict[int, int] = {}
        self.real_steps = 0
        self.padded_steps = 0
        self.shapes: set[tuple[int, int]] = set()

    def add(self, chunk: EpisodeChunk) -> Iterator[PaddedBatch]:
        """Files the chunk's episodes into buckets; yields every batch that became full."""
        longest = int(chunk.lengths.max())
        if longest > self._lengths[-1]:
            self._lengths = bucket_lengths_upto(longest, self.batching.min_bucket, self.batching.bucket_growth)
        bucket_of = np.searchsorted(self._lengths, chunk.lengths, side="left")
        for bucket in np.unique(bucket_of):
            length = int(self._lengths[bucket])
            members = np.flatnonzero(bucket_of == bucket)
            # A gathered copy, not a view: a view would keep the whole chunk alive for as
            # long as a slow-filling bucket (long episodes are rare) holds its few episodes,
            # and memory would grow with the data.
            part = chunk if members.size == chunk.num_episodes else take_episodes(chunk, members)
            self._pending.setdefault(length, []).append(part)
            self._pending_count[length] = self._pending_count.get(length, 0) + members.size
            yield from self._drain(length, final=False)

    def flush(self) -> Iterator[PaddedBatch]:
        """Yields the remaining, partly filled batches (filler rows masked out)."""
        for length in sorted(self._pending):
            yield from self._drain(length, final=True)

    def _tail_batch(self, batch: int, episodes: int) -> int:
        """Rows for a bucket's last, partial batch: the full size halved while the episodes
        still fit, so a nearly empty bucket does not pay for a full batch of filler rows."""
        rows = batch
        while rows % 2 == 0 and rows // 2 >= episodes and (rows // 2) % self.multiple_of == 0:
            rows //= 2
        return rows

    def _drain(self, length: int, final: bool) -> Iterator[PaddedBatch]:
        batch = episodes_per_batch(length, self.batching.batch_steps, self.multiple_of)
        count = self._pending_count.get(length, 0)
        if count == 0 or (count < batch and not final):
            return
        pending = concat_chunks(self._pending.pop(length))
        self._pending_count[length] = 0
        start = 0
        while count - start >= batch or (final and start < count):
            stop = min(start + batch, count)
            rows = batch if stop - start == batch else self._tail_batch(batch, stop - start)
            padded = pad(pending, length, rows, start, stop)
            self.real_steps += int(pending.offsets[stop] - pending.offsets[start])
            self.padded_steps += rows * length
            self.shapes.add((rows, length))
            yield padded
            start = stop
        if start < count:
            self._pending[length] = [slice_episodes(pending, start, count)]
            self._pending_count[length] = count - start
