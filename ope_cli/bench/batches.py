"""Bench's own view of the data: opened once, padded once, and the loop baseline's first episodes.

``open_source`` opens it with ``open_episodes``, as every command does; ``host_batches``
pads it with the pipeline's own stream (``pipeline.BatchStream``, as ``ope evaluate``
does); everything bench learns about ``--data`` (episode lengths, observation size,
action count) comes from those padded batches, not from another pass.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa

from ope_cli.config import BatchingConfig, EvaluationConfig
from ope_cli.data.episode_stream import DataConfig, EpisodeStream, open_episodes
from ope_cli.errors import DataError, UsageError
from ope_cli.estimation.inputs import EvaluationInputs
from ope_cli.estimation.pipeline import BatchStream
from ope_cli.estimation.run_plan import IntervalPlan

if TYPE_CHECKING:
    from ope_cli.data.buckets import Bucketer, PaddedBatch

# The column names the loop baseline reads, by role.
LOOP_COLUMNS = {
    "episode": "episode_id",
    "step": "step",
    "observation": "observation",
    "action": "action",
    "reward": "reward",
    "behavior_prob": "behavior_prob",
}


def open_source(source: str) -> EpisodeStream:
    """Opens ``source`` and checks it is what bench measures: step layout, vector
    observations, integer actions (as ``ope bench`` generates)."""
    try:
        episodes = open_episodes(DataConfig(source))
    except DataError as error:
        if not re.search(r"--[a-z-]+-col\b", str(error)):
            raise
        # its fix names a column option, which bench does not take
        raise DataError(
            f"{error} (ope bench takes no column options: `ope convert DATA OUT.parquet` with "
            "them writes the default names, then pass --data OUT.parquet)"
        ) from None
    schema = episodes.schema
    if (
        schema.layout != "step"
        or schema.observation_kind != "vector"
        or schema.action_kind != "discrete"
    ):
        raise UsageError(
            "ope bench --data needs step-layout data with vector observations and "
            "integer actions (as `ope bench` generates)"
        )
    return episodes


def host_batches(
    source: EpisodeStream, batching: BatchingConfig, devices: int
) -> tuple[list[PaddedBatch], Bucketer, int]:
    """Every padded batch of ``source`` as ``ope evaluate`` builds them: the pipeline's
    BatchStream (same reader, assembler and bucketer), with no policy (the batches only),
    kept on the host; returns (batches, bucketer, max_length)."""
    config = EvaluationConfig(data=source.source, batching=batching)
    episodes = source.reconfigured(read_rows=batching.read_rows)
    inputs = EvaluationInputs(config, episodes, len(source.data.files), [], IntervalPlan("normal"))
    stream = BatchStream(inputs, devices, magnitudes=False)
    batches = list(stream)
    return batches, stream.bucketer, stream.counters.max_length


def describe_batches(batches: list[PaddedBatch], name: str) -> dict:
    """What bench needs to know about ``--data``, from its padded batches: episodes, steps,
    [E] episode lengths (in batch order), observation size and action count."""
    lengths = [b.step_mask[b.episode_mask].sum(axis=1) for b in batches]
    lengths_e = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
    if lengths_e.size == 0:
        raise DataError(f"{name}: no rows")
    n_actions = 1 + max(int(b.action[b.step_mask].max(initial=0)) for b in batches)
    return {
        "episodes": int(lengths_e.size),
        "steps": int(lengths_e.sum()),
        "lengths": lengths_e.astype(np.int64),
        "obs_dim": int(batches[0].observation.shape[-1]),
        "n_actions": n_actions,
    }


def loop_head_table(source: EpisodeStream, episodes: int, read_rows: int) -> pa.Table | None:
    """The first ``episodes`` episodes of ``source`` as a table with the loop baseline's
    column names (LOOP_COLUMNS); None when the data lacks one of those columns."""
    columns = source.schema.columns
    if any(role not in columns for role in LOOP_COLUMNS):
        return None
    names = [columns[role] for role in LOOP_COLUMNS]
    parts, seen, last_id = [], 0, None
    for sourced in source.data.iter_batches(names, read_rows):
        ids = np.asarray(sourced.batch.column(names[0]).to_numpy(zero_copy_only=False))
        if ids.size == 0:
            continue
        parts.append(sourced.batch)
        # episodes starting in this record batch (one cut by the batch boundary counts once)
        seen += int(np.count_nonzero(ids[1:] != ids[:-1])) + (ids[0] != last_id)
        last_id = ids[-1]
        if seen > episodes:
            break
    table = pa.Table.from_batches(parts).select(names)
    table = table.rename_columns(list(LOOP_COLUMNS.values()))
    ids = np.asarray(table.column("episode_id").to_numpy())
    starts = np.concatenate([[0], np.flatnonzero(ids[1:] != ids[:-1]) + 1, [ids.size]])
    return table.slice(0, int(starts[min(episodes, starts.size - 1)]))
