"""Pairing tool results with calls when ids repeat, are missing or come out of order: one rule
(`pipeline.ingest._pairing`) in every adapter that pairs (openai, anthropic, inspect, otel, tau2, toolsandbox)."""

from __future__ import annotations

import zipfile
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from pipeline.apps.cli import app
from pipeline.core.errors import IngestError
from pipeline.core.model import Message
from pipeline.ingest import IngestOptions, ingest, openai
from pipeline.ingest._logs import LogSettings, call_event, text
from pipeline.ingest._pairing import Call, Result, TypedEntry, assemble, assemble_events, pair

# One conversation in every format: the framework reuses id `x` for two calls (each answered after it), answers
# the two calls of one message out of order (`b` before `a`), never answers `n`, and logs a result for `z`, a
# call that does not exist.
# Then two parallel calls share id `p`: answered in order.
EXPECTED = [("get", "out0"), ("get", "out1"), ("put", "out2"), ("put", "out3"), ("get", None), ("put", "out5"),
            ("put", "out6")]  # fmt: skip


def check(record: dict[str, Any], orphan: str = "outz") -> None:
    calls = [e for e in record["events"] if e["type"] == "call"]
    assert [(c["tool"], c.get("output")) for c in calls] == EXPECTED
    orphans = [e for e in record["events"] if e["type"] == "message" and e["role"] == "tool"]
    assert [e["content"] for e in orphans] == [orphan]
    assert record["attributes"]["orphan_results"] == "1"


def test_the_rule() -> None:
    def build(r: Any) -> dict[str, Any]:
        return {"r": r}

    log = [Call("x", build), Result("x", 1, 1), Call("x", build), Call(None, build), Result(None, 3, 3),
           Result("x", 2, 2), Result("y", 9, "nine")]  # fmt: skip
    assert pair(log) == {0: 1, 2: 5, 3: 4}
    events, attributes = assemble(log)
    assert events == [{"r": 1}, {"r": 2}, {"r": 3}, {"type": "message", "role": "tool", "content": "nine", "turn": 0}]
    assert attributes == {"orphan_results": "1"}
    # a result logged before any call with its id answers none of the later ones
    assert pair([Result("x", 0, 0), Call("x", dict)]) == {}
    assert pair([Call("x", dict), Call("x", dict), Result("x", 0, 0), Result("x", 1, 1)]) == {0: 2, 1: 3}


def _tc(cid: str, name: str, k: int) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": orjson.dumps({"k": k}).decode()}}


def _openai_messages() -> list[dict[str, Any]]:
    def result(cid: str, n: Any) -> dict[str, Any]:
        return {"role": "tool", "tool_call_id": cid, "content": f"out{n}"}

    return [
        {"role": "user", "content": "go"},
        {"role": "assistant", "content": None, "tool_calls": [_tc("x", "get", 1)]},
        result("x", 0),
        {"role": "assistant", "content": None, "tool_calls": [_tc("x", "get", 2)]},
        result("x", 1),
        {"role": "assistant", "content": None, "tool_calls": [_tc("a", "put", 3), _tc("b", "put", 4)]},
        result("b", 3),
        result("a", 2),
        {"role": "assistant", "content": None, "tool_calls": [_tc("n", "get", 5)]},
        result("z", "z"),
        {"role": "assistant", "content": None, "tool_calls": [_tc("p", "put", 6), _tc("p", "put", 7)]},
        result("p", 5),
        result("p", 6),
    ]


def _write(path: Path, value: Any) -> Path:
    path.write_bytes(orjson.dumps(value))
    return path


def test_openai(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.json", {"id": "c", "messages": _openai_messages()})
    [record] = ingest("openai", [str(path)])
    check(record)


def test_the_command_line_warns_about_orphans(tmp_path: Path) -> None:
    path = _write(tmp_path / "c.json", [{"id": "c", "messages": _openai_messages()}, {"id": "d", "messages": []}])
    shown = CliRunner().invoke(app, ["ingest", "openai", str(path), "--out", str(tmp_path / "store")])
    assert shown.exit_code == 0, shown.output
    assert "warning: 1 tool result(s) in 1 rollout(s) answer no logged call" in " ".join(shown.output.split())


def test_anthropic(tmp_path: Path) -> None:
    messages = []
    for m in _openai_messages():
        if m["role"] == "assistant":
            blocks = [{"type": "tool_use", "id": t["id"], "name": t["function"]["name"],
                       "input": orjson.loads(t["function"]["arguments"])} for t in m["tool_calls"]]  # fmt: skip
            messages.append({"role": "assistant", "content": blocks})
        elif m["role"] == "tool":
            messages.append({"role": "user", "content": [{"type": "tool_result", "tool_use_id": m["tool_call_id"],
                                                           "content": m["content"]}]})  # fmt: skip
        else:
            messages.append(m)
    [record] = ingest("anthropic", [str(_write(tmp_path / "c.json", {"id": "c", "messages": messages}))])
    check(record)


def test_inspect(tmp_path: Path) -> None:
    messages = []
    for m in _openai_messages():
        if m["role"] == "assistant":
            calls = [{"id": t["id"], "function": t["function"]["name"],
                      "arguments": orjson.loads(t["function"]["arguments"])} for t in m["tool_calls"]]  # fmt: skip
            messages.append({"role": "assistant", "content": "", "tool_calls": calls})
        else:
            messages.append(m)
    sample = {"id": 1, "epoch": 1, "messages": messages, "scores": {"match": {"value": "C"}}}
    with zipfile.ZipFile(tmp_path / "a.eval", "w") as z:
        z.writestr("header.json", orjson.dumps({"eval": {"eval_id": "e", "task": "t", "model": "m"}}))
        z.writestr("samples/1_epoch_1.json", orjson.dumps(sample))
    [record] = ingest("inspect", [str(tmp_path / "a.eval")])
    check(record)


def test_tau2(tmp_path: Path) -> None:
    messages = []
    for m in _openai_messages():
        if m["role"] == "assistant":
            calls = [{"id": t["id"], "name": t["function"]["name"], "requestor": "assistant",
                      "arguments": orjson.loads(t["function"]["arguments"])} for t in m["tool_calls"]]  # fmt: skip
            messages.append({"role": "assistant", "content": None, "tool_calls": calls})
        elif m["role"] == "tool":
            messages.append(
                {"role": "tool", "id": m["tool_call_id"], "content": m["content"], "requestor": "assistant"}
            )
        else:
            messages.append(m)
    results = {
        "info": {"environment_info": {"domain_name": "airline"}, "agent_info": {"llm": "m"}},
        "tasks": [{"id": "0", "initial_state": None}],
        "simulations": [{"id": "s", "task_id": "0", "messages": messages}],
    }
    [record] = ingest("tau2", [str(_write(tmp_path / "results.json", results))])
    check(record)


def test_toolsandbox(tmp_path: Path) -> None:
    run = tmp_path / "agent_m_user_u_06_05_2024_12_55_46"
    (run / "trajectories" / "s").mkdir(parents=True)
    _write(run / "result_summary.json", {"per_scenario_results": [{"name": "s", "milestone_similarity": 1.0}]})
    messages = [m | {"content": repr(m["content"])} if m["role"] == "tool" else m for m in _openai_messages()]
    _write(run / "trajectories" / "s" / "conversation.json", messages)
    [record] = ingest("toolsandbox", [str(run)], IngestOptions())
    check(record, orphan="'outz'")  # an orphan keeps its logged text


def test_otel(tmp_path: Path) -> None:
    from test_ingest_otel import export, span, tool

    spans, at = [], 0
    for m in _openai_messages():
        at += 10
        if m["role"] == "assistant":
            parts = [{"type": "tool_call", "id": t["id"], "name": t["function"]["name"],
                      "arguments": orjson.loads(t["function"]["arguments"])} for t in m["tool_calls"]]  # fmt: skip
            out = orjson.dumps([{"role": "assistant", "parts": parts}]).decode()
            spans.append(
                span("t1", f"s{at}", "chat m", at, gen_ai__operation__name="chat", gen_ai__output__messages=out)
            )
        elif m["role"] == "tool" and m["tool_call_id"] != "z":  # OTel has no result without its call
            name = "get" if m["tool_call_id"] == "x" else "put"

            spans.append(tool("t1", f"s{at}", at, name, m["tool_call_id"], gen_ai__tool__call__result=m["content"]))
    [record] = ingest("otel", [str(_write(tmp_path / "t.json", export(*spans)))])
    calls = [e for e in record["events"] if e["type"] == "call"]
    assert [(c["tool"], c["arguments"], c.get("output")) for c in calls] == [
        ("get", {"k": 1}, "out0"), ("get", {"k": 2}, "out1"), ("put", {"k": 4}, "out3"), ("put", {"k": 3}, "out2"),
        ("get", {"k": 5}, None), ("put", {"k": 6}, "out5"), ("put", {"k": 7}, "out6")]  # fmt: skip


# -- openai's one-walk pairing agrees with the shared rule -------------------------------------------------------

# Ids that pair, repeat, are missing, or are no string (a list or object id is compared as its JSON text, and a list
# spelled as the legacy key pairs with legacy calls: as `pair` has it). Each way to fail is drawn rarely, so that
# most conversations convert and pair.
_IDS = st.sampled_from([None, "a", "b", "c", "a", "b", 1, 1.0, True, ["x"], {"k": 1}, ["legacy function call"]])
_NAMES = st.sampled_from([*("get", "put") * 8, "", None, 5])
_CONTENT = st.sampled_from([None, "out", "Err: no", "", '{"k": 1}', [{"text": "t"}, "p"], {"content": "c"}, 3])
_ARGUMENTS = st.sampled_from(['{"k": 1}', "{", None, {"k": 2}])


@st.composite
def _message(draw: st.DrawFn) -> Any:
    rare = draw(st.integers(0, 39))
    if rare == 0:
        return ["not an object"]
    role = draw(st.sampled_from(["system", "developer", "user", "other", *("assistant", "tool") * 3, "function"]))
    content = draw(_CONTENT)
    m: dict[str, Any] = {"role": role, "content": content}
    if role == "assistant":
        calls = []
        for _ in range(draw(st.integers(0, 3))):
            function = None if rare == 1 else {"name": draw(_NAMES), "arguments": draw(_ARGUMENTS)}
            calls.append("not an object" if rare == 2 else {"id": draw(_IDS), "type": "function", "function": function})
        if calls or draw(st.booleans()):
            m["tool_calls"] = calls
        if draw(st.integers(0, 3)) == 0:
            m["function_call"] = {"name": draw(_NAMES), "arguments": "{}"}
    elif role == "tool":
        if rare != 3:
            m["tool_call_id"] = draw(_IDS)
        if draw(st.booleans()):
            m["error"] = draw(st.sampled_from([True, False, "yes"]))
    return m


def _outcome(build: Any) -> Any:
    try:
        return build()
    except IngestError as exc:
        return ("error", str(exc))


@settings(max_examples=400, deadline=None)
@given(messages=st.lists(_message(), max_size=12), prefix=st.sampled_from([None, "Err"]))
def test_openai_pairs_in_one_walk_as_the_shared_rule_does(messages: list[Any], prefix: str | None) -> None:
    s = LogSettings("openai", "id", "task_id", "success", "observed", own={"error_prefix": prefix} if prefix else {})
    one_walk = _outcome(lambda: openai.paired_events(messages, s, "f line 1"))
    assert one_walk == _outcome(lambda: assemble_events(_openai_entries(messages, s, "f line 1")))


def _openai_entries(messages: list[Any], s: LogSettings, where: str) -> list[TypedEntry]:
    """An OpenAI conversation as the shared pairing rule's entries (`assemble_events` pairs them): the general form
    that `openai.paired_events` takes in one walk, kept here as its reference."""
    out: list[TypedEntry] = []
    append = out.append
    prefix = s.own.get("error_prefix")
    turn = 0
    # Runs for every message of every conversation: places are formatted only when something needs one.
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise IngestError(f"openai: {where} messages[{i}]: a message must be an object")
        role = m.get("role")
        if role == "user":
            turn += 1
        if role in openai._CONTEXT_ROLES:
            content = m.get("content")
            said = content if type(content) is str else text(content)
            if said:
                append(Message(openai._CONTEXT_ROLES[role], said, turn))
            if role == "assistant":
                _openai_calls(m, where, i, turn, append)
        elif role in ("tool", "function"):
            append(_openai_result(m, prefix, where, i, turn))
    return out


def _openai_calls(m: dict[str, Any], where: str, i: int, turn: int, append: Callable[[TypedEntry], None]) -> None:
    """An assistant message's calls: `tool_calls`, then a legacy `function_call`."""
    for j, tc in enumerate(m.get("tool_calls") or ()):
        fn = tc.get("function") if isinstance(tc, dict) else None
        here = f"{where} messages[{i}].tool_calls[{j}]"
        if not isinstance(fn, dict):
            raise IngestError(f"openai: {here}: expected {{'id', 'function': {{'name', 'arguments'}}}}")
        call_id = tc.get("id")
        append(Call(call_id, partial(call_event, fn.get("name"), fn.get("arguments"), call_id, turn, where=here)))
    fc = m.get("function_call")
    if isinstance(fc, dict):
        at = f"{where} messages[{i}]"
        append(Call(openai._LEGACY, partial(call_event, fc.get("name"), fc.get("arguments"), None, turn, where=at)))


def _openai_result(m: dict[str, Any], prefix: str | None, where: str, i: int, turn: int) -> Result:
    """A `role: tool` result (keyed by `tool_call_id`) or a legacy `role: function` one."""
    content = m.get("content")
    if type(content) is not str:
        content = text(content)
    error = m.get("error")
    if not isinstance(error, bool):
        error = content.startswith(prefix) if prefix else None
    if m["role"] == "function":
        return Result(openai._LEGACY, (content, error), content, turn)
    key = m.get("tool_call_id")
    if key is None:
        raise IngestError(f"openai: {where} messages[{i}]: a tool message without 'tool_call_id'")
    return Result(key, (content, error), content, turn)
