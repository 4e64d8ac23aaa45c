"""`phoenix`: Arize Phoenix traces (OpenInference spans) -> canonical rollouts, read with Phoenix's own client
(extra `pexec[phoenix]`).

Not read from files: `--option endpoint=URL --option project=NAME` (on the CLI `--endpoint`, `--project`,
`--since`, `--until`) name the Phoenix server and the project (default `default`); every trace whose root span
started in the window is one rollout. Mapping:
- the rollout id is the trace id (default `id_field` `trace_id`), kept too as the attribute `trace_id`, which
  `pexec publish phoenix` uses to find the trace again; the fields ids, labels and success are read from are the
  root span's attributes (`session.id`, `user.id`, `metadata`...), the model span's `llm.model_name` (label
  `model`) and `date` (UTC day the trace started);
- spans of kind `TOOL` are the calls, in start order: tool = `tool.name` (else the span's name), arguments =
  `input.value` (JSON text kept as is; not captured: null), output = `output.value`, `error` = status ERROR
  (then the output, when none was recorded, is the exception event's message, else the status message);
- spans of kind `LLM`: the user and system messages of `llm.input_messages` are message events; the tools of
  `llm.tools` (each `tool.json_schema`, the request's tool as JSON text) are the definitions S is checked
  against when no spec declares the tool (`env.tools`; see `pipeline.ingest.traces` for versions). No LLM span
  carries them: no definitions (a spec's schemas, else only well-formedness).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from typing import Any

import orjson

from pipeline.core.errors import IngestError
from pipeline.ingest._logs import log_options, settings, tool_definitions
from pipeline.ingest.base import IngestOptions, LogFormat, Option
from pipeline.ingest.traces import (
    WINDOW,
    Trace,
    TraceSpan,
    check_found,
    check_spans,
    kwargs_tools,
    max_traces,
    parse_time,
    records,
)

EXTRA = "pip install 'pexec[phoenix]'"
TIMEOUT_S = 30  # longest one request to the Phoenix server may take
TRACES_PER_REQUEST = 50  # traces whose spans one request asks for
MAX_BATCH_SPANS = 50_000  # spans of one request's traces; more is an IngestError (MAX_SPANS bounds each trace)


class Phoenix(LogFormat):
    name = "phoenix"
    options = log_options(
        Option("endpoint", "the Phoenix server's URL (`--endpoint`; http://HOST:PORT)"),
        Option("project", "the Phoenix project whose traces are read (`--project`)", "default"),
        *WINDOW,
        id_field="trace_id",
    )
    reads_files = False

    def read(self, sources: Sequence[str], options: IngestOptions) -> Iterator[dict[str, Any]]:
        s = settings("phoenix", options)
        if sources:
            raise IngestError("phoenix: reads from a Phoenix server (--endpoint, --project), not from files")
        endpoint, project = s.own.get("endpoint"), s.own["project"]
        if not endpoint:
            raise IngestError("phoenix: give the Phoenix server: --endpoint URL (and --project NAME)")
        since, until = (
            parse_time(s.own.get("since"), "since", "phoenix"),
            parse_time(s.own.get("until"), "until", "phoenix"),
        )
        c = client(endpoint)
        import httpx

        try:
            found = list(traces(c, project, since, until, max_traces(s)))
        except httpx.HTTPError as exc:  # an unreachable server, an unknown project
            raise IngestError(f"phoenix: {endpoint}: project {project!r}: {exc}") from exc
        check_found(found, f"phoenix: project {project!r} at {endpoint}", since, until)
        yield from records(s, found)


FORMAT = Phoenix()


def client(endpoint: str, http: Any = None) -> Any:
    """Phoenix's own client for the server at `endpoint` (an IngestError naming the extra when not installed);
    `http`: the httpx client it is to use."""
    try:
        from phoenix.client import Client
    except ImportError as exc:
        raise IngestError(f"phoenix: the Phoenix client is not installed ({EXTRA})") from exc
    return Client(base_url=endpoint, http_client=http)


def traces(
    c: Any, project: str, since: datetime | None, until: datetime | None, limit: int, ids: Sequence[str] = ()
) -> Iterator[Trace]:
    """The project's traces whose root span started in the window (or the traces `ids`), at most `limit`."""
    if not ids:
        roots = c.spans.get_spans(project_identifier=project, start_time=since, end_time=until, parent_id="null",
                                  limit=limit + 1, timeout=TIMEOUT_S)  # fmt: skip
        if len(roots) > limit:
            raise IngestError(f"phoenix: project {project!r} has more than {limit} traces in the window "
                              "(narrow it with --since/--until, or raise --option max_traces)")  # fmt: skip
        ids = sorted({r["context"]["trace_id"] for r in roots})
    for start in range(0, len(ids), TRACES_PER_REQUEST):
        batch = list(ids[start : start + TRACES_PER_REQUEST])
        spans = c.spans.get_spans(project_identifier=project, trace_ids=batch, limit=MAX_BATCH_SPANS + 1,
                                  timeout=TIMEOUT_S)  # fmt: skip
        if len(spans) > MAX_BATCH_SPANS:
            raise IngestError(f"phoenix: traces {batch[0]}… have more than {MAX_BATCH_SPANS} spans together")
        grouped: dict[str, list[Mapping[str, Any]]] = {trace_id: [] for trace_id in batch}
        for sp in spans:
            grouped.setdefault(sp["context"]["trace_id"], []).append(sp)
        for trace_id, group in grouped.items():
            if group:
                yield reduce(trace_id, group)


def reduce(trace_id: str, spans: list[Mapping[str, Any]]) -> Trace:
    """A Phoenix trace (its spans as the client returns them) as the spans a rollout needs."""
    check_spans("phoenix", trace_id, len(spans))
    reduced = tuple(_span(sp) for sp in spans)
    root = min(spans, key=lambda sp: (sp.get("parent_id") is not None, sp["start_time"]))
    fields = dict(root.get("attributes") or {})  # a dotted path (`session.id`) finds a flat key or nested ones
    model = next((m for sp in spans if sp.get("span_kind") == "LLM" and (m := _get(sp, "llm", "model_name"))), None)
    if model is not None:
        fields.setdefault("model", model)
    return Trace(trace_id, min(s.start_ns for s in reduced), reduced, fields)


def _span(sp: Mapping[str, Any]) -> TraceSpan:
    kind = {"TOOL": "tool", "LLM": "model"}.get(str(sp.get("span_kind")), "other")
    error = sp.get("status_code") == "ERROR"
    messages: tuple[dict[str, Any], ...] = ()
    declared: frozenset[str] = frozenset()
    if kind == "model":
        found = _get(sp, "llm", "input_messages")
        items = _in_order(found)
        messages = tuple(m["message"] for m in items if isinstance(m, dict) and isinstance(m.get("message"), dict))
        declared = kwargs_tools(_in_order(_get(sp, "llm", "tools")))
    return TraceSpan(
        tools=_tools(sp) if kind == "model" else None,
        span_id=str(sp["context"]["span_id"]),
        name=str(_get(sp, "tool", "name") or sp.get("name") or "") if kind == "tool" else str(sp.get("name") or ""),
        kind=kind,
        start_ns=_ns(sp["start_time"]),
        arguments=_get(sp, "input", "value") if kind == "tool" else None,
        output=_get(sp, "output", "value") if kind == "tool" else None,
        error=error,
        error_message=(_exception(sp) or sp.get("status_message")) if error else None,  # the exception's own words
        messages=messages,
        kwargs_tools=declared,
    )


def _tools(sp: Mapping[str, Any]) -> dict[str, Any] | None:
    """The definitions of an LLM span's `llm.tools` (each item's `tool.json_schema`: JSON text, or an object)."""
    given = []
    for item in _in_order(_get(sp, "llm", "tools")):
        schema = item.get("tool", {}).get("json_schema") if isinstance(item, dict) else None
        if isinstance(schema, str):
            try:
                schema = orjson.loads(schema)
            except orjson.JSONDecodeError:
                continue
        given.append(schema)
    return tool_definitions(given)


def _in_order(found: Any) -> list[Any]:
    """A list attribute's items: a list, or an object of positions ("0", "1", ...) in number order."""
    if isinstance(found, list):
        return found
    if isinstance(found, dict):
        return [found[k] for k in sorted(found, key=lambda k: (not k.isdigit(), int(k) if k.isdigit() else 0, k))]
    return []


def _get(sp: Mapping[str, Any], *path: str) -> Any:
    value: Any = nested(sp.get("attributes") or {})
    for key in path:
        value = value.get(key) if isinstance(value, dict) else None
    return value


def nested(attributes: Mapping[str, Any]) -> dict[str, Any]:
    """OpenInference attributes as nested objects, whether the server sent `a.b.c` keys or nested ones (list
    positions stay string keys: `llm.input_messages.0.message.role` -> {"llm": {"input_messages": {"0": ...}}})."""
    out: dict[str, Any] = {}
    for key, value in attributes.items():
        parts = str(key).split(".")
        here = out
        for part in parts[:-1]:
            nxt = here.get(part)
            if not isinstance(nxt, dict):
                nxt = here[part] = {}
            here = nxt
        here[parts[-1]] = nested(value) if isinstance(value, dict) else value
    return out


def _exception(sp: Mapping[str, Any]) -> str | None:
    for event in sp.get("events") or []:
        if event.get("name") == "exception":
            found = nested(event.get("attributes") or {}).get("exception", {}).get("message")
            if found:
                return str(found)
    return None


def _ns(stamp: str) -> int:
    """An ISO 8601 time as nanoseconds since the epoch (microsecond precision, as the server keeps it)."""
    moment = datetime.fromisoformat(str(stamp).replace("Z", "+00:00"))
    return int(moment.timestamp()) * 1_000_000_000 + moment.microsecond * 1_000
