"""Raw logs read where they lie (`pexec score SOURCE --format FMT`): a format's sources cut into shards, each
shard's rollouts read inside the task that scores it, and the hash shuffle of the formats whose rollouts span
files.

- A format whose `plan` cuts shards (files, byte ranges of line-delimited files, archive members; a
  `ShardedFormat` of pipeline.ingest.base) reads one at a time with `read_shard`; a part of a log that is not a
  rollout is a RecordError (a counted reject with its location), never the end of the run.
- A format whose `plan` is None is read one source per shard by its `read`: what it yields is kept, and an error
  ends that source with one reject naming it.
- A format with a `shuffle` (`Shuffle`) yields items (spans, events) from its planned shards instead of
  rollouts: the scoring driver partitions them by hash of their key in Ray tasks (pipeline.scoring.shuffle), and
  each partition's groups become rollouts here (`Shuffle.assemble`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from pipeline.core.errors import IngestError
from pipeline.core.model import Rollout
from pipeline.core.records import rollout_record
from pipeline.ingest import needs_sources, prepared
from pipeline.ingest.base import RECORD_ERRORS, IngestOptions, Item, LogFormat, Part, Shuffle, TypedPart
from pipeline.ingest.registry import get_format
from pipeline.storage.fs import list_files
from pipeline.storage.shards import InputFile, RecordError, Shard, fingerprint


@dataclass(frozen=True)
class RawSource:
    """The raw logs a run reads: format, sources, and the options its reader gets (checked, defaults filled)."""

    fmt: str
    sources: tuple[str, ...]
    options: IngestOptions
    allow_no_calls: bool = False

    def identity(self) -> list[Any]:
        """What about the reading decides a shard's output (never the storage credentials)."""
        o = self.options
        return [self.fmt, sorted(o.extra.items()), sorted(o.labels.items()), asdict(o.limits), self.allow_no_calls]

    @property
    def format(self) -> LogFormat:
        return get_format(self.fmt)

    @property
    def shuffle(self) -> Shuffle | None:
        return self.format.shuffle


def raw_source(fmt: str, sources: Sequence[str], options: IngestOptions) -> RawSource:
    """The raw source `fmt` over `sources`; unknown formats and options fail here, before any work."""
    log_format, checked, allow_no_calls = prepared(fmt, options)
    if not log_format.reads_files:  # its client reads a server, in one process
        raise IngestError(f"{fmt} is read from a server, not from files: `pexec ingest {fmt} … --out STORE`, then "
                          "score the store")  # fmt: skip
    needs_sources(fmt, log_format, sources)
    return RawSource(fmt, tuple(sources), checked, allow_no_calls)


def plan_raw(source: RawSource, target_bytes: int) -> list[Shard]:
    """The shards of the raw source, in source order: the format's own plan, else one shard per source. A file
    named twice, or named beside a folder that holds it, is read once: a shard planned twice would be scored twice,
    and the duplicate-id check would then take each of its rollouts for a later copy of itself."""
    shards = source.format.plan(source.sources, source.options, target_bytes)
    planned = [_whole_source(source, s) for s in source.sources] if shards is None else shards
    once: dict[str, Shard] = {}
    for shard in planned:
        once.setdefault(shard.key, shard)
    return list(once.values())


def read_raw(source: RawSource, shard: Shard) -> Iterator[Part]:
    """(location, canonical record or RecordError) for every rollout of one shard of a non-shuffled format."""
    for location, part in read_raw_rollouts(source, shard):
        yield location, rollout_record(part) if isinstance(part, Rollout) else part


def read_raw_rollouts(source: RawSource, shard: Shard) -> Iterator[TypedPart]:
    """`read_raw`, a rollout the format builds as the model's objects yielded as that `Rollout` (unchecked:
    `check_rollout`): what scoring and `pexec ingest` read."""
    fmt = source.format
    n = 0
    if shard.file.fmt != "source":
        parts = fmt.read_rollouts(shard, source.options)
        while True:
            try:
                location, record = next(parts)
            except StopIteration:
                return
            except IngestError as exc:  # the shard as a whole cannot be read (a damaged archive): one reject
                yield f"after part {n}", RecordError(f"{exc} (the rest of this shard is not read)", "")
                return
            n += 1
            yield location, record
    records = fmt.read([shard.file.url], source.options)
    while True:
        try:
            record = next(records)
        except StopIteration:
            return
        except RECORD_ERRORS as exc:
            # the format's own reader stopped: what it yielded is kept, the rest of the source is one reject
            reason = str(exc) if isinstance(exc, IngestError) else f"{source.fmt}: {type(exc).__name__}: {exc}"
            yield f"after record {n}", RecordError(f"{reason} (the rest of this source is not read)", "")
            return
        n += 1
        yield f"record {n}", record


def shuffle_items(source: RawSource, shard: Shard) -> Iterator[tuple[str, Item | RecordError]]:
    shuffle = source.shuffle
    assert shuffle is not None
    return shuffle.items(shard, source.options)


def _whole_source(source: RawSource, url: str) -> Shard:
    """One shard for a whole source (a file or folder) of a format read by its `read`; its fingerprint covers
    every file below it, so any change rescores it."""
    found = list_files(url, source.options.storage_options)
    if not found:
        raise IngestError(f"{source.fmt}: {url}: no such file or folder, or an empty folder")
    digest = hashlib.sha1()
    size = 0
    for file_url, info in found.items():
        file_size = int(info.get("size") or 0)
        size += file_size
        digest.update(f"{file_url}\n{fingerprint(file_size, info)}\n".encode())
    return Shard(InputFile(url, "source", None, size, f"{size}-{digest.hexdigest()[:12]}"), 0, None)
