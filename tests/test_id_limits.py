"""Ids and names — rollout, task and benchmark ids, label names and values, attribute names, tool names, call ids,
and the keys the shuffle groups spans by — hold at most MAX_ID_CHARS characters. Longer is a counted reject whose
location and reason stay short, never a megabyte-long value in the run's tables; the rest of the input is scored,
and the guard refuses such a call with the scorer's own reason."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest
from test_ingest_otel import CHAT, export, span, tool

from pipeline.apps.guard.service import Guard
from pipeline.apps.guard.session import open_session
from pipeline.core.errors import GuardRequestError, InvalidRecord
from pipeline.core.model import Call, Message, Rollout
from pipeline.core.records import MAX_ID_CHARS, check_rollout, parse_rollout, rollout_record
from pipeline.scoring.driver import run_scoring
from pipeline.scoring.settings import ScoreSettings
from pipeline.synthetic.support_logs import write_samples

LIMIT = f"over the limit of {MAX_ID_CHARS:,}"
SHORT = 300  # characters a reject's location may take here (the files' places, or a stand-in for a long key)


def rollout() -> Rollout:
    events = [Message("user", "hi"), Call("find", {"q": 1}, output={"ok": True}, call_id="c1")]
    return Rollout("r1", "t1", "observed", labels={"model": "m"}, attributes={"seed": "1"}, events=events)


def with_call(r: Rollout, **change: str) -> Rollout:
    call = r.events[1]
    assert isinstance(call, Call)
    return replace(r, events=[r.events[0], replace(call, **change)])


# Each field set to a text of n characters, and the reason's start when n is over the limit.
FIELDS: dict[str, tuple[Callable[[Rollout, str], Rollout], str]] = {
    "rollout_id": (lambda r, v: replace(r, rollout_id=v), "'rollout_id' is"),
    "task_id": (lambda r, v: replace(r, task_id=v), "'task_id' is"),
    "benchmark": (lambda r, v: replace(r, benchmark=v), "'benchmark' is"),
    "label value": (lambda r, v: replace(r, labels={"model": v}), "the value of label 'model' is"),
    "label name": (lambda r, v: replace(r, labels={"L" + v[1:]: "m"}), "a label name is"),
    "attribute name": (lambda r, v: replace(r, attributes={v: "1"}), "an attribute name is"),
    "tool": (lambda r, v: with_call(r, tool=v), "events[1].tool is"),
    "call id": (lambda r, v: with_call(r, call_id=v), "events[1].call_id is"),
}


@pytest.mark.parametrize("field", FIELDS)
def test_an_id_is_kept_up_to_the_limit_and_rejected_past_it_by_both_readers(field):
    """check_rollout (what an adapter builds) and parse_rollout (a canonical record) agree, reason for reason."""
    change, said = FIELDS[field]
    at = change(rollout(), "x" * MAX_ID_CHARS)
    assert check_rollout(at) == at
    assert parse_rollout(rollout_record(at)) == at
    over = change(rollout(), "x" * (MAX_ID_CHARS + 1))
    with pytest.raises(InvalidRecord) as built:
        check_rollout(over)
    with pytest.raises(InvalidRecord) as read:
        parse_rollout(rollout_record(over))
    assert str(built.value) == str(read.value)
    assert str(built.value).startswith(said) and f"{MAX_ID_CHARS + 1:,} characters, {LIMIT}" in str(built.value)
    assert len(str(built.value)) < 200  # the value itself is never quoted


def test_an_integer_rollout_id_counts_its_digits():
    record = rollout_record(rollout()) | {"rollout_id": 10**MAX_ID_CHARS}  # MAX_ID_CHARS + 1 digits
    with pytest.raises(InvalidRecord, match=LIMIT):
        parse_rollout(record)


def test_the_guard_refuses_a_long_id_with_the_scorers_reason():
    guard = Guard("observed")
    try:
        long = "x" * (MAX_ID_CHARS + 1)
        for start, call, said in [
            ({}, {"tool": long, "arguments": {}}, "call.tool is"),
            ({}, {"tool": "find", "arguments": {}, "call_id": long}, "call.call_id is"),
            ({"rollout_id": long}, {"tool": "find", "arguments": {}}, "'rollout_id' is"),
            ({"labels": {"model": long}}, {"tool": "find", "arguments": {}}, "the value of label 'model' is"),
        ]:
            body = {"start": start, "events": [], "call": call}
            with pytest.raises(GuardRequestError) as refused:
                guard.check_stateless(body)
            assert refused.value.status == 400 and str(refused.value).startswith(said), refused.value
            assert LIMIT in str(refused.value)
        ok = guard.check_stateless({"start": {}, "events": [], "call": {"tool": "x" * MAX_ID_CHARS, "arguments": {}}})
        assert ok["valid"] is not None
    finally:
        guard.shutdown()


def test_a_call_built_by_the_mcp_proxy_is_held_to_the_same_limit():
    """The MCP proxy builds its Call from the client's request, not from a record: the session checks it."""
    session = open_session("observed")
    try:
        with pytest.raises(InvalidRecord, match=f"call.tool is {MAX_ID_CHARS + 1:,} characters, {LIMIT}"):
            session.check(Call("x" * (MAX_ID_CHARS + 1), {}))
        assert session.depth == 0
    finally:
        session.close()


# -- through the scorer ------------------------------------------------------------------------------------------


def score(tmp: Path, source: Path, *, fmt: str, **extra: str) -> tuple[dict, list[dict], list[dict]]:
    run = tmp / "run"
    run_scoring([str(source)], str(run), ScoreSettings(format=fmt, inline=True, **extra))  # type: ignore[arg-type]
    counts = json.loads((run / "_manifest.json").read_text())["counts"]
    rollouts = pq.read_table(run / "rollouts", columns=["rollout_id", "task_id"]).to_pylist()
    return counts, pq.read_table(run / "rejects").to_pylist(), rollouts


def test_openai_logs_with_long_ids_score_the_rest_and_reject_each_on_its_line(tmp_path):
    [path] = write_samples(tmp_path / "logs", ("2026-11-27",), 8, 2)  # the demo's writer of OpenAI chat logs
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines()]
    long = "z" * (MAX_ID_CHARS + 1)
    lines[1]["id"] = long
    lines[3]["model"] = long  # the `model` label's value
    calls = [m for m in lines[5]["messages"] if m.get("tool_calls")]
    calls[0]["tool_calls"][0]["function"]["name"] = long
    lines[6]["task_id"] = "t" * MAX_ID_CHARS  # at the limit: scored
    path.write_bytes(b"".join(orjson.dumps(line) + b"\n" for line in lines))
    counts, rejects, rollouts = score(tmp_path, tmp_path / "logs", fmt="openai")
    assert counts["scored"] == 5 and counts["rejected"] == 3, counts
    assert sorted(r["location"] for r in rejects) == ["line 2", "line 4", "line 6"], rejects
    assert all(LIMIT in r["reason"] and len(r["reason"]) < 300 for r in rejects), rejects
    reasons = sorted(r["reason"].split(":")[-1].split(" is ")[0].strip() for r in rejects)
    assert reasons == ["'rollout_id'", "events[2].tool", "the value of label 'model'"], reasons
    assert max(len(r["rollout_id"]) for r in rollouts) < 100
    assert max(len(r["task_id"]) for r in rollouts) == MAX_ID_CHARS


def otel_score(tmp: Path, *docs: dict) -> tuple[dict, list[dict], list[dict]]:
    (tmp / "logs").mkdir()
    (tmp / "logs" / "spans.jsonl").write_bytes(b"".join(orjson.dumps(d) + b"\n" for d in docs))
    return score(tmp, tmp / "logs", fmt="otel", spec="support")


def other_conversation() -> dict:
    chat = {**CHAT, "gen_ai__conversation__id": "conv-2"}
    return export(span("d" * 32, "e" * 16, "chat", 0, **chat), tool("d" * 32, "f" * 16, 10, "find_customer", "c1"))


def test_a_trace_whose_id_is_too_long_makes_its_conversation_one_reject(tmp_path):
    """A traceId that is neither hex nor base64 is kept as given: the shuffle groups its spans under a short stand-in,
    and the conversation they name is one reject, never scored without them."""
    long = "T" * (MAX_ID_CHARS + 1)
    doc = export(span(long, "c" * 16, "chat", 0, **CHAT), tool(long, "b" * 16, 10, "find_customer", "c1"))
    counts, [reject], rollouts = otel_score(tmp_path, doc, other_conversation())
    assert counts["scored"] == 1 and counts["rejected"] == 1, counts
    assert [r["rollout_id"] for r in rollouts] == ["conv-2"]
    assert reject["location"] == "key conv-9", reject
    assert f"its key is {MAX_ID_CHARS + 1:,} characters, {LIMIT}" in reject["reason"], reject
    assert len(reject["reason"]) < SHORT, reject


def test_a_conversation_id_too_long_is_one_reject_and_its_location_stays_short(tmp_path):
    long = "C" * (MAX_ID_CHARS + 1)
    doc = export(
        span("a" * 32, "c" * 16, "chat", 0, **{**CHAT, "gen_ai__conversation__id": long}),
        tool("a" * 32, "b" * 16, 10, "find_customer", "c1"),
    )
    # a second trace joining the same long conversation: neither is scored
    more = export(span("9" * 32, "8" * 16, "chat", 20, **{**CHAT, "gen_ai__conversation__id": long}))
    counts, rejects, rollouts = otel_score(tmp_path, doc, more, other_conversation())
    assert counts["scored"] == 1 and counts["rejected"] >= 1, counts
    assert [r["rollout_id"] for r in rollouts] == ["conv-2"]
    assert all(len(r["location"]) < SHORT and len(r["reason"]) < 2 * SHORT for r in rejects), rejects
    assert any(f"the key it names is {MAX_ID_CHARS + 1:,} characters" in r["reason"] for r in rejects), rejects
