"""Synthetic logged datasets whose evaluation policies' true values are known (``ope generate``).

Each environment is fixed: its dynamics and behavior policy come from a constant NumPy seed.
``shift`` moves the evaluation policies away from the behavior policy along an improving
direction; ``seed`` only chooses which episodes are logged. So the ground truth depends on
``(env, gamma, horizon, shift)`` and not on ``seed``: many seeds give independent datasets with
one truth, which is what a coverage study of confidence intervals needs.

Rollouts are pure JAX, in float64: every episode has its own key ``fold_in(key(seed), id)``,
draws its random numbers a chunk of time steps at a time, and runs under ``jax.vmap`` over
episodes and ``jax.lax.scan`` over time. Between chunks, finished episodes leave the batch, so
skewed lengths cost their real steps; the last few episodes alive run in a few lanes, long
scans at a time. An episode's data depends only on ``seed`` and its id, not on ``episodes``
or ``files`` (a reward computed with ``exp``, as control's, to rounding: the few lanes'
compiled scan may round it in another last bit).

Environments (one module each under ``ope_cli/envs/``): ``bandit``, ``chain``, ``control``,
``gaussian``.

Evaluation policies: by default ``policies/eval_0.npz`` at ``shift``, ``eval_1.npz`` at
``shift / 2`` and ``eval_2.npz`` at ``-shift`` (a worse policy), so estimators can be checked on
ranking checkpoints as well as on values. ``policies=K`` writes K of them instead, for selection
studies: ``eval_k`` at ``policy_scales(K)[k] * shift``, from ``shift`` (the best) down to
``-shift``, a third of them worse than the behavior policy (``ope_cli.envs.base.policy_scales``;
K = 3 is the default's three). Names are zero-padded to one width from K = 11 on
(``eval_00`` ... ``eval_10``), so that they sort in order. The directions are scaled per
environment so that the default ``shift = 0.5`` gives trajectory weights with an effective
sample size of roughly 10-50% of the episodes; larger shifts make importance sampling harder.

Exact action values: where the environment's states are tabular (``chain``) and episodes are
not capped by a horizon, ``q/eval_<k>.npz`` (and ``q/behavior.npz``) hold each policy's
exact Q as a ``tabular_q`` checkpoint (``q`` [n_states, n_actions] float64, the ``gamma`` it
is exact for and its policy's ``policy_fingerprint``: ``ope evaluate`` refuses it for another
gamma or paired with another policy), the Q source of doubly robust
estimators with a known answer; truth.json's entries say where (``"q"``), or
``"q": null`` where there is no exact tabular Q (other environments; a finite horizon, under
which the value of a capped episode depends on time). They live outside ``policies/`` so that
``--policy 'policies/*.npz'`` still matches policies only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import math
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from ope_cli import interrupts
from ope_cli.config import python_numbers
from ope_cli.envs.base import DEFAULT_POLICIES, MAX_POLICIES, Environment
from ope_cli.envs.registry import ENVIRONMENTS as REGISTRY
from ope_cli.envs.writer import write_logs, write_npz
from ope_cli.errors import UsageError
from ope_cli.models.policies import load_checkpoint
from ope_cli.models.qfunctions import provenance_arrays
from ope_cli.outputs import refuse_existing

ENVIRONMENTS: tuple[str, ...] = tuple(REGISTRY)
# what a run writes into OUT (an earlier run's are replaced only with overwrite)
OUTPUTS = ("logs.parquet", "logs", "behavior.npz", "policies", "q", "truth.json")
STAGING_PREFIX = ".ope-generate-"  # the hidden folder in OUT that a run writes into first
MAX_EPISODES = 2**32  # ids 0 .. 2^32 - 1: jax.random.fold_in keeps an id's low 32 bits
# an episode of a million steps serves the memory studies; past ten times that, the exact
# values' loops ran for hours (gaussian) or overflowed (chain, control: exit 1)
MAX_HORIZON = 10_000_000


@dataclasses.dataclass(frozen=True)
class GenerateOptions:
    """What ``generate`` writes besides the environment and the folder (``ope generate``'s
    options, one field each)."""

    episodes: int = 1000
    seed: int = 0
    gamma: float = 1.0
    horizon: int | None = None
    shift: float = 0.5
    files: int = 1
    policies: int = DEFAULT_POLICIES
    overwrite: bool = False


def _with_keywords(options: GenerateOptions, keywords: dict) -> GenerateOptions:
    """``options`` with ``keywords`` (its fields) replaced, NumPy numbers as Python ones (an
    np.int64 --episodes failed in writing truth.json, after the logs); an unknown keyword,
    or options that are no GenerateOptions (``generate(env, out, 100)``), a UsageError."""
    if not isinstance(options, GenerateOptions):
        raise UsageError(
            f"options must be a GenerateOptions, got {options!r}: give them as keywords "
            "(episodes=..., seed=...)"
        )
    fields = {field.name: field for field in dataclasses.fields(GenerateOptions)}
    known = list(fields)
    unknown = sorted(set(keywords) - set(known))
    if unknown:
        raise UsageError(f"unknown option {unknown[0]!r}; the options are {', '.join(known)}")
    # None for an option that takes none is its default, as evaluate's keywords read it
    # (seed=None was refused: "--seed must be an integer")
    keywords = {
        name: value
        for name, value in keywords.items()
        if value is not None or "None" in str(fields[name].type)
    }
    changed = dataclasses.replace(options, **keywords)
    if not isinstance(changed.overwrite, bool):  # overwrite="no" was true
        raise UsageError(f"overwrite must be True or False, got {changed.overwrite!r}")
    return dataclasses.replace(
        changed, **{name: python_numbers(getattr(changed, name)) for name in known}
    )


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # NumPy's: converted


def check_seed_and_episodes(seed: Any, episodes: int) -> None:
    """A UsageError for a --seed outside 0 .. 2^63 - 1 or more than MAX_EPISODES
    --episodes (generate's and bench's)."""
    if episodes > MAX_EPISODES:
        raise UsageError(
            f"--episodes must be at most {MAX_EPISODES:,} (each episode's key folds in its "
            f"32-bit id: episode 2^32 would repeat episode 0), got {episodes:,}"
        )
    if not _is_int(seed) or not 0 <= seed < 2**63:
        raise UsageError(f"--seed must be an integer from 0 to 2^63 - 1, got {seed!r}")


def _check_options(env: str, options: GenerateOptions) -> None:
    episodes, seed, gamma, horizon = options.episodes, options.seed, options.gamma, options.horizon
    shift, files, policies = options.shift, options.files, options.policies

    if not isinstance(env, str) or env not in REGISTRY:
        raise UsageError(f"unknown environment {env!r}; choose one of {', '.join(ENVIRONMENTS)}")
    if not _is_int(episodes) or episodes < 1:
        raise UsageError(f"--episodes must be a positive integer, got {episodes!r}")
    check_seed_and_episodes(seed, episodes)
    number = isinstance(gamma, int | float) and not isinstance(gamma, bool)
    if not (number and 0.0 <= gamma <= 1.0):
        kind = "in" if number else "a number in"  # "0.9" is no number out of range
        raise UsageError(f"--gamma must be {kind} [0, 1], got {gamma!r}")
    if horizon is not None and (not _is_int(horizon) or not 1 <= horizon <= MAX_HORIZON):
        raise UsageError(
            f"--horizon must be a positive integer of at most {MAX_HORIZON:,} steps, "
            f"got {horizon!r}"
        )
    if env == "bandit" and horizon not in (None, 1):
        raise UsageError(f"bandit episodes have one step, so --horizon must be 1, got {horizon}")
    if not isinstance(shift, int | float) or isinstance(shift, bool) or not math.isfinite(shift):
        raise UsageError(f"--shift must be a finite number, got {shift!r}")
    if not _is_int(files) or not 1 <= files <= episodes:
        raise UsageError(
            f"--files must be an integer from 1 to the number of episodes ({episodes}), "
            f"got {files!r}"
        )
    if not _is_int(policies) or not 1 <= policies <= MAX_POLICIES:
        raise UsageError(
            f"--policies must be an integer from 1 to {MAX_POLICIES}, got {policies!r}"
        )


def _check_finite(env: str, shift: float, truths: list, q_values: list) -> None:
    """UsageError where an exact value is not a finite float64: a --shift so large that the
    policies' values overflow (gaussian at --shift 2500 wrote a NaN into truth.json, exit 0)."""
    values = [value for value, *_ in truths] + [q for q in q_values if q is not None]
    if not all(np.all(np.isfinite(value)) for value in values):
        raise UsageError(
            f"--shift {shift:g} moves {env}'s policies too far: their exact values leave "
            "float64's range; give a --shift nearer 0"
        )


def _q_values(
    environment: Environment,
    env_arrays: dict,
    policies: list[dict],
    gamma: float,
    horizon: int | None,
) -> list[np.ndarray | None]:
    """Each policy's exact Q [n_states, n_actions], or None where there is none."""
    if environment.q_truth is None:
        return [None] * len(policies)
    return environment.q_truth(env_arrays, policies, gamma, horizon)


def policy_paths(count: int) -> list[str]:
    """policies/eval_<k>.npz for k < count, k zero-padded to the width of count - 1 (so that
    names sort in order: eval_0 ... eval_9, but eval_00 ... eval_10 for 11)."""
    width = len(str(count - 1))
    return [f"policies/eval_{k:0{width}d}.npz" for k in range(count)]


def _write_q(
    out: Path, paths: list[str], q_values: list[np.ndarray | None], gamma: float
) -> list[str | None]:
    """Writes q/<policy name>.npz (``tabular_q``, with the ``gamma`` it is exact for) per
    exact Q; returns the relative paths (None where no Q)."""
    q_paths: list[str | None] = []
    for path, q in zip(paths, q_values, strict=True):
        q_path = f"q/{Path(path).name}"
        if q is None:
            q_paths.append(None)
            continue
        (out / "q").mkdir(exist_ok=True)
        policy = load_checkpoint(str(out / path)).fingerprint()  # the policy as read back
        write_npz(
            out / q_path, "tabular_q", {"q": q, **provenance_arrays(gamma, policy, exact=True)}
        )
        q_paths.append(q_path)
    return q_paths


def _write_policies(
    out: Path, environment: Environment, policy_arrays: list, policies: int, known: tuple
) -> list[dict]:
    """Writes the behavior and evaluation policies (and their exact Q functions) into
    ``out``; returns truth.json's entry of each, the behavior policy's first. ``known``:
    (each policy's (value, stderr, method), each one's exact Q or None, the discount)."""
    truths, q_values, gamma = known
    paths = ["behavior.npz", *policy_paths(policies)]
    for path, policy in zip(paths, policy_arrays, strict=True):
        write_npz(out / path, environment.kind, policy)
    q_paths = _write_q(out, paths, q_values, gamma)
    return [
        {
            "policy": path,
            "value": value,
            "stderr": stderr,
            "method": method,
            "q": q_path,
            "sha256": hashlib.sha256((out / path).read_bytes()).hexdigest(),
        }
        for path, (value, stderr, method), q_path in zip(paths, truths, q_paths, strict=True)
    ]


def generate(
    env: str, out_dir: str | Path, options: GenerateOptions | None = None, **keywords: Any
) -> dict:
    """Writes a synthetic dataset of `env` and its policies' true values; returns truth.json's dict.

    Files: OUT/logs.parquet (OUT/logs/part-00000.parquet ... when files > 1, whole episodes
    per file), OUT/behavior.npz, OUT/policies/eval_<k>.npz for the `policies` evaluation
    policies (1 to MAX_POLICIES; default eval_0, eval_1, eval_2), OUT/truth.json and, where
    the environment has an exact tabular Q (chain without a horizon), OUT/q/behavior.npz and
    OUT/q/eval_<k>.npz (``tabular_q``; truth.json's ``"q"`` entries, else null). `horizon`
    caps episode lengths (default: bandit 1, chain none, control 1000, gaussian 5). The logs
    declare ``gamma`` (and the reward range and horizon) in their schema metadata. Raises
    UsageError for an unknown env, option or option value, or when an output of an earlier
    run exists (``OUTPUTS``) and not ``overwrite``, or an output cannot be written (it was
    Python's OSError through the API). The options are ``options`` (a GenerateOptions,
    default: its defaults) with ``keywords`` (its fields) replaced.
    """
    options = _with_keywords(GenerateOptions() if options is None else options, keywords)
    _check_options(env, options)
    options = dataclasses.replace(options, gamma=options.gamma + 0.0)  # -0.0 printed "-0"
    if not isinstance(out_dir, str | os.PathLike) or not os.fspath(out_dir):
        # generate("chain", None) was a TypeError; "" wrote into the working folder
        raise UsageError(f"the output folder must be a path, got {out_dir!r}")
    refuse_existing((Path(out_dir) / name for name in OUTPUTS), options.overwrite)
    try:
        return _generate_in_place(env, Path(out_dir), options)
    except OSError as error:  # an output path that cannot be written: say which, no traceback
        where = _public(os.fsdecode(error.filename)) if error.filename else out_dir
        raise UsageError(f"{where}: cannot write the output ({error.strerror or error})") from None


def _generate_in_place(env: str, out: Path, options: GenerateOptions) -> dict:
    """``_generate`` into a hidden folder in ``out`` whose files then replace an earlier
    run's (``_commit``). Interrupted or failed, it leaves an earlier run's outputs as they
    were and no new folder: an interrupted --overwrite left some new part files beside the
    old truth.json, which ``evaluate --truth`` then took without a word, and an
    interrupted first run left folders that refused the same command again."""
    created = not out.exists()
    out.mkdir(parents=True, exist_ok=True)
    _remove_abandoned(out)
    staging = Path(tempfile.mkdtemp(prefix=f"{STAGING_PREFIX}{_owner()}@", dir=out))
    try:
        truth = _generate(env, staging, options)
        _commit(staging, out)
        return truth
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if created:  # a failed run's own folder, empty again
            with contextlib.suppress(OSError):
                out.rmdir()


def _owner() -> str:
    """``PID@HOST`` of this process: which run a hidden folder is (OUT may be on storage
    that other machines write too)."""
    return f"{os.getpid()}@{socket.gethostname()}"


def _remove_abandoned(out: Path) -> None:
    """Removes the hidden folders in ``out`` of this machine's runs whose process is gone
    (killed outright, or by a signal that came while JAX imported a module, where there is
    no cleaning up): their ``PID@HOST@`` is in the name. Another machine's are left alone:
    its processes cannot be seen from here."""
    host = socket.gethostname()
    for folder in out.glob(f"{STAGING_PREFIX}*"):
        pid, _, rest = folder.name[len(STAGING_PREFIX) :].partition("@")
        if rest.partition("@")[0] != host or not pid.isascii() or not pid.isdigit():
            continue
        if not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (OSError, OverflowError):  # another user's (alive), or no pid at all
        return True
    return True


def earlier_outputs(out: Path) -> list[Path]:
    """The files of an earlier run in ``out`` that a new run replaces (a user's own files
    in its folders stay)."""
    found = [out / "logs.parquet", out / "behavior.npz", out / "truth.json"]
    found += [*(out / "logs").glob("part-*.parquet"), out / "q" / "behavior.npz"]
    found += [*(out / "policies").glob("eval_*.npz"), *(out / "q").glob("eval_*.npz")]
    return [path for path in found if path.is_file() or path.is_symlink()]


def _commit(staging: Path, out: Path) -> None:
    """Moves the files written in ``staging`` to their places in ``out`` and removes an
    earlier run's files that none replaced (``earlier_outputs``), with SIGINT and SIGTERM
    held until it is done (``interrupts.held``). An earlier truth.json goes first and the
    new one comes last: a commit that fails half way (a full disk) leaves no truth.json
    beside files of two runs."""
    with interrupts.held():
        new = [path for path in sorted(staging.rglob("*")) if not path.is_dir()]
        placed = {out / path.relative_to(staging) for path in new}
        _check_places(placed)
        (out / "truth.json").unlink(missing_ok=True)
        truth = staging / "truth.json"
        for path in new:
            if path != truth:
                _place(path, out / path.relative_to(staging))
        for stale in earlier_outputs(out):
            if stale not in placed:
                stale.unlink()
        for folder in (out / "logs", out / "q"):  # emptied: an earlier run's, now refused
            with contextlib.suppress(OSError):
                folder.rmdir()
        _place(truth, out / "truth.json")


def _check_places(targets: set[Path]) -> None:
    """The OSError a move would meet half way, raised before anything moves: a file where a
    folder goes (OUT/q a file), or a folder where a file goes (OUT/logs.parquet a folder).
    Met half way, the earlier run's truth.json and some of its files were gone already."""
    for target in sorted(targets):
        if os.path.lexists(target.parent) and not target.parent.is_dir():  # a dangling link too
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(target.parent))
        if target.is_dir():
            raise IsADirectoryError(errno.EISDIR, os.strerror(errno.EISDIR), str(target))


def _place(path: Path, target: Path) -> None:
    """Moves the file ``path`` to ``target`` (a file's path, replaced: a folder there is an
    error), copying it onto another file system (a symlinked folder's)."""
    target.parent.mkdir(exist_ok=True)
    try:
        os.replace(path, target)
    except OSError as error:
        if error.errno != errno.EXDEV:
            raise
        shutil.copyfile(path, target)
        path.unlink()


def _public(path: str) -> str:
    """``path`` with a run's hidden folder taken out: where the file was going."""
    sep = re.escape(os.sep)
    return re.sub(rf"{sep}{re.escape(STAGING_PREFIX)}[^{sep}]+", "", path)


def _generate(env: str, out: Path, options: GenerateOptions) -> dict:
    """``generate``'s writing, its options checked."""
    episodes, seed, horizon, files, policies = (
        options.episodes,
        options.seed,
        options.horizon,
        options.files,
        options.policies,
    )
    environment = REGISTRY[env]
    horizon = horizon if horizon is not None else environment.default_horizon
    gamma, shift = float(options.gamma), float(options.shift)
    env_arrays, policy_arrays = environment.build(shift, policies)
    (out / "policies").mkdir(parents=True, exist_ok=True)

    with jax.enable_x64(True):
        truths = environment.truth(env_arrays, policy_arrays, gamma, horizon)
        q_values = _q_values(environment, env_arrays, policy_arrays, gamma, horizon)
        _check_finite(env, shift, truths, q_values)
        params = jax.tree.map(jnp.asarray, {**env_arrays, "behavior": policy_arrays[0]})
        steps, longest = write_logs(
            environment, params, jax.random.key(seed), episodes, horizon, files, out, gamma
        )

    known = (truths, q_values, gamma)
    entries = _write_policies(out, environment, policy_arrays, policies, known)
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
