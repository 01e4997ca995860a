"""Several processes (hosts) under JAX's multi-process runtime: which files each reads,
and the reduction of their partial statistics with JAX collectives.

Every process runs the same pipeline over a disjoint, deterministic share of the files,
then all of them exchange their accumulators (gathered over one device of each) and merge them in
process order, so every process holds the same result and process 0 prints it.
"""

from __future__ import annotations

import dataclasses
import functools
import glob
import hashlib
import os
import zipfile
from collections.abc import Callable
from typing import TypeVar

import numpy as np

from ope_cli import interrupts, runtime
from ope_cli.choosing import paired
from ope_cli.choosing.paired import PairedSums
from ope_cli.data.validate import REASONS
from ope_cli.errors import (
    DataError,
    InvalidValueError,
    OpeError,
    UsageError,
    first_line,
    summary,
)
from ope_cli.estimation.stats import Accumulator, extend, from_batch, merge, row_lengths
from ope_cli.models.behavior import ESTIMATE
from ope_cli.models.policies import split_name
from ope_cli.models.policies.base import digest_arrays
from ope_cli.models.policies.entry_points import entry_point_file
from ope_cli.models.qfunctions import FIT

MESSAGE_BYTES = 2048
# How long a process that finished its share waits for the slowest peer. Peers may still be
# reading or compiling; one that dies is reported by the runtime's heartbeat long before.
PEER_WAIT_MS = 24 * 3600 * 1000
DEFAULT_TIMEOUT = 60  # seconds to wait for the other processes to join or answer
C = TypeVar("C")


class DistributedError(OpeError):
    """A peer process failed, died or could not be reached (exit 5)."""

    exit_code = 5
    kind = "distributed run failed"


@dataclasses.dataclass(frozen=True)
class DistributedConfig:
    """How to join a multi-process run; ``auto`` lets JAX detect the cluster (SLURM, ...)."""

    coordinator: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    auto: bool = False
    timeout: int | None = None  # --timeout as given; None: the default, DEFAULT_TIMEOUT

    @property
    def timeout_seconds(self) -> int:
        return DEFAULT_TIMEOUT if self.timeout is None else self.timeout

    @property
    def enabled(self) -> bool:
        """Whether a multi-process option was given (a --process-id or --timeout alone was
        ignored: the run is then refused for the options it lacks)."""
        return (
            self.auto
            or self.coordinator is not None
            or self.process_id is not None
            or self.timeout is not None
            or (self.num_processes or 1) > 1
        )


def initialize(config: DistributedConfig) -> tuple[int, int]:
    """Joins the run (``jax.distributed.initialize``); returns (process_id, num_processes)."""
    import jax

    if not config.auto:
        missing = [
            name
            for name, value in (
                ("--coordinator", config.coordinator),
                ("--num-processes", config.num_processes),
                ("--process-id", config.process_id),
            )
            if value is None
        ]
        if missing:
            lone = (
                "--timeout is for a multi-process run, which"
                if len(missing) == 3
                else "a multi-process run"
            )
            raise UsageError(
                f"{lone} needs {', '.join(missing)} (or --distributed to detect the cluster)"
            )
    _check_values(config)  # also beside --distributed (JAX's own words, exit 5, or a crash)
    if config.timeout is not None and config.timeout < 1:  # 0 waited for ever
        raise UsageError(f"--timeout must be at least 1 second, got {config.timeout}")
    if config.auto:
        _check_launcher(config)
    # Like everything here, before anything initialises a JAX backend.
    runtime.enable_cpu_collectives()
    try:
        jax.distributed.initialize(
            coordinator_address=config.coordinator,
            num_processes=config.num_processes,
            process_id=config.process_id,
            initialization_timeout=config.timeout_seconds,
            heartbeat_timeout_seconds=max(5, min(config.timeout_seconds, 100)),
        )
    except Exception as error:  # noqa: BLE001 - the runtime raises several types here
        raise DistributedError(
            f"could not join the run at {config.coordinator or 'the detected coordinator'} within "
            f"{config.timeout_seconds}s (are all processes started, and is the address "
            f"reachable?): {first_line(error)}"
        ) from None
    # the runtime takes SIGTERM for its preemption notice ("SIGTERM caught", and the run
    # went on to its end): a scheduler's SIGTERM ends the run, as Ctrl-C does
    interrupts.reclaim()
    return jax.process_index(), jax.process_count()


def _check_values(config: DistributedConfig) -> None:
    """UsageErrors for the multi-process options given (and, with --distributed, JAX's own
    JAX_COORDINATOR_ADDRESS): a process count below 1, a process id outside it, an address
    that is no HOST:PORT."""
    count, index = config.num_processes, config.process_id
    if count is not None and count < 1:
        raise UsageError(f"--num-processes must be at least 1, got {count}")
    if index is not None and (index < 0 or (count is not None and index >= count)):
        bound = count if count is not None else "the number of processes"
        raise UsageError(f"--process-id must be in [0, {bound}), got {index}")
    address, name = _coordinator(config)
    if address is not None:
        check_coordinator(address, name)


def _coordinator(config: DistributedConfig) -> tuple[str | None, str]:
    """(the coordinator's address the options give, with --distributed also JAX's own
    JAX_COORDINATOR_ADDRESS; where it comes from)."""
    if config.coordinator is not None or not config.auto:
        return config.coordinator, "--coordinator"
    return os.environ.get("JAX_COORDINATOR_ADDRESS"), "JAX_COORDINATOR_ADDRESS"


def _check_launcher(config: DistributedConfig) -> None:
    """A UsageError where --distributed finds no launcher JAX detects and the options (or
    JAX's own JAX_COORDINATOR_ADDRESS) do not give what it would: the run was exit 5,
    "could not join ... within 60s", in JAX's words."""
    if cluster_detected() is not False:
        return
    given = (
        ("--coordinator", _coordinator(config)[0]),
        ("--num-processes", config.num_processes),
        ("--process-id", config.process_id),
    )
    missing = [name for name, value in given if value is None]
    if missing:
        raise UsageError(
            "--distributed found no launcher it detects (SLURM's srun, Open MPI's mpirun, "
            "Cloud TPU, Kubernetes) in this process's environment: start ope under one, or "
            f"give {', '.join(missing)}"
        )


def cluster_detected() -> bool | None:
    """Whether JAX detects a cluster launcher in this process's environment (None where
    its detection cannot be asked: the run then tries to join, as before)."""
    try:
        from jax._src.clusters import ClusterEnv  # no public name; guarded

        clusters = ClusterEnv._cluster_types
        return any(c.is_env_present() for c in clusters if not c.opt_in_only_method)
    except Exception:  # noqa: BLE001 - another JAX: let jax.distributed decide
        return None


def check_coordinator(address: str, name: str = "--coordinator") -> None:
    """UsageError for a --coordinator that is not HOST:PORT with a port from 1 to 65535: the
    runtime took "127.0.0.1" for an internal error and "127.0.0.1:abc" for a segfault
    (exit 5, "another process died")."""
    host, _, port = address.rpartition(":")
    if not host or not (port.isascii() and port.isdigit()) or not 1 <= int(port) <= 65535:
        raise UsageError(f"{name} must be HOST:PORT, a port from 1 to 65535, got {address!r}")


def share_files(files: tuple[str, ...], process_id: int, num_processes: int) -> tuple[str, ...]:
    """This process's contiguous run of files, balanced by bytes (same on every process).

    File i goes to the process whose equal share of the total bytes contains the middle of
    file i, so shares are contiguous, disjoint, and cover every file. With fewer files than
    processes, some processes get none and contribute empty statistics.
    """
    from ope_cli.data.sources.files import file_sizes  # local or object storage

    sizes = np.maximum(np.array(file_sizes(files), np.float64), 1)
    middles = np.cumsum(sizes) - sizes / 2
    owner = np.minimum((middles / sizes.sum() * num_processes).astype(int), num_processes - 1)
    return tuple(f for f, o in zip(files, owner, strict=True) if o == process_id)


# the collectives' words for a peer that is gone
LOST_PEER = ("Connection closed", "Connection reset", "UNAVAILABLE", "DEADLINE_EXCEEDED", "Gloo")


def _gather(array: np.ndarray) -> np.ndarray:
    """Collective: [processes, ...] ``array`` (the same shape and dtype in every process)
    of every process, in process order, gathered over one device of each: processes may
    have different numbers of devices (``multihost_utils.process_allgather`` spans them
    all, as a [processes, local devices] grid, and ended in an internal error)."""
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    local = np.asarray(array)[None]
    if jax.process_count() == 1:
        return local
    first: dict[int, jax.Device] = {}
    for device in sorted(jax.devices(), key=lambda d: d.id):
        first.setdefault(device.process_index, device)
    mesh = Mesh(np.array([first[p] for p in sorted(first)]), ("processes",))
    placed = jax.device_put(local, first[jax.process_index()])
    stacked = jax.make_array_from_single_device_arrays(
        (len(first), *local.shape[1:]), NamedSharding(mesh, PartitionSpec("processes")), [placed]
    )
    try:
        gathered = _replicated(mesh)(stacked)
        return np.asarray(gathered.addressable_data(0))
    except (jax.errors.JaxRuntimeError, ValueError) as error:
        # a peer that stopped mid-run (Ctrl-C, a kill) closed its connection: that was
        # "internal error (a bug)", exit 1 (the CPU collectives raise it as a ValueError
        # too: "UNKNOWN: Gloo AllGather failed"); any other error stays what it is
        if not any(sign in str(error) for sign in LOST_PEER):
            raise
        raise DistributedError(
            "another process stopped while this one exchanged its sums with it (that "
            f"process's own line says why): {_clipped(summary(error))}"
        ) from None


def _clipped(text: str, limit: int = 300) -> str:
    """``text`` cut to about ``limit`` characters at a space, with "..." where it was cut
    (a runtime's message cut at 300 characters ended mid-word)."""
    if len(text) <= limit:
        return text
    return text[:limit].rsplit(" ", 1)[0] + " ..."


@functools.cache
def _replicated(mesh):
    """The identity, jitted once per mesh, its output replicated on every device of
    ``mesh`` (a new function per call would compile every gather again)."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    return jax.jit(lambda x: x, out_shardings=NamedSharding(mesh, PartitionSpec()))


def _encode(message: str) -> np.ndarray:
    data = message.encode()[:MESSAGE_BYTES]
    out = np.zeros(MESSAGE_BYTES, np.uint8)
    out[: len(data)] = np.frombuffer(data, np.uint8)
    return out


_barriers = 0  # barriers passed so far: every process passes the same ones, in order


def wait_for_peers(name: str, waiting_for: str) -> None:
    """Blocks until every process reaches barrier ``name`` (the coordination service's own
    barrier, not a collective). A process with little or no data reaches the first
    collective long before the others; the CPU collectives give up after a fixed, short
    timeout, so the processes meet here first. ``waiting_for``: what the error of a peer
    lost meanwhile says this process waited for, in words."""
    from jax._src import distributed as jax_distributed

    global _barriers
    client = jax_distributed.global_state.client
    if client is not None:
        _barriers += 1  # a barrier's name is used once
        try:
            client.wait_at_barrier(f"ope:{name}:{_barriers}", PEER_WAIT_MS)
        except Exception as error:  # noqa: BLE001 - the runtime's error for a lost peer
            raise DistributedError(
                f"another process died or stopped answering while this one waited for "
                f"{waiting_for}: {_clipped(summary(error))}"
            ) from None


# Options a process may set as its own: how it reads and batches its share of the files, and
# its local devices; they change how the numbers are computed, not which numbers.
OWN_OPTIONS = ("batching", "runtime.devices")
# Options that may name an entry point (package.module:name), and their values that are
# the tool's own words of that form, not modules (--q fit:MODEL, --behavior estimate:MODEL)
ENTRY_POINT_OPTIONS = ("policies", "behavior.policy", "q.sources")
BUILT_IN = (FIT, ESTIMATE)


def option_values(config, prefix: str = "") -> dict[str, str]:
    """{dotted field: repr} of a (nested) options dataclass, but OWN_OPTIONS."""
    values = {}
    for field in dataclasses.fields(config):
        name, value = prefix + field.name, getattr(config, field.name)
        if name in OWN_OPTIONS:
            continue
        if dataclasses.is_dataclass(value):
            values.update(option_values(value, name + "."))
        else:
            # the data by its path alone: each process reads its own share of its files
            compared = _as_compared(value, name != "data", name in ENTRY_POINT_OPTIONS)
            values[name] = repr(compared)
    return values


def _as_compared(value, contents: bool = True, entry_points: bool = False):
    """``value`` with every string that names an existing local file or directory (or is
    ``NAME=PATH`` of one, or a glob of them) given by its real path, and a file of up to
    CONTENT_COMPARED_BYTES by its contents too (``_contents``): processes started in other
    directories name the same file otherwise, and a stale copy of a checkpoint on one host
    (the same path, another policy) merged two policies' sums into one run's numbers, exit 0.
    With ``entry_points``, a ``package.module:name`` by its module's file too."""
    if isinstance(value, str):
        name, path = split_name(value)
        matches = glob.glob(path) if glob.has_magic(path) and not os.path.exists(path) else []
        if matches:  # the files it stands for (a relative glob and an absolute one alike)
            return (name, tuple(_as_compared(match, contents) for match in sorted(matches)))
        if not os.path.exists(path):
            # an entry point by its module's file too: processes that import other code
            # under one name (another version on another host) merged their sums, exit 0
            own = entry_points and path.partition(":")[0] not in BUILT_IN
            source = entry_point_file(path) if own else None
            return value if source is None else f"{value} module{_contents(source)}"
        real = os.path.realpath(path)
        real += _contents(real) if contents else ""
        return real if name is None else f"{name}={real}"
    if isinstance(value, tuple):
        return tuple(_as_compared(item, contents, entry_points) for item in value)
    return value


CONTENT_COMPARED_BYTES = 64 << 20  # checkpoints and truth files, not datasets


def _contents(path: str) -> str:
    """The digest (" sha256:HEX") of a file of up to CONTENT_COMPARED_BYTES: an .npz by its
    arrays (names, dtypes, shapes, values: the same checkpoint saved twice differs in its
    zip timestamps), another file (or an .npz that does not open) by its bytes; "" for a
    directory or a larger file."""
    if not os.path.isfile(path) or os.path.getsize(path) > CONTENT_COMPARED_BYTES:
        return ""
    digest = hashlib.sha256()
    try:
        if not path.endswith(".npz"):
            raise ValueError("not an .npz archive")
        with np.load(path, allow_pickle=False) as archive:
            digest_arrays(digest, {key: archive[key] for key in archive.files})
    except (OSError, ValueError, TypeError, EOFError, zipfile.BadZipFile):  # an .npy: TypeError
        digest = hashlib.sha256()
        try:
            with open(path, "rb") as file:
                digest.update(file.read())
        except OSError:  # unreadable here: loading it says so, in the process's own words
            return " unreadable"
    return f" sha256:{digest.hexdigest()}"


def check_same_options(config, joined: DistributedConfig | None = None) -> None:
    """Collective, right after joining: a UsageError on every process when the processes
    were given different options (OWN_OPTIONS aside), ``joined``'s --num-processes among
    them. Each process estimates its share with its own; with another --gamma or
    checkpoint in one of them, the merged numbers were those of no run, printed without a
    word (and a process given another --num-processes joined the coordinator's run)."""
    values = option_values(config)
    # in every process, also where it was detected (None): the lists must match in length
    values["num_processes"] = repr(None if joined is None else joined.num_processes)
    digests = np.array(
        [int(hashlib.sha256(v.encode()).hexdigest()[:15], 16) for v in values.values()], np.int64
    )
    everyone = _gather(digests)  # [processes, options]
    differ = [name for name, d in zip(values, (everyone != everyone[0]).any(0), strict=True) if d]
    if differ:
        raise UsageError(
            f"the processes were given different options (these settings differ: "
            f"{', '.join(differ)}): give every process the same command line but its "
            "--process-id (--read-rows, --batch-steps, --min-bucket and --devices may differ), "
            "and the same contents in the checkpoint and truth files and entry-point modules it "
            "names"
        )


def check_all_succeeded(error: OpeError | None) -> None:
    """Collective: every process says whether its share succeeded; if any failed, every
    process raises (the failing one its own error, the others one that names it)."""
    wait_for_peers("local-pass-done", "every process to finish its share of the data")
    everyone = _gather(_status(error))  # [processes, 3]
    messages = _gather(_encode("" if error is None else f"{error.kind}: {error}"))
    failed = np.flatnonzero(everyone[:, 0])
    if error is not None:
        raise error
    if failed.size:
        first = int(failed[0])
        text = bytes(messages[first]).rstrip(b"\0").decode(errors="replace")
        code, invalid, reason = (int(x) for x in everyone[first])
        if invalid:  # invalid values: the command line adds where to go from there
            failure = InvalidValueError(
                f"process {first} failed: {text}",
                invalid == 2,
                REASONS[reason - 1] if reason else None,
            )
        else:
            failure = OpeError(f"process {first} failed: {text}")
        failure.exit_code = code
        failure.kind = "error in another process"
        raise failure


def _status(error: OpeError | None) -> np.ndarray:
    """[3] what the others need of this process's error: its exit code (0: none); 0, or 1
    for invalid values (2 where --on-invalid drop would leave them out); and 0, or 1 + the
    index of their reason (``validate.REASONS``)."""
    if not isinstance(error, InvalidValueError):
        return np.array([0 if error is None else error.exit_code, 0, 0], np.int64)
    reason = 1 + REASONS.index(error.reason) if error.reason in REASONS else 0
    return np.array([error.exit_code, 1 + error.droppable, reason], np.int64)


def allgather_ragged(values: np.ndarray) -> np.ndarray:
    """Collective: [sum of n_p, ...] every process's ``values`` ([n_p, ...], n_p may differ;
    the trailing shape and dtype may not) concatenated in process order."""
    values = np.asarray(values)
    counts = _gather(np.array([values.shape[0]], np.int64))[:, 0]
    padded = np.zeros((int(counts.max()), *values.shape[1:]), values.dtype)
    padded[: values.shape[0]] = values
    gathered = _gather(padded)
    return np.concatenate([gathered[p, : counts[p]] for p in range(len(counts))])


def check_disjoint_episodes(
    keys: np.ndarray, file_of: Callable[[np.uint64], str] | None = None
) -> None:
    """Collective: an episode id read by two processes is an error, not a double count. The
    error names the files of the first such episode (``file_of``: a local key's file)."""
    keys = np.asarray(keys, np.uint64)
    everything = allgather_ragged(keys)
    unique, occurrences = np.unique(everything, return_counts=True)
    shared = unique[occurrences > 1]
    if not shared.size:
        return
    first = shared[0]
    mine = file_of(first) if file_of is not None and np.isin(first, keys) else ""
    files = [bytes(name).rstrip(b"\0").decode(errors="replace") for name in _gather(_encode(mine))]
    where = [f"{name} (process {p})" for p, name in enumerate(files) if name]
    raise DataError(
        f"{shared.size} episode id(s) appear in the files of more than one process; the "
        f"first is in {' and '.join(where) or 'several processes'}: an episode must not span "
        "files (keep each episode's rows in one file)"
    )


def allgather(values: np.ndarray) -> np.ndarray:
    """Collective: [N, ...] the array ``values`` (same shape and dtype everywhere) of every
    process, in process order."""
    return _gather(np.asarray(values))


def reduce_counters(counters: C) -> C:
    """Collective: a dataclass of integer counters (ints or int arrays) summed over processes,
    or reduced with ``max`` where the field's metadata says ``{"reduce": "max"}``. Generic
    over the fields, so a new counter needs no edit here."""
    reduced = {}
    for field in dataclasses.fields(counters):
        gathered = _gather(np.asarray(getattr(counters, field.name), np.int64))
        total = gathered.max(axis=0) if field.metadata.get("reduce") == "max" else gathered.sum(0)
        reduced[field.name] = int(total) if total.ndim == 0 else total
    return dataclasses.replace(counters, **reduced)


def reduce_accumulators(accumulators: list[Accumulator]) -> list[Accumulator]:
    """Collective: each policy's accumulators of all processes, merged in process order.
    Generic over the accumulator's fields (a pytree); the per-step arrays are first
    lengthened to the longest over all processes (each group's rows to that group's)."""
    import jax

    if not accumulators:
        return []
    length = int(_gather(np.array([accumulators[0].length], np.int64)).max())
    merged = []
    for accumulator in accumulators:
        rows = _gather(row_lengths(accumulator)).max(axis=0)  # [K]
        leaves, tree = jax.tree.flatten(extend(accumulator, length, rows))
        parts = [_gather(np.asarray(leaf, np.float64)) for leaf in leaves]  # [N, ...] each
        total = None
        for process in range(parts[0].shape[0]):
            one = from_batch(jax.tree.unflatten(tree, [part[process] for part in parts]))
            total = one if total is None else merge(total, one)
        merged.append(total)
    return merged


def reduce_paired(sums: PairedSums, baseline: int) -> PairedSums:
    """Collective: the paired sums of all processes, merged in process order (``paired``)."""
    import jax

    leaves, tree = jax.tree.flatten(sums)
    parts = [_gather(np.asarray(leaf, np.float64)) for leaf in leaves]  # [N, ...] each
    total = None
    for process in range(parts[0].shape[0]):
        one = jax.tree.unflatten(tree, [part[process] for part in parts])
        total = one if total is None else paired.merge(total, one, baseline)
    return total
