"""`canonical`: canonical rollouts in any store format -> a new store (convert JSON Lines <-> Parquet,
recompress, add labels). Every record must already be a valid canonical rollout."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pipeline.core.errors import IngestError
from pipeline.ingest.base import IngestOptions, LogFormat
from pipeline.storage.inputs import list_inputs, plan_shards, read_shard
from pipeline.storage.shards import RecordError


class Canonical(LogFormat):
    name = "canonical"

    def read(self, sources: Sequence[str], options: IngestOptions) -> Iterator[dict[str, Any]]:
        storage = options.storage_options
        for source in sources:
            files, _ = list_inputs(source, storage)
            for shard in plan_shards(files, storage_options=storage):
                for location, record in read_shard(shard, storage):
                    if isinstance(record, RecordError):
                        raise IngestError(f"{shard.file.url} {location}: {record.reason}")
                    if options.labels:
                        record = {**record, "labels": {**(record.get("labels") or {}), **options.labels}}
                    yield record


FORMAT = Canonical()
