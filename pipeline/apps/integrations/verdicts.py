"""A run's verdicts per trace, as `pexec publish` writes them back: read from the run's tables, matched to the
trace's tool spans, and turned into the named values every trace store receives.

Trust first: step k's verdict goes on the k-th tool span of the trace (`pipeline.ingest.traces.tool_spans`, the
order ingest read the calls in) only when the trace still has exactly the run's T tool spans with the same tool
names in that order; a trace that changed, or is gone, is skipped and counted, never annotated by position alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar

from pipeline.core.errors import PublishError
from pipeline.ingest.traces import TRACE_ID, Trace, tool_spans
from pipeline.metrics.run import open_run

SOURCE = "pexec"  # who wrote an assessment or annotation: what a rerun recognises as its own
PREFIX = "pexec."  # every value's name starts with it
MAX_DETAIL = 2000  # characters of the environment's message kept in a rationale (the rest is cut, marked "…")
TRACE_COLUMN = f"attr_{TRACE_ID}"


@dataclass(frozen=True)
class StepVerdict:
    step: int
    tool: str
    valid: bool
    failed_check: str | None
    cause: str | None
    detail: str | None

    @property
    def rationale(self) -> str:
        """Why the call is (not) executable, in one line: the failed check, the cause and the environment's words."""
        if self.valid:
            return f"step {self.step}: executable in the state left by the calls before it"
        detail = self.detail or ""
        said = f": {detail[:MAX_DETAIL]}{'…' if len(detail) > MAX_DETAIL else ''}" if detail else ""
        return f"step {self.step}: check {self.failed_check} failed (cause {self.cause}){said}"


@dataclass(frozen=True)
class TraceVerdict:
    trace_id: str
    rollout_id: str
    run_id: str
    T: int
    fed: int
    executable: bool
    first_cause: str | None
    steps: tuple[StepVerdict, ...]

    def values(self) -> dict[str, int | bool]:
        """The trace-level values: name -> value."""
        return {f"{PREFIX}fed": self.fed, f"{PREFIX}T": self.T, f"{PREFIX}executable": self.executable}

    @property
    def rationale(self) -> str:
        if self.executable:
            return f"all {self.T} calls executable (FED = T + 1 = {self.fed})"
        return f"first invalid call at depth {self.fed} of {self.T} (cause {self.first_cause})"

    def metadata(self) -> dict[str, str]:
        return {"run_id": self.run_id, "rollout_id": self.rollout_id}


@dataclass
class PublishReport:
    traces: int = 0  # traces whose verdicts were put back
    written: int = 0  # values new on the store
    updated: int = 0  # values that were there from an earlier publish, with another value or rationale
    unchanged: int = 0  # values already there as they are
    removed: int = 0  # values of an earlier publish that this run no longer has
    skipped: dict[str, str] = field(default_factory=dict)  # trace id -> why it was not annotated

    def line(self, store: str) -> str:
        out = (f"{store}: {self.traces} trace(s): {self.written} value(s) written, {self.updated} updated, "
               f"{self.unchanged} unchanged, {self.removed} removed")  # fmt: skip
        return out + (f"; {len(self.skipped)} trace(s) skipped" if self.skipped else "")


def read_verdicts(run: str, storage_options: dict[str, Any] | None = None) -> list[TraceVerdict]:
    """The verdicts of every rollout of a complete run that was read from a trace store (attribute `trace_id`)."""
    handle = open_run(run, storage_options)
    rollouts = handle.rollouts()
    if TRACE_COLUMN not in rollouts.column_names:
        raise PublishError(f"{run}: its rollouts were not read from a trace store (no {TRACE_COLUMN} column): "
                           "pexec ingest mlflow|phoenix, then pexec score, make a run to publish")  # fmt: skip
    steps: dict[str, list[StepVerdict]] = {}
    columns = ["rollout_id", "step", "tool", "valid", "failed_check", "cause", "detail", "actor"]
    for s in handle.steps().select(columns).to_pylist():
        if s.pop("actor") == "agent":  # a trace's spans are the agent's calls
            steps.setdefault(s.pop("rollout_id"), []).append(StepVerdict(**s))
    out = []
    for r in rollouts.to_pylist():
        if r[TRACE_COLUMN] is None or r.get("status", "ok") != "ok":
            continue
        own = tuple(sorted(steps.get(r["rollout_id"], []), key=lambda s: s.step))
        out.append(TraceVerdict(r[TRACE_COLUMN], r["rollout_id"], r["run_id"], r["T"], r["fed"], r["executable"],
                                r["first_cause"], own))  # fmt: skip
    return out


def matched(verdict: TraceVerdict, trace: Trace | None) -> tuple[list[tuple[str, StepVerdict]], str | None]:
    """(span id, step verdict) per call when the trace still holds the run's calls; else ([], why not)."""
    if trace is None:
        return [], "the trace is not on the store"
    spans = tool_spans(trace)
    names = [s.name for s in spans]
    expected = [s.tool for s in verdict.steps]
    if len(spans) != verdict.T or names != expected:
        return [], f"its tool spans {names} are not the run's calls {expected}"
    return [(span.span_id, step) for span, step in zip(spans, verdict.steps, strict=True)], None


def step_metadata(verdict: TraceVerdict, step: StepVerdict) -> dict[str, str]:
    found = {"step": str(step.step), "check": step.failed_check, "cause": step.cause}
    return verdict.metadata() | {k: v for k, v in found.items() if v is not None}


Item = TypeVar("Item")


def batched(items: list[Item], size: int) -> Iterator[list[Item]]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
