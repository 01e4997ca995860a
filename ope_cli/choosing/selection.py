"""Choosing between policies (SPEC section 11): true values from ``--truth``, selection
metrics against them, could-be-best sets, and paired differences against a baseline.

Plain NumPy and the standard library; no JAX, no terminal. Every function is pure: it takes
values and returns values, so the kernel integration and the report can call it, and the
tests can check it on hand-computed cases.

Policy order is the order of ``--policy``. The top-k set by estimate ``S_k`` lists ties in
that order (a stable sort), but where equal estimates straddle its edge (the k-th and the
(k+1)-th largest estimates are equal) the set is not determined by the estimates: the @k
metrics are then None, with a note naming the tied policies, rather than numbers that
change with the order of ``--policy``. The estimated best of a could-be-best set is the
first policy with the largest estimate. ``precision@k`` counts ties in the true values in
the ranking's favour: a policy in ``S_k`` is a hit when its true value is at least the
k-th largest true value, so a policy tied with the k-th best counts as top-k by J.

Numbers that cannot be finite are None (JSON null), never NaN.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Mapping, Sequence
from numbers import Real
from pathlib import Path
from statistics import NormalDist

import numpy as np

import ope_cli.data.sources.remote as remote
from ope_cli.errors import UsageError
from ope_cli.estimation.estimators import get, names
from ope_cli.estimation.estimators.logspace import finite
from ope_cli.estimation.intervals import MIN_VALID_REPLICATES
from ope_cli.estimation.run_plan import GAMMA_SOURCES

BASELINE_BEHAVIOR = "behavior"  # the --baseline name of the logging policy itself
DEFAULT_TOP_K = (1, 3)

Interval = tuple[float | None, float | None]  # (low, high); None where undefined
# paired_interval(b, k, level) -> the interval of V(b) - V(k) at that level
PairedInterval = Callable[[str, str, float], Interval]


# ---------------------------------------------------------------------------- --truth FILE


def _load_truth(source: str | Path | Mapping) -> tuple[Mapping, Path | None]:
    """The truth document and the folder its relative paths start from (None: a mapping)."""
    if isinstance(source, Mapping):
        return source, None
    text = str(source)
    if not text:
        raise UsageError("--truth needs a truth.json; an empty path names none")
    local = remote.on_disk(text)
    path = None if local is None else Path(local)
    try:
        raw = remote.read_bytes(text, UsageError) if path is None else path.read_bytes()
        document = json.loads(raw.decode())
    except OSError as error:
        raise UsageError(f"--truth {text}: cannot read it ({error.strerror or error})") from None
    except UsageError as error:  # at a URI: "URI: no such file", "URI: cannot read: ..."
        raise UsageError(f"--truth {error}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise UsageError(f"--truth {text}: not valid JSON ({error})") from None
    if not isinstance(document, Mapping):
        raise UsageError(f"--truth {text}: expected a JSON object, got {type(document).__name__}")
    # a truth.json at a URI names its policies by file name (or as given), not by path
    return document, None if path is None else path.parent


def check_truth_gamma(source: str | Path | Mapping, gamma: float, gamma_source: str) -> None:
    """UsageError (one line) when ``ope generate``'s truth.json gives its values for
    another discount (its ``"gamma"``) than the run's ``gamma`` (from ``gamma_source``):
    selection metrics would compare values of two different quantities. A {policy: value}
    object says nothing of its discount and is taken as it is."""
    document, _ = _load_truth(source)
    declared = document.get("gamma") if isinstance(document.get("policies"), list) else None
    if isinstance(declared, bool) or not isinstance(declared, Real):
        return
    if not math.isclose(float(declared), gamma, rel_tol=1e-12, abs_tol=1e-15):
        name = "--truth" if isinstance(source, Mapping) else f"--truth {source}"
        # every digit (repr): 0.95 against a float32's 0.949999988 read "0.95" and "0.95"
        truth_gamma, run_gamma = (repr(float(g)).removesuffix(".0") for g in (declared, gamma))
        raise UsageError(
            f"{name} gives true values for gamma {truth_gamma}, but this run discounts "
            f"by gamma {run_gamma} ({GAMMA_SOURCES.get(gamma_source, gamma_source)}): "
            f"evaluate with --gamma {truth_gamma}, or give the truth for gamma {run_gamma}"
        )


def truth_horizon(source: str | Path | Mapping) -> tuple[bool, int | None]:
    """(whether ``ope generate``'s truth.json says its horizon, that horizon: None for
    episodes that run to their end); (False, None) for a {policy: value} object."""
    document, _ = _load_truth(source)
    if not isinstance(document.get("policies"), list) or "horizon" not in document:
        return False, None
    horizon = document["horizon"]
    return True, horizon if isinstance(horizon, int) and not isinstance(horizon, bool) else None


def check_truth_horizon(
    source: str | Path | Mapping, bound: int | None, longest: int, by_option: bool = False
) -> None:
    """UsageError (one line), once the data is read, when truth.json's values are for
    episodes cut elsewhere than the data's (a truth for horizon 5 scored estimates over
    97-step episodes without a word): an episode runs past the truth's horizon, or reached
    ``bound`` (at most how many steps an episode has: the data's declared horizon, or
    --horizon where ``by_option``; a bound, not a cut) where the truth runs further (to a
    larger horizon, or to each episode's end), since it may have been cut there."""
    said, horizon = truth_horizon(source)
    if not said:
        return
    name = "--truth" if isinstance(source, Mapping) else f"--truth {source}"
    if horizon is not None and longest > horizon:
        raise UsageError(
            f"{name} gives true values for episodes of at most {horizon} steps (its horizon), "
            f"but the data holds an episode of {longest:,} steps: give the truth for the "
            "data's horizon"
        )
    if bound is not None and longest >= bound and (horizon is None or horizon > bound):
        truth = "episodes that run to their end" if horizon is None else f"horizon {horizon}"
        given, way_out = "the data declares", f"give the truth for horizon {bound}"
        if by_option:
            given, way_out = (
                "--horizon gives",
                f"{way_out}, or a --horizon above the longest episode",
            )
        raise UsageError(
            f"{name} gives true values for {truth}, but the data holds an episode of "
            f"{longest:,} steps, the bound {given} (it may have been cut there): {way_out}"
        )


def _true_value(name: str, value: object) -> float | None:
    """A true value as a float (None for null); UsageError when it is not a finite number."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise UsageError(f"--truth: the value of {name!r} is not a finite number: {value!r}")
    return float(value)


def _truth_entries(
    document: Mapping,
) -> tuple[list[tuple[str, float | None]], list[str], float | None]:
    """([(policy name or path, value)], the names of the behavior policy, its value) from
    either format: ``ope generate``'s truth.json (``policies[].policy/value``,
    ``behavior.policy/value``) or a {policy: value} object (its ``behavior`` key, if any,
    is the behavior policy's)."""
    if isinstance(document.get("policies"), list):
        entries = []
        for entry in document["policies"]:
            if not isinstance(entry, Mapping) or not isinstance(entry.get("policy"), str):
                raise UsageError(f"--truth: a policies[] entry has no 'policy' path: {entry!r}")
            entries.append((entry["policy"], _true_value(entry["policy"], entry.get("value"))))
        behavior = document.get("behavior")
        if not isinstance(behavior, Mapping):
            return entries, [], None
        path = behavior.get("policy")
        names = [path] if isinstance(path, str) else []
        return entries, names, _true_value(BASELINE_BEHAVIOR, behavior.get("value"))
    entries = [(str(name), _true_value(str(name), v)) for name, v in document.items()]
    behavior = [v for name, v in entries if name == BASELINE_BEHAVIOR]
    entries = [(name, v) for name, v in entries if name != BASELINE_BEHAVIOR]
    return entries, [], behavior[0] if behavior else None


def same_path(entry: str, policy: str, base: Path | None = None) -> bool:
    """Whether `entry` (a truth entry, a --baseline) names `policy` by path: the same string,
    or the same file (relative entry paths start from the truth file's folder, or from the
    working folder)."""
    if entry == policy:
        return True
    local = remote.on_disk(policy)
    if local is None:  # s3://, gs://: by its name only
        return False
    target = Path(local).resolve()  # a file:// policy is its path (it matched by name only)
    starts = [Path.cwd()] if base is None else [base, Path.cwd()]
    return any((start / entry).resolve() == target for start in starts)


def _find(
    entry: str,
    policy_names: Sequence[str],
    base: Path | None,
    labels: Mapping[str, str] | None = None,
) -> list[str]:
    """The given policies that truth entry `entry` names: by path, else by a NAME of
    ``--policy NAME=PATH`` (`labels`: NAME -> its policy name), else by file name."""
    by_path = [p for p in policy_names if same_path(entry, p, base)]
    if not by_path and labels and entry in labels:
        return [labels[entry]]
    return by_path or [p for p in policy_names if Path(p).name == Path(entry).name]


def _match(
    entry: str,
    policy_names: Sequence[str],
    base: Path | None,
    labels: Mapping[str, str] | None = None,
) -> str | None:
    """The one given policy that truth entry `entry` names, or None for none (a truth.json
    of ten policies serves a run of three); UsageError for several."""
    found = _find(entry, policy_names, base, labels)
    if len(found) > 1:
        raise UsageError(f"--truth entry {entry!r} matches several policies: {', '.join(found)}")
    return found[0] if found else None


def _checkpoint_bytes(policy: str) -> bytes | None:
    """The file a --policy names, at a path or a URI (an s3:// checkpoint was not
    compared, and another dataset's truth scored it without a word); None where it names
    no file (an entry point)."""
    local = remote.on_disk(policy)
    if local is not None:
        path = Path(local)
        return path.read_bytes() if path.is_file() else None
    try:
        return remote.read_bytes(policy, UsageError)
    except UsageError:
        return None  # the policy's own loading says why it cannot be read


def _check_checkpoint(entry: Mapping, policy: str) -> None:
    """UsageError when truth.json's entry records the sha256 of its checkpoint and the
    matched --policy file is another one (a truth.json of another ``ope generate`` run,
    matched by file name, would give every policy a wrong true value without a word)."""
    digest = entry.get("sha256")
    content = _checkpoint_bytes(policy) if isinstance(digest, str) else None
    if content is None:
        return
    if hashlib.sha256(content).hexdigest() != digest:
        raise UsageError(
            f"--truth gives the value of another checkpoint than {policy} (its entry "
            f"{entry['policy']!r} records another sha256): the truth.json of another dataset?"
        )


def read_truth(
    source: str | Path | Mapping,
    policy_names: Sequence[str],
    labels: Mapping[str, str] | None = None,
) -> dict[str, float | None]:
    """Each given policy's true value from ``--truth``; None where the truth has none.

    Args:
      source: the path of ``ope generate``'s truth.json or of a JSON object {policy: value},
        or such an object already parsed. truth.json's ``policies[].policy`` paths are
        matched to `policy_names` by path (relative to the file's folder or the working
        folder), else by file name; its ``behavior.value`` (or a ``behavior`` key of a
        {policy: value} object) is the value of the baseline name ``behavior``.
      policy_names: the ``--policy`` values, in order, plus ``behavior`` when the baseline
        is the logging policy.
      labels: {NAME: its policy's name} of ``--policy NAME=PATH``: an entry that names no
        policy by path may name one by NAME (before file names).

    Returns:
      {policy: true value or None}, in the order of `policy_names`. A None value means the
      truth has no value for that policy: the caller leaves it out of the selection metrics
      and says so (``missing_truth_note``).

    Raises:
      UsageError (one line): the file cannot be read or is not a JSON object; a value is not
      a finite number; an entry names several given policies, or the same one as another
      entry; a truth.json entry's ``sha256`` is not that of the checkpoint it is matched to.
      An entry that names no given policy is a policy not evaluated in this run: ignored
      (a given policy it was meant for has no value, which the caller says).
    """
    document, base = _load_truth(source)
    entries, behavior_paths, behavior_value = _truth_entries(document)
    listed = document.get("policies")
    recorded = {e["policy"]: e for e in listed} if isinstance(listed, list) else {}
    truth: dict[str, float | None] = dict.fromkeys(policy_names)
    named_by: dict[str, str] = {}
    for entry, value in entries:
        policy = _match(entry, policy_names, base, labels)
        if policy is None:  # a policy not evaluated in this run
            continue
        if entry in recorded:
            _check_checkpoint(recorded[entry], policy)
        if policy in named_by:
            raise UsageError(f"--truth names {policy!r} twice: {named_by[policy]!r}, {entry!r}")
        named_by[policy] = entry
        truth[policy] = value
    # the behavior policy's value goes to the baseline name and, when one --policy is its
    # checkpoint (truth.json's behavior.policy), to that policy; naming no policy is fine
    unnamed = [p for p in policy_names if p not in named_by and p != BASELINE_BEHAVIOR]
    checkpoints = [p for path in behavior_paths for p in _find(path, unnamed, base)]
    behavior_names = [BASELINE_BEHAVIOR] + (checkpoints if len(checkpoints) == 1 else [])
    for policy in behavior_names:
        if policy in truth and policy not in named_by:
            truth[policy] = behavior_value
    return truth


def missing_truth_note(
    truth: Mapping[str, float | None], names: Mapping[str, str] | None = None
) -> str | None:
    """One line on the policies `read_truth` found no value for (None when there are none):
    evaluated policies are left out of the selection metrics; without the baseline
    ``behavior``'s value there is no sharpe@k. ``names``: {policy: the name the note gives
    it} (None: as keyed)."""
    missing = [key for key, value in truth.items() if value is None]  # the baseline by key
    policies = [(names or {}).get(key, key) for key in missing if key != BASELINE_BEHAVIOR]
    parts = []
    if policies:
        parts.append(
            f"--truth has no value for {', '.join(policies)}; left out of the selection metrics"
        )
    if BASELINE_BEHAVIOR in missing:
        parts.append("--truth has no value for behavior; no sharpe@k")
    return "; ".join(parts) or None


# ---------------------------------------------------------------------- selection metrics


def rmse(estimate_k: np.ndarray, true_k: np.ndarray) -> float | None:
    """sqrt(mean_k (Ĵ_k - J_k)^2). estimate_k, true_k: [K]."""
    with np.errstate(over="ignore", invalid="ignore"):
        return finite(math.sqrt(np.mean((estimate_k - true_k) ** 2)))


def nmse(estimate_k: np.ndarray, true_k: np.ndarray) -> float | None:
    """mean_k (Ĵ_k - J_k)^2 / mean_k J_k^2 (None when every J is 0). [K] each."""
    scale = float(np.mean(true_k**2))
    if scale == 0.0:
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        return finite(float(np.mean((estimate_k - true_k) ** 2)) / scale)


# Estimates closer than this share of their size are equal to float64 rounding: ties (a
# policy against its own copy, or as an entry point and as a checkpoint, differs by ~1e-15).
RESOLVED = 1e-12


def average_ranks(x_k: np.ndarray, share: float = RESOLVED) -> np.ndarray:
    """[K] ranks 1..K of x_k in increasing order; tied values share their average rank,
    ties as the ranks and the top-k sets take them: equal to float64 rounding (``above``,
    with ``share``), neighbours in order chaining into one run."""
    order = np.argsort(x_k, kind="stable")
    sorted_x = x_k[order]
    with np.errstate(invalid="ignore"):
        step = sorted_x[1:] - sorted_x[:-1]
        steps_up = step > share * np.maximum(np.abs(sorted_x[1:]), np.abs(sorted_x[:-1]))
        steps_up |= ~np.isfinite(step)  # an infinite or NaN value is its own run
    starts = np.flatnonzero(np.r_[True, steps_up])
    ends = np.r_[starts[1:], x_k.size]  # each run of equal values: [start, end)
    run_rank = (starts + ends + 1) / 2.0  # mean of the 1-based ranks start+1 .. end
    ranks = np.empty(x_k.size)
    ranks[order] = np.repeat(run_rank, ends - starts)
    return ranks


def spearman(estimate_k: np.ndarray, true_k: np.ndarray, share: float = RESOLVED) -> float | None:
    """Spearman's rank correlation of Ĵ and J: Pearson's correlation of their average ranks
    (the estimates' ties at ``share``). None for K < 2 or when either is constant (no
    ranking to correlate). [K] each."""
    if estimate_k.size < 2:
        return None
    rank_e = average_ranks(estimate_k, share) - (estimate_k.size + 1) / 2
    rank_t = average_ranks(true_k) - (true_k.size + 1) / 2
    scale = math.sqrt(float(np.sum(rank_e**2)) * float(np.sum(rank_t**2)))
    if scale == 0.0:
        return None
    return finite(float(np.sum(rank_e * rank_t)) / scale)


def top_k_set(estimate_k: np.ndarray, k: int) -> np.ndarray:
    """[k] indices of the k largest estimates; ties keep policy order (the earlier first)."""
    return np.argsort(-estimate_k, kind="stable")[:k]


def regret_at_k(estimate_k: np.ndarray, true_k: np.ndarray, k: int) -> float:
    """max J - max_{i in S_k} J_i, S_k the top-k by estimate. [K] each."""
    return float(np.max(true_k) - np.max(true_k[top_k_set(estimate_k, k)]))


def nregret_at_k(estimate_k: np.ndarray, true_k: np.ndarray, k: int) -> float | None:
    """regret@k / (max J - min J); None when every J is equal. [K] each."""
    spread = float(np.max(true_k) - np.min(true_k))
    if spread == 0.0:
        return None
    return finite(regret_at_k(estimate_k, true_k, k) / spread)


def precision_at_k(estimate_k: np.ndarray, true_k: np.ndarray, k: int) -> float:
    """|S_k ∩ top-k by J| / k. A policy of S_k is top-k by J when its J is at least the
    k-th largest J (ties in J count in the ranking's favour). [K] each."""
    kth_largest = np.sort(true_k)[::-1][k - 1]
    return float(np.sum(true_k[top_k_set(estimate_k, k)] >= kth_largest)) / k


def sharpe_at_k(
    estimate_k: np.ndarray, true_k: np.ndarray, k: int, baseline_value: float | None
) -> float | None:
    """(max_{i in S_k} J_i - J_0) / std_{i in S_k} J_i, the population std (1/k), J_0 the
    baseline's true value. None without J_0 or when the std is 0 (always for k = 1)."""
    chosen = true_k[top_k_set(estimate_k, k)]
    std = float(np.std(chosen))
    if baseline_value is None or std == 0.0:
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        return finite((float(np.max(chosen)) - baseline_value) / std)


def coverage(intervals: Sequence[Interval], true_k: np.ndarray) -> tuple[float | None, int]:
    """(share of the defined intervals [low, high] that contain J_k, how many were undefined).
    intervals: K (low, high) pairs, None where undefined; true_k: [K]. None when none is
    defined."""
    hits, undefined = [], 0
    for (low, high), truth in zip(intervals, true_k, strict=True):
        if low is None or high is None:
            undefined += 1
            continue
        hits.append(low <= truth <= high)
    return (float(np.mean(hits)) if hits else None), undefined


def check_top_k(top_k: Sequence[int], n_policies: int) -> tuple[int, ...]:
    """The distinct `top_k`, in order; UsageError when one is below 1 or above `n_policies`."""
    checked: list[int] = []
    for k in top_k:
        if isinstance(k, bool) or not isinstance(k, int | np.integer) or k < 1:
            raise UsageError(f"--top-k {k!r} must be a positive whole number")
        if k > n_policies:
            raise UsageError(f"--top-k {k} exceeds the {n_policies} policies with a true value")
        if int(k) not in checked:
            checked.append(int(k))
    return tuple(checked)


def above(a: float, b: float, share: float = RESOLVED) -> bool:
    """Whether estimate ``a`` is larger than ``b`` beyond float64 rounding: ``share`` of
    their size (an estimator's own: ``tie_share``)."""
    return a - b > share * max(abs(a), abs(b))


def tie_share(estimator: str) -> float:
    """The share of ``estimator``'s estimates' size below which they tie: its own
    ``tie_share``, else (or where it is not registered) ``RESOLVED``."""
    own = get(estimator).tie_share if estimator in names() else None
    return RESOLVED if own is None else own


def equal_to_rounding(a: float, b: float, share: float = RESOLVED) -> bool:
    """Whether estimates ``a`` and ``b`` are equal to float64 rounding (neither ``above``)."""
    return not above(a, b, share) and not above(b, a, share)


def tied_at_edge(estimate_k: np.ndarray, k: int, share: float = RESOLVED) -> np.ndarray:
    """[m] indices of the policies whose estimate equals the k-th largest (to rounding:
    ``above``), where the (k+1)-th largest equals it too (the top-k set is then not
    determined); [0] else."""
    ordered = np.sort(estimate_k)[::-1]
    if k >= ordered.size or above(ordered[k - 1], ordered[k], share):
        return np.zeros(0, np.int64)
    edge = ordered[k - 1]
    return np.flatnonzero([equal_to_rounding(edge, x, share) for x in estimate_k])


def _ranking_metrics(
    estimate_k: np.ndarray | None,
    true_k: np.ndarray,
    top_k: tuple[int, ...],
    baseline_value: float | None,
    policies: Sequence[str],
    share: float = RESOLVED,
) -> tuple[dict[str, float | None], list[str]]:
    """(rmse, nmse, spearman and the @k metrics, notes); all None when an estimate is
    undefined, the @k ones where ties straddle the top-k set's edge (``tied_at_edge``);
    the estimates tie at ``share`` of their size."""
    names = ["rmse", "nmse", "spearman"]
    at_k = ("regret", "nregret", "precision", "sharpe")
    names += [f"{m}@{k}" for k in top_k for m in at_k]
    if estimate_k is None:
        return dict.fromkeys(names), []
    metrics = {
        "rmse": rmse(estimate_k, true_k),
        "nmse": nmse(estimate_k, true_k),
        "spearman": spearman(estimate_k, true_k, share),
    }
    notes = []
    if metrics["spearman"] is None and true_k.size >= 2:  # one of the two is constant
        ranks = average_ranks(true_k)  # tied to rounding, as spearman's ranks are
        constant = "true values" if np.all(ranks == ranks[0]) else "estimates"
        notes.append(f"the {constant} are all equal: no ranking for spearman to correlate")
    for k in top_k:
        tied = tied_at_edge(estimate_k, k, share)
        if tied.size:
            metrics.update({f"{m}@{k}": None for m in at_k})
            names_tied = ", ".join(policies[i] for i in tied)
            notes.append(
                f"{names_tied} have equal estimates across the top-{k} edge: the top {k} "
                f"by estimate is not determined, so no {'/'.join(at_k)}@{k}"
            )
            continue
        metrics[f"regret@{k}"] = finite(regret_at_k(estimate_k, true_k, k))
        metrics[f"nregret@{k}"] = nregret_at_k(estimate_k, true_k, k)
        metrics[f"precision@{k}"] = precision_at_k(estimate_k, true_k, k)
        metrics[f"sharpe@{k}"] = sharpe_at_k(estimate_k, true_k, k, baseline_value)
    return metrics, notes


def selection_metrics(
    truth: Mapping[str, float | None],
    estimates: Mapping[str, float | None],
    intervals: Mapping[str, Interval] | None = None,
    *,
    baseline_value: float | None = None,
    top_k: Sequence[int] = DEFAULT_TOP_K,
    names: Mapping[str, str] | None = None,
    share: float = RESOLVED,
) -> tuple[dict[str, float | None], list[str]]:
    """One estimator's selection metrics against the true values (SPEC section 11).

    Args:
      truth: {policy: J or None}, as `read_truth` returns; policies without a true value
        are left out (their note is ``missing_truth_note``'s, the caller's to show once).
      estimates: {policy: Ĵ or None}, in policy order (the order that breaks ties).
      intervals: {policy: (ci_low, ci_high)}, None where undefined; None: no coverage.
      baseline_value: J_0, the baseline's true value, for ``sharpe@k`` (None: none).
      top_k: the k of the @k metrics, each 1 <= k <= K.
      names: {policy: the name the notes give it} (the results' shown names; None: as keyed).
      share: estimates closer than this share of their size tie (the estimator's
        ``tie_share``).

    Returns:
      (metrics, notes): {"rmse", "nmse", "spearman", "coverage", "regret@k", "nregret@k",
      "precision@k", "sharpe@k" for each k} with None where a number cannot be finite, and
      the notes that explain a None (an undefined estimate or interval, equal estimates
      across the top-k edge).

    Raises:
      UsageError: no policy has a true value, or a k of `top_k` is below 1 or above K.
    """
    policies = [p for p in estimates if truth.get(p) is not None]
    if not policies:
        raise UsageError("--truth gives no value for any evaluated policy")
    top_k = check_top_k(top_k, len(policies))
    true_k = np.array([truth[p] for p in policies], dtype=np.float64)
    notes = []
    shown = [(names or {}).get(p, p) for p in policies]
    undefined = [
        name for p, name in zip(policies, shown, strict=True) if finite(estimates[p]) is None
    ]
    estimate_k = None
    if undefined:
        notes.append(
            f"no estimate for {', '.join(undefined)}; no rmse, nmse, spearman or @k metrics"
        )
    else:
        estimate_k = np.array([estimates[p] for p in policies], dtype=np.float64)
    metrics, tie_notes = _ranking_metrics(estimate_k, true_k, top_k, baseline_value, shown, share)
    notes += tie_notes
    metrics["coverage"], coverage_notes = _coverage(intervals, policies, true_k)
    notes += coverage_notes
    order = ["rmse", "nmse", "spearman", "coverage"]
    return {name: metrics[name] for name in order + [m for m in metrics if m not in order]}, notes


def _coverage(
    intervals: Mapping[str, Interval] | None, policies: list[str], true_k: np.ndarray
) -> tuple[float | None, list[str]]:
    """(coverage of ``true_k`` by the ``policies``' intervals, its note); None without
    intervals."""
    if intervals is None:
        return None, []
    pairs = [intervals.get(p, (None, None)) for p in policies]
    share, n_undefined = coverage(pairs, true_k)
    if not n_undefined:
        return share, []
    return share, [
        f"coverage over {len(policies) - n_undefined} of {len(policies)} policies; "
        f"{n_undefined} without an interval left out"
    ]


def selection_by_estimator(
    truth: Mapping[str, float | None],
    estimates: Mapping[str, Mapping[str, float | None]],
    intervals: Mapping[str, Mapping[str, Interval]] | None = None,
    *,
    baseline_value: float | None = None,
    top_k: Sequence[int] = DEFAULT_TOP_K,
    names: Mapping[str, str] | None = None,
) -> tuple[dict[str, dict[str, float | None]], list[str]]:
    """``selection_metrics`` for every estimator: the JSON's ``"selection"`` object.

    estimates: {estimator: {policy: Ĵ or None}}; intervals: {estimator: {policy: (low,
    high)}} (None: no coverage); names: as ``selection_metrics``'. Returns ({estimator:
    metrics}, notes prefixed with the estimator's name)."""
    selection, notes = {}, []
    for estimator, values in estimates.items():
        chosen = None if intervals is None else intervals.get(estimator, {})
        selection[estimator], own = selection_metrics(
            truth,
            values,
            chosen,
            baseline_value=baseline_value,
            top_k=top_k,
            names=names,
            share=tie_share(estimator),
        )
        notes += [f"{estimator}: {note}" for note in own]
    return selection, notes


# --------------------------------------------------------------------- could-be-best sets


def bonferroni_level(confidence: float, n_policies: int) -> float:
    """1 - alpha / (K - 1), alpha = 1 - confidence: the level of each of the K - 1 paired
    comparisons with the estimated best, so that all hold together at `confidence`
    (`confidence` itself for K = 1, where there is nothing to compare)."""
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    if n_policies < 1:
        raise ValueError(f"the number of policies must be at least 1, got {n_policies}")
    if n_policies == 1:
        return confidence
    return 1.0 - (1.0 - confidence) / (n_policies - 1)


def normal_paired_intervals(
    differences: Mapping[tuple[str, str], tuple[float | None, float | None]],
) -> PairedInterval:
    """paired_interval(b, k, level) from precomputed paired differences: {(b, k): (delta,
    stderr)} of V(b) - V(k); the normal interval delta ± z stderr. A pair given only as
    (k, b) is used negated; a pair not given, or with a None, has no interval."""

    def paired_interval(best: str, other: str, level: float) -> Interval:
        if (best, other) in differences:
            delta, stderr = differences[best, other]
        elif (other, best) in differences:
            delta, stderr = differences[other, best]
            delta = None if delta is None else -delta
        else:
            return None, None
        if finite(delta) is None or finite(stderr) is None:
            return None, None
        z = NormalDist().inv_cdf(0.5 + level / 2)
        return finite(delta - z * stderr), finite(delta + z * stderr)

    return paired_interval


def estimated_best(estimates: Mapping[str, float | None]) -> str | None:
    """The policy with the largest defined estimate, the first in order on ties (None when
    no estimate is defined)."""
    best = None
    for policy, value in estimates.items():
        if finite(value) is not None and (best is None or value > estimates[best]):
            best = policy
    return best


def could_be_best(
    estimates: Mapping[str, float | None],
    paired: PairedInterval | Mapping[tuple[str, str], tuple[float | None, float | None]],
    confidence: float,
) -> dict[str, bool]:
    """Which policies could be the best, for one estimator (SPEC section 11).

    The estimated best b is the policy with the largest estimate (the first on ties). For
    every other k, the paired interval of V(b) - V(k) at ``bonferroni_level(confidence, K)``;
    k is confidently worse when that interval lies above 0 (its low end > 0). The rest,
    b included, could be the best: so does a policy whose interval is undefined (nothing
    excludes it), and every policy when no estimate is defined.

    Args:
      estimates: {policy: V̂ or None} in policy order; K = len(estimates).
      paired: ``paired_interval(b, k, level) -> (low, high)`` of V(b) - V(k), or the
        precomputed {(b, k): (delta, stderr)}, turned into normal intervals.
      confidence: the joint level 1 - alpha of the set.

    Returns:
      {policy: could_be_best}, in the order of `estimates`.
    """
    level = bonferroni_level(confidence, max(len(estimates), 1))
    interval = paired if callable(paired) else normal_paired_intervals(paired)
    best = estimated_best(estimates)
    result = dict.fromkeys(estimates, True)
    if best is None:
        return result
    for policy in estimates:
        if policy != best:
            low, _ = interval(best, policy, level)
            result[policy] = not (low is not None and low > 0.0)
    return result


# ------------------------------------------------------------- paired differences (NumPy)


def paired_mean_difference(
    terms_k: np.ndarray, terms_0: np.ndarray
) -> tuple[float | None, float | None]:
    """(Δ, stderr) of an unweighted estimator (is, pdis, dm, dr) against the baseline, from
    the per-episode terms of both policies on the same episodes.

    Δ = mean_i (x_ki - x_0i); stderr = the sample standard deviation (n - 1) of the
    differences / sqrt(n), None for n < 2. terms_k, terms_0: [n], episode i in both.
    """
    terms_k, terms_0 = np.asarray(terms_k, np.float64), np.asarray(terms_0, np.float64)
    if terms_k.ndim != 1 or terms_k.shape != terms_0.shape or terms_k.size == 0:
        raise ValueError(f"need two equal [n] arrays, n >= 1; got {terms_k.shape}, {terms_0.shape}")
    with np.errstate(over="ignore", invalid="ignore"):
        difference_i = terms_k - terms_0
        delta = finite(float(np.mean(difference_i)))
        if terms_k.size < 2:
            return delta, None
        stderr = float(np.std(difference_i, ddof=1)) / math.sqrt(terms_k.size)
    return delta, finite(stderr)


def grouped_jackknife_difference(
    values_k_leave_out: np.ndarray, values_0_leave_out: np.ndarray, delta: float | None
) -> float | None:
    """The grouped-jackknife standard error of Δ = V̂(π_k) - V̂(π_0) for a self-normalised
    estimator (wis, wpdis, wdr), on the same resampling groups for both policies.

    values_k_leave_out, values_0_leave_out: [G] the estimate with group g left out, per
    policy; delta: Δ on all the episodes (None: undefined, so no standard error either).
    stderr = sqrt((G - 1) / G * sum_g (Δ_g - mean Δ)^2), Δ_g the leave-out differences, as
    the estimators' own jackknife computes it. None for G < 3 or an undefined leave-out:
    with two groups of one episode, each leave-out holds one episode, whose self-normalised
    estimate is its own return for every policy, so every Δ_g was 0 (a standard error of 0).
    """
    values_k = np.asarray(values_k_leave_out, np.float64)
    values_0 = np.asarray(values_0_leave_out, np.float64)
    if values_k.ndim != 1 or values_k.shape != values_0.shape:
        raise ValueError(f"need two equal [G] arrays; got {values_k.shape}, {values_0.shape}")
    groups = values_k.size
    if finite(delta) is None or groups < 3:
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        difference_g = values_k - values_0
        if not np.all(np.isfinite(difference_g)):
            return None
        spread = float(np.sum((difference_g - difference_g.mean()) ** 2))
        return finite(math.sqrt((groups - 1) / groups * spread))


def p_improvement(
    replicates_k: np.ndarray | None, replicates_0: np.ndarray | None, tie: float = 0.0
) -> float | None:
    """The share of paired bootstrap replicates with Δ_r = V̂_r(π_k) - V̂_r(π_0) > 0
    (SPEC 11), a Δ_r within ``tie`` of 0 (rounding) being no improvement.

    replicates_k, replicates_0: [R] replicate estimates drawn with the same Poisson counts
    (paired), NaN where undefined; None (or R = 0): no bootstrap, so None. Undefined
    differences are left out; below ``MIN_VALID_REPLICATES`` of them defined, None (the
    rule of the bootstrap intervals).
    """
    if replicates_k is None or replicates_0 is None:
        return None
    replicates_k = np.asarray(replicates_k, np.float64)
    replicates_0 = np.asarray(replicates_0, np.float64)
    if replicates_k.shape != replicates_0.shape or replicates_k.ndim != 1:
        raise ValueError(
            f"need two equal [R] arrays; got {replicates_k.shape}, {replicates_0.shape}"
        )
    if replicates_k.size == 0:
        return None
    with np.errstate(over="ignore", invalid="ignore"):
        difference_r = replicates_k - replicates_0
    valid = np.isfinite(difference_r)
    if valid.mean() < MIN_VALID_REPLICATES:
        return None
    return float(np.mean(difference_r[valid] > tie))
