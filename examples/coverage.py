"""How often do `ope evaluate`'s 95% intervals contain the true value? A coverage study.

`ope generate` writes DATASETS x EPISODES episodes of one environment in one batched JAX
rollout; episode ids 0..EPISODES-1 form dataset 0, the next EPISODES dataset 1, and so on, so
the datasets are independent samples with one known truth (truth.json). Every dataset is then
evaluated at once: the policy's log-probabilities and the kernel's batch statistics
(``ope_cli.estimators.batch_statistics``, the code `ope evaluate` runs) are vmapped over a
[datasets, episodes, time] array, and each dataset's statistics are finalised with every
interval method (``ope_cli.stats.finalize``). The README's coverage table comes from:

    python examples/coverage.py            # chain, 400 datasets of 300 episodes, gamma 0.95

It prints a Markdown table of coverage and mean width per method and estimator; ``--json``
prints the raw numbers.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
from pathlib import Path

import numpy as np

METHODS = ("betting", "normal", "percentile", "bootstrap-t")
ESTIMATORS = ("is", "wis", "pdis", "wpdis")


def binomial_tolerance(datasets: int, confidence: float, sigmas: float = 3.0) -> float:
    """Lowest coverage consistent with ``confidence`` over ``datasets`` independent intervals:
    the promised rate minus ``sigmas`` binomial standard deviations."""
    return confidence - sigmas * math.sqrt(confidence * (1 - confidence) / datasets)


def padded_datasets(logs: Path, datasets: int, episodes: int) -> dict[str, np.ndarray]:
    """The step-layout logs as [datasets, episodes, T] arrays (T: the longest episode).

    ``ope generate`` writes steps sorted by (episode_id, step) and ids 0..N-1, so episode i is
    row i // episodes, column i % episodes. Keys are the episode-id hashes `ope evaluate`
    uses for resampling groups and bootstrap streams.
    """
    import pyarrow.parquet as pq

    from ope_cli.buckets import RESAMPLING_GROUPS
    from ope_cli.episodes import id_keys

    table = pq.read_table(logs, columns=["episode_id", "observation", "action", "reward",
                                         "behavior_prob"])
    ids = table.column("episode_id").to_numpy()
    lengths = np.bincount(ids, minlength=datasets * episodes)
    longest = int(lengths.max())
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    step = np.arange(len(ids)) - starts[ids]

    def padded(values: np.ndarray, fill) -> np.ndarray:
        out = np.full((datasets * episodes, longest), fill, values.dtype)
        out[ids, step] = values
        return out.reshape(datasets, episodes, longest)

    keys = id_keys(np.arange(datasets * episodes)).reshape(datasets, episodes)
    return {
        "observation": padded(table.column("observation").to_numpy(), 0),
        "action": padded(table.column("action").to_numpy(), 0),
        "reward": padded(table.column("reward").to_numpy(), 0.0),
        "log_behavior": padded(np.log(table.column("behavior_prob").to_numpy()), 0.0),
        "step_mask": padded(np.ones(len(ids), bool), False),
        "group": (keys % np.uint64(RESAMPLING_GROUPS)).astype(np.int32),
        "key_hi": (keys >> np.uint64(32)).astype(np.uint32),
        "key_lo": (keys & np.uint64(0xFFFFFFFF)).astype(np.uint32),
    }


def dataset_statistics(arrays: dict[str, np.ndarray], policy, gamma: float, seed: int,
                       replicates: int, betting_range, chunk: int = 25) -> list:
    """BatchStatistics of every dataset (a list, one per dataset), ``chunk`` datasets per call
    of one jitted function vmapped over datasets."""
    import jax
    import jax.numpy as jnp

    from ope_cli.buckets import RESAMPLING_GROUPS
    from ope_cli.estimators import batch_statistics, log_weights, poisson_counts

    @jax.jit
    def statistics(params, obs, action, reward, log_behavior, step_mask, group, key_hi, key_lo):
        log_pi = jax.vmap(jax.vmap(policy.log_prob, in_axes=(None, 0, 0)),
                          in_axes=(None, 0, 0))(params, obs, action)
        log_w = log_weights(log_pi, log_behavior, step_mask)
        counts = poisson_counts(key_hi, key_lo, seed, replicates)
        return batch_statistics(log_w, reward, step_mask, jnp.ones(obs.shape[0], bool), group,
                                counts, gamma, RESAMPLING_GROUPS, jnp.asarray(betting_range))

    names = ("observation", "action", "reward", "log_behavior", "step_mask", "group", "key_hi",
             "key_lo")
    params = {k: jnp.asarray(v) for k, v in policy.params.items()}
    out = []
    for start in range(0, len(arrays["reward"]), chunk):
        part = [arrays[name][start:start + chunk] for name in names]
        batched = jax.device_get(jax.vmap(statistics, in_axes=(None,) + (0,) * len(names))(
            params, *part))
        out.extend(type(batched)(*(v[d] for v in batched)) for d in range(len(part[0])))
    return out


def measure(env: str = "chain", datasets: int = 400, episodes: int = 300, gamma: float = 0.95,
            shift: float = 0.5, confidence: float = 0.95, seed: int = 0,
            bootstrap_samples: int = 200, policy_index: int = 0) -> dict:
    """Coverage and mean width of each method's intervals for each estimator."""
    import jax

    jax.config.update("jax_enable_x64", True)
    from ope_cli.config import EvaluationConfig
    from ope_cli.generate import generate
    from ope_cli.pipeline import plan_intervals
    from ope_cli.policies import load_checkpoint
    from ope_cli.reader import open_dataset
    from ope_cli.stats import finalize, from_batch

    with tempfile.TemporaryDirectory() as directory:
        truth = generate(env, directory, episodes=datasets * episodes, seed=seed, gamma=gamma,
                         shift=shift)
        entry = truth["policies"][policy_index]
        policy = load_checkpoint(str(Path(directory) / entry["policy"]))
        logs = Path(directory) / "logs.parquet"
        plan = plan_intervals(EvaluationConfig(data=str(logs), gamma=gamma, interval="betting"),
                              open_dataset(str(logs)).declared_bounds())
        arrays = padded_datasets(logs, datasets, episodes)
    max_length = arrays["reward"].shape[-1]
    batches = dataset_statistics(arrays, policy, gamma, seed, bootstrap_samples,
                                 plan.betting_range)
    covered = {m: {e: 0 for e in ESTIMATORS} for m in METHODS}
    width = {m: {e: 0.0 for e in ESTIMATORS} for m in METHODS}
    for batch in batches:
        accumulator = from_batch(batch)
        # Steps past a dataset's own longest episode add nothing to WPDIS, so the longest
        # of all datasets serves every one.
        for method in METHODS:
            estimates, _ = finalize(accumulator, gamma, max_length, confidence, method,
                                    plan.betting_range)
            for name, e in estimates.items():
                if e.ci_low is not None and e.ci_low <= entry["value"] <= e.ci_high:
                    covered[method][name] += 1
                if e.ci_low is not None:
                    width[method][name] += (e.ci_high - e.ci_low) / datasets
    return {
        "env": env, "datasets": datasets, "episodes": episodes, "gamma": gamma, "shift": shift,
        "confidence": confidence, "policy": entry["policy"], "truth": entry["value"],
        "reward_range": list(plan.reward_range), "discounted_horizon": plan.betting_range[2],
        "tolerance": binomial_tolerance(datasets, confidence),
        "coverage": {m: {e: covered[m][e] / datasets for e in ESTIMATORS} for m in METHODS},
        "mean_width": width,
    }


def markdown(result: dict) -> str:
    lines = ["| method | " + " | ".join(ESTIMATORS) + " |", "| --- |" + " --- |" * len(ESTIMATORS)]
    for method in METHODS:
        cells = [f"{result['coverage'][method][e]:.1%} (width {result['mean_width'][method][e]:.2f})"
                 for e in ESTIMATORS]
        lines.append(f"| {method} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", default="chain")
    parser.add_argument("--datasets", type=int, default=400)
    parser.add_argument("--episodes", type=int, default=300)
    parser.add_argument("--gamma", type=float, default=0.95)
    parser.add_argument("--shift", type=float, default=0.5)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    result = measure(args.env, args.datasets, args.episodes, args.gamma, args.shift)
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{args.env}, {args.datasets} datasets x {args.episodes} episodes, gamma {args.gamma}, "
          f"shift {args.shift}, truth {result['truth']:.4f}; 95% intervals; a method keeps its "
          f"promise at coverage >= {result['tolerance']:.1%} (3 binomial sd below 95%)\n")
    print(markdown(result))


if __name__ == "__main__":
    main()
