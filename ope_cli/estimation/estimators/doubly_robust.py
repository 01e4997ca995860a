"""Doubly robust estimators (SPEC 9): dm, dr, wdr, registered after the importance ones.

They read two per-step inputs (``Window.fields``), zero after the episode's end:
  q_t: [T] Q-hat(s_t, a_t) of the logged action;
  v_t: [T] V-hat(s_t) = E_{a ~ pi_e} Q-hat(s_t, a).
With W_{-1} = 1 and the absorbing convention (after the end: ratio 1, reward 0, Q = V = 0):

  dm  = (1/n) sum_i v_{i,0}
  dr  = (1/n) sum_i sum_t gamma^t [W_t (r_t - q_t) + W_{t-1} v_t]
  wdr = dm + sum_t gamma^t [sum_i W_t (r_t - q_t + gamma v_{t+1})] / sum_i W_t

The wdr line is SPEC 9's formula regrouped: its V-hat term at step t + 1 has normaliser
sum_i W_{i,t}, the same as step t's, so every per-step sum is relative to W_t (as WPDIS's
are) and ended episodes stay in the normalisers at their final weight.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from ope_cli.estimation.estimators.base import (
    STEP,
    Context,
    Estimator,
    Scale,
    StepSum,
    Sum,
    Sums,
    Trajectory,
    Window,
    jnp,
    register,
    rescaled,
    sum_over_steps,
)
from ope_cli.estimation.estimators.importance import (
    MeanOfTerms,
    closed_form,
    grouped_jackknife,
    replicates_of,
    rewarded_log_scale,
    self_normalised_value,
    weighted,
)
from ope_cli.estimation.estimators.logspace import finite

Q_FIELDS = ("q_t", "v_t")


# dr's own scale (``dr_init``), and as a batch's scale that of its largest term D
# (``Scale.magnitude``), not of its largest weight.
DOUBLY_ROBUST = Scale("doubly_robust", None, magnitude="sum_dr", own="dr_scale")
# dm's ties: about 45 roundings of one V-hat (a policy as an entry point and as a checkpoint
# differs by about 1e-15)
DM_TIE_SHARE = 1e-14
# DM's terms V-hat(s_0), unweighted, about the pivot of one episode's V-hat(s_0)
DM_TERMS = Scale("dm_terms", None, own="dm_log_scale", pivot="dm_v")
DM_SUMS = (Sum("dm_v"), Sum("dm_dev", DM_TERMS, moments=2))


# --- per-episode carry and values (JAX, one episode) -----------------------------------------


def dm_init(zero) -> dict:
    """DM carries V-hat(s_0) once the first step is walked."""
    return {"v_0": zero}


def dm_advance(carry: dict, window: Window) -> tuple[dict, dict]:
    v_0 = jnp().where(window.first_t, window.fields["v_t"], 0.0).sum()
    return {"v_0": carry["v_0"] + v_0}, {}


def dm_values(carry: dict, trajectory: Trajectory) -> dict:
    """V-hat(s_0) (not scaled: no weight), in float64 whatever the kernel's precision, and
    what its moments about a pivot V-hat(s_0) (``DM_TERMS``) read: a value of 1 and a log
    scale of 0. Raw squares of V-hat of 1e12 + N(0, 1) cancelled to a standard error of 0
    (float32 squares lost a spread 1e4 below the mean)."""
    v_0 = carry["v_0"].astype("float64")
    return {"dm_v": v_0, "dm_dev": jnp().ones_like(v_0), "dm_log_scale": jnp().zeros_like(v_0)}


def dr_init(zero) -> dict:
    """DR carries D = sum_t gamma^t [W_t (r_t - q_t) + W_{t-1} v_t] of the steps walked,
    relative to exp(``log_scale``), the largest discounted weight gamma^t W_t (W_{t-1})
    of a term with a non-zero r_t - q_t (v_t) so far: no term overflows, and none
    underflows against a weight that passed e^709 and fell back before the terms."""
    return {"d": zero, "log_scale": zero - math.inf}


def dr_advance(carry: dict, window: Window) -> tuple[dict, dict]:
    q_t, v_t = window.fields["q_t"], window.fields["v_t"]
    log_weight_t = window.log_w_t + window.log_discount_t
    log_previous_t = window.log_w_prev_t + window.log_discount_t
    residual_t = window.reward_t - q_t
    before = carry["log_scale"]
    after = rewarded_log_scale(before, (log_weight_t, residual_t), (log_previous_t, v_t))
    per_step = weighted(log_weight_t, after, residual_t) + weighted(log_previous_t, after, v_t)
    d = rescaled(carry["d"], before, after) + per_step.sum()
    return {"d": d, "log_scale": after}, {}


def dr_values(carry: dict, trajectory: Trajectory) -> dict:
    """D and D^2, relative to its own scale (and its square)."""
    d = carry["d"]
    return {"sum_dr": d, "sum_dr2": d * d, "dr_scale": carry["log_scale"]}


def wdr_advance(carry: dict, window: Window) -> tuple[dict, dict]:
    """Per-step q_t relative to W_t, and v_t relative to W_{t-1}: the v_{t+1} of step t,
    emitted one step late (``StepSum.lag``)."""
    return carry, {"wq_t": window.fields["q_t"], "wv_next_t": window.fields["v_t"]}


# --- finalisation (NumPy, float64) ----------------------------------------------------------


DR_OVERFLOW = "the per-decision weights, the rewards or Q-hat overflow float64"
# (1/n) sum_i V-hat(s_{i,0}); its terms are V-hat's, whose constant the rewards do not carry
dm_estimate = MeanOfTerms(
    "dm_v",
    "dm_dev",
    None,
    "subtract a constant from V-hat (the --v-col values, a Q checkpoint's values, or the "
    "rewards a Q-hat is fitted to)",
    centred=True,
)
dr_estimate = MeanOfTerms("sum_dr", "sum_dr2", "doubly_robust")  # (1/n) sum_i D_i


def _wdr_numerator_t(step_sums: Mapping[str, np.ndarray], discount_t, gamma: float) -> np.ndarray:
    """[..., L] gamma^t sum_i W_t (r_t - q_t + gamma v_{t+1}), relative to W_t as w_t is."""
    s = step_sums
    with np.errstate(over="ignore", invalid="ignore"):  # Q-hat beyond float64: not finite
        return discount_t * (s["wr_t"] - s["wq_t"] + gamma * s["wv_next_t"])


def _wdr_value(sums: Sums, context: Context) -> tuple[float | None, int]:
    numerator_t = _wdr_numerator_t(sums.step_sums, context.discount_t, context.gamma)
    value, empty_step = self_normalised_value(sums, numerator_t)
    if value is None:
        return None, empty_step
    dm = finite(float(dm_estimate(sums)[0]))
    return (None, -1) if dm is None else (value + dm, -1)


def wdr_replicates(sums: Sums, context: Context) -> tuple[np.ndarray, None]:
    """[R] WDR of each bootstrap replicate (NaN where some step has no weight)."""

    def terms_rt(step_sums: Mapping[str, np.ndarray], discount_t: np.ndarray) -> np.ndarray:
        den_t = step_sums["w_t"]
        numerator_t = _wdr_numerator_t(step_sums, discount_t, context.gamma)
        return np.where(den_t > 0, numerator_t / den_t, np.nan)

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        return dm_estimate(sums)[0] + sum_over_steps(
            terms_rt, sums.step_sums, context.discount_t
        ), None


DM = register(
    Estimator(
        name="dm",
        title="DM",
        stderr_method="sample standard error",
        sums=DM_SUMS,
        init=dm_init,
        advance=dm_advance,
        finish=dm_values,
        finalize=closed_form(dm_estimate, "V-hat is not finite"),
        term="dm_v",
        replicates=replicates_of(dm_estimate),
        studentized=True,
        needs=Q_FIELDS,
        # a term is one V-hat(s_0), not a product over steps: two Q checkpoints of 1e12
        # whose dm differed by 0.43 (paired standard error 0.0009) were a tie at 1e-12
        tie_share=DM_TIE_SHARE,
    )
)
DR = register(
    Estimator(
        name="dr",
        title="DR",
        stderr_method="sample standard error",
        sums=(Sum("sum_dr", DOUBLY_ROBUST), Sum("sum_dr2", DOUBLY_ROBUST, power=2)),
        init=dr_init,
        advance=dr_advance,
        finish=dr_values,
        finalize=closed_form(dr_estimate, DR_OVERFLOW),
        term="sum_dr",
        replicates=replicates_of(dr_estimate),
        studentized=True,
        needs=Q_FIELDS,
    )
)
WDR = register(
    Estimator(
        name="wdr",
        title="WDR",
        stderr_method="grouped jackknife over 32 episode-id hash groups",
        # wdr = dm + ...: it reads dm's sums too, which every run with Q-hat computes (both
        # need the same inputs), so they are declared here as well
        sums=(
            *DM_SUMS,
            StepSum("wr_t", STEP, after_end="zero"),
            StepSum("w_t", STEP, after_end="hold"),
            StepSum("wq_t", STEP, after_end="zero"),
            StepSum("wv_next_t", STEP, after_end="zero", lag=1),
        ),
        advance=wdr_advance,
        finalize=grouped_jackknife(
            _wdr_value, lambda sums, context: wdr_replicates(sums, context)[0]
        ),
        replicates=wdr_replicates,
        needs=Q_FIELDS,
    )
)
