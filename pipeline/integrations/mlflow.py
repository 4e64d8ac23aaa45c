"""`pexec publish mlflow`: a run's verdicts back on the MLflow traces it was read from, as assessments.

Per tool span a feedback `pexec.executable` (bool; rationale: the failed check, the cause and the environment's
message; metadata: step, check, cause, run and rollout ids); per trace the feedbacks `pexec.fed`, `pexec.T` and
`pexec.executable` (on no span). The source is CODE `pexec`: a rerun finds its own earlier assessments by (name,
span) and updates, keeps or removes them, so publishing twice writes nothing twice.
"""

from __future__ import annotations

from typing import Any

from pipeline.ingest.mlflow import client, reduce
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


def publish(run: str, tracking_uri: str, storage_options: dict[str, Any] | None = None) -> PublishReport:
    verdicts = read_verdicts(run, storage_options)
    reader = client(tracking_uri)  # first: it says when the extra is missing and sets the request bounds
    from mlflow.exceptions import MlflowException
    from mlflow.tracing.client import TracingClient

    writer = TracingClient(tracking_uri)
    report = PublishReport()
    for verdict in verdicts:
        try:
            trace = reader.get_trace(verdict.trace_id, display=False)
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_DOES_NOT_EXIST":
                raise PublishError(f"mlflow: {tracking_uri}: trace {verdict.trace_id}: {exc.message}") from exc
            trace = None
        pairs, why = matched(verdict, reduce(trace) if trace is not None else None)
        if why is not None:
            report.skipped[verdict.trace_id] = why
            continue
        _sync(writer, trace, _wanted(verdict, pairs), report)
        report.traces += 1
    return report


def _wanted(verdict: TraceVerdict, pairs: list[tuple[str, Any]]) -> dict[tuple[str, str | None], Any]:
    """(name, span id) -> the Feedback this run says there."""
    from mlflow.entities import AssessmentSource, Feedback

    source = AssessmentSource(source_type="CODE", source_id=SOURCE)
    out = {
        (name, None): Feedback(name=name, value=value, source=source, rationale=verdict.rationale,
                               metadata=verdict.metadata())
        for name, value in verdict.values().items()
    }  # fmt: skip
    for span_id, step in pairs:
        out[(f"{PREFIX}executable", span_id)] = Feedback(
            name=f"{PREFIX}executable", value=step.valid, source=source, rationale=step.rationale,
            metadata=step_metadata(verdict, step), span_id=span_id,
        )  # fmt: skip
    return out


def _sync(writer: Any, trace: Any, wanted: dict[tuple[str, str | None], Any], report: PublishReport) -> None:
    trace_id = trace.info.trace_id
    mine: dict[tuple[str, str | None], list[Any]] = {}
    for a in trace.info.assessments or []:
        if a.source is not None and a.source.source_id == SOURCE and a.name.startswith(PREFIX):
            mine.setdefault((a.name, a.span_id or None), []).append(a)
    for key, feedback in wanted.items():
        found = mine.pop(key, [])
        for extra in found[1:]:  # a duplicate left by an interrupted earlier publish
            writer.delete_assessment(trace_id, extra.assessment_id)
            report.removed += 1
        if not found:
            writer.log_assessment(trace_id, feedback)
            report.written += 1
        elif _same(found[0], feedback):
            report.unchanged += 1
        else:
            writer.update_assessment(trace_id, found[0].assessment_id, feedback)
            report.updated += 1
    for stale in mine.values():
        for a in stale:
            writer.delete_assessment(trace_id, a.assessment_id)
            report.removed += 1


def _same(found: Any, feedback: Any) -> bool:
    return (found.value, found.rationale, dict(found.metadata or {})) == (
        feedback.value, feedback.rationale, dict(feedback.metadata or {}),
    )  # fmt: skip
