"""Random test data: checkpoints, logged episodes, and Parquet/Arrow writers (SPEC 2, 3).

Every factory takes a seeded ``numpy.random.Generator``. An episode is a dict of
per-step arrays:

- ``episode_id``: int
- ``observation``: [T] int64 states (tabular) or [T, obs_dim] float64
- ``action``: [T] int64 (discrete) or [T, act_dim] float64 (linear_gaussian)
- ``reward``: [T] float64
- ``behavior_prob`` / ``behavior_log_prob``: [T] float64, probability (discrete, in
  (0, 1]) or density (continuous) of the logged action under the behavior policy
- optionally ``target_prob`` / ``target_log_prob`` (see ``add_target_probs``)
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

import numpy as np
import pyarrow as pa
import pyarrow.feather as feather
import pyarrow.parquet as pq
from reference import action_log_probs, gaussian_mean, reference_log_prob

Checkpoint = dict[str, np.ndarray | str]
EpisodeData = dict[str, np.ndarray | int]
KINDS = ("tabular", "linear_softmax", "mlp_softmax", "linear_gaussian")

# default column names written for each canonical key
STEP_NAMES = {
    "episode_id": "episode_id",
    "step": "step",
    "observation": "observation",
    "action": "action",
    "reward": "reward",
    "behavior_prob": "behavior_prob",
    "behavior_log_prob": "behavior_log_prob",
    "target_prob": "target_prob",
    "target_log_prob": "target_log_prob",
}
EPISODE_NAMES = {
    "episode_id": "episode_id",
    "observation": "observations",
    "action": "actions",
    "reward": "rewards",
    "behavior_prob": "action_probs",
    "behavior_log_prob": "behavior_log_probs",
    "target_prob": "target_probs",
    "target_log_prob": "target_log_probs",
}

# ------------------------------------------------------------------------ checkpoints


@dataclasses.dataclass(frozen=True)
class PolicySizes:
    """The sizes of a random policy (keywords of ``random_checkpoint`` and
    ``random_episodes``): integer states and discrete actions of tabular, observation and
    continuous action dimensions, an mlp's hidden layers."""

    obs_dim: int = 4
    n_actions: int = 4
    n_states: int = 10
    act_dim: int = 2
    hidden: Sequence[int] = (16,)


def random_checkpoint(
    kind: str,
    rng: np.random.Generator,
    *,
    activation: Literal["tanh", "relu"] | None = None,
    temperature: float | None = None,
    scale: float = 1.0,
    **sizes,
) -> Checkpoint:
    """Random policy parameters of ``kind`` (see SPEC 3); ``scale`` multiplies them;
    ``sizes``: PolicySizes' fields.

    tabular: logits [n_states, n_actions]; linear_softmax: weight [obs_dim, n_actions],
    bias [n_actions], temperature if given; mlp_softmax: weight_k/bias_k through
    ``hidden`` to n_actions, activation if given; linear_gaussian: weight
    [obs_dim, act_dim], bias [act_dim], log_std [act_dim].
    """
    size = PolicySizes(**sizes)
    d, n = size.obs_dim, size.n_actions
    ckpt: Checkpoint = {"kind": kind}
    if kind == "tabular":
        ckpt["logits"] = scale * rng.normal(size=(size.n_states, n))
    elif kind == "linear_softmax":
        ckpt["weight"] = scale * rng.normal(size=(d, n)) / np.sqrt(d)
        ckpt["bias"] = scale * rng.normal(size=n)
        if temperature is not None:
            ckpt["temperature"] = np.float64(temperature)
    elif kind == "mlp_softmax":
        layers = [d, *size.hidden, n]
        for k, (d_in, d_out) in enumerate(zip(layers[:-1], layers[1:], strict=True)):
            ckpt[f"weight_{k}"] = scale * rng.normal(size=(d_in, d_out)) / np.sqrt(d_in)
            ckpt[f"bias_{k}"] = scale * 0.1 * rng.normal(size=d_out)
        if activation is not None:
            ckpt["activation"] = activation
    elif kind == "linear_gaussian":
        ckpt["weight"] = scale * rng.normal(size=(d, size.act_dim)) / np.sqrt(d)
        ckpt["bias"] = scale * rng.normal(size=size.act_dim)
        ckpt["log_std"] = rng.uniform(-1.0, 0.0, size=size.act_dim)
    else:
        raise ValueError(f"unknown kind {kind!r}; expected one of {KINDS}")
    return ckpt


def perturb_checkpoint(ckpt: Checkpoint, rng: np.random.Generator, scale: float) -> Checkpoint:
    """A copy with Gaussian noise of std ``scale`` added to every float parameter."""
    out: Checkpoint = {}
    for key, value in ckpt.items():
        if isinstance(value, np.ndarray) and value.dtype.kind == "f" and key != "temperature":
            out[key] = value + scale * rng.normal(size=value.shape)
        else:
            out[key] = value
    return out


def save_checkpoint(path: str | os.PathLike, ckpt: Mapping[str, np.ndarray | str]) -> Path:
    """Write ``ckpt`` as an .npz: strings (kind, activation) become 0-d string arrays."""
    path = Path(path)
    arrays = {key: np.asarray(value) for key, value in ckpt.items()}
    with open(path, "wb") as f:  # a file object keeps numpy from appending ".npz"
        np.savez(f, **arrays)
    return path


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    """Read an .npz checkpoint back into a dict (kind/activation as str)."""
    with np.load(path, allow_pickle=False) as data:
        return {k: str(v) if v.dtype.kind == "U" else v for k, v in data.items()}


# --------------------------------------------------------------------------- episodes


def random_lengths(
    rng: np.random.Generator,
    n: int,
    *,
    length_dist: Literal["skewed", "geometric", "uniform", "fixed"] = "skewed",
    median_length: int = 20,
    max_length: int = 200,
) -> np.ndarray:
    """Episode lengths [n] in [1, max_length].

    skewed: lognormal (sigma 1) with the given median; geometric: mean ~median_length;
    uniform: 1..max_length; fixed: all equal to min(median_length, max_length).
    """
    if length_dist == "skewed":
        lengths = np.rint(rng.lognormal(np.log(median_length), 1.0, size=n))
    elif length_dist == "geometric":
        lengths = rng.geometric(1.0 / median_length, size=n)
    elif length_dist == "uniform":
        lengths = rng.integers(1, max_length + 1, size=n)
    elif length_dist == "fixed":
        lengths = np.full(n, median_length)
    else:
        raise ValueError(f"unknown length_dist {length_dist!r}")
    return np.clip(lengths, 1, max_length).astype(np.int64)


def random_episodes(
    rng: np.random.Generator,
    n_episodes: int,
    *,
    kind: str = "linear_softmax",
    behavior: Checkpoint | None = None,
    length_dist: Literal["skewed", "geometric", "uniform", "fixed"] = "skewed",
    median_length: int = 20,
    max_length: int = 200,
    **sizes,
) -> list[EpisodeData]:
    """Logged episodes whose actions are drawn from ``behavior`` (random of ``kind`` and
    ``sizes``, PolicySizes' fields, if None).

    Observations are i.i.d.: integer states for tabular, N(0, 1) vectors [obs_dim]
    otherwise. Rewards depend on state and action. Pass ``behavior`` explicitly to
    know the logging policy (e.g. for on-policy checks).
    """
    PolicySizes(**sizes)  # a misspelt size fails also where ``behavior`` is given
    if behavior is None:
        behavior = random_checkpoint(kind, rng, **sizes)
    kind = str(behavior["kind"])
    lengths = random_lengths(
        rng,
        n_episodes,
        length_dist=length_dist,
        median_length=median_length,
        max_length=max_length,
    )
    total = int(lengths.sum())

    if kind == "tabular":
        n_states, n_actions = np.shape(behavior["logits"])
        obs = rng.integers(0, n_states, size=total)
        features = np.eye(n_states)[obs]
    else:
        first = behavior["weight" if kind != "mlp_softmax" else "weight_0"]
        obs = rng.normal(size=(total, np.shape(first)[0]))
        features = obs

    if kind == "linear_gaussian":
        log_std = np.asarray(behavior["log_std"])
        mean = gaussian_mean(behavior, obs)
        action = mean + np.exp(log_std) * rng.normal(size=mean.shape)
        target_w = rng.normal(size=(features.shape[1], mean.shape[1])) / np.sqrt(features.shape[1])
        target_action = features @ target_w
        reward = -np.mean((action - target_action) ** 2, axis=1)
    else:
        log_probs = action_log_probs(behavior, obs)
        action = np.argmax(log_probs + rng.gumbel(size=log_probs.shape), axis=1)
        reward_table = rng.normal(size=(features.shape[1], log_probs.shape[1]))
        reward = np.tanh(np.einsum("nd,dn->n", features, reward_table[:, action]))
    reward = reward + 0.1 * rng.normal(size=total)
    log_b = reference_log_prob(behavior, obs, action)

    episodes: list[EpisodeData] = []
    bounds = np.concatenate([[0], np.cumsum(lengths)])
    for i, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:], strict=True)):
        episodes.append(
            {
                "episode_id": i,
                "observation": obs[lo:hi],
                "action": action[lo:hi],
                "reward": reward[lo:hi],
                "behavior_prob": np.exp(log_b[lo:hi]),
                "behavior_log_prob": log_b[lo:hi],
            }
        )
    return episodes


def add_target_probs(episodes: Sequence[EpisodeData], ckpt: Checkpoint) -> list[EpisodeData]:
    """Copies of the episodes with ``target_prob`` and ``target_log_prob`` under ``ckpt``."""
    out = []
    for ep in episodes:
        log_t = reference_log_prob(ckpt, ep["observation"], ep["action"])
        out.append({**ep, "target_prob": np.exp(log_t), "target_log_prob": log_t})
    return out


def to_reference_input(
    episodes: Sequence[EpisodeData], ckpt: Checkpoint
) -> list[dict[str, np.ndarray]]:
    """Per-episode {"log_target", "log_behavior", "reward"} for ``reference_estimates``."""
    return [
        {
            "log_target": reference_log_prob(ckpt, ep["observation"], ep["action"]),
            "log_behavior": np.asarray(ep["behavior_log_prob"], dtype=np.float64),
            "reward": np.asarray(ep["reward"], dtype=np.float64),
        }
        for ep in episodes
    ]


# ---------------------------------------------------------------------------- writers

ObsType = Literal["list", "fixed_size_list"]


def _vectors(values: np.ndarray, obs_type: ObsType) -> pa.Array:
    """[N] -> numbers; [N, d] -> list<float64> or fixed_size_list<float64, d>."""
    if values.ndim == 1:
        return pa.array(values)
    flat = pa.array(np.ascontiguousarray(values, dtype=np.float64).ravel())
    d = values.shape[1]
    if obs_type == "fixed_size_list":
        return pa.FixedSizeListArray.from_arrays(flat, d)
    offsets = pa.array(np.arange(0, len(flat) + 1, d, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, flat)


def _ids(episodes: Sequence[EpisodeData], id_type: type) -> list[int] | list[str]:
    if id_type is str:
        return [f"ep-{ep['episode_id']:06d}" for ep in episodes]
    return [int(ep["episode_id"]) for ep in episodes]


@dataclasses.dataclass(frozen=True)
class StepTable:
    """How ``step_layout_table`` writes episodes (its keywords): ``prob_column`` then
    ``extra_columns`` (e.g. "target_prob") after the standard columns, ``column_names``
    mapping canonical names to the names written, string or integer ids, list or
    fixed-size-list observations, with or without the step column, rows shuffled within
    each episode (by ``seed``)."""

    prob_column: Literal["behavior_prob", "behavior_log_prob"] = "behavior_prob"
    extra_columns: Sequence[str] = ()
    column_names: Mapping[str, str] | None = None
    id_type: type = int
    obs_type: ObsType = "list"
    include_step: bool = True
    shuffle_steps_within_episode: bool = False
    seed: int = 0


def step_layout_table(episodes: Sequence[EpisodeData], **options) -> pa.Table:
    """One row per step: episode_id, step, observation, action, reward, the probability
    column, then the extra columns (``options``: StepTable's fields). Shuffling permutes
    rows within each episode (the ``step`` column keeps each row's true position)."""
    table = StepTable(**options)
    prob_column, extra_columns, obs_type = table.prob_column, table.extra_columns, table.obs_type
    shuffle_steps_within_episode = table.shuffle_steps_within_episode
    names = {**STEP_NAMES, **(table.column_names or {})}
    rng = np.random.default_rng(table.seed)
    order = []
    offset = 0
    for ep in episodes:
        t = len(ep["reward"])
        within = rng.permutation(t) if shuffle_steps_within_episode else np.arange(t)
        order.append(offset + within)
        offset += t
    order = np.concatenate(order)

    lengths = [len(ep["reward"]) for ep in episodes]
    ids = np.repeat(np.array(_ids(episodes, table.id_type)), lengths)
    columns = {names["episode_id"]: pa.array(ids)}
    if table.include_step:
        steps = np.concatenate([np.arange(t, dtype=np.int64) for t in lengths])
        columns[names["step"]] = pa.array(steps[order])
    for key in ("observation", "action", "reward", prob_column, *extra_columns):
        values = np.concatenate([np.asarray(ep[key]) for ep in episodes])[order]
        columns[names[key]] = _vectors(values, obs_type)
    return pa.table(columns)


def episode_layout_table(
    episodes: Sequence[EpisodeData],
    *,
    prob_column: Literal["behavior_prob", "behavior_log_prob"] = "behavior_prob",
    extra_columns: Sequence[str] = (),
    column_names: Mapping[str, str] | None = None,
    id_type: type | None = int,
    obs_type: ObsType = "list",
) -> pa.Table:
    """One row per episode, list columns: episode_id (omitted if ``id_type`` is None),
    observations, actions, rewards, action_probs (or behavior_log_probs), extras."""
    names = {**EPISODE_NAMES, **(column_names or {})}
    columns = {}
    if id_type is not None:
        columns[names["episode_id"]] = pa.array(_ids(episodes, id_type))
    lengths = np.array([len(ep["reward"]) for ep in episodes])
    offsets = pa.array(np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32))
    for key in ("observation", "action", "reward", prob_column, *extra_columns):
        values = np.concatenate([np.asarray(ep[key]) for ep in episodes])
        columns[names[key]] = pa.ListArray.from_arrays(offsets, _vectors(values, obs_type))
    return pa.table(columns)


FileFormat = Literal["parquet", "feather"]


def write_table(
    table: pa.Table,
    path: str | os.PathLike,
    *,
    file_format: FileFormat = "parquet",
    row_group_size: int | None = None,
) -> Path:
    """Write one Parquet or Arrow IPC (Feather v2) file; row_group_size is rows per
    Parquet row group or per IPC record batch."""
    path = Path(path)
    if file_format == "parquet":
        pq.write_table(table, path, row_group_size=row_group_size)
    else:
        feather.write_feather(table, path, chunksize=row_group_size)
    return path


def write_step_layout(
    episodes: Sequence[EpisodeData],
    path: str | os.PathLike,
    *,
    n_files: int = 1,
    file_format: FileFormat = "parquet",
    row_group_size: int | None = None,
    **table_options,
) -> Path:
    """Write the step layout; returns what to pass to the tool.

    n_files == 1: ``path`` is the file. n_files > 1: ``path`` is a directory that gets
    part-00000.parquet (or .feather), ...; each file holds whole, consecutive episodes.
    ``table_options`` go to ``step_layout_table``.
    """
    return _write_split(
        episodes,
        Path(path),
        n_files,
        file_format,
        row_group_size,
        lambda eps: step_layout_table(eps, **table_options),
    )


def write_episode_layout(
    episodes: Sequence[EpisodeData],
    path: str | os.PathLike,
    *,
    n_files: int = 1,
    file_format: FileFormat = "parquet",
    row_group_size: int | None = None,
    **table_options,
) -> Path:
    """Write the episode layout (one row per episode); like ``write_step_layout``.
    ``table_options`` go to ``episode_layout_table``."""
    return _write_split(
        episodes,
        Path(path),
        n_files,
        file_format,
        row_group_size,
        lambda eps: episode_layout_table(eps, **table_options),
    )


def _write_split(episodes, path: Path, n_files, file_format, row_group_size, make_table) -> Path:
    if n_files == 1:
        write_table(
            make_table(episodes), path, file_format=file_format, row_group_size=row_group_size
        )
        return path
    if not 1 <= n_files <= len(episodes):
        raise ValueError(f"n_files={n_files} must be in 1..{len(episodes)} (episodes)")
    path.mkdir(parents=True, exist_ok=True)
    suffix = "parquet" if file_format == "parquet" else "feather"
    for k, chunk in enumerate(np.array_split(np.arange(len(episodes)), n_files)):
        write_table(
            make_table([episodes[i] for i in chunk]),
            path / f"part-{k:05d}.{suffix}",
            file_format=file_format,
            row_group_size=row_group_size,
        )
    return path


# ------------------------------------------------- sources compared with the same Parquet


def vector_column(values: np.ndarray) -> pa.Array:
    """[N] values as a plain column, [N, d] as a fixed-size list column of d values."""
    if values.ndim == 2:
        return pa.FixedSizeListArray.from_arrays(pa.array(values.reshape(-1)), values.shape[1])
    return pa.array(values)


def write_flat_steps(
    path: str | os.PathLike,
    lengths: Sequence[int],
    observations: np.ndarray,
    actions: np.ndarray,
    rewards: np.ndarray,
    behavior_log_probs: np.ndarray,
) -> Path:
    """Step-layout Parquet with the standard column names: episodes of ``lengths`` steps
    whose [N, ...] per-step arrays follow one another (N = sum of lengths)."""
    lengths = np.asarray(lengths, np.int64)
    table = pa.table(
        {
            "episode_id": np.repeat(np.arange(lengths.size), lengths),
            "step": np.arange(lengths.sum()) - np.repeat(np.cumsum(lengths) - lengths, lengths),
            "observation": vector_column(np.asarray(observations).reshape(lengths.sum(), -1)),
            "action": vector_column(np.asarray(actions)),
            "reward": np.asarray(rewards),
            "behavior_log_prob": np.asarray(behavior_log_probs),
        }
    )
    pq.write_table(table, path)
    return Path(path)


def run_estimates(run) -> dict[str, float]:
    """{estimator: value} of a successful ``ope evaluate --format json`` of one policy."""
    assert run.returncode == 0, run
    (result,) = json.loads(run.stdout)["results"]
    return {name: e["value"] for name, e in result["estimates"].items()}


def assert_same_estimates(first: Mapping[str, float], second: Mapping[str, float]) -> None:
    """The same estimators, each value equal to 1e-9 (relative; 1e-12 absolute)."""
    assert first.keys() == second.keys()
    for name, value in second.items():
        assert math.isclose(first[name], value, rel_tol=1e-9, abs_tol=1e-12), name


def assert_one_line_exit_3(run, *parts: str) -> None:
    """A data error: exit 3, no traceback, one stderr line holding every one of ``parts``."""
    assert run.returncode == 3, run
    assert "Traceback" not in run.stderr, run
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, run
    for part in parts:
        assert part in lines[0], run
