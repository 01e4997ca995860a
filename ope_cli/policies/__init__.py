"""Evaluation policies: ``.npz`` checkpoints, ``module:name`` entry points, logged targets.

Every policy becomes a per-step function ``log_prob(params, observation, action) -> []``
written for one step; the kernel vmaps it over steps, episodes and (for stacked
checkpoints) policies. Checkpoints of the same kind and shapes share one function
and are stacked along a leading policy axis.

By job: ``base`` (the Policy record), ``functions`` (per-step log-probabilities, pure JAX),
``checkpoints`` (``.npz`` kinds), ``entry_points`` (user code), ``checks`` (a policy against
the data); here, a ``--policy`` value to its policies. Every name is importable from here.
"""

from __future__ import annotations

import glob
from collections.abc import Sequence
from pathlib import Path

import ope_cli.sources.remote as remote
from ope_cli.errors import PolicyError
from ope_cli.policies.base import LOGGED, LogProbFn, Policy, SampleFn, logged_policy
from ope_cli.policies.checkpoints import (
    check_size,
    checked_array,
    checkpoint_policy,
    load_checkpoint,
    mlp_layers,
    read_archive,
)
from ope_cli.policies.checks import check_against_schema, chunk_checks
from ope_cli.policies.entry_points import import_entry_point, load_entry_point
from ope_cli.policies.functions import (
    _mlp_log_prob as _mlp_log_prob,  # one function per activation (tests/test_traced.py)
)
from ope_cli.policies.functions import (
    action_log_probs,
    linear_gaussian_log_prob,
    linear_gaussian_sample,
    linear_softmax_log_prob,
    mlp_forward,
    tabular_log_prob,
)


def load_policy(spec: str) -> Policy:
    """A policy from a command-line ``--policy`` value."""
    if spec.endswith(".npz") or remote.is_uri(spec) or Path(spec).is_file():
        return load_checkpoint(spec)
    return load_entry_point(spec)


def load_policies(specs: Sequence[str]) -> list[Policy]:
    """The policies of every ``--policy`` value, in order; a glob such as 'ckpts/*.npz'
    (quoted, so the shell leaves it alone) stands for its matching files, sorted."""
    policies = []
    for spec in specs:
        if glob.has_magic(spec) and remote.is_uri(spec):
            policies.extend(load_policy(m) for m in remote.glob_files(spec, PolicyError))
        elif glob.has_magic(spec) and not Path(spec).exists():
            matches = sorted(glob.glob(spec))
            if not matches:
                raise PolicyError(f"{spec}: no checkpoint matches this pattern")
            policies.extend(load_policy(match) for match in matches)
        else:
            policies.append(load_policy(spec))
    return policies


__all__ = [
    "LOGGED",
    "LogProbFn",
    "Policy",
    "SampleFn",
    "action_log_probs",
    "check_against_schema",
    "check_size",
    "checked_array",
    "checkpoint_policy",
    "chunk_checks",
    "import_entry_point",
    "linear_gaussian_log_prob",
    "linear_gaussian_sample",
    "linear_softmax_log_prob",
    "load_checkpoint",
    "load_entry_point",
    "load_policies",
    "load_policy",
    "logged_policy",
    "mlp_forward",
    "mlp_layers",
    "read_archive",
    "tabular_log_prob",
]
