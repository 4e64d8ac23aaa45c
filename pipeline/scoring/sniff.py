"""Whether a store given without `--format` holds another format's raw logs: the first records of its first files
are asked what they look like (pipeline.ingest.registry.likely_format, the sniffer `pexec ingest` uses), so that
a forgotten `--format` is one line before anything is scored, never a run of rejects."""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import orjson

from pipeline.core.errors import InvalidRecord, ScoringFailed
from pipeline.core.records import parse_rollout
from pipeline.ingest.registry import likely_format
from pipeline.storage.fs import StorageOptions, filesystem
from pipeline.storage.inputs import read_shard
from pipeline.storage.shards import RecordError, Shard

SNIFF_FILES = 16  # input files whose first records are asked
SNIFF_RECORDS = 4  # records asked per file
SNIFF_DOCUMENT_BYTES = 16 * 2**20  # a `.json` file no line of which is a record is decoded whole up to this size


def refuse_other_formats(shards: Sequence[Shard], storage_options: StorageOptions | None = None) -> None:
    """A ScoringFailed (`these look like openai logs: add --format openai`) when a record among the first of the
    store's first files is no canonical rollout and clearly belongs to another known format; else nothing."""
    firsts = [s for s in shards if s.start == 0][:SNIFF_FILES]
    for shard in firsts:
        for where, doc in _documents(shard, storage_options):
            try:
                parse_rollout(doc)
                continue
            except InvalidRecord:
                pass
            fmt = likely_format(doc)
            if fmt is not None and fmt != "canonical":
                raise ScoringFailed(
                    f"these look like {fmt} logs: add --format {fmt} ({where} of {shard.file.url} is no canonical "
                    "rollout)"
                )


def _documents(shard: Shard, storage_options: StorageOptions | None) -> Iterator[tuple[str, dict[str, Any]]]:
    """(location, decoded record) of the shard's first records; a plain `.json` file none of whose first lines is
    a record (a pretty-printed document), decoded whole when it is small enough."""
    records = list(itertools.islice(read_shard(shard, storage_options), SNIFF_RECORDS))
    yield from ((at, r) for at, r in records if isinstance(r, dict))
    file = shard.file
    whole = file.url.endswith(".json") and file.compression is None and file.size <= SNIFF_DOCUMENT_BYTES
    if whole and records and all(isinstance(r, RecordError) for _, r in records):
        fs, path = filesystem(file.url, storage_options)
        with fs.open(path, "rb") as f:
            data = f.read(SNIFF_DOCUMENT_BYTES + 1)
        try:
            doc = orjson.loads(data)
        except orjson.JSONDecodeError:
            return
        if isinstance(doc, dict):
            yield "the whole file", doc
