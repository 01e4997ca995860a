"""The vectorised float64 NumPy twin of the kernel: ``ope bench``'s yardstick.

The same padded [B, T] batches in, the same per-batch sufficient statistics out as
``reduction.batch_statistics`` (per resampling group: the trajectory and per-decision sums,
and per-step WPDIS sums with a scale per group and step), merged log-sum-exp style as in
``stats.merge``. It is self-contained, so it stays a fixed yardstick while the kernel grows:
diagnostics the kernel adds beyond these (weight histograms, bootstrap replicates) are not
computed here, which if anything favours NumPy in the comparison.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from ope_cli.data.ids import RESAMPLING_GROUPS

if TYPE_CHECKING:
    from ope_cli.data.buckets import PaddedBatch

TWIN_FIELDS = (
    "count",
    "zero_count",
    "sum_w",
    "sum_w2",
    "sum_wg",
    "sum_w2g",
    "sum_w2g2",
    "sum_p",
    "sum_p2",
)
_TWIN_SCALING = ("one", "one", "w", "w2", "w", "w2", "w2", "p", "p2")


class TwinStatistics(NamedTuple):
    """Float64 statistics of some episodes for one policy (K groups, L steps).

    Sums of weights are relative to exp(log scale): the trajectory sums to
    ``log_scale_trajectory`` (max_i log W_{i,T_i-1}), the per-decision sums to
    ``log_scale_step`` (max_{i,t} log W_{i,t}), the per-step sums of group k to
    ``group_log_scale_kt[k, t]``.
    """

    log_scale_trajectory: float
    log_scale_step: float
    group_sums_kf: np.ndarray  # [K, F] the TWIN_FIELDS per group
    group_log_scale_kt: np.ndarray  # [K, L] max over the group's episodes of log W_{i,t}
    group_num_kt: np.ndarray  # [K, L] sum_{i in k} W_{i,t} r_{i,t} / exp(group_log_scale_kt)
    group_den_kt: np.ndarray  # [K, L] sum_{i in k} W_{i,t} / exp(group_log_scale_kt)


def numpy_linear_softmax_log_prob(
    params: dict, observation_btd: np.ndarray, action_bt: np.ndarray
) -> np.ndarray:
    """[B, T] log softmax((s @ W + b) / temperature)[a], float64, for one linear_softmax policy.

    The A logits are kept as A separate [B, T] planes, so the log-sum-exp over actions is
    elementwise work rather than a reduction over a tiny last axis.
    """
    temperature = float(params.get("temperature", 1.0))
    logits_bta = (
        observation_btd.astype(np.float64, copy=False) @ params["weight"] + params["bias"]
    ) / temperature
    logits_a = [logits_bta[..., a] for a in range(logits_bta.shape[-1])]
    max_bt = np.maximum.reduce(logits_a)
    log_norm_bt = max_bt + np.log(sum(np.exp(plane - max_bt) for plane in logits_a))
    if len(logits_a) <= 32:  # np.choose's limit
        chosen_bt = np.choose(action_bt, logits_a)
    else:
        chosen_bt = np.take_along_axis(logits_bta, action_bt[..., None], axis=-1)[..., 0]
    return chosen_bt - log_norm_bt


def numpy_batch_statistics(
    log_target_bt: np.ndarray,
    log_behavior_bt: np.ndarray,
    reward_bt: np.ndarray,
    step_mask_bt: np.ndarray,
    episode_mask_b: np.ndarray,
    group_b: np.ndarray,
    gamma: float,
    num_groups: int,
) -> TwinStatistics:
    """Log weights and batch statistics of one padded batch, in float64 NumPy.

    Args:
      log_target_bt, log_behavior_bt: [B, T] log pi_e(a|s) and log pi_b(a|s).
      reward_bt: [B, T] rewards, any value on padding.
      step_mask_bt: [B, T] True on real steps.
      episode_mask_b: [B] True on real episodes (False on filler rows).
      group_b: [B] int resampling group in [0, num_groups).

    Sums per group are ``reduceat`` over the episodes sorted by group (no BLAS, whose
    threads make timings erratic on a busy machine, and no K-fold one-hot product).
    """
    num_steps = step_mask_bt.shape[-1]
    real_bt = step_mask_bt & episode_mask_b[:, None]
    # log W_t = sum_{k<=t} log ratio; padding has ratio 1 (absorbing), filler rows weight 0.
    log_w_bt = np.cumsum(np.where(step_mask_bt, log_target_bt - log_behavior_bt, 0.0), axis=-1)
    log_w_bt[~episode_mask_b] = -np.inf
    reward_bt = np.where(real_bt, reward_bt, 0.0)
    discount_t = float(gamma) ** np.arange(num_steps, dtype=np.float64)

    order_b = np.argsort(group_b, kind="stable")
    present_k, first_k = np.unique(group_b[order_b], return_index=True)

    def per_group(reduce, values, empty):  # [B, ...] -> [K, ...], episodes grouped by group_b
        out = np.full((num_groups, *values.shape[1:]), empty)
        out[present_k] = reduce.reduceat(values[order_b], first_k, axis=0)
        return out

    group_log_scale_kt = per_group(np.maximum, log_w_bt, -np.inf)
    with np.errstate(under="ignore"):
        w_bt = np.exp(log_w_bt - _finite_or_zero(group_log_scale_kt)[group_b])

    log_scale_trajectory, log_scale_step, per_episode_bf = _per_episode(
        log_w_bt, reward_bt, discount_t, episode_mask_b
    )
    return TwinStatistics(
        log_scale_trajectory=log_scale_trajectory,
        log_scale_step=log_scale_step,
        group_sums_kf=per_group(np.add, per_episode_bf, 0.0),
        group_log_scale_kt=group_log_scale_kt,
        group_num_kt=per_group(np.add, w_bt * reward_bt, 0.0),
        group_den_kt=per_group(np.add, w_bt, 0.0),
    )


def _per_episode(
    log_w_bt: np.ndarray, reward_bt: np.ndarray, discount_t: np.ndarray, episode_mask_b
) -> tuple[float, float, np.ndarray]:
    """(trajectory log scale, step log scale, [B, F] per-episode terms) of the batch's log
    weights ``log_w_bt`` and (zeroed off real steps) rewards: real, zero-weight, w, w^2,
    w G, w^2 G, w^2 G^2, the per-decision sum p and p^2."""
    real_b = episode_mask_b.astype(np.float64)
    log_w_final_b = log_w_bt[:, -1]
    log_scale_trajectory = float(log_w_final_b.max())
    log_scale_step = float(log_w_bt.max())
    with np.errstate(under="ignore"):
        w_b = np.exp(log_w_final_b - _finite_or_zero(log_scale_trajectory))
        p_b = (np.exp(log_w_bt - _finite_or_zero(log_scale_step)) * reward_bt) @ discount_t
    w2_b = w_b * w_b
    return_b = reward_bt @ discount_t
    zero_b = (episode_mask_b & (log_w_final_b == -np.inf)).astype(np.float64)
    per_episode_bf = np.stack(
        [
            real_b,
            zero_b,
            w_b,
            w2_b,
            w_b * return_b,
            w2_b * return_b,
            w2_b * return_b * return_b,
            p_b,
            p_b * p_b,
        ],
        axis=-1,
    )
    return log_scale_trajectory, log_scale_step, per_episode_bf


def _finite_or_zero(log_scale):
    """The scale to subtract: 0 where it is -inf (every weight zero), so exp never sees NaN."""
    return np.where(np.isfinite(log_scale), log_scale, 0.0)


def _rescale(log_scale, new_log_scale):
    """exp(log_scale - new_log_scale), and 1 where both are equal (also both -inf)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.where(log_scale == new_log_scale, 1.0, np.exp(log_scale - new_log_scale))


def twin_init(num_groups: int) -> TwinStatistics:
    """The statistics of no episodes (the identity of ``twin_merge``)."""
    empty = np.zeros((num_groups, 0))
    return TwinStatistics(
        -math.inf, -math.inf, np.zeros((num_groups, len(TWIN_FIELDS))), empty, empty, empty
    )


def _twin_extend(s: TwinStatistics, length: int) -> TwinStatistics:
    """Per-step arrays lengthened to ``length``: after its last step every episode has
    ended, so each group keeps its last weights and gets no more reward."""
    extra = length - s.group_log_scale_kt.shape[-1]
    if extra <= 0:
        return s
    k = s.group_sums_kf.shape[0]
    if s.group_log_scale_kt.shape[-1] == 0:
        last_scale_k, last_den_k = np.full(k, -np.inf), np.zeros(k)
    else:
        last_scale_k, last_den_k = s.group_log_scale_kt[:, -1], s.group_den_kt[:, -1]

    def continued(values_kt, last_k):
        return np.concatenate([values_kt, np.repeat(last_k[:, None], extra, 1)], 1)

    return s._replace(
        group_log_scale_kt=continued(s.group_log_scale_kt, last_scale_k),
        group_num_kt=continued(s.group_num_kt, np.zeros(k)),
        group_den_kt=continued(s.group_den_kt, last_den_k),
    )


def twin_merge(a: TwinStatistics, b: TwinStatistics) -> TwinStatistics:
    """The statistics of the episodes behind ``a`` and ``b`` (sums rescaled to the larger scale)."""
    length = max(a.group_log_scale_kt.shape[-1], b.group_log_scale_kt.shape[-1])
    a, b = _twin_extend(a, length), _twin_extend(b, length)
    trajectory = max(a.log_scale_trajectory, b.log_scale_trajectory)
    step = max(a.log_scale_step, b.log_scale_step)

    def factors_f(s: TwinStatistics) -> np.ndarray:
        w = float(_rescale(s.log_scale_trajectory, trajectory))
        p = float(_rescale(s.log_scale_step, step))
        by_kind = {"one": 1.0, "w": w, "w2": w * w, "p": p, "p2": p * p}
        return np.array([by_kind[kind] for kind in _TWIN_SCALING])

    scale_kt = np.maximum(a.group_log_scale_kt, b.group_log_scale_kt)
    ta_kt = _rescale(a.group_log_scale_kt, scale_kt)
    tb_kt = _rescale(b.group_log_scale_kt, scale_kt)
    return TwinStatistics(
        log_scale_trajectory=trajectory,
        log_scale_step=step,
        group_sums_kf=a.group_sums_kf * factors_f(a) + b.group_sums_kf * factors_f(b),
        group_log_scale_kt=scale_kt,
        group_num_kt=a.group_num_kt * ta_kt + b.group_num_kt * tb_kt,
        group_den_kt=a.group_den_kt * ta_kt + b.group_den_kt * tb_kt,
    )


def _times_exp(value: float, log_scale: float) -> float | None:
    """value * exp(log_scale) without overflowing on the way; None if not finite."""
    if value == 0.0 or not math.isfinite(value):
        return 0.0 if value == 0.0 else None
    log_magnitude = math.log(abs(value)) + log_scale
    return math.copysign(math.exp(log_magnitude), value) if log_magnitude < 709.7 else None


def twin_estimates(s: TwinStatistics, gamma: float, max_length: int) -> dict[str, float | None]:
    """IS, WIS, PDIS and WPDIS from merged statistics (None where undefined or not finite)."""
    total_f = dict(zip(TWIN_FIELDS, s.group_sums_kf.sum(axis=0), strict=True))
    n = total_f["count"]
    s = _twin_extend(s, max_length)
    scale_kt, num_kt, den_kt = (
        x[:, :max_length] for x in (s.group_log_scale_kt, s.group_num_kt, s.group_den_kt)
    )
    log_scale_t = scale_kt.max(axis=0)
    den_t = np.sum(den_kt * _rescale(scale_kt, log_scale_t), axis=0)
    num_t = np.sum(num_kt * _rescale(scale_kt, log_scale_t), axis=0)
    discount_t = float(gamma) ** np.arange(max_length, dtype=np.float64)
    wpdis = float(np.sum(discount_t * num_t / den_t)) if (den_t > 0).all() else None
    return {
        "is": _times_exp(total_f["sum_wg"] / n, s.log_scale_trajectory),
        "wis": total_f["sum_wg"] / total_f["sum_w"] if total_f["sum_w"] > 0 else None,
        "pdis": _times_exp(total_f["sum_p"] / n, s.log_scale_step),
        "wpdis": wpdis if wpdis is not None and math.isfinite(wpdis) else None,
    }


def numpy_statistics(
    batch: PaddedBatch, params: dict, gamma: float, num_groups: int
) -> TwinStatistics:
    """The NumPy twin of one kernel call for one linear_softmax policy."""
    log_target_bt = numpy_linear_softmax_log_prob(params, batch.observation, batch.action)
    return numpy_batch_statistics(
        log_target_bt,
        batch.log_behavior,
        batch.reward,
        batch.step_mask,
        batch.episode_mask,
        batch.group,
        gamma,
        num_groups,
    )


def numpy_estimates(
    batches: list[PaddedBatch], params: dict, gamma: float, max_length: int
) -> dict[str, float | None]:
    """The four estimates of one linear_softmax policy from padded batches, NumPy only."""
    merged = twin_init(RESAMPLING_GROUPS)
    for batch in batches:
        merged = twin_merge(merged, numpy_statistics(batch, params, gamma, RESAMPLING_GROUPS))
    return twin_estimates(merged, gamma, max_length)
