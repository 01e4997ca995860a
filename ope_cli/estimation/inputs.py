"""What an evaluation reads and evaluates with, and the models it fits first.

``open_inputs(config)`` opens the data (``episode_stream.open_episodes``) and loads the
policies, the behavior policy and the Q sources, checked against the data's columns;
``fit_models`` returns the inputs with what ``--behavior estimate`` and ``--q fit`` fit,
each a pass over the episodes as the evaluation validates them. ``pipeline.stream`` pads
the result: fit, then evaluate with what was fitted.
"""

from __future__ import annotations

import dataclasses
import glob
from collections.abc import Callable, Iterator

from ope_cli.choosing.selection import check_truth_gamma
from ope_cli.config import EvaluationConfig, check_v_samples_apply
from ope_cli.data.episode_stream import DataConfig, EpisodeStream, open_episodes
from ope_cli.data.episodes import EpisodeChunk
from ope_cli.data.sources.remote import is_uri
from ope_cli.data.validate import Check
from ope_cli.estimation.distributed import share_files
from ope_cli.estimation.run_plan import (
    GAMMA_SOURCES,
    IntervalPlan,
    check_seed_applies,
    plan_intervals,
    reported_estimators,
)
from ope_cli.models.behavior import (
    BehaviorSource,
    check_behavior_actions,
    column_source,
    is_estimate,
    load_behavior,
    policy_source,
)
from ope_cli.models.policies import (
    Policy,
    check_against_schema,
    chunk_checks,
    is_checkpoint,
    load_policies,
    logged_policy,
    split_name,
)
from ope_cli.models.qfunctions import (
    COLUMNS,
    FIT,
    QFunction,
    check_q,
    check_q_gamma,
    check_q_policies,
    fit_model_of,
    load_qs,
    q_for_another_gamma,
    q_of_another_policy,
)
from ope_cli.models.qfunctions import chunk_checks as q_chunk_checks

Collectives = tuple[Callable, Callable]  # a multi-process run's (gather, check_all)


@dataclasses.dataclass(frozen=True)
class EvaluationInputs:
    """What an evaluation pass reads and evaluates with, resolved before it reads a row.

    Attributes:
      config: the run's settings, the discount resolved (``plan.gamma_source`` says whence).
      episodes: this process's share of the episodes (its files).
      files: the count of files of all processes.
      policies: the evaluation policies, in order.
      plan: the interval method and the bounds checked with the data.
      behavior: the ``--behavior`` policy (or the fitted one); None: the data's column.
      behavior_source: where pi_b comes from, for the report; None: to be estimated.
      qs: one Q function per policy (a ``fit`` one until fitted), or None without a Q source.
      passes: the run's passes over the data, as ``fit_models`` found them (``data_passes``;
        empty: the evaluation alone).
    """

    config: EvaluationConfig
    episodes: EpisodeStream
    files: int
    policies: list[Policy]
    plan: IntervalPlan
    behavior: Policy | None = None
    behavior_source: BehaviorSource | None = None
    qs: list[QFunction] | None = None
    passes: tuple[str, ...] = ()

    def chunk_checks(self, chunk: EpisodeChunk) -> Iterator[Check]:
        """Action and state ranges and bounds, validated with the data."""
        for policy in self.policies:
            yield from chunk_checks(policy, chunk)
        for q, policy in zip(self.qs or (), self.policies, strict=False):
            yield from q_chunk_checks(q, policy, chunk)
        yield from self.plan.chunk_checks(chunk)

    def checked_episodes(self) -> EpisodeStream:
        """The episodes as the evaluation validates them (with ``chunk_checks``)."""
        return self.episodes.with_checks(self.chunk_checks)


def open_inputs(config: EvaluationConfig, process: tuple[int, int] = (0, 1)) -> EvaluationInputs:
    """Opens the data of ``config`` and loads its policies, behavior policy and Q sources,
    checked against the data's columns; no row is read but, with several processes, the
    data's first vectors (the widths every share judges vectors by). ``process`` = (process
    id, number of processes): this process's share of the files. Raises OpeError
    subclasses."""
    policies: list[Policy] = load_policies(config.policies) or [logged_policy()]
    episodes = open_episodes(data_config(config))
    schema = episodes.schema
    behavior = None
    if config.behavior.policy is not None and not is_estimate(config.behavior.policy):
        behavior = load_behavior(config.behavior.policy, schema)
    for policy in policies:
        if policy.kind != "logged":
            check_against_schema(policy, schema)
    if behavior is not None:
        check_behavior_actions(behavior, policies)
    columns = config.columns
    check_v_samples_apply(config.q.v_samples, schema.action_kind)
    critic = None if columns.q_value is None else (columns.q_value, columns.v_value)
    qs = load_qs(config.q.sources, policies, critic)
    for q, policy in zip(qs or [], policies if qs else [], strict=True):
        check_q(q, policy, schema)
    # dm is the value of the Q it is given; dr and wdr stay unbiased with any Q (a control
    # variate), so only a run that reports dm needs the Q of its policy and discount
    dm_reported = "dm" in reported_estimators(config)
    if dm_reported:
        check_q_policies(qs, policies)
    plan = plan_intervals(config, episodes.data.declared_bounds())
    q_models = [  # the --q sources' (critic columns draw nothing)
        fit_model_of(q.name, schema.observation_kind, schema.action_kind) if q.kind == FIT else None
        for q in qs or ()
        if q.kind != COLUMNS
    ]
    check_seed_applies(config, plan.method, q_models, schema.action_kind)
    config = dataclasses.replace(config, gamma=plan.gamma)  # --gamma, declared, or 1.0
    if dm_reported:
        check_q_gamma(qs, plan.gamma, GAMMA_SOURCES[plan.gamma_source])
    elif qs:  # dr and wdr alone: accepted, and said (every format warns: q_mismatch)
        qs = [_with_mismatch(q, p, policies, plan) for q, p in zip(qs, policies, strict=True)]
    if config.choosing.truth is not None:
        check_truth_gamma(config.choosing.truth, plan.gamma, plan.gamma_source)
    files = len(episodes.data.files)
    process_id, num_processes = process
    if num_processes > 1:
        episodes = episodes.restrict(share_files(episodes.data.files, process_id, num_processes))
    source = (
        policy_source(behavior, schema.action_kind == "discrete")
        if behavior is not None
        else column_source(schema)
        if schema.behavior_logged
        else None  # estimated: set by the fit
    )
    return EvaluationInputs(config, episodes, files, policies, plan, behavior, source, qs)


def _with_mismatch(q, policy: Policy, policies, plan: IntervalPlan):
    """``q`` with why it is not ``policy``'s Q for the run's discount, if it is not."""
    reasons = (
        q_of_another_policy(q, policy, policies),
        q_for_another_gamma(q, plan.gamma, GAMMA_SOURCES[plan.gamma_source]),
    )
    found = [reason for reason in reasons if reason is not None]
    return dataclasses.replace(q, mismatch=found[0]) if found else q


def check_before_jax(config: EvaluationConfig) -> None:
    """``open_inputs``'s first checks, where they need no JAX: the ``--policy``
    checkpoints, then the local data's columns and the checkpoints against them (in that
    order, as ``open_inputs`` checks them), so that such a user error ends before JAX
    starts (about a second). Where a policy is an entry point (its module may build JAX
    arrays on import, after 64-bit types are on) or anything is remote (not read twice),
    nothing is checked here; ``open_inputs`` checks it all."""
    specs = [split_name(spec)[1] for spec in config.policies]
    local = not any(is_uri(path) for path in [config.data, *specs])
    # a glob stands for the files it matches, each a checkpoint (load_policies: expand)
    if not local or not all(is_checkpoint(path) or glob.has_magic(path) for path in specs):
        return
    policies = load_policies(config.policies)
    schema = open_episodes(data_config(config)).schema
    behavior = config.behavior.policy
    if behavior is None or is_estimate(behavior):  # else a --behavior CKPT is loaded first
        for policy in policies:
            check_against_schema(policy, schema)


def data_config(config: EvaluationConfig) -> DataConfig:
    """How ``ope evaluate`` reads its data: the target probabilities from the data without
    ``--policy``, the behavior probabilities without ``--behavior``."""
    return DataConfig(
        config.data,
        config.columns,
        config.batching.read_rows,
        config.on_invalid,
        target_column="unread" if config.policies else "required",
        behavior_column="required" if config.behavior.policy is None else "unread",
    )


def fit_models(
    inputs: EvaluationInputs,
    collectives: Collectives | None = None,
    on_status: Callable[[str], None] | None = None,
) -> EvaluationInputs:
    """``inputs`` with the models the run fits before its evaluation pass: the behavior
    policy of ``--behavior estimate`` (a pass over the data), then each policy's Q-hat of
    ``--q fit`` (a pass per policy); ``collectives``: a multi-process run's (gather,
    check_all), else None. The same inputs when there is nothing to fit."""
    passes = data_passes(inputs)  # before the fits, which change what it looks at
    if len(passes) == 1:
        return inputs
    inputs = dataclasses.replace(inputs, passes=passes)
    say = on_status or (lambda text: None)
    if FIT_BEHAVIOR in passes:
        say(pass_status(passes, FIT_BEHAVIOR))
        inputs = with_estimated_behavior(inputs, collectives)
    if FIT_Q in passes:
        say(pass_status(passes, FIT_Q))
        inputs = with_fitted_qs(inputs, collectives)
    say(pass_status(passes, EVALUATE))
    return inputs


# the passes of a run over the data, as its progress names them
FIT_BEHAVIOR, FIT_Q, EVALUATE = "fitting the behavior policy", "fitting Q-hat", "evaluating"
COMPARE_LOGGED = "evaluating again with the logged propensities, to compare"


def data_passes(inputs: EvaluationInputs) -> tuple[str, ...]:
    """The run's passes over the data, in order: the fits (``fit_models``), the evaluation,
    and, for a behavior policy estimated on data that logs propensities too, the evaluation
    under the logged column (``pipeline._reported_behavior``)."""
    from ope_cli.models.behavior_models.fitting import logged_propensity_column

    estimating = is_estimate(inputs.config.behavior.policy)
    fitting_q = any(q.kind == FIT for q in inputs.qs or ())
    comparing = estimating and logged_propensity_column(inputs.episodes) is not None
    return (
        *((FIT_BEHAVIOR,) if estimating else ()),
        *((FIT_Q,) if fitting_q else ()),
        EVALUATE,
        *((COMPARE_LOGGED,) if comparing else ()),
    )


def pass_status(passes: tuple[str, ...], name: str) -> str:
    """What the progress says as the pass ``name`` of ``passes`` starts."""
    return f"{name} (pass {passes.index(name) + 1} of {len(passes)})" + (
        "" if name == EVALUATE else " ..."
    )


def with_estimated_behavior(
    inputs: EvaluationInputs, collectives: Collectives | None = None
) -> EvaluationInputs:
    """``inputs`` with the behavior policy of ``--behavior estimate[:MODEL]`` fitted on
    the episodes as the evaluation validates them."""
    from ope_cli.models.behavior_models.base import check_floor_applies, parse_model
    from ope_cli.models.behavior_models.fitting import (
        choose_model,
        fit_behavior,
        logged_propensity_column,
    )

    config, episodes = inputs.config, inputs.episodes
    option = f"--behavior {config.behavior.policy}"
    model = choose_model(parse_model(config.behavior.policy), episodes.schema, option)
    check_floor_applies(model, config.behavior.min_propensity)
    estimated = fit_behavior(
        inputs.checked_episodes(),
        model,
        folds=config.behavior.cross_fit,
        min_propensity=config.behavior.min_propensity,
        collectives=collectives,
    )
    source = estimated.source(logged_propensity_column(episodes))
    return dataclasses.replace(inputs, behavior=estimated.policy, behavior_source=source)


def with_fitted_qs(
    inputs: EvaluationInputs, collectives: Collectives | None = None
) -> EvaluationInputs:
    """``inputs`` with every ``--q fit`` Q source fitted, policy by policy (each pass
    validated with the Q functions fitted before it)."""
    from ope_cli.models.fitted_q import fit_q_function

    config, qs = inputs.config, list(inputs.qs or ())
    for index, (q, policy) in enumerate(zip(qs, inputs.policies, strict=True)):
        if q.kind != FIT:
            continue
        so_far = dataclasses.replace(inputs, qs=list(qs))
        qs[index] = fit_q_function(
            so_far.checked_episodes(),
            policy,
            q.name,
            gamma=config.gamma,
            folds=config.q.cross_fit,
            seed=config.intervals.seed,
            v_samples=config.q.v_samples,
            collectives=collectives,
        )
    return dataclasses.replace(inputs, qs=qs)
