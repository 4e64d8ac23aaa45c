"""`pexec publish phoenix`: a run's verdicts back on the Phoenix traces it was read from, as annotations.

Per tool span a span annotation `pexec.executable` (label `executable` or `not executable`, score 1 or 0;
explanation: the failed check, the cause and the environment's message; metadata: step, check, cause, run and
rollout ids); per trace the trace annotations `pexec.fed`, `pexec.T` (score and label the number) and
`pexec.executable`. Every annotation is of kind CODE with the identifier `pexec`: Phoenix keeps one annotation
per (name, span or trace, identifier) and a rerun updates it in place, so publishing twice writes nothing twice.
"""

from __future__ import annotations

import os
from typing import Any

import httpx

from pipeline.ingest.phoenix import TIMEOUT_S, client, traces
from pipeline.integrations.verdicts import (
    PREFIX,
    SOURCE,
    PublishError,
    PublishReport,
    TraceVerdict,
    matched,
    read_verdicts,
    step_metadata,
)

EXECUTABLE = f"{PREFIX}executable"
BATCH = 100  # annotations per write, and spans or traces per read-back request


def publish(
    run: str, endpoint: str, storage_options: dict[str, Any] | None = None, project: str = "default"
) -> PublishReport:
    verdicts = read_verdicts(run, storage_options)
    http = _http(endpoint)
    c = client(endpoint, http)
    try:
        found = {t.trace_id: t for t in traces(c, project, None, None, len(verdicts), [v.trace_id for v in verdicts])}
        report = PublishReport()
        spans: list[dict[str, Any]] = []
        notes: list[dict[str, Any]] = []
        for verdict in verdicts:
            pairs, why = matched(verdict, found.get(verdict.trace_id))
            if why is not None:
                report.skipped[verdict.trace_id] = why
                continue
            report.traces += 1
            spans += [
                _annotation(EXECUTABLE, step.valid, step.rationale, step_metadata(verdict, step), span_id=span_id)
                for span_id, step in pairs
            ]
            notes += _trace_annotations(verdict)
        _count(http, project, "span", spans, report)
        _count(http, project, "trace", notes, report)
        for start in range(0, len(spans), BATCH):
            c.spans.log_span_annotations(span_annotations=spans[start : start + BATCH], sync=True)
        for start in range(0, len(notes), BATCH):
            c.traces.log_trace_annotations(trace_annotations=notes[start : start + BATCH], sync=True)
    except httpx.HTTPError as exc:  # an unreachable server, an unknown project, a refused write
        raise PublishError(f"phoenix: {endpoint}: project {project!r}: {exc}") from exc
    finally:
        http.close()
    return report


def _http(endpoint: str) -> httpx.Client:
    """The HTTP client Phoenix's client and the annotation reads share: bounded waits, the API key of
    PHOENIX_API_KEY (as Phoenix's own client takes it) when set."""
    key = os.environ.get("PHOENIX_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=endpoint, headers=headers, timeout=TIMEOUT_S)


def _annotation(name: str, value: bool | int, explanation: str, metadata: dict[str, str], **target: str) -> dict:
    if isinstance(value, bool):
        result = {"label": "executable" if value else "not executable", "score": float(value)}
    else:
        result = {"label": str(value), "score": float(value)}
    return {"name": name, "annotator_kind": "CODE", "identifier": SOURCE, "metadata": metadata,
            "result": result | {"explanation": explanation}, **target}  # fmt: skip


def _trace_annotations(verdict: TraceVerdict) -> list[dict[str, Any]]:
    return [
        _annotation(name, value, verdict.rationale, verdict.metadata(), trace_id=verdict.trace_id)
        for name, value in verdict.values().items()
    ]


def _count(http: httpx.Client, project: str, kind: str, wanted: list[dict[str, Any]], report: PublishReport) -> None:
    """Which of the `kind` (span or trace) annotations are new, changed or as they were: the ones pexec wrote
    before are read back through the server's annotation listing (`/v1/projects/P/<kind>_annotations`)."""
    ids = sorted({a[f"{kind}_id"] for a in wanted})
    before: dict[tuple[str, str], Any] = {}
    for start in range(0, len(ids), BATCH):
        params: dict[str, Any] = {f"{kind}_ids": ids[start : start + BATCH], "identifier": SOURCE, "limit": 1000}
        while True:
            response = http.get(f"v1/projects/{project}/{kind}_annotations", params=params)
            response.raise_for_status()
            body = response.json()
            for a in body.get("data") or []:
                if a.get("identifier") == SOURCE:
                    before[(a["name"], a[f"{kind}_id"])] = (a.get("result") or {}, a.get("metadata") or {})
            if not body.get("next_cursor"):
                break
            params["cursor"] = body["next_cursor"]
    for a in wanted:
        was = before.get((a["name"], a[f"{kind}_id"]))
        if was is None:
            report.written += 1
        elif was == (a["result"], a["metadata"]):
            report.unchanged += 1
        else:
            report.updated += 1
