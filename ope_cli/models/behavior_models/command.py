"""``ope fit-behavior``: fit a behavior model to the logged actions, write it as a policy
checkpoint, and measure it: the mean log-likelihood of held-out episodes (a fixed fifth of
them, by id hash) under a fit on the others, and, where the data also logs propensities,
how far the estimated probabilities are from the logged ones.

Passes over the data: one to fit (the checkpoint is fitted on every episode, the held-out
score on the other four fifths, from the same per-fold statistics), and a second, host-only
one to compare with a logged propensity column when there is one.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Iterable, Iterator

import numpy as np

from ope_cli.config import ColumnMapping
from ope_cli.data.columns import DataSchema
from ope_cli.data.episode_stream import DataConfig, EpisodeStream, open_episodes
from ope_cli.data.episodes import EpisodeChunk
from ope_cli.errors import DataError, first_line
from ope_cli.models.behavior import ESTIMATED_BEHAVIOR_OFF
from ope_cli.models.behavior_models.base import BEHAVIOR_FIT_NOT_CONVERGED, MODELS, log_softmax
from ope_cli.models.behavior_models.fitting import (
    HOLDOUT_FOLDS,
    checkpoint_arrays,
    choose_model,
    collect_all,
    heldout_log_likelihood,
    make_model,
)
from ope_cli.models.behavior_models.softmax import logits_of, stopped_short_message
from ope_cli.outputs import check_checkpoint_out, write_checkpoint_file

CALIBRATION_BINS = 10


@dataclasses.dataclass(frozen=True)
class FitBehaviorConfig:
    """What ``ope fit-behavior`` needs, independent of the terminal."""

    data: str
    out: str
    model: str | None = None  # None: the default for the data's types (SPEC section 8)
    columns: ColumnMapping = ColumnMapping()
    read_rows: int = 65_536
    overwrite: bool = False  # replace an existing --out


@dataclasses.dataclass(frozen=True)
class CalibrationBin:
    """Logged steps whose estimated probability of the logged action is in [low, high)."""

    low: float
    high: float
    steps: int
    mean_estimated: float | None
    mean_logged: float | None


@dataclasses.dataclass(frozen=True)
class LoggedComparison:
    """Estimated against logged log pi_b(a|s), over every logged step.

    ``*_log_ratio``: of log(logged / estimated); ``calibration``: for discrete actions, the
    steps binned by estimated probability with the mean logged probability in each bin.
    """

    column: str
    steps: int
    mean_log_ratio: float
    mean_abs_log_ratio: float
    max_abs_log_ratio: float
    calibration: list[CalibrationBin]


@dataclasses.dataclass(frozen=True)
class FitBehaviorResult:
    """What ``ope fit-behavior`` found; log-likelihoods are means per step, in nats."""

    source: str
    out: str
    model: str
    kind: str
    episodes: int
    steps: int
    mean_log_likelihood: float  # in-sample, of the written checkpoint
    heldout_episodes: int
    heldout_steps: int
    heldout_mean_log_likelihood: float | None  # None: no episode fell in the held-out fold
    seconds: float
    logged: LoggedComparison | None = None
    logged_note: str | None = None  # why a logged column the data has was not compared
    warnings: tuple[dict[str, str | None], ...] = ()  # {code, message, policy}, as every command's


# An episode's log-weight error that fit-behavior warns of: the mean log(logged / estimated)
# per step (in-sample, about the KL divergence of the estimate from the logged behavior, <=
# 0 for a model that can represent it, up to its regularisation) times the steps per
# episode. On ``ope generate`` data of every environment the default models gave -0.22 to
# -0.0001; models blind to what the behavior depends on (its choice, or its spread, set by
# |x|) 0.45 and 0.78.
LOGGED_GAP_PER_EPISODE = 0.1


# Nats per step by which the held-out fifth may score below the episodes fitted on before
# fit-behavior calls the model overfitted: the default models on ``ope generate`` data of
# every environment lose far less; mlp_softmax on a 300-episode bandit log lost 2.27
# (-1.22 in sample, -3.49 held out, below a uniform guess's -2.30) and said nothing
OVERFIT_NATS_PER_STEP = 0.5
BEHAVIOR_FIT_OVERFITS = "behavior_fit_overfits"
BEHAVIOR_FIT_UNCHECKED = "behavior_fit_unchecked"  # no held-out episode to score it on


# what to prefer to a model that overfits: only the network has a simpler one to offer
SIMPLER_MODELS = {"mlp_softmax": "a simpler model (linear_softmax, or tabular for integer states)"}


def overfit_message(model: str, in_sample: float, heldout: float | None) -> str | None:
    """What to say where ``model``'s held-out mean log-likelihood is more than
    OVERFIT_NATS_PER_STEP below the in-sample one; None otherwise."""
    if heldout is None or not in_sample - heldout > OVERFIT_NATS_PER_STEP:
        return None
    simpler = f"{SIMPLER_MODELS[model]} or " if model in SIMPLER_MODELS else ""
    return (
        f"the {model} model scores {heldout:.3g} nats per step on the held-out fifth of the "
        f"episodes against {in_sample:.3g} on the episodes it was fitted on: it overfits "
        "them, its probabilities of the logged actions are too high there, and weights made "
        f"with it would be off; prefer {simpler}more episodes."
    )


def unchecked_message(model: str, episodes: int, held_out: int | None) -> str:
    """What to say where no held-out score was made: ``held_out`` of the ``episodes`` fell
    in the held-out fifth (0 or all; None: not known which)."""
    fell = {0: "none", None: "none, or every one,"}.get(held_out, "every one")
    return (
        f"{fell} of the {episodes:,} episode(s) fell in the held-out fifth (by id hash), so "
        f"whether the {model} model overfits them was not checked; fit on more episodes."
    )


def overfit_warnings(
    model: str, in_sample: float, heldout: float | None, episodes: int, held_out: int
) -> tuple[dict, ...]:
    """A warning where the model overfits (``overfit_message``), or where the held-out
    fifth (``held_out`` of ``episodes``) or the rest has no episode, so that nothing could
    say whether it does (1 episode: exit 0 with a null held-out score and no word)."""
    if heldout is None:
        message = unchecked_message(model, episodes, held_out)
        return ({"code": BEHAVIOR_FIT_UNCHECKED, "message": message, "policy": None},)
    message = overfit_message(model, in_sample, heldout)
    if message is None:
        return ()
    return ({"code": BEHAVIOR_FIT_OVERFITS, "message": message, "policy": None},)


def stopped_short_warnings(model: str, gradient: float | None) -> tuple[dict, ...]:
    """A warning where the written fit stopped at its step cap short of its tolerance
    (``BehaviorModel.stopped_short``: it said nothing, 1.8e-5 above the optimum's
    objective, each probability up to 1.7% off)."""
    if gradient is None:
        return ()
    message = stopped_short_message(model, gradient)
    return ({"code": BEHAVIOR_FIT_NOT_CONVERGED, "message": message, "policy": None},)


def logged_gap_warnings(
    logged: LoggedComparison | None, episodes: int, steps: int
) -> tuple[dict[str, str | None], ...]:
    """A warning where the estimated model is more than LOGGED_GAP_PER_EPISODE nats of
    log-weight per episode from the logged column (it printed a max |log ratio| of 258 and
    said nothing). A wrong column that sums to 1 over the actions lowers the mean log
    ratio (by its KL divergence from the behavior); one too high raises it."""
    if logged is None or not episodes:
        return ()
    per_episode = logged.mean_log_ratio * steps / episodes
    if not per_episode > LOGGED_GAP_PER_EPISODE:
        return ()
    length = steps / episodes
    message = (
        f"the estimated model is {per_episode:.2g} nats of log-weight per episode from the "
        f"logged column {logged.column!r} (the mean log(logged / estimated), "
        f"{logged.mean_log_ratio:.2g} per step, over "
        f"{'1 step' if length == 1 else f'{length:.3g} steps'} per episode; a model that can "
        "represent the behavior gives 0 or less): it misses what the behavior depends on, "
        "or the column is too high (one that sums to 1 over the actions but is wrong lowers "
        "this mean instead), and trajectory weights made with it would be off by a factor "
        "of about "
        f"{math.exp(min(per_episode, 700.0)):.2g}; try another --model."
    )
    return ({"code": ESTIMATED_BEHAVIOR_OFF, "message": message, "policy": None},)


def write_checkpoint(path: str, model: str, arrays: dict[str, np.ndarray]) -> None:
    """The fitted model as an ``.npz`` policy checkpoint of SPEC section 3."""
    write_checkpoint_file(path, checkpoint_arrays(model, arrays))


def run_fit_behavior(config: FitBehaviorConfig) -> FitBehaviorResult:
    """Fits, writes and measures the behavior model of ``config``. Raises OpeError."""
    started = time.perf_counter()
    check_checkpoint_out(config.out, config.overwrite)
    opened = open_episodes(
        # the propensity column, when the data has a usable one, to compare with; no
        # rewards: the fit is to the logged actions (a log of actions alone fits, and a NaN
        # reward does not stop it)
        DataConfig(
            config.data,
            config.columns,
            config.read_rows,
            behavior_column="if_usable",
            reward_column="unread",
        )
    )
    schema = opened.schema
    # the fit reads no propensities: a logged column with zeros or NaNs (often the reason to
    # fit a behavior model) does not stop it
    episodes = opened.reconfigured(behavior_column="unread") if schema.behavior_logged else opened
    model = choose_model(config.model, schema, f"--model {config.model or '(default)'}")
    collected = collect_all(make_model(model, HOLDOUT_FOLDS), episodes, HOLDOUT_FOLDS)
    fitted = collected.model
    arrays = fitted.fit()
    stopped_short = fitted.stopped_short  # the written fit's, before the held-out one's
    total, steps = fitted.log_likelihood(arrays)
    heldout_total, heldout_steps = heldout_log_likelihood(collected)
    write_checkpoint(config.out, model, arrays)
    heldout = heldout_total / heldout_steps if heldout_steps else None
    logged, logged_note = None, None
    if schema.behavior_logged:
        logged, logged_note = _compare_where_valid(arrays, model, opened, collected.episodes)
    return FitBehaviorResult(
        source=config.data,
        out=config.out,
        model=model,
        kind=MODELS[model],
        episodes=collected.episodes,
        steps=collected.steps,
        mean_log_likelihood=total / steps,
        heldout_episodes=int(collected.fold_episodes[0]),
        heldout_steps=heldout_steps,
        heldout_mean_log_likelihood=heldout,
        seconds=time.perf_counter() - started,
        logged=logged,
        logged_note=logged_note,
        warnings=(
            *stopped_short_warnings(model, stopped_short),
            *overfit_warnings(
                model, total / steps, heldout, collected.episodes, int(collected.fold_episodes[0])
            ),
            *logged_gap_warnings(logged, collected.episodes, collected.steps),
        ),
    )


def _compare_where_valid(
    arrays, model: str, opened: EpisodeStream, episodes: int
) -> tuple[LoggedComparison | None, str | None]:
    """The comparison with the logged column over all ``episodes`` fitted on, or (None,
    why) where the column is invalid in some of them (a comparison over the others would
    not be over the data the model was fitted on)."""
    valid = [0]

    def counted(chunks: Iterable[EpisodeChunk]) -> Iterator[EpisodeChunk]:
        for chunk in chunks:
            valid[0] += len(chunk.lengths)
            yield chunk

    schema = opened.schema
    try:
        comparison = compare_with_logged_propensities(
            arrays, model, counted(opened.reconfigured(on_invalid="drop")), schema
        )
    except DataError as error:  # the checkpoint is written: the comparison is a report's
        return None, f"the logged column could not be read ({first_line(error)}): not compared"
    if valid[0] == episodes and comparison is not None:
        return comparison, None
    role = "behavior_log_prob" if schema.behavior_is_log else "behavior_prob"
    return None, (
        f"the logged column {schema.columns[role]!r} is invalid in {episodes - valid[0]:,} of "
        f"the {episodes:,} episodes: not compared"
    )


def step_log_probs(
    model: str, arrays: dict[str, np.ndarray], observation: np.ndarray, action: np.ndarray
) -> np.ndarray:
    """[N] log pi(a|s) (a log-density for continuous actions) of fitted ``arrays``, NumPy."""
    if model == "tabular":
        return log_softmax(arrays["logits"])[observation, action]
    if model == "linear_gaussian":
        x = observation[:, None] if observation.ndim == 1 else observation
        y = action[:, None] if action.ndim == 1 else action
        z = (y - x @ arrays["weight"] - arrays["bias"]) * np.exp(-arrays["log_std"])
        return np.sum(-0.5 * z * z - arrays["log_std"] - 0.5 * math.log(2 * math.pi), axis=1)
    x = np.asarray(observation, np.float64)
    logits = logits_of(arrays, x[:, None] if x.ndim == 1 else x)
    return np.take_along_axis(logits, action[:, None], axis=1)[:, 0]


def compare_with_logged_propensities(
    arrays, model: str, chunks: Iterable[EpisodeChunk], schema: DataSchema
) -> LoggedComparison | None:
    """Streams the data again: log(logged / estimated) per step, and (discrete actions) the
    calibration of the estimated probabilities against the logged ones; None where
    ``chunks`` hold no step (the column invalid in every episode)."""
    steps, total, total_abs, largest = 0, 0.0, 0.0, 0.0
    counts = np.zeros(CALIBRATION_BINS, np.int64)
    sum_estimated, sum_logged = np.zeros(CALIBRATION_BINS), np.zeros(CALIBRATION_BINS)
    for chunk in chunks:
        log_estimated = step_log_probs(model, arrays, chunk.observation, chunk.action)
        ratio = chunk.log_behavior - log_estimated
        steps += ratio.size
        total += float(ratio.sum())
        total_abs += float(np.abs(ratio).sum())
        largest = max(largest, float(np.abs(ratio).max()))
        if model != "linear_gaussian":
            estimated = np.exp(log_estimated)
            bins = np.minimum((estimated * CALIBRATION_BINS).astype(np.int64), CALIBRATION_BINS - 1)
            counts += np.bincount(bins, minlength=CALIBRATION_BINS)
            sum_estimated += np.bincount(bins, estimated, CALIBRATION_BINS)
            sum_logged += np.bincount(bins, np.exp(chunk.log_behavior), CALIBRATION_BINS)
    calibration = [
        CalibrationBin(
            low=k / CALIBRATION_BINS,
            high=(k + 1) / CALIBRATION_BINS,
            steps=int(counts[k]),
            mean_estimated=float(sum_estimated[k] / counts[k]) if counts[k] else None,
            mean_logged=float(sum_logged[k] / counts[k]) if counts[k] else None,
        )
        for k in range(CALIBRATION_BINS)
        if model != "linear_gaussian" and counts[k]
    ]
    if steps == 0:
        return None
    role = "behavior_log_prob" if schema.behavior_is_log else "behavior_prob"
    return LoggedComparison(
        column=schema.columns[role],
        steps=steps,
        mean_log_ratio=total / steps,
        mean_abs_log_ratio=total_abs / steps,
        max_abs_log_ratio=largest,
        calibration=calibration,
    )
