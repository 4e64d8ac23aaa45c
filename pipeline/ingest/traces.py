"""What the trace-store formats (mlflow, phoenix) share: a trace as the store's client gives it, reduced to the
few things a rollout needs, and the one order of its tool spans.

A trace is a rollout. Its tool spans are its calls, in the order of their start time (then span id): the order
`pexec publish` uses to put the verdict of step k back on the k-th tool span, so ingest and publish must agree
on it (`tool_spans`). Messages come from the model spans' input messages: each distinct user or system message
once, at the first model span that carried it; a user message starts a new turn. The tool definitions a model
span's request carried are the rollout's `env.tools`; a call is under those of the latest model span before it
(a change is a new version: `env.tool_versions`, the call's `tools_version`).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import orjson

from pipeline.core.errors import IngestError
from pipeline.core.records import EventRecord
from pipeline.ingest._logs import LogSettings, ToolVersions, call, message, rollout, text
from pipeline.ingest.base import Option

DEFAULT_MAX_TRACES = 100_000  # traces one ingest reads at most unless `--option max_traces` says otherwise
# The options every trace-store format takes besides the shared log options (`--since`/`--until` on the CLI).
WINDOW = (
    Option("since", "only traces that started at or after this UTC time (ISO 8601: 2026-12-01 or 2026-12-01T06:00)"),
    Option("until", "only traces that started before this UTC time (ISO 8601)"),
    Option(
        "max_traces", "refuse to read more traces than this (a bound on one ingest's memory)", str(DEFAULT_MAX_TRACES)
    ),
)
TRACE_ID = "trace_id"  # the attribute every rollout read from a trace store carries: its trace, for publish
KWARGS = "kwargs"  # the key a recorder puts a `**kwargs` tool's inputs under
MAX_SPANS = 10_000  # spans in one trace; more is an IngestError (a runaway agent loop, or not an agent trace)


@dataclass(frozen=True)
class TraceSpan:
    """One span, reduced. `kind`: `tool`, `model` (a chat or LLM call: its input messages are read) or `other`."""

    span_id: str
    name: str
    kind: str
    start_ns: int
    arguments: Any = None  # a tool span's input: an object, JSON text, or None when not captured
    output: Any = None  # a tool span's output; None when not captured
    error: bool = False
    error_message: str | None = None  # the store's status message or the exception's, when the span failed
    messages: tuple[Mapping[str, Any], ...] = ()  # a model span's input messages ({role, content})
    tools: dict[str, Any] | None = None  # the tool definitions a model span's request carried (name -> schema)
    kwargs_tools: frozenset[str] = frozenset()  # a model span's declared tools that have a parameter named kwargs


@dataclass(frozen=True)
class Trace:
    trace_id: str
    start_ns: int
    spans: tuple[TraceSpan, ...]
    fields: Mapping[str, Any] = field(default_factory=dict)  # what ids, labels and success are read from


def tool_spans(trace: Trace) -> list[TraceSpan]:
    """The trace's calls in depth order: its tool spans by start time, then span id."""
    return sorted((s for s in trace.spans if s.kind == "tool"), key=lambda s: (s.start_ns, s.span_id))


def parse_time(value: str | None, option: str, fmt: str) -> datetime | None:
    """`--since`/`--until` as an aware UTC datetime (a date alone is midnight UTC); None when not given."""
    if value in (None, ""):
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise IngestError(
            f"{fmt}: --{option} takes an ISO 8601 date or time (2026-12-01T06:00), got {value!r}"
        ) from None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def max_traces(s: LogSettings) -> int:
    raw = s.own.get("max_traces", "")
    if not raw.isdigit() or int(raw) < 1:
        raise IngestError(f"{s.fmt}: --option max_traces takes a positive integer, got {raw!r}")
    return int(raw)


def window(since: datetime | None, until: datetime | None) -> str:
    """The time window `--since`/`--until` select, as a reader would say it."""
    if since is None and until is None:
        return "at any time (no --since/--until)"
    parts = [f"at or after {since.isoformat()}"] if since else []
    parts += [f"before {until.isoformat()}"] if until else []
    return " and ".join(parts)


def check_found(traces: Sequence[Trace], where: str, since: datetime | None, until: datetime | None) -> None:
    """An IngestError when the window matched no trace: an empty store would read as a quiet night."""
    if not traces:
        raise IngestError(f"{where}: no trace started {window(since, until)}; nothing written")


def check_spans(fmt: str, trace_id: str, n: int) -> None:
    if n > MAX_SPANS:
        raise IngestError(f"{fmt}: trace {trace_id} has {n} spans, over the limit of {MAX_SPANS} per trace")


def records(s: LogSettings, traces: Sequence[Trace]) -> Iterator[dict[str, Any]]:
    """One canonical rollout per trace, in start order."""
    for trace in sorted(traces, key=lambda t: (t.start_ns, t.trace_id)):
        day = datetime.fromtimestamp(trace.start_ns / 1e9, UTC).date().isoformat()
        fields = {"date": day, **trace.fields, TRACE_ID: trace.trace_id}
        where = f"{s.fmt}: trace {trace.trace_id}"
        versions = ToolVersions()
        found = events(trace, versions)
        yield rollout(s, fields, found, where, {TRACE_ID: trace.trace_id}, env=versions.env())


def events(trace: Trace, versions: ToolVersions | None = None) -> list[EventRecord]:
    """The trace's events; `versions` collects the tool definitions of its model spans and stamps its calls."""
    versions = versions if versions is not None else ToolVersions()
    calls = {id(s) for s in tool_spans(trace)}
    keep = frozenset().union(*(s.kwargs_tools for s in trace.spans))
    out: list[EventRecord] = []
    seen: set[tuple[str, str]] = set()
    turn = 0
    for span in sorted(trace.spans, key=lambda s: (s.start_ns, s.span_id)):
        if span.kind == "model":
            versions.given(span.tools)
            for m in span.messages:
                role, said = m.get("role"), text(m.get("content"))
                if role in ("user", "system") and said and (role, said) not in seen:
                    seen.add((role, said))
                    turn += role == "user"
                    out.append(message(str(role), said, turn))
        elif id(span) in calls:
            output = span.output if span.output is not None or not span.error else span.error_message
            result = (_json_text(output), span.error)
            where = f"trace {trace.trace_id} span {span.span_id}"
            arguments = unwrapped(span.name, span.arguments, keep)
            out.append(versions.stamp(call(span.name, arguments, None, turn, result, where)))
    return out


def unwrapped(tool: str, arguments: Any, keep: frozenset[str] = frozenset()) -> Any:
    """A tool's arguments without its recorder's envelope. A tool declared `def tool(**kwargs)` and traced by
    MLflow's `@mlflow.trace` or OpenInference's decorators is recorded with its inputs under one key, `{"kwargs":
    {...}}`: the call's arguments are what is inside, unless the tool declares a parameter named `kwargs` itself
    (`keep`: such tools, read from the trace's model spans). Anything else is returned as it is."""
    value = arguments
    if isinstance(value, str) and value.lstrip().startswith("{"):  # OpenInference's input.value: JSON text
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError:
            return arguments
    if isinstance(value, dict) and list(value) == [KWARGS] and isinstance(value[KWARGS], dict) and tool not in keep:
        return value[KWARGS]
    return arguments


def kwargs_tools(tools: Any) -> frozenset[str]:
    """The tools of a model call's declared `tools` with a parameter named `kwargs`: OpenAI function entries
    (`{"type": "function", "function": {"name", "parameters"}}` or bare `{"name", "parameters"}`), or
    OpenInference's `llm.tools` entries (`{"tool": {"json_schema": "<that JSON as text>"}}`)."""
    found = set()
    for entry in tools if isinstance(tools, list) else []:
        if isinstance(entry, dict) and isinstance(entry.get("tool"), dict):
            schema = entry["tool"].get("json_schema")
            try:
                entry = orjson.loads(schema) if isinstance(schema, str) else schema
            except orjson.JSONDecodeError:
                continue
        fn = entry.get("function", entry) if isinstance(entry, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            continue
        params = fn.get("parameters")
        properties = params.get("properties") if isinstance(params, dict) else None
        if isinstance(properties, dict) and KWARGS in properties:
            found.add(fn["name"])
    return frozenset(found)


def _json_text(value: Any) -> Any:
    """A logged output as the canonical record keeps it: text as is, anything else as JSON text."""
    if value is None or isinstance(value, str):
        return value
    return orjson.dumps(value, default=str).decode()
