"""`otel`: OpenTelemetry GenAI spans (OTLP JSON) -> canonical rollouts.

A source is a file or folder (searched recursively) of OTLP JSON exports (`.json`, or `.jsonl` with one
export per line), each `{"resourceSpans": [{"resource", "scopeSpans": [{"spans": [...]}]}]}`. All spans of
all sources are collected first, so spans may arrive in any order and any file. Mapping:
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
  once, at the first span that carried it); `tool_call` parts of `gen_ai.output.messages` with no
  `execute_tool` span -> calls with no result.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime
from functools import partial
from typing import Any

from pipeline.ingest import IngestError, IngestOptions, source_files
from pipeline.ingest._logs import LOG_FILES, call, documents, loads, message, rollout, settings, text
from pipeline.ingest._pairing import Call, Entry, Result, pair
from pipeline.ingest._sniff import mismatch

CONVERSATION = "gen_ai.conversation.id"
_ERROR_STATUS = {2, "2", "STATUS_CODE_ERROR", "ERROR"}


def read(sources: Sequence[str], options: IngestOptions) -> Iterator[dict]:
    labels = {"model": "gen_ai.request.model", "agent_version": "service.version"}
    s = settings("otel", options, labels=labels, id_field=CONVERSATION)
    spans = [span for source in sources for span in _spans(source, options)]
    for key, group in sorted(_conversations(spans).items()):
        group.sort(key=lambda sp: (sp["start"], sp["span_id"]))
        record = _record(group, key)
        yield rollout(s, record, _events(group), f"otel: conversation {key}")


def _spans(source: str, options: IngestOptions) -> Iterator[dict[str, Any]]:
    for url in source_files("otel", source, options, LOG_FILES):
        for where, doc in documents("otel", url, options):
            if not isinstance(doc, dict) or not isinstance(doc.get("resourceSpans"), list):
                hint = mismatch("otel", doc) or ""
                raise IngestError(f"otel: {where}: not an OTLP JSON export (no 'resourceSpans' list){hint}")
            for r, rs in enumerate(doc["resourceSpans"]):
                resource = _attributes((rs.get("resource") or {}).get("attributes"), f"{where} resourceSpans[{r}]")
                for ss in rs.get("scopeSpans") or []:
                    for span in ss.get("spans") or []:
                        yield _span(span, resource, f"{where} resourceSpans[{r}]")


def _span(span: Any, resource: dict[str, Any], where: str) -> dict[str, Any]:
    if not isinstance(span, dict) or not span.get("traceId") or not span.get("spanId"):
        raise IngestError(f"otel: {where}: a span needs 'traceId' and 'spanId'")
    at = f"{where} span {span['spanId']}"
    try:
        start = int(span.get("startTimeUnixNano") or 0)
    except (TypeError, ValueError) as exc:
        raise IngestError(f"otel: {at}: startTimeUnixNano is not an integer") from exc
    attrs = _attributes(span.get("attributes"), at)
    status = (span.get("status") or {}).get("code")
    return {
        "trace_id": span["traceId"],
        "span_id": span["spanId"],
        "name": str(span.get("name") or ""),
        "start": start,
        "attrs": attrs,
        "resource": resource,
        "error": status in _ERROR_STATUS or attrs.get("error.type") is not None,
        "where": at,
    }


def _attributes(items: Any, where: str) -> dict[str, Any]:
    if items is None:
        return {}
    if not isinstance(items, list):
        raise IngestError(f"otel: {where}: 'attributes' must be a list of {{key, value}}")
    return {a["key"]: _value(a.get("value")) for a in items if isinstance(a, dict) and "key" in a}


def _value(v: Any) -> Any:
    """An OTLP AnyValue as plain JSON."""
    if not isinstance(v, dict) or not v:
        return None
    kind, inner = next(iter(v.items()))
    if kind == "intValue":
        return int(inner)
    if kind == "arrayValue":
        return [_value(x) for x in (inner or {}).get("values", [])]
    if kind == "kvlistValue":
        return {kv["key"]: _value(kv.get("value")) for kv in (inner or {}).get("values", [])}
    return inner  # stringValue, boolValue, doubleValue, bytesValue


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
    return sp["attrs"].get("gen_ai.operation.name") == "execute_tool" or sp["name"].startswith("execute_tool")


def _events(group: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A `tool_call` part of a chat span's output is a request; the `execute_tool` span with its id answers the
    earliest unanswered one (`pipeline.ingest._pairing`) and is the call, at its own time; a request no span
    answers is a call with no result, at the chat span."""
    log: list[Entry] = []
    arguments: dict[int, Any] = {}  # position of a request -> its arguments
    turn = 0
    seen_messages: set[tuple[str, str]] = set()
    for sp in group:
        attrs = sp["attrs"]
        if _is_tool_span(sp):
            log.append(Result(attrs.get("gen_ai.tool.call.id"), sp, None, turn))
            continue
        for m in _messages(attrs.get("gen_ai.input.messages"), sp["where"]):
            said = text([p for p in m.get("parts") or [] if isinstance(p, dict) and p.get("type") == "text"])
            role = m.get("role")
            if role in ("user", "system") and said and (role, said) not in seen_messages:
                seen_messages.add((role, said))
                turn += role == "user"
                log.append(message(role, said, turn))
        for m in _messages(attrs.get("gen_ai.output.messages"), sp["where"]):
            for p in m.get("parts") or []:
                if isinstance(p, dict) and p.get("type") == "tool_call":
                    arguments[len(log)] = p.get("arguments")
                    build = partial(call, p.get("name"), p.get("arguments"), p.get("id"), turn, where=sp["where"])
                    log.append(Call(p.get("id"), build))
    answers = pair(log)
    requests = {r: c for c, r in answers.items()}
    out: list[dict[str, Any]] = []
    for position, entry in enumerate(log):
        if isinstance(entry, Call):
            if position not in answers:  # requested, never executed: a call with no result
                out.append(entry.build(None))
        elif isinstance(entry, Result):
            sp, attrs = entry.value, entry.value["attrs"]
            request = requests.get(position)
            args = attrs.get("gen_ai.tool.call.arguments", None if request is None else arguments[request])
            result = (attrs.get("gen_ai.tool.call.result"), sp["error"])
            out.append(call(attrs.get("gen_ai.tool.name"), args, entry.key, entry.turn, result, sp["where"]))
        else:
            out.append(entry)
    return out


def _messages(value: Any, where: str) -> list[dict[str, Any]]:
    if value is None:
        return []
    if isinstance(value, str):
        value = loads("otel", value.encode(), f"{where} gen_ai messages")
    if not isinstance(value, list):
        raise IngestError(f"otel: {where}: gen_ai messages must be a list")
    return [m for m in value if isinstance(m, dict)]
