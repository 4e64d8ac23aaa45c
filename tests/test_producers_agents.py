"""`openai` on a transcript the OpenAI Agents SDK writes: an `Agent` on the chat-completions model talks to the
stub on 127.0.0.1 with `function_tool` tools (one raises), and the SDK's own converter turns the run's items
into chat-completions messages. The script and its known answer are in tests/producers.py."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from producers import (
    CALLS,
    EXPECTED_STEPS,
    SCRIPT,
    Stub,
    assert_logged_definitions,
    ingest_and_score,
    score_with_log_definitions,
    stub_server,
    unique_id,
    verdicts,
)

from pipeline.ingest import IngestOptions, ingest

PRODUCERS = Path(__file__).with_name("producers.py")
ERROR_PREFIX = "An error occurred while running the tool"  # the SDK's default answer for a tool that raised


@pytest.fixture(scope="module")
def stub() -> Iterator[Stub]:
    with stub_server() as s:
        yield s


def produce(base_url: str, out: Path) -> subprocess.CompletedProcess:
    args = [sys.executable, str(PRODUCERS), "agents", base_url, str(out)]
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


def test_an_agents_sdk_transcript_ingests_with_exact_calls_errors_and_pairing(stub, tmp_path):
    path = tmp_path / "transcript.json"
    proc = produce(stub.unique_url, path)
    assert proc.returncode == 0, proc.stderr
    [record] = ingest("openai", [str(path)], IngestOptions(extra={"error_prefix": ERROR_PREFIX}))
    calls = [e for e in record["events"] if e["type"] == "call"]
    ids = [unique_id(c, turn) for turn, calls_of_turn in enumerate(SCRIPT) for c in calls_of_turn]
    assert [(c["tool"], c["call_id"], json.loads(c["arguments"])) for c in calls] == [
        (c.tool, i, c.arguments) for c, i in zip(CALLS, ids, strict=True)
    ]
    assert json.loads(calls[0]["output"])["customer_id"] == "C104"
    assert json.loads(calls[1]["output"])["status"] == "shipped"
    assert calls[2]["output"].startswith(ERROR_PREFIX) and json.loads(calls[3]["output"])["carrier"] == "UPS"
    assert [c["error"] for c in calls] == [False, False, True, False]
    assert "orphan_results" not in record["attributes"]
    assert_logged_definitions(record)  # the request's `tools`, as the SDK's converter wrote them
    [plain] = ingest("openai", [str(path)])  # without the prefix the log says nothing about errors
    assert ["error" in e for e in plain["events"] if e["type"] == "call"] == [False] * 4
    [steps] = ingest_and_score("openai", path, tmp_path, f"error_prefix={ERROR_PREFIX}").values()
    assert verdicts(steps) == EXPECTED_STEPS
    assert {s["schema_source"] for s in steps} == {"spec"}
    # No spec: S is checked against the logged definitions, and the logged error decides P
    logged = score_with_log_definitions(tmp_path)
    assert verdicts(logged) == EXPECTED_STEPS and [s["schema_source"] for s in logged] == ["log"] * 4


def test_the_agents_sdk_refuses_a_reused_call_id(stub, tmp_path):
    # So its transcripts never carry repeated ids; pairing by position is shown by the other producers.
    proc = produce(stub.base_url, tmp_path / "transcript.json")
    assert proc.returncode != 0 and "reused a completed tool call ID" in proc.stderr
