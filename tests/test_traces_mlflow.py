"""The MLflow round trip on a real tracking server (SQLite backend, started here on loopback): MLflow's own
OpenAI autolog traces the scripted support agent (tests/producers.py) against the stub model, `pexec ingest mlflow`
reads the trace through MLflow's client, `pexec score` replays it, and `pexec publish mlflow` writes the verdicts
back as assessments, read back here through MLflow's client."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import starts
from producers import (
    CALLS,
    CANCEL_ERROR,
    EXPECTED_STEPS,
    MODEL,
    USER,
    Stub,
    assert_logged_definitions,
    pexec,
    stub_server,
    verdicts,
)
from trace_servers import mlflow_server, score_support

from pipeline.apps.integrations.mlflow import publish
from pipeline.ingest import IngestError, IngestOptions, ingest

PRODUCERS = Path(__file__).with_name("producers.py")
EXPERIMENT = "support"


@pytest.fixture(scope="module")
def stub() -> Iterator[Stub]:
    with stub_server() as s:
        yield s


@pytest.fixture(scope="module")
@starts("trace_server")
def server(stub: Stub, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The tracking server, holding one trace of the scripted conversation."""
    with mlflow_server(tmp_path_factory.mktemp("mlflow")) as url:
        args = [sys.executable, str(PRODUCERS), "mlflow", stub.base_url, url, EXPERIMENT]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        yield url


@pytest.fixture(scope="module")
def run(server: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`pexec ingest mlflow` then `pexec score` with the support spec."""
    folder = tmp_path_factory.mktemp("run")
    pexec("ingest", "mlflow", "--tracking-uri", server, "--experiment", EXPERIMENT, "--out", "store", cwd=folder)
    score_support(folder / "store", folder / "run")
    return folder / "run"


def read(server: str, **options: str) -> list[dict[str, Any]]:
    extra = {"tracking_uri": server, "experiment": EXPERIMENT, **options}
    return list(ingest("mlflow", [], IngestOptions(extra=extra)))


def test_tool_spans_are_the_calls_with_their_arguments_outputs_and_errors(server):
    [record] = read(server)
    calls = [e for e in record["events"] if e["type"] == "call"]
    assert [(c["tool"], c["arguments"]) for c in calls] == [(c.tool, c.arguments) for c in CALLS]
    assert json.loads(calls[0]["output"])["customer_id"] == "C104"
    assert json.loads(calls[3]["output"])["carrier"] == "UPS"
    assert [c["error"] for c in calls] == [False, False, True, False]
    assert CANCEL_ERROR in calls[2]["output"]  # the exception the tool span recorded: the environment's words
    assert [(e["role"], e["content"]) for e in record["events"] if e["type"] == "message"] == [("user", USER)]
    assert record["rollout_id"] == record["attributes"]["trace_id"] and record["rollout_id"].startswith("tr-")
    assert record["labels"]["model"] == MODEL
    assert_logged_definitions(record)  # the model spans' request tools


def test_the_window_selects_traces_by_start_time(server):
    assert len(read(server, since="2000-01-01", until="2100-01-01")) == 1
    with pytest.raises(IngestError, match="no trace started before 2000-01-01T00:00:00"):
        read(server, until="2000-01-01")
    with pytest.raises(IngestError, match="--since takes an ISO 8601"):
        read(server, since="yesterday")


def test_an_unknown_experiment_is_a_one_line_error(server):
    with pytest.raises(IngestError, match="no experiment named 'nope'"):
        list(ingest("mlflow", [], IngestOptions(extra={"tracking_uri": server, "experiment": "nope"})))


def test_a_window_that_matches_no_trace_is_a_one_line_error_and_writes_no_store(server, tmp_path):
    said = (
        f"mlflow: experiment {EXPERIMENT!r} at {server}: "
        "no trace started at or after 2100-01-01T00:00:00+00:00; nothing written"
    )
    with pytest.raises(IngestError) as refused:
        read(server, since="2100-01-01")
    assert str(refused.value) == said
    script = str(Path(sys.executable).with_name("pexec"))
    args = ["ingest", "mlflow", "--tracking-uri", server, "--experiment", EXPERIMENT]
    args += ["--since", "2100-01-01", "--out", "store"]
    proc = subprocess.run([script, *args], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert (proc.returncode, proc.stderr.strip()) == (2, f"error: {said}")
    assert not (tmp_path / "store").exists()


def test_scoring_the_trace_gives_the_known_verdicts(run):
    import pyarrow.parquet as pq

    steps = sorted(pq.read_table(run / "steps").to_pylist(), key=lambda s: s["step"])
    assert verdicts(steps) == EXPECTED_STEPS


def assessments(server: str) -> tuple[Any, list[Any]]:
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=server)
    [trace] = client.search_traces(locations=[client.get_experiment_by_name(EXPERIMENT).experiment_id])
    return trace, [a for a in trace.info.assessments if a.name.startswith("pexec.")]


def test_publish_puts_each_verdict_on_its_tool_span_once(server, run):
    first = pexec("publish", "mlflow", str(run), "--tracking-uri", server, cwd=run.parent)
    assert "1 trace(s): 7 value(s) written, 0 updated, 0 unchanged, 0 removed" in first.stderr
    trace, found = assessments(server)
    spans = {s.span_id: s.name for s in trace.data.spans}
    per_span = sorted(((spans[a.span_id], a.value, a.rationale) for a in found if a.span_id),
                      key=lambda x: [c.tool for c in CALLS].index(x[0]))  # fmt: skip
    assert [(tool, value) for tool, value, _ in per_span] == [(t, valid) for t, valid, _ in EXPECTED_STEPS]
    cancel = per_span[2][2]
    assert "check P failed" in cancel and "cause " in cancel and "step 3" in cancel
    [cancel_feedback] = [a for a in found if a.span_id and a.value is False]
    assert cancel_feedback.metadata["check"] == "P" and cancel_feedback.source.source_id == "pexec"
    per_trace = {a.name: a.value for a in found if not a.span_id}
    assert per_trace == {"pexec.fed": 3, "pexec.T": 4, "pexec.executable": False}

    again = publish(str(run), server)  # in this process: the command line was shown above
    assert (again.written, again.updated, again.unchanged, again.removed, again.skipped) == (0, 0, 7, 0, {})
    assert len(assessments(server)[1]) == 7  # no duplicate


def test_a_verdict_that_flips_invalid_to_valid_keeps_no_stale_key_and_settles(server, run, tmp_path):
    # The same trace scored without the precondition check: the cancel call (P failed) becomes valid.
    from pipeline.scoring.driver import run_scoring
    from pipeline.scoring.settings import ScoreSettings

    flipped = tmp_path / "run"
    checks = ("schema", "dependency")
    run_scoring(str(run.parent / "store"), str(flipped), ScoreSettings(env="observed", spec="support", inline=True,
                                                                       checks=checks))  # fmt: skip
    try:
        first = publish(str(flipped), server)
        assert (first.written, first.removed) == (0, 0) and first.updated > 0
        trace, found = assessments(server)
        assert len(found) == 7
        spans = {s.span_id: s.name for s in trace.data.spans}
        [cancel] = [a for a in found if a.span_id and spans[a.span_id] == "cancel_order"]
        assert cancel.value is True and "check" not in cancel.metadata and "cause" not in cancel.metadata
        again = publish(str(flipped), server)
        assert (again.written, again.updated, again.unchanged, again.removed) == (0, 0, 7, 0)
    finally:
        back = publish(str(run), server)  # the module's run, as the other tests read it
        assert back.written == 0 and back.removed == 0


def test_a_kwargs_tools_recorded_envelope_is_unwrapped_unless_it_declares_kwargs():
    """MLflow's @mlflow.trace (and OpenInference's decorators) record `def tool(**kwargs)` called as tool(a=1) with
    inputs {"kwargs": {"a": 1}}; the call's arguments are what is inside, unless the declared schema has `kwargs`."""
    from pipeline.ingest.traces import Trace, TraceSpan, events, kwargs_tools

    declared = [
        {"type": "function", "function": {"name": "get_order", "parameters": {"properties": {"order_id": {}}}}},
        {"tool": {"json_schema": json.dumps({"name": "run", "parameters": {"properties": {"kwargs": {}}}})}},
    ]
    assert kwargs_tools(declared) == {"run"}
    model = TraceSpan("m", "chat", "model", 1, kwargs_tools=kwargs_tools(declared))
    spans = (
        model,
        TraceSpan("a", "get_order", "tool", 2, arguments={"kwargs": {"order_id": "O1"}}, output="ok"),
        TraceSpan("b", "get_order", "tool", 3, arguments='{"kwargs": {"order_id": "O2"}}', output="ok"),  # as text
        TraceSpan("c", "run", "tool", 4, arguments={"kwargs": {"x": 1}}, output="ok"),  # declares kwargs: kept
        TraceSpan("d", "get_order", "tool", 5, arguments={"kwargs": {}, "order_id": "O3"}, output="ok"),  # not one
    )
    calls = [e for e in events(Trace("t", 1, spans)) if e["type"] == "call"]
    assert [c["arguments"] for c in calls] == [
        {"order_id": "O1"},
        {"order_id": "O2"},
        {"kwargs": {"x": 1}},
        {"kwargs": {}, "order_id": "O3"},
    ]
