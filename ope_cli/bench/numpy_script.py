"""A plain NumPy script, as a user would write one: reads a step-layout Parquet file whole and
computes the four importance-sampling estimates (IS, WIS, PDIS, WPDIS) of one linear_softmax
policy, with no intervals and no diagnostics. ``ope bench --script`` times whole
``ope evaluate`` processes against it (SPEC 6).

Run it as a file, not as a module of ope (it imports only NumPy and pyarrow)::

    python numpy_script.py DATA CHECKPOINT GAMMA   # -> {"is": ..., ...} on stdout

It assumes what the bench data guarantees: each episode's rows are contiguous and in step
order, columns named as ``ope generate`` and ``ope bench`` write them. Steps are flat
[N] arrays; each episode's cumulative log weight is a segment of one cumulative sum.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

COLUMNS = ["episode_id", "observation", "action", "reward", "behavior_prob"]


def _log_softmax_of_actions(observation, action, weight, bias):
    """[N] log pi(a_t | s_t) of a linear_softmax policy; observation [N, d], action [N]."""
    logits = observation @ weight + bias
    top = logits.max(axis=1, keepdims=True)
    log_normaliser = np.log(np.exp(logits - top).sum(axis=1)) + top[:, 0]
    return logits[np.arange(len(action)), action] - log_normaliser


def estimates(table: pa.Table, weight: np.ndarray, bias: np.ndarray, gamma: float) -> dict:
    """The four estimates of SPEC 4 from the columns of ``table`` (one row per step)."""
    episode = table["episode_id"].to_numpy()
    n = len(episode)
    observation = table["observation"].combine_chunks().flatten().to_numpy().reshape(n, -1)
    observation = observation.astype(np.float64)  # float64 like ope on CPU (and BLAS's fast path)
    action = table["action"].to_numpy()
    reward = table["reward"].to_numpy()
    log_ratio = _log_softmax_of_actions(observation, action, weight, bias) - np.log(
        table["behavior_prob"].to_numpy()
    )
    starts = np.flatnonzero(np.r_[True, episode[1:] != episode[:-1]])
    lengths = np.diff(np.r_[starts, n])
    episodes = starts.size
    t = np.arange(n) - np.repeat(starts, lengths)
    cumulative = np.cumsum(log_ratio)
    log_w = cumulative - np.repeat(np.r_[0.0, cumulative[starts[1:] - 1]], lengths)
    shift = log_w.max()  # every weight relative to the largest, as log-sum-exp does
    w = np.exp(log_w - shift)
    discount = gamma**t
    returns = np.bincount(np.repeat(np.arange(episodes), lengths), discount * reward)
    w_end = w[starts + lengths - 1]
    # WPDIS: an ended episode keeps its last weight in every later step's normaliser
    horizon = lengths.max()
    held = np.cumsum(np.bincount(lengths, w_end, minlength=horizon + 1))[:horizon]
    numerator = np.bincount(t, w * reward, minlength=horizon)
    normaliser = np.bincount(t, w, minlength=horizon) + held
    return {
        "is": float(np.exp(shift) * (w_end @ returns) / episodes),
        "wis": float((w_end @ returns) / w_end.sum()),
        "pdis": float(np.exp(shift) * np.sum(discount * w * reward) / episodes),
        "wpdis": float(np.sum(gamma ** np.arange(horizon) * numerator / normaliser)),
    }


def main(argv: list[str]) -> None:
    data, checkpoint, gamma = argv
    with np.load(checkpoint) as policy:
        weight, bias = policy["weight"], policy["bias"]
    table = pq.read_table(data, columns=COLUMNS)
    json.dump(estimates(table, weight, bias, float(gamma)), sys.stdout)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main(sys.argv[1:])
