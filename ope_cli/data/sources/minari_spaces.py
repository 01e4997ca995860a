"""Minari's serialised gymnasium spaces: the leaves of Dict and Tuple observations in the
order of ``gymnasium.spaces.flatten``, and that flattening done on [K, ...] arrays of rows
(Box and MultiBinary reshaped, Discrete and MultiDiscrete one-hot), without gymnasium."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from ope_cli.data.sources.minari_storage import Leaf
from ope_cli.errors import DataError


def space_leaves(space: dict, path: str, member) -> list[tuple[str, dict]]:
    """(leaf path, space) of every leaf of ``space``, in gymnasium.spaces.flatten order."""
    if space["type"] == "Dict":
        return [
            leaf
            for key, sub in space["subspaces"].items()
            for leaf in space_leaves(sub, f"{path}/{key}", member)
        ]
    if space["type"] == "Tuple":
        return [
            leaf
            for i, sub in enumerate(space["subspaces"])
            for leaf in space_leaves(sub, f"{path}/{member(i)}", member)
        ]
    return [(path, space)]


def flat_size(space: dict) -> int:
    """The length of gymnasium.spaces.flatten of one value of a leaf space."""
    kind = space["type"]
    if kind == "Box":
        return int(np.prod(space["shape"], dtype=np.int64))
    if kind == "Discrete":
        return int(space["n"])
    if kind == "MultiBinary":
        return int(np.prod(space["n"], dtype=np.int64))
    if kind == "MultiDiscrete":
        return int(np.sum(space["nvec"]))
    raise DataError(f"a {kind} observation space cannot be flattened into numbers")


def flatten(values: np.ndarray, space: dict) -> np.ndarray:
    """[K, ...] values of one leaf -> [K, size] float64, as gymnasium.spaces.flatten."""
    k = values.shape[0]
    kind = space["type"]
    if kind in ("Box", "MultiBinary"):
        return values.reshape(k, -1).astype(np.float64)
    out = np.zeros((k, flat_size(space)), np.float64)
    if kind == "Discrete":
        out[np.arange(k), values.reshape(k) - int(space.get("start", 0))] = 1.0
        return out
    nvec = np.asarray(space["nvec"]).reshape(-1)
    start = np.asarray(space.get("start", np.zeros_like(nvec))).reshape(-1)
    offsets = np.concatenate([[0], np.cumsum(nvec)[:-1]])
    out[np.arange(k)[:, None], values.reshape(k, -1) - start + offsets] = 1.0
    return out


def arrow_type(leaf: Leaf) -> pa.DataType | None:
    """One row's Arrow type ([K] -> a number, [K, ...] -> a fixed-size list of the flattened
    row); None for values that are not numbers or booleans."""
    if not (np.issubdtype(leaf.dtype, np.number) or leaf.dtype == np.bool_):
        return None
    value = pa.from_numpy_dtype(leaf.dtype)
    if not leaf.shape:
        return value
    return pa.list_(value, int(np.prod(leaf.shape)))
