"""Data and checkpoints in object storage (ope_cli/data/sources/remote.py): a real S3-compatible
server on 127.0.0.1 (moto's server mode) holds Parquet files, a directory with hive
partitions and a checkpoint, reached through AWS_ENDPOINT_URL. Files, directories and globs
resolve as locally, shares balance by the stored sizes, estimates equal the local ones, and
a missing bucket, a denied request or a refused connection ends in one line, quickly."""

from __future__ import annotations

import json
import logging
import os
import socket
import time
import urllib.request

import numpy as np
import pyarrow.fs as pafs
import pytest
from datasets import (
    assert_same_estimates,
    random_checkpoint,
    random_episodes,
    run_estimates,
    save_checkpoint,
    write_step_layout,
)

from ope_cli.data.sources import open_dataset, remote
from ope_cli.data.sources.files import resolve_files
from ope_cli.estimation.distributed import share_files

moto_server = pytest.importorskip("moto.server")

BUCKET = "logs"
ENV = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing"}


@pytest.fixture(scope="module")
def local(tmp_path_factory):
    """The data on a local disk: one file, a directory of 4 files with a hidden and an
    underscore file beside them, a directory of hive partitions, and a checkpoint."""
    folder = tmp_path_factory.mktemp("local")
    rng = np.random.default_rng(11)
    episodes = random_episodes(rng, 24, median_length=4, max_length=8)
    (folder / "one").mkdir()
    write_step_layout(episodes, folder / "one" / "steps.parquet")
    write_step_layout(episodes, folder / "many", n_files=4)
    (folder / "many" / "_SUCCESS").write_bytes(b"")
    (folder / "many" / ".part-0.crc").write_bytes(b"x")
    for day, part in (("1", episodes[:10]), ("2", episodes[10:])):
        (folder / "hive" / f"day={day}").mkdir(parents=True)
        write_step_layout(part, folder / "hive" / f"day={day}" / "part-0.parquet")
    save_checkpoint(folder / "pi.npz", random_checkpoint("linear_softmax", rng))
    return folder


@pytest.fixture(scope="module")
def s3(local):
    """A moto S3 server on a free port of 127.0.0.1 holding a copy of ``local`` in bucket
    ``logs``; the environment points pyarrow at it for the module's tests."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    with pytest.MonkeyPatch.context() as patch:
        for key, value in {**ENV, "AWS_ENDPOINT_URL": endpoint, "AWS_REGION": "us-east-1"}.items():
            patch.setenv(key, value)
        filesystem = pafs.S3FileSystem(
            endpoint_override=endpoint, allow_bucket_creation=True, region="us-east-1"
        )
        filesystem.create_dir(BUCKET)
        pafs.copy_files(str(local), BUCKET, destination_filesystem=filesystem)
        yield endpoint
    server.stop()


def test_files_directories_and_globs_resolve_as_locally(s3, local):
    assert resolve_files(f"s3://{BUCKET}/one/steps.parquet") == (
        [f"s3://{BUCKET}/one/steps.parquet"],
        None,
    )
    files, base = resolve_files(f"s3://{BUCKET}/many")
    local_files, _ = resolve_files(str(local / "many"))
    assert [f.rsplit("/", 1)[1] for f in files] == [f.rsplit("/", 1)[1] for f in local_files]
    assert base == f"s3://{BUCKET}/many"
    globbed, _ = resolve_files(f"s3://{BUCKET}/many/part-0000[12].parquet")
    assert globbed == files[1:3]
    everything, _ = resolve_files(f"s3://{BUCKET}/**/*.parquet")
    assert len(everything) == 1 + 4 + 2


def test_shares_balance_by_the_stored_sizes(s3, local):
    files, _ = resolve_files(f"s3://{BUCKET}/many")
    local_files, _ = resolve_files(str(local / "many"))
    assert remote.sizes(files) == [os.path.getsize(f) for f in local_files]
    for processes in (2, 3):
        for process in range(processes):
            mine = share_files(tuple(files), process, processes)
            theirs = share_files(tuple(local_files), process, processes)
            assert [f.rsplit("/", 1)[1] for f in mine] == [f.rsplit("/", 1)[1] for f in theirs]


def test_hive_partitions_are_columns(s3):
    data = open_dataset(f"s3://{BUCKET}/hive")
    assert "day" in data.schema.names
    restricted = data.restrict(data.files[1:])
    days = {b.batch.column("day")[0].as_py() for b in restricted.iter_batches(["day"], 1000)}
    assert days == {2}


@pytest.mark.parametrize("where", ["one/steps.parquet", "many", "many/part-*.parquet", "hive"])
def test_evaluate_gives_the_local_estimates(s3, local, ope_in_process, where):
    common = ["--format", "json", "--read-rows", "16"]
    from_s3 = ope_in_process(
        ["evaluate", f"s3://{BUCKET}/{where}", "--policy", f"s3://{BUCKET}/pi.npz", *common]
    )
    from_disk = ope_in_process(["evaluate", local / where, "--policy", local / "pi.npz", *common])
    assert_same_estimates(run_estimates(from_s3), run_estimates(from_disk))


def test_convert_reads_and_writes_object_storage(s3, local, ope_in_process, tmp_path):
    out = f"s3://{BUCKET}/converted/steps.parquet"
    run = ope_in_process(["convert", f"s3://{BUCKET}/many", out, "--read-rows", "16"])
    assert run.returncode == 0, run
    assert json.loads(run.stdout)["files"] == 4
    common = ["--format", "json", "--policy", local / "pi.npz"]
    first = run_estimates(ope_in_process(["evaluate", out, *common]))
    second = run_estimates(ope_in_process(["evaluate", local / "many", *common]))
    assert_same_estimates(first, second)


def test_file_uris_are_local_paths(local, ope_in_process):
    run = ope_in_process(["inspect", f"file://{local / 'many'}", "--format", "json"])
    assert run.returncode == 0, run
    assert json.loads(run.stdout)["counts"]["episodes"] == 24


def test_inspect_reads_object_storage(s3, ope_in_process):
    run = ope_in_process(["inspect", f"s3://{BUCKET}/many", "--format", "json"])
    assert run.returncode == 0, run
    report = json.loads(run.stdout)
    assert report["counts"]["episodes"] == 24
    assert report["valid"] is True


# ------------------------------------------------------------------------ bad inputs


def assert_one_line(run, code: int, *parts: str) -> None:
    assert run.returncode == code, run
    assert "Traceback" not in run.stderr, run
    lines = [line for line in run.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, run
    for part in parts:
        assert part in lines[0], run


def test_missing_bucket_and_key(s3, ope_in_process):
    run = ope_in_process(["evaluate", "s3://no-such-bucket/x.parquet"])
    assert_one_line(run, 3, "bucket 'no-such-bucket' does not exist")
    assert_one_line(ope_in_process(["evaluate", f"s3://{BUCKET}/nothing.parquet"]), 3, "no such")
    assert_one_line(ope_in_process(["evaluate", "s3://no-such-bucket/*.parquet"]), 3, "no-such")


def test_missing_checkpoint_is_exit_4(s3, ope_in_process):
    run = ope_in_process(
        ["evaluate", f"s3://{BUCKET}/many", "--policy", f"s3://{BUCKET}/missing.npz"]
    )
    assert_one_line(run, 4, "missing.npz")


def test_unknown_scheme_is_a_usage_error(ope_in_process, local):
    assert_one_line(ope_in_process(["evaluate", "nosuch://bucket/x.parquet"]), 2, "'nosuch'")
    run = ope_in_process(["evaluate", local / "many", "--policy", "nosuch://b/pi.npz"])
    assert_one_line(run, 2, "'nosuch'")


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_refused_connection_ends_quickly(ope):
    env = {**ENV, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{closed_port()}"}
    started = time.perf_counter()
    run = ope(["evaluate", f"s3://{BUCKET}/many"], env=env)  # the real entry point
    assert_one_line(run, 3, f"s3://{BUCKET}/many", "connect")
    assert run.stdout == ""
    assert time.perf_counter() - started < 60


def set_moto_auth(endpoint: str, free_requests: str) -> None:
    """Moto checks credentials after ``free_requests`` unauthenticated requests ("inf":
    never)."""
    request = urllib.request.Request(
        f"{endpoint}/moto-api/reset-auth",
        data=free_requests.encode(),
        method="POST",
        headers={"Content-Type": "text/plain"},
    )
    urllib.request.urlopen(request).close()


def test_denied_access(s3, ope_in_process):
    """With credential checks on, the test's keys are unknown and every request denied."""
    set_moto_auth(s3, "0")
    try:
        run = ope_in_process(["evaluate", f"s3://{BUCKET}/many"])
    finally:
        set_moto_auth(s3, "inf")
    assert_one_line(run, 3, f"s3://{BUCKET}/many")
