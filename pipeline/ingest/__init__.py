"""Ingest adapters: benchmark and production log formats -> canonical rollout records
(docs/explanation/data-model.md, "Canonical rollout").

A format is an instance of a `LogFormat` subclass (base.py), which states every member a format has: `name`,
the `--option` keys it accepts (`options`, an `OptionSchema` of `Option(key, doc, default)`), `looks_like(doc)`
(whether a decoded document is clearly its own, so that another format's reader given it names this one),
`read(sources, options) -> Iterator[dict[str, Any]]` yielding canonical records, and, with their defaults, `reads_files`
(False for a trace store read from a server), `plan`/`read_shard` (a `ShardedFormat` read in parallel) and
`shuffle` (rollouts whose items lie in several files). Nothing downstream knows the original format. Sources are
local paths or fsspec URLs, listed with `source_files` and opened with `options.storage_options`; an input that
cannot be read raises `IngestError` naming the file and the place. `ingest` checks the options against the schema
(one place, one message), fills in their declared defaults, and checks every record the format yields.

`pexec score --format` reads a format where its logs lie (pipeline/ingest/sharded.py): a format whose `plan` cuts
shards (files, byte ranges, archive members) has them read inside the scoring tasks by `read_shard`, a part of a
log that is not a rollout coming back as a RecordError (a reject); a format with a `shuffle` has its items
partitioned by key first (OTel spans); any other is read one source per task by `read`. The read limits
(`ReadLimits`: `max_line_bytes`, `max_record_bytes`, `max_member_bytes`, `max_record_items`,
`max_row_group_bytes`, `max_conversation_items`, `max_archive_bytes`, options of every format) are checked while
reading, before a record is decoded.

To add a format (docs/how-to/add-a-log-format.md):
- built in: a module `pipeline/ingest/<name>.py` whose `FORMAT` is an instance of its `LogFormat` subclass, and
  its name in `registry.BUILT_IN` (whose order is the order formats are asked whether a document is theirs);
  a reader that finds a document not in its format adds `registry.mismatch(name, doc)` to its error;
- outside pexec: a package whose `pyproject.toml` declares the instance in the entry-point group `pexec.ingest`:
  `[project.entry-points."pexec.ingest"] <name> = "module:object"`; `pexec ingest <name>` then reads it, and
  its `looks_like` is asked too (after the built-in formats) when another format's reader meets a stray file.

Imports: core, storage, envs.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from typing import Any

from pipeline.core.errors import IngestError, InvalidRecord
from pipeline.core.records import parse_rollout
from pipeline.ingest.base import (
    MAX_ARCHIVE_BYTES,
    MAX_CONVERSATION_ITEMS,
    MAX_MEMBER_BYTES,
    MAX_RECORD_BYTES,
    IngestOptions,
    LogFormat,
    Option,
    OptionSchema,
    ShardedFormat,
    source_files,
)
from pipeline.ingest.registry import formats, get_format
from pipeline.storage.inputs import MAX_LINE_BYTES, MAX_RECORD_ITEMS, MAX_ROW_GROUP_BYTES

__all__ = [
    "ALLOW_NO_CALLS",
    "IngestError",
    "IngestOptions",
    "LogFormat",
    "Option",
    "OptionSchema",
    "ShardedFormat",
    "accepted_options",
    "checked",
    "formats",
    "ingest",
    "prepared",
    "source_files",
]

ALLOW_NO_CALLS = "allow_no_calls"
_LIMITS = {
    "max_line_bytes": "line_bytes",
    "max_record_bytes": "record_bytes",
    "max_member_bytes": "member_bytes",
    "max_record_items": "record_items",
    "max_row_group_bytes": "row_group_bytes",
    "max_conversation_items": "conversation_items",
    "max_archive_bytes": "archive_bytes",
}
# The options of every format, handled here.
COMMON_OPTIONS = (
    Option(ALLOW_NO_CALLS, "true: keep sources in which no rollout has a tool call (else refused)", "false"),
    Option(
        "max_line_bytes", "bytes of one line of a line-delimited log; a longer line is a reject", str(MAX_LINE_BYTES)
    ),
    Option(
        "max_record_bytes",
        "bytes of a JSON document read whole (a `.json` log); larger is a reject",
        str(MAX_RECORD_BYTES),
    ),
    Option(
        "max_member_bytes",
        "decompressed bytes of an archive member (an Inspect sample); larger: a reject",
        str(MAX_MEMBER_BYTES),
    ),
    Option(
        "max_record_items",
        "objects and lists of one record (a line, a document, a Parquet row's list elements); more: a reject",
        str(MAX_RECORD_ITEMS),
    ),
    Option(
        "max_row_group_bytes",
        "decoded bytes of a Parquet row group (by its footer); larger: its rows are rejects, unread",
        str(MAX_ROW_GROUP_BYTES),
    ),
    Option(
        "max_conversation_items",
        "spans and log records gathered into one conversation (otel); more: the conversation is a reject",
        str(MAX_CONVERSATION_ITEMS),
    ),
    Option(
        "max_archive_bytes",
        "decompressed bytes of an archive's members together (an Inspect log); the members past it are rejects",
        str(MAX_ARCHIVE_BYTES),
    ),
)


def accepted_options(fmt: str) -> OptionSchema:
    """Every `--option` format `fmt` accepts: its own and the common ones (for `--option help` and the docs)."""
    schema = get_format(fmt).options
    return replace(schema, options=schema.options + COMMON_OPTIONS)


def prepared(fmt: str, options: IngestOptions | None = None) -> tuple[LogFormat, IngestOptions, bool]:
    """The format `fmt`, the options its reader gets (checked against its schema, its defaults filled in, the
    common options taken out: the byte limits into `limits`; then resolved by the format, `LogFormat.resolve`), and
    whether sources with no call are allowed."""
    log_format = get_format(fmt)
    options = options or IngestOptions()
    allowed = options.extra.get(ALLOW_NO_CALLS, "false").lower()
    if allowed not in ("true", "false"):
        raise IngestError(f"{fmt}: --option {ALLOW_NO_CALLS} takes true or false, got {allowed!r}")
    accepted = accepted_options(fmt)
    unknown = accepted.unknown(options.extra)
    if unknown:
        raise IngestError(f"{fmt}: unknown option(s) {', '.join(unknown)} (known: {', '.join(accepted.known())})")
    limits = {}
    for key, name in _LIMITS.items():
        if key in options.extra:
            value = options.extra[key]
            if not value.isdigit() or int(value) < 1:
                raise IngestError(f"{fmt}: --option {key} takes a number >= 1, got {value!r}")
            limits[name] = int(value)
    common = {ALLOW_NO_CALLS, *_LIMITS}
    extra = log_format.resolve(
        log_format.options.defaults() | {k: v for k, v in options.extra.items() if k not in common}
    )
    return log_format, replace(options, extra=extra, limits=replace(options.limits, **limits)), allowed == "true"


def ingest(fmt: str, sources: Sequence[str], options: IngestOptions | None = None) -> Iterator[dict[str, Any]]:
    """Canonical records from `sources` in format `fmt`; each is checked to be a scorable rollout.

    Rollouts with no tool call at all are held back until one with a call comes: sources that yield rollouts
    but not one call are most likely another format's logs, an error (nothing is written) unless
    `--option allow_no_calls=true` says the logs truly have none."""
    log_format, options, allowed = prepared(fmt, options)
    needs_sources(fmt, log_format, sources)
    yield from checked(fmt, log_format.read(sources, options), allowed)


def needs_sources(fmt: str, log_format: LogFormat, sources: Sequence[str]) -> None:
    """A format that reads files needs some; one read from a server (a trace store) takes none."""
    if not sources and log_format.reads_files:
        raise IngestError(f"{fmt}: give the files or folders to read")


def checked(
    fmt: str, records: Iterator[dict[str, Any]], allow_no_calls: bool, validate: bool = True
) -> Iterator[dict[str, Any]]:
    """`records`, each checked to be a scorable rollout (`validate`), held back until one has a tool call (see
    `ingest`)."""
    held: list[dict[str, Any]] = []
    calls_seen = allow_no_calls
    for record in records:
        if validate:
            try:
                parse_rollout(record)
            except InvalidRecord as exc:  # an adapter bug, not bad input: say which record
                rid = record.get("rollout_id")
                shown = (
                    repr(rid)[:200] if isinstance(rid, str | int | float | None) else f"of type {type(rid).__name__}"
                )
                raise IngestError(f"{fmt}: produced an invalid record {shown}: {exc}") from exc
        if not calls_seen:
            held.append(record)
            calls_seen = any(e.get("type") == "call" for e in record["events"])
            if not calls_seen:
                continue
            yield from held
            held.clear()
            continue
        yield record
    if held:
        raise IngestError(
            f"{fmt}: {len(held)} rollout(s) and not one tool call: are these {fmt} logs? "
            f"(logs that truly have no calls: --option {ALLOW_NO_CALLS}=true)"
        )
