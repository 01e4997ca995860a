"""The pure parts of a multi-process run's checks, in process (the processes themselves:
``test_distributed``, slow)."""

from __future__ import annotations

import dataclasses
import os

import pytest

from ope_cli.config import BatchingConfig, BehaviorConfig, EvaluationConfig, QConfig
from ope_cli.estimation.distributed import option_values


def test_processes_naming_one_file_by_other_paths_give_the_same_options(tmp_path, monkeypatch):
    """A process started elsewhere names the same checkpoint by another path: the same
    option, not a difference that stops the run."""
    (tmp_path / "run").mkdir()
    for name in ("p.npz", "q.npz", "logs.parquet"):
        (tmp_path / name).write_bytes(b"")
    monkeypatch.chdir(tmp_path / "run")
    relative = EvaluationConfig(
        data="../logs.parquet",
        policies=("../p.npz", "best=../p.npz"),
        q=QConfig(sources=("../q.npz",)),
    )
    absolute = EvaluationConfig(
        data=str(tmp_path / "logs.parquet"),
        policies=(str(tmp_path / "p.npz"), f"best={tmp_path / 'p.npz'}"),
        q=QConfig(sources=(os.path.join(tmp_path, "run", "..", "q.npz"),)),
    )
    assert option_values(relative) == option_values(absolute)


def test_other_files_names_and_settings_still_differ(tmp_path, monkeypatch):
    (tmp_path / "p.npz").write_bytes(b"")
    (tmp_path / "other.npz").write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    base = EvaluationConfig(data="logs.parquet", policies=("best=p.npz",), gamma=0.9)
    for changed in (
        {"policies": ("best=other.npz",)},
        {"policies": ("good=p.npz",)},
        {"policies": ("s3://bucket/p.npz",)},
        {"gamma": 0.5},
    ):
        other = dataclasses.replace(base, **changed)
        assert option_values(other) != option_values(base), changed
    # reading and batching are each process's own
    own = dataclasses.replace(base, batching=BatchingConfig(read_rows=7, batch_steps=64))
    assert option_values(own) == option_values(base)


def test_a_process_id_alone_asks_for_the_rest_of_a_multi_process_run():
    """--process-id 7 alone was ignored: a single-process run, as if it were process 7."""
    from ope_cli.errors import UsageError
    from ope_cli.estimation.distributed import DistributedConfig, initialize

    alone = DistributedConfig(process_id=7)
    assert alone.enabled and not DistributedConfig().enabled
    with pytest.raises(UsageError, match="needs --coordinator, --num-processes"):
        initialize(alone)


def test_a_timeout_alone_asks_for_the_rest_of_a_multi_process_run():
    """--timeout 30 alone was ignored (a single-process run); the default is 60 seconds."""
    from ope_cli.errors import UsageError
    from ope_cli.estimation.distributed import DistributedConfig, initialize

    alone = DistributedConfig(timeout=30)
    assert alone.enabled and DistributedConfig().timeout_seconds == 60
    with pytest.raises(UsageError, match="--timeout is for a multi-process run, which needs"):
        initialize(alone)
    # 0 (or below): the runtime waited for ever, and ignored SIGTERM and Ctrl-C
    for seconds in (0, -5):
        config = DistributedConfig("127.0.0.1:1234", 2, 1, timeout=seconds)
        with pytest.raises(UsageError, match=f"--timeout must be at least 1 second, got {seconds}"):
            initialize(config)


def test_distributed_without_a_launcher_is_a_usage_error(monkeypatch):
    """--distributed outside srun or mpirun was exit 5, "could not join the run ... within
    60s: coordinator_address should be defined" (JAX's words, at once)."""
    from ope_cli.errors import UsageError
    from ope_cli.estimation.distributed import DistributedConfig, cluster_detected, initialize

    for name in list(os.environ):
        if name.startswith(("SLURM_", "OMPI_", "PMI_", "PMIX_", "TPU_", "KUBERNETES_")):
            monkeypatch.delenv(name)
    monkeypatch.delenv("JAX_COORDINATOR_ADDRESS", raising=False)
    assert cluster_detected() is False
    with pytest.raises(UsageError, match="--distributed found no launcher it detects"):
        initialize(DistributedConfig(auto=True))
    # only what is missing is asked for: the address may come from JAX's own variable
    with pytest.raises(UsageError, match=r"or give --num-processes, --process-id$"):
        initialize(DistributedConfig(coordinator="127.0.0.1:1234", auto=True))
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "127.0.0.1:1234")
    with pytest.raises(UsageError, match=r"or give --process-id$"):
        initialize(DistributedConfig(num_processes=2, auto=True))


@pytest.mark.parametrize(
    ("config", "words"),
    [
        (dict(num_processes=2, process_id=5), r"--process-id must be in \[0, 2\), got 5"),
        (dict(num_processes=0, process_id=0), "--num-processes must be at least 1, got 0"),
        (dict(coordinator="127.0.0.1:abc"), "--coordinator must be HOST:PORT"),
    ],
)
def test_distributed_checks_the_options_it_is_given(config, words, monkeypatch):
    """Beside --distributed these were exit 5 in JAX's words, or a crash (a port of
    "abc"), where without it they are usage errors."""
    from ope_cli.errors import UsageError
    from ope_cli.estimation.distributed import DistributedConfig, initialize

    monkeypatch.delenv("JAX_COORDINATOR_ADDRESS", raising=False)
    with pytest.raises(UsageError, match=words):
        initialize(DistributedConfig(auto=True, **config))
    monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "127.0.0.1:abc")
    with pytest.raises(UsageError, match="JAX_COORDINATOR_ADDRESS must be HOST:PORT"):
        initialize(DistributedConfig(auto=True))


def test_a_checkpoint_of_other_contents_at_the_same_path_differs(tmp_path, monkeypatch):
    """A stale copy of a checkpoint on one host (the same path, another policy): the
    processes' sums were merged into one run's numbers (WIS 1.441, where the two policies
    have 2.453 and 0.885), exit 0. The same arrays saved again are the same option."""
    import numpy as np

    monkeypatch.chdir(tmp_path)
    (tmp_path / "ckpts").mkdir()
    logits = np.zeros((3, 2))
    np.savez(tmp_path / "ckpts" / "p.npz", kind=np.array("tabular"), logits=logits)
    for config in (
        EvaluationConfig(data="logs.parquet", policies=("ckpts/p.npz",)),
        EvaluationConfig(data="logs.parquet", policies=("best=ckpts/p.npz",)),
        EvaluationConfig(data="logs.parquet", policies=("ckpts/*.npz",)),
        EvaluationConfig(data="logs.parquet", q=QConfig(sources=("ckpts/p.npz",))),
    ):
        before = option_values(config)
        np.savez(tmp_path / "ckpts" / "p.npz", kind=np.array("tabular"), logits=logits)
        assert option_values(config) == before, config  # saved again: other zip bytes
        np.savez(tmp_path / "ckpts" / "p.npz", kind=np.array("tabular"), logits=logits + 1)
        assert option_values(config) != before, config
        np.savez(tmp_path / "ckpts" / "p.npz", kind=np.array("tabular"), logits=logits)


@pytest.mark.parametrize(
    "address", ["127.0.0.1", "127.0.0.1:abc", ":1234", "host:0", "h:70000", "h:\u00b2"]
)
def test_a_coordinator_that_is_no_host_and_port_is_a_usage_error(address):
    """The runtime took "127.0.0.1" for an internal error ("list index out of range") and
    "127.0.0.1:abc" for a segfault, each exit 5 blaming another process."""
    from ope_cli.errors import UsageError
    from ope_cli.estimation.distributed import DistributedConfig, initialize

    config = DistributedConfig(coordinator=address, num_processes=2, process_id=0)
    with pytest.raises(UsageError, match="--coordinator must be HOST:PORT"):
        initialize(config)


def test_the_data_is_compared_by_its_path_and_a_glob_by_its_files(tmp_path, monkeypatch):
    """The data's files were read whole to be compared (each process reads only its share
    of them); a relative glob and an absolute one of the same checkpoints differed."""
    import numpy as np

    (tmp_path / "run").mkdir()
    monkeypatch.chdir(tmp_path / "run")
    (tmp_path / "logs.parquet").write_bytes(b"one")
    np.savez(tmp_path / "p.npz", kind=np.array("tabular"), logits=np.zeros((2, 2)))
    config = EvaluationConfig(data="../logs.parquet", policies=("../*.npz",))
    before = option_values(config)
    assert "sha256" not in before["data"]
    (tmp_path / "logs.parquet").write_bytes(b"two")
    assert option_values(config) == before
    absolute = EvaluationConfig(
        data=str(tmp_path / "logs.parquet"), policies=(f"{tmp_path}/*.npz",)
    )
    assert option_values(absolute) == before


def test_a_checkpoint_that_is_no_archive_is_compared_by_its_bytes(tmp_path, monkeypatch):
    """An .npy array named .npz: np.load gave an array, not an archive, and comparing the
    options was an internal error on every process (one process says "not a readable
    .npz checkpoint")."""
    import numpy as np

    monkeypatch.chdir(tmp_path)
    np.save(tmp_path / "arr.npy", np.zeros(3))
    (tmp_path / "fake.npz").write_bytes((tmp_path / "arr.npy").read_bytes())
    config = EvaluationConfig(data="logs.parquet", policies=("fake.npz",))
    assert "sha256:" in option_values(config)["policies"]


def test_an_entry_point_is_compared_by_its_module_s_file_too(tmp_path, monkeypatch):
    """Two processes importing other code under one name (PYTHONPATH to another version)
    merged their sums into one printed number, exit 0: an entry point's module file is
    compared by its contents, wherever it is found (in the working directory, as loading
    finds it), and a name that is no module stays a name."""
    import sys

    for folder, probability in (("good", "1 / 3"), ("other", "0.8")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "qa_entry_mod.py").write_text(
            f"import jax.numpy as jnp\ndef log_prob(o, a):\n    return jnp.log({probability})\n"
        )
    config = EvaluationConfig(data="logs.parquet", policies=("named=qa_entry_mod:log_prob",))
    seen, path = [], list(sys.path)
    for folder in ("good", "other", "good"):
        monkeypatch.chdir(tmp_path / folder)  # found in the working directory, as loading does
        monkeypatch.setattr(sys, "path", list(path))
        seen.append(option_values(config)["policies"])
    assert seen[0] != seen[1] and seen[0] == seen[2], seen
    assert "module sha256:" in seen[0]
    missing = EvaluationConfig(data="logs.parquet", policies=("no_such_mod_here:f",))
    assert option_values(missing)["policies"] == repr(("no_such_mod_here:f",))
    # the tool's own words of that form name no module, even where one of that name is
    # found; a package whose __init__ fails is left to loading to report (exit 4, not 1)
    (tmp_path / "good" / "fit.py").write_text("")
    (tmp_path / "good" / "broken_pkg").mkdir()
    (tmp_path / "good" / "broken_pkg" / "__init__.py").write_text("raise RuntimeError('no')\n")
    monkeypatch.chdir(tmp_path / "good")
    own = EvaluationConfig(
        data="logs.parquet",
        policies=("broken_pkg.mod:f",),
        behavior=BehaviorConfig("estimate:tabular"),
        q=QConfig(sources=("fit:linear",)),
    )
    values = option_values(own)
    assert values["q.sources"] == repr(("fit:linear",)), values
    assert values["behavior.policy"] == repr("estimate:tabular")
    assert values["policies"] == repr(("broken_pkg.mod:f",))


def test_a_peer_lost_in_a_gather_is_a_distributed_error(monkeypatch):
    """A peer stopped by Ctrl-C closed its connection mid-gather: the collectives' runtime
    error was "internal error (a bug)", exit 1, where the run's word for it is exit 5."""
    import jax
    import numpy as np

    from ope_cli.estimation import distributed
    from ope_cli.estimation.distributed import DistributedError

    def failing(message, kind):
        def replicated(mesh):
            def gather(x):
                raise kind(message)

            return gather

        return replicated

    lost = "UNKNOWN: Gloo AllGather failed: Connection closed by peer"
    monkeypatch.setattr(jax, "process_count", lambda: 2)
    monkeypatch.setattr(distributed, "_replicated", failing(lost, jax.errors.JaxRuntimeError))
    with pytest.raises(DistributedError, match="another process stopped while this one") as error:
        distributed.allgather(np.zeros(3))
    assert error.value.exit_code == 5 and "Connection closed by peer" in str(error.value)
    # the CPU collectives raise the same as a ValueError too (it was an internal error)
    monkeypatch.setattr(distributed, "_replicated", failing(lost, ValueError))
    with pytest.raises(DistributedError, match="another process stopped while this one"):
        distributed.allgather(np.zeros(3))
    # a long runtime message is cut at a word, not mid-word ("to debug fu")
    long = lost + " Check the task logs for an earlier error" * 20
    monkeypatch.setattr(distributed, "_replicated", failing(long, ValueError))
    with pytest.raises(DistributedError) as error:
        distributed.allgather(np.zeros(3))
    said = str(error.value)
    assert said.endswith(" ...") and said.split()[-2] in long.split() and len(said) < 500
    # an error of this process's own (a bug, a shape) is not put down to a peer
    monkeypatch.setattr(distributed, "_replicated", failing("our own bug", TypeError))
    with pytest.raises(TypeError, match="our own bug"):
        distributed.allgather(np.zeros(3))
    other = failing("RESOURCE_EXHAUSTED: out of memory", jax.errors.JaxRuntimeError)
    monkeypatch.setattr(distributed, "_replicated", other)
    with pytest.raises(jax.errors.JaxRuntimeError, match="RESOURCE_EXHAUSTED"):
        distributed.allgather(np.zeros(3))
