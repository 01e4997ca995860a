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

import dataclasses
import glob
import re
from collections.abc import Sequence
from pathlib import Path

import ope_cli.data.sources.remote as remote
from ope_cli.errors import PolicyError, UsageError
from ope_cli.models.policies.base import (
    LOGGED,
    LogitsFn,
    LogProbFn,
    Policy,
    SampleFn,
    logged_policy,
)
from ope_cli.models.policies.checkpoints import (
    check_size,
    checked_array,
    checkpoint_policy,
    load_checkpoint,
    mlp_layers,
    read_archive,
    refuse_unread,
    text,
)
from ope_cli.models.policies.checks import (
    check_against_schema,
    check_probability_sums,
    chunk_checks,
)
from ope_cli.models.policies.entry_points import import_entry_point, load_entry_point
from ope_cli.models.policies.functions import (
    _mlp_log_prob as _mlp_log_prob,  # one function per activation (tests/test_kernel_cache.py)
)
from ope_cli.models.policies.functions import (
    action_log_probs,
    linear_gaussian_log_prob,
    linear_gaussian_sample,
    linear_softmax_log_prob,
    mlp_forward,
    tabular_log_prob,
)


def is_checkpoint(spec: str) -> bool:
    """Whether a ``--policy`` (or ``--q``) value, a single one, not a glob, names a
    checkpoint file (local or at a URI), not an entry point."""
    return spec.endswith(".npz") or remote.is_uri(spec) or Path(spec).is_file()


def load_policy(spec: str) -> Policy:
    """A policy from a command-line ``--policy`` value."""
    return load_checkpoint(spec) if is_checkpoint(spec) else load_entry_point(spec)


def load_one_policy(spec: str, option: str) -> Policy:
    """The one policy of an option that takes one (``--behavior``, fit-q's ``--policy``):
    a quoted glob matching a single checkpoint is that checkpoint (it was 'no such
    checkpoint file'); matching several is a UsageError naming the count, as the option
    given twice is (it was a PolicyError, exit 4)."""
    matches = expand(spec) if is_checkpoint(spec) or not spec else [spec]
    if len(matches) != 1:
        raise UsageError(
            f"{option} {spec}: matches {len(matches)} checkpoints, and {option} takes one"
        )
    return load_policy(matches[0])


NAMED = re.compile(r"(?P<name>[A-Za-z0-9_][A-Za-z0-9_.+-]*)=(?P<path>.+)")


def split_name(spec: str) -> tuple[str | None, str]:
    """``NAME=PATH`` -> (NAME, PATH); any other value (a path, a glob, an entry point, a
    file whose name holds '=') -> (None, spec). UsageError for a NAME that no NAME may be
    (a space, a comma, a quote...) before an existing file: "no such checkpoint file" said
    the whole value was meant as a path."""
    named = NAMED.fullmatch(spec)
    if Path(spec).exists():
        return None, spec
    if named is None:
        name, _, path = spec.partition("=")
        if name and path and Path(path).is_file():
            raise UsageError(
                f"{spec}: {name!r} cannot be a NAME of NAME=PATH (ASCII letters, digits and _.+- "
                "only, first a letter, digit or _)"
            )
        return None, spec
    return named["name"], named["path"]


def expand(spec: str, error: type[Exception] = PolicyError, what: str = "checkpoint") -> list[str]:
    """A ``--policy`` (or ``--q``) value as the values it stands for: a glob such as
    'ckpts/*.npz' (quoted, so the shell leaves it alone) for its matching files, sorted;
    a directory is refused with the glob that would name its checkpoints."""
    if not spec:  # the working directory, refused as one with the glob '/*.npz'
        raise error(f"an empty path names no {what}")
    if glob.has_magic(spec) and remote.is_uri(spec):
        return list(remote.glob_files(spec, error))
    if glob.has_magic(spec) and not Path(spec).exists():
        matches = sorted(glob.glob(spec))
        if not matches:
            raise error(f"{spec}: no {what} matches this pattern")
        return matches
    if not remote.is_uri(spec) and Path(spec).is_dir():
        pattern = f"{spec.rstrip('/')}/*.npz"
        raise error(
            f"{spec}: a directory, not a {what}; to take every checkpoint in it, pass the "
            f"quoted glob '{pattern}'"
        )
    return [spec]


def load_policies(specs: Sequence[str]) -> list[Policy]:
    """The policies of every ``--policy`` value, in order (``expand``: globs stand for
    their matching files, sorted), each labelled (``label_policies``). ``NAME=PATH``
    names the policy of PATH (one checkpoint or entry point)."""
    policies = []
    for spec in specs:
        name, path = split_name(spec)
        if name is None:
            policies.extend(load_policy(match) for match in expand(spec))
            continue
        matches = expand(path)
        if len(matches) != 1:
            raise UsageError(
                f"--policy {spec}: NAME=PATH names one policy, but {path} matches "
                f"{len(matches)}; name them one by one or leave out the name"
            )
        policy = load_policy(matches[0])
        policies.append(dataclasses.replace(policy, name=name, source=matches[0]))
    _check_names(policies)
    return label_policies(policies)


def _check_names(policies: Sequence[Policy]) -> None:
    """UsageError for a NAME of ``NAME=PATH`` that another policy also goes by: the two
    were one row name in every output (a warning of one was printed on the other's CSV
    rows, and ``--baseline NAME`` picked one of them)."""
    for policy in (p for p in policies if p.source is not None):
        others = [p for p in policies if p is not policy and p.name == policy.name]
        if others:
            other = others[0].source or others[0].name
            raise UsageError(
                f"--policy {policy.name}={policy.source}: the name {policy.name} is also "
                f"that of {other}; give each policy its own name"
            )


def _parts(name: str) -> list[str]:
    """A name's path components (an entry point, package.module:name, is one)."""
    return [part for part in name.replace("\\", "/").split("/") if part] or [name]


def suffix_labels(names: Sequence[str]) -> list[str]:
    """The shortest path suffix of each name that no other name ends with (whole
    components): ['runs/a/ckpt.npz', 'runs/b/ckpt.npz', 'x.npz'] -> ['a/ckpt.npz',
    'b/ckpt.npz', 'x.npz']. A name given twice keeps its whole self."""
    parts = [_parts(name) for name in names]
    labels = []
    for i, mine in enumerate(parts):
        others = [theirs for j, theirs in enumerate(parts) if j != i and names[j] != names[i]]
        label = names[i]
        for k in range(1, len(mine) + 1):
            if all(theirs[-k:] != mine[-k:] for theirs in others):
                label = "/".join(mine[-k:])
                break
        labels.append(label)
    return labels


def label_policies(policies: Sequence[Policy]) -> list[Policy]:
    """Each policy with its ``label``: the NAME it was given, else the shortest unambiguous
    suffix of its path among the policies (a label never equals another policy's: the same
    path given again is labelled "ckpt.npz #2", where both rows read "ckpt.npz")."""
    suffixes = iter(suffix_labels([p.name for p in policies if p.source is None]))
    taken = {p.name for p in policies if p.source is not None}
    labelled, seen = [], {}
    for policy in policies:
        label = policy.name if policy.source is not None else next(suffixes)
        if policy.source is None and label in taken:
            label = policy.name  # a suffix that is another policy's NAME: the full path
        base, copy = label, 1
        while label in seen or (copy > 1 and label in taken):  # given again (another --q):
            copy += 1  # two rows, told apart, and never as another policy's NAME
            label = f"{base} #{copy}"
        seen[label] = True
        labelled.append(dataclasses.replace(policy, label=label))
    return labelled


__all__ = [
    "LOGGED",
    "LogProbFn",
    "LogitsFn",
    "Policy",
    "SampleFn",
    "action_log_probs",
    "check_against_schema",
    "check_probability_sums",
    "check_size",
    "checked_array",
    "checkpoint_policy",
    "chunk_checks",
    "expand",
    "import_entry_point",
    "is_checkpoint",
    "label_policies",
    "linear_gaussian_log_prob",
    "linear_gaussian_sample",
    "linear_softmax_log_prob",
    "load_checkpoint",
    "load_entry_point",
    "load_policies",
    "load_one_policy",
    "load_policy",
    "logged_policy",
    "mlp_forward",
    "mlp_layers",
    "read_archive",
    "refuse_unread",
    "text",
    "split_name",
    "suffix_labels",
    "tabular_log_prob",
]
