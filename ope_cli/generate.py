"""Synthetic logged datasets whose evaluation policies' true values are known (``ope generate``).

Each environment is fixed: its dynamics and behavior policy come from a constant NumPy seed.
``shift`` moves the evaluation policies away from the behavior policy along an improving
direction; ``seed`` only chooses which episodes are logged. So the ground truth depends on
``(env, gamma, horizon, shift)`` and not on ``seed``: many seeds give independent datasets with
one truth, which is what a coverage study of confidence intervals needs.

Rollouts are pure JAX, in float64: every episode has its own key ``fold_in(key(seed), id)``,
draws its random numbers a chunk of time steps at a time, and runs under ``jax.vmap`` over
episodes and ``jax.lax.scan`` over time. Between chunks, finished episodes leave the batch, so
skewed lengths cost their real steps. An episode's data depends only on ``seed`` and its id,
not on ``episodes`` or ``files``.

Environments:

- ``bandit``: contextual bandit, one step per episode, 5-d contexts drawn uniformly from a fixed
  set of 100, 10 actions, Bernoulli rewards; ``linear_softmax`` policies. Truth: exact
  enumeration over contexts and actions.
- ``chain``: 10 states in a line, actions left/stay/right that slip, mean rewards growing to the
  right, Bernoulli rewards in {0, 1}, a termination probability per (state, action) of 5-15%;
  ``tabular`` policies. Truth: the Bellman equations (a linear solve; backward induction when
  ``horizon`` caps the episodes).
- ``control``: 4-d linear-Gaussian state, actions noop/push+/push-, reward ``exp(-|s|^2 / 8)``
  minus an action cost plus noise, episode lengths from a discrete Pareto law (median 10, mean
  ~46) capped at ``horizon`` (default 1000) and independent of the actions; ``linear_softmax``
  policies. Truth: Monte Carlo with the exact length law and expected rewards (see
  ``_control_truth``), standard error recorded.
- ``gaussian``: 3-d linear-Gaussian state, 2-d continuous actions, reward
  ``-|a - target(s)|^2``, ``horizon`` steps (default 5); ``linear_gaussian`` policies. Truth:
  closed form from the Gaussian state moments.

Evaluation policies: ``policies/eval_0.npz`` at ``shift``, ``eval_1.npz`` at ``shift / 2`` and
``eval_2.npz`` at ``-shift`` (a worse policy), so estimators can be checked on ranking
checkpoints as well as on values. The directions are scaled per environment so that the default
``shift = 0.5`` gives trajectory weights with an effective sample size of roughly 10-50% of the
episodes; larger shifts make importance sampling harder.
"""

from __future__ import annotations

import dataclasses
import json
import math
import zipfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ope_cli.sources import METADATA_KEY

ENVIRONMENTS: tuple[str, ...] = ("bandit", "chain", "control", "gaussian")

POLICY_SCALES = (1.0, 0.5, -1.0)  # eval_k = behavior + POLICY_SCALES[k] * shift * direction

CONTROL_TRUTH_EPISODES = 1 << 16  # Monte Carlo episodes for the control truth ...
CONTROL_TRUTH_CONTINUED = 1 << 13  # ... of which this many run past CONTROL_TRUTH_SPLIT_STEP
CONTROL_TRUTH_SPLIT_STEP = 64

CHUNK_STEPS = 32  # time steps per jitted scan
LANES = 1024  # episodes per jitted scan
BLOCK_EPISODES = 1 << 17  # episodes simulated and written at a time (bounds memory)
ROW_GROUP_ROWS = 1 << 17
NO_HORIZON = np.iinfo(np.int64).max

Params = dict[str, Any]
State = dict[str, jax.Array]
Record = dict[str, jax.Array]
Truth = tuple[float, float, str]  # value, stderr, method


def _draw(key: jax.Array, steps: int, noise: tuple[int, int]) -> tuple[jax.Array, jax.Array]:
    """One random call: uniforms in (0, 1) [steps, U] and standard normals [steps, N]."""
    n_uniform, n_normal = noise
    raw = jax.random.uniform(key, (steps, n_uniform + n_normal), minval=np.nextafter(-1.0, 0.0))
    uniform = (raw[:, :n_uniform] + 1.0) / 2.0
    normal = math.sqrt(2.0) * jax.scipy.special.erfinv(raw[:, n_uniform:])
    return uniform, normal


def _sample_index(uniform: jax.Array, probs: jax.Array) -> jax.Array:
    """Inverse-CDF draw of an index from probs [n] with one uniform []; returns int []."""
    return jnp.sum(uniform > jnp.cumsum(probs)[:-1])


def _linear_softmax(policy: Params, obs: jax.Array) -> jax.Array:
    """softmax(obs [d] @ weight [d, A] + bias [A]) -> probs [A]."""
    return jax.nn.softmax(obs @ policy["weight"] + policy["bias"])


def _softmax_np(logits: np.ndarray) -> np.ndarray:
    """Softmax over the last axis, float64 NumPy."""
    z = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return z / z.sum(axis=-1, keepdims=True)


def _shifted(behavior: Params, direction: Params, shift: float) -> list[Params]:
    """[behavior, eval_0, ...]: eval_k = behavior + POLICY_SCALES[k] * shift * direction."""
    evals = [
        {k: v + scale * shift * direction[k] for k, v in behavior.items()}
        for scale in POLICY_SCALES
    ]
    return [behavior, *evals]


# --- environments --------------------------------------------------------------------------------
#
# build(shift) -> (env arrays, [behavior, eval_0, ...] policy arrays as written to .npz)
# reset(params, uniform [U], normal [N]) -> per-episode state with "obs"
# step(params, state, uniform [U], normal [N], t) -> (next state, record, terminated), with the
#   record's "observation", "action", "reward", "behavior_prob" under params["behavior"]
# truth(env arrays, policies, gamma, horizon) -> [(value, stderr, method)] per policy


def _bandit_build(shift: float) -> tuple[Params, list[Params]]:
    """Contexts [100, 5], click-model weights [5, 10] and biases [10]."""
    rng = np.random.default_rng(101)
    n_contexts, dim, n_actions = 100, 5, 10
    env = {
        "contexts": rng.normal(size=(n_contexts, dim)),
        "reward_weight": rng.normal(scale=0.6, size=(dim, n_actions)),
        "reward_bias": rng.normal(loc=-1.0, scale=0.5, size=n_actions),
    }
    behavior = {"weight": rng.normal(scale=0.2, size=(dim, n_actions)), "bias": np.zeros(n_actions)}
    direction = {"weight": 2.0 * env["reward_weight"], "bias": 2.0 * env["reward_bias"]}
    return env, _shifted(behavior, direction, shift)


def _bandit_reset(params: Params, uniform: jax.Array, normal: jax.Array) -> State:
    n_contexts = params["contexts"].shape[0]
    return {
        "obs": params["contexts"][
            jnp.minimum(jnp.floor(uniform[0] * n_contexts), n_contexts - 1).astype(int)
        ]
    }


def _bandit_step(params: Params, state: State, uniform: jax.Array, normal: jax.Array, t: jax.Array):
    obs = state["obs"]
    probs = _linear_softmax(params["behavior"], obs)
    action = _sample_index(uniform[0], probs)
    click_prob = jax.nn.sigmoid(obs @ params["reward_weight"] + params["reward_bias"])[action]
    reward = (uniform[1] < click_prob).astype(jnp.float64)
    record = {
        "observation": obs,
        "action": action,
        "reward": reward,
        "behavior_prob": probs[action],
    }
    return state, record, jnp.bool_(True)


def _bandit_truth(
    env: Params, policies: list[Params], gamma: float, horizon: int | None
) -> list[Truth]:
    """Mean over the contexts of sum_a pi(a|x) P(click | x, a)."""
    x = env["contexts"]
    click = 1.0 / (1.0 + np.exp(-(x @ env["reward_weight"] + env["reward_bias"])))
    values = [
        np.mean(np.sum(_softmax_np(x @ p["weight"] + p["bias"]) * click, axis=1)) for p in policies
    ]
    return [(float(v), 0.0, "exact enumeration") for v in values]


def _chain_build(shift: float) -> tuple[Params, list[Params]]:
    """Transitions [S, A, S], mean rewards and termination probabilities [S, A], initial law [S]."""
    rng = np.random.default_rng(202)
    n_states, n_actions, slip = 10, 3, 0.2
    transitions = np.zeros((n_states, n_actions, n_states))
    for s in range(n_states):
        for a, intended in enumerate((-1, 0, 1)):
            for move in (-1, 0, 1):
                target = min(max(s + move, 0), n_states - 1)
                transitions[s, a, target] += (1 - slip) * (move == intended) + slip / 3
    env = {
        "transitions": transitions,
        "mean_reward": np.clip(
            np.linspace(0.0, 1.0, n_states)[:, None]
            + rng.normal(scale=0.1, size=(n_states, n_actions)),
            0.0,
            1.0,
        ),
        "terminate": rng.uniform(0.05, 0.15, size=(n_states, n_actions)),
        "initial": np.array([0.5, 0.3, 0.2] + [0.0] * (n_states - 3)),
    }
    behavior = {"logits": rng.normal(scale=0.5, size=(n_states, n_actions))}
    direction = {"logits": np.tile([-1.0, 0.0, 1.0], (n_states, 1))}  # go right
    return env, _shifted(behavior, direction, shift)


def _chain_reset(params: Params, uniform: jax.Array, normal: jax.Array) -> State:
    return {"obs": _sample_index(uniform[0], params["initial"])}


def _chain_step(params: Params, state: State, uniform: jax.Array, normal: jax.Array, t: jax.Array):
    s = state["obs"]
    probs = jax.nn.softmax(params["behavior"]["logits"][s])
    action = _sample_index(uniform[0], probs)
    reward = (uniform[3] < params["mean_reward"][s, action]).astype(jnp.float64)  # Bernoulli
    terminated = uniform[1] < params["terminate"][s, action]
    next_s = _sample_index(uniform[2], params["transitions"][s, action])
    record = {"observation": s, "action": action, "reward": reward, "behavior_prob": probs[action]}
    return {"obs": next_s}, record, terminated


def _chain_truth(
    env: Params, policies: list[Params], gamma: float, horizon: int | None
) -> list[Truth]:
    """initial @ V, V = r_pi + gamma P_pi V with P_pi [S, S] the continuing transitions under pi."""
    truths = []
    for policy in policies:
        probs = _softmax_np(policy["logits"])
        reward_pi = np.sum(probs * env["mean_reward"], axis=1)
        transition_pi = np.einsum(
            "sa,sat->st", probs * (1.0 - env["terminate"]), env["transitions"]
        )
        if horizon is None:
            values = np.linalg.solve(np.eye(len(reward_pi)) - gamma * transition_pi, reward_pi)
        else:
            values = np.zeros_like(reward_pi)
            for _ in range(horizon):  # until the horizon or a fixed point in float64
                values, previous = reward_pi + gamma * transition_pi @ values, values
                if np.array_equal(values, previous):
                    break
        truths.append((float(env["initial"] @ values), 0.0, "bellman"))
    return truths


def _control_build(shift: float) -> tuple[Params, list[Params]]:
    """s' = s @ dynamics [d, d] + pushes[a] [A, d] + noise; lengths 1 + floor(10 (U^-1 - 1))."""
    rng = np.random.default_rng(303)
    dim = 4

    def rotation(angle: float) -> np.ndarray:
        return np.array([[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]])

    dynamics = np.zeros((dim, dim))
    dynamics[:2, :2], dynamics[2:, 2:] = 0.9 * rotation(0.3), 0.9 * rotation(-0.5)
    push = rng.normal(size=dim)
    # noop, push+, push-
    pushes = np.stack([np.zeros(dim), push, -push]) * 0.6 / np.linalg.norm(push)
    env = {
        "dynamics": dynamics,
        "pushes": pushes,
        "action_cost": np.array([0.0, 0.1, 0.1]),
        "state_noise": np.float64(0.3),
        "reward_noise": np.float64(0.1),
        "length_scale": np.float64(10.0),
        "length_index": np.float64(1.0),
    }
    behavior = {"weight": rng.normal(scale=0.3, size=(dim, 3)), "bias": np.zeros(3)}
    # logits -|s @ dynamics + push_a|^2 / 5: prefer the push that brings the next state nearest 0,
    # gently, as the log-ratios add up over up to `horizon` steps
    direction = {"weight": -0.4 * dynamics @ pushes.T, "bias": -0.2 * np.sum(pushes**2, axis=1)}
    return env, _shifted(behavior, direction, shift)


def _control_mean_reward(params: Params, obs: jax.Array) -> jax.Array:
    """Expected reward of each action, obs [..., d] -> [..., A]."""
    closeness = jnp.exp(-jnp.sum(obs**2, axis=-1, keepdims=True) / (2 * obs.shape[-1]))
    return closeness - params["action_cost"]


def _control_reset(params: Params, uniform: jax.Array, normal: jax.Array) -> State:
    dim = params["dynamics"].shape[0]
    pareto = params["length_scale"] * (uniform[0] ** (-1.0 / params["length_index"]) - 1.0)
    return {
        "obs": normal[:dim],
        "length": 1 + jnp.floor(jnp.minimum(pareto, 2.0**62)).astype(jnp.int64),
    }


def _control_step(
    params: Params, state: State, uniform: jax.Array, normal: jax.Array, t: jax.Array
):
    obs = state["obs"]
    probs = _linear_softmax(params["behavior"], obs)
    action = _sample_index(uniform[0], probs)
    reward = _control_mean_reward(params, obs)[action] + params["reward_noise"] * normal[-1]
    next_obs = (
        obs @ params["dynamics"] + params["pushes"][action] + params["state_noise"] * normal[:-1]
    )
    record = {
        "observation": obs,
        "action": action,
        "reward": reward,
        "behavior_prob": probs[action],
    }
    return {"obs": next_obs, "length": state["length"]}, record, t + 1 >= state["length"]


@jax.jit
def _control_truth_chunk(
    params: Params,
    policies: Params,
    obs: jax.Array,
    key: jax.Array,
    times: jax.Array,
    discounts: jax.Array,
) -> tuple[jax.Array, jax.Array]:
    """Steps `times` [T] of every policy from obs [P, d, n].

    Returns the next obs [P, d, n] and sum_t discounts[t] E_pi[r_t] [P, n].

    Batched by hand with the episodes last, which XLA on CPU runs ~4x faster than a vmap over
    episodes; the policies [P, ...] share the episodes' random numbers.
    """
    dim, n_lanes = obs.shape[1], obs.shape[2]

    def step(obs, inputs):
        t, discount = inputs
        uniform, normal = _draw(jax.random.fold_in(key, t), n_lanes, (1, dim))  # [n, 1], [n, d]
        logits = jnp.einsum("pdn,pda->pan", obs, policies["weight"]) + policies["bias"][:, :, None]
        probs = jax.nn.softmax(logits, axis=1)  # [P, A, n]
        mean_reward = jnp.moveaxis(
            _control_mean_reward(params, jnp.moveaxis(obs, 1, 2)), 2, 1
        )  # [P, A, n]
        actions = jnp.sum(uniform[:, 0] > jnp.cumsum(probs, axis=1)[:, :-1], axis=1)  # [P, n]
        pushes = jnp.einsum(
            "pan,ad->pdn", jax.nn.one_hot(actions, probs.shape[1], axis=1), params["pushes"]
        )
        next_obs = (
            jnp.einsum("pdn,de->pen", obs, params["dynamics"])
            + pushes
            + params["state_noise"] * normal.T
        )
        return next_obs, discount * jnp.sum(probs * mean_reward, axis=1)

    obs, rewards = jax.lax.scan(step, obs, (times, discounts))
    return obs, jnp.sum(rewards, axis=0)


def _control_truth(env: Params, policies: list[Params], gamma: float, horizon: int) -> list[Truth]:
    """value = sum_{t < horizon} gamma^t P(L > t) E_pi[r(s_t, a_t)], by Monte Carlo over states.

    The length L is independent of the states and actions, so its law enters exactly, and each
    step contributes its expected reward sum_a pi(a|s) r(s, a): no length or reward noise.
    CONTROL_TRUTH_EPISODES episodes run the first CONTROL_TRUTH_SPLIT_STEP steps and the first
    CONTROL_TRUTH_CONTINUED of them the rest, where the survival weights are small and so is the
    variance. The stderr accounts for both parts and their correlation. All runs are chunks of
    CONTROL_TRUTH_SPLIT_STEP steps of CONTROL_TRUTH_CONTINUED episodes: one compiled kernel.
    """
    n_all, n_group = CONTROL_TRUTH_EPISODES, CONTROL_TRUTH_CONTINUED
    chunk = CONTROL_TRUTH_SPLIT_STEP
    params = jax.tree.map(jnp.asarray, env)
    stacked = jax.tree.map(lambda *xs: jnp.stack(xs), *policies)
    n_chunks = -(-horizon // chunk)
    times = np.arange(n_chunks * chunk)
    survival = (1.0 + times / env["length_scale"]) ** (-env["length_index"])
    discounts = np.where(times < horizon, gamma**times * survival, 0.0)  # zero past the horizon
    start_key, steps_key = jax.random.split(jax.random.key(303))
    dim = env["dynamics"].shape[0]
    start = jax.random.normal(start_key, (n_all // n_group, 1, dim, n_group))  # [groups, 1, d, n]
    early_chunks, late_chunks = [], []  # jax arrays, read once every chunk is dispatched
    for group in range(n_all // n_group):
        group_key = jax.random.fold_in(steps_key, group)
        obs = jnp.broadcast_to(start[group], (len(policies), dim, n_group))
        obs, rewards = _control_truth_chunk(
            params, stacked, obs, group_key, times[:chunk], discounts[:chunk]
        )
        early_chunks.append(rewards)
        for k in range(1, n_chunks if group == 0 else 1):
            window = slice(k * chunk, (k + 1) * chunk)
            obs, rewards = _control_truth_chunk(
                params, stacked, obs, group_key, times[window], discounts[window]
            )
            late_chunks.append(rewards)
    early = np.concatenate(early_chunks, axis=1)  # [P, n_all]
    # [P, n_group]: the rest of the first group's episodes (none when horizon <= chunk)
    late = np.sum(late_chunks, axis=0) if late_chunks else np.zeros((len(policies), n_group))
    mean = early.mean(axis=1) + late.mean(axis=1)
    # a sum of independent per-episode terms, in two groups of identically distributed ones
    both = early[:, :n_group] / n_all + late / n_group
    only_early = early[:, n_group:] / n_all
    variance = n_group * both.var(axis=1, ddof=1) + (n_all - n_group) * only_early.var(
        axis=1, ddof=1
    )
    method = f"monte carlo ({n_all} episodes)"
    if n_chunks > 1:
        method = f"monte carlo ({n_all} episodes, {n_group} of them past step {chunk})"
    return [(float(m), float(math.sqrt(v)), method) for m, v in zip(mean, variance, strict=True)]


def _gaussian_build(shift: float) -> tuple[Params, list[Params]]:
    """s' = s @ dynamics [3, 3] + a @ control [2, 3] + noise; target(s) = s @ gain [3, 2] + c."""
    rng = np.random.default_rng(404)
    obs_dim, act_dim = 3, 2
    env = {
        "dynamics": 0.6 * np.eye(obs_dim) + rng.normal(scale=0.05, size=(obs_dim, obs_dim)),
        "control": rng.normal(scale=0.15, size=(act_dim, obs_dim)),
        "state_noise": np.float64(0.3),
        "gain": rng.normal(scale=0.5, size=(obs_dim, act_dim)),
        "offset": rng.normal(scale=0.5, size=act_dim),
    }
    behavior = {
        "weight": env["gain"] + rng.normal(scale=0.3, size=(obs_dim, act_dim)),
        "bias": env["offset"] + rng.normal(scale=0.3, size=act_dim),
        "log_std": np.full(act_dim, math.log(0.5)),
    }
    # towards the target (reached at shift 2) with narrower actions
    direction = {
        "weight": 0.5 * (env["gain"] - behavior["weight"]),
        "bias": 0.5 * (env["offset"] - behavior["bias"]),
        "log_std": np.full(act_dim, -0.15),
    }
    return env, _shifted(behavior, direction, shift)


def _gaussian_reset(params: Params, uniform: jax.Array, normal: jax.Array) -> State:
    return {"obs": normal[: params["dynamics"].shape[0]]}


def _gaussian_step(
    params: Params, state: State, uniform: jax.Array, normal: jax.Array, t: jax.Array
):
    obs, behavior = state["obs"], params["behavior"]
    act_dim = behavior["bias"].shape[0]
    z = normal[:act_dim]
    action = obs @ behavior["weight"] + behavior["bias"] + jnp.exp(behavior["log_std"]) * z
    log_density = jnp.sum(-0.5 * z**2 - behavior["log_std"] - 0.5 * math.log(2 * math.pi))
    reward = -jnp.sum((action - obs @ params["gain"] - params["offset"]) ** 2)
    next_obs = (
        obs @ params["dynamics"]
        + action @ params["control"]
        + params["state_noise"] * normal[act_dim:]
    )
    record = {
        "observation": obs,
        "action": action,
        "reward": reward,
        "behavior_prob": jnp.exp(log_density),
    }
    return {"obs": next_obs}, record, jnp.bool_(False)


def _gaussian_truth(env: Params, policies: list[Params], gamma: float, horizon: int) -> list[Truth]:
    """sum_t gamma^t E[r_t], propagating the state's mean [d] and covariance [d, d] exactly.

    With a = s W + b + std z: E[r | s] = -|s (W - K) + (b - c)|^2 - sum(std^2), and
    s' = s (A + W B) + b B + (std z) B + noise stays Gaussian.
    """
    dynamics, control, dim = env["dynamics"], env["control"], len(env["dynamics"])
    truths = []
    for policy in policies:
        weight, bias, variance = policy["weight"], policy["bias"], np.exp(2 * policy["log_std"])
        gap_weight, gap_bias = weight - env["gain"], bias - env["offset"]
        closed_loop = dynamics + weight @ control
        added_cov = control.T @ np.diag(variance) @ control + env["state_noise"] ** 2 * np.eye(dim)
        mean, cov, value = np.zeros(dim), np.eye(dim), 0.0
        for t in range(horizon):
            gap_mean = mean @ gap_weight + gap_bias
            value -= gamma**t * (
                np.trace(gap_weight.T @ cov @ gap_weight) + gap_mean @ gap_mean + variance.sum()
            )
            mean, cov = (
                mean @ closed_loop + bias @ control,
                closed_loop.T @ cov @ closed_loop + added_cov,
            )
        truths.append((float(value), 0.0, "closed form"))
    return truths


@dataclasses.dataclass(frozen=True)
class _Environment:
    build: Callable[[float], tuple[Params, list[Params]]]
    reset: Callable[..., State]
    step: Callable[..., tuple[State, Record, jax.Array]]
    truth: Callable[[Params, list[Params], float, int | None], list[Truth]]
    noise: tuple[int, int]  # uniforms and normals a reset or a step draws
    kind: str  # the policies' checkpoint kind
    default_horizon: int | None
    reward_range: tuple[float, float] | None  # declared in the logs' metadata when bounded


_ENVIRONMENTS = {
    "bandit": _Environment(
        _bandit_build,
        _bandit_reset,
        _bandit_step,
        _bandit_truth,
        (2, 0),
        "linear_softmax",
        1,
        (0.0, 1.0),
    ),
    "chain": _Environment(
        _chain_build, _chain_reset, _chain_step, _chain_truth, (4, 0), "tabular", None, (0.0, 1.0)
    ),
    "control": _Environment(
        _control_build,
        _control_reset,
        _control_step,
        _control_truth,
        (1, 5),
        "linear_softmax",
        1000,
        None,
    ),
    "gaussian": _Environment(
        _gaussian_build,
        _gaussian_reset,
        _gaussian_step,
        _gaussian_truth,
        (0, 5),
        "linear_gaussian",
        5,
        None,
    ),
}


# --- the rollout engine --------------------------------------------------------------------------


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
    uniform, normal = jax.vmap(lambda key: _draw(jax.random.fold_in(key, 0), 1, noise))(keys)
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
    uniform, normal = jax.vmap(lambda key: _draw(jax.random.fold_in(key, t0 + 1), length, noise))(
        keys
    )

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


def _simulate(
    environment: _Environment,
    params: Params,
    data_key: jax.Array,
    first_episode: int,
    n_episodes: int,
    horizon: int | None,
) -> dict[str, np.ndarray]:
    """Rolls out episodes first_episode .. first_episode + n_episodes - 1 under params["behavior"].

    The episodes run in groups of LANES (one compiled chunk for every batch size); between
    chunks the state lives in NumPy and the live episodes are packed into as few groups as hold
    them. Returns step arrays in (episode_id, step) order: episode_id, step [N] int64,
    observation [N] or [N, d], action [N] or [N, k], reward and behavior_prob [N] float64.
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
        for g, (_, _, records, valid) in zip(groups, outputs, strict=True):
            lane, offset = np.nonzero(np.asarray(valid))
            pieces.append(
                (
                    ids[g][lane],
                    t0 + offset,
                    {k: np.asarray(v)[lane, offset] for k, v in records.items()},
                )
            )
        state = {k: np.concatenate([np.asarray(output[0][k]) for output in outputs]) for k in state}
        alive, t0 = np.concatenate([np.asarray(output[1]) for output in outputs]), t0 + length
        live = np.flatnonzero(alive)
        if 0 < len(live) <= (len(groups) - 1) * LANES:  # pack the live episodes into fewer groups
            groups = groups[: -(-len(live) // LANES)]
            # the padding repeats live lanes, marked dead
            keep = np.resize(live, len(groups) * LANES)
            state = {k: v[keep] for k, v in state.items()}
            ids, alive = ids[keep], np.arange(len(keep)) < len(live)
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


# --- output files --------------------------------------------------------------------------------


def _column(values: np.ndarray) -> pa.Array:
    """[N] -> a scalar column; [N, d] -> a list<float64> column."""
    if values.ndim == 1:
        return pa.array(values)
    offsets = np.arange(0, values.size + 1, values.shape[1], dtype=np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values.reshape(-1)))


def _table(data: dict[str, np.ndarray], declared: dict) -> pa.Table:
    """The step-layout table, with the bounds every episode keeps to in its schema metadata
    (what ``ope evaluate --ci betting`` relies on)."""
    names = ("episode_id", "step", "observation", "action", "reward", "behavior_prob")
    table = pa.table({name: _column(data[name]) for name in names})
    return table.replace_schema_metadata({METADATA_KEY: json.dumps(declared)})


def _write_logs(
    environment: _Environment,
    params: Params,
    data_key: jax.Array,
    episodes: int,
    horizon: int | None,
    files: int,
    out: Path,
) -> tuple[int, int]:
    """Simulates and writes the episodes, whole ones per file; returns (steps, longest episode)."""
    for stale in [out / "logs.parquet", *(out / "logs").glob("part-*.parquet")]:  # an earlier run's
        stale.unlink(missing_ok=True)
    if files == 1:
        paths = [out / "logs.parquet"]
    else:
        (out / "logs").mkdir(exist_ok=True)
        paths = [out / "logs" / f"part-{k:05d}.parquet" for k in range(files)]
    bounds = [k * episodes // files for k in range(files + 1)]
    declared = {"reward_range": environment.reward_range, "horizon": horizon}
    steps = longest = 0
    for path, first, last in zip(paths, bounds[:-1], bounds[1:], strict=True):
        writer = None
        for start in range(first, last, BLOCK_EPISODES):
            data = _simulate(
                environment, params, data_key, start, min(BLOCK_EPISODES, last - start), horizon
            )
            table = _table(data, declared)
            writer = writer or pq.ParquetWriter(path, table.schema, compression="snappy")
            writer.write_table(table, row_group_size=ROW_GROUP_ROWS)
            steps += len(data["step"])
            longest = max(longest, int(data["step"].max()) + 1)
        writer.close()
    return steps, longest


def _write_npz(path: Path, kind: str, arrays: Params) -> None:
    """Like np.savez, with a fixed date in the archive so equal arrays give equal bytes."""
    entries = {
        "kind": np.array(kind),
        **{k: np.asarray(v, dtype=np.float64) for k, v in arrays.items()},
    }
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        for name, value in entries.items():
            info = zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0))
            with archive.open(info, "w", force_zip64=True) as member:
                np.lib.format.write_array(member, value, allow_pickle=False)


def _check_options(
    env: str, episodes: int, seed: int, gamma: float, horizon: int | None, shift: float, files: int
) -> None:
    def is_int(value: Any) -> bool:
        return isinstance(value, int | np.integer) and not isinstance(value, bool)

    if env not in _ENVIRONMENTS:
        raise ValueError(f"unknown environment {env!r}; choose one of {', '.join(ENVIRONMENTS)}")
    if not is_int(episodes) or episodes < 1:
        raise ValueError(f"episodes must be a positive integer, got {episodes!r}")
    if not is_int(seed) or not 0 <= seed < 2**63:
        raise ValueError(f"seed must be a non-negative integer, got {seed!r}")
    if not isinstance(gamma, int | float) or isinstance(gamma, bool) or not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must be in [0, 1], got {gamma!r}")
    if horizon is not None and (not is_int(horizon) or horizon < 1):
        raise ValueError(f"horizon must be a positive integer, got {horizon!r}")
    if env == "bandit" and horizon not in (None, 1):
        raise ValueError(f"bandit episodes have one step, so horizon must be 1, got {horizon}")
    if not isinstance(shift, int | float) or isinstance(shift, bool) or not math.isfinite(shift):
        raise ValueError(f"shift must be a finite number, got {shift!r}")
    if not is_int(files) or not 1 <= files <= episodes:
        raise ValueError(
            f"files must be an integer from 1 to the number of episodes ({episodes}), got {files!r}"
        )


def generate(
    env: str,
    out_dir: str | Path,
    *,
    episodes: int = 1000,
    seed: int = 0,
    gamma: float = 1.0,
    horizon: int | None = None,
    shift: float = 0.5,
    files: int = 1,
) -> dict:
    """Writes a synthetic dataset of `env` and its policies' true values; returns truth.json's dict.

    Files: OUT/logs.parquet (OUT/logs/part-00000.parquet ... when files > 1, whole episodes
    per file), OUT/behavior.npz, OUT/policies/eval_{0,1,2}.npz and OUT/truth.json. `horizon`
    caps episode lengths (default: bandit 1, chain none, control 1000, gaussian 5). Raises
    ValueError for an unknown env or a bad option.
    """
    _check_options(env, episodes, seed, gamma, horizon, shift, files)
    environment = _ENVIRONMENTS[env]
    horizon = horizon if horizon is not None else environment.default_horizon
    gamma, shift = float(gamma), float(shift)
    env_arrays, policies = environment.build(shift)
    out = Path(out_dir)
    (out / "policies").mkdir(parents=True, exist_ok=True)

    with jax.enable_x64(True):
        truths = environment.truth(env_arrays, policies, gamma, horizon)
        params = jax.tree.map(jnp.asarray, {**env_arrays, "behavior": policies[0]})
        steps, longest = _write_logs(
            environment, params, jax.random.key(seed), episodes, horizon, files, out
        )

    paths = ["behavior.npz"] + [f"policies/eval_{k}.npz" for k in range(len(POLICY_SCALES))]
    for path, policy in zip(paths, policies, strict=True):
        _write_npz(out / path, environment.kind, policy)
    entries = [
        {"policy": path, "value": value, "stderr": stderr, "method": method}
        for path, (value, stderr, method) in zip(paths, truths, strict=True)
    ]
    truth = {
        "env": env,
        "gamma": gamma,
        "episodes": episodes,
        "seed": seed,
        "shift": shift,
        "horizon": horizon,
        "reward_range": list(environment.reward_range) if environment.reward_range else None,
        "steps": steps,
        "max_length": longest,
        "policies": entries[1:],
        "behavior": entries[0],
    }
    (out / "truth.json").write_text(json.dumps(truth, indent=2) + "\n")
    return truth
