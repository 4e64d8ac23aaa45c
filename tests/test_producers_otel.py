"""`otel` on what OpenTelemetry's GenAI instrumentation writes: the `openai` SDK instrumented by
`opentelemetry-instrumentation-openai-v2` talks to a chat-completions stub on 127.0.0.1, tools run inside
`opentelemetry-util-genai` `execute_tool` spans, and the SDK's OTLP encoder writes the spans as OTLP JSON; content
capture on and off, with and without tool spans. The script and its known answer are in tests/producers.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from producers import (
    CALLS,
    CANCEL_ERROR,
    EXPECTED_STEPS,
    MODEL,
    Stub,
    assert_logged_definitions,
    ingest_and_score,
    pexec,
    score_with_log_definitions,
    stub_server,
    verdicts,
)

from pipeline.ingest import IngestError, ingest
from pipeline.replay.checker import UNCAPTURED

PRODUCERS = Path(__file__).with_name("producers.py")


@pytest.fixture(scope="module")
def stub() -> Iterator[Stub]:
    with stub_server() as s:
        yield s


def produce(stub: Stub, out: Path, capture: bool, tool_spans: bool = True) -> Path:
    """One conversation in a fresh process (the GenAI semantic-convention opt-in is read once per process)."""
    env = {**os.environ, "OTEL_SEMCONV_STABILITY_OPT_IN": "gen_ai_latest_experimental",
           "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT": "SPAN_ONLY" if capture else "NO_CONTENT"}  # fmt: skip
    args = [sys.executable, str(PRODUCERS), "otel", stub.base_url, str(out), "yes" if tool_spans else "no"]
    proc = subprocess.run(args, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return out


def calls_of(path: Path) -> tuple[dict, list[dict]]:
    [record] = ingest("otel", [str(path)])
    return record, [e for e in record["events"] if e["type"] == "call"]


def test_captured_spans_give_every_call_its_arguments_output_and_error(stub, tmp_path):
    path = produce(stub, tmp_path / "spans.json", capture=True)
    trace_ids = {s["traceId"] for rs in json.loads(path.read_text())["resourceSpans"]
                 for ss in rs["scopeSpans"] for s in ss["spans"]}  # fmt: skip
    assert len(trace_ids) == 1  # protobuf's JSON mapping writes ids as base64; the adapter keeps hex
    record, calls = calls_of(path)
    assert len(record["rollout_id"]) == 32 and int(record["rollout_id"], 16) >= 0
    assert record["labels"] == {"model": MODEL, "agent_version": "1.5.0", "date": record["labels"]["date"]}
    assert [(c["tool"], c["call_id"], json.loads(c["arguments"])) for c in calls] == [
        (c.tool, c.call_id, c.arguments) for c in CALLS
    ]
    # call_1 and call_2 are each used twice: every execute_tool span answers the request before it
    assert json.loads(calls[0]["output"])["customer_id"] == "C104"
    assert json.loads(calls[1]["output"])["status"] == "shipped"
    assert "output" not in calls[2] and json.loads(calls[3]["output"])["carrier"] == "UPS"
    assert [c["error"] for c in calls] == [False, False, True, False]
    assert "orphan_results" not in record["attributes"]
    assert_logged_definitions(record)  # the invoke_agent span's gen_ai.tool.definitions
    [steps] = ingest_and_score("otel", path, tmp_path).values()
    assert verdicts(steps) == EXPECTED_STEPS
    logged = score_with_log_definitions(tmp_path)
    assert verdicts(logged) == EXPECTED_STEPS and [s["schema_source"] for s in logged] == ["log"] * 4


def test_capture_off_leaves_arguments_unknown_and_the_logged_outcome_decides(stub, tmp_path):
    path = produce(stub, tmp_path / "spans.json", capture=False)
    record, calls = calls_of(path)
    assert_logged_definitions(record)  # util-genai records the definitions whatever the content capture
    assert [(c["tool"], c["call_id"], c["arguments"], "output" in c, c["error"]) for c in calls] == [
        (c.tool, c.call_id, None, False, c.tool == "cancel_order") for c in CALLS
    ]
    [steps] = ingest_and_score("otel", path, tmp_path).values()
    assert verdicts(steps) == EXPECTED_STEPS  # cancel_order: rejected by its logged error alone
    assert [(s["decided_by"], s["detail"]) for s in steps] == [
        ("log", UNCAPTURED), ("log", UNCAPTURED), ("log", f"logged error ({UNCAPTURED})"), ("log", UNCAPTURED)
    ]  # fmt: skip


@pytest.fixture(scope="module")
def client_alone(stub, tmp_path_factory) -> Path:
    """Spans of the instrumented client alone (no tool spans), content captured."""
    return produce(stub, tmp_path_factory.mktemp("otel") / "spans.json", capture=True, tool_spans=False)


def test_the_instrumented_client_alone_pairs_tool_responses_from_the_input_messages(client_alone, tmp_path):
    path = client_alone
    record, calls = calls_of(path)
    assert [(c["tool"], c["call_id"], c["arguments"]) for c in calls] == [
        (c.tool, c.call_id, c.arguments) for c in CALLS
    ]
    outputs = [c["output"] for c in calls]
    assert json.loads(outputs[0])["customer_id"] == "C104" and json.loads(outputs[3])["carrier"] == "UPS"
    assert outputs[2] == f"Error: {CANCEL_ERROR}"  # the agent's answer to the model; no error flag is logged
    assert ["error" in c for c in calls] == [False] * 4
    assert "orphan_results" not in record["attributes"]
    [steps] = ingest_and_score("otel", path, tmp_path).values()
    assert verdicts(steps) == EXPECTED_STEPS  # cancel_order: rejected by the spec's rule over get_order's output


def test_the_instrumented_client_alone_with_capture_off_logs_no_call_and_ingest_says_so(stub, tmp_path):
    path = produce(stub, tmp_path / "spans.json", capture=False, tool_spans=False)
    with pytest.raises(IngestError, match=r"1 rollout\(s\) and not one tool call: are these otel logs"):
        list(ingest("otel", [str(path)]))
    script = str(Path(sys.executable).with_name("pexec"))
    proc = subprocess.run([script, "ingest", "otel", str(path), "--out", "store"], capture_output=True, text=True,
                          cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 2 and "not one tool call" in proc.stderr and "Traceback" not in proc.stderr
    pexec("ingest", "otel", str(path), "--out", "store", "--option", "allow_no_calls=true", cwd=tmp_path)


def test_a_lost_chat_span_leaves_its_response_an_orphan_not_another_calls_result(client_alone, tmp_path):
    # Drop the chat span that requested cancel_order (an exporter can lose spans): its response, the second
    # with id call_1, must not become find_customer's output nor vanish.
    doc = json.loads(client_alone.read_text())
    spans = doc["resourceSpans"][0]["scopeSpans"][0]["spans"]
    lost = [s for s in spans if "cancel_order" in json.dumps(s.get("attributes")) and s["name"].startswith("chat")]
    spans.remove(min(lost, key=lambda s: int(s["startTimeUnixNano"])))
    (tmp_path / "lossy.json").write_text(json.dumps(doc))
    record, calls = calls_of(tmp_path / "lossy.json")
    kept = [(c.tool, c.call_id) for c in CALLS if c.tool != "cancel_order"]
    assert [(c["tool"], c["call_id"]) for c in calls] == kept
    assert json.loads(calls[0]["output"])["customer_id"] == "C104"
    assert record["attributes"]["orphan_results"] == "1"
    assert [e["content"] for e in record["events"] if e["type"] == "message" and e["role"] == "tool"] == [
        f"Error: {CANCEL_ERROR}"
    ]
