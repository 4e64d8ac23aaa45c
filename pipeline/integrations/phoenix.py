"""`pexec publish phoenix`: a run's verdicts back on the Phoenix traces it was read from, as annotations.

Per tool span a span annotation `pexec.executable` (label `executable` or `not executable`, score 1 or 0;
explanation: the failed check, the cause and the environment's message; metadata: step, check, cause, run and
rollout ids); per trace the trace annotations `pexec.fed`, `pexec.T` (score and label the number) and
`pexec.executable`. Every annotation is of kind CODE with the identifier `pexec`: Phoenix keeps one annotation
per (name, span or trace, identifier) and a rerun updates it in place, so publishing twice writes nothing twice.
"""

from __future__ import annotations

from typing import Any

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


def publish(
    run: str, endpoint: str, storage_options: dict[str, Any] | None = None, project: str = "default"
) -> PublishReport:
    verdicts = read_verdicts(run, storage_options)
    c = client(endpoint)
    try:
        found = {t.trace_id: t for t in traces(c, project, None, None, len(verdicts), [v.trace_id for v in verdicts])}
    except Exception as exc:  # httpx errors: an unreachable server, an unknown project
        if type(exc).__module__.startswith("httpx"):
            raise PublishError(f"phoenix: {endpoint}: project {project!r}: {exc}") from exc
        raise
    report = PublishReport()
    spans: list[dict[str, Any]] = []
    trace_notes: list[dict[str, Any]] = []
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
        trace_notes += _trace_annotations(verdict)
    _count(c, project, spans, report)
    report.upserted += len(trace_notes)  # Phoenix's client reads no trace annotation back: each is an upsert
    for start in range(0, len(spans), 100):
        c.spans.log_span_annotations(span_annotations=spans[start : start + 100], sync=True)
    for start in range(0, len(trace_notes), 100):
        c.traces.log_trace_annotations(trace_annotations=trace_notes[start : start + 100], sync=True)
    return report


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


def _count(c: Any, project: str, spans: list[dict[str, Any]], report: PublishReport) -> None:
    """Which span annotations are new, changed or as they were (read back before writing)."""
    before = {}
    ids = [a["span_id"] for a in spans]
    found = c.spans.get_span_annotations(
        span_ids=ids, project_identifier=project, include_annotation_names=[EXECUTABLE], timeout=TIMEOUT_S
    )
    for a in found:
        if a.get("identifier") == SOURCE:
            before[a["span_id"]] = (a.get("result") or {}, a.get("metadata") or {})
    for a in spans:
        was = before.get(a["span_id"])
        if was is None:
            report.written += 1
        elif was == (a["result"], a["metadata"]):
            report.unchanged += 1
        else:
            report.updated += 1
