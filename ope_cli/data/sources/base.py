"""What every source yields and promises: record batches with their provenance, the
bounds data may declare, and the ``Dataset`` protocol the pipeline reads through."""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Iterator
from typing import Protocol

import pyarrow as pa

from ope_cli.errors import DataError

# Schema metadata in which data declares the bounds that ``--ci betting`` relies on and the
# discount its returns are meant with.
METADATA_KEY = "ope"


@dataclasses.dataclass(frozen=True)
class SourcedBatch:
    """A record batch and where it came from (so errors can say where): its file, the row
    of that file it starts at, and whether it is the file's last batch (which ends the
    file's episodes)."""

    file: str
    batch: pa.RecordBatch
    last_in_file: bool
    row_offset: int = 0


def is_reward_range(low: float, high: float) -> bool:
    """Whether [low, high] can bound rewards: finite, and low < high."""
    return math.isfinite(low) and math.isfinite(high) and low < high


@dataclasses.dataclass(frozen=True)
class DeclaredBounds:
    """What the data says about every possible episode: rewards in [low, high], at most
    ``horizon`` steps, and the discount ``gamma`` its returns are meant with (None: not
    declared)."""

    reward_range: tuple[float, float] | None = None
    horizon: int | None = None
    gamma: float | None = None


class _Undeclarable(ValueError):
    """A metadata key whose value is not what the key takes: what it declares, and why not."""

    @classmethod
    def value(cls, key: str, value: object, takes: str) -> _Undeclarable:
        return cls(f"{key} {json.dumps(value)}, where it takes {takes}")


def _number(value: object) -> float:
    """A JSON number as a float; NaN for anything else (a boolean, a string, null), which
    no key takes."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return math.nan
    try:
        return float(value)
    except OverflowError:  # an integer beyond float64 (JSON has no bound on them)
        return math.inf


def _declared_reward_range(value: object) -> tuple[float, float] | None:
    if value is None:
        return None
    try:
        low, high = (_number(x) for x in value)
    except (ValueError, TypeError):  # not a pair
        low = high = math.nan
    if not is_reward_range(low, high):
        raise _Undeclarable.value("reward_range", value, "[low, high]: finite numbers, low < high")
    return low, high


def _declared_horizon(value: object) -> int | None:
    steps = None if value is None else _number(value)
    if steps is not None and not (math.isfinite(steps) and steps.is_integer() and steps >= 1):
        raise _Undeclarable.value("horizon", value, "a whole number of steps, at least 1")
    return None if steps is None else int(steps)


def _declared_gamma(value: object) -> float | None:
    """The declared discount in [0, 1] (-0.0 read as 0.0, which every output prints as 0)."""
    gamma = None if value is None else _number(value)
    if gamma is not None and not 0.0 <= gamma <= 1.0:
        raise _Undeclarable.value("gamma", value, "a number in [0, 1]")
    return None if gamma is None else gamma + 0.0


def _unique_keys(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object's dict; a key given twice is refused (json keeps the last silently:
    {"gamma": 0.9, "gamma": 0.5} declared 0.5)."""
    keys = [key for key, _ in pairs]
    for key in keys:
        if keys.count(key) > 1:
            raise _Undeclarable(
                f"{key!r} twice (json would keep the last silently); declare it once"
            )
    return dict(pairs)


def declared_bounds(schema: pa.Schema, source: str) -> DeclaredBounds:
    """The reward range, horizon and discount declared in ``schema``'s metadata (key
    METADATA_KEY, a JSON object with "reward_range": [low, high], "horizon": steps and
    "gamma": a number in [0, 1], each optional)."""
    raw = (schema.metadata or {}).get(METADATA_KEY.encode())
    if raw is None:
        return DeclaredBounds()
    try:
        declared = json.loads(raw, object_pairs_hook=_unique_keys)
        if not isinstance(declared, dict):
            raise ValueError
        return DeclaredBounds(
            _declared_reward_range(declared.get("reward_range")),
            _declared_horizon(declared.get("horizon")),
            _declared_gamma(declared.get("gamma")),
        )
    except _Undeclarable as bad:
        raise DataError(f"{source}: schema metadata {METADATA_KEY!r} declares {bad}") from None
    except ValueError:
        text = raw[:80].decode("utf-8", "replace")
        raise DataError(
            f"{source}: schema metadata {METADATA_KEY!r} must be a JSON object "
            f'like {{"reward_range": [0, 1], "horizon": 100, "gamma": 0.99}}, got {text}'
        ) from None


class Dataset(Protocol):
    """An ordered list of files read as one dataset; what the pipeline needs of a source."""

    source: str  # what the user passed
    files: tuple[str, ...]  # data files in read order
    format: str  # the registry name of the format

    @property
    def schema(self) -> pa.Schema: ...

    def declared_bounds(self) -> DeclaredBounds: ...

    def restrict(self, files: tuple[str, ...]) -> Dataset:
        """The same dataset (schema, partitioning) over a subset of its files."""
        ...

    def count_rows(self) -> int | None:
        """Total rows when cheap to know (for progress), else None."""
        ...

    def iter_batches(self, columns: list[str], rows: int) -> Iterator[SourcedBatch]:
        """Record batches of at most ``rows`` rows of ``columns``, file by file, in order;
        each file's last batch (possibly empty) has ``last_in_file``."""
        ...
