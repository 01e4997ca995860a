"""``mlp``: fitted Q evaluation with a small neural network, in JAX with optax.

Frozen-target iterations: Q_{k+1} is fitted to r + gamma V_k(s') (V_k(s') = 0 after the
last step) with ``STEPS`` Adam steps on minibatches of ``BATCH`` transitions drawn from the
training episodes, starting from Q_k, the learning rate decaying to 0 over them (cosine) so
that the last steps settle. Discrete actions: the network maps the observation to Q(s, .)
[A] (kind ``mlp_q``), V(s) = sum_a pi_e(a|s) Q(s, a); continuous actions: it maps
concat(observation, action) to Q(s, a) [1] (``mlp_q_sa``), V(s) the mean of Q over
``V_SAMPLES`` actions drawn from pi_e.

Stopping: each iteration reaches one step further ahead, so at least ``min_iterations`` run
(the longest episode's steps, or enough for gamma^k < 1%, whichever is fewer); then the
iterations stop once Q(s, a) over the held-out fifth of the episodes (by id hash) changes
by less than ``TOLERANCE`` (relative RMS) twice in a row, or at ``iteration_limit``
(``converged`` says which; a fit that would need more than ``LOOKAHEAD_LIMIT`` steps ahead
stops there and is not converged). The held-out Bellman residual r + gamma V(s') - Q(s, a) of the
final Q is reported, but does not pick the iteration: a sample residual also holds the
spread of V(s') over the next states, which grows with Q, so it favours a Q shrunk towards
0 (on ``ope generate chain`` it rose from 0.53 at the first iteration to 0.86 at the 30th,
while dm moved from 0.11 to the truth's neighbourhood; stopping on a 2% change alone, after
18 iterations, left dm 7% short of the truth). Inputs are standardised with the training
steps' mean and spread, folded into the first layer of the checkpoint; each iteration's
targets likewise (Q = m + s net, m and s the targets' mean and spread, the last layer
re-expressed in them before it is fitted, folded into it at the end): with raw targets a
reward offset of 1,000 stopped the fit at half the value (501.6 against 1,000.6), said
converged, since 100 Adam steps move the output by a bounded amount.

The transitions are held in memory ([N, d] observations and next observations, pi_e at the
next state), up to ``OPE_FIT_MEMORY_GB``; past it the model refuses with one line.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from ope_cli.errors import DataError, UsageError
from ope_cli.models.behavior_models.base import (
    Gather,
    features,
    largest,
    standardizer,
    summed,
    usable_spread,
)
from ope_cli.models.behavior_models.softmax import MEMORY_ENV, memory_budget
from ope_cli.models.q_models.base import Transitions, centred

HIDDEN = (64, 64)
MAX_ITERATIONS, STEPS, BATCH, LEARNING_RATE, TOLERANCE = 100, 100, 256, 3e-3, 2e-2
HORIZON_SHARE = 1e-2
# The most iterations, hence steps ahead, a fit runs: on longer horizons it stops there, not
# converged (at 100, a fit on 300-step episodes said "converged" at a third of the value)
LOOKAHEAD_LIMIT = 1_000
_STEP_FIELDS = ("x", "a", "r", "done", "x_next", "p_next", "fold", "holdout")
_START_FIELDS = ("x0", "p0", "fold0")


def _optax():
    """optax (a dependency), imported when the model is fitted."""
    import optax

    return optax


def forward(arrays: dict[str, np.ndarray], inputs: np.ndarray, xp=np):
    """[..., out] the MLP of checkpoint ``arrays`` (tanh or relu between layers)."""
    layers = sum(1 for key in arrays if key.startswith("weight_"))
    relu = str(arrays.get("activation", "tanh")) == "relu"
    hidden = inputs
    for i in range(layers):
        hidden = hidden @ arrays[f"weight_{i}"] + arrays[f"bias_{i}"]
        if i < layers - 1:
            hidden = xp.maximum(hidden, 0.0) if relu else xp.tanh(hidden)
    return hidden


def q_sa(arrays, x, a, discrete: bool, xp=np):
    """[N] Q(s, a) of observations x [N, d] and actions a ([N] int or [N, k])."""
    if discrete:
        return xp.take_along_axis(forward(arrays, x, xp), a[:, None], axis=1)[:, 0]
    return forward(arrays, xp.concatenate([x, a], axis=1), xp)[:, 0]


def values(arrays, x, p, discrete: bool, xp=np):
    """[N] V(s) = sum_a pi(a|s) Q(s, a) (p [N, A]) or the mean of Q(s, a_m) (p [N, M, k])."""
    if discrete:
        return xp.sum(p * forward(arrays, x, xp), axis=1)
    tiled = xp.broadcast_to(x[:, None, :], (*p.shape[:2], x.shape[1]))
    return xp.mean(forward(arrays, xp.concatenate([tiled, p], axis=2), xp)[..., 0], axis=1)


class MlpQ:
    """The transitions held in memory: x, x_next [N, d], a, r, done, fold, holdout [N],
    p_next [N, A] or [N, M, k]; and the initial steps x0 [E, d], p0, fold0 [E]."""

    name = "mlp"

    def __init__(self, folds: int, gamma: float, discrete: bool, seed: int = 0, budget=None):
        self.folds, self.gamma, self.discrete, self.seed = folds, gamma, discrete, seed
        self.budget = memory_budget() if budget is None else budget
        self.parts: dict[str, list[np.ndarray]] = {f: [] for f in _STEP_FIELDS + _START_FIELDS}
        self.bytes = 0
        self.longest = 0  # steps of the longest episode
        self._data: dict[str, np.ndarray] | None = None
        self.last: dict = {}

    def add(self, batch: Transitions) -> None:
        x = features(batch.observation)
        p = batch.probs if self.discrete else batch.samples
        a = batch.action if self.discrete else features(batch.action)
        self.bytes += 2 * x.nbytes + p.nbytes + a.nbytes + 26 * batch.size
        if self.bytes > self.budget:
            raise self._over_budget()
        step = {"x": x, "a": a, "r": batch.reward, "done": batch.done}
        step |= {"x_next": batch.next_of(x), "p_next": batch.next_of(p)}
        step |= {"fold": batch.fold, "holdout": batch.holdout}
        step |= {"x0": x[batch.first], "p0": p[batch.first], "fold0": batch.fold[batch.first]}
        for name, value in step.items():
            self.parts[name].append(value)
        starts = np.flatnonzero(batch.first)
        self.longest = max(self.longest, int(np.diff(starts, append=batch.size).max()))

    def _over_budget(self) -> UsageError:
        """Past the budget: the linear model streams, but over discrete actions only (for
        continuous ones it was suggested, and then refused)."""
        instead = (
            "use the linear model (fit-q --model linear, --q fit:linear), or fit on a sample "
            "of the episodes"
            if self.discrete
            else "fit on a sample of the episodes (the linear model, which streams, takes "
            "discrete actions only)"
        )
        return UsageError(
            f"the mlp Q model holds the transitions in memory and needs more than "
            f"{self.budget / 2**30:.3g} GiB for this data ({MEMORY_ENV} raises the budget); "
            f"{instead}"
        )

    def data(self) -> dict[str, np.ndarray]:
        """Every held array, concatenated in reading order once."""
        if self._data is None:
            if not self.parts["x"]:
                raise DataError("no steps to fit the mlp Q model on")
            self._data = {name: np.concatenate(p) for name, p in self.parts.items()}
            self.parts = {}
        return self._data

    def gather_processes(self, gather: Gather) -> None:
        """Every process's transitions, in process order, within the memory budget."""
        total = int(summed(gather, np.asarray(self.bytes)))
        if total > self.budget:
            raise self._over_budget()
        mine = self.data() if self._data is not None or self.parts.get("x") else None
        sizes = (0, 0, 0, 0)
        if mine is not None:
            p_shape = mine["p_next"].shape[1:] + (0,)
            k = 0 if self.discrete else mine["a"].shape[1]
            sizes = (mine["x"].shape[1], k, p_shape[0], p_shape[1])
        d, k, p1, p2 = largest(gather, sizes)
        if mine is None:
            mine = _empty(d, k, (p1,) if self.discrete else (p1, p2), self.discrete)
        self._data = {name: _gathered(gather, value) for name, value in mine.items()}
        self.bytes = total
        (self.longest,) = largest(gather, (self.longest,))

    def _weights(self, exclude: int | None) -> tuple[np.ndarray, np.ndarray]:
        d = self.data()
        kept = np.ones(d["r"].shape, bool) if exclude is None else d["fold"] != exclude
        return (kept & ~d["holdout"]).astype(float), (kept & d["holdout"]).astype(float)

    def fit(self, exclude: int | None = None) -> dict[str, np.ndarray]:
        """MLP checkpoint arrays fitted on every fold but ``exclude`` (its held-out fifth
        picks the iteration kept); ``self.last`` holds the fit's diagnostics."""
        import jax.numpy as jnp

        train, valid = self._weights(exclude)
        if not train.any():
            train, valid = train + valid, np.zeros_like(valid)  # too few episodes to hold out
        if not train.any():
            raise DataError("no steps to fit the mlp Q model on")
        mu, sd = self._scale(train)
        inputs = self._inputs(mu, sd)
        program = _iteration_program(self.discrete, STEPS, BATCH, LEARNING_RATE)
        params = _initial(self.seed, mu.shape[0], self._outputs())
        units = (np.float64(0.0), np.float64(1.0))  # Q = m + s net: Q_0 = 0 (not weakly
        # typed, as the later units are not: one compilation)
        watch = np.flatnonzero(valid if valid.any() else train)  # rows scored each iteration
        args = (jnp.asarray(train), jnp.asarray(watch), self.gamma)
        least = min_iterations(self.gamma, self.longest)
        iterations, calm, rmse = 0, 0, math.nan
        for iteration in range(iteration_limit(least)):  # frozen-target iterations
            params, units, rmse, change = program(
                params, units, iteration, self.seed, inputs, *args
            )
            iterations += 1
            calm = calm + 1 if float(change) <= TOLERANCE else 0
            if calm >= 2 and iterations >= least:
                break
        self.last = {
            "iterations": iterations,
            # Q-hat looks one step further ahead per iteration: calm before it reached
            # ``least`` steps is the small change of each further discounted step
            "converged": calm >= 2 and iterations >= least,
            "heldout_bellman_rmse": float(rmse) if valid.any() else None,
            "heldout_steps": int(valid.sum()),
        }
        return _export(params, mu, sd, units)

    def _outputs(self) -> int:
        return int(self.data()["p_next"].shape[1]) if self.discrete else 1

    def _scale(self, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and spread ([d] or [d + k]) of the network's inputs over weighted steps."""
        d = self.data()
        inputs = d["x"] if self.discrete else np.concatenate([d["x"], d["a"]], axis=1)
        return standardizer(inputs, weight)

    def _inputs(self, mu: np.ndarray, sd: np.ndarray) -> tuple:
        """The standardised arrays the JAX program trains on."""
        import jax.numpy as jnp

        d = self.data()
        width = d["x"].shape[1]
        x, x_next = (d["x"] - mu[:width]) / sd[:width], (d["x_next"] - mu[:width]) / sd[:width]
        a, p = d["a"], d["p_next"]
        if not self.discrete:
            a, p = (a - mu[width:]) / sd[width:], (p - mu[width:]) / sd[width:]
        return tuple(jnp.asarray(v) for v in (x, a, d["r"], d["done"], x_next, p))

    def _select(self, fold: int | None, prefix: str = "") -> dict[str, np.ndarray]:
        d = self.data()
        rows = slice(None) if fold is None else d[f"fold{prefix or ''}"] == fold
        return {k: v[rows] for k, v in d.items() if (k in _START_FIELDS) == bool(prefix)}

    def residual(self, arrays: dict[str, np.ndarray], fold: int | None = None):
        """(sum of squared Bellman residuals of ``arrays``, steps) over one fold's steps;
        in-sample (``fold`` None), over the steps fitted on, not the held-out fifth (its
        own RMSE is reported beside: the in-sample figure blended both)."""
        d = self._select(fold)
        if fold is None and d["holdout"].any() and not d["holdout"].all():
            d = {key: value[~d["holdout"]] for key, value in d.items()}
        v_next = values(arrays, d["x_next"], d["p_next"], self.discrete)
        target = d["r"] + self.gamma * np.where(d["done"], 0.0, v_next)
        gap = q_sa(arrays, d["x"], d["a"], self.discrete) - target
        return float(gap @ gap), int(gap.size)

    def initial_centred(self, arrays: dict[str, np.ndarray], fold: int | None = None):
        """InitialValues of one fold's episodes, about the first one's V(s_0)."""
        d = self._select(fold, prefix="0")
        return centred(np.asarray(values(arrays, d["x0"], d["p0"], self.discrete), np.float64))


def min_iterations(gamma: float, longest: int) -> int:
    """Iterations before convergence may stop them: enough for gamma^k < HORIZON_SHARE
    (the discounted weight of what lies further ahead) or for the longest episode's
    steps, whichever is fewer. Past LOOKAHEAD_LIMIT, the fit stops there, not converged."""
    if gamma == 0:  # Q is the reward's regression: one iteration (log 0 has no value)
        return 1
    horizon = math.ceil(math.log(HORIZON_SHARE) / math.log(gamma)) if gamma < 1 else longest
    return max(1, min(longest, horizon))


def iteration_limit(least: int) -> int:
    """The most iterations a fit needing ``least`` runs: MAX_ITERATIONS, or ``least`` and
    a quarter of MAX_ITERATIONS more to settle, up to LOOKAHEAD_LIMIT."""
    return max(MAX_ITERATIONS, min(least + MAX_ITERATIONS // 4, LOOKAHEAD_LIMIT))


def _empty(d: int, k: int, p_shape: tuple[int, ...], discrete: bool) -> dict:
    """The held arrays of a process that read no steps: zero rows, the others' widths."""
    a = np.zeros(0, np.int64) if discrete else np.zeros((0, k))
    return {
        "x": np.zeros((0, d)),
        "a": a,
        "r": np.zeros(0),
        "done": np.zeros(0, bool),
        "x_next": np.zeros((0, d)),
        "p_next": np.zeros((0, *p_shape)),
        "fold": np.zeros(0, np.int64),
        "holdout": np.zeros(0, bool),
        "x0": np.zeros((0, d)),
        "p0": np.zeros((0, *p_shape)),
        "fold0": np.zeros(0, np.int64),
    }


def _gathered(gather: Gather, value: np.ndarray) -> np.ndarray:
    """``value`` of every process concatenated, its dtype kept (booleans travel as ints)."""
    wire = value.astype(np.int64) if value.dtype == bool else value
    return gather(wire).astype(value.dtype)


def _initial(seed: int, inputs: int, outputs: int) -> dict[str, np.ndarray]:
    """Layer weights ~ N(0, 1 / fan_in) (NumPy, from ``seed``: no compilation), zero
    biases, a zero last layer (Q_0 = 0)."""
    rng = np.random.default_rng(seed)
    sizes = (inputs, *HIDDEN, outputs)
    params = {}
    for i, (fan_in, fan_out) in enumerate(zip(sizes[:-1], sizes[1:], strict=True)):
        scale = 0.0 if i == len(sizes) - 2 else 1.0 / math.sqrt(fan_in)
        params[f"weight_{i}"] = scale * rng.standard_normal((fan_in, fan_out))
        params[f"bias_{i}"] = np.zeros(fan_out)
    return params


def _last_layer(params: dict) -> tuple[str, str]:
    """The keys of the network's last layer: (its weight, its bias)."""
    last = sum(1 for key in params if key.startswith("weight_")) - 1
    return f"weight_{last}", f"bias_{last}"


def _in_units(params: dict, units: tuple, new_units: tuple, xp=np) -> dict:
    """``params`` with the last layer re-expressed so that m' + s' net' = m + s net:
    ``units`` (m, s) the network's output units, ``new_units`` (m', s') the new ones."""
    (mean, spread), (new_mean, new_spread) = units, new_units
    weight, bias = _last_layer(params)
    ratio = spread / new_spread
    return {
        **params,
        weight: params[weight] * ratio,
        bias: params[bias] * ratio + (mean - new_mean) / new_spread,
    }


def _export(params: dict, mu: np.ndarray, sd: np.ndarray, units: tuple) -> dict[str, np.ndarray]:
    """Checkpoint arrays over the raw inputs and outputs: the inputs' standardisation folded
    into layer 0, the output units (m, s) into the last layer."""
    arrays = {k: np.asarray(v, np.float64) for k, v in params.items()}
    arrays = _in_units(arrays, tuple(float(u) for u in units), (0.0, 1.0))
    w0 = arrays["weight_0"]
    arrays["bias_0"] = arrays["bias_0"] - (mu / sd) @ w0
    arrays["weight_0"] = w0 / sd[:, None]
    return {**arrays, "activation": np.array("tanh")}


@functools.cache  # one jitted program per setting, reused by every fold and iteration
def _iteration_program(discrete: bool, steps: int, batch: int, learning_rate: float):
    import jax
    import jax.numpy as jnp

    optax = _optax()
    solver = optax.adam(optax.cosine_decay_schedule(learning_rate, steps))

    def program(params, units, iteration, seed, data, train, watch, gamma):
        """One frozen-target iteration: (new params, their output units (m, s): Q = m +
        s net, the Bellman RMSE of the new Q and the relative RMS change of Q(s, a), both
        over the ``watch`` rows)."""
        x, a, r, done, x_next, p_next = data
        mean, spread = units
        v_next = mean + spread * values(params, x_next, p_next, discrete, jnp)
        target = r + gamma * jnp.where(done, 0.0, v_next)
        share = train / jnp.sum(train)
        new_mean = share @ target
        new_spread = jnp.sqrt(share @ (target - new_mean) ** 2)
        new_spread = usable_spread(new_spread, new_mean, jnp)
        before = mean + spread * q_sa(params, x[watch], a[watch], discrete, jnp)
        params = _in_units(params, units, (new_mean, new_spread), jnp)
        scaled = (target - new_mean) / new_spread
        # Q_k warm-starts Q_{k+1}, its mean moved to the targets' (Q_0 = 0 was 1,000 of the
        # units away from targets near 1,000, which bounded Adam steps cross in 100s of steps)
        _, bias = _last_layer(params)
        shift = share @ (scaled - q_sa(params, x, a, discrete, jnp))
        params = {**params, bias: params[bias] + shift}
        cdf = jnp.cumsum(train) / jnp.sum(train)
        key = jax.random.fold_in(jax.random.key(seed), iteration)

        def loss(p, rows):
            gap = q_sa(p, x[rows], a[rows], discrete, jnp) - scaled[rows]
            return jnp.mean(gap * gap)

        def step(i, carry):
            p, state = carry
            u = jax.random.uniform(jax.random.fold_in(key, i), (batch,))
            rows = jnp.minimum(jnp.searchsorted(cdf, u, side="right"), r.shape[0] - 1)
            updates, state = solver.update(jax.grad(loss)(p, rows), state, p)
            return optax.apply_updates(p, updates), state

        params, _ = jax.lax.fori_loop(0, steps, step, (params, solver.init(params)))

        def raw(net):  # Q in the rewards' units
            return new_mean + new_spread * net

        after = raw(q_sa(params, x[watch], a[watch], discrete, jnp))
        v_next = raw(values(params, x_next[watch], p_next[watch], discrete, jnp))
        gap = after - (r[watch] + gamma * jnp.where(done[watch], 0.0, v_next))

        def rms(values):
            return jnp.sqrt(jnp.mean(values * values))

        change = rms(after - before) / jnp.maximum(rms(after), 1e-12)
        return params, (new_mean, new_spread), rms(gap), change

    return jax.jit(program)
