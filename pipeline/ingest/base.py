"""The base class every log format derives from (`LogFormat`, and `ShardedFormat` for a format read in parallel),
its options schema, and what every adapter uses: the settings of one ingest (`IngestOptions`), its error
(`IngestError`), the listing of source files and the shuffle of items that lie in several files (`Shuffle`).

`pipeline.ingest.ingest` and the raw scoring path only talk to `LogFormat`, so adding a format never touches them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from pipeline.core.errors import IngestError
from pipeline.core.model import Rollout
from pipeline.core.records import MAX_DEPTH, decoded_too_deep, too_deep
from pipeline.storage import inputs
from pipeline.storage.fs import StorageOptions, list_files
from pipeline.storage.inputs import MAX_LINE_BYTES, MAX_RECORD_ITEMS, MAX_ROW_GROUP_BYTES, over_items
from pipeline.storage.shards import Compression, InputFile, RecordError, Shard, fingerprint

# Levels of objects and lists in one decoded log document: a record's own limit, with room for the format's
# wrapping; a deeper document is a reject before any of it is converted (conversions recurse).
MAX_DOCUMENT_DEPTH = 2 * MAX_DEPTH
_TOO_DEEP = f"nests deeper than {MAX_DOCUMENT_DEPTH} levels of objects and lists"
MAX_RECORD_BYTES = 64 * 2**20  # a JSON document read whole (a `.json` log file, a record of a partition)
MAX_MEMBER_BYTES = 256 * 2**20  # an archive member (an Inspect sample) decompressed
# An archive's members decompressed, all together: the time a small archive can cost (members declared over
# shared compressed data decompress it once each).
MAX_ARCHIVE_BYTES = 16 * 2**30
# Items (OTel spans and log records) one conversation of a shuffled format gathers; a larger group is one reject,
# its items never decoded.
MAX_CONVERSATION_ITEMS = 100_000


@dataclass(frozen=True)
class ReadLimits:
    """Limits checked while a source is read (`--option max_line_bytes=N`, ...): over one, the record is a
    counted reject with its location, and what is past the limit is counted, never held or decoded."""

    line_bytes: int = MAX_LINE_BYTES
    record_bytes: int = MAX_RECORD_BYTES
    member_bytes: int = MAX_MEMBER_BYTES
    record_items: int = MAX_RECORD_ITEMS  # objects and lists of one record, counted before it is decoded
    row_group_bytes: int = MAX_ROW_GROUP_BYTES  # a Parquet row group, decoded (by its footer)
    conversation_items: int = MAX_CONVERSATION_ITEMS  # items (spans, log records) a shuffle groups into one rollout
    archive_bytes: int = MAX_ARCHIVE_BYTES  # an archive's members decompressed, all together (CPU, not memory)


@dataclass(frozen=True)
class IngestOptions:
    labels: dict[str, str] = field(default_factory=dict)  # added to every record's labels (`--label k=v`)
    extra: dict[str, str] = field(default_factory=dict)  # format-specific settings (`--option k=v`)
    # the sources' filesystem settings (`--endpoint-url`, `--storage-option k=v`)
    storage_options: StorageOptions | None = field(default=None, repr=False)  # may hold credentials
    limits: ReadLimits = field(default_factory=ReadLimits)


# (location within the shard's file, a canonical record or why the part of the log there is not one)
Part = tuple[str, "dict[str, Any] | RecordError"]
# The same, where a format builds a rollout as the model's objects (unchecked: `check_rollout`)
TypedPart = tuple[str, "Rollout | dict[str, Any] | RecordError"]


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


# One item of a shuffled format: (key it is grouped by, (time, id) it is ordered by in its group, payload).
Item = tuple[str, tuple[int, str], dict[str, Any]]


@dataclass(frozen=True)
class Shuffle:
    """How a format's rollouts are assembled from items that may lie in any file.

    `items(shard, options)`: (location, Item or RecordError) for every item of a shard. `regroup(key, group)`,
    when given, is a second round: one first-key group becomes the (key, item) pairs it returns, each item with
    `start` and `span_id` to order it (OTel: spans and log records are grouped by trace, the records' content
    joins their spans, and a trace joins the conversation one of its spans names). `assemble(key, group,
    options)`: the canonical rollout of one final group, ordered; an IngestError makes it a reject.

    `rekey(payload)`, with `regroup`: what the second round needs to know of an item without decoding it, taken
    when it is first read: the key it names (None: none) and whether `regroup` must see it. A group none of whose
    items must be seen is rekeyed as `regroup` would do it, without decoding: every item takes the key named by
    the group's first item (in time, then id order) that names one, else keeps the group's key, and is otherwise
    unchanged (OTel: a trace without log records joins its earliest span's conversation)."""

    items: Callable[[Shard, IngestOptions], Iterator[tuple[str, Item | RecordError]]]
    assemble: Callable[[str, list[dict[str, Any]], IngestOptions], dict[str, Any]]
    regroup: Callable[[str, list[dict[str, Any]]], list[tuple[str, dict[str, Any]]]] | None = None
    rekey: Callable[[dict[str, Any]], tuple[str | None, bool]] | None = None


class LogFormat(ABC):
    """A log format: what `pexec ingest <name>` reads, and `pexec score --format <name>` reads where the logs lie.

    Every built-in format is a subclass, and its module exposes the instance (`FORMAT`); a package outside pexec
    names its instance in the entry-point group `pexec.ingest`. Only `name` and `read` must be given: each other
    member has the default stated here. A format read in parallel derives from `ShardedFormat` instead, which
    gives `read` from `plan` and `read_shard`.
    """

    @property
    @abstractmethod
    def name(self) -> str:
        """The name users type (`pexec ingest <name>`); an entry point's name must be this one."""

    @property
    def options(self) -> OptionSchema:
        """The `--option` keys it accepts, each an `Option(key, doc, default)`; `fields=True` adds `label.NAME=PATH`
        and `attr.NAME=PATH`. `pexec ingest` checks the given keys against it before `read` runs (an unknown key is
        an error), fills in the declared defaults and lists them with `--option help`. Default: no key of its own
        (the byte limits and `allow_no_calls`, common to every format, are handled by pexec)."""
        return OptionSchema()

    def resolve(self, extra: dict[str, str]) -> dict[str, str]:
        """The `--option` values as this run reads them, resolved once where it is planned (after the check against
        `options` and the defaults): what a value names that can change between runs (a folder of code the logs
        replay against) is pinned here, e.g. as an absolute path and a fingerprint of what it holds. The result is
        what `read` gets and part of the scoring settings, so a change to what an option names rescores the shards
        read with it. Default: as given."""
        return extra

    @property
    def reads_files(self) -> bool:
        """False for a format read from a server (a trace store) rather than from files: `read` then gets no
        sources, and `pexec score --format` refuses it (ingest it into a store first). Default: True."""
        return True

    @property
    def shuffle(self) -> Shuffle | None:
        """How rollouts whose records lie in several files are assembled: `plan`'s shards yield items (spans,
        events) that the scoring driver partitions by key in Ray tasks (pipeline.scoring.shuffle) before each
        group becomes a rollout. Default: None (every rollout lies in one shard)."""
        return None

    def looks_like(self, doc: Any) -> bool:
        """Whether `doc` (one decoded JSON document, or a conversation record) is clearly in this format: another
        format's reader given it names this one (`it looks like <name> logs: pexec ingest <name>`). False when
        unsure. Default: False (a format not read from JSON documents of its own claims none)."""
        return False

    @abstractmethod
    def read(self, sources: Sequence[str], options: IngestOptions) -> Iterator[dict[str, Any]]:
        """Canonical records (`pipeline/core/records.py`) from `sources`, local paths or fsspec URLs opened with
        `options.storage_options`; `options.extra` holds the `--option` values given, declared defaults filled in,
        `options.labels` the `--label`s to add to every record. An input it cannot read raises `IngestError`
        naming the file and the place."""

    def plan(self, sources: Sequence[str], options: IngestOptions, target_bytes: int) -> list[Shard] | None:
        """The shards `pexec score --format` reads in parallel (files, byte ranges of about `target_bytes` of
        line-delimited files, archive members), in source order, each read by `read_shard` (or into items by
        `shuffle`). Default: None, not cut: each source is read whole by `read`, one per task, and an error ends
        that source with one reject."""
        return None

    def read_shard(self, shard: Shard, options: IngestOptions) -> Iterator[Part]:
        """(location, canonical record or RecordError) for every rollout of one of `plan`'s shards, run inside a
        Ray task: a part of a log that is not a rollout is a RecordError (a counted reject), never the end of the
        run; an IngestError means the rest of the shard cannot be read. Default: none (only a format whose `plan`
        cuts shards, without a `shuffle`, is asked)."""
        raise NotImplementedError(f"{self.name}: plans no shards of rollouts")

    def read_rollouts(self, shard: Shard, options: IngestOptions) -> Iterator[TypedPart]:
        """`read_shard`'s parts, where a format that builds a rollout as the model's objects (pipeline.core.model)
        yields that `Rollout`, not yet checked (`check_rollout`), without a canonical record in between: what
        scoring reads, and `pexec ingest` writes as `rollout_record`. Default: `read_shard`'s records."""
        return iter(self.read_shard(shard, options))


class ShardedFormat(LogFormat):
    """A format read in parallel where its logs lie: it gives `plan` and `read_shard`, and its `read` (what
    `pexec ingest` uses) is every shard's records, whole files in source order, all or nothing: the first part
    that is not a record is an IngestError naming it."""

    @abstractmethod
    def plan(self, sources: Sequence[str], options: IngestOptions, target_bytes: int) -> list[Shard]: ...

    @abstractmethod
    def read_shard(self, shard: Shard, options: IngestOptions) -> Iterator[Part]: ...

    def read(self, sources: Sequence[str], options: IngestOptions) -> Iterator[dict[str, Any]]:
        for shard in self.plan(sources, options, 2**62):
            for location, record in self.read_shard(shard, options):
                if isinstance(record, RecordError):
                    raise IngestError(one_line(self.name, f"{shard.file.url} {location}".rstrip(), record.reason))
                yield record


def one_line(fmt: str, where: str, reason: str) -> str:
    """An error of a reader as one line naming the format and the place (a conversion's errors name it already)."""
    return reason if reason.startswith(f"{fmt}: {where}") or reason.startswith(f"{fmt}: /") or "://" in reason[:80] \
        else f"{fmt}: {where}: {reason.removeprefix(f'{fmt}: ')}"  # fmt: skip


# What converting one hostile log document can raise (a shape no adapter expected, a number past float range or
# Python's digit limit, nesting past the interpreter's recursion limit): that document's reject, never the run's end.
RECORD_ERRORS = (
    IngestError,
    ValueError,
    TypeError,
    KeyError,
    AttributeError,
    IndexError,
    ArithmeticError,
    RecursionError,
)


def record_error(fmt: str, where: str, exc: Exception, raw: str = "") -> RecordError:
    """One of RECORD_ERRORS raised while a document at `where` was converted, as its reject."""
    reason = str(exc) if isinstance(exc, IngestError) else f"{fmt}: {where}: {type(exc).__name__}: {exc}"
    return RecordError(reason, raw)


def decode_json(data: bytes, max_items: int = MAX_RECORD_ITEMS) -> Any:
    """One log document decoded, within the record limits: more than `max_items` objects and lists is refused
    before it is decoded, deeper than MAX_DOCUMENT_DEPTH after; an IngestError says why (without the place)."""
    # The objects and lists the text opens, at most: counted once (in C) for both limits, which `over_items` and
    # `decoded_too_deep` would each count again; only a text with more than a limit's worth is looked at further.
    opened = data.count(b"{") + data.count(b"[")
    if opened > max_items and (items := over_items(data, max_items)) is not None:
        raise IngestError(f"{items:,} objects and lists are over the limit of {max_items:,} (max_record_items)")
    try:
        value = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise IngestError(f"not JSON: {exc}") from None
    if opened > MAX_DOCUMENT_DEPTH and decoded_too_deep(data, value, MAX_DOCUMENT_DEPTH):
        raise IngestError(_TOO_DEEP)
    return value


def check_document(value: Any) -> Any:
    """`value`, a decoded log document, or an IngestError when it nests deeper than MAX_DOCUMENT_DEPTH levels."""
    if too_deep(value, MAX_DOCUMENT_DEPTH):
        raise IngestError(_TOO_DEEP)
    return value


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
        compression: Compression = "gzip" if lower.endswith(".gz") else "zstd" if lower.endswith(".zst") else None
        lines = lower.removesuffix(".gz").removesuffix(".zst").endswith((".jsonl", ".ndjson"))
        out.append(InputFile(url, "jsonl" if lines else "json", compression, size, fingerprint(size, info)))
    return out


def line_shards(
    files: Sequence[InputFile], target_bytes: int, storage_options: StorageOptions | None = None
) -> list[Shard]:
    """Shards of `files`: byte ranges of about `target_bytes` of a line-delimited file (of a compressed one, of
    its decompressed bytes), else whole files (a JSON document is read whole): pipeline.storage.inputs."""
    return inputs.line_shards(files, target_bytes, storage_options)


def read_document(fmt: str, url: str, options: IngestOptions) -> bytes:
    """A file read whole as one JSON document (a τ2 results file, a ToolSandbox run file), never past
    `max_record_bytes`: a larger file, or one of more than `max_record_items` objects and lists, is an IngestError
    naming the limit and the option that raises it."""
    from pipeline.storage.fs import open_for_read

    limit = options.limits.record_bytes
    with open_for_read(url, options.storage_options, compression="infer") as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise IngestError(f"{fmt}: {url}: over the limit of {limit:,} bytes (--option max_record_bytes=N raises it)")
    if (items := over_items(data, options.limits.record_items)) is not None:
        raise IngestError(f"{fmt}: {url}: {items:,} objects and lists are over the limit of "
                          f"{options.limits.record_items:,} (--option max_record_items=N raises it)")  # fmt: skip
    return data
