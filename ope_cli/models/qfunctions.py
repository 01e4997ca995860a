"""Q sources for the doubly robust estimators (SPEC 9, ``--q``): checkpoints, entry points,
fitted Q evaluation in the run (``fit``), or the user's own columns.

Every Q function becomes per-step JAX code written for one step, like a policy's log_prob:
``q_values(params, observation) -> [n_actions]`` for discrete actions, or
``q_sa(params, observation, action) -> []`` for continuous ones. ``step_values`` turns one
step into (Q-hat of the logged action, V-hat of the state): V-hat is exact for discrete
actions (sum_a pi_e(a|s) Q-hat(s, a)) and a mean over ``v_samples`` actions drawn from
pi_e for continuous ones. The kernel vmaps it over steps, episodes and stacked policies.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from ope_cli.data.columns import observations_held
from ope_cli.errors import DataError, PolicyError, UsageError
from ope_cli.models.policies import (
    Policy,
    action_log_probs,
    check_probability_sums,
    check_size,
    checked_array,
    expand,
    import_entry_point,
    is_checkpoint,
    mlp_forward,
    mlp_layers,
    read_archive,
    refuse_unread,
    text,
)
from ope_cli.models.q_models.base import check_q_model_fits, default_q_model

FIT = "fit"  # --q fit[:MODEL]: fitted Q evaluation in the same run
COLUMNS = "columns"  # --q-col/--v-col: the user's critic scored the log
DEFAULT_V_SAMPLES = 16
DEFAULT_CROSS_FIT = 2
Q_KINDS = ("tabular_q", "linear_q", "mlp_q", "mlp_q_sa")
GAMMA_KEY = "gamma"  # a Q checkpoint's optional discount it was fitted for (ope fit-q's)
# a Q checkpoint's optional fingerprint of the policy it is the Q of (Policy.fingerprint)
POLICY_KEY = "policy_fingerprint"
# a Q checkpoint's optional mark that it holds its policy's exact Q (``ope generate``'s):
# dm's interval, which takes Q-hat as exact, is then honest
EXACT_KEY = "exact"


def _jnp():
    import jax.numpy as jnp

    return jnp


# --- per-step Q functions (pure JAX) -------------------------------------------------------


def tabular_q_values(params, observation):
    """[A] q[s] for an integer state s."""
    return params["q"][observation]


def linear_q_values(params, observation):
    """[A] s @ weight + bias."""
    return _jnp().atleast_1d(observation) @ params["weight"] + params["bias"]


@functools.cache  # one function object per activation, so the jit cache recognises it
def mlp_q_values(activation: str):
    def mlp_q(params, observation):
        """[A] MLP(s)."""
        return mlp_forward(params, _jnp().atleast_1d(observation), activation)

    return mlp_q


@functools.cache
def mlp_q_sa(activation: str):
    def mlp_q_of_action(params, observation, action):
        """[] MLP(concat(s, a))[0]."""
        jnp = _jnp()
        inputs = jnp.concatenate([jnp.atleast_1d(observation), jnp.atleast_1d(action)])
        return mlp_forward(params, inputs.astype(params["weight_0"].dtype), activation)[0]

    return mlp_q_of_action


# --- the Q function record -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class QFunction:
    """One Q-hat, for one evaluation policy.

    Attributes:
      name: as given (a path, an entry point, ``fit``, ``columns``): the report's ``q``.
      kind: a checkpoint kind of Q_KINDS, ``entry_point``, ``fit`` (placeholder until the
        first pass fits it) or ``columns``.
      params: arrays (checkpoints, fitted models), else None; [K, ...] when cross-fitted.
      static: hashable settings that select the function (the MLP activation).
      q_values: per-step ``(params, observation) -> [n_actions]``, discrete actions.
      q_sa: per-step ``(params, observation, action) -> []``, continuous actions.
      n_actions, n_states, obs_dim, act_dim: sizes to check the data against (None: unknown);
        input_dim: obs_dim + act_dim of a network of (observation, action) (mlp_q_sa).
      folds: K of a cross-fitted Q (episodes use the fold ``ids.fold_index`` gives).
      fit: the fitted Q evaluation's summary (``--q fit``), else None.
      gamma: the discount the Q-hat was fitted for (a checkpoint's optional ``gamma``,
        which ``ope fit-q`` writes), None when unknown.
      policy_fingerprint: ``Policy.fingerprint`` of the policy it is the Q of (a
        checkpoint's optional ``policy_fingerprint``), None when unknown.
      exact: the checkpoint says it holds the exact Q (``EXACT_KEY``: ``ope generate``'s).
    """

    name: str
    kind: str
    params: dict[str, np.ndarray] | None = None
    static: tuple = ()
    q_values: Callable | None = None
    q_sa: Callable | None = None
    n_actions: int | None = None
    n_states: int | None = None
    obs_dim: int | None = None
    act_dim: int | None = None
    input_dim: int | None = None
    folds: int = 1
    fit: Any = None
    gamma: float | None = None
    policy_fingerprint: str | None = None
    exact: bool = False
    mismatch: str | None = None  # why it is not its policy's Q for the run's gamma (dr, wdr)

    @property
    def stack_key(self) -> tuple:
        """Q functions with equal keys are stacked along the policy axis of one kernel."""
        if self.params is None:
            return (self.kind, self.name)
        shapes = tuple((k, v.shape, v.dtype.str) for k, v in sorted(self.params.items()))
        return (self.kind, self.static, self.folds, shapes)


def _tabular_q(path: str, arrays: dict[str, np.ndarray]) -> QFunction:
    q = checked_array(arrays, "q", 2, path)
    return QFunction(
        path, "tabular_q", {"q": q}, (), tabular_q_values, n_states=q.shape[0], n_actions=q.shape[1]
    )


def _linear_q(path: str, arrays: dict[str, np.ndarray]) -> QFunction:
    weight, bias = checked_array(arrays, "weight", 2, path), checked_array(arrays, "bias", 1, path)
    check_size(path, "bias must match weight's columns", weight.shape[1], "bias", bias.shape[0])
    return QFunction(
        path,
        "linear_q",
        {"weight": weight, "bias": bias},
        (),
        linear_q_values,
        obs_dim=weight.shape[0],
        n_actions=weight.shape[1],
    )


def _mlp_q(path: str, arrays: dict[str, np.ndarray]) -> QFunction:
    params, activation = mlp_layers(path, "mlp_q", arrays)
    return QFunction(
        path,
        "mlp_q",
        params,
        (activation,),
        mlp_q_values(activation),
        obs_dim=params["weight_0"].shape[0],
        n_actions=params[f"bias_{len(params) // 2 - 1}"].shape[0],
    )


def _mlp_q_sa(path: str, arrays: dict[str, np.ndarray]) -> QFunction:
    params, activation = mlp_layers(path, "mlp_q_sa", arrays)
    width = params[f"bias_{len(params) // 2 - 1}"].shape[0]
    if width != 1:
        raise PolicyError(f"{path}: an mlp_q_sa network must output one value, got {width}")
    return QFunction(
        path,
        "mlp_q_sa",
        params,
        (activation,),
        q_sa=mlp_q_sa(activation),
        input_dim=params["weight_0"].shape[0],
    )


_CHECKPOINT_KINDS = {
    "tabular_q": _tabular_q,
    "linear_q": _linear_q,
    "mlp_q": _mlp_q,
    "mlp_q_sa": _mlp_q_sa,
}


def q_checkpoint(path: str, arrays: dict[str, np.ndarray]) -> QFunction:
    """The Q function of checkpoint arrays (a string ``kind`` of Q_KINDS and its
    parameters); ``path`` names it in messages. Raises PolicyError."""
    arrays = dict(arrays)
    kind = text(arrays.pop("kind", ""))
    if kind not in _CHECKPOINT_KINDS:
        found = f"kind {kind!r}" if kind else "no 'kind' array"
        raise PolicyError(f"{path}: not a Q checkpoint ({found}; expected {', '.join(Q_KINDS)})")
    gamma = _fitted_gamma(path, arrays.pop(GAMMA_KEY, None))
    policy = _policy_fingerprint(path, arrays.pop(POLICY_KEY, None))
    exact = _exact(path, arrays.pop(EXACT_KEY, None))
    q = _CHECKPOINT_KINDS[kind](path, arrays)
    refuse_unread(path, kind, arrays, q.params)
    return dataclasses.replace(q, gamma=gamma, policy_fingerprint=policy, exact=exact)


def provenance_arrays(
    gamma: float, policy_fingerprint: str | None, exact: bool = False
) -> dict[str, np.ndarray]:
    """What a Q checkpoint records of the Q-hat it holds, as ``q_checkpoint`` reads it: the
    discount it is for, where known (not an entry point's) its policy's fingerprint, and
    whether it is that policy's exact Q (``ope generate``'s; a fit is not)."""
    arrays = {GAMMA_KEY: np.float64(gamma)}
    if policy_fingerprint is not None:
        arrays[POLICY_KEY] = np.array(policy_fingerprint)
    if exact:
        arrays[EXACT_KEY] = np.array(True)
    return arrays


def _exact(path: str, value: np.ndarray | None) -> bool:
    """A Q checkpoint's optional ``exact`` mark (a boolean) as a bool; PolicyError for
    anything else."""
    if value is None:
        return False
    value = np.asarray(value)
    if value.shape != () or value.dtype.kind != "b":
        raise PolicyError(
            f"{path}: array {EXACT_KEY!r} must be one boolean (whether the Q is its policy's "
            f"exact Q), got {_shown(value)}"
        )
    return bool(value)


def _policy_fingerprint(path: str, value: np.ndarray | None) -> str | None:
    """A Q checkpoint's optional ``policy_fingerprint`` (64 hex digits); PolicyError for
    anything else."""
    if value is None:
        return None
    value = np.asarray(value)
    found = text(value) if value.shape == () and value.dtype.kind in "US" else ""
    if len(found) != 64 or any(c not in "0123456789abcdef" for c in found):
        raise PolicyError(
            f"{path}: array {POLICY_KEY!r} must be the sha256 (64 hex digits) of the policy "
            f"the Q is of, got {_shown(value)}"
        )
    return found


def _shown(value: np.ndarray) -> str:
    """A checkpoint array as a message shows it: its value, or its type and shape."""
    return repr(value.tolist()) if value.size == 1 else f"a {value.dtype} array of {value.shape}"


def check_q_policies(qs: Sequence[QFunction] | None, policies: Sequence[Policy]) -> None:
    """UsageError (one line) when a Q checkpoint records the policy it is the Q of and
    the --policy it is paired with (the one in the same position) is another: dm would
    estimate the value of that other policy without a word (a --q glob that sorts in
    another order than the --policy one, say)."""
    for q, policy in zip(qs or (), policies if qs else (), strict=True):
        other = q_of_another_policy(q, policy, policies)
        if other is not None:
            raise UsageError(other)


def q_of_another_policy(q: QFunction, policy: Policy, policies: Sequence[Policy]) -> str | None:
    """Why ``q`` (recording the policy it is the Q of) is not ``policy``'s, or None."""
    if q.policy_fingerprint is None or policy.fingerprint() in (None, q.policy_fingerprint):
        return None
    named = [p.name for p in policies if p.fingerprint() == q.policy_fingerprint]
    fix = (
        f"(it is {named[0]}'s): give --q once per --policy, in the same order"
        if named
        else "(another checkpoint's): give this policy's own Q, or --q fit"
    )
    return (
        f"--q {q.name} is the Q of another policy than {policy.name}, the --policy it is "
        f"paired with {fix}"
    )


def _fitted_gamma(path: str, value: np.ndarray | None) -> float | None:
    """A Q checkpoint's optional ``gamma`` (a number in [0, 1]) as a float; PolicyError
    for anything else."""
    if value is None:
        return None
    value = np.asarray(value)
    if value.shape != () or value.dtype.kind not in "fiu" or not 0.0 <= float(value) <= 1.0:
        raise PolicyError(
            f"{path}: array {GAMMA_KEY!r} must be one number in [0, 1] (the discount the Q "
            f"was fitted for), got {_shown(value)}"
        )
    if value.dtype.kind == "f":  # the shortest decimal of its own precision: float32's 0.95
        return float(np.format_float_positional(value[()], unique=True, trim="-"))
    return float(value)


def check_q_gamma(qs: Sequence[QFunction] | None, gamma: float, described: str) -> None:
    """UsageError (one line) when a Q checkpoint was fitted for another discount than the
    run's ``gamma`` (``described``: where it comes from): its Q-hat is the value of another
    return, and dm would estimate that one without a word."""
    for q in qs or ():
        other = q_for_another_gamma(q, gamma, described)
        if other is not None:
            raise UsageError(other)


def q_for_another_gamma(q: QFunction, gamma: float, described: str) -> str | None:
    """Why ``q`` (recording the discount it was fitted for) is not for ``gamma``, or None."""
    if q.gamma is None or math.isclose(q.gamma, gamma, rel_tol=1e-12, abs_tol=1e-15):
        return None
    ours, theirs = f"{gamma:.15g}", f"{q.gamma:.15g}"
    return (
        f"--q {q.name} is a Q for gamma {theirs}, but this run discounts by gamma {ours} "
        f"({described}): evaluate with --gamma {theirs}, or refit it with --gamma {ours} "
        "(or --q fit)"
    )


def load_q_entry_point(spec: str) -> QFunction:
    """Imports ``package.module:name``: a function ``q_values(observation) -> [n_actions]``,
    or an object with ``q(observation, action) -> scalar`` (continuous actions) or a
    ``q_values`` method."""
    return _entry_point_q(spec, import_entry_point(spec, "a Q checkpoint .npz, fit"))


_ENTRY_POINTS: dict[int, tuple[Any, QFunction]] = {}  # one wrapper per object: jit reuses it


def _entry_point_q(spec: str, target: Any) -> QFunction:
    if id(target) in _ENTRY_POINTS:
        return dataclasses.replace(_ENTRY_POINTS[id(target)][1], name=spec)
    n_actions = getattr(target, "n_actions", None)
    if callable(getattr(target, "q", None)):
        method = target.q

        def q_sa(params, observation, action):
            return method(observation, action)

        q = QFunction(spec, "entry_point", q_sa=q_sa)
    else:
        method = target.q_values if callable(getattr(target, "q_values", None)) else target
        if not callable(method):
            raise PolicyError(f"{spec}: not callable, and has no q or q_values method")

        def q_values(params, observation):
            return method(observation)

        q = QFunction(spec, "entry_point", q_values=q_values)
    if isinstance(n_actions, int | np.integer) and not isinstance(n_actions, bool):
        q = dataclasses.replace(q, n_actions=int(n_actions))
    _ENTRY_POINTS[id(target)] = (target, q)
    return q


def load_q(spec: str) -> QFunction:
    """The Q source of one ``--q`` value: ``fit``, a checkpoint (local or at a URI), or an
    entry point."""
    if _is_fit(spec):
        return QFunction(spec, FIT)
    if is_checkpoint(spec):
        return q_checkpoint(spec, read_archive(spec))
    return load_q_entry_point(spec)


def _is_fit(spec: str) -> bool:
    return spec == FIT or spec.startswith(FIT + ":")


def expand_qs(specs: Sequence[str]) -> list[str]:
    """The ``--q`` values with each glob replaced by its matching files, sorted (as
    ``--policy`` does); ``fit[:MODEL]`` and entry points stand for themselves."""
    expanded = []
    for spec in specs:
        files = not _is_fit(spec) and (
            spec.endswith(".npz") or glob.has_magic(spec) or Path(spec).is_dir()
        )
        expanded.extend(expand(spec, PolicyError, "Q checkpoint") if files else [spec])
    return expanded


def pair_qs(specs: Sequence[str], policies: int, globbed: str = "") -> list[str]:
    """One ``--q`` value per policy, in order: a Q function belongs to one policy, so
    several policies need one --q each (a glob counts its files), or ``fit``, which fits
    one Q-hat per policy. ``globbed``: how the globs grew the count, for the message."""
    if len(specs) == 1 and (policies == 1 or _is_fit(specs[0])):
        return list(specs) * policies
    if len(specs) == 1:
        raise UsageError(
            f"--q {specs[0]} is one Q-hat for {policies} policies, but a Q function belongs to "
            "one policy: give --q once per --policy, in the same order (a quoted glob counts "
            "its files), or --q fit to fit one for each"
        )
    if len(specs) != policies:
        raise UsageError(
            f"--q is given {len(specs)} times{globbed} for {policies} policies: give --q once "
            "per --policy, in the same order (a quoted glob counts its files), or --q fit"
        )
    return list(specs)


def load_qs(
    specs: Sequence[str], policies: Sequence[Policy], columns: tuple[str, str] | None = None
) -> list[QFunction] | None:
    """One Q source per policy, in order (None without any): ``--q`` once per ``--policy``
    (globs expanded, ``pair_qs``), or ``fit`` once for all; ``columns``: the --q-col and
    --v-col names."""
    if columns is not None:
        if specs:
            raise UsageError("--q-col/--v-col and --q are two Q sources; give one of them")
        if len(policies) != 1:
            raise UsageError(
                f"--q-col/--v-col score the log for one policy, but {len(policies)} are given"
            )
        return [QFunction(f"{columns[0]!r} and {columns[1]!r}", COLUMNS)]
    if not specs:
        return None
    expanded = expand_qs(specs)
    globbed = ""
    if len(expanded) != len(specs):  # the files, so that one matched by mistake shows
        shown = ", ".join(expanded[:6]) + (", ..." if expanded[6:] else "")
        globbed = f" (globs expanded from {len(specs)}: {shown})"
    return [load_q(spec) for spec in pair_qs(expanded, len(policies), globbed)]


# --- checks against the data and the policy ------------------------------------------------


def fit_model_of(spec: str, observation_kind: str | None, action_kind: str) -> str:
    """The fit-q model of ``fit[:MODEL]`` (the data's default without one), checked."""
    model = spec.partition(":")[2] or default_q_model(observation_kind, action_kind)
    check_q_model_fits(model, observation_kind, action_kind, "--q fit:MODEL")
    return model


def check_q(q: QFunction, policy: Policy, schema) -> None:
    """Type-level compatibility of a Q source with the data and its policy (before any row
    is read); raises PolicyError / DataError / UsageError with one line."""
    if q.kind == COLUMNS:
        return
    if "observation" not in schema.columns:
        raise DataError(
            f"--q {q.name} needs the observations, but no observation column was found; "
            "name it with --obs-col"
        )
    if policy.kind == "logged":
        raise UsageError(
            "V-hat needs the evaluation policy's probabilities of every action; "
            "logged target probabilities give only the logged action's "
            "(pass --policy, or --q-col with --v-col)"
        )
    if q.kind == FIT:
        fit_model_of(q.name, schema.observation_kind, schema.action_kind)
        return
    _check_q_types(q, f"Q function {q.name} (for policy {policy.name})", schema)
    if q.n_states is not None and policy.n_states not in (None, q.n_states):
        # a Q of another state space: its states past the policy's (or the policy's past its)
        # were data errors, and --on-invalid drop, which they suggested, dropped 199 of 200
        raise PolicyError(
            f"Q function {q.name} has {q.n_states} states, but policy {policy.name} has "
            f"{policy.n_states} states"
        )
    if schema.action_kind == "discrete":
        width = q.n_actions
        if width is not None and policy.n_actions is not None and width != policy.n_actions:
            raise PolicyError(
                f"Q function {q.name} has {width} action values, but policy {policy.name} "
                f"has {policy.n_actions} actions"
            )
        if width is None and policy.n_actions is None:
            raise PolicyError(
                f"Q function {q.name}: neither it nor policy {policy.name} declares "
                "n_actions, which V-hat = sum_a pi(a|s) Q(s, a) needs"
            )
    elif policy.sample is None:
        raise PolicyError(
            "V-hat for continuous actions averages Q over actions drawn from the policy, but "
            f"policy {policy.name} cannot sample (a linear_gaussian checkpoint, or an entry "
            "point with a sample(key, observation) method)"
        )


def _check_q_types(q: QFunction, where: str, schema) -> None:
    """The Q function's action kind, state kind and observation size against the data."""
    actions = schema.columns["action"]
    if schema.action_kind == "discrete" and q.q_values is None:
        raise DataError(
            f"{where} scores (observation, action) pairs of continuous actions, but the "
            f"actions in column {actions!r} are integers"
        )
    if schema.action_kind != "discrete" and q.q_values is not None:
        raise DataError(
            f"{where} gives a value per discrete action, but the actions in column "
            f"{actions!r} are continuous"
        )
    observations = schema.columns["observation"]
    if q.kind == "tabular_q" and schema.observation_kind != "index":
        raise DataError(
            f"{where} is tabular and needs integer state observations, but column "
            f"{observations!r} holds {observations_held(schema.observation_kind)}"
        )
    if q.obs_dim is not None and schema.observation_dim not in (None, q.obs_dim):
        raise DataError(
            f"{where} expects observations of size {q.obs_dim}, but column "
            f"{observations!r} has size {schema.observation_dim}"
        )


def chunk_checks(q: QFunction, policy: Policy, chunk):
    """Value-level compatibility of one chunk with the Q function, like
    policies.chunk_checks: yields validate.Check(reason, problem, [N] rows)."""
    from ope_cli.data.validate import Check

    n_actions = q.n_actions
    if n_actions is not None and policy.n_actions is None and chunk.action.ndim == 1:
        _check_probabilities_over(q, policy, chunk)
        yield Check(
            "action_out_of_range",
            f"action is outside Q function {q.name}'s {n_actions} actions (0..{n_actions - 1})",
            chunk.action >= n_actions,
        )
    if q.n_states is not None and chunk.observation is not None:
        yield Check(
            "state_out_of_range",
            f"state index is outside Q function {q.name}'s {q.n_states} states "
            f"(0..{q.n_states - 1})",
            chunk.observation >= q.n_states,
        )
    yield from _size_checks(q, chunk, Check)


def _check_probabilities_over(q: QFunction, policy: Policy, chunk) -> None:
    """A PolicyError where a policy that declares no action count gives probabilities that
    do not sum to 1 over the Q function's actions, at the chunk's first steps
    (``probability_sum_off``): V-hat = sum_a pi(a|s) Q(s, a) is then over other actions
    than the policy's (an entry point of 3 actions, which clamps a larger one to its last,
    with a Q of 5: dr 919 where the truth is 4.5, said nowhere)."""
    check_probability_sums(
        policy,
        chunk,
        q.n_actions,
        f"Q function {q.name}'s {q.n_actions} actions",
        "the Q function has another number of actions than the policy (declare the "
        "policy's n_actions to have them compared)",
    )


def _size_checks(q: QFunction, chunk, check):
    """The observation (and action) sizes against the network's input: every row, never
    dropped (an integer state is one number)."""
    if chunk.observation is None or (q.obs_dim is None and q.input_dim is None):
        return
    every = np.ones(chunk.action.shape[0], bool)
    observation = 1 if chunk.observation.ndim == 1 else chunk.observation.shape[1]
    action = 1 if chunk.action.ndim == 1 else chunk.action.shape[1]
    if q.obs_dim is not None and observation != q.obs_dim:
        yield check(
            "observation_size",
            f"observation has size {observation}, but Q function {q.name} expects {q.obs_dim}",
            every,
        )
    if q.input_dim is not None and observation + action != q.input_dim:
        yield check(
            "observation_size",
            f"observation and action have sizes {observation} + {action}, but Q function "
            f"{q.name} takes {q.input_dim} inputs",
            every,
        )


# --- in the kernel (JAX) -------------------------------------------------------------------


class QSpec(NamedTuple):
    """The static part of a group's Q source, for the kernel's jit.

    kind: ``values`` (q_values over discrete actions), ``sa`` (q_sa, continuous actions)
    or ``columns``; function: q_values or q_sa; n_actions: the discrete action count;
    sample: the policy's sampler (``sa``); v_samples: actions drawn per step (``sa``);
    folds: K of a cross-fitted Q.
    """

    kind: str
    function: Callable | None
    n_actions: int | None
    sample: Callable | None
    v_samples: int
    folds: int


def q_spec(q: QFunction, policy: Policy, v_samples: int) -> QSpec:
    """The kernel's static description of ``q`` evaluated for ``policy``."""
    if q.kind == COLUMNS:
        return QSpec(COLUMNS, None, None, None, 0, 1)
    if q.q_values is not None:
        n_actions = q.n_actions or policy.n_actions
        return QSpec("values", q.q_values, n_actions, None, 0, q.folds)
    return QSpec("sa", q.q_sa, None, policy.sample, v_samples, q.folds)


def step_values(
    spec: QSpec, log_prob, policy_params, q_params, observation, action, key, probs=None
):
    """(Q-hat(s, a), V-hat(s)) of one step: ``key`` draws the actions of a continuous V-hat;
    ``probs`` [n_actions]: the policy's probabilities of every discrete action, when the
    caller has them (else computed here)."""
    import jax

    jnp = _jnp()
    if spec.kind == "values":
        q_all = spec.function(q_params, observation)
        if jnp.shape(q_all) != (spec.n_actions,):  # a [1] broadcast and clamped silently
            raise PolicyError(
                f"returns action values of shape {jnp.shape(q_all)} for one observation, but "
                f"V-hat sums over {spec.n_actions} actions (the n_actions the Q or the policy "
                f"declares): return one value per action, shape ({spec.n_actions},)"
            )
        if probs is None:
            probs = jnp.exp(action_log_probs(log_prob, policy_params, observation, spec.n_actions))
        pi_q = jnp.where(probs == 0, 0.0, probs * q_all)  # inf * 0 would be NaN
        return q_all[action], jnp.sum(pi_q)
    keys = jax.random.split(key, spec.v_samples)
    drawn = jax.vmap(spec.sample, in_axes=(None, 0, None))(policy_params, keys, observation)
    # a scalar logged action and a draw of one number are one action (as fitting reads them)
    logged, own = jnp.shape(action) or (1,), jnp.shape(drawn)[1:] or (1,)
    if own != logged:  # Q-hat's own shape error named no sample
        raise PolicyError(
            f"sample(key, observation) must return one action shaped as the logged ones, "
            f"{logged}, got shape {own}"
        )
    q_drawn = jax.vmap(spec.function, in_axes=(None, None, 0))(q_params, observation, drawn)
    q_logged = spec.function(q_params, observation, action)
    if jnp.shape(q_logged) != ():
        raise PolicyError(
            f"returns a value of shape {jnp.shape(q_logged)} for one (observation, action), "
            "not one number: return a scalar (q[0] of a one-value output, say)"
        )
    return q_logged, jnp.mean(q_drawn)


def episode_q_fields(spec, log_prob, policy_params, q_params, batch, seed, start=0, pi_all=None):
    """{"q_t": [B, C], "v_t": [B, C]} of one policy over a window of a padded batch whose
    column 0 is step ``start``, 0 on padding (the absorbing convention: Q = V = 0 after an
    episode ends), in Q-hat's dtype. The draws of a continuous V-hat are keyed by the
    episode and the step. ``pi_all`` [B, C, n_actions]: the policy's probabilities of every
    discrete action, when the kernel already has them (else computed here)."""
    import jax

    from ope_cli.data.ids import fold_index

    jnp = _jnp()
    mask = batch.step_mask & batch.episode_mask[:, None]
    if spec.kind == COLUMNS:
        q_bt, v_bt = batch.steps.q_value, batch.steps.v_value
    else:
        steps = batch.steps
        length = mask.shape[1]

        def one_episode(q_params_e, observation_t, action_t, hi, lo, pi_t):
            base = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), hi), lo)
            keys = jax.vmap(lambda t: jax.random.fold_in(base, t))(start + jnp.arange(length))
            per_step = jax.vmap(
                lambda o, a, k, lp: step_values(
                    spec, log_prob, policy_params, q_params_e, o, a, k, lp
                ),
                in_axes=(0, 0, 0, None if pi_t is None else 0),
            )
            return per_step(observation_t, action_t, keys, pi_t)

        by_episode = None if pi_all is None else 0
        if spec.folds > 1:
            fold = fold_index(batch.key_hi, batch.key_lo, spec.folds, jnp)
            q_params_b = jax.tree.map(lambda p: p[fold], q_params)
            in_axes = (0, 0, 0, 0, 0, by_episode)
        else:
            q_params_b, in_axes = q_params, (None, 0, 0, 0, 0, by_episode)
        q_bt, v_bt = jax.vmap(one_episode, in_axes=in_axes)(
            q_params_b, steps.observation, steps.action, batch.key_hi, batch.key_lo, pi_all
        )
    return {"q_t": jnp.where(mask, q_bt, 0.0), "v_t": jnp.where(mask, v_bt, 0.0)}


def faulty_q_error(q: QFunction, count: int) -> PolicyError:
    """The PolicyError (exit 4) for a Q function whose Q-hat or V-hat the kernel found NaN
    or infinite on ``count`` logged steps of a batch (``kernel.faulty_q_counts``)."""
    return PolicyError(
        f"Q function {q.name} gives NaN or infinite values (Q-hat or V-hat) on {count} "
        "logged step(s) of a batch: a fault of its code or parameters, or values past the "
        "float range; dm, dr and wdr are not defined with it"
    )


def q_source(q: QFunction):
    """The report's record of where ``q`` comes from (results.QSource)."""
    from ope_cli.results import QSource

    if q.kind == COLUMNS:
        return QSource("columns", q.name)
    if q.fit is not None:
        return QSource("fit", FIT, q.fit.get("kind"), q.fit)
    source = "entry_point" if q.kind == "entry_point" else "checkpoint"
    # exact is of its own policy and discount: not this run's Q where they differ (dr, wdr)
    exact = q.exact and q.mismatch is None
    return QSource(source, q.name, q.kind, mismatch=q.mismatch, exact=exact)
