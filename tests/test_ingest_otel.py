"""`otel`: OpenTelemetry GenAI spans (OTLP JSON) -> rollouts, scored by `observed`."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline.core.records import parse_rollout
from pipeline.envs import EnvOptions, get_environment
from pipeline.ingest import IngestError, IngestOptions, ingest
from pipeline.replay.checker import UNCAPTURED, replay

T0 = 1_795_953_600_000_000_000  # 2026-11-29 12:00 UTC, in ns


def attr(key: str, value: Any) -> dict:
    kind = {bool: "boolValue", int: "intValue", float: "doubleValue"}.get(type(value), "stringValue")
    return {"key": key, "value": {kind: str(value) if kind == "intValue" else value}}


def span(trace: str, sid: str, name: str, at: int, error: bool = False, **attrs: Any) -> dict:
    return {
        "traceId": trace,
        "spanId": sid,
        "name": name,
        "startTimeUnixNano": str(T0 + at),
        "endTimeUnixNano": str(T0 + at + 5),
        "attributes": [attr(k.replace("__", "."), v) for k, v in attrs.items()],
        "status": {"code": 2, "message": "boom"} if error else {"code": 1},
    }


def tool(trace: str, sid: str, at: int, name: str, call_id: str, error: bool = False, **extra: Any) -> dict:
    base = {"gen_ai__operation__name": "execute_tool", "gen_ai__tool__name": name, "gen_ai__tool__call__id": call_id}
    return span(trace, sid, f"execute_tool {name}", at, error, **base, **extra)


def export(*spans: dict, service: str = "support-agent", version: str = "1.5.0") -> dict:
    resource = {"attributes": [attr("service.name", service), attr("service.version", version)]}
    return {
        "resourceSpans": [{"resource": resource, "scopeSpans": [{"scope": {"name": "agent"}, "spans": list(spans)}]}]
    }


USER_MSG = orjson.dumps([{"role": "user", "parts": [{"type": "text", "content": "I'm ava@example.com, order O5521"}]}])
CHAT = {
    "gen_ai__operation__name": "chat",
    "gen_ai__request__model": "gpt-x",
    "gen_ai__conversation__id": "conv-9",
    "gen_ai__input__messages": USER_MSG.decode(),
    "gen_ai__output__messages": orjson.dumps([{"role": "assistant", "parts": [
        {"type": "tool_call", "id": "c1", "name": "find_customer", "arguments": {"email": "ava@example.com"}},
        {"type": "tool_call", "id": "c2", "name": "get_order", "arguments": {"order_id": "O5521"}},
        {"type": "tool_call", "id": "c3", "name": "list_orders", "arguments": {"customer_id": "C104"}},
    ]}]).decode(),
}  # fmt: skip


def read(tmp_path: Path, *docs: dict, **extra: str) -> list[dict]:
    paths = []
    for i, doc in enumerate(docs):
        paths.append(tmp_path / f"part{i}.json")
        paths[-1].write_bytes(orjson.dumps(doc))
    return list(ingest("otel", [str(p) for p in paths], IngestOptions(extra=extra)))


def steps(record: dict) -> list[tuple]:
    env = get_environment("observed", EnvOptions(spec="support"))
    return [(s.tool, s.valid, s.failed_check, s.decided_by, s.detail) for s in replay(env, parse_rollout(record)).steps]


def test_spans_out_of_order_across_files_grouped_and_sorted(tmp_path):
    # The tool spans arrive first, in another file, in reverse order; c3 was requested but never executed.
    late = export(
        tool("t1", "s4", 40, "get_order", "c2", True),  # no arguments captured; span status ERROR
        tool("t1", "s3", 30, "find_customer", "c1", gen_ai__tool__call__arguments='{"email": "ava@example.com"}',
             gen_ai__tool__call__result='{"customer_id": "C104"}'),
    )  # fmt: skip
    early = export(span("t1", "s1", "chat gpt-x", 10, **CHAT), span("t2", "s9", "chat gpt-x", 5, **{**CHAT,
                   "gen_ai__conversation__id": "conv-8"}))  # fmt: skip
    records = {r["rollout_id"]: r for r in read(tmp_path, late, early)}
    assert sorted(records) == ["conv-8", "conv-9"]
    rec = records["conv-9"]
    assert rec["labels"] == {"model": "gpt-x", "agent_version": "1.5.0", "date": "2026-11-29"}
    events = [(e["type"], e.get("tool"), e.get("call_id")) for e in rec["events"]]
    assert events == [("message", None, None), ("call", "list_orders", "c3"),
                      ("call", "find_customer", "c1"), ("call", "get_order", "c2")]  # fmt: skip
    calls = {e["call_id"]: e for e in rec["events"] if e["type"] == "call"}
    assert calls["c1"]["arguments"] == '{"email": "ava@example.com"}' and calls["c1"]["error"] is False
    assert calls["c2"]["arguments"] == {"order_id": "O5521"}  # from the chat span's tool_call part
    assert calls["c2"]["error"] is True and "output" not in calls["c3"] and "error" not in calls["c3"]


def test_uncaptured_arguments_are_unknown_for_s_and_d(tmp_path):
    # Content capture off: no arguments on the tool span, no messages on the chat span.
    doc = export(
        span("t1", "s1", "chat gpt-x", 0, gen_ai__operation__name="chat", gen_ai__conversation__id="c"),
        tool("t1", "s2", 10, "get_order", "x1"),
        tool("t1", "s3", 20, "cancel_order", "x2", True, error__type="HTTPError"),
        tool("t1", "s4", 30, "no_such_tool", "x3"),
    )
    [rec] = read(tmp_path, doc)
    assert [e["arguments"] for e in rec["events"]] == [None, None, None]
    assert steps(rec) == [
        ("get_order", True, None, "log", UNCAPTURED),  # not "valid" by S/D: unknown, P from the log
        ("cancel_order", False, "P", "log", f"logged error ({UNCAPTURED})"),
        ("no_such_tool", False, "S", None, "unknown tool 'no_such_tool'"),  # the name alone is enough for that
    ]


def test_trace_without_conversation_id_is_one_rollout(tmp_path):
    [rec] = read(tmp_path, export(tool("abc", "s1", 0, "search_kb", "k", gen_ai__tool__call__arguments='{"query": 1}')))
    assert rec["rollout_id"] == "abc"
    assert steps(rec)[0][1:3] == (False, "S")


def test_not_otlp_is_a_clear_error(tmp_path):
    with pytest.raises(IngestError, match=r"part0\.json line 1: not an OTLP JSON export"):
        read(tmp_path, {"spans": []})
    with pytest.raises(IngestError, match="a span needs 'traceId' and 'spanId'"):
        read(tmp_path, export({"name": "x"}))
