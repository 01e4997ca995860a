"""``ope fit-q DATA --policy P --out Q.npz``: fit pi_e's Q on the logged episodes, write it
as a Q checkpoint (SPEC section 9), and report the fit and the dm estimate
(1/n) sum_i V(s_{i,0}) with its sample standard error.

One pass over the data (two for an entry point over discrete actions that declares no
``n_actions``: the first reads the action column for the largest action).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Iterable

import numpy as np

from ope_cli.config import ColumnMapping, QConfig, check_v_samples, check_v_samples_apply
from ope_cli.data.columns import DataSchema
from ope_cli.data.episode_stream import DataConfig, EpisodeStream, open_episodes
from ope_cli.data.episodes import EpisodeChunk
from ope_cli.errors import DataError, UsageError
from ope_cli.estimation.run_plan import GAMMA_DEFAULT, default_gamma_message, resolve_gamma
from ope_cli.models.policies import Policy, check_against_schema, chunk_checks, load_one_policy
from ope_cli.models.q_models.base import (
    DM_TAKES_Q_AS_EXACT,
    FITTED_Q_INTERVALS,
    Q_FIT_NOT_CONVERGED,
    Q_UNLOGGED_ACTIONS,
    check_q_model_fits,
    default_q_model,
    draws_with_seed,
    unconverged_message,
    unlogged_warning,
)
from ope_cli.models.q_models.fitting import FitSettings, fit_q
from ope_cli.models.qfunctions import provenance_arrays
from ope_cli.outputs import check_checkpoint_out, write_checkpoint_file
from ope_cli.report.warnings import replaced_gamma_warning


@dataclasses.dataclass(frozen=True)
class FitQConfig:
    """What ``ope fit-q`` needs, independent of the terminal."""

    data: str
    policy: str
    out: str
    model: str | None = None  # None: the default for the data's types (SPEC section 9)
    gamma: float | None = None  # None: the data's declared gamma, else 1.0
    ridge: float | None = None  # None: linear.RIDGE_PER_STEP * steps
    seed: int | None = None  # None: 0; only the mlp model and sampled actions use it
    v_samples: int = QConfig.v_samples  # continuous actions: draws from pi_e per V-hat(s)
    columns: ColumnMapping = ColumnMapping()
    read_rows: int = 65_536
    overwrite: bool = False  # replace an existing --out


@dataclasses.dataclass(frozen=True)
class FitQResult:
    """What ``ope fit-q`` found. Bellman RMSEs are of r + gamma V(s') - Q(s, a), in reward
    units; ``dm``: (1/n) sum_i V(s_{i,0}) under the written checkpoint, ``dm_stderr`` its
    sample standard error over the initial states, which leaves out the error of the
    fitted Q itself (on ``ope generate chain``, 2000 episodes, tabular: 0.0098, while dm
    spread by 0.034 over 8 datasets)."""

    source: str
    policy: str
    out: str
    model: str
    kind: str
    gamma: float
    episodes: int
    steps: int
    dm: float
    dm_stderr: float | None
    bellman_rmse: float | None
    seconds: float
    ridge: float | None = None  # linear
    iterations: int | None = None  # mlp
    converged: bool | None = None
    heldout_steps: int | None = None
    heldout_bellman_rmse: float | None = None
    gamma_source: str = "option"  # option (--gamma), data (declared) or default
    bellman_rmse_note: str | None = None  # why bellman_rmse is null (the sums' rounding)
    dm_stderr_note: str | None = None  # what float64 resolves of dm_stderr (as evaluate's)
    # pi_e's probability at the logged states on actions never logged there, where Q-hat is
    # 0 (tabular and linear; as evaluate's diagnostics.q.fit.unlogged_share); else None
    unlogged_share: float | None = None
    # what the fit warns about, as ope evaluate does: {"code", "message", "policy"} (None:
    # the whole run, its one policy)
    warnings: tuple[dict[str, str], ...] = ()


def check_options(config: FitQConfig) -> None:
    """UsageErrors for values no data can make valid."""
    check_checkpoint_out(config.out, config.overwrite)
    if config.gamma is not None and not (
        math.isfinite(config.gamma) and 0.0 <= config.gamma <= 1.0
    ):
        raise UsageError(f"--gamma must be in [0, 1], got {config.gamma}")
    if config.ridge is not None and not (math.isfinite(config.ridge) and config.ridge >= 0):
        raise UsageError(f"--ridge must be a number >= 0, got {config.ridge}")
    if config.seed is not None and config.seed < 0:
        raise UsageError(f"--seed must be >= 0, got {config.seed}")
    check_v_samples(config.v_samples)


def check_options_apply(config: FitQConfig, model: str, action_kind: str) -> None:
    """UsageErrors for options that would change nothing with ``model`` on these actions
    (they were ignored without a word)."""
    if config.ridge is not None and model != "linear":
        raise UsageError(f"--ridge applies to the linear model only, not to {model}")
    if config.seed is not None and not draws_with_seed(model, action_kind):
        raise UsageError(
            f"--seed applies to the mlp model and to continuous actions (sampled for V-hat), "
            f"not to the {model} model over discrete actions"
        )
    check_v_samples_apply(config.v_samples, action_kind)


def choose_q_model(model: str | None, schema: DataSchema) -> str:
    """The model asked for (or the data's default), checked against the data's types."""
    if "observation" not in schema.columns:
        raise DataError(
            "fit-q needs the observations, but no observation column was found; "
            "name it with --obs-col"
        )
    chosen = model or default_q_model(schema.observation_kind, schema.action_kind)
    check_q_model_fits(chosen, schema.observation_kind, schema.action_kind)
    return chosen


def largest_logged_action(episodes: Iterable[EpisodeChunk]) -> int:
    """The largest logged (discrete) action over a pass of ``episodes``; -1 without any
    step."""
    largest = -1
    for chunk in episodes:
        largest = max(largest, int(chunk.action.max()))
    return largest


def action_count(largest: int) -> int:
    """1 + the largest logged action; DataError when there was no step."""
    if largest < 0:
        raise DataError("no steps to fit Q on (the data has no episodes)")
    return largest + 1


def _n_actions(policy: Policy, episodes: EpisodeStream) -> int | None:
    """The policy's action count, else (discrete actions) 1 + the largest logged one."""
    if episodes.schema.action_kind != "discrete" or policy.n_actions is not None:
        return policy.n_actions
    return action_count(largest_logged_action(episodes))


# FitQResult's fields that some fits' diagnostics have (None where a fit has none)
FIT_DETAILS = (
    "bellman_rmse_note",
    "dm_stderr_note",
    "ridge",
    "iterations",
    "converged",
    "heldout_steps",
    "heldout_bellman_rmse",
    "unlogged_share",
)


def run_fit_q(config: FitQConfig) -> FitQResult:
    """Fits, writes and measures pi_e's Q of ``config``. Raises OpeError."""
    started = time.perf_counter()
    check_options(config)
    episodes = open_episodes(
        DataConfig(config.data, config.columns, config.read_rows, behavior_column="unread")
    )
    schema = episodes.schema
    model = choose_q_model(config.model, schema)
    check_options_apply(config, model, schema.action_kind)
    declared = episodes.data.declared_bounds()
    gamma, gamma_source = resolve_gamma(config.gamma, declared)
    policy = load_one_policy(config.policy, "--policy")
    check_against_schema(policy, schema)
    n_actions = _n_actions(policy, episodes)
    fit = fit_q(
        episodes.with_checks(functools.partial(chunk_checks, policy)),
        policy,
        FitSettings(
            model,
            gamma,
            ridge=config.ridge,
            seed=config.seed or 0,
            n_actions=n_actions,
            v_samples=config.v_samples,
            discrete=schema.action_kind == "discrete",
        ),
    )
    write_q_checkpoint(config.out, fit.arrays[0], gamma, policy.fingerprint())
    d = fit.diagnostics
    stderr = d["dm_stderr"]
    return FitQResult(
        source=config.data,
        policy=config.policy,
        out=config.out,
        model=fit.model,
        kind=fit.kind,
        gamma=gamma,
        gamma_source=gamma_source,
        episodes=fit.episodes,
        steps=fit.steps,
        dm=d["dm"],
        dm_stderr=None if stderr is None or math.isnan(stderr) else stderr,
        bellman_rmse=d["bellman_rmse"],
        seconds=time.perf_counter() - started,
        **{name: d.get(name) for name in FIT_DETAILS},
        warnings=tuple(  # {code, message, policy}, as every command's (SPEC 12)
            {**warning, "policy": None}
            for warning in fit_warnings(
                gamma_source, fit.episodes, fit.steps, {**d, "model": fit.model, "kind": fit.kind}
            )
        )
        + _replaced_gamma(gamma, gamma_source, declared.gamma),
    )


def fit_warnings(
    gamma_source: str, episodes: int, steps: int, diagnostics: dict | None = None
) -> tuple[dict[str, str], ...]:
    """gamma = 1 by default on episodes of more than one step, as ope evaluate warns: the
    Q-hat of undiscounted returns (fit-q said nothing); an mlp fit that stopped before it
    converged, as ope evaluate warns (``q_fit_not_converged``; fit-q said it in its table
    alone); with a dm estimate, that its interval takes Q-hat as exact (FIT_Q_DM_NOTE)."""
    warnings = []
    if gamma_source == "default" and steps > episodes:
        message = default_gamma_message("Q-hat is fitted to undiscounted returns", "the policy is")
        warnings.append({"code": GAMMA_DEFAULT, "message": message})
    if (diagnostics or {}).get("converged") is False:
        model, iterations = diagnostics.get("model", "mlp"), diagnostics.get("iterations")
        discrete = diagnostics.get("kind") != "mlp_q_sa"
        message = unconverged_message(model, iterations, discrete, "--model linear")
        warnings.append({"code": Q_FIT_NOT_CONVERGED, "message": message})
    if (message := unlogged_warning(diagnostics)) is not None:
        warnings.append({"code": Q_UNLOGGED_ACTIONS, "message": message})
    if (diagnostics or {}).get("dm") is not None:
        warnings.append({"code": FITTED_Q_INTERVALS, "message": FIT_Q_DM_NOTE})
    return tuple(warnings)


def _replaced_gamma(gamma: float, source: str, declared: float | None) -> tuple[dict, ...]:
    """evaluate's GAMMA_REPLACED warning, of the Q-hat fit-q fitted (it said nothing)."""
    warning = replaced_gamma_warning(gamma, source, declared, "Q-hat and its dm are of returns")
    return () if warning is None else (warning.to_dict(),)


# fit-q's dm, as evaluate's with --q fit: a linear Q-hat on ``ope generate control`` gave
# dm 9.129 +- 0.0015 where the truth is 6.08, and fit-q said nothing, where evaluate warns
# that dm is far from dr
FIT_Q_DM_NOTE = (
    f"dm's standard error {DM_TAKES_Q_AS_EXACT}; `ope evaluate --q` with this checkpoint "
    "also gives dr and wdr, "
    "which correct Q-hat with the logged rewards, and warns where dm is far from dr."
)


def write_q_checkpoint(
    path: str, arrays: dict[str, np.ndarray], gamma: float, policy: str | None
) -> None:
    """A Q checkpoint ``.npz``: ``kind``, the fitted arrays, the discount ``gamma`` they
    were fitted for and the fingerprint of the ``policy`` they are the Q of (None: an entry
    point's, which has none); ``ope evaluate`` refuses it for another of either."""
    write_checkpoint_file(path, {**arrays, **provenance_arrays(gamma, policy)})
