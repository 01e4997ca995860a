"""Fitting Q on a stream of episodes: ``fit_q`` (the library entry point, also behind
``--q fit``), the collection pass and the dm estimate of a fit.

One pass over the chunks: each chunk becomes transitions (``base.transitions``), with
pi_e over every action at each step (discrete actions; the linear and mlp models) or
actions drawn from pi_e (continuous actions) computed in JAX, and is added to the model
per fold of episodes. The model is then fitted on all folds, or on all but fold k for each
k (cross-fitting), without reading the data again.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterable

import numpy as np

from ope_cli.data.episodes import EpisodeChunk
from ope_cli.errors import DataError, OpeError, UsageError
from ope_cli.estimation.estimators.doubly_robust import dm_estimate
from ope_cli.estimation.estimators.importance import (
    mean_and_sem,
    spread_cancelled,
    spread_resolution,
    zero_to_precision,
)
from ope_cli.models.behavior_models.fitting import Collected, gathered
from ope_cli.models.policies import Policy
from ope_cli.models.q_models.base import (
    V_SAMPLES,
    InitialValues,
    QModel,
    check_q_model_name,
    kind_of,
    policy_probs,
    policy_samples,
    transitions,
)
from ope_cli.models.q_models.linear import LinearQ
from ope_cli.models.q_models.mlp import MlpQ
from ope_cli.models.q_models.tabular import TabularQ


@dataclasses.dataclass
class QFit:
    """A fitted Q of one evaluation policy.

    arrays: checkpoint arrays (with ``kind``): folds == 1, [the fit on every episode];
      else [the fit on every fold but k, for k in range(folds)].
    diagnostics: ``bellman_rmse`` (in-sample; with folds > 1, each fold's steps scored by
      the fit without them), ``dm`` and ``dm_stderr`` (the same way), ``seconds``, and per
      model, of the single fit or as a list over the folds' fits: ``ridge`` (linear);
      ``iterations``, ``converged``, ``heldout_bellman_rmse``, ``heldout_steps`` (mlp).
    """

    model: str  # tabular | linear | mlp
    kind: str  # tabular_q | linear_q | mlp_q | mlp_q_sa
    arrays: list[dict[str, np.ndarray]]
    episodes: int
    steps: int
    diagnostics: dict


def _state_probs(policy: Policy):
    """(n_states, n_actions) -> [S, A] pi_e(a|s) over integer states 0 .. S - 1."""

    def probs(n_states: int, n_actions: int) -> np.ndarray:
        return policy_probs(policy, np.arange(n_states, dtype=np.int64), n_actions)

    return probs


def make_q_model(
    model: str,
    policy: Policy,
    *,
    discrete: bool,
    gamma: float,
    folds: int = 1,
    ridge: float | None = None,
    seed: int = 0,
    n_actions: int | None = None,
) -> QModel:
    """An empty Q model of ``model`` over ``folds`` folds of episodes."""
    if model == "tabular":
        return TabularQ(folds, gamma, _state_probs(policy), n_actions, policy.n_states)
    if model == "linear":
        if n_actions is None:
            raise UsageError(_action_count_message(policy))
        return LinearQ(folds, gamma, n_actions, ridge)
    if discrete and n_actions is None:
        raise UsageError(_action_count_message(policy))
    return MlpQ(folds, gamma, discrete, seed)


def _action_count_message(policy: Policy) -> str:
    return (
        f"policy {policy.name} declares no n_actions, and the number of actions is needed to "
        "fit Q; give the entry point an n_actions attribute"
    )


def collect_q(
    model: QModel,
    chunks: Iterable[EpisodeChunk],
    policy: Policy,
    *,
    folds: int,
    n_actions: int | None,
    seed: int = 0,
    v_samples: int = V_SAMPLES,
) -> Collected:
    """Adds every chunk's transitions to ``model`` (pi_e at each step as the model needs:
    its probabilities, or ``v_samples`` actions drawn from it)."""
    done = Collected(model, np.zeros(folds, np.int64))
    for chunk in chunks:
        if chunk.observation is None:
            raise DataError("fitting Q needs the observations; name their column with --obs-col")
        batch = transitions(chunk, folds)
        integers = chunk.action.dtype.kind in "iu"
        if integers != model.discrete:
            raise DataError(
                f"{chunk.file}: the actions are {'integers' if integers else 'continuous'}, "
                f"but the {model.name} Q model was made for the other kind"
            )
        if model.name != "tabular":
            if integers:
                batch.probs = policy_probs(policy, chunk.observation, n_actions)
            else:
                batch.samples = policy_samples(policy, chunk, seed, v_samples)
        model.add(batch)
        done.fold_episodes += np.bincount(batch.fold[batch.first], minlength=folds)
        done.episodes += chunk.num_episodes
        done.steps += chunk.num_steps
    return done


def collect_q_all(
    model, chunks, policy, *, folds, n_actions, seed, collectives, v_samples=V_SAMPLES
) -> Collected:
    """``collect_q`` on this process's share; with ``collectives`` = (gather, check_all),
    every process then holds what all of them collected (as
    ``behavior_models.fitting.collect_all``)."""
    options = {"folds": folds, "n_actions": n_actions, "seed": seed, "v_samples": v_samples}
    if collectives is None:
        collected = collect_q(model, chunks, policy, **options)
    else:
        gather, check_all = collectives
        error = None
        try:
            collected = collect_q(model, chunks, policy, **options)
        except OpeError as failure:  # as the behavior pass: one process's error stops all
            error = failure
            collected = Collected(model, np.zeros(folds, np.int64))
        check_all(error)
        collected = gathered(collected, gather)
    if collected.steps == 0:
        raise DataError("no steps to fit Q on (the data has no episodes)")
    return collected


DM_REMEDY = dm_estimate.remedy


def direct_method(initial: InitialValues) -> tuple[float, float, str | None]:
    """(mean, sample standard error, what float64 resolves of it) of V(s_0) over the
    episodes of ``initial``, as ``evaluate``'s dm takes them: about one episode's V(s_0)
    (``mean_and_sem``, ``spread_resolution``), so that a constant in V-hat cancels nowhere
    (rewards of 1e12 + noise gave 0, where evaluate's dm gave 0.0099); NaN for one episode.
    From raw sums (pivot 0: the linear model's) 0 where float64 finds no spread and V(s_0)
    is one value, NaN with the reason where it cancelled though V(s_0) varies."""
    pivot, total, total_sq, n, varies = initial
    deviation, stderr = (float(x) for x in mean_and_sem(total, total_sq, n, 0.0))
    mean = pivot + deviation
    if n < 2:
        return mean, math.nan, None
    if varies is False:  # raw sums of V(s_0) that is one value (equal phibar(s_0), one fit)
        return mean, 0.0, None
    note, drop = spread_resolution(total, total_sq, n, DM_REMEDY, offset=pivot)
    cancelled = note is not None and note.startswith(zero_to_precision())
    if cancelled and varies:  # raw sums (the linear model's) of V(s_0) that is not one value
        return mean, math.nan, spread_cancelled(DM_REMEDY, "V-hat(s_0)'s values")
    return mean, math.nan if drop else stderr, note


@dataclasses.dataclass(frozen=True)
class FitSettings:
    """How ``fit_q`` fits: the Q ``model``, the discount, the cross-fitting ``folds``, the
    ridge penalty (None: the model's default) and seed; ``n_actions``: default
    ``policy.n_actions`` (needed for the linear and mlp models over discrete actions);
    ``discrete``: whether the actions are integers (default: ``policy.discrete``, else
    integers)."""

    model: str
    gamma: float
    folds: int = 1
    ridge: float | None = None
    seed: int = 0
    n_actions: int | None = None
    discrete: bool | None = None
    v_samples: int = V_SAMPLES  # actions drawn from pi_e per state (continuous actions)


def fit_q(
    chunks: Iterable[EpisodeChunk], policy: Policy, settings: FitSettings, *, collectives=None
) -> QFit:
    """Fits pi_e's Q on ``chunks`` (one pass) with ``settings.model``; with ``folds`` > 1,
    once per fold k on every other fold (cross-fitting, folds by episode-id hash as the
    kernel's ``ids.fold_index``). Raises OpeError."""
    started = time.perf_counter()
    model, folds, seed = settings.model, settings.folds, settings.seed
    check_q_model_name(model)
    n_actions = settings.n_actions or policy.n_actions
    discrete = (policy.discrete is not False) if settings.discrete is None else settings.discrete
    q_model = make_q_model(
        model,
        policy,
        discrete=discrete,
        gamma=settings.gamma,
        folds=folds,
        ridge=settings.ridge,
        seed=seed,
        n_actions=n_actions,
    )
    collected = collect_q_all(
        q_model,
        chunks,
        policy,
        folds=folds,
        n_actions=n_actions,
        seed=seed,
        collectives=collectives,
        v_samples=settings.v_samples,
    )
    if folds > 1 and np.any(collected.fold_episodes == collected.episodes):
        raise UsageError(
            f"cross-fitting over {folds} folds: every one of the {collected.episodes} "
            "episode(s) falls in one fold, leaving nothing to fit the others on; use fewer folds"
        )
    excluded = [None] if folds <= 1 else list(range(folds))
    arrays, per_fold = [], []
    kind = kind_of(model, discrete)
    for k in excluded:  # one fit per fold (a handful), not a loop over the data
        fitted = q_model.fit(exclude=k)
        per_fold.append(getattr(q_model, "last", {}))
        arrays.append({"kind": np.array(kind), **fitted})
    diagnostics = _diagnostics(q_model, arrays, excluded, per_fold)
    diagnostics["seconds"] = time.perf_counter() - started
    return QFit(model, kind, arrays, collected.episodes, collected.steps, diagnostics)


def _joined(a: InitialValues, b: InitialValues) -> InitialValues:
    """The InitialValues of both sets of episodes, about ``a``'s pivot (of one with any)."""
    if 0 in (a.count, b.count):
        return b if a.count == 0 else a
    b = b.about(a.pivot)
    varies = None
    if None not in (a.varies, b.varies):  # raw sums: the folds' Q-hats differ, and so may V
        varies = a.varies or b.varies or a.total / a.count != b.total / b.count
    return InitialValues(
        a.pivot, a.total + b.total, a.total_sq + b.total_sq, a.count + b.count, varies
    )


# The sum of squared residuals is kept where it is at least this many times float64's
# epsilon times the parts it is summed from: their rounding then moves the RMSE by 1% at
# most (rewards of 1e4 + noise: 0.02% off, kept; of 1e6: 0.0 or 1.9x the direct value)
RESIDUAL_RESOLUTION = 1e3
RESIDUAL_UNRESOLVED = (
    "not resolved: the residuals are below the rounding of the sums they come from (rewards "
    "or Q-hat far from 0 beside a small spread)"
)


def _diagnostics(q_model: QModel, arrays: list[dict], excluded: list, per_fold: list) -> dict:
    """The Bellman RMSE and the dm estimate, each fold's steps and episodes scored by the
    fit that excludes them (in-sample for a single fit), and for the models whose Q-hat is
    0 on actions they never saw, pi_e's largest share of probability on those
    (``unlogged_share``)."""
    squares, steps, initial = 0.0, 0, None
    magnitude = 0.0  # of the parts the squares are summed from (models of sums)
    for fitted, k in zip(arrays, excluded, strict=True):
        params = {key: value for key, value in fitted.items() if key != "kind"}
        s, n = q_model.residual(params, k)
        squares, steps = squares + s, steps + n
        if hasattr(q_model, "residual_magnitude"):
            magnitude += q_model.residual_magnitude(params, k)
        fold_values = q_model.initial_centred(params, k)
        initial = fold_values if initial is None else _joined(initial, fold_values)
    dm, dm_stderr, dm_note = direct_method(initial)
    out = {"bellman_rmse": math.sqrt(squares / steps) if steps else None}
    if squares < RESIDUAL_RESOLUTION * np.finfo(np.float64).eps * magnitude:
        out = {"bellman_rmse": None, "bellman_rmse_note": RESIDUAL_UNRESOLVED}
    out |= {"dm": dm, "dm_stderr": dm_stderr}
    if dm_note is not None:
        out["dm_stderr_note"] = dm_note
    share = getattr(q_model, "unlogged_share", None)  # models whose unseen actions get 0
    if share is not None:
        out["unlogged_share"] = max(share(k) for k in excluded)
    for key in per_fold[0]:  # the model's own: ridge (linear), iterations ... (mlp)
        values = [fold[key] for fold in per_fold]
        out[key] = values[0] if len(values) == 1 else values
    return out
