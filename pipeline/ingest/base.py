"""The log-format protocol every ingest adapter implements, its options schema, and what every adapter uses:
the settings of one ingest (`IngestOptions`), its error (`IngestError`) and the listing of source files.

`pipeline.ingest.ingest` only talks to this protocol, so adding a format never touches it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from pipeline.core.errors import PexecError
from pipeline.storage.fs import list_files
from pipeline.storage.inputs import MAX_LINE_BYTES, InputFile, RecordError, Shard, fingerprint


class IngestError(PexecError, ValueError):
    """The sources cannot be read in this format; the message names the file and the place."""


MAX_RECORD_BYTES = 64 * 2**20  # a JSON document read whole (a `.json` log file, a record of a partition)
MAX_MEMBER_BYTES = 256 * 2**20  # an archive member (an Inspect sample) decompressed


@dataclass(frozen=True)
class ReadLimits:
    """Byte limits checked while a source is read (`--option max_line_bytes=N`, ...): over one, the record is a
    counted reject with its location, and the bytes past the limit are counted, never held."""

    line_bytes: int = MAX_LINE_BYTES
    record_bytes: int = MAX_RECORD_BYTES
    member_bytes: int = MAX_MEMBER_BYTES


@dataclass(frozen=True)
class IngestOptions:
    labels: dict[str, str] = field(default_factory=dict)  # added to every record's labels (`--label k=v`)
    extra: dict[str, str] = field(default_factory=dict)  # format-specific settings (`--option k=v`)
    # the sources' filesystem settings (`--endpoint-url`, `--storage-option k=v`)
    storage_options: dict[str, Any] | None = field(default=None, repr=False)  # may hold credentials
    limits: ReadLimits = field(default_factory=ReadLimits)


# (location within the shard's file, a canonical record or why the part of the log there is not one)
Part = tuple[str, "dict[str, Any] | RecordError"]


@dataclass(frozen=True)
class Option:
    """One `--option KEY=VALUE` a format accepts."""

    key: str
    doc: str  # one line: what the value is and what happens when the option is not given
    default: str | None = None  # the value `read` gets when the option is not given; None: left out


FIELD_PREFIXES = ("label.", "attr.")  # `label.NAME=PATH`, `attr.NAME=PATH`: one key per name the user picks
FIELD_OPTIONS = (
    Option("label.NAME", "condition label NAME from the field at dotted PATH"),
    Option("attr.NAME", "per-rollout attribute NAME from the field at dotted PATH"),
)


@dataclass(frozen=True)
class OptionSchema:
    """The `--option` keys a format accepts; `fields`: also `label.NAME=PATH` and `attr.NAME=PATH`."""

    options: tuple[Option, ...] = ()
    fields: bool = False

    def listed(self) -> tuple[Option, ...]:
        """Every option as the user writes it, in the order declared (`label.NAME`, `attr.NAME` last)."""
        return self.options + (FIELD_OPTIONS if self.fields else ())

    def unknown(self, given: Iterable[str]) -> list[str]:
        """The keys of `given` this schema does not accept, sorted."""
        keys = {o.key for o in self.options}
        return sorted(k for k in given if k not in keys and not (self.fields and k.startswith(FIELD_PREFIXES)))

    def known(self) -> list[str]:
        """The accepted keys for an error message: sorted, then `label.NAME`, `attr.NAME`."""
        return sorted(o.key for o in self.options) + [o.key for o in FIELD_OPTIONS if self.fields]

    def defaults(self) -> dict[str, str]:
        return {o.key: o.default for o in self.options if o.default is not None}


@runtime_checkable
class LogFormat(Protocol):
    """A log format `pexec ingest <name>` reads.

    `ingest` checks the `--option` keys against `options` before `read` runs (an unknown key is an error),
    and gives `read` the keys the user gave plus every declared default (`Option.default`); `allow_no_calls`
    is the ingest's own, never passed on. `read` yields canonical records (`pipeline/core/records.py`); an
    input it cannot read raises `IngestError` naming the file and the place.
    """

    name: str
    options: OptionSchema

    def looks_like(self, doc: Any) -> bool:
        """Whether `doc` (one decoded JSON document, or a conversation record) is clearly in this format:
        another format's reader given it names this one (`pexec ingest <name>`). False when unsure."""

    def read(self, sources: Sequence[str], options: IngestOptions) -> Iterator[dict]:
        """Canonical records from `sources` (local paths or fsspec URLs opened with `options.storage_options`)."""


@runtime_checkable
class ShardedFormat(Protocol):
    """A format read in parallel where its logs lie (`pexec score --format`): `plan` cuts the sources into
    shards (files, byte ranges of line-delimited files, archive members), and `read_shard`, run inside a Ray
    task, yields every rollout of one shard, or a RecordError for a part that is not one (a reject: it never
    stops the run). A format without these is read one source per task, by `read`."""

    def plan(self, sources: Sequence[str], options: IngestOptions, target_bytes: int) -> list[Shard]: ...

    def read_shard(self, shard: Shard, options: IngestOptions) -> Iterator[Part]: ...


def never(doc: Any) -> bool:
    """`looks_like` of a format that claims no document (it is not read from JSON documents)."""
    return False


@dataclass(frozen=True)
class Format:
    """A `LogFormat` made of functions: how the built-in formats declare themselves."""

    name: str
    read: Callable[[Sequence[str], IngestOptions], Iterator[dict]]
    options: OptionSchema = OptionSchema()
    looks_like: Callable[[Any], bool] = never
    plan: Callable[[Sequence[str], IngestOptions, int], list[Shard]] | None = None
    read_shard: Callable[[Shard, IngestOptions], Iterator[Part]] | None = None
    # records of one rollout may lie in several files: the rollouts are assembled by a hash shuffle
    # (pipeline.ingest.shuffle) instead of `read_shard`
    shuffle: Any = None
    # False for a format read from a server (a trace store), not from files: its `read` gets no sources.
    reads_files: bool = True


def source_files(
    fmt: str, source: str, options: IngestOptions, patterns: Sequence[str], max_depth: int | None = None
) -> list[str]:
    """The URLs of the files to read for `source`: the file itself, or the files of the folder matching
    `patterns` (at most `max_depth` levels down; see `pipeline.storage.fs.list_files`), sorted."""
    found = list_files(source, options.storage_options, patterns=patterns, max_depth=max_depth)
    if found is None:
        raise IngestError(f"{fmt}: {source}: no such file or folder")
    if not found:
        below = " or below" if max_depth is None else "" if max_depth == 1 else f" or {max_depth - 1} level(s) below"
        raise IngestError(f"{fmt}: {source}: no {' or '.join(patterns)} file in this folder{below}")
    return list(found)


def source_inputs(
    fmt: str, source: str, options: IngestOptions, patterns: Sequence[str], max_depth: int | None = None
) -> list[InputFile]:
    """`source_files` with each file's size and content fingerprint (what decides whether its shards are reused);
    `fmt` of each is `jsonl` for a line-delimited file (`.jsonl`, `.ndjson`, maybe compressed), else `json`."""
    found = list_files(source, options.storage_options, patterns=patterns, max_depth=max_depth)
    if not found:
        source_files(fmt, source, options, patterns, max_depth)  # raises the error that says what is missing
        return []
    out = []
    for url, info in found.items():
        size = int(info.get("size") or 0)
        lower = url.lower()
        compression = "gzip" if lower.endswith(".gz") else "zstd" if lower.endswith(".zst") else None
        lines = lower.removesuffix(".gz").removesuffix(".zst").endswith((".jsonl", ".ndjson"))
        out.append(InputFile(url, "jsonl" if lines else "json", compression, size, fingerprint(size, info)))
    return out


def line_shards(files: Sequence[InputFile], target_bytes: int) -> list[Shard]:
    """Shards of `files`: byte ranges of about `target_bytes` of a plain line-delimited file, else whole files
    (a compressed stream cannot seek; a JSON document is read whole)."""
    shards: list[Shard] = []
    for file in files:
        if file.fmt == "jsonl" and file.compression is None and file.size > target_bytes:
            shards += [Shard(file, a, min(a + target_bytes, file.size)) for a in range(0, file.size, target_bytes)]
        else:
            shards.append(Shard(file, 0, None))
    return shards


def read_document(fmt: str, url: str, options: IngestOptions) -> bytes:
    """A file read whole as one JSON document (a τ2 results file, a ToolSandbox run file), never past
    `max_record_bytes`: a larger file is an IngestError naming the limit and the option that raises it."""
    from pipeline.storage.fs import open_for_read

    limit = options.limits.record_bytes
    with open_for_read(url, options.storage_options, compression="infer") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise IngestError(f"{fmt}: {url}: over the limit of {limit:,} bytes (--option max_record_bytes=N raises it)")
    return data
