"""The rollout engine: episodes under the behavior policy, vmapped over episodes and scanned
over time, in chunks of time steps between which finished episodes leave the batch.

Every episode has its own key ``fold_in(key(seed), id)`` and a draw per CHUNK_STEPS steps, so
its data depends only on the seed and its id, not on how many episodes are rolled out
together (but for the rounding of a value computed with ``exp``: the few lanes' scan is
another compiled program).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import jax
import jax.numpy as jnp
import numpy as np

from ope_cli.envs.base import Environment, Params, Record, State, draw

CHUNK_STEPS = 32  # time steps per random draw (and per jitted scan of LANES episodes)
LANES = 1024  # episodes per jitted scan
# Once at most FEW_LANES episodes are alive, they run FEW_LANES at a time for LONG_CHUNKS
# draws' worth of steps per scan: a long episode ran alone in 1024 lanes, 32 steps a call
# (a 1M-step episode took about 3 minutes); its draws, hence its data, stay the same
FEW_LANES = 8
LONG_CHUNKS = 32
NO_HORIZON = np.iinfo(np.int64).max


@partial(jax.jit, static_argnames=("reset", "noise"))
def _reset_lanes(
    reset: Callable,
    noise: tuple[int, int],
    params: Params,
    data_key: jax.Array,
    episode_ids: jax.Array,
) -> State:
    """Initial states of episodes [lanes]; "key" holds the data of keys fold_in(data_key, id)."""
    keys = jax.vmap(partial(jax.random.fold_in, data_key))(episode_ids)
    uniform, normal = jax.vmap(lambda key: draw(jax.random.fold_in(key, 0), 1, noise))(keys)
    state = jax.vmap(reset, in_axes=(None, 0, 0))(params, uniform[:, 0], normal[:, 0])
    return {**state, "key": jax.random.key_data(keys)}


@partial(jax.jit, static_argnames=("step", "noise", "length"))
def _run_chunk(
    step: Callable,
    noise: tuple[int, int],
    length: int,
    params: Params,
    state: State,
    alive: jax.Array,
    t0: jax.Array,
    horizon: jax.Array,
) -> tuple[State, jax.Array, Record, jax.Array]:
    """Steps t0 .. t0 + length - 1 of every lane.

    Returns the next state, alive [lanes], records [lanes, length, ...] and valid [lanes, length].
    """
    keys = jax.random.wrap_key_data(state["key"])
    uniform, normal = jax.vmap(partial(_draws, noise=noise, t0=t0, length=length))(keys)

    def scan_step(carry, inputs):
        env_state, lanes_alive = carry
        t, lanes_uniform, lanes_normal = inputs
        next_state, records, terminated = jax.vmap(step, in_axes=(None, 0, 0, 0, None))(
            params, env_state, lanes_uniform, lanes_normal, t
        )
        return (next_state, lanes_alive & ~terminated & (t + 1 < horizon)), (records, lanes_alive)

    env_state = {k: v for k, v in state.items() if k != "key"}
    xs = (t0 + jnp.arange(length), jnp.swapaxes(uniform, 0, 1), jnp.swapaxes(normal, 0, 1))
    (env_state, alive), (records, valid) = jax.lax.scan(scan_step, (env_state, alive), xs)
    return (
        {**env_state, "key": state["key"]},
        alive,
        jax.tree.map(lambda x: jnp.swapaxes(x, 0, 1), records),
        valid.T,
    )


def _draws(key: jax.Array, noise: tuple[int, int], t0: jax.Array, length: int):
    """One lane's uniforms [length, U] and normals [length, N] of steps t0 .. t0 + length -
    1: a draw per CHUNK_STEPS steps from ``fold_in(key, its first step + 1)``, so a step's
    numbers do not depend on how many steps a scan runs (one draw where ``length`` is
    less: a horizon under CHUNK_STEPS)."""
    if length <= CHUNK_STEPS:
        return draw(jax.random.fold_in(key, t0 + 1), length, noise)
    starts = t0 + 1 + CHUNK_STEPS * jnp.arange(length // CHUNK_STEPS)
    uniform, normal = jax.vmap(
        lambda start: draw(jax.random.fold_in(key, start), CHUNK_STEPS, noise)
    )(starts)
    return uniform.reshape(length, -1), normal.reshape(length, -1)


def simulate(
    environment: Environment,
    params: Params,
    data_key: jax.Array,
    first_episode: int,
    n_episodes: int,
    horizon: int | None,
) -> dict[str, np.ndarray]:
    """Rolls out episodes first_episode .. first_episode + n_episodes - 1 under params["behavior"].

    The episodes run in groups of LANES (one compiled chunk for every batch size), and the
    last FEW_LANES alive in one group of that many, LONG_CHUNKS draws' worth of steps a
    scan; between chunks the state lives in NumPy and the live episodes are packed into as
    few groups as hold them. Returns step arrays in (episode_id, step) order: episode_id,
    step [N] int64, observation [N] or [N, d], action [N] or [N, k], reward and
    behavior_prob [N] float64.
    """
    n_groups = -(-n_episodes // LANES)
    ids = np.arange(first_episode, first_episode + n_groups * LANES, dtype=np.int64)
    alive = np.arange(len(ids)) < n_episodes
    groups = [slice(g * LANES, (g + 1) * LANES) for g in range(n_groups)]
    initial = [
        _reset_lanes(environment.reset, environment.noise, params, data_key, ids[g]) for g in groups
    ]
    state = {
        k: np.concatenate([np.asarray(group_state[k]) for group_state in initial])
        for k in initial[0]
    }
    length = min(CHUNK_STEPS, horizon or CHUNK_STEPS)
    horizon_array = np.int64(horizon or NO_HORIZON)
    pieces: list[tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]] = []
    t0 = 0
    while alive.any():
        outputs = [
            _run_chunk(
                environment.step,
                environment.noise,
                length,
                params,
                {k: v[g] for k, v in state.items()},
                alive[g],
                np.int64(t0),
                horizon_array,
            )
            for g in groups
        ]
        pieces += _valid_steps(groups, ids, t0, outputs)
        state = {k: np.concatenate([np.asarray(output[0][k]) for output in outputs]) for k in state}
        alive, t0 = np.concatenate([np.asarray(output[1]) for output in outputs]), t0 + length
        live = np.flatnonzero(alive)
        lanes = groups[0].stop  # the groups' width
        if 0 < len(live) <= FEW_LANES and length == CHUNK_STEPS:  # the long tail: long scans
            lanes, length = FEW_LANES, CHUNK_STEPS * LONG_CHUNKS
        if 0 < len(live) <= (len(groups) - 1) * lanes or lanes != groups[0].stop:
            # pack the live episodes into as few groups of ``lanes`` as hold them
            groups = [slice(g * lanes, (g + 1) * lanes) for g in range(-(-len(live) // lanes))]
            keep = np.resize(live, len(groups) * lanes)  # the padding repeats live lanes, dead
            state = {k: v[keep] for k, v in state.items()}
            ids, alive = ids[keep], np.arange(len(keep)) < len(live)
    return _in_episode_order(pieces)


def _valid_steps(
    groups: list[slice], ids: np.ndarray, t0: int, outputs: list
) -> list[tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]]:
    """(episode ids, steps, {name: records}) of each group's valid steps of a chunk that
    started at step ``t0`` (``outputs``: each group's ``_run_chunk``)."""
    pieces = []
    for g, (_, _, records, valid) in zip(groups, outputs, strict=True):
        lane, offset = np.nonzero(np.asarray(valid))
        pieces.append(
            (
                ids[g][lane],
                t0 + offset,
                {k: np.asarray(v)[lane, offset] for k, v in records.items()},
            )
        )
    return pieces


def _in_episode_order(
    pieces: list[tuple[np.ndarray, np.ndarray, dict[str, np.ndarray]]],
) -> dict[str, np.ndarray]:
    """The step arrays of ``pieces`` (in time order) in (episode_id, step) order."""
    episode_ids = np.concatenate([piece[0] for piece in pieces])
    # the pieces are in time order, which a stable sort keeps within each episode
    order = np.argsort(episode_ids, kind="stable")
    data = {
        "episode_id": episode_ids[order],
        "step": np.concatenate([piece[1] for piece in pieces])[order],
    }
    for name in pieces[0][2]:
        data[name] = np.concatenate([piece[2][name] for piece in pieces])[order]
    return data
