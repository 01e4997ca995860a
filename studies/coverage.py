"""How often do `ope evaluate`'s 95% intervals contain the true value? A coverage study.

`ope generate` writes DATASETS x EPISODES episodes of one environment in one batched JAX
rollout; episode ids 0..EPISODES-1 form dataset 0, the next EPISODES dataset 1, and so on, so
the datasets are independent samples with one known truth (truth.json). Every dataset is then
evaluated at once: the logs are padded as `ope evaluate` pads them
(``ope_cli.data.buckets.pad``) into [datasets, episodes, time] arrays, the kernel's own
statistics (``ope_cli.estimation.kernel.policy_group_statistics``) are vmapped over the
datasets, and each dataset's statistics are finalised with every interval method
(``ope_cli.estimation.stats.finalize``). The README's coverage table comes from:

    python studies/coverage.py            # chain, 400 datasets of 300 episodes, gamma 0.95

It prints a Markdown table of coverage and mean width per method and estimator; ``--json``
prints the raw numbers.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import tempfile
from pathlib import Path
from types import SimpleNamespace

import numpy as np

METHODS = ("betting", "normal", "percentile", "bootstrap-t")
ESTIMATORS = ("is", "wis", "pdis", "wpdis")


def binomial_tolerance(datasets: int, confidence: float, sigmas: float = 3.0) -> float:
    """Lowest coverage consistent with ``confidence`` over ``datasets`` independent intervals:
    the promised rate minus ``sigmas`` binomial standard deviations."""
    return confidence - sigmas * math.sqrt(confidence * (1 - confidence) / datasets)


def padded_datasets(logs: Path, datasets: int, episodes: int):
    """The step-layout logs as one PaddedBatch whose fields are [datasets, episodes, T, ...]
    (T: the longest episode), padded by ``ope_cli.data.buckets.pad`` as `ope evaluate` pads.

    ``ope generate`` writes steps sorted by (episode_id, step) and ids 0..N-1, so episode i is
    row i // episodes, column i % episodes.
    """
    import pyarrow.parquet as pq

    from ope_cli.data.buckets import pad
    from ope_cli.data.episodes import EpisodeChunk
    from ope_cli.data.ids import id_keys
    from ope_cli.data.steps import Steps, map_arrays

    table = pq.read_table(
        logs, columns=["episode_id", "observation", "action", "reward", "behavior_prob"]
    )
    ids = np.arange(datasets * episodes)
    lengths = np.bincount(table.column("episode_id").to_numpy(), minlength=ids.size)
    chunk = EpisodeChunk(
        file=str(logs),
        ids=ids,
        keys=id_keys(ids),
        lengths=lengths,
        steps=Steps(
            observation=table.column("observation").to_numpy(),
            action=table.column("action").to_numpy(),
            reward=table.column("reward").to_numpy(),
            log_behavior=np.log(table.column("behavior_prob").to_numpy()),
            log_target=None,
        ),
    )
    padded = pad(chunk, int(lengths.max()), ids.size)
    return map_arrays(lambda value: value.reshape(datasets, episodes, *value.shape[1:]), padded)


DATASETS_PER_CALL = 25  # datasets vmapped in one call of the jitted statistics


def dataset_statistics(
    padded,
    policy,
    gamma: float,
    seed: int,
    replicates: int,
    betting_range,
    *,
    policies=None,
    terms: bool = False,
) -> list:
    """BatchStatistics of every dataset (a list, one per dataset): the kernel's own
    ``policy_group_statistics``, jitted and vmapped over DATASETS_PER_CALL datasets per call, for
    ``policy`` (or the stacked ``policies``: then [1, P, ...] each); with ``terms``,
    (statistics, episode terms {name: [P, episodes]}) per dataset."""
    import jax
    import jax.numpy as jnp

    from ope_cli.data.ids import RESAMPLING_GROUPS
    from ope_cli.estimation.kernel import GroupSettings, PolicyGroup, policy_group_statistics

    stacked = list(policies) if policies is not None else [policy]
    settings = GroupSettings(
        stacked[0].log_prob, RESAMPLING_GROUPS, replicates, "float64", terms=terms
    )
    params = PolicyGroup(stacked, list(range(len(stacked)))).stacked_params(np.float64)

    @jax.jit
    def per_dataset(batch):
        return policy_group_statistics(
            params,
            batch,
            jnp.asarray(gamma),
            jnp.asarray(seed, jnp.uint32),
            jnp.asarray(betting_range),
            settings,
        )

    out = []
    chunk = DATASETS_PER_CALL
    for start in range(0, padded.reward.shape[0], chunk):
        part = jax.tree.map(lambda value: value[start : start + chunk], padded)  # noqa: B023
        batched = jax.device_get(jax.vmap(per_dataset)(part))  # [d, 1, P, ...]: device, policy
        count = part.step_mask.shape[0]
        if policies is None and not terms:
            out.extend(jax.tree.map(lambda v: v[d, 0, 0], batched) for d in range(count))  # noqa: B023
        else:
            out.extend(jax.tree.map(lambda v: v[d], batched) for d in range(count))  # noqa: B023
    return out


@dataclasses.dataclass(frozen=True)
class StudyOptions:
    """The study's finer settings: the intervals' confidence, the generator's seed, bootstrap
    replicates, and which evaluation policy (``policies/eval_<policy_index>.npz``)."""

    confidence: float = 0.95
    seed: int = 0
    bootstrap_samples: int = 200
    policy_index: int = 0


def _generated(env: str, datasets: int, episodes: int, generate_options: dict) -> tuple:
    """``ope generate`` of ``datasets`` x ``episodes`` episodes of ``env`` in a temporary
    directory: (its truth, its evaluation policies loaded, the interval plan of betting
    intervals on its declared bounds, the padded datasets)."""
    from ope_cli import runtime
    from ope_cli.config import EvaluationConfig, IntervalConfig
    from ope_cli.data.sources import open_dataset
    from ope_cli.envs.generate import generate
    from ope_cli.estimation.run_plan import plan_intervals
    from ope_cli.models.policies import load_checkpoint

    runtime.enable_x64()
    with tempfile.TemporaryDirectory() as directory:
        truth = generate(env, directory, episodes=datasets * episodes, **generate_options)
        policies = [load_checkpoint(str(Path(directory) / e["policy"])) for e in truth["policies"]]
        logs = Path(directory) / "logs.parquet"
        gamma, betting = generate_options["gamma"], IntervalConfig(method="betting")
        config = EvaluationConfig(data=str(logs), gamma=gamma, intervals=betting)
        plan = plan_intervals(config, open_dataset(str(logs)).declared_bounds())
        return truth, policies, plan, padded_datasets(logs, datasets, episodes)


def measure(
    env: str = "chain",
    datasets: int = 400,
    episodes: int = 300,
    gamma: float = 0.95,
    shift: float = 0.5,
    options: StudyOptions = StudyOptions(),
) -> dict:
    """Coverage and mean width of each method's intervals for each estimator."""
    confidence, seed = options.confidence, options.seed
    bootstrap_samples, policy_index = options.bootstrap_samples, options.policy_index
    from ope_cli.estimation.estimators.reduction import betting_inputs
    from ope_cli.estimation.stats import finalize, from_batch

    generate_options = {"seed": seed, "gamma": gamma, "shift": shift}
    truth, policies, plan, padded = _generated(env, datasets, episodes, generate_options)
    entry, policy = truth["policies"][policy_index], policies[policy_index]
    max_length = padded.reward.shape[-1]
    betting = betting_inputs(plan.betting_range, plan.horizon, gamma)
    batches = dataset_statistics(padded, policy, gamma, seed, bootstrap_samples, betting)
    covered = {m: {e: 0 for e in ESTIMATORS} for m in METHODS}
    width = {m: {e: 0.0 for e in ESTIMATORS} for m in METHODS}
    for batch in batches:
        accumulator = from_batch(batch)
        # Steps past a dataset's own longest episode add nothing to WPDIS, so the longest
        # of all datasets serves every one.
        for method in METHODS:
            estimates, _ = finalize(
                accumulator, gamma, max_length, confidence, method, plan.betting_range
            )
            for name, e in estimates.items():
                if e.ci_low is not None and e.ci_low <= entry["value"] <= e.ci_high:
                    covered[method][name] += 1
                if e.ci_low is not None:
                    width[method][name] += (e.ci_high - e.ci_low) / datasets
    return {
        "env": env,
        "datasets": datasets,
        "episodes": episodes,
        "gamma": gamma,
        "shift": shift,
        "confidence": confidence,
        "policy": entry["policy"],
        "truth": entry["value"],
        "reward_range": list(plan.reward_range),
        "discounted_horizon": plan.betting_range[2],
        "tolerance": binomial_tolerance(datasets, confidence),
        "coverage": {m: {e: covered[m][e] / datasets for e in ESTIMATORS} for m in METHODS},
        "mean_width": width,
    }


def measure_paired(
    datasets: int = 200,
    episodes: int = 300,
    gamma: float = 0.95,
    options: StudyOptions = StudyOptions(),
) -> dict:
    """Coverage of the paired intervals of PDIS(eval_0) - PDIS(eval_1) (``ope evaluate
    --baseline``'s, normal and betting) against the exact difference, on ``chain``
    datasets: each dataset's two policies stacked in one kernel, their episode terms paired
    as ``ope evaluate`` pairs them (``ope_cli.choosing.paired``,
    ``ope_cli.choosing.comparison``)."""
    import jax

    from ope_cli.choosing import paired
    from ope_cli.choosing.comparison import Pairing
    from ope_cli.estimation.estimators.base import Context
    from ope_cli.estimation.estimators.reduction import betting_inputs
    from ope_cli.estimation.stats import finalize, from_batch

    generate_options = {"seed": options.seed, "gamma": gamma}
    truth, policies, plan, padded = _generated("chain", datasets, episodes, generate_options)
    entries, policies = truth["policies"][:2], policies[:2]
    exact = entries[0]["value"] - entries[1]["value"]
    context = Context(gamma, padded.reward.shape[-1])
    betting = betting_inputs(plan.betting_range, plan.horizon, gamma)
    rows = dataset_statistics(
        padded, None, gamma, options.seed, 0, betting, policies=policies, terms=True
    )
    covered = dict.fromkeys(("normal", "betting"), 0)
    width = dict.fromkeys(covered, 0.0)
    for (statistics, terms), mask in zip(rows, padded.episode_mask, strict=True):
        accumulators = [from_batch(jax.tree.map(lambda v: v[0, p], statistics)) for p in (0, 1)]  # noqa: B023
        estimates = [
            finalize(acc, gamma, context.max_length, options.confidence)[0] for acc in accumulators
        ]
        groups = [([0, 1], {name: np.asarray(v) for name, v in terms.items()})]
        sums = paired.from_terms(
            paired.rows_of(groups, 2), np.asarray(mask), np.zeros((mask.shape[0], 0)), 1
        )
        for method in covered:
            methods = dict.fromkeys(estimates[0], method)
            results = [SimpleNamespace(estimates=e, weightless=()) for e in estimates]
            pairing = Pairing(accumulators, results, sums, context, methods, plan.betting_range, 1)
            low, high, _ = pairing.interval(0, 1, "pdis", options.confidence)
            if low is not None and low <= exact <= high:
                covered[method] += 1
            if low is not None:
                width[method] += (high - low) / datasets
    return {
        "datasets": datasets,
        "episodes": episodes,
        "exact_difference": exact,
        "tolerance": binomial_tolerance(datasets, options.confidence),
        "coverage": {m: covered[m] / datasets for m in covered},
        "mean_width": width,
    }


def markdown(result: dict) -> str:
    lines = ["| method | " + " | ".join(ESTIMATORS) + " |", "| --- |" + " --- |" * len(ESTIMATORS)]
    for method in METHODS:
        cells = [
            f"{result['coverage'][method][e]:.1%} (width {result['mean_width'][method][e]:.2f})"
            for e in ESTIMATORS
        ]
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
    print(
        f"{args.env}, {args.datasets} datasets x {args.episodes} episodes, gamma {args.gamma}, "
        f"shift {args.shift}, truth {result['truth']:.4f}; 95% intervals; a method keeps its "
        f"promise at coverage >= {result['tolerance']:.1%} (3 binomial sd below 95%)\n"
    )
    print(markdown(result))


if __name__ == "__main__":
    main()
