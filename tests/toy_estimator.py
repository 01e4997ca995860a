"""A toy estimator, registered from the tests alone (no edit to ope_cli), to show that a new
estimator needs no change to the core: the mean per-decision weight mass

    toy = (1/n) sum_i sum_{t < T_i} W_{i,t}

(on-policy data: the mean episode length). Its value comes from a per-step sum, its
standard error from scalar per-episode sums; it has bootstrap replicates but no betting
interval. Importing this module registers it (``python -c "import toy_estimator"``).
"""

from __future__ import annotations

import numpy as np

from ope_cli.estimation.estimators import Estimator, register
from ope_cli.estimation.estimators.base import (
    DECISION,
    STEP,
    Context,
    Grouped,
    Point,
    StepSum,
    Sum,
    jnp,
    relative,
    rescaled,
)
from ope_cli.estimation.estimators.logspace import finite, scaled_array


def toy_init(zero):
    """The mass so far, relative to the largest W_t so far."""
    return {"mass": zero}


def toy_advance(carry, window):
    """For ONE episode's window ([C] arrays): the mask per step (relative to W_t), and the
    mass m = sum_t W_t [t < T] so far, relative to the largest W_t so far."""
    np_ = jnp()
    mask_t = window.step_mask_t.astype(window.log_w_t.dtype)
    before, after = window.before.log_peak, window.after.log_peak
    steps = np_.sum(np_.where(window.step_mask_t, relative(window.log_w_t, after), 0.0))
    return {"mass": rescaled(carry["mass"], before, after) + steps}, {"toy_mask_t": mask_t}


def toy_finish(carry, trajectory):
    """m and m^2, relative to the episode's largest W_t (and its square)."""
    mass = carry["mass"]
    return {"toy_mass": mass, "toy_mass2": mass * mass}


def mean_and_sem(sums):
    s, n = sums.sums, sums.sums["count"]
    with np.errstate(divide="ignore", invalid="ignore"):
        variance = np.maximum(s["toy_mass2"] - s["toy_mass"] ** 2 / n, 0.0) / (n - 1)
        stderr = np.where(n > 1, np.sqrt(variance / n), np.nan)
        scale = sums.log_scales["decision"]
        return scaled_array(s["toy_mass"] / n, scale), scaled_array(stderr, scale)


def toy_finalize(grouped: Grouped, context: Context) -> Point:
    totals = grouped.totals
    log_scale_t = totals.step_log_scales["step"]
    with np.errstate(over="ignore", invalid="ignore"):
        weight_t = np.where(np.isfinite(log_scale_t), np.exp(log_scale_t), 0.0)
        value = np.sum(totals.step_sums["toy_mask_t"] * weight_t) / totals.sums["count"]
    return Point(finite(float(value)), finite(float(mean_and_sem(totals)[1])))


def toy_replicates(sums, context: Context):
    return mean_and_sem(sums)


TOY = register(
    Estimator(
        name="toy",
        title="TOY",
        stderr_method="toy sample standard error",
        sums=(
            StepSum("toy_mask_t", STEP, after_end="zero"),
            Sum("toy_mass", DECISION),
            Sum("toy_mass2", DECISION, power=2),
        ),
        init=toy_init,
        advance=toy_advance,
        finish=toy_finish,
        finalize=toy_finalize,
        replicates=toy_replicates,
        studentized=True,
    )
)


def expected_toy(log_target_steps, log_behavior_steps) -> float:
    """The toy value of episodes given as lists of [T_i] log-probability arrays (NumPy)."""
    masses = [
        np.exp(np.cumsum(np.asarray(t) - np.asarray(b))).sum()
        for t, b in zip(log_target_steps, log_behavior_steps, strict=True)
    ]
    return float(np.mean(masses))


if __name__ == "__main__":  # the CLI with the toy registered: python tests/toy_estimator.py ...
    from ope_cli.cli import main

    main()
