"""``--q fit[:MODEL]``: fitted Q evaluation in the run. Before the evaluation pass, a
host-side pass per policy over the episodes (validated as the evaluation reads them)
fits Q-hat of that policy (``fit_q_function``, on ``q_models.fitting.fit_q``), cross-fitted over
``--cross-fit K`` folds of episodes by id hash: episode i is scored with the Q fitted on
the other folds, which the kernel picks per episode exactly as for a cross-fitted
behavior model.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable

import numpy as np

from ope_cli.data.episode_stream import EpisodeStream
from ope_cli.data.episodes import EpisodeChunk
from ope_cli.errors import OpeError
from ope_cli.models.behavior_models.base import largest
from ope_cli.models.policies import Policy
from ope_cli.models.q_models.base import V_SAMPLES
from ope_cli.models.q_models.command import action_count, largest_logged_action
from ope_cli.models.q_models.fitting import FitSettings, QFit, fit_q
from ope_cli.models.qfunctions import FIT, QFunction, fit_model_of, q_checkpoint


def _plain(value):
    """``value`` with non-finite floats as None and NumPy scalars as Python ones (JSON)."""
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def fitted_q(spec: str, fit: QFit, folds: int) -> QFunction:
    """The Q function of a fit: the checkpoint record of its kind, its params stacked over
    the folds ([K, ...]) when cross-fitted, and the fit's summary for the report."""
    first = q_checkpoint(f"--q {spec}", fit.arrays[0])
    summary = {
        "model": fit.model,
        "kind": fit.kind,
        "folds": folds,
        "episodes": fit.episodes,
        "steps": fit.steps,
        **{key: _plain(value) for key, value in fit.diagnostics.items()},
    }
    if folds <= 1:
        return dataclasses.replace(first, name=spec, fit=summary)
    per_fold = [q_checkpoint(f"--q {spec}", arrays).params for arrays in fit.arrays]
    stacked = {key: np.stack([params[key] for params in per_fold]) for key in first.params}
    return dataclasses.replace(first, name=spec, params=stacked, folds=folds, fit=summary)


def _logged_action_count(episodes: Iterable[EpisodeChunk], collectives=None) -> int:
    """1 + the largest logged action over a pass of ``episodes`` and, in a multi-process
    run (``collectives``: its gather and check_all), over every process's."""
    largest_action, error = -1, None
    try:
        largest_action = largest_logged_action(episodes)
    except OpeError as failure:
        if collectives is None:
            raise
        error = failure
    if collectives is not None:  # every process meets here, also one that failed
        gather, check_all = collectives
        check_all(error)
        (largest_action,) = largest(gather, (largest_action,))
    return action_count(largest_action)


def fit_q_function(
    episodes: EpisodeStream,
    policy: Policy,
    spec: str = FIT,
    *,
    gamma: float,
    folds: int,
    seed: int = 0,
    v_samples: int = V_SAMPLES,
    collectives=None,
) -> QFunction:
    """``--q fit[:MODEL]`` (``spec``): pi_e's Q fitted on a pass of ``episodes`` (another
    pass first counts the logged actions of an entry point that declares none), over
    ``folds`` folds of episodes by id hash; ``collectives``: the (gather, check_all) of a
    multi-process run, else None. Raises OpeError."""
    schema = episodes.schema
    discrete = schema.action_kind == "discrete"
    model = fit_model_of(spec, schema.observation_kind, schema.action_kind)
    n_actions = policy.n_actions
    if discrete and n_actions is None:  # an entry point: count the logged actions
        n_actions = _logged_action_count(episodes, collectives)
    settings = FitSettings(
        model,
        gamma,
        folds=folds,
        seed=seed,
        n_actions=n_actions,
        discrete=discrete,
        v_samples=v_samples,
    )
    fit = fit_q(episodes, policy, settings, collectives=collectives)
    return fitted_q(spec, fit, folds)
