"""`pexec publish phoenix`: a run's verdicts back on the Phoenix traces it was read from, as annotations.

Per tool span a span annotation `pexec.executable` (label `executable` or `not executable`, score 1 or 0;
explanation: the failed check, the cause and the environment's message; metadata: step, check, cause, run and
rollout ids); per trace the trace annotations `pexec.fed`, `pexec.T` (score and label the number) and
`pexec.executable`. Every annotation is of kind CODE with the identifier `pexec`: Phoenix keeps one annotation
per (name, span or trace, identifier) and a rerun updates it in place; only the new and the changed are written,
so publishing an unchanged run again writes nothing (the annotations keep their updated_at).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

import httpx

from pipeline.apps.integrations.verdicts import (
    PREFIX,
    SOURCE,
    PublishReport,
    TraceVerdict,
    matched,
    read_verdicts,
    step_metadata,
)
from pipeline.core.errors import PublishError
from pipeline.ingest.phoenix import TIMEOUT_S, client, traces

if TYPE_CHECKING:  # Phoenix's client is an extra: imported where it is used
    from phoenix.client.__generated__.v1 import AnnotationResult, SpanAnnotationData, TraceAnnotationData

EXECUTABLE = f"{PREFIX}executable"
BATCH = 100  # annotations per write, and spans or traces per read-back request
Held = tuple["AnnotationResult", Mapping[str, Any]]  # what the store holds of an annotation: result, metadata
Wanted = tuple[tuple[str, str], Held]  # an annotation of this run: (name, span or trace id), what the store should hold


def publish(
    run: str, endpoint: str, storage_options: dict[str, Any] | None = None, project: str = "default"
) -> PublishReport:
    verdicts = read_verdicts(run, storage_options)
    http = _http(endpoint)
    c = client(endpoint, http)
    try:
        found = {t.trace_id: t for t in traces(c, project, None, None, len(verdicts), [v.trace_id for v in verdicts])}
        if verdicts and not found:
            raise PublishError(
                f"phoenix: {endpoint}: project {project!r} holds none of the run's {len(verdicts)} trace(s) "
                "(--project names the project the traces were ingested from)"
            )
        report = PublishReport()
        spans: list[SpanAnnotationData] = []
        notes: list[TraceAnnotationData] = []
        for verdict in verdicts:
            pairs, why = matched(verdict, found.get(verdict.trace_id))
            if why is not None:
                report.skipped[verdict.trace_id] = why
                continue
            report.traces += 1
            spans += [
                _span_annotation(span_id, step.valid, step.rationale, step_metadata(verdict, step))
                for span_id, step in pairs
            ]
            notes += _trace_annotations(verdict)
        # Only what is new or changed is written: an unchanged annotation keeps its updated_at.
        changed = _count(http, project, "span", [((a["name"], a["span_id"]), _held(a)) for a in spans], report)
        spans = [a for a in spans if (a["name"], a["span_id"]) in changed]
        changed = _count(http, project, "trace", [((a["name"], a["trace_id"]), _held(a)) for a in notes], report)
        notes = [a for a in notes if (a["name"], a["trace_id"]) in changed]
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


def _result(value: bool | int, explanation: str) -> AnnotationResult:
    """A label and a score: `executable` or `not executable` and 1 or 0, or the number itself (FED, T)."""
    label = ("executable" if value else "not executable") if isinstance(value, bool) else str(value)
    return {"label": label, "score": float(value), "explanation": explanation}


def _span_annotation(span_id: str, valid: bool, explanation: str, metadata: dict[str, str]) -> SpanAnnotationData:
    return {"name": EXECUTABLE, "annotator_kind": "CODE", "identifier": SOURCE, "metadata": metadata,
            "result": _result(valid, explanation), "span_id": span_id}  # fmt: skip


def _trace_annotations(verdict: TraceVerdict) -> list[TraceAnnotationData]:
    return [
        {"name": name, "annotator_kind": "CODE", "identifier": SOURCE, "metadata": verdict.metadata(),
         "result": _result(value, verdict.rationale), "trace_id": verdict.trace_id}
        for name, value in verdict.values().items()
    ]  # fmt: skip


def _held(annotation: SpanAnnotationData | TraceAnnotationData) -> Held:
    return annotation["result"], annotation["metadata"]  # pexec's annotations always carry both


def _count(
    http: httpx.Client, project: str, kind: Literal["span", "trace"], wanted: list[Wanted], report: PublishReport
) -> set[tuple[str, str]]:
    """Which of the `kind` (span or trace) annotations are new, changed or as they were, counted in `report`; the
    ones pexec wrote before are read back through the server's annotation listing
    (`/v1/projects/P/<kind>_annotations`). Returns the keys of those to write: the new and the changed."""
    ids = sorted({target for (_, target), _ in wanted})
    before: dict[tuple[str, str], object] = {}  # as the server lists them: (result, metadata)
    for start in range(0, len(ids), BATCH):
        params: dict[str, str | int | list[str]] = {
            f"{kind}_ids": ids[start : start + BATCH],
            "identifier": SOURCE,
            "limit": 1000,
        }
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
    changed = set()
    for key, held in wanted:
        was = before.get(key)
        if was is None:
            report.written += 1
        elif was == held:
            report.unchanged += 1
            continue
        else:
            report.updated += 1
        changed.add(key)
    return changed
