"""Episode ids: stable uint64 keys (hashes of integer or string ids, the same in every
process and run), display values, the tracking of ids that reappear, the resampling groups
and the folds of episodes by id hash (cross-fitting, held-out sets)."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from ope_cli.errors import InvalidValueError, where


def display_id(value: object) -> object:
    """An id as reports show it: a NumPy scalar becomes its Python value."""
    return value.item() if isinstance(value, np.generic) else value


_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def mix64(values: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser: a fixed, well-spread bijection on uint64 ([n] -> [n])."""
    with np.errstate(over="ignore"):
        z = values.astype(np.uint64) + _GOLDEN
        z = (z ^ (z >> np.uint64(30))) * _MIX_1
        z = (z ^ (z >> np.uint64(27))) * _MIX_2
        return z ^ (z >> np.uint64(31))


def hash_strings(array: pa.Array) -> np.ndarray:
    """[n] uint64 hashes of a string array's UTF-8 bytes, computed without a Python loop."""
    array = pc.cast(array, pa.large_string()) if not pa.types.is_large_string(array.type) else array
    _, offsets_buffer, data_buffer = array.buffers()
    offsets = np.frombuffer(offsets_buffer, np.int64)[array.offset : array.offset + len(array) + 1]
    data = (
        np.frombuffer(data_buffer, np.uint8) if data_buffer is not None else np.zeros(0, np.uint8)
    )
    lengths = np.diff(offsets)
    starts = offsets[:-1]
    total = int(lengths.sum())
    hashes = np.zeros(len(array), np.uint64)
    if total:
        row = np.repeat(np.arange(len(array)), lengths)
        position = np.arange(total) - np.repeat(starts - starts[0], lengths)
        byte_index = np.repeat(starts, lengths) + position
        with np.errstate(over="ignore"):
            powers = np.cumprod(np.full(int(lengths.max()), 1099511628211, np.uint64))
            terms = (data[byte_index].astype(np.uint64) + np.uint64(1)) * powers[position]
        np.add.at(hashes, row, terms)
    return mix64(hashes ^ mix64(lengths.astype(np.uint64)))


def id_keys(ids: np.ndarray | pa.Array) -> np.ndarray:
    """[n] uint64 keys of episode ids (integers or strings)."""
    if isinstance(ids, pa.Array) and (
        pa.types.is_string(ids.type)
        or pa.types.is_large_string(ids.type)
        or pa.types.is_string_view(ids.type)
    ):
        return hash_strings(ids)
    return mix64(np.asarray(ids).astype(np.int64).view(np.uint64))


RESAMPLING_GROUPS = 32  # episodes are hashed into this many groups for the grouped jackknife
_FOLD_SALT = 0x6F70652D  # "ope-": folds do not follow the order of the ids


def fold_index(key_hi, key_lo, folds: int, xp=np):
    """[E] int32 fold in [0, folds) of episodes from the uint32 halves of their id keys
    ([E] each): murmur3's 32-bit finaliser of the mixed halves, modulo ``folds``. Written
    for ``xp`` = numpy (the fitting pass) or jax.numpy (the kernel, per episode of a padded
    batch), so both assign every episode the same fold."""
    h = key_hi ^ (key_lo * xp.uint32(0x9E3779B9)) ^ xp.uint32(_FOLD_SALT)
    h = h ^ (h >> 16)
    h = h * xp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    h = h * xp.uint32(0xC2B2AE35)
    h = h ^ (h >> 16)
    return (h % xp.uint32(folds)).astype(xp.int32)


def episode_folds(keys: np.ndarray, folds: int) -> np.ndarray:
    """[E] fold index in [0, folds) of each episode key ([E] uint64): a hash of the id, the
    same in every run, batching, device and process (``fold_index`` of the key's halves)."""
    if folds <= 1:
        return np.zeros(keys.shape, np.int64)
    keys = np.asarray(keys, np.uint64)
    hi = (keys >> np.uint64(32)).astype(np.uint32)
    lo = (keys & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    with np.errstate(over="ignore"):
        return fold_index(hi, lo, folds).astype(np.int64)


def run_starts(keys: np.ndarray, ids: np.ndarray | None = None) -> np.ndarray:
    """[k] the rows where a run of equal keys starts in ``keys`` ([n], n > 0): each
    episode's first row in the step layout. String ``ids`` ([n] object) are compared too:
    two ids whose hashes collide are two episodes, not one (integer keys cannot collide:
    ``mix64`` is a bijection)."""
    change = keys[1:] != keys[:-1]
    if ids is not None and ids.dtype == object:
        change |= ids[1:] != ids[:-1]
    return np.concatenate([[0], np.flatnonzero(change) + 1])


REAPPEARS = (
    "episode id appears in more than one place (its rows must be contiguous within one file)"
)


class SeenKeys:
    """Episode keys seen so far, to catch an episode id that reappears (non-contiguous
    rows, or an episode split over files), and the file each was first seen in. 12 bytes
    per episode; each check is a binary search in two sorted arrays: all keys but the
    latest (``_sorted``) and the latest (``_recent``, merged into ``_sorted`` once it
    outgrows sqrt(seen x added), which keeps the copying of both merges small)."""

    def __init__(self) -> None:
        self._sorted, self._sorted_file = _no_keys()
        self._recent, self._recent_file = _no_keys()
        self._files: dict[str, int] = {}  # file -> its index in the *_file arrays
        self._kinds: dict[str, str] = {}  # file -> its ids' dtype kind (signed, unsigned ...)

    def add(
        self, file: str, keys: np.ndarray, ids: np.ndarray, raise_error: bool = True
    ) -> np.ndarray | None:
        """Records the episodes' keys ([E] uint64). An id seen before (or twice here) is a
        DataError, or without ``raise_error`` flagged in the returned [E] bool (None: none)."""
        order = np.argsort(keys)
        ordered = keys[order]  # sorted: the searches below walk the arrays in order
        repeated = None
        if ordered.size > 1 and (ordered[1:] == ordered[:-1]).any():
            unique, first_index, counts = np.unique(keys, return_index=True, return_counts=True)
            if raise_error:
                self._fail(file, ids[int(first_index[np.argmax(counts > 1)])], file)
            repeated = np.ones(keys.shape, bool)
            repeated[first_index] = False
            ordered = unique
        found = _found_in(self._sorted, ordered) | _found_in(self._recent, ordered)
        if found.any():
            if repeated is None:
                seen = np.empty(keys.shape, bool)
                seen[order] = found
            else:
                seen = np.isin(keys, ordered[found])
            if raise_error:
                first = int(np.argmax(seen))
                first_file = self.first_file(keys[first])
                twin = self._kinds.get(first_file) not in (None, np.asarray(ids).dtype.kind)
                self._fail(file, ids[first], first_file, twin)
            repeated = seen if repeated is None else repeated | seen
            ordered = ordered[~found]  # each key once: all_keys() counts processes per key
        index = self._files.setdefault(file, len(self._files))
        self._kinds.setdefault(file, np.asarray(ids).dtype.kind)
        added = (ordered, np.full(ordered.size, index, np.uint32))
        self._recent, self._recent_file = _merged((self._recent, self._recent_file), added)
        if self._recent.size > max(4096, math.isqrt(self._sorted.size * ordered.size)):
            self._sorted, self._sorted_file = _merged(
                (self._sorted, self._sorted_file), (self._recent, self._recent_file)
            )
            self._recent, self._recent_file = _no_keys()
        return None if repeated is None else np.flatnonzero(repeated)

    def all_keys(self) -> np.ndarray:
        """[E] sorted uint64 keys of every episode seen."""
        return np.sort(np.concatenate([self._sorted, self._recent]), kind="stable")

    def first_file(self, key: np.uint64) -> str:
        """The file where ``key`` (seen before) was first seen."""
        names = list(self._files)
        for keys, files in ((self._sorted, self._sorted_file), (self._recent, self._recent_file)):
            position = int(np.searchsorted(keys, key))
            if position < keys.size and keys[position] == key:
                return names[int(files[position])]
        raise AssertionError("a key reported as seen is not among the seen keys")

    @staticmethod
    def _fail(file: str, episode_id: object, first_file: str, twin: bool = False) -> None:
        """``twin``: the first file's ids are of another kind (int64, uint64)."""
        where_first = "earlier in this file" if first_file == file else f"first in {first_file}"
        note = _twin_note(episode_id) if twin else ""
        raise InvalidValueError(
            f"{where(file, display_id(episode_id))}{REAPPEARS}; seen {where_first}{note}",
            False,
        )


def _twin_note(episode_id: object) -> str:
    """For an integer id whose 64-bit twin of the other signedness is another id (-1 in an
    int64 column, 2**64 - 1 in a uint64 one: one key), the words that say they were taken
    as one."""
    if not isinstance(episode_id, int | np.integer):
        return ""
    value = int(episode_id)
    if 0 <= value < 2**63:
        return ""
    twin = value + 2**64 if value < 0 else value - 2**64
    return f" (ids are compared as 64-bit integers: {value} and {twin} are one id)"


def _no_keys() -> tuple[np.ndarray, np.ndarray]:
    """(keys, file indices) of no episode."""
    return np.zeros(0, np.uint64), np.zeros(0, np.uint32)


def _found_in(sorted_keys: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """[E] bool: whether each of ``keys`` is in ``sorted_keys`` (sorted uint64)."""
    if not sorted_keys.size:
        return np.zeros(keys.shape, bool)
    position = np.searchsorted(sorted_keys, keys).clip(max=sorted_keys.size - 1)
    return sorted_keys[position] == keys


def _merged(
    first: tuple[np.ndarray, np.ndarray], second: tuple[np.ndarray, np.ndarray]
) -> tuple[np.ndarray, np.ndarray]:
    """(keys, file indices) of two such pairs, each sorted by key, in one sorted pair (a
    stable sort of two sorted runs is a linear merge)."""
    keys = np.concatenate([first[0], second[0]])
    order = np.argsort(keys, kind="stable")
    return keys[order], np.concatenate([first[1], second[1]])[order]


def locate_key(key: int, step: int, chunks) -> str:
    """The location prefix (file, episode, step) of the episode of ``key`` among ``chunks``
    (EpisodeChunks, e.g. a second read of the data on an error path); "" when absent."""
    for chunk in chunks:
        match = np.flatnonzero(chunk.keys == np.uint64(key))
        if match.size:
            return where(chunk.file, display_id(chunk.ids[int(match[0])]), step)
    return ""
