"""The customer-support sample as OpenTelemetry GenAI spans (OTLP JSON lines or OTLP protobuf), for the shuffle's
scale benches:
each conversation of `pipeline.synthetic.support_logs` becomes one trace of `chat` spans (the user's latest
message in, the assistant's tool calls out) and `execute_tool` spans (arguments, result, an error status for a
backend error), carrying `gen_ai.conversation.id`. Spans are dealt round-robin over the files, so every
conversation's spans lie in several files, as a rotating exporter leaves them.

Protobuf files (`encoding="proto"`) are written as the Collector `file` exporter writes `format: proto`: each
export an `ExportTraceServiceRequest` made by the OpenTelemetry SDK's own OTLP encoder from SDK spans, behind its
length (4 bytes, big-endian). That needs the SDK and its encoder (development dependencies).

    python -m pipeline.synthetic.support_spans --out DIR --conversations N [--files F] [--seed S] [--proto]
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal, NotRequired, TypedDict

import orjson

from pipeline.synthetic.support_logs import conversation

_BATCH = 64  # spans per OTLP export line


class _Value(TypedDict):
    stringValue: str  # every attribute is written as a string: JSON text for structured values


class _Attribute(TypedDict):
    key: str
    value: _Value


class _Status(TypedDict):
    code: int  # 2: ERROR


class Span(TypedDict):
    """A span as OTLP JSON writes it, with the fields these spans use."""

    traceId: str
    spanId: str
    name: str
    attributes: list[_Attribute]
    startTimeUnixNano: str
    endTimeUnixNano: str
    status: NotRequired[_Status]


def _attr(key: str, value: Any) -> _Attribute:
    if isinstance(value, str):
        return {"key": key, "value": {"stringValue": value}}
    return {"key": key, "value": {"stringValue": orjson.dumps(value).decode()}}


def spans_of(record: dict[str, Any], index: int, start_ns: int) -> list[Span]:
    """The spans of one OpenAI-format conversation record."""
    trace = f"{index:032x}"
    conv = str(record["id"])
    model = str(record.get("model") or "")
    out: list[Span] = []
    latest_user: list[dict[str, Any]] = []  # GenAI input messages (the attribute's JSON)
    clock = start_ns

    def span(name: str, attrs: list[_Attribute], error: bool = False) -> None:
        nonlocal clock
        clock += 1_000_000
        span_id = f"{index % 2**32:08x}{len(out):08x}"
        item: Span = {"traceId": trace, "spanId": span_id, "name": name, "attributes": attrs,
                      "startTimeUnixNano": str(clock), "endTimeUnixNano": str(clock + 500_000)}  # fmt: skip
        if error:
            item["status"] = {"code": 2}
        out.append(item)

    for m in record["messages"]:
        role = m.get("role")
        if role in ("user", "system") and isinstance(m.get("content"), str):
            latest_user = [{"role": role, "parts": [{"type": "text", "content": m["content"]}]}]
        elif role == "assistant" and m.get("tool_calls"):
            calls = [{"type": "tool_call", "id": c["id"], "name": c["function"]["name"],
                      "arguments": c["function"]["arguments"]} for c in m["tool_calls"]]  # fmt: skip
            output = [{"role": "assistant", "parts": calls}]
            span(f"chat {model}", [_attr("gen_ai.operation.name", "chat"), _attr("gen_ai.conversation.id", conv),
                                   _attr("gen_ai.request.model", model), _attr("gen_ai.input.messages", latest_user),
                                   _attr("gen_ai.output.messages", output)])  # fmt: skip
        elif role == "tool":
            content = str(m.get("content") or "")
            call = next((c for c in _calls(record) if c["id"] == m.get("tool_call_id")), None)
            if call is None:
                continue
            attrs = [_attr("gen_ai.operation.name", "execute_tool"), _attr("gen_ai.conversation.id", conv),
                     _attr("gen_ai.tool.name", call["function"]["name"]), _attr("gen_ai.tool.call.id", call["id"]),
                     _attr("gen_ai.tool.call.arguments", call["function"]["arguments"]),
                     _attr("gen_ai.tool.call.result", content)]  # fmt: skip
            span(f"execute_tool {call['function']['name']}", attrs, error=content.startswith("Error:"))
    return out


def _calls(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [c for m in record["messages"] if m.get("role") == "assistant" for c in m.get("tool_calls") or []]


def write_spans(
    out: str | Path,
    conversations: int,
    files: int = 8,
    seed: int = 0,
    day: str = "2026-11-29",
    encoding: Literal["json", "proto"] = "json",
) -> int:
    """Write the spans of `conversations` conversations over `files` OTLP files (JSON Lines, or length-prefixed
    protobuf with `encoding="proto"`); returns the spans."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(f"{seed}/{day}")
    resource = {"attributes": [_attr("service.name", "support-agent")]}
    suffix = ".pb" if encoding == "proto" else ".jsonl"
    handles = [open(folder / f"spans-{i:03d}{suffix}", "wb") for i in range(files)]  # noqa: SIM115
    pending: list[list[Span]] = [[] for _ in range(files)]
    encode = _proto_encoder() if encoding == "proto" else None
    n = 0

    def flush(i: int) -> None:
        if encode is not None:
            data = encode(pending[i])
            handles[i].write(len(data).to_bytes(4, "big") + data)
        else:
            export = {"resourceSpans": [{"resource": resource, "scopeSpans": [{"spans": pending[i]}]}]}
            handles[i].write(orjson.dumps(export) + b"\n")
        pending[i] = []

    try:
        for index in range(conversations):
            record = conversation(rng, index, day)
            for s in spans_of(record, index, 1_764_400_000_000_000_000 + index * 10_000_000_000):
                i = n % files
                pending[i].append(s)
                n += 1
                if len(pending[i]) >= _BATCH:
                    flush(i)
        for i in range(files):
            if pending[i]:
                flush(i)
    finally:
        for h in handles:
            h.close()
    return n


def _proto_encoder() -> Callable[[list[Span]], bytes]:
    """Spans as `spans_of` makes them -> one serialized export, by the SDK's OTLP protobuf encoder."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import ReadableSpan
    from opentelemetry.trace import SpanContext, Status, StatusCode, TraceFlags

    resource = Resource({"service.name": "support-agent"})
    sampled = TraceFlags(TraceFlags.SAMPLED)

    def sdk_span(s: Span) -> ReadableSpan:
        context = SpanContext(int(s["traceId"], 16), int(s["spanId"], 16), is_remote=False, trace_flags=sampled)
        status = Status(StatusCode.ERROR if "status" in s and s["status"]["code"] == 2 else StatusCode.UNSET)
        return ReadableSpan(s["name"], context, resource=resource, start_time=int(s["startTimeUnixNano"]),
                            end_time=int(s["endTimeUnixNano"]), status=status,
                            attributes={a["key"]: a["value"]["stringValue"] for a in s["attributes"]})  # fmt: skip

    return lambda spans: encode_spans([sdk_span(s) for s in spans]).SerializeToString()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--conversations", type=int, default=1000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--proto", action="store_true", help="OTLP protobuf (the SDK's encoder), not JSON lines")
    args = parser.parse_args(argv)
    n = write_spans(args.out, args.conversations, args.files, args.seed, encoding="proto" if args.proto else "json")
    print(f"wrote {n} spans to {args.out}")


if __name__ == "__main__":
    main()
