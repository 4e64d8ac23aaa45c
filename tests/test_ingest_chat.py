"""`openai` and `anthropic` adapters, and the options every production-log adapter shares."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline.core.records import parse_rollout
from pipeline.envs import EnvOptions, get_environment
from pipeline.ingest import IngestError, IngestOptions, ingest
from pipeline.replay.checker import UNCAPTURED, replay

USER = "Hi, I'm Ava (ava@example.com). Cancel order O5521 please."


def write_jsonl(path: Path, *records: Any) -> Path:
    path.write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    return path


def read(fmt: str, path: Path, labels: dict[str, str] | None = None, **extra: str) -> list[dict]:
    return list(ingest(fmt, [str(path)], IngestOptions(labels=labels or {}, extra=extra)))


def score(record: dict, spec: str | None = "support") -> list[tuple[bool, str | None, str | None, str | None]]:
    env = get_environment("observed", EnvOptions(spec=spec))
    return [(s.valid, s.failed_check, s.decided_by, s.detail) for s in replay(env, parse_rollout(record)).steps]


def tool_call(cid: str, name: str, arguments: str) -> dict:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": arguments}}


OPENAI = {
    "id": "conv-1",
    "model": "gpt-x",
    "metadata": {"agent_version": "v2", "date": "2026-11-29"},
    "success": True,
    "messages": [
        {"role": "system", "content": "You are a support agent."},
        {"role": "user", "content": [{"type": "text", "text": USER}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [  # several calls in one message: kept in logged order, results arrive reversed
                tool_call("a", "find_customer", '{"email": "ava@example.com"}'),
                tool_call("b", "get_order", '{"order_id": "O5521"'),  # invalid JSON
                tool_call("c", "get_order", '{"order_id": "O5521"}'),
            ],
        },
        {"role": "tool", "tool_call_id": "c", "content": '{"order_id": "O5521", "status": "shipped", "total": 80}'},
        {"role": "tool", "tool_call_id": "a", "content": '{"customer_id": "C104", "tier": "silver"}'},
        {
            "role": "assistant",
            "tool_calls": [tool_call("d", "cancel_order", '{"order_id": "O5521", "reason": "other"}')],
        },
        {"role": "tool", "tool_call_id": "d", "content": "Error: already shipped"},
        {
            "role": "assistant",
            "tool_calls": [tool_call("e", "send_email", '{"customer_id": "C104", "template": "cancellation"}')],
        },
        {"role": "assistant", "content": "Sorry, it has shipped."},
    ],
}


def test_openai_mapping_order_results_and_labels(tmp_path):
    [rec] = read("openai", write_jsonl(tmp_path / "a.jsonl", OPENAI), {"run": "n1"}, error_prefix="Error:")
    assert rec["rollout_id"] == "conv-1" and rec["task_id"] == "conv-1" and rec["success"] is True
    assert rec["labels"] == {"model": "gpt-x", "agent_version": "v2", "date": "2026-11-29", "run": "n1"}
    calls = [e for e in rec["events"] if e["type"] == "call"]
    assert [(c["tool"], c["call_id"]) for c in calls] == [
        ("find_customer", "a"), ("get_order", "b"), ("get_order", "c"), ("cancel_order", "d"), ("send_email", "e")
    ]  # fmt: skip
    assert calls[1]["arguments"] == '{"order_id": "O5521"' and "output" not in calls[1]  # no result for b
    assert calls[3]["error"] is True and calls[0]["error"] is False
    assert "output" not in calls[4] and "error" not in calls[4]  # a call with no result
    assert [e["role"] for e in rec["events"] if e["type"] == "message"] == ["system", "user", "assistant"]


def test_openai_scored_with_the_spec(tmp_path):
    [rec] = read("openai", write_jsonl(tmp_path / "a.jsonl", OPENAI), error_prefix="Error:")
    steps = score(rec)
    assert steps[1][:2] == (False, "S") and "do not parse as JSON" in steps[1][3]  # not a crash
    assert steps[0][:3] == (True, None, "log") and steps[2][:3] == (True, None, "log")
    # cancel_order: the observed rule (the order the agent saw is shipped) decides before the log
    assert steps[3][:3] == (False, "P", "precondition") and "shipped" in steps[3][3]
    assert steps[4][:3] == (True, None, "log")  # no result logged, no error logged


def test_openai_without_error_field_or_prefix_logs_no_error(tmp_path):
    [rec] = read("openai", write_jsonl(tmp_path / "a.jsonl", OPENAI))
    assert all("error" not in e for e in rec["events"] if e["type"] == "call")


def test_openai_legacy_function_call_and_bare_message_list(tmp_path):
    def legacy(name: str, arguments: dict) -> dict:
        return {
            "role": "assistant",
            "content": None,
            "function_call": {"name": name, "arguments": orjson.dumps(arguments).decode()},
        }

    messages = [
        {"role": "user", "content": "Look up ava@example.com"},
        legacy("find_customer", {"email": "ava@example.com"}),
        {"role": "function", "name": "find_customer", "content": '{"customer_id": "C104"}'},
        legacy("get_customer", {"customer_id": "C104"}),
    ]
    path = tmp_path / "one.json"
    path.write_bytes(orjson.dumps(messages))
    [rec] = read("openai", path)
    calls = [e for e in rec["events"] if e["type"] == "call"]
    assert [c["tool"] for c in calls] == ["find_customer", "get_customer"]
    assert calls[0]["output"] == '{"customer_id": "C104"}' and "output" not in calls[1]
    assert rec["rollout_id"] == str(path) and rec["success"] is None


def test_shared_options_id_task_success_labels_and_outcomes(tmp_path):
    src = write_jsonl(tmp_path / "a.jsonl", {**OPENAI, "meta": {"conv": "X1", "goal": "cancel", "ok": "fail"}})
    [rec] = read("openai", src, id_field="meta.conv", task_field="meta.goal", success_field="meta.ok",
                 **{"label.tenant": "meta.goal", "benchmark": "support"})  # fmt: skip
    assert (rec["rollout_id"], rec["task_id"], rec["success"], rec["benchmark"]) == ("X1", "cancel", False, "support")
    assert rec["labels"]["tenant"] == "cancel"
    (tmp_path / "out.csv").write_text("rollout_id,success\nconv-1,true\nother,false\n")
    [rec] = read("openai", src, outcomes=str(tmp_path / "out.csv"))
    assert rec["success"] is True  # the table overrides the log's own field
    (tmp_path / "out.jsonl").write_text('{"id": "nobody", "success": 1}\n')
    [rec] = read("openai", src, outcomes=str(tmp_path / "out.jsonl"))
    assert rec["success"] is None  # absent from the outcomes table


@pytest.mark.parametrize(
    ("content", "extra", "message"),
    [
        ('{"messages": [}\n', {}, "a.jsonl line 1: not JSON"),
        ('{"id": 1}\n', {}, "a.jsonl line 1: expected an object with a 'messages' list"),
        ('{"messages": [{"role": "tool", "content": "x"}]}\n', {}, "without 'tool_call_id'"),
        ('{"messages": [], "success": "maybe"}\n', {}, "cannot read 'maybe' as success"),
        ('{"messages": []}\n', {"nope": "1"}, "unknown option(s) nope"),
    ],
)
def test_bad_input_is_a_clear_error(tmp_path, content, extra, message):
    (tmp_path / "a.jsonl").write_text(content)
    with pytest.raises(IngestError, match=None) as info:
        read("openai", tmp_path / "a.jsonl", **extra)
    assert message in str(info.value)


def test_bad_outcomes_table_names_file_and_line(tmp_path):
    (tmp_path / "o.csv").write_text("rollout_id,success\nconv-1,perhaps\n")
    with pytest.raises(IngestError, match=r"o\.csv line 2: cannot read 'perhaps'"):
        read("openai", write_jsonl(tmp_path / "a.jsonl", OPENAI), outcomes=str(tmp_path / "o.csv"))


ANTHROPIC = {
    "id": "msg-conv-7",
    "model": "claude-x",
    "system": "You are a support agent.",
    "messages": [
        {"role": "user", "content": USER},
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Let me look."},
                {"type": "tool_use", "id": "tu1", "name": "find_customer", "input": {"email": "ava@example.com"}},
                {"type": "tool_use", "id": "tu2", "name": "get_order", "input": {"order_id": "O5521"}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "tu2", "is_error": True,
                 "content": [{"type": "text", "text": "not found"}]},
                {"type": "tool_result", "tool_use_id": "tu1", "content": '{"customer_id": "C104"}'},
            ],
        },
        {"role": "assistant", "content": [
            {"type": "tool_use", "id": "tu3", "name": "list_orders", "input": {"customer_id": "C104"}}]},
    ],
}  # fmt: skip


def test_anthropic_blocks_results_errors_and_turns(tmp_path):
    [rec] = read("anthropic", write_jsonl(tmp_path / "a.jsonl", ANTHROPIC))
    assert rec["rollout_id"] == "msg-conv-7" and rec["labels"] == {"model": "claude-x"}
    calls = [e for e in rec["events"] if e["type"] == "call"]
    assert [(c["tool"], c.get("output"), c.get("error")) for c in calls] == [
        ("find_customer", '{"customer_id": "C104"}', False),
        ("get_order", "not found", True),
        ("list_orders", None, None),  # no tool_result
    ]
    assert {e["turn"] for e in rec["events"]} == {0, 1}  # tool_result-only user messages start no turn
    steps = score(rec)
    assert [s[:3] for s in steps] == [(True, None, "log"), (False, "P", "log"), (True, None, "log")]


def test_anthropic_raw_text_input_that_is_not_json_is_an_s_failure(tmp_path):
    broken = {**ANTHROPIC, "messages": [ANTHROPIC["messages"][0], {"role": "assistant", "content": [
        {"type": "tool_use", "id": "x", "name": "find_customer", "input": '{"email": '}]}]}  # fmt: skip
    [rec] = read("anthropic", write_jsonl(tmp_path / "a.jsonl", broken))
    assert score(rec)[0][:2] == (False, "S")


def test_anthropic_missing_input_is_not_captured(tmp_path):
    blind = {**ANTHROPIC, "messages": [ANTHROPIC["messages"][0], {"role": "assistant", "content": [
        {"type": "tool_use", "id": "x", "name": "get_order"}]}]}  # fmt: skip
    [rec] = read("anthropic", write_jsonl(tmp_path / "a.jsonl", blind))
    assert score(rec) == [(True, None, "log", UNCAPTURED)]


def test_ingest_names_the_file_of_a_document_that_is_not_json(tmp_path):
    """A `.json` file that holds JSON Lines is one document that does not parse: `pexec ingest` fails on one line
    that says which file, as scoring's reject does."""
    from typer.testing import CliRunner

    from pipeline.apps.cli import app

    logs = tmp_path / "logs"
    logs.mkdir()
    line = orjson.dumps({"messages": [{"role": "user", "content": "hi"}]}).decode()
    (logs / "b.json").write_text(f"{line}\n{line}\n")
    done = CliRunner().invoke(app, ["ingest", "openai", str(logs), "--out", str(tmp_path / "store")])
    assert done.exit_code == 2, done.output
    assert done.output.replace("\n", "").startswith(f"error: openai: {logs / 'b.json'}: not JSON: ")
