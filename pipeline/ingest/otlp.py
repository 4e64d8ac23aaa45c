"""OTLP files as OpenTelemetry writes them -> the spans and GenAI log records the `otel` adapter reads.

What is read (docs/reference/log-formats.md, "OTLP files as the Collector writes them"), recognised by content:
- OTLP JSON: one `ExportTraceServiceRequest` / `ExportLogsServiceRequest` object per line (the Collector `file`
  exporter, the SDK's OTLP JSON file exporter, the S3 exporter's batching marshaler), or one object (or a list of
  them) per file (the S3 exporter's `otlp_json` objects, a pretty-printed export);
- OTLP protobuf: messages each preceded by its length as a 4-byte big-endian integer (the `file` exporter with
  `format: proto`), or one message per file (the S3 exporter's `otlp_proto` objects, `.binpb`);
- compression: a gzip or zstd file holding any of the above (zstd as the `file` exporter's native compression
  writes it, one stream or one frame per write), and the `file` exporter's default zstd: each message a zstd
  frame of its own behind its 4-byte length.

Everything streams: a file is read in chunks, one message (a line, a frame) at a time, each at most
`MAX_MESSAGE_BYTES` decompressed; a message that cannot be read is a `Malformed` item in the stream (its place
and a one-line reason) and reading goes on with the next. Metrics and profiles exports are skipped; of the log
records, only GenAI events (`gen_ai.*`) are kept, as only they carry a conversation's content.

Items are plain dicts, `signal` "span" or "log". A span: `trace_id`, `span_id` (hex), `name`, `start` (ns),
`attrs`, `resource`, `error`, `where`. A log record: `trace_id`, `span_id` (hex or ""), `time` (ns), `event`,
`attrs`, `body`, `resource`, `where`. `with_events` joins the content GenAI log records carry to their spans.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import io
import re
import zlib
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import orjson
import zstandard
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from pipeline.ingest._logs import text
from pipeline.ingest.registry import mismatch
from pipeline.storage.fs import StorageOptions, open_for_read
from pipeline.storage.inputs import over_items

MAX_MESSAGE_BYTES = 64 * 2**20  # one export message (a JSON line or document, a protobuf message), decompressed
# Spans (or log records) of one protobuf export message, counted from its framing before it is parsed: a span
# takes 2 bytes at least, and parsed each costs ~1 KiB (64 MiB of minimal spans parsed took 3.9 GB).
MAX_MESSAGE_ITEMS = 1_000_000
# Objects and lists of one OTLP/JSON export message, counted before it is decoded (a span is ~25 of them).
MAX_JSON_MESSAGE_ITEMS = 4 * MAX_MESSAGE_ITEMS
# What a folder of OTLP files is searched for (a file named directly is read whatever its name).
FILES = tuple(f"*{ext}{z}" for ext in (".json", ".jsonl", ".ndjson", ".binpb", ".pb") for z in ("", ".gz", ".zst"))

_CHUNK = 1 << 20
_ZSTD_PIECE = 1 << 10  # compressed bytes decompressed at a time (see _Zstd)
_GZIP = b"\x1f\x8b"
_ZSTD = b"\x28\xb5\x2f\xfd"
_ERROR_STATUS = {2, "2", "STATUS_CODE_ERROR", "ERROR"}
_HEX_ID = re.compile(r"[0-9a-fA-F]{16}|[0-9a-fA-F]{32}")
_BAD = (AttributeError, KeyError, TypeError, ValueError)  # what a malformed export raises while it is walked
_SKIPPED = ("resourceMetrics", "resourceProfiles")  # other signals an exporter may write beside spans and logs
_DETAILS = "gen_ai.client.inference.operation.details"  # the latest GenAI conventions' content event
_INPUT, _OUTPUT = "gen_ai.input.messages", "gen_ai.output.messages"


@dataclass(frozen=True)
class Malformed:
    """A message (or the rest of a file) that cannot be read: where it is and why, in one line."""

    where: str
    reason: str


Item = dict[str, Any] | Malformed


def records(url: str, storage_options: StorageOptions | None = None) -> Iterator[Item]:
    """The spans and GenAI log records of one OTLP file, one at a time, in file order."""
    try:
        with open_for_read(url, storage_options) as f:
            yield from _content(url, _Stream(f), url.rsplit("/", 1)[-1])
    except (OSError, EOFError, zlib.error) as exc:  # a gzip stream cut short or corrupt: the rest of the file is lost
        yield Malformed(url, f"cannot read: {exc}")
    except zstandard.ZstdError as exc:
        yield Malformed(url, f"not a valid zstd stream: {exc}")


class _Readable(Protocol):
    """What `_Stream` reads from: a file, a gzip or zstd decompressor."""

    def read(self, n: int, /) -> bytes: ...


class _Stream:
    """A byte stream read in chunks, with the bytes looked at but not yet consumed put back in front."""

    def __init__(self, f: _Readable) -> None:
        self._f = f
        self._pending = b""

    def peek(self, n: int) -> bytes:
        while len(self._pending) < n and (chunk := self._f.read(_CHUNK)):
            self._pending += chunk
        return self._pending[:n]

    def read(self, n: int) -> bytes:
        """Up to `n` bytes (fewer only at the end)."""
        parts, have = [self._pending[:n]], min(n, len(self._pending))
        self._pending = self._pending[n:]
        while have < n and (chunk := self._f.read(min(_CHUNK, n - have))):
            parts.append(chunk)
            have += len(chunk)
        return b"".join(parts)

    def seek(self, offset: int, /) -> int:
        """Never possible: a stream is read forward only (GzipFile, which reads one, asks only to rewind)."""
        raise io.UnsupportedOperation("a stream read as it comes cannot seek")

    def skip(self, n: int) -> int:
        """Drop `n` bytes without keeping them; how many there were."""
        done = 0
        while done < n and (chunk := self.read(min(_CHUNK, n - done))):
            done += len(chunk)
        return done

    def lines(self, limit: int) -> Iterator[bytes | None]:
        """Every line without its end; None for a line over `limit` bytes (its bytes are dropped as they come)."""
        parts: list[bytes] = []  # the start of the current line, from earlier chunks
        size, over = 0, False
        chunk, self._pending = self._pending, b""
        while True:
            start = 0
            while (end := chunk.find(b"\n", start)) >= 0:
                if over or size + end - start > limit:
                    yield None
                else:
                    yield b"".join([*parts, chunk[start:end]]) if parts else chunk[start:end]
                parts, size, over, start = [], 0, False, end + 1
            if start < len(chunk) and not over:
                size += len(chunk) - start
                over = size > limit
                parts = [] if over else [*parts, chunk[start:]]
            chunk = self._f.read(_CHUNK)
            if not chunk:
                if size or over:
                    yield None if over else b"".join(parts)
                return


def _content(url: str, stream: _Stream, name: str, depth: int = 0) -> Iterator[Item]:
    head = stream.peek(8)
    if not head:
        return
    framed = head[0] <= 0x08  # a big-endian length below 151 MiB (JSON starts with `{`, `[` or white space)
    binary = name.removesuffix(".gz").removesuffix(".zst").endswith((".binpb", ".pb"))
    if head.startswith((_GZIP, _ZSTD)) and depth == 0:  # a compressed file: what it holds, read as it comes
        inner = gzip.GzipFile(fileobj=stream, mode="rb") if head.startswith(_GZIP) else _Zstd(stream)
        yield from _content(url, _Stream(inner), name, depth + 1)
    elif framed:  # the file exporter's default zstd compresses each message into a frame of its own
        yield from _framed(url, stream, name, compressed=head[4:8] == _ZSTD)
    elif head[:1] == b"\x0a" and (binary or head.lstrip()[:1] not in (b"{", b"[")):
        # field 1 of an export request: one protobuf message, the whole file (a protobuf name settles `\n{`)
        data = stream.read(MAX_MESSAGE_BYTES + 1)
        if len(data) > MAX_MESSAGE_BYTES:
            yield Malformed(url, f"a protobuf message over {MAX_MESSAGE_BYTES} bytes")
        else:
            yield from _proto_message(data, url, name)
    elif head.lstrip()[:1] in (b"{", b"[") or head.strip() == b"":
        yield from _json_content(url, stream, name)
    else:
        yield Malformed(url, "not OTLP: neither JSON nor protobuf (plain, length-prefixed, gzip or zstd)")


class _Zstd:
    """A zstd stream of any number of frames, decompressed as it is read; input goes in small pieces, so that one
    piece can decompress to no more than about 32 MiB (a block of 4 bytes can stand for 128 KiB). A stream cut
    inside a frame is an error (zstandard's own readers end it silently)."""

    def __init__(self, source: _Stream) -> None:
        self._source = source
        self._frame: Any = None
        self._out, self._at = b"", 0  # the last piece's output and how much of it was read

    def read(self, n: int) -> bytes:
        parts, have = [], 0
        while have < n and (self._at < len(self._out) or self._fill()):
            piece = self._out[self._at : self._at + n - have]
            self._at += len(piece)
            parts.append(piece)
            have += len(piece)
        return b"".join(parts)

    def _fill(self) -> bool:
        """Decompress input until some output comes; False at the end of the input."""
        while True:
            data = self._source.read(_ZSTD_PIECE)
            if not data:
                if self._frame is not None and not self._frame.eof:
                    raise zstandard.ZstdError("the file ends inside a zstd frame")
                return False
            out = []
            while data:
                if self._frame is None or self._frame.eof:
                    self._frame = zstandard.ZstdDecompressor().decompressobj()
                out.append(self._frame.decompress(data))
                data = self._frame.unused_data if self._frame.eof else b""
            self._out, self._at = b"".join(out), 0
            if self._out:
                return True


def _framed(url: str, stream: _Stream, name: str, compressed: bool) -> Iterator[Item]:
    """Messages each behind its length (4 bytes, big-endian); `compressed`: each a zstd frame."""
    number = 0
    while size := stream.read(4):
        number += 1
        where = f"{url} message {number}"
        if len(size) < 4:
            yield Malformed(where, "the file ends inside a message's length")
            return
        length = int.from_bytes(size, "big")
        if length > MAX_MESSAGE_BYTES:
            yield Malformed(where, f"a message of {length} bytes, over the limit of {MAX_MESSAGE_BYTES}")
            if stream.skip(length) < length:
                return
            continue
        data = stream.read(length)
        if len(data) < length:
            yield Malformed(where, f"the file ends inside the message ({len(data)} of {length} bytes)")
            return
        if compressed:
            try:
                data = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data)).read(MAX_MESSAGE_BYTES + 1)
            except zstandard.ZstdError as exc:
                yield Malformed(where, f"not a zstd frame: {exc}")
                continue
            if len(data) > MAX_MESSAGE_BYTES:
                yield Malformed(where, f"a message over {MAX_MESSAGE_BYTES} bytes decompressed")
                continue
        if data.lstrip()[:1] == b"{":  # json format, compressed
            yield from _json_document(data, where)
        else:
            yield from _proto_message(data, where, name)


def _json_content(url: str, stream: _Stream, name: str) -> Iterator[Item]:
    """One export per line; a file whose first line is not a whole JSON value (pretty-printed) is one document."""
    lines = stream.lines(MAX_MESSAGE_BYTES)
    first = next(((n, line) for n, line in enumerate(lines, 1) if line is None or line.strip()), None)
    if first is None:
        return
    line_mode = name.removesuffix(".gz").removesuffix(".zst").endswith((".jsonl", ".ndjson"))
    if not line_mode and first[1] is not None:
        try:
            orjson.loads(first[1])
            line_mode = True
        except orjson.JSONDecodeError:
            pass
    if not line_mode:  # one document over several lines: it has to fit in one message
        parts: list[bytes] = []
        size = 0
        for _, line in _numbered(first, lines):
            size += MAX_MESSAGE_BYTES + 1 if line is None else len(line) + 1
            if line is None or size > MAX_MESSAGE_BYTES:  # None: a line over the limit
                yield Malformed(url, f"a JSON document over {MAX_MESSAGE_BYTES} bytes")
                return
            parts.append(line)
        yield from _json_document(b"\n".join(parts), url)
        return
    for number, line in _numbered(first, lines):
        where = f"{url} line {number}"
        if line is None:
            yield Malformed(where, f"a line over {MAX_MESSAGE_BYTES} bytes")
        elif line.strip():
            yield from _json_document(line, where)


def _numbered(first: tuple[int, bytes | None], rest: Iterable[bytes | None]) -> Iterator[tuple[int, bytes | None]]:
    yield first
    yield from enumerate(rest, first[0] + 1)


def _json_document(data: bytes, where: str) -> Iterator[Item]:
    if (items := over_items(data, MAX_JSON_MESSAGE_ITEMS)) is not None:
        yield Malformed(where, f"{items:,} objects and lists in one message, over the limit of "
                               f"{MAX_JSON_MESSAGE_ITEMS:,}")  # fmt: skip
        return
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        yield Malformed(where, f"not JSON: {exc}")
        return
    for i, export in enumerate(doc) if isinstance(doc, list) else [(None, doc)]:
        at = where if i is None else f"{where} [{i}]"
        if isinstance(export, dict) and isinstance(export.get("resourceSpans"), list):
            yield from _json_spans(export["resourceSpans"], at)
        elif isinstance(export, dict) and isinstance(export.get("resourceLogs"), list):
            yield from _json_logs(export["resourceLogs"], at)
        elif not (isinstance(export, dict) and any(k in export for k in _SKIPPED)):
            hint = mismatch("otel", export) or ""
            yield Malformed(at, f"not an OTLP JSON export (no 'resourceSpans' or 'resourceLogs' list){hint}")


def _json_spans(resource_spans: list[Any], where: str) -> Iterator[Item]:
    for r, rs in enumerate(resource_spans):
        at = f"{where} resourceSpans[{r}]"
        if not isinstance(rs, dict):
            yield Malformed(at, "not an object")
            continue
        try:
            resource = json_attributes((rs.get("resource") or {}).get("attributes"))
            for ss in rs.get("scopeSpans") or []:
                for span in ss.get("spans") or []:
                    yield _json_span(span, resource, at)
        except _BAD as exc:
            yield Malformed(at, f"not an OTLP span export: {exc!r}")


def _json_span(span: Any, resource: dict[str, Any], where: str) -> Item:
    if not isinstance(span, dict) or not span.get("traceId") or not span.get("spanId"):
        return Malformed(where, "a span needs 'traceId' and 'spanId'")
    at = f"{where} span {span['spanId']}"
    try:
        start = int(span.get("startTimeUnixNano") or 0)
    except (TypeError, ValueError):
        return Malformed(at, "startTimeUnixNano is not an integer")
    try:
        attrs = json_attributes(span.get("attributes"))
    except _BAD as exc:
        return Malformed(at, f"unreadable attributes: {exc!r}")
    status = (span.get("status") or {}).get("code")
    error = status in _ERROR_STATUS or attrs.get("error.type") is not None
    return _span(hex_id(span["traceId"]), hex_id(span["spanId"]), span.get("name"), start, attrs, resource, error, at)


def _span(
    trace: str,
    span: str,
    name: Any,
    start: int,
    attrs: dict[str, Any],
    resource: dict[str, Any],
    error: bool,
    where: str,
) -> dict[str, Any]:
    return {"signal": "span", "trace_id": trace, "span_id": span, "name": str(name or ""), "start": start,
            "attrs": attrs, "resource": resource, "error": error, "where": where}  # fmt: skip


def _json_logs(resource_logs: list[Any], where: str) -> Iterator[Item]:
    for r, rl in enumerate(resource_logs):
        at = f"{where} resourceLogs[{r}]"
        try:
            resource: dict[str, Any] | None = None
            for sl in rl.get("scopeLogs") or []:
                for n, lr in enumerate(sl.get("logRecords") or []):
                    attrs = json_attributes(lr.get("attributes"))
                    event = lr.get("eventName") or attrs.get("event.name") or ""
                    if not str(event).startswith("gen_ai."):
                        continue
                    if resource is None:
                        resource = json_attributes((rl.get("resource") or {}).get("attributes"))
                    time = int(lr.get("timeUnixNano") or 0) or int(lr.get("observedTimeUnixNano") or 0)
                    trace, span = hex_id(lr.get("traceId") or ""), hex_id(lr.get("spanId") or "")
                    body = json_value(lr.get("body"))
                    yield _log(trace, span, time, str(event), attrs, body, resource, f"{at} logRecords[{n}]")
        except _BAD as exc:
            yield Malformed(at, f"not an OTLP log export: {exc!r}")


def _log(
    trace: str, span: str, time: int, event: str, attrs: dict[str, Any], body: Any, resource: dict[str, Any], where: str
) -> dict[str, Any]:
    return {"signal": "log", "trace_id": trace, "span_id": span, "time": time, "event": event, "attrs": attrs,
            "body": body, "resource": resource, "where": where}  # fmt: skip


def hex_id(value: Any) -> str:
    """A trace or span id in hex (OTLP/JSON's form) when given in hex or as base64 of 8 or 16 bytes (protobuf's
    JSON mapping, e.g. `MessageToDict`)."""
    text = str(value)
    if _HEX_ID.fullmatch(text):
        return text.lower()
    try:
        raw = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return text
    return raw.hex() if len(raw) in (8, 16) else text


def json_attributes(items: Any) -> dict[str, Any]:
    if items is None:
        return {}
    if not isinstance(items, list):
        raise ValueError("'attributes' must be a list of {key, value}")
    return {a["key"]: json_value(a.get("value")) for a in items if isinstance(a, dict) and "key" in a}


def json_value(v: Any) -> Any:
    """An OTLP/JSON AnyValue as plain JSON."""
    if not isinstance(v, dict) or not v:
        return None
    kind, inner = next(iter(v.items()))
    if kind == "intValue":
        return int(inner)
    if kind == "arrayValue":
        return [json_value(x) for x in (inner or {}).get("values", [])]
    if kind == "kvlistValue":
        return {kv["key"]: json_value(kv.get("value")) for kv in (inner or {}).get("values", [])}
    return inner  # stringValue, boolValue, doubleValue, bytesValue (base64 text)


# --- protobuf ------------------------------------------------------------------------------------------


def _proto_message(data: bytes, where: str, name: str) -> Iterator[Item]:
    """One export request: spans when its spans carry well-formed ids, else log records (an exporter shared by
    the traces and logs pipelines writes both into one file; the bytes do not say which)."""
    if name.startswith("metrics_"):  # the S3 exporter's metrics objects
        return
    if len(data) > 2 * MAX_MESSAGE_ITEMS and (count := _items_over(data, MAX_MESSAGE_ITEMS)) is not None:
        yield Malformed(where, f"more than {count - 1:,} spans or log records in one message, over the limit of "
                               f"{MAX_MESSAGE_ITEMS:,}")  # fmt: skip
        return
    try:
        traces = ExportTraceServiceRequest.FromString(data)
        spans = [(rs, s) for rs in traces.resource_spans for ss in rs.scope_spans for s in ss.spans]
    except DecodeError:  # a logs message can be no valid traces message
        spans = []
    if spans and all(len(s.trace_id) == 16 and len(s.span_id) == 8 for _, s in spans):
        resources: dict[int, dict[str, Any]] = {}
        for rs, s in spans:
            if (resource := resources.get(id(rs))) is None:
                resource = resources[id(rs)] = _proto_resource(rs.resource)
            attrs = proto_attributes(s.attributes)
            error = s.status.code == 2 or attrs.get("error.type") is not None
            at = f"{where} span {s.span_id.hex()}"
            yield _span(s.trace_id.hex(), s.span_id.hex(), s.name, s.start_time_unix_nano, attrs, resource, error, at)
        return
    try:
        logs = ExportLogsServiceRequest.FromString(data)
    except DecodeError as exc:
        yield Malformed(where, f"not an OTLP protobuf export (traces or logs): {exc}")
        return
    for rl in logs.resource_logs:
        resource = None
        for sl in rl.scope_logs:
            for n, lr in enumerate(sl.log_records):
                attrs = proto_attributes(lr.attributes)
                event = lr.event_name or str(attrs.get("event.name") or "")
                if not event.startswith("gen_ai."):
                    continue
                resource = resource if resource is not None else _proto_resource(rl.resource)
                time = lr.time_unix_nano or lr.observed_time_unix_nano
                body = proto_value(lr.body) if lr.HasField("body") else None
                at = f"{where} log record {n}"
                yield _log(lr.trace_id.hex(), lr.span_id.hex(), time, event, attrs, body, resource, at)


def _items_over(data: bytes, limit: int) -> int | None:
    """limit + 1 when an export message holds more than `limit` spans (traces) or log records (logs: the same
    field numbers, 1 > 2 > 2), counted from its framing without parsing it; else None (framing it cannot follow
    is left to the parser)."""
    count = 0
    try:
        for resource in _fields(data, 0, len(data), 1):
            for scope in _fields(data, *resource, 2):
                for _ in _fields(data, *scope, 2):
                    count += 1
                    if count > limit:
                        return count
    except (IndexError, ValueError):
        return None
    return None


def _fields(data: bytes, start: int, end: int, number: int) -> Iterator[tuple[int, int]]:
    """(start, end) of each length-delimited field `number` of the protobuf message in data[start:end]."""
    i = start
    while i < end:
        key, i = _varint(data, i)
        kind = key & 7
        if kind == 0:
            _, i = _varint(data, i)
        elif kind == 1:
            i += 8
        elif kind == 5:
            i += 4
        elif kind == 2:
            size, i = _varint(data, i)
            if key >> 3 == number:
                yield i, i + size
            i += size
        else:
            raise ValueError(f"wire type {kind}")
        if i > end:
            raise ValueError("a field past the end of its message")


def _varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, i
        shift += 7
        if shift > 63:
            raise ValueError("a varint longer than 10 bytes")


_RESOURCES: dict[bytes, dict[str, Any]] = {}  # a process sends the same resource with every export
_RESOURCES_KEPT = 256


def _proto_resource(resource: Any) -> dict[str, Any]:
    key = resource.SerializeToString()
    if (attrs := _RESOURCES.get(key)) is None:
        if len(_RESOURCES) >= _RESOURCES_KEPT:
            _RESOURCES.clear()
        attrs = _RESOURCES[key] = proto_attributes(resource.attributes)
    return dict(attrs)  # each span its own copy: readers may change it


def proto_attributes(items: Iterable[Any]) -> dict[str, Any]:
    return {kv.key: proto_value(kv.value) for kv in items}


def proto_value(v: Any) -> Any:
    """An OTLP protobuf AnyValue as plain JSON (bytes as base64 text, as in OTLP/JSON)."""
    kind = v.WhichOneof("value")
    if kind == "string_value":
        return v.string_value
    if kind is None:
        return None
    if kind == "array_value":
        return [proto_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: proto_value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return base64.b64encode(v.bytes_value).decode()
    return getattr(v, kind)


# --- GenAI log records joined to their spans -----------------------------------------------------------


def with_events(spans: list[dict[str, Any]], events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`spans` with the content their GenAI log records carry: `gen_ai.input.messages` and
    `gen_ai.output.messages` (and the other attributes of a `gen_ai.client.inference.operation.details` event)
    where the span has none of its own. Events of a span that was not exported become a span of their own, at
    their first event's time. Events without a trace and span id cannot be placed and are left out."""
    by_span: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for event in events:
        if event["trace_id"] and event["span_id"]:
            by_span[(event["trace_id"], event["span_id"])].append(event)
    if not by_span:
        return spans
    out = []
    for sp in spans:
        group = by_span.pop((sp["trace_id"], sp["span_id"]), None)
        out.append(sp if group is None else sp | {"attrs": _content_of(group) | sp["attrs"]})
    for (trace, span), group in by_span.items():
        attrs = _content_of(group)
        first = min(group, key=lambda e: e["time"])
        name = attrs.get("gen_ai.operation.name") or "chat"
        out.append(_span(trace, span, name, first["time"], attrs, first["resource"], False, first["where"]))
    return out


def _content_of(group: list[dict[str, Any]]) -> dict[str, Any]:
    """The span attributes one span's GenAI events amount to: the latest conventions' details event as it is; the
    earlier conventions' per-message events (`gen_ai.{system,user,assistant,tool}.message`, `gen_ai.choice`, as
    openai-v2 emits without the semantic-convention opt-in) as the input and output messages they describe."""
    group = sorted(group, key=lambda e: e["time"])  # stable: events of one instant keep their order
    details = [e for e in group if e["event"] == _DETAILS]
    if details:
        return {k: v for e in reversed(details) for k, v in e["attrs"].items()}
    inputs, outputs = [], []
    for e in group:
        body = e["body"] if isinstance(e["body"], dict) else {}
        role = e["event"].removeprefix("gen_ai.").removesuffix(".message")
        if e["event"] == "gen_ai.choice":
            message = body.get("message")
            if not isinstance(message, dict):
                message = {}
            outputs.append((body.get("index") or 0, _legacy_message(message.get("role") or "assistant", message)))
        elif e["event"].endswith(".message") and role in ("system", "user", "assistant", "tool"):
            inputs.append(_legacy_message(role, body))
    content: dict[str, Any] = {}
    if inputs:
        content[_INPUT] = inputs
    if outputs:
        content[_OUTPUT] = [m for _, m in sorted(outputs, key=lambda o: o[0])]
    return content


def _legacy_message(role: str, body: dict[str, Any]) -> dict[str, Any]:
    """An earlier-conventions message body (chat-completions shaped) as a latest-conventions message."""
    parts: list[dict[str, Any]] = []
    said = text(body.get("content"))
    if role == "tool":
        if body.get("content") is not None:  # no content captured: the response is not known
            parts.append({"type": "tool_call_response", "id": body.get("id"), "response": said})
    elif said:
        parts.append({"type": "text", "content": said})
    for tc in body.get("tool_calls") or []:
        function = tc.get("function") if isinstance(tc, dict) else None
        if not isinstance(function, dict):
            function = {}
        if isinstance(tc, dict):
            parts.append({"type": "tool_call", "id": tc.get("id"), "name": function.get("name"),
                          "arguments": function.get("arguments")})  # fmt: skip
    return {"role": role, "parts": parts}
