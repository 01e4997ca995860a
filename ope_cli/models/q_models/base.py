"""What every fitted Q model shares: the model registry and defaults, the transitions of a
chunk of episodes (next observation from the next step, the last step terminal), their
folds by id hash, and pi_e over every action (or sampled actions) at each step, in JAX.

Folds: an episode's cross-fitting fold is ``ids.episode_folds(key, K)``, the fold
the kernel gives it (``fold_index``); the mlp model also holds out a fifth of the episodes
for early stopping, ``(h % 5K) // K == 0`` of the same hash h, which is independent of the
cross-fitting fold ``h % K`` (for K = 1: fold 0 of 5, the fifth fit-behavior holds out).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import NamedTuple, Protocol

import numpy as np

from ope_cli.data.episodes import EpisodeChunk
from ope_cli.data.ids import episode_folds
from ope_cli.errors import PolicyError, UsageError, summary
from ope_cli.models.behavior_models.base import Gather
from ope_cli.models.policies import Policy, action_log_probs
from ope_cli.models.policies.functions import logit_probs

# model name -> the checkpoint kind it writes (discrete actions; mlp on continuous actions
# writes mlp_q_sa)
MODELS: dict[str, str] = {"tabular": "tabular_q", "linear": "linear_q", "mlp": "mlp_q"}
HOLDOUT_FOLDS = 5
V_SAMPLES = 16  # actions drawn from pi_e per state for V(s) with continuous actions
BLOCK = 4096  # steps per call of the jitted policy programs (padded to a power of two)


def default_q_model(observation_kind: str | None, action_kind: str) -> str:
    """SPEC section 9: tabular for integer-state observations, linear otherwise; mlp for
    continuous actions (the only model over them)."""
    if action_kind != "discrete":
        return "mlp"
    return "tabular" if observation_kind == "index" else "linear"


def draws_with_seed(model: str | None, action_kind: str) -> bool:
    """Whether a Q source draws from ``--seed``: the mlp fit's initial weights, or V-hat's
    actions drawn from pi_e over continuous actions; ``model``: the fitted model (None: a
    Q given whole, a checkpoint or an entry point)."""
    return model == "mlp" or action_kind != "discrete"


def check_q_model_name(model: str, option: str = "--model") -> None:
    """A UsageError naming ``option`` for a model that is not one of MODELS."""
    if model not in MODELS:
        raise UsageError(f"{option}: unknown Q model {model!r} (choose from {', '.join(MODELS)})")


def check_q_model_fits(
    model: str, observation_kind: str | None, action_kind: str, option: str = "--model"
) -> None:
    """A UsageError when ``model`` cannot describe the data's observations and actions;
    ``option`` names the model as the command takes it (``--model`` or ``--q fit:MODEL``)."""
    check_q_model_name(model, option)

    def chosen(name: str) -> str:
        return option.replace("MODEL", name) if "MODEL" in option else f"{option} {name}"

    if model == "tabular" and observation_kind != "index":
        # the linear model takes discrete actions only: it was suggested, then refused
        others = [chosen("linear")] if action_kind == "discrete" else []
        raise UsageError(
            f"{chosen('tabular')} needs integer state observations, but the data's "
            f"observations are {observation_kind} values; use "
            f"{' or '.join([*others, chosen('mlp')])}"
        )
    if model in ("tabular", "linear") and action_kind != "discrete":
        raise UsageError(
            f"{chosen(model)} is over discrete actions, but the data's actions are "
            f"continuous; use {chosen('mlp')}"
        )


# The warning that intervals read from a fitted Q-hat leave out the fit's own error, and
# what it says of dm's (coverage studies on ``ope generate chain``, 100 datasets of 300
# episodes: dm's 95% interval covered the truth 2-37% of the time): evaluate's with --q fit
# and fit-q's say it alike
FITTED_Q_INTERVALS = "fitted_q_intervals"
DM_TAKES_Q_AS_EXACT = (  # of dm's interval, or its standard error
    "takes Q-hat as exact, so its interval is about a biased value when the fit is off (on "
    "generated data, 95% intervals covered the truth 2-37% of the time)"
)


Q_FIT_NOT_CONVERGED = "q_fit_not_converged"  # an mlp Q-hat fit stopped before it converged


def unconverged_message(model: str, iterations, discrete: bool, linear: str) -> str:
    """What a fit that stopped before it converged means (``q_fit_not_converged``, evaluate's
    and fit-q's); the linear model (``linear``: how the command asks for it) is suggested
    for discrete actions only, the ones it fits."""
    way_out = f", or {linear}" if discrete else ""
    return (
        f"the fitted Q-hat ({model}) did not converge in {iterations} iterations (each looks "
        "one step further ahead, and then its held-out values must change by less than 2% "
        "twice: long episodes or a gamma near 1 need more iterations, and noisy values, as "
        "on one-step episodes, may never settle): dm can be far off, by more than its "
        f"interval says; prefer dr or wdr{way_out}."
    )


Q_UNLOGGED_ACTIONS = "q_unlogged_actions"  # pi_e's mass on actions a fitted Q-hat never saw
UNLOGGED_SHARE_WARNED = 1e-3  # of pi_e's probability over the logged states


def unlogged_warning(fit: dict | None) -> str | None:
    """The message of ``q_unlogged_actions`` (evaluate's and fit-q's) for a fit's
    diagnostics ``fit`` (with its ``model``), or None where pi_e gives less than
    UNLOGGED_SHARE_WARNED of its probability to actions the fit never saw."""
    share = (fit or {}).get("unlogged_share")
    if share is None or share < UNLOGGED_SHARE_WARNED:
        return None
    return unlogged_message(fit.get("model"), share, int(fit.get("folds") or 1))


def unlogged_message(model: str, share: float, folds: int = 1) -> str:
    """What pi_e's probability ``share`` on actions never logged means for a fitted Q-hat
    (``q_unlogged_actions``, evaluate's and fit-q's); cross-fitted (``folds`` > 1), each
    episode's Q-hat is fitted on the other folds, whose logs may lack actions its own has
    (it said "never logged" and "their importance weights never occur" of those)."""
    if folds > 1:
        return (
            f"the evaluation policy gives {share:.3g} of its probability at the logged "
            f"states to actions that the other folds never logged there, where each "
            f"episode's cross-fitted Q-hat ({model}, {folds} folds) is 0: dm counts them as "
            "worth 0 (fewer folds, or more episodes, leave fewer such actions)."
        )
    return (
        f"the evaluation policy gives {share:.3g} of its probability at the logged states to "
        f"actions never logged there, where the fitted Q-hat ({model}) is 0: dm counts them "
        "as worth 0, and no estimate from these logs sees them (their importance weights "
        "never occur either)."
    )


def kind_of(model: str, discrete: bool) -> str:
    """The checkpoint kind a model writes: mlp over continuous actions writes mlp_q_sa."""
    return MODELS[model] if discrete or model != "mlp" else "mlp_q_sa"


@dataclasses.dataclass
class Transitions:
    """The steps of one EpisodeChunk as transitions (N steps, E episodes).

    observation [N] or [N, d]; action [N] (int) or [N] / [N, k] (float); reward [N];
    done [N] bool, the last step of its episode (V(s_T) = 0); next_row [N] the row of the
    next step (its own row where done); first [N] bool, step 0; fold [N] cross-fitting
    fold; holdout [N] bool, the mlp's held-out fifth; probs [N, A] pi_e(a|s_t) (discrete
    models that need it) or samples [N, M, k] actions drawn from pi_e at s_t (continuous).
    """

    observation: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    done: np.ndarray
    next_row: np.ndarray
    first: np.ndarray
    fold: np.ndarray
    holdout: np.ndarray
    probs: np.ndarray | None = None
    samples: np.ndarray | None = None

    @property
    def size(self) -> int:
        return int(self.reward.shape[0])

    def next_of(self, values: np.ndarray) -> np.ndarray:
        """``values`` [N, ...] of each step's next state (zeros where done). A step that is
        not its episode's last is followed by the next row (``next_row`` = row + 1 there, as
        ``transitions`` builds it), so this is one shifted copy rather than a gather over
        ``next_row`` (a third of the time)."""
        shifted = np.empty_like(values)
        shifted[:-1] = values[1:]
        shifted[-1:] = 0  # an episode's last step: done
        shifted[self.done] = 0
        return shifted


def episode_split(keys: np.ndarray, folds: int) -> tuple[np.ndarray, np.ndarray]:
    """([E] cross-fitting fold in [0, folds), [E] bool held out) of episode keys [E]."""
    hashed = episode_folds(keys, HOLDOUT_FOLDS * max(folds, 1))
    return hashed % max(folds, 1), hashed // max(folds, 1) == 0


def transitions(chunk: EpisodeChunk, folds: int) -> Transitions:
    """The chunk's steps as transitions, vectorised over its episodes."""
    n = chunk.num_steps
    starts, ends = chunk.offsets[:-1], chunk.offsets[1:] - 1
    done = np.zeros(n, bool)
    done[ends] = True
    first = np.zeros(n, bool)
    first[starts] = True
    rows = np.arange(n)
    fold, holdout = episode_split(chunk.keys, folds)
    return Transitions(
        observation=chunk.observation,
        action=chunk.action,
        reward=np.asarray(chunk.reward, np.float64),
        done=done,
        next_row=np.where(done, rows, rows + 1),
        first=first,
        fold=np.repeat(fold, chunk.lengths),
        holdout=np.repeat(holdout, chunk.lengths),
    )


def step_keys(chunk: EpisodeChunk) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """[N] uint32 halves of each step's episode key and [N] uint32 step index, so sampled
    actions depend on the episode and step only, not on the batching."""
    keys = np.repeat(np.asarray(chunk.keys, np.uint64), chunk.lengths)
    step = np.arange(chunk.num_steps) - np.repeat(chunk.offsets[:-1], chunk.lengths)
    hi = (keys >> np.uint64(32)).astype(np.uint32)
    return hi, (keys & np.uint64(0xFFFFFFFF)).astype(np.uint32), step.astype(np.uint32)


# --- pi_e over the actions, in JAX ---------------------------------------------------------


@functools.cache  # one jitted program per (log_prob, logits, n_actions): compiled once
def _probs_program(log_prob, logits, n_actions: int):
    import jax
    import jax.numpy as jnp

    def probs(params, observation):
        shared = logit_probs(logits, params, observation, n_actions)
        if shared is not None:  # a softmax checkpoint's: exp of no log-probability
            return shared[1]
        return jnp.exp(action_log_probs(log_prob, params, observation, n_actions))

    return jax.jit(jax.vmap(probs, in_axes=(None, 0)))


@functools.cache
def _sample_program(sample, m: int):
    import jax

    def draws(params, seed, hi, lo, step, observation):
        key = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), hi), lo)
        keys = jax.random.split(jax.random.fold_in(key, step), m)
        return jax.vmap(sample, in_axes=(None, 0, None))(params, keys, observation)

    return jax.jit(jax.vmap(draws, in_axes=(None, None, 0, 0, 0, 0)))


def _blocks(program, arrays: tuple[np.ndarray, ...]) -> np.ndarray:
    """``program(*block)`` over blocks of BLOCK rows, each padded to a power of two (a few
    compiled shapes), concatenated: [N, ...]."""
    n = arrays[0].shape[0]
    out = []
    for start in range(0, n, BLOCK):  # blocks of steps, not steps
        parts = [a[start : start + BLOCK] for a in arrays]
        rows = parts[0].shape[0]
        size = max(64, 1 << (rows - 1).bit_length())
        padded = [np.concatenate([p, np.repeat(p[:1], size - rows, axis=0)]) for p in parts]
        out.append(np.asarray(program(*padded))[:rows])
    return np.concatenate(out)


def policy_probs(policy: Policy, observation: np.ndarray, n_actions: int) -> np.ndarray:
    """[N, n_actions] pi_e(a|s) of every action at each observation ([N] or [N, d])."""
    program = _probs_program(policy.log_prob, policy.logits, n_actions)
    try:
        probs = _blocks(lambda obs: program(policy.params, obs), (observation,))
    except Exception as error:  # noqa: BLE001 - user code under jit: a policy error
        raise PolicyError(
            f"policy {policy.name}: cannot compute its probabilities of the {n_actions} "
            f"actions: {summary(error)}"
        ) from None
    if probs.shape != (observation.shape[0], n_actions):  # log_prob gave more than a number
        raise PolicyError(
            f"policy {policy.name}: log_prob must return a scalar per step, got shape "
            f"{probs.shape[2:]}"
        )
    if not np.isfinite(probs).all():
        raise PolicyError(f"policy {policy.name} gives NaN or infinite action probabilities")
    return np.asarray(probs, np.float64)


def policy_samples(policy: Policy, chunk: EpisodeChunk, seed: int, m: int = V_SAMPLES):
    """[N, m, k] actions drawn from pi_e at each step's observation (keys from ``seed``,
    the episode key and the step)."""
    if policy.sample is None:
        raise UsageError(
            f"policy {policy.name} cannot sample actions, which fitted Q evaluation needs for "
            "continuous actions (use linear_gaussian, or an entry point object with "
            "sample(key, observation))"
        )
    program = _sample_program(policy.sample, m)
    hi, lo, step = step_keys(chunk)
    try:
        drawn = _blocks(
            lambda *a: program(policy.params, seed, *a), (hi, lo, step, chunk.observation)
        )
    except Exception as error:  # noqa: BLE001 - user code under jit: a policy error
        raise PolicyError(
            f"policy {policy.name}: cannot sample actions: {type(error).__name__}: {error}"
        ) from None
    drawn = np.asarray(drawn, np.float64)
    drawn = drawn[..., None] if drawn.ndim == 2 else drawn
    logged = (1,) if chunk.action.ndim == 1 else chunk.action.shape[1:]
    if drawn.shape[2:] != logged:  # a numpy broadcast error later, an internal error
        raise PolicyError(
            f"policy {policy.name}: sample(key, observation) must return one action shaped as "
            f"the logged ones, {logged}, got shape {drawn.shape[2:]}"
        )
    return drawn


class FoldSums:
    """Per-fold statistics of a model (arrays with a leading [folds] axis, by attribute
    name), pooled over every fold or every fold but one."""

    def _pooled(self, name: str, exclude: int | None) -> np.ndarray:
        array = getattr(self, name)
        total = array.sum(axis=0)
        return total if exclude is None else total - array[exclude]

    def _fold(self, name: str, fold: int | None) -> np.ndarray:
        return self._pooled(name, None) if fold is None else getattr(self, name)[fold]


class InitialValues(NamedTuple):
    """V(s_0) over some episodes, as dm reads it: ``count`` episodes, the sum and the sum of
    squares of V(s_0) - ``pivot`` (one episode's V(s_0): no constant cancels); a model
    that keeps sums of raw values (linear) has the pivot 0, and says whether V(s_0) may
    differ between episodes (``varies``; False: every phibar(s_0) equal under one fit, or
    folds whose means are equal too; None: sums about a pivot, which need not know)."""

    pivot: float
    total: float
    total_sq: float
    count: int
    varies: bool | None = None

    def about(self, pivot: float) -> InitialValues:
        """The same values' sums about ``pivot``."""
        shift = self.pivot - pivot
        if shift == 0 or self.count == 0:
            return self._replace(pivot=pivot)
        total = self.total + self.count * shift
        total_sq = self.total_sq + 2 * shift * self.total + self.count * shift * shift
        return self._replace(pivot=pivot, total=total, total_sq=total_sq)


class QModel(Protocol):
    """A Q model's statistics over folds of episodes.

    ``add`` streams transitions in; ``fit(exclude)`` returns checkpoint arrays (without
    ``kind``) fitted on every fold but ``exclude`` (None: all); ``residual(arrays, fold)``
    is (sum of squared Bellman residuals r + gamma V(s') - Q(s, a), steps) over one
    fold's steps (None: all); ``initial_centred(arrays, fold)`` is the InitialValues of one
    fold's episodes, for the dm estimate.
    """

    name: str
    discrete: bool  # over integer actions (else continuous: mlp only)

    def add(self, batch: Transitions) -> None: ...

    def fit(self, exclude: int | None = None) -> dict[str, np.ndarray]: ...

    def residual(
        self, arrays: dict[str, np.ndarray], fold: int | None = None
    ) -> tuple[float, int]: ...

    def initial_centred(
        self, arrays: dict[str, np.ndarray], fold: int | None = None
    ) -> InitialValues: ...

    def gather_processes(self, gather: Gather) -> None: ...


def centred(v: np.ndarray, counts: np.ndarray | None = None) -> InitialValues:
    """InitialValues of values ``v`` [n] (each ``counts`` [n] times; None: once), about
    the first counted one."""
    counts = np.ones(v.shape) if counts is None else np.asarray(counts, np.float64)
    counted = np.flatnonzero(counts > 0)
    if counted.size == 0:
        return InitialValues(0.0, 0.0, 0.0, 0)
    pivot = float(v[counted[0]])
    deviation = np.where(counts > 0, v - pivot, 0.0)
    return InitialValues(
        pivot,
        float(counts @ deviation),
        float(counts @ (deviation * deviation)),
        int(round(counts.sum())),
    )
