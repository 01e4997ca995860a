"""The generated long-tailed bench data and checkpoints near its behavior policy.

Step layout, one Parquet file written block by block: vector observations, integer actions,
the behavior policy's probability of each logged action, and a state/action reward.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

OBS_DIM = 8
N_ACTIONS = 4
MEDIAN_LENGTH = 50
LENGTH_SIGMA = 1.0  # lognormal: p99 ~ 500 steps, p99.9 ~ 1,100, the longest of 24k ~ 2,000
MAX_LENGTH = 2000
POLICY_SHIFT = 0.1  # evaluation policy = behavior + N(0, shift^2) on every parameter
BLOCK_EPISODES = 8192  # episodes generated and written at a time (bounds memory)
ROW_GROUP_ROWS = 1 << 17


def episode_lengths(rng: np.random.Generator, episodes: int) -> np.ndarray:
    """[E] int64 long-tailed lengths: lognormal with median MEDIAN_LENGTH, in [1, MAX_LENGTH]."""
    lengths = np.rint(rng.lognormal(math.log(MEDIAN_LENGTH), LENGTH_SIGMA, size=episodes))
    return np.clip(lengths, 1, MAX_LENGTH).astype(np.int64)


def episodes_for_steps(steps: int) -> int:
    """Episodes whose expected total length is about ``steps``."""
    mean = MEDIAN_LENGTH * math.exp(LENGTH_SIGMA**2 / 2)
    return max(1, round(steps / mean))


def behavior_params(seed: int, obs_dim: int = OBS_DIM, n_actions: int = N_ACTIONS) -> dict:
    """The behavior policy of the generated data: linear_softmax weight [d, A], bias [A]."""
    rng = np.random.default_rng([seed, 0])
    return {
        "weight": rng.normal(size=(obs_dim, n_actions)) / math.sqrt(obs_dim),
        "bias": 0.5 * rng.normal(size=n_actions),
    }


def _softmax_rows(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def step_table(first_id: int, lengths: np.ndarray, behavior: dict, rng: np.random.Generator):
    """A step-layout pyarrow Table of episodes ``first_id, first_id + 1, ...`` with the given
    lengths: observation list<float32>[d] ~ N(0, 1), actions drawn from ``behavior``, its
    probability of the logged action, and a reward that depends on state and action."""
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


def generate_data(
    path: str | os.PathLike, episodes: int, seed: int, lengths: np.ndarray | None = None
) -> dict:
    """Writes the long-tailed bench dataset (step layout, one Parquet file) block by block
    and returns {"episodes", "steps", "lengths"} ([E] int64 lengths). ``lengths``: [E]
    episode lengths to use instead of the long-tailed ones (e.g. all 1: a bandit log)."""
    if lengths is None:
        lengths = episode_lengths(np.random.default_rng([seed, 1]), episodes)
    lengths = np.asarray(lengths, np.int64)
    episodes = lengths.size
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


def generated_checkpoint(directory: Path, seed: int) -> str:
    """A linear_softmax checkpoint near the behavior policy of ``generate_data(..., seed)``
    (the sizes of the bench's own data), in ``directory``/generated/: for the measurements
    that generate their data, whatever data ``--data`` gave the others."""
    (directory / "generated").mkdir(exist_ok=True)
    return write_checkpoints(directory / "generated", 1, seed, behavior_params(seed))[0]


def write_q_checkpoint(directory: Path, seed: int, obs_dim: int, n_actions: int) -> str:
    """A random linear_q checkpoint of the data's sizes (q.npz), for the doubly robust
    estimators' kernel cost (any Q-hat costs the same)."""
    rng = np.random.default_rng(seed + 17)
    path = directory / "q.npz"
    with open(path, "wb") as handle:
        np.savez(
            handle,
            kind=np.asarray("linear_q"),
            weight=rng.normal(size=(obs_dim, n_actions)),
            bias=rng.normal(size=n_actions),
        )
    return str(path)


def write_behavior_checkpoint(directory: Path, behavior: dict) -> str:
    """The data's behavior policy as a linear_softmax checkpoint (behavior.npz)."""
    path = directory / "behavior.npz"
    with open(path, "wb") as handle:
        np.savez(handle, kind=np.asarray("linear_softmax"), **behavior)
    return str(path)
