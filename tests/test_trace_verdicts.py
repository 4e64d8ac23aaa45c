"""The pure parts of the trace-store round trips: which span a step's verdict goes on, when a trace is refused,
what a rationale says, how the window and Phoenix's attributes are read. The servers: tests/test_traces_*.py."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from pipeline.apps.integrations import mlflow, phoenix
from pipeline.apps.integrations.verdicts import MAX_DETAIL, StepVerdict, TraceVerdict, matched
from pipeline.core.errors import PublishError
from pipeline.ingest import IngestError, IngestOptions, ingest
from pipeline.ingest.phoenix import nested
from pipeline.ingest.traces import Trace, TraceSpan, events, parse_time, tool_spans


def span(span_id: str, name: str, start: int, kind: str = "tool", **more) -> TraceSpan:
    return TraceSpan(span_id, name, kind, start, **more)


STEPS = (
    StepVerdict(1, "find", True, None, None, None),
    StepVerdict(2, "cancel", False, "P", "precondition", "shipped"),
)
VERDICT = TraceVerdict("t1", "t1", "run", 2, 2, False, "precondition", STEPS)


def test_step_k_goes_on_the_kth_tool_span_by_start_time_then_span_id():
    trace = Trace("t1", 0, (span("b", "cancel", 20), span("m", "chat", 5, "model"), span("z", "find", 10)))
    assert [s.span_id for s in tool_spans(trace)] == ["z", "b"]
    pairs, why = matched(VERDICT, trace)
    assert why is None and [(span_id, step.tool) for span_id, step in pairs] == [("z", "find"), ("b", "cancel")]
    tie = Trace("t1", 0, (span("b", "cancel", 10), span("a", "find", 10)))  # same start: span id decides
    assert [s.span_id for s in tool_spans(tie)] == ["a", "b"]


@pytest.mark.parametrize(
    ("spans", "reason"),
    [
        ((span("a", "find", 1),), "are not the run's calls"),  # a span gone
        ((span("a", "cancel", 1), span("b", "find", 2)), "are not the run's calls"),  # another order
        ((span("a", "find", 1), span("b", "cancel", 2), span("c", "find", 3)), "are not the run's calls"),
    ],
)
def test_a_trace_that_no_longer_holds_the_runs_calls_is_never_annotated(spans, reason):
    pairs, why = matched(VERDICT, Trace("t1", 0, spans))
    assert pairs == [] and reason in why
    assert matched(VERDICT, None) == ([], "the trace is not on the store")


def test_a_rationale_names_the_check_the_cause_and_the_environments_words_within_its_limit():
    assert STEPS[1].rationale == "step 2: check P failed (cause precondition): shipped"
    long = StepVerdict(3, "x", False, "S", "schema", "y" * (MAX_DETAIL + 50))
    assert long.rationale.endswith("y…") and len(long.rationale) < MAX_DETAIL + 60
    assert VERDICT.values() == {"pexec.fed": 2, "pexec.T": 2, "pexec.executable": False}


def test_a_failed_tool_span_without_output_logs_its_error_message():
    said = ({"role": "user", "content": "hi"},)
    failed = span("a", "cancel", 2, error=True, error_message="shipped", arguments={"id": 1})
    trace = Trace("t1", 0, (span("m", "chat", 1, "model", messages=said), failed))
    assert events(trace) == [
        {"type": "message", "role": "user", "content": "hi", "turn": 1},
        {"type": "call", "tool": "cancel", "arguments": {"id": 1}, "turn": 1, "output": "shipped", "error": True},
    ]


def test_the_window_is_utc_and_a_date_alone_is_midnight():
    assert parse_time("2026-12-01", "since", "mlflow") == datetime(2026, 12, 1, tzinfo=UTC)
    assert parse_time("2026-12-01T08:00+02:00", "since", "mlflow") == datetime(2026, 12, 1, 6, tzinfo=UTC)
    assert parse_time(None, "since", "mlflow") is None
    with pytest.raises(IngestError, match="--until takes an ISO 8601"):
        parse_time("soon", "until", "phoenix")


def test_phoenix_attributes_read_the_same_flat_or_nested():
    flat = {"llm.input_messages.0.message.role": "user", "tool.name": "find", "input.value": '{"a": 1}'}
    deep = {"llm": {"input_messages": {"0": {"message": {"role": "user"}}}}, "tool": {"name": "find"},
            "input": {"value": '{"a": 1}'}}  # fmt: skip
    assert nested(flat) == nested(deep) == deep


def test_file_formats_need_sources_and_trace_stores_take_none():
    with pytest.raises(IngestError, match="openai: give the files or folders to read"):
        list(ingest("openai", []))
    with pytest.raises(IngestError, match="mlflow: reads from a tracking server"):
        list(ingest("mlflow", ["traces.json"], IngestOptions(extra={"tracking_uri": "http://127.0.0.1:9"})))
    with pytest.raises(IngestError, match="--tracking-uri URI --experiment NAME"):
        list(ingest("mlflow", []))
    with pytest.raises(IngestError, match="phoenix: give the Phoenix server"):
        list(ingest("phoenix", []))
    with pytest.raises(IngestError, match=r"unknown option\(s\) experiment"):
        list(ingest("phoenix", [], IngestOptions(extra={"endpoint": "http://127.0.0.1:9", "experiment": "x"})))


def test_publish_refuses_a_run_not_read_from_a_trace_store(tmp_path):
    from pipeline.scoring.driver import run_scoring
    from pipeline.scoring.settings import ScoreSettings
    from pipeline.storage.stores import write_store
    from pipeline.synthetic.rollouts import synthesize

    write_store(synthesize("shop", 4, 2, 0), str(tmp_path / "store"), "jsonl")
    run_scoring(str(tmp_path / "store"), str(tmp_path / "run"), ScoreSettings(inline=True))
    for publish in (mlflow.publish, phoenix.publish):  # refused before any server is asked
        with pytest.raises(PublishError, match="not read from a trace store"):
            publish(str(tmp_path / "run"), "http://127.0.0.1:9")


@pytest.mark.parametrize(
    "fmt, extra",
    [
        ("mlflow", {"tracking_uri": "http://127.0.0.1:9", "experiment": "x"}),
        ("phoenix", {"endpoint": "http://127.0.0.1:9"}),
    ],
)
def test_a_server_that_does_not_answer_is_a_one_line_error_not_a_hang(fmt, extra):
    with pytest.raises(IngestError, match=rf"^{fmt}: http://127.0.0.1:9: "):
        list(ingest(fmt, [], IngestOptions(extra=extra)))  # bounded: one retry, 30 s per request at most
