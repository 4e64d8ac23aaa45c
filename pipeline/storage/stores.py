"""Writing canonical stores: rollout records as numbered JSON Lines (plain, gzip, zstd) or Parquet files
under a URL, what `pexec synth` and `pexec ingest` produce and `pipeline.storage.inputs` reads."""

from __future__ import annotations

import gzip
from collections.abc import Iterator

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from pipeline.errors import StorageError
from pipeline.storage.fs import open_for_write


def write_store(
    records: Iterator[dict],
    out: str,
    fmt: str = "jsonl",
    per_file: int = 50_000,
    compression: str | None = None,
    storage_options: dict | None = None,
) -> int:
    """Write records as numbered files under `out`; returns the number of records."""
    root = out.rstrip("/")
    count, part, batch = 0, 0, []
    for record in records:
        batch.append(record)
        count += 1
        if len(batch) == per_file:
            _write_file(root, part, batch, fmt, compression, storage_options)
            part, batch = part + 1, []
    if batch or count == 0:
        _write_file(root, part, batch, fmt, compression, storage_options)
    return count


def _write_file(
    root: str, part: int, batch: list[dict], fmt: str, compression: str | None, storage_options: dict | None
) -> None:
    try:
        if fmt == "parquet":
            with open_for_write(f"{root}/part-{part:05d}.parquet", storage_options) as f:
                pq.write_table(_to_arrow(batch), f, row_group_size=5000)
            return
        data = b"".join(orjson.dumps(r) + b"\n" for r in batch)
        if compression == "gzip":
            suffix, data = ".gz", gzip.compress(data)
        elif compression == "zstd":
            suffix, data = ".zst", zstandard.ZstdCompressor().compress(data)
        else:
            suffix = ""
        with open_for_write(f"{root}/part-{part:05d}.jsonl{suffix}", storage_options) as f:
            f.write(data)
    except OSError as exc:
        raise StorageError(f"cannot write store {root}: {exc}") from exc


def _to_arrow(batch: list[dict]) -> pa.Table:
    # Parquet keeps free-form JSON (env, arguments, outputs, truth) as JSON text.
    def event(e: dict) -> dict:
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
