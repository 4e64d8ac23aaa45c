"""`otel`: OpenTelemetry GenAI spans and log records (OTLP) -> canonical rollouts.

A source is a file, a folder (searched recursively) or a glob of OTLP files as OpenTelemetry writes them: OTLP
JSON or protobuf, one export per line, per length-prefixed message or per file, plain, gzip or zstd
(`pipeline.ingest.otlp` reads them). Spans may arrive in any order and any file: `pexec ingest` collects all
spans first; `pexec score --format otel` partitions them (and the log records) by a hash of their trace id, then
of their conversation, in Ray tasks (`SHUFFLE`), so no task holds more than its partition. The content GenAI log
records carry (`gen_ai.*` events) joins the span they belong to, as its `gen_ai.input.messages` /
`gen_ai.output.messages` when the span has none (`otlp.with_events`). Mapping:
- rollouts: spans are grouped by `gen_ai.conversation.id` (a trace in which any span carries one joins that
  conversation), else by trace id; the record for ids/labels is the resource and span attributes (first
  value wins, in time order) plus `trace_id` and `date` (UTC day of the first span); default id field
  `gen_ai.conversation.id`, else the trace id; label `model` from `gen_ai.request.model`, `agent_version`
  from `service.version` unless configured;
- events are ordered by span start time (`startTimeUnixNano`), then by span id;
- `execute_tool` spans (`gen_ai.operation.name`, or a name starting with `execute_tool`) -> calls (each
  answers the earliest unanswered `tool_call` part with its id, `pipeline.ingest._pairing`):
  `gen_ai.tool.name`, `gen_ai.tool.call.id`, arguments from `gen_ai.tool.call.arguments` (else from the
  matching `tool_call` part of a chat span's output messages; else **not captured**: `arguments: null`,
  S and D unknown), output from `gen_ai.tool.call.result` when captured, `error` = span status ERROR or an
  `error.type` attribute;
- chat spans: user/system text parts of `gen_ai.input.messages` -> message events (each distinct message
  once, at the first span that carried it); `tool_call` parts of `gen_ai.output.messages` -> the calls'
  requests. In a conversation with no `execute_tool` span (an instrumented model client alone, such as
  `opentelemetry-instrumentation-openai-v2`), the `tool_call_response` parts of later input messages answer
  them (output = `response`, error not logged); each distinct response once, a response being the n-th with
  its id in a span's input messages. A request nothing answers is a call with no result.
- tool definitions: `gen_ai.tool.definitions` of any span (a chat span's request, or the `invoke_agent` span
  around the conversation) -> `env.tools`; a call is under the definitions the latest span before it that
  carried them recorded (a change within the conversation is a new version: `env.tool_versions`, the call's
  `tools_version`). No span carries them: no definitions (a spec's schemas, else only well-formedness);
- trace and span ids are kept as hex: OTLP/JSON writes them so, protobuf's JSON mapping of the same export
  (`MessageToDict`) as base64, which is turned into hex.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import Any

import orjson

from pipeline.core.errors import IngestError
from pipeline.core.records import EventRecord
from pipeline.ingest import otlp
from pipeline.ingest._logs import (
    ToolVersions,
    call,
    loads,
    log_options,
    message,
    rollout,
    settings,
    text,
    tool_definitions,
)
from pipeline.ingest._pairing import Call, Entry, Result, pair
from pipeline.ingest.base import IngestOptions, Item, LogFormat, Shuffle, source_files, source_inputs
from pipeline.storage.shards import RecordError, Shard

CONVERSATION = "gen_ai.conversation.id"


def assemble(key: str, group: list[dict[str, Any]], options: IngestOptions) -> dict[str, Any]:
    """The canonical rollout of one conversation: all its spans, in any order."""
    s = settings("otel", options, {"model": "gen_ai.request.model", "agent_version": "service.version"})
    group.sort(key=lambda sp: (sp["start"], sp["span_id"]))
    record = _record(group, key)
    versions = ToolVersions()
    events = _events(group, versions)
    orphans = sum(e["type"] == "message" and e["role"] == "tool" for e in events)
    attributes = {"orphan_results": str(orphans)} if orphans else {}
    return rollout(s, record, events, f"otel: conversation {key}", attributes, env=versions.env())


def _items(shard: Shard, options: IngestOptions) -> Iterator[tuple[str, Item | RecordError]]:
    """Every span and log record of a file as a shuffle item keyed by its trace id; what `otlp` cannot read is a
    RecordError at its place."""
    url = shard.file.url
    for item in otlp.records(url, options.storage_options):
        if isinstance(item, otlp.Malformed):
            yield item.where.removeprefix(url).strip(), RecordError(f"otel: {item.where}: {item.reason}", "")
        else:
            time = item["start"] if item["signal"] == "span" else item["time"]
            yield "", (item["trace_id"], (time, item["span_id"]), item)


def regroup(trace: str, items: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    """One trace's spans with the content of its log records, each keyed by the trace's conversation: the
    `gen_ai.conversation.id` of its earliest span that carries one (in time, then span id order), else the trace."""
    spans = otlp.with_events([i for i in items if i["signal"] != "log"], [i for i in items if i["signal"] == "log"])
    carrying = [sp for sp in spans if sp["attrs"].get(CONVERSATION) is not None]
    key = str(min(carrying, key=lambda sp: (sp["start"], sp["span_id"]))["attrs"][CONVERSATION]) if carrying else trace
    return [(key, sp) for sp in spans]


def rekey(item: dict[str, Any]) -> tuple[str | None, bool]:
    """The conversation a span names, and whether regrouping must see the item: a log record's content joins its
    span (and may name the conversation), so a trace with log records is regrouped in full."""
    if item["signal"] == "log":
        return None, True
    conversation = item["attrs"].get(CONVERSATION)
    return (None if conversation is None else str(conversation)), False


SHUFFLE = Shuffle(items=_items, assemble=assemble, regroup=regroup, rekey=rekey)


class OTel(LogFormat):
    name = "otel"
    options = log_options(id_field=CONVERSATION)
    shuffle = SHUFFLE

    def looks_like(self, doc: Any) -> bool:
        return isinstance(doc, dict) and ("resourceSpans" in doc or "resourceLogs" in doc)

    def read(self, sources: Sequence[str], options: IngestOptions) -> Iterator[dict[str, Any]]:
        """Every conversation of the sources, all spans held in this process (the `ingest` function)."""
        spans = _spans(sources, options)
        for key, group in sorted(_conversations(spans).items()):
            yield assemble(key, group, options)

    def plan(self, sources: Sequence[str], options: IngestOptions, target_bytes: int) -> list[Shard]:
        """One shard per OTLP file (a protobuf or compressed stream cannot be cut)."""
        return [Shard(f, 0, None) for source in sources for f in source_inputs("otel", source, options, otlp.FILES)]


FORMAT = OTel()


def _spans(sources: Sequence[str], options: IngestOptions) -> list[dict[str, Any]]:
    """Every span of `sources`, with the content its GenAI log records carry (`pipeline.ingest.otlp` reads the files
    as OpenTelemetry writes them and joins the records to their spans)."""
    spans: list[dict[str, Any]] = []
    events: list[dict[str, Any]] = []
    for source in sources:
        for url in source_files("otel", source, options, otlp.FILES):
            for item in otlp.records(url, options.storage_options):
                if isinstance(item, otlp.Malformed):
                    raise IngestError(f"otel: {item.where}: {item.reason}")
                (events if item["signal"] == "log" else spans).append(item)
    return otlp.with_events(spans, events)


def _conversations(spans: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    by_trace: dict[str, str] = {}
    for sp in sorted(spans, key=lambda sp: (sp["start"], sp["span_id"])):
        conv = sp["attrs"].get(CONVERSATION)
        if conv is not None and sp["trace_id"] not in by_trace:
            by_trace[sp["trace_id"]] = str(conv)
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for sp in spans:
        groups[by_trace.get(sp["trace_id"], sp["trace_id"])].append(sp)
    return groups


def _record(group: list[dict[str, Any]], key: str) -> dict[str, Any]:
    record: dict[str, Any] = {}
    for sp in group:
        for attrs in (sp["resource"], sp["attrs"]):
            for k, v in attrs.items():
                record.setdefault(k, v)
    day = datetime.fromtimestamp(group[0]["start"] / 1e9, UTC).date().isoformat()
    record.setdefault(CONVERSATION, key)
    return record | {"trace_id": group[0]["trace_id"], "date": day}


def _is_tool_span(sp: dict[str, Any]) -> bool:
    name: str = sp["name"]
    return sp["attrs"].get("gen_ai.operation.name") == "execute_tool" or name.startswith("execute_tool")


def _events(group: list[dict[str, Any]], versions: ToolVersions) -> list[EventRecord]:
    """A `tool_call` part of a chat span's output is a request; the `execute_tool` span with its id answers the
    earliest unanswered one (`pipeline.ingest._pairing`) and is the call, at its own time. Without tool spans, a
    `tool_call_response` part of a later chat span's input answers it and the call stays at its request. A
    request nothing answers is a call with no result, at the chat span. Each call is stamped with the tool
    definitions in force where it is logged (`versions`)."""
    log: list[Entry] = []
    version_at: dict[int, int] = {}  # position of a call or tool span -> the definitions' version in force
    arguments: dict[int, Any] = {}  # position of a request -> its arguments
    turn = 0
    seen_messages: set[tuple[str, str]] = set()
    seen_responses: set[tuple[Any, int, str]] = set()
    responses = not any(_is_tool_span(sp) for sp in group)  # else the tool spans are the results
    for sp in group:
        attrs = sp["attrs"]
        versions.given(tool_definitions(attrs.get("gen_ai.tool.definitions")))
        if _is_tool_span(sp):
            version_at[len(log)] = versions.current
            log.append(Result(attrs.get("gen_ai.tool.call.id"), sp, None, turn))
            continue
        nth: Counter[Any] = Counter()  # responses per id so far in this span's input
        for m in _messages(attrs.get("gen_ai.input.messages"), sp["where"]):
            parts = [p for p in m.get("parts") or [] if isinstance(p, dict)]
            said = text([p for p in parts if p.get("type") == "text"])
            role = m.get("role")
            if role in ("user", "system") and said and (role, said) not in seen_messages:
                seen_messages.add((role, said))
                turn += role == "user"
                log.append(message(role, said, turn))
            for p in parts:
                if p.get("type") != "tool_call_response":
                    continue
                key, response = p.get("id"), _response(p.get("response"))
                nth[key] += 1
                if responses and (key, nth[key], response) not in seen_responses:
                    seen_responses.add((key, nth[key], response))
                    log.append(Result(key, (response, None), response, turn))
        for m in _messages(attrs.get("gen_ai.output.messages"), sp["where"]):
            for p in m.get("parts") or []:
                if isinstance(p, dict) and p.get("type") == "tool_call":
                    arguments[len(log)] = p.get("arguments")
                    version_at[len(log)] = versions.current
                    build = partial(call, p.get("name"), p.get("arguments"), p.get("id"), turn, where=sp["where"])
                    log.append(Call(p.get("id"), build))
    answers = pair(log)
    requests = {r: c for c, r in answers.items()}
    out: list[EventRecord] = []
    for position, entry in enumerate(log):
        if isinstance(entry, Call):
            answer = log[answers[position]] if position in answers else None
            if not isinstance(answer, Result):  # requested, never answered: a call with no result
                out.append(versions.stamp(entry.build(None), version_at[position]))
            elif isinstance(answer.value, tuple):  # answered by a response message: the call stays at its request
                out.append(versions.stamp(entry.build(answer.value), version_at[position]))
            # else an execute_tool span answers it and is the call
        elif isinstance(entry, Result) and isinstance(entry.value, tuple):
            if position not in requests:  # a response that answers no request: an orphan
                out.append(message("tool", entry.content, entry.turn))
        elif isinstance(entry, Result):
            sp, attrs = entry.value, entry.value["attrs"]
            request = requests.get(position)
            args = attrs.get("gen_ai.tool.call.arguments", None if request is None else arguments[request])
            result = (attrs.get("gen_ai.tool.call.result"), sp["error"])
            event = call(attrs.get("gen_ai.tool.name"), args, entry.key, entry.turn, result, sp["where"])
            out.append(versions.stamp(event, version_at[position]))
        else:
            out.append(entry)
    return out


def _response(value: Any) -> str:
    return value if isinstance(value, str) else "" if value is None else orjson.dumps(value).decode()


def _messages(value: Any, where: str) -> list[dict[str, Any]]:
    if value is None:
        return []
    if isinstance(value, str):
        value = loads("otel", value.encode(), f"{where} gen_ai messages")
    if not isinstance(value, list):
        raise IngestError(f"otel: {where}: gen_ai messages must be a list")
    return [m for m in value if isinstance(m, dict)]
