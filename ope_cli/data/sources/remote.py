"""Paths given as URIs (``s3://``, ``gs://``, ``hdfs://``, ``file://``), opened through
pyarrow's filesystems: listing files, directories and globs, reading heads, sizes and whole
small files (checkpoints).

Filesystems are made with ``pyarrow.fs.FileSystem.from_uri``, which takes credentials and
endpoints from the usual environment variables (``AWS_ENDPOINT_URL`` among them, which a
bare ``S3FileSystem()`` ignores). S3 filesystems are remade with bounded connect and
request timeouts and few retries, so that a refused connection or a missing bucket ends
in an error within seconds rather than after minutes of retries (GCS: retries for at most
GCS_RETRY_S seconds).
"""

from __future__ import annotations

import dataclasses
import datetime
import os
import re
import urllib.parse
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.fs as pafs

from ope_cli.errors import DataError, OpeError, UsageError, first_line

_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")
_MAGIC = re.compile(r"[*?[]")
S3_CONNECT_TIMEOUT_S = 5.0
S3_REQUEST_TIMEOUT_S = 30.0
S3_MAX_ATTEMPTS = 2  # the first try and one retry
GCS_RETRY_S = 15
KNOWN = "s3://, gs://, hdfs:// or file://"
_ERRORS = (OSError, pa.ArrowException)


def is_uri(text: str) -> bool:
    """Whether ``text`` is a URI (``scheme://...``) rather than a local path."""
    return bool(_URI.match(text))


def local_path(uri: str) -> str | None:
    """The local path of a ``file://`` URI (globs kept), None for other schemes."""
    if not uri.lower().startswith("file://"):
        return None
    return urllib.parse.unquote(uri[len("file://") :])


def on_disk(text: str) -> str | None:
    """The local path that ``text`` names: itself when it is no URI, a ``file://`` URI's
    path; None for another scheme (``s3://``, ``gs://``)."""
    return local_path(text) if is_uri(text) else text


@dataclasses.dataclass(frozen=True)
class Location:
    """Where a URI points: its filesystem, the path within it, and the text that precedes
    the path in the URI (``s3://``; ``hdfs://host:port``), so that ``prefix + path`` names
    any file of the same filesystem as a URI."""

    filesystem: pafs.FileSystem
    path: str
    prefix: str

    @property
    def is_local(self) -> bool:
        return isinstance(self.filesystem, pafs.LocalFileSystem)

    def uri(self, path: str) -> str:
        return self.prefix + path


# (prefix, the environment's credential and endpoint settings) -> filesystem
_OPENED: dict[tuple[str, tuple[tuple[str, str], ...]], pafs.FileSystem] = {}
_SETTINGS = ("AWS_", "GOOGLE_", "GCS_", "HADOOP_", "ARROW_")


def _settings() -> tuple[tuple[str, str], ...]:
    return tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith(_SETTINGS)))


def _bounded(filesystem: pafs.FileSystem) -> pafs.FileSystem:
    """An S3 or GCS filesystem remade with bounded timeouts and retries (its other options
    kept; GCS retries for 15 minutes by default); other filesystems as they are."""
    if isinstance(filesystem, pafs.GcsFileSystem):
        options = dict(filesystem.__reduce__()[1][0])
        if options.get("retry_time_limit") is None:
            options["retry_time_limit"] = datetime.timedelta(seconds=GCS_RETRY_S)
        return pafs.GcsFileSystem(**options)
    if not isinstance(filesystem, pafs.S3FileSystem):
        return filesystem
    options = dict(filesystem.__reduce__()[1][0])
    options.update(
        connect_timeout=S3_CONNECT_TIMEOUT_S,
        request_timeout=S3_REQUEST_TIMEOUT_S,
        retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=S3_MAX_ATTEMPTS),
    )
    return pafs.S3FileSystem(**options)


_BUCKETED = ("s3", "gs", "gcs")  # object storage: a URI's first path part is its bucket


def locate(uri: str, error: type[OpeError] = DataError) -> Location:
    """The filesystem and path of ``uri``. An unknown scheme is a UsageError (exit 2); an
    object-storage URI without a bucket (which would list every bucket) or a filesystem
    that cannot be made raises ``error``."""
    scheme = uri.split("://", 1)[0]
    if scheme.lower() in _BUCKETED and not uri.split("://", 1)[1].split("?", 1)[0].strip("/"):
        raise error(f"{uri}: names no bucket (write {scheme}://BUCKET/PATH)")
    try:
        filesystem, path = pafs.FileSystem.from_uri(uri)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as failure:
        if "Unrecognized filesystem type" in str(failure) or isinstance(
            failure, pa.ArrowNotImplementedError
        ):
            raise UsageError(
                f"{uri}: unknown URI scheme {scheme!r} (pyarrow opens {KNOWN})"
            ) from None
        raise error(f"{uri}: cannot open: {first_line(failure)}") from None
    except _ERRORS as failure:
        raise error(f"{uri}: cannot open: {first_line(failure)}") from None
    head = uri.split("?", 1)[0]
    at = head.find(path.rstrip("/")) if path.strip("/") else -1
    prefix = head[:at] if at >= 0 else f"{scheme}://"
    if isinstance(filesystem, pafs.LocalFileSystem):
        prefix = ""
    key = (prefix, _settings())
    if key not in _OPENED:
        _OPENED[key] = _bounded(filesystem)
    return Location(_OPENED[key], path, prefix)


def _glob_regex(pattern: str) -> re.Pattern:
    """A glob as Python's ``glob`` reads it on local files: ``*`` and ``?`` within one path
    segment, ``**`` across segments, ``[...]`` a set of characters (``[!...]`` its
    complement; ``^`` and ``\\`` in it are themselves), never ``/`` (``[!2]`` read as
    a regular expression's "! or 2" picked other files on S3 than on disk)."""
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[":
            start = i + 1 + pattern.startswith("!", i + 1)
            end = pattern.find("]", start + 1)  # a "]" first in the set is itself
            if end < 0:
                out.append(re.escape("["))
                i += 1
            else:
                chars = "".join(f"\\{c}" if c in "\\]^[" else c for c in pattern[start:end])
                negated = pattern[i + 1] == "!"
                out.append(f"(?!/)[^{chars}]" if negated else f"(?!/)[{chars}]")
                i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out) + r"\Z")


def _hidden_shown(pattern: str) -> bool:
    """Whether a glob names hidden entries itself (a segment starting with ``.``), as
    Python's ``glob`` requires to match them."""
    return any(part.startswith(".") for part in pattern.split("/"))


def _visible(path: str, base: str, hidden: tuple[str, ...] = (".", "_")) -> bool:
    """Whether no entry below ``base`` on ``path`` starts with one of ``hidden``: hidden and
    underscore-prefixed entries of a directory are metadata (as in pyarrow); a glob's ``*``
    skips hidden ones only (``hidden=(".",)``), as on local files (``*.parquet`` read
    ``.a.parquet`` too on S3)."""
    relative = path[len(base) :].lstrip("/")
    return not any(part.startswith(hidden) for part in relative.split("/"))


def _listing(location: Location, base: str) -> list[pafs.FileInfo]:
    selector = pafs.FileSelector(base, recursive=True)
    return location.filesystem.get_file_info(selector)


def resolve(source: str) -> tuple[list[str], str | None]:
    """(sorted data file URIs, the directory hive partitions are relative to or None) of a
    URI naming a file, a directory or a glob; raises DataError or UsageError."""
    magic = _MAGIC.search(source, source.find("://") + 3)
    if magic:  # the URI parser rejects glob characters: open the part before them
        static = source[: magic.start()].rsplit("/", 1)[0]
        if static.endswith(":/"):  # the glob is in the bucket's (or host's) name
            raise DataError(
                f"{source}: a glob in the bucket's name is not supported; name the bucket"
            )
        location = locate(static)
        base = location.path.rstrip("/")
        pattern = _glob_regex(f"{base}/{source[len(static) + 1 :]}")
        try:
            infos = _listing(location, base)
        except _ERRORS as failure:
            _refuse_missing_bucket(source, location)
            raise DataError(f"{source}: cannot list: {first_line(failure)}") from None
        shown = _hidden_shown(source[len(static) + 1 :])
        files = sorted(
            i.path
            for i in infos
            if i.type == pafs.FileType.File
            and pattern.match(i.path)
            and (shown or _visible(i.path, base, hidden=(".",)))
        )
        if not files:
            _refuse_missing_bucket(source, location)
            raise DataError(f"{source}: no files match this pattern")
        return [location.uri(f) for f in files], None
    location = locate(source)
    path = location.path
    try:
        info = location.filesystem.get_file_info(path)
        if info.type == pafs.FileType.File:
            return [location.uri(path)], None
        if info.type == pafs.FileType.Directory:
            base = path.rstrip("/")
            infos = _listing(location, base)
            files = sorted(
                i.path for i in infos if i.type == pafs.FileType.File and _visible(i.path, base)
            )
            if not files:
                raise DataError(f"{source}: directory holds no data files")
            return [location.uri(f) for f in files], location.uri(base)
    except _ERRORS as failure:
        raise DataError(f"{source}: cannot read: {first_line(failure)}") from None
    _refuse_missing_bucket(source, location)
    raise DataError(f"{source}: no such file or directory")


def _refuse_missing_bucket(uri: str, location: Location, error: type[OpeError] = DataError):
    """Raises ``error`` naming the bucket when ``location`` is in object storage and its
    bucket itself does not exist (or cannot be seen); returns otherwise."""
    if not isinstance(location.filesystem, (pafs.S3FileSystem, pafs.GcsFileSystem)):
        return
    bucket = location.path.split("/", 1)[0]
    try:
        missing = location.filesystem.get_file_info(bucket).type == pafs.FileType.NotFound
    except _ERRORS as failure:
        raise error(f"{uri}: cannot read: {first_line(failure)}") from None
    if missing:
        raise error(f"{uri}: bucket {bucket!r} does not exist (or these credentials cannot see it)")


def split(uris: Sequence[str]) -> tuple[pafs.FileSystem, str, list[str]]:
    """(filesystem, prefix, paths within it) of URIs of one filesystem."""
    location = locate(uris[0])
    paths = [u[len(location.prefix) :] if location.prefix else locate(u).path for u in uris]
    return location.filesystem, location.prefix, paths


def read_head(uri: str, size: int) -> bytes:
    """The first ``size`` bytes of the file at ``uri``; raises DataError."""
    location = locate(uri)
    try:
        with location.filesystem.open_input_file(location.path) as handle:
            return handle.read(size)
    except _ERRORS as failure:
        raise DataError(f"{uri}: cannot read file: {first_line(failure)}") from None


def read_bytes(uri: str, error: type[OpeError] = DataError) -> bytes:
    """The whole file at ``uri`` (a checkpoint); raises ``error``."""
    location = locate(uri, error)
    try:
        with location.filesystem.open_input_file(location.path) as handle:
            return handle.read()
    except FileNotFoundError:
        _refuse_missing_bucket(uri, location, error)
        raise error(f"{uri}: no such file") from None
    except _ERRORS as failure:
        raise error(f"{uri}: cannot read: {first_line(failure)}") from None


def sizes(uris: Sequence[str]) -> list[int]:
    """Bytes of each file at ``uris`` (one listing request per filesystem); DataError."""
    if not uris:
        return []
    filesystem, _, paths = split(uris)
    try:
        return [int(info.size or 0) for info in filesystem.get_file_info(paths)]
    except _ERRORS as failure:
        raise DataError(f"{uris[0]}: cannot read file sizes: {first_line(failure)}") from None


def glob_files(pattern: str, error: type[OpeError]) -> list[str]:
    """The file URIs matching a glob URI (checkpoints), sorted; raises ``error``."""
    try:
        files, _ = resolve(pattern)
    except DataError as failure:
        raise error(str(failure)) from None
    return files
