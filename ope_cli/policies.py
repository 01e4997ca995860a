"""Evaluation policies: ``.npz`` checkpoints, ``module:name`` entry points, logged targets.

Every policy becomes a per-step function ``log_prob(params, observation, action) -> []``
written for one step; the kernel vmaps it over steps, episodes and (for stacked
checkpoints) policies. Checkpoints of the same kind and shapes share one function
and are stacked along a leading policy axis.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import importlib
import io
import math
import os
import sys
import zipfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

import ope_cli.sources.remote as remote
from ope_cli.errors import DataError, PolicyError
from ope_cli.validate import Check

LogProbFn = Callable[[Any, Any, Any], Any]
SampleFn = Callable[[Any, Any, Any], Any]  # (params, key, observation) -> one action
LOGGED = "logged target probabilities"


@dataclasses.dataclass(frozen=True)
class Policy:
    """One evaluation policy.

    Attributes:
      name: as given on the command line (the report's ``policy`` field).
      kind: checkpoint kind, ``entry_point`` or ``logged``.
      params: dict of parameter arrays (checkpoints), else None.
      static: hashable settings that select the function (e.g. the MLP activation).
      log_prob: per-step ``(params, observation, action) -> log pi(a|s)``; None for logged.
      discrete: whether the policy is over integer actions (None: unknown, entry points).
      n_actions, n_states, obs_dim, act_dim: sizes to check the data against (None: unknown).
      actions_checked: False when nothing bounds the logged discrete actions this policy is
        given (an entry point that declares no ``n_actions``): JAX's gather clamps an index
        out of range instead of failing, so the report says they are unchecked.
      folds: 1, or the K folds of a cross-fitted behavior model (params [K, ...]).
      sample: per-step ``(params, key, observation) -> action`` drawing from the policy
        (continuous policies that can sample: ``linear_gaussian``, entry points with a
        ``sample(key, observation)`` method); None when it cannot.
    """

    name: str
    kind: str
    params: dict[str, np.ndarray] | None
    static: tuple
    log_prob: LogProbFn | None
    discrete: bool | None = None
    n_actions: int | None = None
    n_states: int | None = None
    obs_dim: int | None = None
    act_dim: int | None = None
    actions_checked: bool = True
    # cross-fitted (a behavior model of --behavior-cross-fit K): every params array has a
    # leading [folds] axis, and an episode uses the fold fit.base.fold_index gives its key
    folds: int = 1
    sample: SampleFn | None = None

    @property
    def stack_key(self) -> tuple:
        """Policies with equal keys run as one vmapped, stacked kernel."""
        if self.params is None:
            return (self.kind, self.name)
        shapes = tuple((k, v.shape, v.dtype.str) for k, v in sorted(self.params.items()))
        return (self.kind, self.static, shapes)


# --- per-step log-probabilities (pure JAX) -------------------------------------------------


def _jnp():
    import jax.numpy as jnp

    return jnp


def _vector(observation):
    jnp = _jnp()
    return jnp.atleast_1d(observation)


def tabular_log_prob(params, observation, action):
    """log softmax(logits[s])[a]; observation is an integer state."""
    import jax

    return jax.nn.log_softmax(params["logits"][observation])[action]


def linear_softmax_log_prob(params, observation, action):
    """log softmax((s @ W + b) / temperature)[a]."""
    import jax

    logits = (_vector(observation) @ params["weight"] + params["bias"]) / params["temperature"]
    return jax.nn.log_softmax(logits)[action]


def mlp_forward(params, inputs, activation: str):
    """[width] the MLP of ``weight_i``/``bias_i`` layers on [d] ``inputs``, ``activation``
    (tanh or relu) between layers and none after the last."""
    import jax

    act = {"tanh": _jnp().tanh, "relu": jax.nn.relu}[activation]
    hidden = inputs
    layers = len([key for key in params if key.startswith("weight_")])
    for i in range(layers):
        hidden = hidden @ params[f"weight_{i}"] + params[f"bias_{i}"]
        if i < layers - 1:
            hidden = act(hidden)
    return hidden


@functools.cache  # one function object per activation, so the jit cache recognises it
def _mlp_log_prob(activation: str) -> LogProbFn:
    def mlp_softmax_log_prob(params, observation, action):
        """log softmax(MLP(s))[a] with ``activation`` between layers."""
        import jax

        return jax.nn.log_softmax(mlp_forward(params, _vector(observation), activation))[action]

    return mlp_softmax_log_prob


def linear_gaussian_log_prob(params, observation, action):
    """Diagonal Gaussian log-density of the action vector, mean s @ W + b, std exp(log_std)."""
    jnp = _jnp()
    mean = _vector(observation) @ params["weight"] + params["bias"]
    log_std = params["log_std"]
    z = (jnp.atleast_1d(action) - mean) * jnp.exp(-log_std)
    return jnp.sum(-0.5 * z * z - log_std - 0.5 * math.log(2 * math.pi))


def linear_gaussian_sample(params, key, observation):
    """[act_dim] one action from the diagonal Gaussian of ``linear_gaussian_log_prob``."""
    import jax

    mean = _vector(observation) @ params["weight"] + params["bias"]
    return mean + _jnp().exp(params["log_std"]) * jax.random.normal(key, mean.shape, mean.dtype)


def action_log_probs(log_prob: LogProbFn, params, observation, n_actions: int):
    """[n_actions] log pi(a|s) of every discrete action a of one step (``log_prob`` vmapped
    over the actions 0 .. n_actions - 1), e.g. for V(s) = sum_a pi(a|s) Q(s, a)."""
    import jax

    actions = _jnp().arange(n_actions)
    return jax.vmap(log_prob, in_axes=(None, None, 0))(params, observation, actions)


# --- checkpoints ---------------------------------------------------------------------------


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
    )


def mlp_layers(path: str, kind: str, arrays: dict[str, np.ndarray]):
    """(params, activation) of an MLP checkpoint's ``weight_i``/``bias_i`` layers and
    optional ``activation``, checked layer by layer; raises PolicyError."""
    activation = str(arrays.pop("activation", "tanh"))
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
    kind = str(arrays.pop("kind"))
    if kind not in _CHECKPOINT_KINDS:
        raise PolicyError(
            f"{path}: unknown checkpoint kind {kind!r} (expected tabular, linear_softmax, "
            "mlp_softmax or linear_gaussian)"
        )
    return _CHECKPOINT_KINDS[kind](path, kind, arrays)


# --- entry points --------------------------------------------------------------------------


def import_entry_point(spec: str, expected: str = "an .npz checkpoint") -> Any:
    """The object named by ``package.module:name`` (modules in the working directory import,
    as with ``python -m``); PolicyError when it is not one. ``expected``: the words for what
    else the value could have been, for the message."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise PolicyError(f"{spec}: expected {expected} or an entry point 'package.module:name'")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does, so local modules import
    try:
        target: Any = importlib.import_module(module_name)
    except Exception as error:  # noqa: BLE001 - any import failure of user code is a policy error
        raise PolicyError(
            f"{spec}: cannot import module {module_name!r}: {type(error).__name__}: {error}"
        ) from None
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise PolicyError(f"{spec}: module {module_name!r} has no attribute {attribute!r}")
        target = getattr(target, part)
    return target


def load_entry_point(spec: str) -> Policy:
    """Imports ``package.module:name``: a per-step log_prob function, or an object with a
    ``log_prob`` or ``prob`` method of that signature."""
    target = import_entry_point(spec)
    attribute = spec.partition(":")[2]
    n_actions = _declared_action_count(spec, target)
    return Policy(
        spec,
        "entry_point",
        None,
        (),
        _entry_point_log_prob(spec, attribute, target),
        discrete=True if n_actions is not None else None,
        n_actions=n_actions,
        actions_checked=n_actions is not None,
        sample=_entry_point_sample(target),
    )


_ENTRY_POINT_SAMPLERS: dict[int, tuple[Any, SampleFn]] = {}


def _entry_point_sample(target: Any) -> SampleFn | None:
    """The per-step ``(params, key, observation)`` wrapper of a user object's
    ``sample(key, observation)`` method, one per object (None without one)."""
    method = getattr(target, "sample", None)
    if not callable(method):
        return None
    if id(target) not in _ENTRY_POINT_SAMPLERS:

        def sample(params, key, observation):
            return method(key, observation)

        _ENTRY_POINT_SAMPLERS[id(target)] = (target, sample)
    return _ENTRY_POINT_SAMPLERS[id(target)][1]


def _declared_action_count(spec: str, target: Any) -> int | None:
    """The ``n_actions`` attribute of an entry point (function or object), if it declares
    one: logged discrete actions are then checked against it like a checkpoint's."""
    value = getattr(target, "n_actions", None)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise PolicyError(f"{spec}: n_actions must be a positive integer, got {value!r}")
    return int(value)


_ENTRY_POINT_WRAPPERS: dict[int, tuple[Any, LogProbFn]] = {}


def _entry_point_log_prob(spec: str, attribute: str, target: Any) -> LogProbFn:
    """The per-step ``(params, observation, action)`` wrapper of a user object, one per
    object, so that loading the same entry point twice reuses its compiled kernels."""
    if id(target) in _ENTRY_POINT_WRAPPERS:
        return _ENTRY_POINT_WRAPPERS[id(target)][1]
    if hasattr(target, "log_prob") and callable(target.log_prob):
        method = target.log_prob

        def log_prob(params, observation, action):
            return method(observation, action)
    elif hasattr(target, "prob") and callable(target.prob):
        method = target.prob

        def log_prob(params, observation, action):
            return _jnp().log(method(observation, action))
    elif callable(target):

        def log_prob(params, observation, action):
            return target(observation, action)
    else:
        raise PolicyError(
            f"{spec}: {attribute!r} is not callable and has no log_prob or prob method"
        )
    _ENTRY_POINT_WRAPPERS[id(target)] = (target, log_prob)  # holding target keeps its id unique
    return log_prob


def load_policy(spec: str) -> Policy:
    """A policy from a command-line ``--policy`` value."""
    if spec.endswith(".npz") or remote.is_uri(spec) or Path(spec).is_file():
        return load_checkpoint(spec)
    return load_entry_point(spec)


def load_policies(specs: Sequence[str]) -> list[Policy]:
    """The policies of every ``--policy`` value, in order; a glob such as 'ckpts/*.npz'
    (quoted, so the shell leaves it alone) stands for its matching files, sorted."""
    policies = []
    for spec in specs:
        if glob.has_magic(spec) and remote.is_uri(spec):
            policies.extend(load_policy(m) for m in remote.glob_files(spec, PolicyError))
        elif glob.has_magic(spec) and not Path(spec).exists():
            matches = sorted(glob.glob(spec))
            if not matches:
                raise PolicyError(f"{spec}: no checkpoint matches this pattern")
            policies.extend(load_policy(match) for match in matches)
        else:
            policies.append(load_policy(spec))
    return policies


def logged_policy() -> Policy:
    """The evaluation policy whose probabilities are logged in the data."""
    return Policy(LOGGED, "logged", None, (), None)


# --- checks against the data ---------------------------------------------------------------


def check_against_schema(policy: Policy, schema) -> None:
    """Type-level compatibility of a policy and the data (before any row is read)."""
    if policy.discrete is True and schema.action_kind != "discrete":
        raise DataError(
            f"actions in column {schema.columns['action']!r} are not integers, but policy "
            f"{policy.name} ({policy.kind}) is over discrete actions"
        )
    if policy.discrete is False and schema.action_kind == "discrete":
        raise DataError(
            f"actions in column {schema.columns['action']!r} are integers, but policy "
            f"{policy.name} ({policy.kind}) is over continuous actions"
        )
    if policy.kind == "tabular" and schema.observation_kind != "index":
        raise DataError(
            f"policy {policy.name} is tabular and needs integer state observations, but "
            f"column {schema.columns['observation']!r} holds {schema.observation_kind} values"
        )
    if policy.obs_dim is not None and schema.observation_dim not in (None, policy.obs_dim):
        raise DataError(
            f"observations in column {schema.columns['observation']!r} have size "
            f"{schema.observation_dim}, but policy {policy.name} expects {policy.obs_dim}"
        )


def chunk_checks(policy: Policy, chunk) -> Iterator[Check]:
    """Value-level compatibility of one chunk with the policy, as validate.value_checks does
    it: yields Check(reason, problem, [N] bool rows). Action and state ranges can be dropped
    (``--on-invalid drop``); a size mismatch concerns every row and never is."""
    if policy.n_actions is not None:
        yield Check(
            "action_out_of_range",
            f"action is outside policy {policy.name}'s {policy.n_actions} actions "
            f"(0..{policy.n_actions - 1})",
            chunk.action >= policy.n_actions,
        )
    if policy.n_states is not None and chunk.observation is not None:
        yield Check(
            "state_out_of_range",
            f"state index is outside policy {policy.name}'s {policy.n_states} states "
            f"(0..{policy.n_states - 1})",
            chunk.observation >= policy.n_states,
        )
    if policy.obs_dim is not None and chunk.observation is not None:
        size = 1 if chunk.observation.ndim == 1 else chunk.observation.shape[1]
        if size != policy.obs_dim:
            yield Check(
                "observation_size",
                f"observation has size {size}, but policy {policy.name} expects {policy.obs_dim}",
                np.ones(chunk.num_steps, bool),
            )
    if policy.act_dim is not None:
        size = 1 if chunk.action.ndim == 1 else chunk.action.shape[1]
        if size != policy.act_dim:
            yield Check(
                "action_size",
                f"action has size {size}, but policy {policy.name} expects {policy.act_dim}",
                np.ones(chunk.num_steps, bool),
            )
