"""The Phoenix round trip on a real Phoenix server (SQLite, started here on loopback): OpenInference's OpenAI
instrumentation traces the scripted support agent (tests/producers.py) against the stub model and exports the
spans to the server, `pexec ingest phoenix` reads them with Phoenix's client, `pexec score` replays them, and
`pexec publish phoenix` writes the verdicts back as annotations, read back here with Phoenix's client."""

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
from trace_servers import phoenix_server, score_support

from pipeline.apps.integrations.phoenix import publish
from pipeline.core.errors import PublishError
from pipeline.ingest import IngestError, IngestOptions, ingest

PRODUCERS = Path(__file__).with_name("producers.py")
PROJECT = "support"


@pytest.fixture(scope="module")
def stub() -> Iterator[Stub]:
    with stub_server() as s:
        yield s


@pytest.fixture(scope="module")
@starts("trace_server")
def server(stub: Stub, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The Phoenix server, holding one trace of the scripted conversation."""
    with phoenix_server(tmp_path_factory.mktemp("phoenix")) as url:
        args = [sys.executable, str(PRODUCERS), "phoenix", stub.base_url, url, PROJECT]
        proc = subprocess.run(args, capture_output=True, text=True, timeout=120)  # returns once they are stored
        assert proc.returncode == 0, proc.stderr
        yield url


@pytest.fixture(scope="module")
def run(server: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("run")
    pexec("ingest", "phoenix", "--endpoint", server, "--project", PROJECT, "--out", "store", cwd=folder)
    score_support(folder / "store", folder / "run")
    return folder / "run"


def read(server: str, **options: str) -> list[dict[str, Any]]:
    extra = {"endpoint": server, "project": PROJECT, **options}
    return list(ingest("phoenix", [], IngestOptions(extra=extra)))


def test_tool_spans_are_the_calls_with_their_arguments_outputs_and_errors(server):
    [record] = read(server)
    calls = [e for e in record["events"] if e["type"] == "call"]
    assert [(c["tool"], json.loads(c["arguments"])) for c in calls] == [(c.tool, c.arguments) for c in CALLS]
    assert json.loads(calls[0]["output"])["customer_id"] == "C104"
    assert json.loads(calls[3]["output"])["carrier"] == "UPS"
    assert [c["error"] for c in calls] == [False, False, True, False]
    assert CANCEL_ERROR in calls[2]["output"]
    assert [(e["role"], e["content"]) for e in record["events"] if e["type"] == "message"] == [("user", USER)]
    assert record["rollout_id"] == record["attributes"]["trace_id"]
    assert record["labels"]["model"] == MODEL
    assert_logged_definitions(record)  # the model spans' request tools


def test_the_window_selects_traces_by_start_time(server):
    assert len(read(server, since="2000-01-01", until="2100-01-01")) == 1
    with pytest.raises(IngestError, match="max_traces takes a positive integer"):
        read(server, max_traces="0")


def test_a_window_that_matches_no_trace_is_a_one_line_error_and_writes_no_store(server, tmp_path):
    said = (
        f"phoenix: project {PROJECT!r} at {server}: "
        "no trace started at or after 2100-01-01T00:00:00+00:00; nothing written"
    )
    with pytest.raises(IngestError) as refused:
        read(server, since="2100-01-01")
    assert str(refused.value) == said
    script = str(Path(sys.executable).with_name("pexec"))
    args = ["ingest", "phoenix", "--endpoint", server, "--project", PROJECT]
    args += ["--since", "2100-01-01", "--out", "store"]
    proc = subprocess.run([script, *args], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert (proc.returncode, proc.stderr.strip()) == (2, f"error: {said}")
    assert not (tmp_path / "store").exists()


def test_scoring_the_trace_gives_the_known_verdicts(run):
    import pyarrow.parquet as pq

    steps = sorted(pq.read_table(run / "steps").to_pylist(), key=lambda s: s["step"])
    assert verdicts(steps) == EXPECTED_STEPS


def annotations(server: str) -> tuple[dict[str, str], list[dict[str, Any]]]:
    """Tool span id -> tool name, and the pexec annotations on the tool spans, through Phoenix's client."""
    from phoenix.client import Client

    client = Client(base_url=server)
    spans = client.spans.get_spans(project_identifier=PROJECT, span_kind="TOOL", limit=100)
    names = {s["context"]["span_id"]: s["attributes"].get("tool.name", s["name"]) for s in spans}
    found = client.spans.get_span_annotations(spans=spans, project_identifier=PROJECT,
                                              include_annotation_names=["pexec.executable"])  # fmt: skip
    return names, found


def test_publish_puts_each_verdict_on_its_tool_span_once(server, run):
    first = pexec("publish", "phoenix", str(run), "--endpoint", server, "--project", PROJECT, cwd=run.parent)
    assert "1 trace(s): 7 value(s) written, 0 updated, 0 unchanged, 0 removed" in first.stderr
    names, found = annotations(server)
    order = [c.tool for c in CALLS]
    per_span = sorted(((names[a["span_id"]], a["result"]) for a in found), key=lambda x: order.index(x[0]))
    assert [(tool, r["label"], r["score"]) for tool, r in per_span] == [
        (tool, "executable" if valid else "not executable", float(valid)) for tool, valid, _ in EXPECTED_STEPS
    ]
    assert "check P failed" in per_span[2][1]["explanation"]
    assert {a["annotator_kind"] for a in found} == {"CODE"} and {a["identifier"] for a in found} == {"pexec"}

    trace_id = json.loads(next((run.parent / "store").glob("*.jsonl")).read_text())["rollout_id"]
    assert trace_values(server, trace_id) == {"pexec.fed": 3.0, "pexec.T": 4.0, "pexec.executable": 0.0}

    stamps = sorted(a["updated_at"] for a in found)
    again = publish(str(run), server, project=PROJECT)  # in this process: the command line was shown above
    assert (again.written, again.updated, again.unchanged, again.skipped) == (0, 0, 7, {})
    assert len(annotations(server)[1]) == 4  # no duplicate
    assert sorted(a["updated_at"] for a in annotations(server)[1]) == stamps  # nothing rewritten
    assert len(trace_values(server, trace_id)) == 3


def test_publish_to_a_project_without_the_runs_traces_fails_naming_the_project(server, run):
    with pytest.raises(PublishError) as refused:
        publish(str(run), server, project="default")  # Phoenix's own project, empty here
    assert str(refused.value) == (
        f"phoenix: {server}: project 'default' holds none of the run's 1 trace(s) (--project names the project the "
        "traces were ingested from)"
    )


def trace_values(server: str, trace_id: str) -> dict[str, float]:
    """The trace's pexec annotations, name -> score, from the server's annotation listing (Phoenix's client has
    no reader of trace annotations)."""
    import httpx

    response = httpx.get(f"{server}/v1/projects/{PROJECT}/trace_annotations",
                         params={"trace_ids": [trace_id], "identifier": "pexec"}, timeout=30)  # fmt: skip
    response.raise_for_status()
    found = response.json()["data"]
    assert len({a["name"] for a in found}) == len(found)
    return {a["name"]: a["result"]["score"] for a in found}
