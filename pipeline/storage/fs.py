"""URLs to filesystems: the one place a URL and the storage options meet.

A URL is a local path or an fsspec URL (`s3://…`, `gs://…`, `memory://…`). Storage options (an endpoint,
credentials, any setting of the filesystem) come with every URL pexec reads or writes, sources and outputs
alike, so an S3-compatible store other than AWS works everywhere once `--endpoint-url` is given.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from fnmatch import fnmatchcase
from typing import IO, Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

_GLOB = re.compile(r"[*?\[]")

# fsspec's keyword arguments for a filesystem (an endpoint, credentials, any setting): each filesystem takes its own,
# so their values stay untyped.
StorageOptions = dict[str, Any]


def filesystem(url: str, storage_options: StorageOptions | None = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem serving `url`, built with `storage_options`, and the path of `url` on it."""
    found: tuple[fsspec.AbstractFileSystem, str] = fsspec.core.url_to_fs(url, **(storage_options or {}))
    return found


def absolute(url: str) -> str:
    """`url` with a local relative path made absolute against this process's working directory: a Ray worker (a
    cluster's above all) does not share it. An fsspec URL or an absolute path is returned as it is."""
    return url if "://" in url or os.path.isabs(url) else os.path.abspath(url)


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return isinstance(fs, LocalFileSystem)


def url_of(fs: fsspec.AbstractFileSystem, path: str) -> str:
    """The URL of a path of `fs`: a plain absolute path on the local disk, normalised (`a/../a/x` is `a/x`: one file,
    one name), else with its protocol."""
    return os.path.normpath(path) if is_local(fs) else fs.unstrip_protocol(path)


def exists(url: str, storage_options: StorageOptions | None = None) -> bool:
    fs, path = filesystem(url, storage_options)
    return bool(fs.exists(path))


def is_empty(url: str, storage_options: StorageOptions | None = None) -> bool:
    """True when nothing is at `url`, or it is a folder without files (an output may be written there without
    mixing with earlier contents)."""
    fs, path = filesystem(url, storage_options)
    if not fs.exists(path):
        return True
    return fs.isdir(path) and not fs.find(path)


def remove_all(url: str, storage_options: StorageOptions | None = None) -> None:
    """Remove whatever is at `url` (an output about to be overwritten); nothing there is fine."""
    fs, path = filesystem(url, storage_options)
    if fs.exists(path):
        fs.rm(path, recursive=True)


def list_files(
    url: str,
    storage_options: StorageOptions | None = None,
    *,
    patterns: Sequence[str] | None = None,
    max_depth: int | None = None,
) -> dict[str, dict[str, Any]] | None:
    """The files at `url` with their listing info, by URL (see `url_of`) in sorted order; None when nothing
    exists there.

    A file named directly is listed whatever its name. Under a folder: the files at most `max_depth` levels
    down (1: the folder's own files; None: all) whose name matches one of the glob `patterns` (None: any),
    except names starting with "." or "_" at any depth below `url`: they are metadata such as
    `_manifest.json` or `.git/`. A `url` with glob characters (`*`, `?`, `[`) names what it matches: each file
    as if named directly (but for such metadata names), each folder as above (e.g. `s3://logs/otel/year=2026/month=11/day=2[89]/`).
    """
    fs, root = filesystem(url, storage_options)
    if _GLOB.search(root) and not fs.exists(root):  # a path that exists as written is that path
        matched = fs.glob(root.rstrip("/"), detail=True)
        if not matched:
            return None
        found: dict[str, dict[str, Any]] = {}
        for path, info in matched.items():
            if info.get("type") == "directory":
                found |= _below(fs, path, patterns, max_depth)
            elif path.rsplit("/", 1)[-1][:1] not in (".", "_"):
                found[url_of(fs, path)] = info
        return dict(sorted(found.items()))
    if not fs.exists(root):
        return None
    if fs.isfile(root):
        return {url_of(fs, root): fs.info(root)}
    return dict(sorted(_below(fs, root, patterns, max_depth).items()))


def _below(
    fs: fsspec.AbstractFileSystem, root: str, patterns: Sequence[str] | None, max_depth: int | None
) -> dict[str, dict[str, Any]]:
    base = root.rstrip("/") + "/"
    found = {}
    for path, info in fs.find(root, maxdepth=max_depth, detail=True).items():
        parts = path.removeprefix(base).split("/")
        if info.get("type") == "directory" or any(part[:1] in (".", "_") for part in parts):
            continue
        if patterns is None or any(fnmatchcase(parts[-1], p) for p in patterns):
            found[url_of(fs, path)] = info
    return found


def open_for_read(url: str, storage_options: StorageOptions | None = None, compression: str | None = None) -> IO[bytes]:
    """Open `url` for reading bytes; `compression="infer"` decompresses by the name's suffix (.gz, .zst)."""
    fs, path = filesystem(url, storage_options)
    opened: IO[bytes] = fs.open(path, "rb", compression=compression)
    return opened


def open_for_write(url: str, storage_options: StorageOptions | None = None) -> IO[bytes]:
    """Open `url` for writing. Folders are made on local disks only: on an object store a missing bucket
    must be an error, never created behind the user's back."""
    fs, path = filesystem(url, storage_options)
    if is_local(fs):
        fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    opened: IO[bytes] = fs.open(path, "wb")
    return opened


@contextmanager
def open_whole(url: str, storage_options: StorageOptions | None = None) -> Iterator[IO[bytes]]:
    """Open `url` for a write that a reader sees whole or not at all: what the run folder holds (a part, a shard's
    marker, the plan, the manifest) is read by other processes while scoring writes it, and a write that fails
    must not leave a file that looks written.
    - On a local disk the bytes go to a hidden file beside `url` (listings skip names starting with a dot),
      renamed over it once closed, and removed if the write fails.
    - On an object store the object appears when the upload completes; a write that fails is abandoned: its
      multipart upload aborted (`discard`), and the file marked closed so that nothing uploads what was written."""
    fs, path = filesystem(url, storage_options)
    if is_local(fs):
        folder, name = path.rsplit("/", 1)
        os.makedirs(folder, exist_ok=True)
        temporary = f"{folder}/.{name}.{os.getpid()}.partial"
        try:
            with open(temporary, "wb") as f:
                yield f
            os.replace(temporary, path)
        finally:
            with suppress(FileNotFoundError):
                os.unlink(temporary)
        return
    remote: IO[bytes] = fs.open(path, "wb")
    try:
        yield remote
    except BaseException:
        _abandon(remote)
        raise
    remote.close()


def _abandon(f: IO[bytes]) -> None:
    discard = getattr(f, "discard", None)
    if callable(discard):
        with suppress(Exception):  # the store that failed the write may fail this too: the first error is the one
            discard()
    with suppress(AttributeError):  # fsspec's buffered files: closing (or collecting) one would upload its bytes
        f.closed = True  # type: ignore[misc]
