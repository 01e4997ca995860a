"""Fitting a behavior model on a stream of episodes, and ``--behavior estimate[:MODEL]``:
a first, host-side pass over the data fits the model; the estimated policy then gives the
kernel log pi_b(a|s) exactly as a ``--behavior`` checkpoint would, its probabilities
raised to ``--min-propensity``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from ope_cli.data.columns import DataSchema
from ope_cli.data.episode_stream import EpisodeStream
from ope_cli.data.episodes import EpisodeChunk
from ope_cli.data.ids import episode_folds
from ope_cli.errors import DataError, OpeError, UsageError
from ope_cli.models.behavior import BehaviorFit, BehaviorSource
from ope_cli.models.behavior_models.base import (
    DISCRETE_MODELS,
    MIN_PROPENSITY,
    MODELS,
    BehaviorModel,
    Gather,
    check_model_fits,
    default_model,
)
from ope_cli.models.behavior_models.gaussian import LinearGaussianModel
from ope_cli.models.behavior_models.softmax import SoftmaxModel
from ope_cli.models.behavior_models.tabular import TabularModel
from ope_cli.models.policies import LogProbFn, Policy, checkpoint_policy

if TYPE_CHECKING:
    from ope_cli.results import PolicyResult


HOLDOUT_FOLDS = 5  # fold 0 of 5 (about 20% of the episodes) is held out
# the models whose in-sample fits evaluate also scores on held-out episodes: the flexible
# one (mlp_softmax on 600 bandit episodes: every IS interval 28% low, without a word)
HELD_OUT_MODELS = ("mlp_softmax",)


def make_model(name: str, folds: int = 1) -> BehaviorModel:
    """An empty model of ``name`` over ``folds`` folds of episodes."""
    if name == "tabular":
        return TabularModel(folds)
    if name == "linear_gaussian":
        return LinearGaussianModel(folds)
    return SoftmaxModel(name, folds)


def choose_model(spec_model: str | None, schema: DataSchema, option: str) -> str:
    """The model asked for (or the data's default), checked against the data's types."""
    if "observation" not in schema.columns:
        raise DataError(
            f"{option} needs the observations, but no observation column was found; "
            "name it with --obs-col"
        )
    model = spec_model or default_model(schema.observation_kind, schema.action_kind)
    check_model_fits(model, schema.observation_kind, schema.action_kind, option)
    return model


@dataclasses.dataclass
class Collected:
    """A model with every chunk's steps added, and what it was fitted on: episodes and
    steps, and episodes per fold ([folds])."""

    model: BehaviorModel
    fold_episodes: np.ndarray
    episodes: int = 0
    steps: int = 0


def collect(model: BehaviorModel, chunks: Iterable[EpisodeChunk], folds: int = 1) -> Collected:
    """Adds every chunk's (observation, action) steps to ``model``, each in its episode's
    fold (``episode_folds`` of the id hash)."""
    done = Collected(model, np.zeros(folds, np.int64))
    for chunk in chunks:
        episode_fold = episode_folds(chunk.keys, folds)
        model.add(chunk.observation, chunk.action, np.repeat(episode_fold, chunk.lengths))
        done.fold_episodes += np.bincount(episode_fold, minlength=folds)
        done.episodes += chunk.num_episodes
        done.steps += chunk.num_steps
    return done


def gathered(collected: Collected, gather: Gather) -> Collected:
    """What every process of a multi-process run collected, as if one process had read
    all the files (``gather``: distributed.allgather_ragged)."""
    collected.model.gather_processes(gather)
    counts = np.array([[collected.episodes, collected.steps]], np.int64)
    episodes, steps = (int(x) for x in gather(counts).sum(axis=0))
    fold_episodes = gather(collected.fold_episodes[None]).sum(axis=0)
    return Collected(collected.model, fold_episodes, episodes, steps)


def checkpoint_arrays(model: str, arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The arrays of a SPEC section 3 checkpoint: ``kind`` plus the fitted parameters."""
    return {"kind": np.array(MODELS[model]), **arrays}


@functools.cache  # one wrapper per function, so the kernel's jit cache recognises it
def floored_log_prob(log_prob: LogProbFn) -> LogProbFn:
    """``log_prob`` raised to ``params["log_floor"]`` (log of --min-propensity)."""

    def log_prob_floored(params, observation, action):
        import jax.numpy as jnp

        inner = {key: value for key, value in params.items() if key != "log_floor"}
        return jnp.maximum(log_prob(inner, observation, action), params["log_floor"])

    return log_prob_floored


def estimated_policy(model: str, arrays: dict[str, np.ndarray], min_propensity: float) -> Policy:
    """The fitted model as a behavior Policy; discrete models floored at ``min_propensity``."""
    policy = checkpoint_policy(f"estimated {model} model", checkpoint_arrays(model, arrays))
    if policy.discrete is False:
        return policy  # densities are not probabilities: no floor
    log_floor = math.log(min_propensity) if min_propensity > 0 else -math.inf
    return dataclasses.replace(
        policy,
        params={**policy.params, "log_floor": np.float64(log_floor)},
        log_prob=floored_log_prob(policy.log_prob),
        logits=None,  # floored, log_prob is no longer their log-softmax
    )


def logged_propensity_column(episodes: EpisodeStream) -> str | None:
    """The data's propensity column when it has one besides the estimate, else None."""
    try:
        schema = episodes.reconfigured(behavior_column="required").schema
    except DataError:
        return None
    role = "behavior_log_prob" if schema.behavior_is_log else "behavior_prob"
    return schema.columns.get(role)


def cross_fitted_policy(
    model: str, collected: Collected, folds: int, min_propensity: float
) -> tuple[Policy, float, int]:
    """The behavior policy of ``--behavior-cross-fit K``: fold k's episodes get the model
    fitted on the other K - 1 folds (params stacked [K, ...]); with the out-of-fold total
    log-likelihood and the count of floored steps."""
    empty = np.flatnonzero(collected.fold_episodes == collected.episodes)
    if empty.size:
        raise UsageError(
            f"--behavior-cross-fit {folds}: every one of the {collected.episodes} episode(s) "
            "falls in one fold, leaving nothing to fit the others on; use fewer folds"
        )
    fitted = collected.model
    per_fold = [fitted.fit(exclude=k) for k in range(folds)]
    policies = [estimated_policy(model, arrays, min_propensity) for arrays in per_fold]
    total = sum(fitted.log_likelihood(arrays, k)[0] for k, arrays in enumerate(per_fold))
    floored = sum(fitted.floored(arrays, k, min_propensity) for k, arrays in enumerate(per_fold))
    stacked = {key: np.stack([p.params[key] for p in policies]) for key in policies[0].params}
    policy = dataclasses.replace(policies[0], params=stacked, folds=folds)
    return policy, total, floored


def collect_all(model, chunks, folds: int, collectives=None) -> Collected:
    """``collect`` on this process's share; with ``collectives`` = (gather, check_all) of
    a multi-process run, every process then holds what all of them collected (a data
    error in one process stops all of them, as in the evaluation pass)."""
    if collectives is None:
        collected = collect(model, chunks, folds)
    else:
        gather, check_all = collectives
        error = None
        try:
            collected = collect(model, chunks, folds)
        except OpeError as failure:
            error = failure
        check_all(error)
        collected = gathered(collected, gather)
    if collected.steps == 0:
        raise DataError("no steps to fit the behavior model on (the data has no episodes)")
    return collected


class EstimatedBehavior(NamedTuple):
    """A behavior model fitted to the logged actions: the behavior ``policy`` it gives the
    kernel, and what the report says about its ``fit``."""

    policy: Policy
    fit: BehaviorFit

    def source(self, logged_column: str | None = None) -> BehaviorSource:
        """The report's record of where the behavior probabilities come from;
        ``logged_column``: the data's propensity column, when it also has one."""
        fit = dataclasses.replace(self.fit, logged_column=logged_column)
        return BehaviorSource("estimated", fit.model, MODELS[fit.model], fit)


def fit_behavior(
    episodes: Iterable[EpisodeChunk],
    model: str,
    *,
    folds: int = 1,
    min_propensity: float = MIN_PROPENSITY,
    collectives=None,
) -> EstimatedBehavior:
    """``--behavior estimate[:MODEL]``: ``model`` fitted on a pass of ``episodes``, its
    probabilities raised to ``min_propensity`` (discrete models); with ``folds`` > 1, each
    fold of episodes (by id hash) gets the model fitted on the others. ``collectives``:
    the (gather, check_all) of a multi-process run, None in one process. Raises OpeError."""
    started = time.perf_counter()
    # an in-sample mlp fit is also scored on held-out episodes (its fit on every step does
    # not depend on the folds the steps are in): it can overfit them without a word
    held_out = folds == 1 and model in HELD_OUT_MODELS
    kept = HOLDOUT_FOLDS if held_out else folds
    collected = collect_all(make_model(model, kept), episodes, kept, collectives)
    heldout = None
    if folds > 1:
        policy, total, floored = cross_fitted_policy(model, collected, folds, min_propensity)
    else:
        arrays = collected.model.fit()
        policy = estimated_policy(model, arrays, min_propensity)
        total = collected.model.log_likelihood(arrays)[0]
        floored = collected.model.floored(arrays, None, min_propensity)
        if held_out:
            heldout_total, heldout_steps = heldout_log_likelihood(collected)
            heldout = heldout_total / heldout_steps if heldout_steps else None
    floors = model in DISCRETE_MODELS  # densities of continuous actions are not floored
    fit = BehaviorFit(
        model=model,
        episodes=collected.episodes,
        steps=collected.steps,
        mean_log_likelihood=total / collected.steps,
        min_propensity=min_propensity if floors else None,
        floored=floored if floors else None,
        seconds=time.perf_counter() - started,
        cross_fit=folds,
        stopped_short=collected.model.stopped_short,
        heldout_mean_log_likelihood=heldout,
    )
    return EstimatedBehavior(policy, fit)


def heldout_log_likelihood(collected: Collected) -> tuple[float, int]:
    """(log-likelihood, steps) of fold 0's steps under the model fitted on the other folds;
    (0, 0) where fold 0 or the rest has no episode."""
    if not 0 < collected.fold_episodes[0] < collected.episodes:
        return 0.0, 0
    return collected.model.log_likelihood(collected.model.fit(exclude=0), 0)


def with_logged_comparison(
    source: BehaviorSource, estimated: list[PolicyResult], logged: list[PolicyResult]
) -> BehaviorSource:
    """``source`` (an estimated model) with each policy's mean trajectory weight and its
    largest gap between estimates (``largest_gap``) under the estimated and under the
    logged propensities (``estimated`` and ``logged``: the two evaluations' results,
    policy by policy)."""
    pairs = list(zip(estimated, logged, strict=True))
    weights = {
        mine.policy: {
            "estimated": mine.diagnostics.mean_weight,
            "logged": theirs.diagnostics.mean_weight,
        }
        for mine, theirs in pairs
    }
    gaps = {mine.policy: largest_gap(mine, theirs) for mine, theirs in pairs}
    fit = dataclasses.replace(source.fit, mean_weight=weights, logged_gap=gaps)
    return dataclasses.replace(source, fit=fit)


def largest_gap(estimated: PolicyResult, logged: PolicyResult) -> dict | None:
    """The estimator whose estimates under the estimated and the logged propensities are
    furthest apart in standard errors (sqrt(se_e^2 + se_l^2): the two share their episodes,
    so this overstates the spread of their difference and understates the gap), as
    ``BehaviorFit.logged_gap`` holds it; None where no estimator has both with a spread."""
    best = None
    for name, mine in estimated.estimates.items():
        theirs = logged.estimates.get(name)
        if theirs is None or None in (mine.value, mine.stderr, theirs.value, theirs.stderr):
            continue
        spread = math.hypot(mine.stderr, theirs.stderr)
        if not (spread > 0 and math.isfinite(spread)):
            continue
        apart = abs(mine.value - theirs.value) / spread
        if math.isfinite(apart) and (best is None or apart > best["standard_errors"]):
            best = {
                "estimator": name,
                "estimated": {"value": mine.value, "stderr": mine.stderr},
                "logged": {"value": theirs.value, "stderr": theirs.stderr},
                "standard_errors": apart,
            }
    return best


def without_logged_mean_weights(source: BehaviorSource, why: str) -> BehaviorSource:
    """``source`` without the comparison with the logged propensities, and ``why``: it
    would not cover the episodes the estimate does."""
    note = f"no mean weights under the logged propensities: {why}"
    return dataclasses.replace(source, fit=dataclasses.replace(source.fit, mean_weight_note=note))
