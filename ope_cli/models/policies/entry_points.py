"""``package.module:name`` entry points: a user's per-step function, or an object with a
``log_prob`` or ``prob`` method (and optionally ``sample`` and ``n_actions``), wrapped once
per object so that loading it twice reuses its compiled kernels."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import sys
from typing import Any

import numpy as np

from ope_cli.errors import PolicyError
from ope_cli.models.policies.base import LogProbFn, Policy, SampleFn
from ope_cli.models.policies.functions import _jnp

_SPEC = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def _with_working_directory_importable() -> None:
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())  # as `python -m` does, so local modules import


def entry_point_file(spec: str) -> str | None:
    """The file that defines the module of entry point ``spec`` (``package.module:name``),
    found as importing it would find it, without running it; None for what is no entry
    point or whose module is not found."""
    if _SPEC.match(spec) is None:
        return None
    _with_working_directory_importable()
    try:
        found = importlib.util.find_spec(spec.partition(":")[0])
    except Exception:  # noqa: BLE001 - its parent package failed: loading it says how
        return None
    origin = getattr(found, "origin", None)
    return origin if origin and os.path.isfile(origin) else None


def import_entry_point(spec: str, expected: str = "an .npz checkpoint") -> Any:
    """The object named by ``package.module:name`` (modules in the working directory import,
    as with ``python -m``); PolicyError when it is not one. ``expected``: the words for what
    else the value could have been, for the message."""
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise PolicyError(f"{spec}: expected {expected} or an entry point 'package.module:name'")
    _with_working_directory_importable()
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

        log_prob.returns = "prob"  # what the user wrote returns: errors speak of it
    elif callable(target):

        def log_prob(params, observation, action):
            return target(observation, action)
    else:
        raise PolicyError(
            f"{spec}: {attribute!r} is not callable and has no log_prob or prob method"
        )
    _ENTRY_POINT_WRAPPERS[id(target)] = (target, log_prob)  # holding target keeps its id unique
    return log_prob
