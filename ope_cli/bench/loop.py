"""The per-episode Python loop that importance-sampling code usually starts as.

One episode at a time, one step at a time: pi_e(a|s) from a ``tabular`` or
``linear_softmax`` .npz checkpoint, ratio = pi_e / pi_b, weight = product of ratios,
then IS, WIS, PDIS and WPDIS. This is the readable baseline ``ope bench`` compares
against (it ships inside the package, so an installed ``ope bench`` measures it too);
it multiplies ratios naively, so very long episodes can over/underflow.
``studies/is_loop.py`` runs it from the command line.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def load_policy(checkpoint_path: str):
    """Return pi(action, observation) -> probability for a tabular/linear_softmax .npz."""
    ckpt = np.load(checkpoint_path, allow_pickle=False)
    kind = str(ckpt["kind"])
    if kind == "tabular":
        logits_table = ckpt["logits"]

        def logits_of(obs):
            return logits_table[int(obs)]

    elif kind == "linear_softmax":
        weight, bias = ckpt["weight"], ckpt["bias"]
        temperature = float(ckpt["temperature"]) if "temperature" in ckpt else 1.0

        def logits_of(obs):
            return (np.asarray(obs, dtype=np.float64) @ weight + bias) / temperature

    else:
        raise ValueError(f"the loop baseline supports tabular and linear_softmax, not {kind!r}")

    def prob(action, obs) -> float:
        logits = logits_of(obs)
        exp = np.exp(logits - np.max(logits))
        return float(exp[int(action)] / np.sum(exp))

    return prob


def read_episodes(table: pa.Table) -> list[list[tuple]]:
    """Group step rows by episode_id (sorted by step); each step is (obs, action, reward, pi_b)."""
    episode_ids = table.column("episode_id").to_pylist()
    steps = table.column("step").to_pylist()
    observations = table.column("observation").to_pylist()
    actions = table.column("action").to_pylist()
    rewards = table.column("reward").to_pylist()
    behavior = table.column("behavior_prob").to_pylist()

    grouped = defaultdict(list)
    for row in zip(episode_ids, steps, observations, actions, rewards, behavior, strict=True):
        grouped[row[0]].append(row[1:])
    episodes = []
    for rows in grouped.values():
        rows.sort(key=lambda row: row[0])
        episodes.append([row[1:] for row in rows])
    return episodes


def loop_estimates(
    table_or_path: pa.Table | str, checkpoint_path: str, gamma: float, horizon: int = 0
) -> dict:
    """IS/WIS/PDIS/WPDIS of the checkpoint's policy on step-layout logs (loop version).
    WPDIS's per-step sums run to the longest episode, or to ``horizon`` steps where that is
    longer: a run on a dataset's first episodes then walks the whole dataset's steps after
    each episode's end, as the run on all of it does (the estimates are the same)."""
    table = table_or_path if isinstance(table_or_path, pa.Table) else pq.read_table(table_or_path)
    policy = load_policy(checkpoint_path)
    episodes = read_episodes(table)
    n = len(episodes)
    max_length = max(max(len(steps) for steps in episodes), horizon)

    weighted_returns = weight_sum = pdis_sum = 0.0
    wpdis_num = np.zeros(max_length)  # sum_i W_it r_it
    wpdis_den = np.zeros(max_length)  # sum_i W_it, absorbing after the episode ends
    for steps in episodes:
        ratios = []
        running_weight = 1.0
        episode_return = 0.0
        for t, (obs, action, reward, behavior_prob) in enumerate(steps):
            ratio = policy(action, obs) / behavior_prob
            ratios.append(ratio)
            running_weight *= ratio
            episode_return += gamma**t * reward
            pdis_sum += gamma**t * running_weight * reward
            wpdis_num[t] += running_weight * reward
            wpdis_den[t] += running_weight
        weight = np.prod(ratios)
        for t in range(len(steps), max_length):
            wpdis_den[t] += weight
        weighted_returns += weight * episode_return
        weight_sum += weight

    wpdis = 0.0
    for t in range(max_length):
        wpdis += gamma**t * wpdis_num[t] / wpdis_den[t]
    return {
        "is": float(weighted_returns / n),
        "wis": float(weighted_returns / weight_sum),
        "pdis": float(pdis_sum / n),
        "wpdis": float(wpdis),
    }
