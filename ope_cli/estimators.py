"""Pure JAX importance-sampling statistics of one padded batch (no jit, no devices here).

Shapes: B episodes, T steps (a padded bucket), K resampling groups. Weights live in
log space; every sum of weights is returned relative to a scale (the batch's maximum
log-weight, as in log-sum-exp) so that products that over- or underflow as plain
numbers still combine exactly in ``stats``. Padding is absorbing: log-ratio 0 and
reward 0 after an episode ends, so W_t stays at the episode's final weight.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp


class BatchStatistics(NamedTuple):
    """Sufficient statistics of one batch for one policy; merged across batches in ``stats``.

    Trajectory terms use w_i = exp(log W_{i,T_i-1} - log_scale_trajectory); per-decision
    terms use exp(log W_{i,t} - log_scale_step); WPDIS terms use a scale per step t.
    """

    count: jax.Array  # [] episodes
    zero_count: jax.Array  # [] episodes whose trajectory weight is 0
    log_scale_trajectory: jax.Array  # [] max_i log W_{i,T_i-1} (-inf if no episode)
    sum_w: jax.Array  # [] sum_i w_i
    sum_w2: jax.Array  # [] sum_i w_i^2
    sum_wg: jax.Array  # [] sum_i w_i G_i
    sum_w2g: jax.Array  # [] sum_i w_i^2 G_i
    sum_w2g2: jax.Array  # [] sum_i w_i^2 G_i^2
    group_count: jax.Array  # [K] episodes per group
    group_sum_w: jax.Array  # [K] sum of w_i per group (WPDIS denominators after the bucket ends)
    log_scale_step: jax.Array  # [] max_{i,t} log W_{i,t}
    sum_p: jax.Array  # [] sum_i P_i, P_i = sum_t gamma^t W_{i,t} r_{i,t} (scaled)
    sum_p2: jax.Array  # [] sum_i P_i^2 (scaled twice)
    log_scale_t: jax.Array  # [T] max_i log W_{i,t}
    group_num_t: jax.Array  # [K, T] sum_i in group of W_{i,t} r_{i,t} (scaled per t)
    group_den_t: jax.Array  # [K, T] sum_i in group of W_{i,t} (scaled per t)


def log_weights(log_target_t: jax.Array, log_behavior_t: jax.Array, step_mask_t: jax.Array) -> jax.Array:
    """Cumulative log importance weights log W_t = sum_{k<=t} log(pi_e/pi_b), shape [T].

    Padded steps get log-ratio 0 (absorbing), through ``where`` so that whatever the
    policy computed on padding (even NaN) never leaks in.
    """
    log_ratio_t = jnp.where(step_mask_t, log_target_t - log_behavior_t, 0.0)
    return jnp.cumsum(log_ratio_t, axis=-1)


def _safe_scale(log_scale: jax.Array) -> jax.Array:
    """The scale to subtract: 0 where it is -inf (all weights zero) so exp never sees NaN."""
    return jnp.where(jnp.isfinite(log_scale), log_scale, 0.0)


def batch_statistics(
    log_w_bt: jax.Array,
    reward_bt: jax.Array,
    step_mask_bt: jax.Array,
    episode_mask_b: jax.Array,
    group_b: jax.Array,
    gamma: float,
    num_groups: int,
) -> BatchStatistics:
    """Statistics of a padded batch for one policy.

    Args:
      log_w_bt: [B, T] cumulative log weights (``log_weights`` per episode).
      reward_bt: [B, T] rewards, any value on padding.
      step_mask_bt: [B, T] True on real steps.
      episode_mask_b: [B] True on real episodes.
      group_b: [B] int resampling group in [0, num_groups).
      gamma: discount factor.
      num_groups: K.
    """
    dtype = log_w_bt.dtype
    num_steps = log_w_bt.shape[-1]
    log_w_bt = jnp.where(episode_mask_b[:, None], log_w_bt, -jnp.inf)
    reward_bt = jnp.where(step_mask_bt & episode_mask_b[:, None], reward_bt, 0.0)
    discount_t = jnp.asarray(gamma, dtype) ** jnp.arange(num_steps, dtype=dtype)
    one_hot_bk = jax.nn.one_hot(group_b, num_groups, dtype=dtype) * episode_mask_b[:, None]

    # Trajectory-wise terms: IS, WIS and the weight diagnostics.
    log_w_final_b = log_w_bt[:, -1]
    log_scale_trajectory = jnp.max(log_w_final_b)
    w_b = jnp.exp(log_w_final_b - _safe_scale(log_scale_trajectory))
    return_b = jnp.sum(discount_t * reward_bt, axis=-1)
    w2_b = w_b * w_b

    # Per-decision terms: PDIS (one scale for the whole batch).
    log_scale_step = jnp.max(log_w_bt)
    w_step_bt = jnp.exp(log_w_bt - _safe_scale(log_scale_step))
    p_b = jnp.sum(discount_t * w_step_bt * reward_bt, axis=-1)

    # WPDIS terms: a scale per step, so late steps whose weights all drifted far from the
    # early ones still form a well-defined ratio sum_i W_it r_it / sum_i W_it.
    log_scale_t = jnp.max(log_w_bt, axis=0)
    w_t_bt = jnp.exp(log_w_bt - _safe_scale(log_scale_t))

    return BatchStatistics(
        count=jnp.sum(episode_mask_b.astype(dtype)),
        zero_count=jnp.sum((episode_mask_b & (log_w_final_b == -jnp.inf)).astype(dtype)),
        log_scale_trajectory=log_scale_trajectory,
        sum_w=jnp.sum(w_b),
        sum_w2=jnp.sum(w2_b),
        sum_wg=jnp.sum(w_b * return_b),
        sum_w2g=jnp.sum(w2_b * return_b),
        sum_w2g2=jnp.sum(w2_b * return_b * return_b),
        group_count=jnp.sum(one_hot_bk, axis=0),
        group_sum_w=one_hot_bk.T @ w_b,
        log_scale_step=log_scale_step,
        sum_p=jnp.sum(p_b),
        sum_p2=jnp.sum(p_b * p_b),
        log_scale_t=log_scale_t,
        group_num_t=one_hot_bk.T @ (w_t_bt * reward_bt),
        group_den_t=one_hot_bk.T @ w_t_bt,
    )
