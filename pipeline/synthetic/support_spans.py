"""The customer-support sample as OpenTelemetry GenAI spans (OTLP JSON lines), for the shuffle's scale bench:
each conversation of `pipeline.synthetic.support_logs` becomes one trace of `chat` spans (the user's latest
message in, the assistant's tool calls out) and `execute_tool` spans (arguments, result, an error status for a
backend error), carrying `gen_ai.conversation.id`. Spans are dealt round-robin over the files, so every
conversation's spans lie in several files, as a rotating exporter leaves them.

    python -m pipeline.synthetic.support_spans --out DIR --conversations N [--files F] [--seed S]
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path
from typing import Any

import orjson

from pipeline.synthetic.support_logs import conversation

_BATCH = 64  # spans per OTLP export line


def _attr(key: str, value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        return {"key": key, "value": {"stringValue": value}}
    return {"key": key, "value": {"stringValue": orjson.dumps(value).decode()}}


def spans_of(record: dict[str, Any], index: int, start_ns: int) -> list[dict[str, Any]]:
    """The spans of one OpenAI-format conversation record."""
    trace = f"{index:032x}"
    conv = str(record["id"])
    model = str(record.get("model") or "")
    out: list[dict[str, Any]] = []
    latest_user: list[dict[str, Any]] = []
    clock = start_ns

    def span(name: str, attrs: list[dict[str, Any]], error: bool = False) -> None:
        nonlocal clock
        clock += 1_000_000
        item = {"traceId": trace, "spanId": f"{index % 2**32:08x}{len(out):08x}", "name": name, "attributes": attrs,
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


def write_spans(out: str | Path, conversations: int, files: int = 8, seed: int = 0, day: str = "2026-11-29") -> int:
    """Write the spans of `conversations` conversations over `files` OTLP JSON Lines files; returns the spans."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    rng = random.Random(f"{seed}/{day}")
    resource = {"attributes": [_attr("service.name", "support-agent")]}
    handles = [open(folder / f"spans-{i:03d}.jsonl", "wb") for i in range(files)]  # noqa: SIM115
    pending: list[list[dict[str, Any]]] = [[] for _ in range(files)]
    n = 0

    def flush(i: int) -> None:
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True)
    parser.add_argument("--conversations", type=int, default=1000)
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    print(f"wrote {write_spans(args.out, args.conversations, args.files, args.seed)} spans to {args.out}")


if __name__ == "__main__":
    main()
