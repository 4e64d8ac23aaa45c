"""What input is read in: files as listed (`InputFile`, with the fingerprint that says whether one changed), the
shards a run cuts them into (`Shard`: a file's byte range, row groups, archive members or a shuffle's partitions,
each a task's unit of work), and what reading a shard yields for a part that is not a record (`RecordError`: a
reject, never a crash). The types every stage passes around; reading the bytes is pipeline.storage.inputs.

Imports: nothing of pipeline.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

# jsonl, parquet: a canonical store's files; the raw logs of `score --format` add json (a JSON document read
# whole), eval (an archive: shards are ranges of its members), source (a whole source read by its format) and
# partition (a partition of a shuffle, in the run's staging area)
Format = Literal["jsonl", "parquet", "json", "eval", "source", "partition"]
Compression = Literal[None, "gzip", "zstd"]

RAW_LIMIT = 2000  # characters of offending text kept in a RecordError
# Listing keys that change with the content, most specific first (S3/GCS checksums, then times).
_VERSION_KEYS = (
    "ETag",
    "etag",
    "md5Hash",
    "md5",
    "checksum",
    "crc32c",
    "generation",
    "mtime",
    "LastModified",
    "last_modified",
    "updated",
    "created",
)


@dataclass(frozen=True)
class RecordError:
    """One unreadable record (or the unreadable rest of a file): a reject, not a crash."""

    reason: str
    raw: str  # the offending text, at most RAW_LIMIT characters


@dataclass(frozen=True)
class InputFile:
    url: str  # full URL with protocol; a plain absolute path for the local filesystem
    fmt: Format
    compression: Compression
    size: int
    fingerprint: str  # "<size>-<hash of the content version>", or "<size>" when the fs reports no version


@dataclass(frozen=True)
class Shard:
    file: InputFile
    start: int  # plain JSONL: byte offset; Parquet: first row group; whole-file shards: 0
    stop: int | None  # exclusive byte offset / row group; None = to the end of the file
    # Records in the shard when planning knows them (Parquet footers; JSON Lines: None). Not part of its identity.
    rows: int | None = field(default=None, compare=False)

    @property
    def key(self) -> str:
        # The input version is left out on purpose: a rerun over a changed file must overwrite the same parts.
        ident = f"{self.file.url}\n{self.start}\n{'' if self.stop is None else self.stop}"
        return hashlib.sha1(ident.encode()).hexdigest()[:16]

    @property
    def whole_file(self) -> bool:
        return self.start == 0 and self.stop is None


Record = dict[str, Any] | RecordError


def fingerprint(size: int, info: dict[str, Any]) -> str:
    for key in _VERSION_KEYS:
        value = info.get(key)
        if value is None or value == "":
            continue
        if isinstance(value, datetime):  # some filesystems give a datetime in info() but a float in find()
            value = value.timestamp()
        return f"{size}-{hashlib.sha1(f'{key}={value}'.encode()).hexdigest()[:12]}"
    return str(size)
