"""``.npz`` checkpoints: the arrays read (local or at a URI) and checked, then turned into
a Policy of one of the kinds tabular, linear_softmax, mlp_softmax, linear_gaussian."""

from __future__ import annotations

import io
import zipfile
from pathlib import Path

import numpy as np

import ope_cli.data.sources.remote as remote
from ope_cli.errors import PolicyError
from ope_cli.models.policies.base import Policy
from ope_cli.models.policies.functions import (
    _mlp_log_prob,
    _mlp_logits,
    linear_gaussian_log_prob,
    linear_gaussian_sample,
    linear_softmax_log_prob,
    linear_softmax_logits,
    tabular_log_prob,
    tabular_logits,
)


def checked_array(arrays: dict[str, np.ndarray], key: str, ndim: int, path: str) -> np.ndarray:
    if key not in arrays:
        raise PolicyError(
            f"{path}: checkpoint has no array {key!r} (has: {', '.join(sorted(arrays))})"
        )
    value = arrays[key]
    if value.dtype.kind not in "fiu":
        raise PolicyError(f"{path}: array {key!r} has dtype {value.dtype}, expected numbers")
    if value.ndim != ndim:
        raise PolicyError(
            f"{path}: array {key!r} has shape {value.shape}, expected {ndim} dimension(s)"
        )
    if 0 in value.shape:  # no actions, states or features: nothing to evaluate with
        raise PolicyError(f"{path}: array {key!r} has shape {value.shape}, with no entries")
    if not np.isfinite(value).all():
        raise PolicyError(f"{path}: array {key!r} holds NaN or infinite values")
    return value.astype(np.float64)


def check_size(path: str, what: str, expected: int, key: str, actual: int) -> None:
    if expected != actual:
        raise PolicyError(f"{path}: {what}: {key!r} has size {actual}, expected {expected}")


def read_archive(path: str) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file, local or at a URI (object storage); PolicyError when
    it is missing or unreadable."""
    source: str | io.BytesIO = path
    if remote.is_uri(path):
        source = io.BytesIO(remote.read_bytes(path, PolicyError))
        if not zipfile.is_zipfile(source):
            raise PolicyError(f"{path}: not a readable .npz checkpoint (not a zip archive)")
    elif Path(path).is_file() and not zipfile.is_zipfile(path):
        raise PolicyError(f"{path}: not a readable .npz checkpoint (not a zip archive)")
    try:
        with np.load(source, allow_pickle=False) as archive:
            return {key: archive[key] for key in archive.files}
    except FileNotFoundError:
        raise PolicyError(f"{path}: no such checkpoint file") from None
    except ValueError as error:
        if "allow_pickle" in str(error):
            raise PolicyError(
                f"{path}: checkpoint holds pickled Python objects, which are not loaded "
                "(save plain numeric arrays and a string 'kind')"
            ) from None
        raise PolicyError(f"{path}: not a readable .npz checkpoint ({error})") from None
    except (OSError, zipfile.BadZipFile, EOFError) as error:
        raise PolicyError(f"{path}: not a readable .npz checkpoint ({error})") from None


def text(value) -> str:
    """A checkpoint's string array (``kind``, ``activation``) as text, bytes decoded: a
    ``np.array(b"relu")`` was read as "b'relu'" and refused as unknown."""
    value = np.asarray(value)
    item = value.item() if value.ndim == 0 else value
    return item.decode("utf-8", "replace") if isinstance(item, bytes) else str(item)


def _tabular(path: str, kind: str, arrays: dict[str, np.ndarray]) -> Policy:
    logits = checked_array(arrays, "logits", 2, path)
    return Policy(
        path,
        kind,
        {"logits": logits},
        (),
        tabular_log_prob,
        discrete=True,
        n_states=logits.shape[0],
        n_actions=logits.shape[1],
        logits=tabular_logits,
    )


def _linear_softmax(path: str, kind: str, arrays: dict[str, np.ndarray]) -> Policy:
    weight, bias = checked_array(arrays, "weight", 2, path), checked_array(arrays, "bias", 1, path)
    check_size(path, "bias must match weight's columns", weight.shape[1], "bias", bias.shape[0])
    temperature = (
        checked_array(arrays, "temperature", 0, path) if "temperature" in arrays else np.float64(1)
    )
    if not temperature > 0:
        raise PolicyError(f"{path}: temperature must be > 0, got {float(temperature)}")
    params = {"weight": weight, "bias": bias, "temperature": np.asarray(temperature)}
    return Policy(
        path,
        kind,
        params,
        (),
        linear_softmax_log_prob,
        discrete=True,
        obs_dim=weight.shape[0],
        n_actions=weight.shape[1],
        logits=linear_softmax_logits,
    )


def mlp_layers(path: str, kind: str, arrays: dict[str, np.ndarray]):
    """(params, activation) of an MLP checkpoint's ``weight_i``/``bias_i`` layers and
    optional ``activation``, checked layer by layer; raises PolicyError."""
    activation = text(arrays.pop("activation", "tanh"))
    if activation not in ("tanh", "relu"):
        raise PolicyError(f"{path}: activation {activation!r} is not one of tanh, relu")
    layers = sum(1 for key in arrays if key.startswith("weight_"))
    if layers == 0:
        raise PolicyError(f"{path}: {kind} checkpoint has no 'weight_0' array")
    params = {}
    width = None
    for i in range(layers):
        weight = checked_array(arrays, f"weight_{i}", 2, path)
        bias = checked_array(arrays, f"bias_{i}", 1, path)
        if width is not None:
            check_size(
                path,
                f"layer {i} input must match layer {i - 1} output",
                width,
                f"weight_{i}",
                weight.shape[0],
            )
        check_size(path, f"layer {i}", weight.shape[1], f"bias_{i}", bias.shape[0])
        width = weight.shape[1]
        params[f"weight_{i}"], params[f"bias_{i}"] = weight, bias
    return params, activation


def _mlp_softmax(path: str, kind: str, arrays: dict[str, np.ndarray]) -> Policy:
    params, activation = mlp_layers(path, kind, arrays)
    return Policy(
        path,
        kind,
        params,
        (activation,),
        _mlp_log_prob(activation),
        discrete=True,
        obs_dim=params["weight_0"].shape[0],
        n_actions=params[f"bias_{len(params) // 2 - 1}"].shape[0],
        logits=_mlp_logits(activation),
    )


def _linear_gaussian(path: str, kind: str, arrays: dict[str, np.ndarray]) -> Policy:
    weight, bias = checked_array(arrays, "weight", 2, path), checked_array(arrays, "bias", 1, path)
    log_std = checked_array(arrays, "log_std", 1, path)
    check_size(path, "bias must match weight's columns", weight.shape[1], "bias", bias.shape[0])
    check_size(
        path,
        "log_std must match weight's columns",
        weight.shape[1],
        "log_std",
        log_std.shape[0],
    )
    return Policy(
        path,
        kind,
        {"weight": weight, "bias": bias, "log_std": log_std},
        (),
        linear_gaussian_log_prob,
        discrete=False,
        obs_dim=weight.shape[0],
        act_dim=weight.shape[1],
        sample=linear_gaussian_sample,
    )


_CHECKPOINT_KINDS = {
    "tabular": _tabular,
    "linear_softmax": _linear_softmax,
    "mlp_softmax": _mlp_softmax,
    "linear_gaussian": _linear_gaussian,
}


def load_checkpoint(path: str) -> Policy:
    """Reads an ``.npz`` checkpoint of the spec's kinds; raises PolicyError."""
    return checkpoint_policy(path, read_archive(path))


def checkpoint_policy(path: str, arrays: dict[str, np.ndarray]) -> Policy:
    """The policy of checkpoint arrays (a string ``kind`` and its parameters), checked as a
    file's would be; ``path`` names it in messages. Raises PolicyError."""
    arrays = dict(arrays)
    if "kind" not in arrays:
        raise PolicyError(
            f"{path}: checkpoint has no 'kind' array (one of tabular, linear_softmax, "
            "mlp_softmax, linear_gaussian)"
        )
    kind = text(arrays.pop("kind"))
    if kind not in _CHECKPOINT_KINDS:
        raise PolicyError(
            f"{path}: unknown checkpoint kind {kind!r} (expected tabular, linear_softmax, "
            "mlp_softmax or linear_gaussian)"
        )
    policy = _CHECKPOINT_KINDS[kind](path, kind, arrays)
    refuse_unread(path, kind, arrays, policy.params)
    return policy


def refuse_unread(path: str, kind: str, arrays: dict, read: dict) -> None:
    """A PolicyError when the checkpoint holds arrays its kind does not read (besides
    ``kind``; an MLP's ``activation`` is taken out as it is read): a misspelt
    'temprature', observation statistics the policy was trained with, or an activation
    beside a linear policy would leave another policy evaluated than the file describes."""
    unread = sorted(set(arrays) - set(read) - {"kind"})
    if unread:
        raise PolicyError(
            f"{path}: a {kind} checkpoint holds arrays it does not read: "
            f"{', '.join(unread)} (it reads {', '.join(sorted(read))}); remove or rename them"
        )
