"""``ope bench``: the performance targets of SPEC section 6, measured as ratios in one run.

On one long-tailed dataset (generated, or ``--data``) it times, on the same episodes:

- ``loop``: the per-episode Python loop of ``examples/is_loop.py``, on the first
  ``--loop-episodes`` episodes, extrapolated to the whole dataset by its steps/s;
- ``numpy``: a vectorised float64 NumPy twin of the kernel (``numpy_batch_statistics``, log
  space) over the same padded batches;
- ``kernel``: the jitted kernel alone on batches already on the device (steady state;
  compile time measured separately, from a cold jit cache), in float32 and float64, and with
  ``--policies`` K stacked policies;
- ``end_to_end``: ``ope evaluate`` (``pipeline.evaluate`` plus the JSON report) from Parquet,
  run once to compile, then timed (also with K policies);
- ``io_floor``: pyarrow alone reading the projected columns and converting them to NumPy;
- with ``--memory``, the peak RSS of ``ope evaluate`` subprocesses on 1x and 10x data.

Steps/s count real (logged) steps. Absolute times on a shared machine are noise; the ratios
between measurements of one run are what the targets are about, and every timed measurement
runs ROUNDS times, round-robin, the fastest counting, so a change in load hits all alike.

The core here knows no terminal: ``bench`` returns a JSON-ready dict, ``render_bench`` draws
it, ``register`` adds the typer command. Heavy imports (NumPy, pyarrow, JAX) happen inside
functions so that ``ope --help`` stays instant.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import importlib.util
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NamedTuple

import typer

from ope_cli import __version__
from ope_cli.config import BatchingConfig
from ope_cli.errors import DataError, UsageError

if TYPE_CHECKING:
    import numpy as np
    from rich.console import Console

    from ope_cli.buckets import PaddedBatch

BENCH_SCHEMA_VERSION = 1
GAMMA = 0.99
OBS_DIM = 8
N_ACTIONS = 4
MEDIAN_LENGTH = 50
LENGTH_SIGMA = 1.0  # lognormal: p99 ~ 500 steps, p99.9 ~ 1,100, the longest of 24k ~ 2,000
MAX_LENGTH = 2000
DEFAULT_EPISODES = 24_000  # ~2M steps
DEFAULT_LOOP_EPISODES = 300
DEFAULT_MEMORY_STEPS = 200_000
MEMORY_FACTOR = 10
POLICY_SHIFT = 0.1  # evaluation policy = behavior + N(0, shift^2) on every parameter
BLOCK_EPISODES = 8192  # episodes generated and written at a time (bounds memory)
ROW_GROUP_ROWS = 1 << 17
ROUNDS = 3  # interleaved timed runs of every measurement; the fastest of each counts

# SPEC section 6.
TARGET_LOOP_SPEEDUP = 1000.0
TARGET_END_TO_END_OVER_IO = 1.5
TARGET_PADDING_WASTE = 0.25
TARGET_MEMORY_GROWTH = 1.2


@dataclasses.dataclass(frozen=True)
class BenchConfig:
    """Everything ``ope bench`` needs, independent of the terminal.

    Attributes:
      data: a step-layout Parquet file/directory to measure instead of generated data.
      episodes: episodes to generate (about 83 steps each).
      seed: seed of the generated data and checkpoints.
      policies: K, the stacked linear_softmax checkpoints of the many-policies measurement.
      precision: the kernel precision of the main measurements (None: as ``ope evaluate``).
      memory: also measure peak memory of ``ope evaluate`` subprocesses on 1x and 10x data.
      memory_steps: steps of the 1x memory dataset.
      loop_episodes: episodes the Python loop runs on (then extrapolated).
      out: directory for generated files (default: a temporary directory, removed after).
      batching: read and batch sizes, as ``ope evaluate``'s.
    """

    data: str | None = None
    episodes: int = DEFAULT_EPISODES
    seed: int = 0
    policies: int = 4
    precision: str | None = None
    memory: bool = False
    memory_steps: int = DEFAULT_MEMORY_STEPS
    loop_episodes: int = DEFAULT_LOOP_EPISODES
    out: str | None = None
    batching: BatchingConfig = BatchingConfig()


Progress = Callable[[str], None]


# --- data --------------------------------------------------------------------------------


def episode_lengths(rng: np.random.Generator, episodes: int) -> np.ndarray:
    """[E] int64 long-tailed lengths: lognormal with median MEDIAN_LENGTH, in [1, MAX_LENGTH]."""
    import numpy as np

    lengths = np.rint(rng.lognormal(math.log(MEDIAN_LENGTH), LENGTH_SIGMA, size=episodes))
    return np.clip(lengths, 1, MAX_LENGTH).astype(np.int64)


def episodes_for_steps(steps: int) -> int:
    """Episodes whose expected total length is about ``steps``."""
    mean = MEDIAN_LENGTH * math.exp(LENGTH_SIGMA**2 / 2)
    return max(1, round(steps / mean))


def behavior_params(seed: int, obs_dim: int = OBS_DIM, n_actions: int = N_ACTIONS) -> dict:
    """The behavior policy of the generated data: linear_softmax weight [d, A], bias [A]."""
    import numpy as np

    rng = np.random.default_rng([seed, 0])
    return {
        "weight": rng.normal(size=(obs_dim, n_actions)) / math.sqrt(obs_dim),
        "bias": 0.5 * rng.normal(size=n_actions),
    }


def _softmax_rows(logits: np.ndarray) -> np.ndarray:
    import numpy as np

    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def step_table(first_id: int, lengths: np.ndarray, behavior: dict, rng: np.random.Generator):
    """A step-layout pyarrow Table of episodes ``first_id, first_id + 1, ...`` with the given
    lengths: observation list<float32>[d] ~ N(0, 1), actions drawn from ``behavior``, its
    probability of the logged action, and a reward that depends on state and action."""
    import numpy as np
    import pyarrow as pa

    n = int(lengths.sum())
    obs_dim, n_actions = behavior["weight"].shape
    starts = np.cumsum(lengths) - lengths
    episode_id = np.repeat(np.arange(first_id, first_id + lengths.size, dtype=np.int64), lengths)
    step = np.arange(n, dtype=np.int64) - np.repeat(starts, lengths)
    observation = rng.standard_normal((n, obs_dim), dtype=np.float32)
    probs = _softmax_rows(observation.astype(np.float64) @ behavior["weight"] + behavior["bias"])
    uniform = rng.random(n)[:, None]
    action = (uniform > np.cumsum(probs, axis=1)[:, :-1]).sum(axis=1).astype(np.int64)
    behavior_prob = probs[np.arange(n), action]
    reward_table = np.linspace(-1.0, 1.0, obs_dim * n_actions).reshape(obs_dim, n_actions)
    reward = np.tanh(observation.astype(np.float64) @ reward_table)[np.arange(n), action]
    reward += 0.1 * rng.standard_normal(n)
    offsets = pa.array(np.arange(0, n * obs_dim + 1, obs_dim, dtype=np.int32))
    return pa.table(
        {
            "episode_id": episode_id,
            "step": step,
            "observation": pa.ListArray.from_arrays(offsets, pa.array(observation.ravel())),
            "action": action,
            "reward": reward,
            "behavior_prob": behavior_prob,
        }
    )


def generate_data(path: str | os.PathLike, episodes: int, seed: int) -> dict:
    """Writes the long-tailed bench dataset (step layout, one Parquet file) block by block
    and returns {"episodes", "steps", "lengths"} ([E] int64 lengths)."""
    import numpy as np
    import pyarrow.parquet as pq

    lengths = episode_lengths(np.random.default_rng([seed, 1]), episodes)
    behavior = behavior_params(seed)
    writer = None
    try:
        for block, first in enumerate(range(0, episodes, BLOCK_EPISODES)):
            table = step_table(
                first,
                lengths[first : first + BLOCK_EPISODES],
                behavior,
                np.random.default_rng([seed, 2, block]),
            )
            if writer is None:
                writer = pq.ParquetWriter(str(path), table.schema)
            writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
    finally:
        if writer is not None:
            writer.close()
    return {"episodes": episodes, "steps": int(lengths.sum()), "lengths": lengths}


def write_checkpoints(directory: Path, k: int, seed: int, behavior: dict) -> list[str]:
    """K linear_softmax checkpoints near ``behavior`` (eval_0.npz, ...); returns their paths."""
    import numpy as np

    rng = np.random.default_rng([seed, 3])
    paths = []
    for i in range(k):
        path = directory / f"eval_{i}.npz"
        arrays = {
            name: value + POLICY_SHIFT * rng.normal(size=value.shape)
            for name, value in behavior.items()
        }
        with open(path, "wb") as handle:
            np.savez(handle, kind=np.asarray("linear_softmax"), **arrays)
        paths.append(str(path))
    return paths


def _inspect_data(source: str, batching: BatchingConfig) -> dict:
    """What the bench needs to know about ``--data``: schema, sizes, observation dim and
    action count (for checkpoints that fit), and the episode lengths."""
    import numpy as np
    import pyarrow.compute as pc

    from ope_cli.config import ColumnMapping
    from ope_cli.schema import resolve_schema
    from ope_cli.sources import iter_batches, open_dataset

    data = open_dataset(source)
    schema = resolve_schema(data.schema, ColumnMapping(), logged_target=False)
    if (
        schema.layout != "step"
        or schema.observation_kind != "vector"
        or schema.action_kind != "discrete"
    ):
        raise UsageError(
            "ope bench --data needs step-layout data with vector observations and "
            "integer actions (as `ope bench` generates)"
        )
    episode_col, obs_col, action_col = (
        schema.columns[role] for role in ("episode", "observation", "action")
    )
    ids, obs_dim, max_action = [], None, 0
    for sourced in iter_batches(data, [episode_col, obs_col, action_col], batching.read_rows):
        batch = sourced.batch
        if batch.num_rows == 0:
            continue
        ids.append(np.asarray(batch.column(episode_col).to_numpy(zero_copy_only=False)))
        if obs_dim is None:
            obs_dim = int(pc.list_value_length(batch.column(obs_col)[:1])[0].as_py())
        max_action = max(max_action, int(pc.max(batch.column(action_col)).as_py()))
    if not ids:
        raise DataError(f"{source}: no rows")
    ids_all = np.concatenate(ids)
    boundaries = np.flatnonzero(ids_all[1:] != ids_all[:-1]) + 1
    lengths = np.diff(np.concatenate([[0], boundaries, [ids_all.size]]))
    return {
        "episodes": int(lengths.size),
        "steps": int(ids_all.size),
        "lengths": lengths,
        "obs_dim": obs_dim,
        "n_actions": max_action + 1,
    }


# --- the NumPy twin of the kernel ------------------------------------------------------------
#
# The same padded [B, T] batches in, the same per-batch sufficient statistics out as
# ``estimators.batch_statistics`` (per resampling group: the trajectory and per-decision sums,
# and per-step WPDIS sums with a scale per group and step), merged log-sum-exp style as in
# ``stats.merge``. It is self-contained, so it stays a fixed yardstick while the kernel grows:
# diagnostics the kernel adds beyond these (weight histograms, bootstrap replicates) are not
# computed here, which if anything favours NumPy in the comparison.

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
    import numpy as np

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
    import numpy as np

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
    return TwinStatistics(
        log_scale_trajectory=log_scale_trajectory,
        log_scale_step=log_scale_step,
        group_sums_kf=per_group(np.add, per_episode_bf, 0.0),
        group_log_scale_kt=group_log_scale_kt,
        group_num_kt=per_group(np.add, w_bt * reward_bt, 0.0),
        group_den_kt=per_group(np.add, w_bt, 0.0),
    )


def _finite_or_zero(log_scale):
    """The scale to subtract: 0 where it is -inf (every weight zero), so exp never sees NaN."""
    import numpy as np

    return np.where(np.isfinite(log_scale), log_scale, 0.0)


def _rescale(log_scale, new_log_scale):
    """exp(log_scale - new_log_scale), and 1 where both are equal (also both -inf)."""
    import numpy as np

    with np.errstate(invalid="ignore", over="ignore"):
        return np.where(log_scale == new_log_scale, 1.0, np.exp(log_scale - new_log_scale))


def twin_init(num_groups: int) -> TwinStatistics:
    """The statistics of no episodes (the identity of ``twin_merge``)."""
    import numpy as np

    empty = np.zeros((num_groups, 0))
    return TwinStatistics(
        -math.inf, -math.inf, np.zeros((num_groups, len(TWIN_FIELDS))), empty, empty, empty
    )


def _twin_extend(s: TwinStatistics, length: int) -> TwinStatistics:
    """Per-step arrays lengthened to ``length``: after its last step every episode has
    ended, so each group keeps its last weights and gets no more reward."""
    import numpy as np

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
    import numpy as np

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
    import numpy as np

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
    from ope_cli.buckets import RESAMPLING_GROUPS

    merged = twin_init(RESAMPLING_GROUPS)
    for batch in batches:
        merged = twin_merge(merged, numpy_statistics(batch, params, gamma, RESAMPLING_GROUPS))
    return twin_estimates(merged, gamma, max_length)


# --- measurements --------------------------------------------------------------------------


def _rate(steps: int, seconds: float) -> float | None:
    return steps / seconds if seconds > 0 else None


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b is not None and b > 0 else None


def _timed(function: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    value = function()
    return time.perf_counter() - started, value


def host_batches(source: str, batching: BatchingConfig, devices: int):
    """Every padded batch of ``source`` as ``ope evaluate`` builds them (same reader,
    assembler and bucketer), kept on the host; returns (batches, bucketer, max_length)."""
    from ope_cli.buckets import Bucketer
    from ope_cli.config import ColumnMapping
    from ope_cli.episodes import EpisodeAssembler
    from ope_cli.schema import resolve_schema
    from ope_cli.sources import iter_batches, open_dataset

    data = open_dataset(source)
    schema = resolve_schema(data.schema, ColumnMapping(), logged_target=False)
    bucketer = Bucketer(batching, multiple_of=devices)
    batches, max_length = [], 0
    assembler = EpisodeAssembler(schema)
    for chunk in assembler.chunks(iter_batches(data, schema.read_columns, batching.read_rows)):
        max_length = max(max_length, int(chunk.lengths.max()))
        batches.extend(bucketer.add(chunk))
    batches.extend(bucketer.flush())
    return batches, bucketer, max_length


@dataclasses.dataclass
class Trial:
    """One measurement, prepared (data read, compiled, warmed) and ready to be timed.

    ``run()`` does the timed unit of work once; ``steps`` is how many real steps it covers;
    ``info`` holds what the preparation learned (first-run time, compiles, estimates).
    """

    run: Callable[[], Any]
    steps: int
    info: dict


def time_interleaved(trials: dict[str, Trial], rounds: int) -> dict[str, dict]:
    """Times every trial ``rounds`` times, round-robin, so that a change in the load of a
    shared machine hits all of them alike; the fastest run of each counts."""
    best = {name: math.inf for name in trials}
    for _ in range(rounds):
        for name, trial in trials.items():
            best[name] = min(best[name], _timed(trial.run)[0])
    return {
        name: {
            "seconds": best[name],
            "steps_per_second": _rate(trial.steps, best[name]),
            "runs": rounds,
            **trial.info,
        }
        for name, trial in trials.items()
    }


def prepare_io_floor(source: str, batching: BatchingConfig) -> Trial:
    """pyarrow alone: the projected columns in record batches, each column to NumPy."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.dataset as ds

    from ope_cli.config import ColumnMapping
    from ope_cli.schema import resolve_schema
    from ope_cli.sources import open_dataset

    logged = open_dataset(source)
    columns = resolve_schema(logged.schema, ColumnMapping(), logged_target=False).read_columns
    dataset = ds.dataset(list(logged.files), format=logged.format)

    def read() -> int:
        rows = 0
        for batch in dataset.to_batches(columns=columns, batch_size=batching.read_rows):
            for column in batch.columns:
                if (
                    pa.types.is_list(column.type)
                    or pa.types.is_large_list(column.type)
                    or pa.types.is_fixed_size_list(column.type)
                ):
                    column.flatten().to_numpy().reshape(len(column), -1)
                else:
                    np.asarray(column.to_numpy(zero_copy_only=False))
            rows += batch.num_rows
        return rows

    rows = read()  # the file in the page cache, as for every other measurement
    return Trial(read, rows, {"columns": columns})


def prepare_end_to_end(
    source: str, policies: list[str], precision: str | None, batching: BatchingConfig
) -> tuple[Trial, Any]:
    """``ope evaluate`` from Parquet (pipeline.evaluate plus the JSON report), run once from
    a cold jit cache to compile; returns the trial and that first EvaluationResult."""
    import jax

    from ope_cli.config import EvaluationConfig
    from ope_cli.pipeline import evaluate
    from ope_cli.report import to_json

    config = EvaluationConfig(
        data=source, policies=tuple(policies), gamma=GAMMA, precision=precision, batching=batching
    )

    def run():
        result = evaluate(config)
        to_json(result)
        return result

    jax.clear_caches()
    first_seconds, first = _timed(run)
    return Trial(
        run,
        first.steps,
        {"first_run_seconds": first_seconds, "compiles": first.compiles, "policies": len(policies)},
    ), first


def device_batches(batches: list[PaddedBatch], dtype, mesh) -> list[PaddedBatch]:
    """The batches on the device(s), floats cast to ``dtype``, episodes split over ``mesh``."""
    import jax
    import numpy as np
    from jax.sharding import NamedSharding, PartitionSpec

    from ope_cli.kernel import BATCH_AXIS

    sharding = NamedSharding(mesh, PartitionSpec(BATCH_AXIS)) if mesh is not None else None

    def put(x):
        if x is None:
            return None
        if np.issubdtype(x.dtype, np.floating):
            x = x.astype(dtype, copy=False)
        return jax.device_put(x, sharding)

    on_device = [
        dataclasses.replace(b, **{f.name: put(getattr(b, f.name)) for f in dataclasses.fields(b)})
        for b in batches
    ]
    jax.block_until_ready([dataclasses.astuple(b) for b in on_device])
    return on_device


def prepare_kernel(
    on_device: list[PaddedBatch],
    checkpoints: list[str],
    precision: str,
    mesh,
    real_steps: int,
    max_length: int,
    cold: bool,
) -> Trial:
    """The jitted kernel alone over batches already on the device. One first pass compiles
    (from a cold jit cache when ``cold``); its statistics give the first policy's estimates,
    to compare precisions."""
    import jax
    import numpy as np

    from ope_cli.buckets import RESAMPLING_GROUPS
    from ope_cli.kernel import Kernel, group_policies, trace_count
    from ope_cli.policies import load_policy
    from ope_cli.stats import finalize, from_batch, init, merge

    dtype = np.float64 if precision == "float64" else np.float32
    (group,) = group_policies([load_policy(path) for path in checkpoints])
    kernel = Kernel(group, GAMMA, RESAMPLING_GROUPS, dtype, mesh)

    def one_pass():
        return jax.block_until_ready([kernel(batch) for batch in on_device])

    if cold:
        jax.clear_caches()
    traces = trace_count()
    first_seconds, outputs = _timed(one_pass)
    compiles = trace_count() - traces

    acc = init(RESAMPLING_GROUPS)
    for statistics in jax.device_get(outputs):  # [D, P, ...]
        for device in range(statistics.group_sums.shape[0]):
            one = type(statistics)(*(value[device, 0] for value in statistics))
            acc = merge(acc, from_batch(one))
    estimates, _ = finalize(acc, GAMMA, max_length, 0.95)
    padded_steps = sum(b.step_mask.size for b in on_device)
    return Trial(
        one_pass,
        real_steps,
        {
            "first_run_seconds": first_seconds,
            "compiles": compiles,
            "precision": precision,
            "policies": len(checkpoints),
            "padded_steps": padded_steps,
            "estimates": {name: e.value for name, e in estimates.items()},
        },
    )


def prepare_numpy(
    batches: list[PaddedBatch], checkpoint: str, real_steps: int, max_length: int
) -> Trial:
    """The NumPy twin over the same padded (host) batches, merged and finalized."""
    import numpy as np

    with np.load(checkpoint, allow_pickle=False) as archive:
        params = {k: archive[k] for k in archive.files if k != "kind"}

    def run():
        return numpy_estimates(batches, params, GAMMA, max_length)

    return Trial(run, real_steps, {"precision": "float64", "estimates": run()})


def _load_loop_module():
    """examples/is_loop.py of this checkout, or None when ope runs from an installed wheel."""
    path = Path(__file__).resolve().parent.parent / "examples" / "is_loop.py"
    if not path.is_file():
        return None
    spec = importlib.util.spec_from_file_location("ope_bench_is_loop", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def measure_loop(
    source: str, checkpoint: str, episodes: int, batching: BatchingConfig, total_steps: int
) -> dict:
    """examples/is_loop.py ``loop_estimates`` on the first ``episodes`` episodes (columns
    renamed to the loop's defaults), its steps/s extrapolated to ``total_steps``."""
    import warnings

    import numpy as np
    import pyarrow as pa

    from ope_cli.config import ColumnMapping
    from ope_cli.schema import resolve_schema
    from ope_cli.sources import iter_batches, open_dataset

    module = _load_loop_module()
    if module is None:
        return {
            "steps_per_second": None,
            "note": "examples/is_loop.py not found (installed without the repository's examples/)",
        }
    data = open_dataset(source)
    schema = resolve_schema(data.schema, ColumnMapping(), logged_target=False)
    roles = ("episode", "step", "observation", "action", "reward", "behavior_prob")
    if any(role not in schema.columns for role in roles):
        return {"steps_per_second": None, "note": "the loop needs step and behavior_prob columns"}
    names = [schema.columns[role] for role in roles]
    parts, rows, seen = [], 0, 0
    for sourced in iter_batches(data, names, batching.read_rows):
        ids = np.asarray(sourced.batch.column(names[0]).to_numpy(zero_copy_only=False))
        parts.append(sourced.batch)
        rows += ids.size
        seen += int(np.count_nonzero(ids[1:] != ids[:-1])) + (ids.size > 0)
        if seen > episodes:
            break
    table = pa.Table.from_batches(parts).select(names)
    table = table.rename_columns(
        ["episode_id", "step", "observation", "action", "reward", "behavior_prob"]
    )
    ids = np.asarray(table.column("episode_id").to_numpy())
    starts = np.concatenate([[0], np.flatnonzero(ids[1:] != ids[:-1]) + 1, [ids.size]])
    table = table.slice(0, int(starts[min(episodes, starts.size - 1)]))
    with warnings.catch_warnings(), np.errstate(all="ignore"):
        warnings.simplefilter("ignore")
        seconds, _ = _timed(lambda: module.loop_estimates(table, checkpoint, GAMMA))
    steps_per_second = _rate(table.num_rows, seconds)
    return {
        "seconds": seconds,
        "steps": table.num_rows,
        "episodes": min(episodes, starts.size - 1),
        "steps_per_second": steps_per_second,
        "extrapolated": True,
        "extrapolated_seconds": total_steps / steps_per_second if steps_per_second else None,
        "note": f"run on the first {min(episodes, starts.size - 1)} episodes "
        f"({table.num_rows:,} steps), extrapolated to all {total_steps:,} steps"
        if table.num_rows < total_steps
        else "run on every episode",
    }


def _peak_rss_of(command: list[str], env: dict, stdout_path: Path) -> tuple[int, float]:
    """(peak resident set size in bytes, wall seconds) of one child process.

    The peak is the child's own ``VmHWM`` (/proc/<pid>/status), read every few milliseconds
    once it has exec'd ``command`` (its command line then holds ``command[-1]``, which must
    not be in ours). Not ``ru_maxrss``: Linux folds the forking parent's
    high-water mark into the child's at exec, so a big parent would hide the child's.
    """
    started = time.perf_counter()
    peak_kib = 0
    with open(stdout_path, "wb") as stdout, tempfile.TemporaryFile() as stderr:
        child = subprocess.Popen(
            command, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL, env=env
        )
        status_path = Path(f"/proc/{child.pid}/status")
        cmdline_path = Path(f"/proc/{child.pid}/cmdline")
        marker = command[-1].encode()
        while child.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                if marker in cmdline_path.read_bytes():  # exec'd: its own memory from here on
                    for line in status_path.read_text().splitlines():
                        if line.startswith("VmHWM:"):
                            peak_kib = max(peak_kib, int(line.split()[1]))
            time.sleep(0.005)
        stderr.seek(0)
        message = stderr.read().decode(errors="replace").strip()[-500:]
    if child.returncode != 0:
        raise RuntimeError(f"ope evaluate exited {child.returncode}: {message}")
    return peak_kib * 1024, time.perf_counter() - started


def measure_memory(
    directory: Path,
    base_steps: int,
    seed: int,
    checkpoint: str,
    batching: BatchingConfig,
    progress: Progress,
) -> dict:
    """Peak RSS of ``ope evaluate`` subprocesses on 1x and MEMORY_FACTORx generated data."""
    import json

    runs = {}
    env = dict(os.environ, OPE_CACHE_DIR="off")
    for factor in (1, MEMORY_FACTOR):
        path = directory / f"memory_{factor}x.parquet"
        info = generate_data(path, episodes_for_steps(base_steps * factor), seed + factor)
        progress(f"memory: ope evaluate on {info['steps']:,} steps ({factor}x) in a subprocess")
        command = [
            sys.executable,
            "-m",
            "ope_cli.cli",
            "evaluate",
            "--policy",
            checkpoint,
            "--format",
            "json",
            "--quiet",
            "--read-rows",
            str(batching.read_rows),
            "--batch-steps",
            str(batching.batch_steps),
            "--min-bucket",
            str(batching.min_bucket),
            str(path),
        ]
        peak, seconds = _peak_rss_of(command, env, directory / f"memory_{factor}x.json")
        reported = json.loads((directory / f"memory_{factor}x.json").read_text())
        path.unlink()
        runs[f"{factor}x"] = {
            "steps": reported["dataset"]["steps"],
            "peak_rss_bytes": peak,
            "peak_rss_mib": peak / 2**20,
            "seconds": seconds,
        }
    growth = _ratio(runs[f"{MEMORY_FACTOR}x"]["peak_rss_bytes"], runs["1x"]["peak_rss_bytes"])
    return {
        **runs,
        "growth": growth,
        "factor": MEMORY_FACTOR,
        "method": "VmHWM of each ope evaluate child, read while it runs; compilation cache "
        "off in both",
    }


# --- the whole bench ----------------------------------------------------------------------


@contextlib.contextmanager
def _work_directory(out: str | None) -> Iterator[Path]:
    if out is not None:
        path = Path(out)
        path.mkdir(parents=True, exist_ok=True)
        yield path
    else:
        with tempfile.TemporaryDirectory(prefix="ope-bench-") as name:
            yield Path(name)


@contextlib.contextmanager
def _environment(**values: str) -> Iterator[None]:
    previous = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in previous.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _relative_difference(a: dict, b: dict) -> float | None:
    """max over estimators of |a - b| / |b| (None when an estimate is missing)."""
    differences = []
    for name, reference in b.items():
        value = a.get(name)
        if value is None or reference is None:
            return None
        differences.append(abs(value - reference) / max(abs(reference), 1e-300))
    return max(differences) if differences else None


def _quantiles(lengths: np.ndarray) -> dict:
    import numpy as np

    return {
        "median": float(np.median(lengths)),
        "p90": float(np.quantile(lengths, 0.9)),
        "p99": float(np.quantile(lengths, 0.99)),
        "max": int(lengths.max()),
        "mean": float(lengths.mean()),
        "at_least_1000": int(np.count_nonzero(lengths >= 1000)),
    }


def _target(met: bool | None, value: float | int | None, threshold: str, note: str | None = None):
    entry = {"met": met, "value": value, "threshold": threshold}
    if note:
        entry["note"] = note
    return entry


def bench(config: BenchConfig, on_progress: Progress | None = None) -> dict:
    """Runs every measurement on one dataset and returns the JSON-ready result.

    ``on_progress(message)`` is told what is being measured (for a status line on stderr).
    """
    progress = on_progress or (lambda message: None)
    if config.episodes < 1 or config.policies < 1 or config.loop_episodes < 1:
        raise UsageError("--episodes, --policies and --loop-episodes must be >= 1")
    if config.memory_steps < 1:
        raise UsageError("--memory-steps must be >= 1")
    b = config.batching
    if b.read_rows < 1 or b.batch_steps < 1 or b.min_bucket < 1 or not b.bucket_growth > 1:
        raise UsageError("batching options must be positive, and the bucket growth > 1")
    if config.precision not in (None, "float32", "float64"):
        raise UsageError(f"--precision must be float32 or float64, got {config.precision}")
    # Cold compilations, measured the same way every run (and the user's cache untouched).
    with _environment(OPE_CACHE_DIR="off"), _work_directory(config.out) as directory:
        return _bench(config, directory, progress)


def _bench(config: BenchConfig, directory: Path, progress: Progress) -> dict:
    import jax

    started = time.perf_counter()
    load_before = _load_average()
    jax.config.update("jax_enable_x64", True)
    from ope_cli.kernel import local_mesh

    backend = jax.default_backend()
    precision = config.precision or ("float64" if backend == "cpu" else "float32")
    other = "float32" if precision == "float64" else "float64"
    mesh = local_mesh(None)
    devices = 1 if mesh is None else mesh.size
    source, dataset, lengths, behavior = _dataset(config, directory, progress)
    checkpoints = write_checkpoints(directory, config.policies, config.seed, behavior)
    one, many = checkpoints[:1], checkpoints
    k = config.policies

    progress("end to end: a first ope evaluate (compiles)")
    trials = {"io_floor": prepare_io_floor(source, config.batching)}
    trials["end_to_end"], result = prepare_end_to_end(source, one, precision, config.batching)
    progress("padding every batch on the host, and putting them on the device")
    batches, bucketer, max_length = host_batches(source, config.batching, devices)
    real = bucketer.real_steps
    on_device = {
        name: device_batches(batches, np_dtype, mesh)
        for name, np_dtype in (("float64", "float64"), ("float32", "float32"))
    }
    progress("kernel alone: first passes (compiles)")
    trials["kernel"] = prepare_kernel(
        on_device[precision], one, precision, mesh, real, max_length, cold=True
    )
    trials[f"kernel_{other}"] = prepare_kernel(
        on_device[other], one, other, mesh, real, max_length, cold=False
    )
    if k > 1:
        progress(f"{k} stacked policies: first runs (compile)")
        trials["kernel_many"] = prepare_kernel(
            on_device[precision], many, precision, mesh, real, max_length, cold=False
        )
        trials["end_to_end_many"], _ = prepare_end_to_end(source, many, precision, config.batching)
    trials["numpy"] = prepare_numpy(batches, one[0], real, max_length)
    progress(f"timing everything, {ROUNDS} interleaved rounds")
    m = time_interleaved(trials, ROUNDS)
    m["kernel"]["padded_steps_per_second"] = _rate(
        m["kernel"]["padded_steps"], m["kernel"]["seconds"]
    )
    batch_count = len(batches)
    del batches, on_device, trials

    progress(f"python loop: the first {config.loop_episodes} episodes")
    m["loop"] = measure_loop(
        source, one[0], config.loop_episodes, config.batching, dataset["steps"]
    )
    m["memory"] = None
    if config.memory:
        m["memory"] = measure_memory(
            directory, config.memory_steps, config.seed, one[0], config.batching, progress
        )

    summary = _summary(config, m, result, bucketer, precision)
    return {
        "schema_version": BENCH_SCHEMA_VERSION,
        "tool": {"name": "ope", "version": __version__},
        "dataset": {**dataset, "lengths": _quantiles(lengths)},
        "runtime": {
            "backend": backend,
            "devices": devices,
            "precision": precision,
            "jax": jax.__version__,
            "cpus": os.cpu_count(),
            "load_average": {"start": load_before, "end": _load_average()},
            "timing": f"each measurement's fastest of {ROUNDS} interleaved runs",
            "bench_seconds": time.perf_counter() - started,
        },
        "batching": {
            "read_rows": config.batching.read_rows,
            "batch_steps": config.batching.batch_steps,
            "min_bucket": config.batching.min_bucket,
            "bucket_growth": config.batching.bucket_growth,
            "batches": batch_count,
            "shapes": [list(shape) for shape in sorted(bucketer.shapes)],
        },
        **summary,
    }


def _dataset(config: BenchConfig, directory: Path, progress: Progress):
    """(source, dataset block, [E] lengths, behavior params) of generated or given data."""
    if config.data is None:
        source = str(directory / "bench.parquet")
        progress(f"generating {config.episodes:,} long-tailed episodes")
        seconds, info = _timed(lambda: generate_data(source, config.episodes, config.seed))
        behavior = behavior_params(config.seed)
        dataset = {"source": source, "generated": True, "generate_seconds": seconds}
    else:
        source = config.data
        info = _inspect_data(source, config.batching)
        behavior = behavior_params(config.seed, info["obs_dim"], info["n_actions"])
        dataset = {"source": source, "generated": False}
    obs_dim, n_actions = behavior["weight"].shape
    dataset.update(
        episodes=info["episodes"],
        steps=info["steps"],
        obs_dim=int(obs_dim),
        n_actions=int(n_actions),
        bytes=sum(Path(f).stat().st_size for f in _files(source)),
    )
    return source, dataset, info["lengths"], behavior


def _summary(config: BenchConfig, m: dict, result, bucketer, precision: str) -> dict:
    """Measurements, ratios, padding, compiles, policies, precision and targets."""
    loop, numpy_run, e2e, io_floor, kernel = (
        m[name] for name in ("loop", "numpy", "end_to_end", "io_floor", "kernel")
    )
    other = "float32" if precision == "float64" else "float64"
    kernels = {precision: kernel, other: m[f"kernel_{other}"]}
    for entry in (e2e, kernel):
        entry["compile_seconds"] = max(entry["first_run_seconds"] - entry["seconds"], 0.0)
    shapes = len(bucketer.shapes)
    ratios = {
        "kernel_over_numpy": _ratio(kernel["steps_per_second"], numpy_run["steps_per_second"]),
        "kernel_over_loop": _ratio(kernel["steps_per_second"], loop["steps_per_second"]),
        "end_to_end_over_io_floor": _ratio(e2e["seconds"], io_floor["seconds"]),
        "kernel_over_end_to_end": _ratio(kernel["steps_per_second"], e2e["steps_per_second"]),
    }
    waste = _ratio(bucketer.padded_steps - bucketer.real_steps, bucketer.real_steps)
    padding = {
        "real_steps": bucketer.real_steps,
        "padded_steps": bucketer.padded_steps,
        "ratio": _ratio(bucketer.padded_steps, bucketer.real_steps),
        "waste": waste,
    }
    compiles = {
        "end_to_end": result.compiles,
        "end_to_end_seconds": e2e["compile_seconds"],
        "kernel": kernel["compiles"],
        "kernel_seconds": kernel["compile_seconds"],
        "bucket_shapes": shapes,
        "persistent_cache": "off (cold compiles, measured the same way every run)",
    }
    precisions = {
        name: {
            "steps_per_second": run["steps_per_second"],
            "seconds": run["seconds"],
            "estimates": run["estimates"],
        }
        for name, run in sorted(kernels.items())
    }
    precisions["numpy_float64"] = {"estimates": numpy_run["estimates"]}
    precisions["max_relative_difference"] = _relative_difference(
        kernels["float32"]["estimates"], kernels["float64"]["estimates"]
    )
    precisions["numpy_vs_kernel_max_relative_difference"] = _relative_difference(
        numpy_run["estimates"], kernels["float64"]["estimates"]
    )
    policies = {"k": config.policies}
    if config.policies > 1:
        many, e2e_many = m["kernel_many"], m["end_to_end_many"]
        policies.update(
            steps_per_second_1=kernel["steps_per_second"],
            steps_per_second_k=many["steps_per_second"],
            cost_ratio=_ratio(many["seconds"], kernel["seconds"]),
            cost_per_policy=_ratio(many["seconds"], kernel["seconds"] * config.policies),
            compiles=many["compiles"],
            end_to_end_seconds_1=e2e["seconds"],
            end_to_end_seconds_k=e2e_many["seconds"],
            end_to_end_cost_ratio=_ratio(e2e_many["seconds"], e2e["seconds"]),
        )
    memory = m["memory"]
    growth = None if memory is None else memory["growth"]

    def at_most(value, limit):
        return None if value is None else value <= limit

    targets = {
        "kernel_faster_than_numpy": _target(
            None if ratios["kernel_over_numpy"] is None else ratios["kernel_over_numpy"] > 1,
            ratios["kernel_over_numpy"],
            "> 1 (steps/s ratio)",
        ),
        "kernel_vs_loop": _target(
            None
            if ratios["kernel_over_loop"] is None
            else ratios["kernel_over_loop"] >= TARGET_LOOP_SPEEDUP,
            ratios["kernel_over_loop"],
            f">= {TARGET_LOOP_SPEEDUP:g} (steps/s ratio)",
        ),
        "end_to_end_vs_io_floor": _target(
            at_most(ratios["end_to_end_over_io_floor"], TARGET_END_TO_END_OVER_IO),
            ratios["end_to_end_over_io_floor"],
            f"<= {TARGET_END_TO_END_OVER_IO} (time ratio)",
        ),
        "padding_waste": _target(
            at_most(waste, TARGET_PADDING_WASTE),
            waste,
            f"<= {TARGET_PADDING_WASTE} ((padded - real) / real steps)",
        ),
        "compiles_per_shape": _target(
            result.compiles <= len(result.batch_shapes) and kernel["compiles"] <= shapes,
            result.compiles,
            f"<= {len(result.batch_shapes)} (bucket shapes used)",
        ),
        "memory_growth": _target(
            at_most(growth, TARGET_MEMORY_GROWTH),
            growth,
            f"<= {TARGET_MEMORY_GROWTH} (peak RSS, {MEMORY_FACTOR}x data / 1x)",
            None if memory is not None else "not measured; run `ope bench --memory`",
        ),
    }
    return {
        "measurements": {
            "loop": loop,
            "numpy": {k: v for k, v in numpy_run.items() if k != "estimates"},
            "kernel": {k: v for k, v in kernel.items() if k != "estimates"},
            "end_to_end": e2e,
            "io_floor": io_floor,
        },
        "ratios": ratios,
        "compiles": compiles,
        "padding": padding,
        "policies": policies,
        "precision": precisions,
        "memory": memory,
        "targets": targets,
    }


def _load_average() -> float | None:
    """The 1-minute load average (how busy a shared machine was), None where unknown."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return None


def _files(source: str) -> list[Path]:
    from ope_cli.sources import open_dataset

    return [Path(f) for f in open_dataset(source).files]


# --- output --------------------------------------------------------------------------------


def _si(x: float | None, unit: str = "") -> str:
    """1234567 -> '1.23M'; None -> '-'."""
    if x is None:
        return "-"
    for factor, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(x) >= factor:
            return f"{x / factor:.3g}{prefix}{unit}"
    return f"{x:.3g}{unit}"


def _seconds(x: float | None) -> str:
    return "-" if x is None else f"{x:.3f} s" if x < 10 else f"{x:.1f} s"


def _times(x: float | None) -> str:
    return "-" if x is None else f"{x:,.3g}x" if x < 1000 else f"{x:,.0f}x"


def render_bench(result: dict, console: Console) -> None:
    """The bench result as rich tables: measurements, then targets, then the details."""
    from rich.table import Table

    data, runtime, m = result["dataset"], result["runtime"], result["measurements"]
    lengths = data["lengths"]
    title = (
        f"ope bench: {data['steps']:,} steps, {data['episodes']:,} episodes (length median "
        f"{lengths['median']:g}, p99 {lengths['p99']:g}, max {lengths['max']:,}); "
        f"{runtime['backend']}, {runtime['devices']} device(s), {runtime['precision']}"
    )
    table = Table(title=title, title_justify="left")
    table.add_column("measurement")
    table.add_column("steps/s", justify="right")
    table.add_column("time", justify="right")
    table.add_column("notes")
    loop, kernel, e2e = m["loop"], m["kernel"], m["end_to_end"]
    loop_time = (
        f"{_seconds(loop.get('extrapolated_seconds'))} (extrapolated)"
        if loop.get("extrapolated_seconds")
        else "-"
    )
    rows = [
        ("python loop (examples/is_loop.py)", loop, loop_time, loop.get("note", "")),
        (
            "numpy twin, float64",
            m["numpy"],
            _seconds(m["numpy"]["seconds"]),
            "padded batches, log space",
        ),
        (
            f"jitted kernel, {kernel['precision']}",
            kernel,
            _seconds(kernel["seconds"]),
            f"data on the device, steady state; {kernel['compiles']} compiles took "
            f"{_seconds(kernel['compile_seconds'])} more",
        ),
        (
            "ope evaluate, end to end",
            e2e,
            _seconds(e2e["seconds"]),
            f"Parquet -> report, after a compile run of {_seconds(e2e['first_run_seconds'])}",
        ),
        (
            "pyarrow read (I/O floor)",
            m["io_floor"],
            _seconds(m["io_floor"]["seconds"]),
            f"{len(m['io_floor']['columns'])} projected columns to NumPy",
        ),
    ]
    for name, entry, seconds, note in rows:
        table.add_row(name, _si(entry.get("steps_per_second")), seconds, note)
    console.print(table)

    targets = Table(title="targets (SPEC section 6)", title_justify="left")
    for column, justify in (
        ("target", "left"),
        ("value", "right"),
        ("threshold", "left"),
        ("met", "center"),
    ):
        targets.add_column(column, justify=justify)
    for name, target in result["targets"].items():
        value = target["value"]
        shown = (
            "-" if value is None else f"{value:,}" if isinstance(value, int) else f"{value:,.3g}"
        )
        met = {True: "[green]yes[/green]", False: "[red]no[/red]", None: "-"}[target["met"]]
        targets.add_row(
            name.replace("_", " "),
            shown,
            target["threshold"] + (f" ({target['note']})" if target.get("note") else ""),
            met,
        )
    console.print(targets)

    padding, compiles, policies = result["padding"], result["compiles"], result["policies"]
    precision, batching = result["precision"], result["batching"]
    lines = [
        f"padding: {padding['padded_steps']:,} padded / {padding['real_steps']:,} real steps "
        f"(waste {padding['waste']:.1%}), bucket growth {batching['bucket_growth']:g}, "
        f"{batching['batches']} batches of {batching['batch_steps']:,} cells in "
        f"{len(batching['shapes'])} shapes",
        f"compiles: ope evaluate {compiles['end_to_end']} "
        f"({_seconds(compiles['end_to_end_seconds'])}), kernel alone {compiles['kernel']} "
        f"({_seconds(compiles['kernel_seconds'])}), {compiles['bucket_shapes']} bucket shapes; "
        f"persistent cache {compiles['persistent_cache']}",
        f"precision: float32 {_si(precision['float32']['steps_per_second'])} steps/s, float64 "
        f"{_si(precision['float64']['steps_per_second'])} steps/s, max relative difference of "
        f"the estimates {_number(precision['max_relative_difference'])}; numpy twin vs float64 "
        f"kernel {_number(precision['numpy_vs_kernel_max_relative_difference'])}",
    ]
    if "cost_ratio" in policies:
        lines.append(
            f"policies: {policies['k']} stacked cost {_times(policies['cost_ratio'])} of one in "
            f"the kernel, {_times(policies['end_to_end_cost_ratio'])} end to end"
        )
    memory = result.get("memory")
    if memory:
        small, large = memory["1x"], memory[f"{memory['factor']}x"]
        lines.append(
            f"memory: peak RSS {small['peak_rss_mib']:,.0f} MiB on {small['steps']:,} steps, "
            f"{large['peak_rss_mib']:,.0f} MiB on {large['steps']:,} steps "
            f"(growth {_times(memory['growth'])})"
        )
    load = runtime["load_average"]
    if load["start"] is not None:
        lines.append(
            f"load average {load['start']:.2f} at the start, {load['end']:.2f} at the "
            f"end, on {runtime['cpus']} CPUs (a busy machine makes timings noisy)"
        )
    for line in lines:
        console.print(line, highlight=False)


def _number(x: float | None) -> str:
    return "-" if x is None else f"{x:.2e}"


def to_json(result: dict) -> str:
    import json

    def clean(value):  # NaN/inf are not JSON numbers; the spec's rule: null
        if isinstance(value, float) and not math.isfinite(value):
            return None
        if isinstance(value, dict):
            return {k: clean(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [clean(v) for v in value]
        return value

    return json.dumps(clean(result), indent=2, allow_nan=False)


# --- command line --------------------------------------------------------------------------


class BenchFormat(enum.StrEnum):
    table = "table"
    json = "json"


class BenchPrecision(enum.StrEnum):
    float32 = "float32"
    float64 = "float64"


def register(app: typer.Typer) -> None:
    """Adds the ``bench`` command to the ``ope`` app."""

    @app.command("bench")
    def bench_command(
        data: Annotated[
            str | None,
            typer.Option(help="Step-layout Parquet data to measure instead of generated data."),
        ] = None,
        episodes: Annotated[
            int, typer.Option(help="Episodes to generate (long-tailed lengths, ~83 steps each).")
        ] = DEFAULT_EPISODES,
        seed: Annotated[int, typer.Option(help="Seed of the generated data and policies.")] = 0,
        policies: Annotated[
            int,
            typer.Option(
                help="K stacked linear_softmax policies, for the cost of K relative to 1."
            ),
        ] = 4,
        precision: Annotated[
            BenchPrecision | None,
            typer.Option(
                help="Kernel precision of the main measurements. Default: as ope evaluate."
            ),
        ] = None,
        output_format: Annotated[
            BenchFormat | None,
            typer.Option(
                "--format",
                "-f",
                help="Output on stdout. Default: table on a terminal, json otherwise.",
            ),
        ] = None,
        memory: Annotated[
            bool,
            typer.Option(
                "--memory",
                help=f"Also measure peak memory of ope evaluate on 1x and {MEMORY_FACTOR}x data.",
            ),
        ] = False,
        memory_steps: Annotated[
            int, typer.Option(help="Steps of the 1x dataset of --memory.")
        ] = DEFAULT_MEMORY_STEPS,
        loop_episodes: Annotated[
            int, typer.Option(help="Episodes the Python loop runs on (its speed is extrapolated).")
        ] = DEFAULT_LOOP_EPISODES,
        out: Annotated[
            str | None,
            typer.Option(help="Keep generated files in this directory. Default: a temporary one."),
        ] = None,
        quiet: Annotated[
            bool, typer.Option("--quiet", "-q", help="No progress on stderr.")
        ] = False,
        read_rows: Annotated[
            int, typer.Option(help="Rows per record batch read.", rich_help_panel="Batching")
        ] = BatchingConfig.read_rows,
        batch_steps: Annotated[
            int, typer.Option(help="Padded steps per kernel call.", rich_help_panel="Batching")
        ] = BatchingConfig.batch_steps,
        min_bucket: Annotated[
            int,
            typer.Option(
                help="Shortest episode-length bucket; lengths double.", rich_help_panel="Batching"
            ),
        ] = BatchingConfig.min_bucket,
    ) -> None:
        """Measure the performance targets: the Python loop, NumPy, the jitted kernel, ope
        evaluate end to end and the pyarrow read floor, on one long-tailed dataset.

        Examples:

          ope bench

          ope bench --format json | jq .targets

          ope bench --memory --policies 8
        """
        from rich.console import Console

        config = BenchConfig(
            data=data,
            episodes=episodes,
            seed=seed,
            policies=policies,
            precision=precision.value if precision else None,
            memory=memory,
            memory_steps=memory_steps,
            loop_episodes=loop_episodes,
            out=out,
            batching=BatchingConfig(
                read_rows=read_rows, batch_steps=batch_steps, min_bucket=min_bucket
            ),
        )
        chosen = output_format or (BenchFormat.table if sys.stdout.isatty() else BenchFormat.json)
        stderr = Console(stderr=True)
        if quiet or not stderr.is_terminal:
            result = bench(config)
        else:
            with stderr.status("ope bench") as status:
                result = bench(config, on_progress=lambda text: status.update(f"ope bench: {text}"))
        if chosen is BenchFormat.json:
            sys.stdout.write(to_json(result) + "\n")
        else:
            console = Console()
            render_bench(result, console if console.is_terminal else Console(width=140))
