"""The guard's library API: a live agent's session checks its next call before it runs, then records what
happened (docs/explanation/architecture.md, "The guard").

A session is the batch checker's own `Session` (pipeline.replay.checker), so its steps equal what `pexec score`
writes for the same rollout. It holds an environment instance of its own, leased from a pool: the spec and
τ environments keep one state per instance.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypedDict

import orjson

from pipeline.core.errors import InvalidRecord, SessionFull
from pipeline.core.model import NOT_LOGGED, Call, Message, Rollout, RolloutResult, StepResult
from pipeline.core.records import MAX_DEPTH, event_record, too_deep
from pipeline.envs import Environment, EnvOptions, get_environment, new_environment
from pipeline.envs.observed import NO_ERROR_NOTE
from pipeline.replay.checker import Session, Verdict


class VerdictJSON(TypedDict):
    """A GuardVerdict as the services answer it (`POST /sessions/{id}/check`, the MCP log's `guard`)."""

    step: int
    valid: bool
    failed_check: str | None
    cause: str | None
    detail: str | None
    message: str | None
    decided_by: str | None
    output: Any  # a tool's output, as the simulator returned it


@dataclass(frozen=True, slots=True)
class GuardVerdict:
    """The verdict on a call before it runs: the step it would be, whether it is executable, and why not."""

    step: int
    valid: bool
    failed_check: str | None  # S, D or P; None when valid
    cause: str | None
    detail: str | None
    message: str | None  # the environment's own rejection message
    decided_by: str | None
    output: Any = None  # a simulator's output for an accepted call (None without a simulator)

    @classmethod
    def of(cls, step: int, verdict: Verdict, simulated: bool) -> GuardVerdict:
        output = verdict.outcome.output if verdict.outcome is not None and verdict.valid and simulated else None
        why = (verdict.check, verdict.cause, verdict.detail, verdict.message, verdict.decided_by)
        return cls(step, verdict.valid, *why, output)

    def to_json(self) -> VerdictJSON:
        return {
            "step": self.step,
            "valid": self.valid,
            "failed_check": self.failed_check,
            "cause": self.cause,
            "detail": self.detail,
            "message": self.message,
            "decided_by": self.decided_by,
            "output": self.output,
        }


# What a kept event costs in memory besides its JSON text: the Python objects of the rollout, the checker's
# history and its word index. Measured: 9,000 small calls (0.85 MiB of JSON) grew a guard's RSS by 11 MB.
EVENT_OVERHEAD = 1024


@dataclass(frozen=True)
class SessionBudget:
    """What one session may hold: its events, and their bytes — each event's canonical JSON (the log
    `pexec score` reads) plus EVENT_OVERHEAD, so the count follows the memory the session really takes."""

    max_events: int = 10_000
    max_bytes: int = 16 * 1024 * 1024


RECORD_TOO_DEEP = f"the record nests deeper than {MAX_DEPTH} levels"  # the scorer's own reject reason


def check_event(event: Call | Message) -> bytes:
    """The event's canonical JSON, or InvalidRecord with the reason `pexec score` would reject its rollout for
    (the guard refuses a call the nightly rescore could not read)."""
    record = event_record(event)
    # An event sits two levels below its rollout record (the record, its `events` list): checked in that place.
    if too_deep({"events": [record]}):
        raise InvalidRecord(RECORD_TOO_DEEP)
    try:
        return orjson.dumps(record)
    except TypeError as exc:
        raise InvalidRecord(f"the event is not JSON: {exc}") from exc


def check_start(env: dict[str, Any]) -> None:
    """A session's start as the record's `env` (one level below the record)."""
    if too_deep({"env": env}):
        raise InvalidRecord(RECORD_TOO_DEEP)


class EnvironmentPool:
    """Environment instances to lend to sessions, one per live session, reused once it closes."""

    def __init__(self) -> None:
        self._free: dict[tuple[str, EnvOptions], list[Environment]] = {}
        self._lock = threading.Lock()

    def lease(self, name: str, options: EnvOptions) -> Environment:
        get_environment(name, options)  # resolves the name once, with the registry's one-line errors
        with self._lock:
            free = self._free.get((name, options))
            if free:
                return free.pop()
        return new_environment(name, options)

    def release(self, name: str, options: EnvOptions, env: Environment) -> None:
        with self._lock:
            self._free.setdefault((name, options), []).append(env)


POOL = EnvironmentPool()


class GuardSession:
    """One live agent's session: `check` a call before it runs, `record` what really happened, add
    user/system `message`s as they arrive. Every event is kept in `rollout` (a canonical rollout)."""

    def __init__(
        self,
        env: Environment,
        start: Rollout,
        on_close: Callable[[Environment], None] | None = None,
        budget: SessionBudget | None = None,
    ) -> None:
        check_start(start.env)
        self.env = env
        self.rollout = replace(start, events=[])
        self.budget = budget  # None: no budget (the library's default; the services set theirs)
        self.bytes = 0  # of the events kept: their canonical JSON and EVENT_OVERHEAD each
        self._session = Session(env, start)
        self._on_close = on_close

    def _admit(self, event: Call | Message) -> None:
        """Count `event` against the budget before it is kept (SessionFull when it would not fit)."""
        size = len(check_event(event)) + EVENT_OVERHEAD
        budget = self.budget
        if budget is None:
            self.bytes += size
            return
        if len(self.rollout.events) >= budget.max_events:
            raise SessionFull(f"the session holds its limit of {budget.max_events} events: close it, open a new one")
        if self.bytes + size > budget.max_bytes:
            raise SessionFull(
                f"the session would hold more than {budget.max_bytes} bytes of events: close it, open a new one"
            )
        self.bytes += size

    @property
    def depth(self) -> int:
        """The number of calls recorded so far."""
        return len(self._session.steps)

    @property
    def steps(self) -> list[StepResult]:
        return self._session.steps

    def check(self, call: Call) -> GuardVerdict:
        """The verdict on `call` as the next step. Nothing is recorded: check again after a repair. A call the
        batch scorer would reject with its rollout (nested too deep) raises InvalidRecord with that reason."""
        check_event(call)
        verdict = GuardVerdict.of(self.depth + 1, self._session.check(call), self.env.simulated)
        # Checked before it runs: there is no logged outcome for a rule's refusal to contradict.
        return replace(
            verdict,
            detail=verdict.detail and verdict.detail.removesuffix(NO_ERROR_NOTE),
            message=verdict.message and verdict.message.removesuffix(NO_ERROR_NOTE),
        )

    def record(self, call: Call, output: Any = NOT_LOGGED, error: bool | None = None) -> StepResult:
        """Add `call` as the next step with its real outcome: the production tool's output (or, in a
        simulated environment, what the simulator returned) and whether it was an error. An output of None
        is "not known", as `null` is in a canonical log."""
        if output is not NOT_LOGGED or error is not None:
            call = replace(call, output=NOT_LOGGED if output is None else output, error=error)
        self._admit(call)
        self.rollout.events.append(call)
        return self._session.record(call)

    def message(self, role: str, content: str, turn: int = 0) -> None:
        message = Message(role, content, turn)
        self._admit(message)
        self.rollout.events.append(message)
        self._session.message(role, content)

    def result(self) -> RolloutResult:
        return RolloutResult(self.rollout, list(self._session.steps))

    def close(self) -> None:
        if self._on_close is not None:
            self._on_close(self.env)
            self._on_close = None


def open_session(
    name: str,
    env: dict[str, Any] | None = None,
    *,
    options: EnvOptions | None = None,
    rollout_id: str = "guard",
    task_id: str = "guard",
    labels: dict[str, str] | None = None,
    pool: EnvironmentPool = POOL,
    budget: SessionBudget | None = None,
) -> GuardSession:
    """A guard session in environment `name` (any registered one, as `pexec score --env`), starting from
    `env` (a rollout's `env` field) and the rollout-level fields an environment may read. `budget`: what the
    session may hold (None: no limit but the batch scorer's record limits, which every session applies)."""
    options = options or EnvOptions()
    start = Rollout(rollout_id, task_id, name, labels=dict(labels or {}), env=dict(env or {}))
    instance = pool.lease(name, options)
    try:
        return GuardSession(instance, start, lambda e: pool.release(name, options, e), budget)
    except Exception:
        pool.release(name, options, instance)
        raise
