"""Writing canonical stores: rollout records as numbered JSON Lines (plain, gzip, zstd) or Parquet files
under a URL, what `pexec synth` and `pexec ingest` produce and `pipeline.storage.inputs` reads.

A write never mixes with what was there by accident and never leaves half a store: into a non-empty folder
it is refused unless the caller overwrites (the old files go) or appends (new names that never collide).
Files are written under `OUT/.staging-<id>/` (skipped by store listings) and moved into place only once
every record is written (a rename on a local disk, copy + delete per object on object storage: each file
appears whole), so a failure mid-way leaves the old store as it was and no partial new one.
"""

from __future__ import annotations

import contextlib
import gzip
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from typing import Any, Literal

import orjson
import pyarrow.parquet as pq
import zstandard

from pipeline.core.arrow import pa
from pipeline.core.errors import StorageError, StoreExists
from pipeline.storage.fs import StorageOptions, filesystem, list_files, open_for_write
from pipeline.storage.inputs import classify

WriteMode = Literal["new", "overwrite", "append"]


def write_store(
    records: Iterable[Mapping[str, Any]],
    out: str,
    fmt: str = "jsonl",
    per_file: int = 50_000,
    compression: str | None = None,
    storage_options: StorageOptions | None = None,
    mode: WriteMode = "new",
) -> int:
    """Write records as numbered files under `out`; returns the number of records.

    `mode`: "new" refuses a non-empty `out`; "overwrite" replaces its files; "append" adds files named
    `part-<write id>-NNNNN` beside them (same format only).
    """
    root = out.rstrip("/")
    old = _existing(root, fmt, mode, storage_options)
    write_id = f"{datetime.now(UTC):%Y%m%dT%H%M%S%fZ}-{uuid.uuid4().hex[:6]}"  # sorts in write order
    staging = f"{root}/.staging-{write_id}"
    prefix = f"part-{write_id}-" if old and mode == "append" else "part-"
    count, part, names = 0, 0, []
    batch: list[Mapping[str, Any]] = []
    try:
        for record in records:
            batch.append(record)
            count += 1
            if len(batch) == per_file:
                names.append(_write_file(staging, f"{prefix}{part:05d}", batch, fmt, compression, storage_options))
                part, batch = part + 1, []
        if batch or count == 0:
            names.append(_write_file(staging, f"{prefix}{part:05d}", batch, fmt, compression, storage_options))
    except BaseException:  # any failure, Ctrl-C too: nothing of this write becomes visible
        _remove(staging, storage_options)
        raise
    _publish(staging, root, names, old if mode == "overwrite" else [], storage_options)
    return count


def _existing(root: str, fmt: str, mode: WriteMode, storage_options: StorageOptions | None) -> list[str]:
    """The visible files under `root` (URLs), after checking that `mode` allows writing there."""
    try:
        fs, path = filesystem(root, storage_options)
        if fs.isfile(path):
            raise StoreExists(f"{root} is a file; --out takes a folder")
        # What a reader of the store would see: hidden names (a crashed write's staging folder) do not count.
        files = list(list_files(root, storage_options) or {})
        if not files:
            return []
    except OSError as exc:
        if isinstance(exc, StorageError):
            raise
        raise StorageError(f"cannot list store {root}: {exc}") from exc
    if mode == "new":
        raise StoreExists(
            f"{root} already holds {len(files)} file(s) (e.g. {files[0]}): pass --overwrite to replace them "
            "or --append to add to them"
        )
    if mode == "append":
        other = [f for f in files if (kind := classify(f)) and kind[0] != fmt]
        if other:
            raise StoreExists(f"--append writes {fmt} but {root} holds files of another format (e.g. {other[0]})")
    return files


def _publish(
    staging: str, root: str, names: list[str], remove: list[str], storage_options: StorageOptions | None
) -> None:
    """Move the staged files into `root`, then remove the old files they did not replace."""
    fs, staged = filesystem(staging, storage_options)
    _, target = filesystem(root, storage_options)
    try:
        for name in names:
            fs.mv(f"{staged}/{name}", f"{target}/{name}")  # s3fs: server-side copy, then delete
        replaced = {f"{target}/{name}" for name in names}
        for url in remove:
            old_fs, path = filesystem(url, storage_options)
            if path not in replaced:
                old_fs.rm_file(path)
    except OSError as exc:
        raise StorageError(f"cannot publish store {root}: {exc}") from exc
    _remove(staging, storage_options)


def _remove(url: str, storage_options: StorageOptions | None) -> None:
    fs, path = filesystem(url, storage_options)
    with contextlib.suppress(OSError):  # cleaning up after a failure must not hide the failure
        if fs.exists(path):
            fs.rm(path, recursive=True)


def _write_file(
    folder: str,
    stem: str,
    batch: list[Mapping[str, Any]],
    fmt: str,
    compression: str | None,
    storage_options: StorageOptions | None,
) -> str:
    """Write one file of the store under `folder`; returns its name."""
    try:
        if fmt == "parquet":
            name = f"{stem}.parquet"
            with open_for_write(f"{folder}/{name}", storage_options) as f:
                pq.write_table(_to_arrow(batch), f, row_group_size=5000)
            return name
        data = b"".join(orjson.dumps(r) + b"\n" for r in batch)
        if compression == "gzip":
            suffix, data = ".gz", gzip.compress(data)
        elif compression == "zstd":
            suffix, data = ".zst", zstandard.ZstdCompressor().compress(data)
        else:
            suffix = ""
        name = f"{stem}.jsonl{suffix}"
        with open_for_write(f"{folder}/{name}", storage_options) as f:
            f.write(data)
        return name
    except OSError as exc:
        raise StorageError(f"cannot write store {folder.rsplit('/', 1)[0]}: {exc}") from exc


def _to_arrow(batch: list[Mapping[str, Any]]) -> pa.Table:
    # Parquet keeps free-form JSON (env, arguments, outputs, truth) as JSON text.
    def event(e: dict[str, Any]) -> dict[str, Any]:
        e = dict(e)
        for key in ("arguments", "output"):
            if key in e and not isinstance(e[key], str):
                e[key] = orjson.dumps(e[key]).decode()
        return e

    rows = [
        {
            **r,
            # Every row has both keys (Arrow takes the columns from the first row); no attributes: null.
            "attributes": r.get("attributes") or None,
            "status": r.get("status", "ok"),
            "env": orjson.dumps(r.get("env") or {}).decode(),  # optional in a canonical record, as truth is
            "truth": orjson.dumps(r.get("truth")).decode(),
            "events": [event(e) for e in r["events"]],
        }
        for r in batch
    ]
    return pa.Table.from_pylist(rows)
