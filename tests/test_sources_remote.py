"""Data and checkpoints in object storage (ope_cli/data/sources/remote.py): a real S3-compatible
server on 127.0.0.1 (moto's server mode) holds Parquet files, a directory with hive
partitions and a checkpoint, reached through AWS_ENDPOINT_URL. Files, directories and globs
resolve as locally, shares balance by the stored sizes, evaluate reads what it reads locally
(so the estimates are equal), and a missing bucket, a denied request or a refused connection
is an error naming it (in a real process: one line, quickly)."""

from __future__ import annotations

import logging
import os
import socket
import time
import urllib.request

import numpy as np
import pyarrow.fs as pafs
import pytest
from datasets import random_checkpoint, random_episodes, save_checkpoint, write_step_layout
from evaluation_inputs import assert_same_evaluation, data_error, evaluation_inputs

import ope_cli
from ope_cli.data.convert import ConvertConfig, convert
from ope_cli.data.sources import open_dataset, remote
from ope_cli.data.sources.files import resolve_files
from ope_cli.errors import PolicyError, UsageError
from ope_cli.estimation.distributed import share_files
from ope_cli.models.policies import load_policies

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


@pytest.mark.parametrize(
    "pattern",
    [
        "many/part-0000[!2].parquet",  # read as a regular expression: "! or 2"
        "many/part-0000[^2].parquet",  # in a glob, ^ is itself
        "many/*",  # not the hidden .part-0.crc (read on S3), the _SUCCESS file yes
        "many/.*",  # hidden files where the glob names them
        "**/*.parquet",
        "many/part-0000[0-1].parquet",
    ],
)
def test_globs_match_the_files_they_match_locally(s3, local, pattern):
    """A glob picks the same files at s3:// as on disk, as Python's glob reads it: with
    [!2] S3 read one file where the disk gave three (WIS 1.4635 against 1.4757, exit 0),
    and *.parquet read a hidden file's episodes too."""
    remote_files, _ = resolve_files(f"s3://{BUCKET}/{pattern}")
    local_files, _ = resolve_files(f"{local}/{pattern}")
    assert [f.split(f"s3://{BUCKET}/", 1)[1] for f in remote_files] == [
        os.path.relpath(f, local) for f in local_files
    ]


@pytest.mark.parametrize(
    ("pattern", "names"),
    [
        ("b/[!]]x", ["b/a]x", "b/ax", "b/]x"]),  # "]" first in a set is itself
        ("b/[]a]x", ["b/]x", "b/ax", "b/bx"]),
        ("b/[^2]", ["b/^", "b/2", "b/3"]),
        ("b/[a-c\\]", ["b/b", "b/d", "b/\\"]),
        ("b/[!-c]", ["b/b", "b/0", "b/-"]),  # "-" first is itself, not a range from "/"
        ("b/[!a]?", ["b/ab", "b/bb"]),  # (fnmatch lets ? match "/"; glob, per segment, not)
    ],
)
def test_glob_sets_read_as_fnmatch_reads_them(pattern, names):
    """Character sets of a glob at a URI as Python's glob (fnmatch) reads them."""
    import fnmatch

    regex = remote._glob_regex(pattern)
    for name in names:
        assert bool(regex.match(name)) == fnmatch.fnmatchcase(name, pattern), name


def test_truth_checks_a_checkpoint_at_a_uri_and_reads_a_truth_at_one(s3, local, tmp_path):
    """--truth matched an s3:// checkpoint by file name without comparing its sha256 (it
    compared local files only): another dataset's truth scored it, exit 0. A truth.json
    at an s3:// URI was read as a mangled local path ("s3:/logs/...")."""
    import hashlib
    import json

    from ope_cli.choosing.selection import read_truth

    policy = f"s3://{BUCKET}/pi.npz"
    digest = hashlib.sha256((local / "pi.npz").read_bytes()).hexdigest()

    def truth(sha: str) -> dict:
        return {"policies": [{"policy": "policies/pi.npz", "value": 1.5, "sha256": sha}]}

    with pytest.raises(UsageError, match="records another sha256"):
        read_truth(truth("0" * 64), [policy])
    assert read_truth(truth(digest), [policy]) == {policy: 1.5}
    filesystem = pafs.S3FileSystem(endpoint_override=s3, region="us-east-1")
    with filesystem.open_output_stream(f"{BUCKET}/truth.json") as out:
        out.write(json.dumps(truth(digest)).encode())
    assert read_truth(f"s3://{BUCKET}/truth.json", [policy]) == {policy: 1.5}
    with pytest.raises(UsageError, match=f"--truth s3://{BUCKET}/none.json: "):
        read_truth(f"s3://{BUCKET}/none.json", [policy])


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
def test_evaluate_reads_the_same_inputs_as_locally(s3, local, where):
    from_s3 = evaluation_inputs(f"s3://{BUCKET}/{where}", f"s3://{BUCKET}/pi.npz", read_rows=16)
    from_disk = evaluation_inputs(local / where, local / "pi.npz", read_rows=16)
    assert_same_evaluation(from_s3, from_disk)


def test_convert_reads_and_writes_object_storage(s3, local):
    out = f"s3://{BUCKET}/converted/steps.parquet"
    result = convert(ConvertConfig(f"s3://{BUCKET}/many", out, read_rows=16))
    assert result.to_dict()["files"] == 4
    first = evaluation_inputs(out, local / "pi.npz")
    second = evaluation_inputs(local / "many", local / "pi.npz")
    assert_same_evaluation(first, second)


def test_convert_to_object_storage_refuses_an_existing_file_and_leaves_no_partial_one(s3, local):
    """At an s3:// output, convert replaced an existing file without --overwrite, and a
    failed conversion left a truncated file that read as valid data (1,237 episodes of a
    larger source): an existing file is refused, and a failure leaves no file."""
    filesystem = pafs.S3FileSystem(endpoint_override=s3, region="us-east-1")
    out = f"s3://{BUCKET}/kept/steps.parquet"
    convert(ConvertConfig(f"s3://{BUCKET}/many", out))
    before = remote.read_bytes(out)
    with pytest.raises(UsageError, match="already exists"):
        convert(ConvertConfig(f"s3://{BUCKET}/one", out))
    assert remote.read_bytes(out) == before
    for name in ("a", "b"):  # the same episodes twice: refused when the second file comes
        pafs.copy_files(
            str(local / "one" / "steps.parquet"),
            f"{BUCKET}/twice/{name}.parquet",
            destination_filesystem=filesystem,
        )
    other = f"s3://{BUCKET}/kept/other.parquet"
    with pytest.raises(ope_cli.errors.DataError):
        convert(ConvertConfig(f"s3://{BUCKET}/twice", other, read_rows=4))
    # written as a multipart upload (any size; a move is one copy of at most 5 GiB on S3),
    # deleted when the conversion fails: --overwrite gives up the old file
    with pytest.raises(ope_cli.errors.DataError):
        convert(ConvertConfig(f"s3://{BUCKET}/twice", out, overwrite=True, read_rows=4))
    listed = filesystem.get_file_info(pafs.FileSelector(f"{BUCKET}/kept"))
    assert [info.base_name for info in listed if info.type == pafs.FileType.File] == []


def test_file_uris_are_local_paths(local):
    inspection = ope_cli.inspect(f"file://{local / 'many'}")
    assert inspection.ok  # ope inspect exits 0
    assert inspection.to_dict()["counts"]["episodes"] == 24


def test_inspect_reads_object_storage(s3):
    report = ope_cli.inspect(f"s3://{BUCKET}/many").to_dict()
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


def test_missing_bucket_and_key(s3):
    message = data_error(open_dataset, "s3://no-such-bucket/x.parquet")
    assert "bucket 'no-such-bucket' does not exist" in message, message
    assert "no such" in data_error(open_dataset, f"s3://{BUCKET}/nothing.parquet")
    glob = data_error(open_dataset, "s3://no-such-bucket/*.parquet")
    assert "bucket 'no-such-bucket' does not exist" in glob, glob


def test_a_uri_without_a_bucket_is_refused_not_listed(s3):
    """``s3://`` alone would list every bucket the credentials see, recursively; a glob in
    the bucket's name is not supported (it said "s3://: names no bucket")."""
    for uri in ("s3://", "s3:///"):
        message = data_error(open_dataset, uri)
        assert "names no bucket" in message, (uri, message)
    for uri in ("s3://*.parquet", f"s3://{BUCKET[:2]}*/one/steps.parquet"):
        message = data_error(open_dataset, uri)
        assert message.startswith(f"{uri}: a glob in the bucket's name is not supported"), message


def test_missing_checkpoint_is_a_policy_error(s3):
    with pytest.raises(PolicyError, match=r"missing\.npz"):  # ope exits 4
        load_policies([f"s3://{BUCKET}/missing.npz"])
    with pytest.raises(PolicyError, match=r"bucket 'no-such-bucket' does not exist"):
        load_policies(["s3://no-such-bucket/pi.npz"])


def test_unknown_scheme_is_a_usage_error():
    with pytest.raises(UsageError, match="'nosuch'"):  # ope exits 2
        open_dataset("nosuch://bucket/x.parquet")
    with pytest.raises(UsageError, match="'nosuch'"):
        load_policies(["nosuch://b/pi.npz"])


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow  # a process start: imports and JAX
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


def test_denied_access(s3):
    """With credential checks on, the test's keys are unknown and every request denied."""
    set_moto_auth(s3, "0")
    try:
        message = data_error(open_dataset, f"s3://{BUCKET}/many")
    finally:
        set_moto_auth(s3, "inf")
    assert f"s3://{BUCKET}/many" in message, message


def test_minari_datasets_in_object_storage_are_said_to_be_local_only(s3, monkeypatch):
    """A Minari dataset directory at a URI was "data/metadata.json: not a Parquet, Arrow
    IPC/Feather or HDF5 file", and MINARI_DATASETS_PATH=s3://... "no Minari dataset ...
    under s3:/logs/minari" (a slash lost): Minari datasets are read from a local disk."""
    filesystem = pafs.S3FileSystem(endpoint_override=s3, region="us-east-1")
    for name in ("data/metadata.json", "data/main_data.hdf5"):
        with filesystem.open_output_stream(f"{BUCKET}/minari/qa/ds-v0/{name}") as out:
            out.write(b"{}")
    message = data_error(open_dataset, f"s3://{BUCKET}/minari/qa/ds-v0")
    assert message == (
        f"s3://{BUCKET}/minari/qa/ds-v0: Minari datasets are read from a local disk only; "
        "copy it first"
    )
    monkeypatch.setenv("MINARI_DATASETS_PATH", f"s3://{BUCKET}/minari")
    message = data_error(open_dataset, "minari:qa/ds-v0")
    assert message.startswith(f"MINARI_DATASETS_PATH s3://{BUCKET}/minari: a local directory")
