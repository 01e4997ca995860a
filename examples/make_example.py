"""Write the shipped example (deterministic, seed 0):

- examples/data/logs.parquet: step layout, 2,000 episodes with skewed lengths
  (lognormal, median ~20, at most 200), 4-dim observations (list<float64>),
  4 discrete actions drawn from a linear_softmax behavior policy; columns
  episode_id, step, observation, action, reward, behavior_prob.
- examples/policies/ckpt.npz: a linear_softmax policy close to the behavior policy.
- examples/policies/other.npz: a linear_softmax policy further away, leaning towards
  the actions the reward favours, so the two policies differ in value.

    python examples/make_example.py
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

SEED = 0
N_EPISODES = 2_000
OBS_DIM = N_ACTIONS = 4
MEDIAN_LENGTH, MAX_LENGTH = 20, 200
HERE = Path(__file__).resolve().parent


def softmax(logits: np.ndarray) -> np.ndarray:
    """[N, A] -> [N, A] probabilities."""
    exp = np.exp(logits - logits.max(axis=1, keepdims=True))
    return exp / exp.sum(axis=1, keepdims=True)


def simulate(
    rng: np.random.Generator, weight: np.ndarray, bias: np.ndarray, reward_weight: np.ndarray
) -> dict[str, np.ndarray]:
    """Roll out all episodes in parallel under softmax(s @ weight + bias).

    The state drifts (AR(1)) and each action pushes its own state dimension; the
    reward is s @ reward_weight[:, a] plus noise. Observations are rounded to 0.05 and
    rewards to 0.01 (logged at sensor precision), which keeps the file small.
    Returns flat per-step arrays in episode order.
    """
    lengths = np.rint(rng.lognormal(np.log(MEDIAN_LENGTH), 0.8, size=N_EPISODES))
    lengths = np.clip(lengths, 1, MAX_LENGTH).astype(np.int64)
    lengths[0] = MAX_LENGTH  # make the longest episode exactly MAX_LENGTH
    state = rng.normal(size=(N_EPISODES, OBS_DIM))
    per_t = []
    for _ in range(MAX_LENGTH):
        obs = np.round(state / 0.05) * 0.05
        probs = softmax(obs @ weight + bias)
        action = (rng.random((N_EPISODES, 1)) > np.cumsum(probs, axis=1)).sum(axis=1)
        action = np.minimum(action, N_ACTIONS - 1)
        reward = np.einsum("nd,dn->n", obs, reward_weight[:, action])
        reward = np.round(reward + 0.1 * rng.normal(size=N_EPISODES), 2)
        per_t.append((obs, action, reward, probs[np.arange(N_EPISODES), action]))
        state = 0.8 * state + 0.5 * rng.normal(size=state.shape) + 0.3 * np.eye(OBS_DIM)[action]

    rows = [
        (i, t, *(column[i] for column in per_t[t]))
        for i in range(N_EPISODES)
        for t in range(lengths[i])
    ]
    episode_id, step, obs, action, reward, prob = zip(*rows, strict=True)
    return {
        "episode_id": np.array(episode_id, dtype=np.int64),
        "step": np.array(step, dtype=np.int64),
        "observation": np.stack(obs),
        "action": np.array(action, dtype=np.int64),
        "reward": np.array(reward, dtype=np.float64),
        "behavior_prob": np.array(prob, dtype=np.float64),
    }


def save_linear_softmax(path: Path, weight: np.ndarray, bias: np.ndarray) -> None:
    """weight [4, 4], bias [4] as a linear_softmax checkpoint."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        np.savez(f, kind=np.array("linear_softmax"), weight=weight, bias=bias)


def main() -> None:
    rng = np.random.default_rng(SEED)
    reward_weight = rng.normal(size=(OBS_DIM, N_ACTIONS))
    weight = 0.5 * rng.normal(size=(OBS_DIM, N_ACTIONS))
    bias = 0.2 * rng.normal(size=N_ACTIONS)

    steps = simulate(rng, weight, bias, reward_weight)
    flat_obs = pa.array(steps["observation"].ravel())
    offsets = pa.array(np.arange(0, len(flat_obs) + 1, OBS_DIM, dtype=np.int32))
    table = pa.table(
        {
            "episode_id": steps["episode_id"],
            "step": steps["step"],
            "observation": pa.ListArray.from_arrays(offsets, flat_obs),
            "action": steps["action"],
            "reward": steps["reward"],
            "behavior_prob": steps["behavior_prob"],
        }
    )
    data = HERE / "data" / "logs.parquet"
    data.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(table, data, compression="zstd")

    close = weight + 0.05 * rng.normal(size=weight.shape)
    save_linear_softmax(HERE / "policies" / "ckpt.npz", close, bias)
    far = weight + 0.15 * reward_weight + 0.1 * rng.normal(size=weight.shape)
    save_linear_softmax(HERE / "policies" / "other.npz", far, bias)
    print(f"wrote {data} ({table.num_rows} steps, {data.stat().st_size / 1e6:.2f} MB)")


if __name__ == "__main__":
    main()
