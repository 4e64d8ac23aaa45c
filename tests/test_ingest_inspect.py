"""`inspect`: Inspect AI `.eval` archives (zip of JSON) -> rollouts, one per sample and epoch."""

from __future__ import annotations

import zipfile
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline.core.records import parse_rollout
from pipeline.envs import EnvOptions, get_environment
from pipeline.ingest import IngestError, IngestOptions, ingest
from pipeline.replay.checker import replay

HEADER = {"version": 2, "status": "success",
          "eval": {"eval_id": "EV1", "run_id": "RUN1", "task": "support", "model": "openai/gpt-x",
                   "created": "2026-11-29T01:02:03+00:00"}}  # fmt: skip


def tc(cid: str, fn: str, args: dict, parse_error: str | None = None) -> dict:
    return {"id": cid, "function": fn, "arguments": args, "type": "function", "parse_error": parse_error}


def sample(sid: Any, epoch: int, score: Any, *messages: dict) -> dict:
    return {"id": sid, "epoch": epoch, "input": "x", "target": "",
            "messages": [{"role": "system", "content": "Be helpful."}, *messages],
            "scores": {"match": {"value": score}}, "metadata": {"agent_version": "v3"}}  # fmt: skip


SAMPLE = sample(
    7, 1, "C",
    {"role": "user", "content": [{"type": "text", "text": "I'm ava@example.com"}]},
    {"role": "assistant", "content": "", "tool_calls": [
        tc("t1", "find_customer", {"email": "ava@example.com"}),
        tc("t2", "list_orders", {}, parse_error="Expecting value: line 1 column 17"),
        tc("t3", "list_orders", {"customer_id": "C104"})]},
    {"role": "tool", "tool_call_id": "t3", "function": "list_orders", "content": "",
     "error": {"type": "unknown", "message": "backend timeout"}},
    {"role": "tool", "tool_call_id": "t1", "function": "find_customer", "content": '{"customer_id": "C104"}',
     "error": None},
)  # fmt: skip


def eval_file(path: Path, samples: list[dict], header: str = "header.json") -> Path:
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("_journal/start.json", orjson.dumps(HEADER))
        if header:
            z.writestr(header, orjson.dumps(HEADER))
        for s in samples:
            z.writestr(f"samples/{s['id']}_epoch_{s['epoch']}.json", orjson.dumps(s))
        z.writestr("summaries.json", b"[]")
    return path


def read(*paths: Path, **extra: str) -> list[dict]:
    return list(ingest("inspect", [str(p) for p in paths], IngestOptions(extra=extra)))


def test_samples_calls_errors_and_labels(tmp_path):
    (tmp_path / "logs").mkdir()
    eval_file(tmp_path / "logs" / "a.eval", [SAMPLE, {**SAMPLE, "epoch": 2, "scores": {"match": {"value": "I"}}}])
    recs = read(tmp_path / "logs")
    assert [(r["rollout_id"], r["task_id"], r["success"]) for r in recs] == [
        ("EV1/7/1", "7", True),
        ("EV1/7/2", "7", False),
    ]
    assert recs[0]["labels"] == {"model": "openai/gpt-x", "agent_version": "v3", "date": "2026-11-29"}
    calls = [e for e in recs[0]["events"] if e["type"] == "call"]
    assert [(c["tool"], c.get("output"), c.get("error")) for c in calls] == [
        ("find_customer", '{"customer_id": "C104"}', False),
        ("list_orders", None, None),  # parse error, no tool message
        ("list_orders", "backend timeout", True),
    ]
    env = get_environment("observed", EnvOptions(spec="support"))
    steps = replay(env, parse_rollout(recs[0])).steps
    assert [(s.valid, s.failed_check, s.decided_by) for s in steps] == [
        (True, None, "log"),
        (False, "S", None),
        (False, "P", "log"),
    ]


def test_journal_only_log_and_named_scorer(tmp_path):
    two = {**SAMPLE, "scores": {"match": {"value": 0}, "judge": {"value": 1.0}}}
    [rec] = read(eval_file(tmp_path / "b.eval", [two], header=""), scorer="judge")
    assert rec["success"] is True
    with pytest.raises(IngestError, match="no scorer 'nope'"):
        read(tmp_path / "b.eval", scorer="nope")


def test_not_an_eval_archive(tmp_path):
    (tmp_path / "c.eval").write_text("not a zip")
    with pytest.raises(IngestError, match=r"c\.eval: cannot read the \.eval archive"):
        read(tmp_path / "c.eval")
    with zipfile.ZipFile(tmp_path / "d.eval", "w") as z:
        z.writestr("header.json", orjson.dumps(HEADER))
        z.writestr("samples/1_epoch_1.json", b"{broken")
    with pytest.raises(IngestError, match=r"d\.eval!samples/1_epoch_1\.json: not JSON"):
        read(tmp_path / "d.eval")
