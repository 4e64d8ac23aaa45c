"""`pexec publish mlflow`: a run's verdicts back on the MLflow traces it was read from, as assessments.

Per tool span a feedback `pexec.executable` (bool; rationale: the failed check, the cause and the environment's
message; metadata: step, check, cause, run and rollout ids); per trace the feedbacks `pexec.fed`, `pexec.T` and
`pexec.executable` (on no span). The source is CODE `pexec`: a rerun finds its own earlier assessments by (name,
span) and keeps, replaces (a new one written, the old deleted) or removes them, so publishing twice writes nothing
twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from pipeline.apps.integrations.verdicts import (
    PREFIX,
    SOURCE,
    PublishReport,
    StepVerdict,
    TraceVerdict,
    matched,
    read_verdicts,
    step_metadata,
)
from pipeline.core.errors import PublishError
from pipeline.ingest.mlflow import client, reduce

if TYPE_CHECKING:  # MLflow is an extra: imported where it is used
    from mlflow.entities import Assessment, AssessmentSource, Feedback, Trace
    from mlflow.tracing.client import TracingClient

Where = tuple[str, str | None]  # (assessment name, span id; None on the trace itself)


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


def _wanted(verdict: TraceVerdict, pairs: list[tuple[str, StepVerdict]]) -> dict[Where, Feedback]:
    """(name, span id) -> the Feedback this run says there."""
    from mlflow.entities import AssessmentSource, Feedback

    source = AssessmentSource(source_type="CODE", source_id=SOURCE)
    out: dict[Where, Feedback] = {
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


def _sync(writer: TracingClient, trace: Trace, wanted: dict[Where, Feedback], report: PublishReport) -> None:
    trace_id = trace.info.trace_id
    mine: dict[Where, list[Assessment]] = {}
    for a in trace.info.assessments or []:
        source: AssessmentSource | None = a.source  # MLflow declares one always; a stored record may lack it
        if source is not None and source.source_id == SOURCE and a.name.startswith(PREFIX):
            mine.setdefault((a.name, a.span_id or None), []).append(a)
    for key, feedback in wanted.items():
        found = mine.pop(key, [])
        for extra in found[1:]:  # a duplicate left by an interrupted earlier publish
            writer.delete_assessment(trace_id, _id(extra, trace_id))
            report.removed += 1
        if not found:
            writer.log_assessment(trace_id, feedback)
            report.written += 1
        elif _same(found[0], feedback):
            report.unchanged += 1
        else:
            # A new assessment, then the old one deleted: MLflow's server merges the metadata of an updated one,
            # so keys this verdict no longer has (check, cause after invalid -> valid) would stay. Written first:
            # an interruption between the two leaves a duplicate the next publish removes, never a gap.
            writer.log_assessment(trace_id, feedback)
            writer.delete_assessment(trace_id, _id(found[0], trace_id))
            report.updated += 1
    for stale in mine.values():
        for a in stale:
            writer.delete_assessment(trace_id, _id(a, trace_id))
            report.removed += 1


def _id(assessment: Assessment, trace_id: str) -> str:
    """The id of an assessment read back from the store (which gives every one it keeps an id)."""
    if assessment.assessment_id is None:
        raise PublishError(f"mlflow: trace {trace_id}: assessment {assessment.name!r} came back without an id")
    return assessment.assessment_id


def _same(found: Assessment, feedback: Feedback) -> bool:
    """Whether an earlier publish left this feedback as it is now (an expectation under the name never is)."""
    from mlflow.entities import Feedback

    return isinstance(found, Feedback) and (found.value, found.rationale, dict(found.metadata or {})) == (
        feedback.value, feedback.rationale, dict(feedback.metadata or {}),
    )  # fmt: skip
