"""Convert logged episodes into the step-layout Parquet file ``ope`` reads, with pyarrow.

Two common shapes of RL logs are shown:

1. a Gymnasium-style list of transitions, one dict per ``env.step`` (what a rollout
   loop appends to a list): ``obs, action, reward, terminated, truncated`` plus the
   probability the behavior policy gave the action it took;
2. a dict of NumPy arrays, one entry per field with the steps of all episodes
   concatenated (a replay buffer, or a D4RL-style dataset with ``terminals`` and
   ``timeouts``).

Either way an episode ends at a step with ``terminated`` or ``truncated`` set; episode
ids and 0-based steps are derived from those flags with vectorised NumPy (no loop over
steps), and the file gets the columns ``episode_id, step, observation, action, reward,
behavior_prob``. A trailing episode without an end flag (logging stopped mid-episode)
is kept as it is: it is what was logged.

    python examples/from_transitions.py OUT_DIR
    ope evaluate OUT_DIR/transitions.parquet --policy examples/policies/ckpt.npz
    ope evaluate OUT_DIR/arrays.parquet --policy examples/policies/ckpt.npz

The demo rolls out a toy environment with a uniform-random behavior policy over
4 actions and 4-dimensional observations, the shapes of examples/policies/ckpt.npz.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

OBS_DIM = N_ACTIONS = 4


def episode_ids_and_steps(done: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[N] bool "this step ends its episode" -> ([N] episode id, [N] step within it)."""
    done = np.asarray(done, bool)
    episode_id = np.concatenate([[0], np.cumsum(done[:-1])]).astype(np.int64)
    starts = np.flatnonzero(np.diff(episode_id, prepend=-1))  # first row of each episode
    step = np.arange(done.size) - np.repeat(starts, np.diff(np.append(starts, done.size)))
    return episode_id, step.astype(np.int64)


def to_step_table(
    observation: np.ndarray,
    action: np.ndarray,
    reward: np.ndarray,
    done: np.ndarray,
    behavior_prob: np.ndarray,
) -> pa.Table:
    """Concatenated per-step arrays ([N, obs_dim] observations) -> a step-layout table."""
    episode_id, step = episode_ids_and_steps(done)
    observation = np.asarray(observation, np.float64)
    flat = pa.array(observation.reshape(-1))
    return pa.table(
        {
            "episode_id": episode_id,
            "step": step,
            # A fixed-size list keeps the observation width in the schema; list<double> works too.
            "observation": pa.FixedSizeListArray.from_arrays(flat, observation.shape[1]),
            "action": np.asarray(action, np.int64),
            "reward": np.asarray(reward, np.float64),
            "behavior_prob": np.asarray(behavior_prob, np.float64),
        }
    )


def from_transitions(transitions: list[dict]) -> pa.Table:
    """A Gymnasium-style list of transition dicts -> a step-layout table."""

    def column(key):
        return np.array([t[key] for t in transitions])

    done = column("terminated") | column("truncated")
    return to_step_table(
        np.stack([t["obs"] for t in transitions]),
        column("action"),
        column("reward"),
        done,
        column("behavior_prob"),
    )


def from_arrays(arrays: dict[str, np.ndarray]) -> pa.Table:
    """A D4RL-style dict (observations, actions, rewards, terminals, timeouts, action_probs)
    -> a step-layout table."""
    done = np.asarray(arrays["terminals"], bool) | np.asarray(arrays["timeouts"], bool)
    return to_step_table(
        arrays["observations"], arrays["actions"], arrays["rewards"], done, arrays["action_probs"]
    )


# --- a toy rollout that produces both kinds of logs -------------------------------------


def rollout(num_episodes: int = 200, max_steps: int = 30, seed: int = 0) -> list[dict]:
    """What a Gymnasium loop logs: ``obs, reward, terminated, truncated, info = env.step(a)``
    with a uniform-random behavior policy (probability 1/4 for every action)."""
    rng = np.random.default_rng(seed)
    transitions = []
    for _ in range(num_episodes):
        obs = rng.normal(size=OBS_DIM)
        for t in range(max_steps):
            action = int(rng.integers(N_ACTIONS))
            reward = float(obs[action] + 0.1 * rng.normal())
            next_obs = 0.8 * obs + 0.5 * rng.normal(size=OBS_DIM)
            terminated = bool(rng.random() < 0.05)
            truncated = t == max_steps - 1 and not terminated
            transitions.append(
                {
                    "obs": obs,
                    "action": action,
                    "reward": reward,
                    "terminated": terminated,
                    "truncated": truncated,
                    "behavior_prob": 1.0 / N_ACTIONS,
                }
            )
            obs = next_obs
            if terminated or truncated:
                break
    return transitions


def as_arrays(transitions: list[dict]) -> dict[str, np.ndarray]:
    """The same log as a dict of concatenated arrays (a replay buffer's layout)."""
    return {
        "observations": np.stack([t["obs"] for t in transitions]),
        "actions": np.array([t["action"] for t in transitions]),
        "rewards": np.array([t["reward"] for t in transitions]),
        "terminals": np.array([t["terminated"] for t in transitions]),
        "timeouts": np.array([t["truncated"] for t in transitions]),
        "action_probs": np.array([t["behavior_prob"] for t in transitions]),
    }


def main(out_dir: str) -> None:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    transitions = rollout()
    pq.write_table(from_transitions(transitions), out / "transitions.parquet")
    pq.write_table(from_arrays(as_arrays(transitions)), out / "arrays.parquet")
    episodes = int(sum(t["terminated"] or t["truncated"] for t in transitions))
    print(
        f"wrote {out / 'transitions.parquet'} and {out / 'arrays.parquet'}: "
        f"{episodes} episodes, {len(transitions)} steps"
    )


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python examples/from_transitions.py OUT_DIR")
    main(sys.argv[1])
