"""The guard's library API: a live agent's session checks its next call before it runs, then records what
happened (docs/explanation/architecture.md, "The guard").

A session is the batch checker's own `Session` (pipeline.replay.checker), so its steps equal what `pexec score`
writes for the same rollout. It holds an environment instance of its own, leased from a pool: the spec and
τ environments keep one state per instance.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, TypedDict

import orjson

from pipeline.core.errors import GuardFull, InvalidRecord, SessionFull
from pipeline.core.model import NOT_LOGGED, Call, Message, Rollout, RolloutResult, StepResult
from pipeline.core.records import (
    MAX_DEPTH,
    check_call_names,
    check_repeated,
    event_record,
    repeated_chars,
    too_deep,
)
from pipeline.core.text import clipped
from pipeline.envs import Environment, EnvOptions, get_environment, new_environment
from pipeline.envs.observed import NO_ERROR_NOTE
from pipeline.replay.checker import MAX_DETAIL_CHARS, Session, Verdict
from pipeline.replay.dependencies import INDEX_ENTRY_BYTES


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
        """The checker's verdict on a call checked before it runs: there is no logged outcome yet for a rule's
        refusal to contradict, so the replay's note that the log shows no error is left out."""
        output = verdict.outcome.output if verdict.outcome is not None and verdict.valid and simulated else None
        detail, message = verdict.detail, verdict.message
        detail = detail and clipped(detail.removesuffix(NO_ERROR_NOTE), MAX_DETAIL_CHARS)  # as a scored step's
        message = message and clipped(message.removesuffix(NO_ERROR_NOTE), MAX_DETAIL_CHARS)
        return cls(step, verdict.valid, verdict.check, verdict.cause, detail, message, verdict.decided_by, output)

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


# What a kept event costs in memory besides its JSON text: the Python objects of the rollout and the checker's
# history. Measured: 9,000 small calls (0.85 MiB of JSON) grew a guard's RSS by 11 MB.
EVENT_OVERHEAD = 1024
# A session's `env` is held as Python objects (its rollout's field), and an environment may take a copy of
# what it starts from (a spec environment's `state`): it counts twice its objects' size, measured by walking
# them (a 7.8 MiB JSON `env` of small objects is 86 MiB of them, which a count of its JSON missed).
ENV_COPIES = 2


def with_slack(size: int) -> int:
    """`size` bytes of Python objects as resident memory: the allocator's partly used pages come on top (measured:
    a 7.8 MiB `env` as a spec state, 158 MiB of objects counted twice, took 170 MiB; an empty τ-retail session
    11.8 MiB of objects, 12.3 MiB), so a quarter more."""
    return size * 5 // 4


@dataclass(frozen=True)
class SessionBudget:
    """What one session may hold: its events, and their bytes — each event's canonical JSON (the log
    `pexec score` reads) plus EVENT_OVERHEAD, its `env` (ENV_COPIES times its objects' size) and its word index
    (INDEX_ENTRY_BYTES an entry, the index capped to what is left), so the count follows the memory the session
    really takes. What an empty session of the environment costs is counted apart (`GuardSession.base`)."""

    max_events: int = 10_000
    max_bytes: int = 16 * 1024 * 1024


class MemoryBudget:
    """The bytes all sessions of a guard may hold together (their `cost`): a session takes what it adds before it
    keeps it, and gives it all back when it closes. Thread-safe."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._lock = threading.Lock()

    def room(self) -> int:
        return max(self.limit - self.held, 0)

    def take(self, size: int, what: str) -> None:
        """Count `size` more bytes, or GuardFull naming `what` when they would not fit."""
        with self._lock:
            if self.held + size > self.limit:
                raise GuardFull(
                    f"the guard holds {self.held} of its {self.limit} bytes of sessions: {what} needs {size} more; "
                    "close sessions, or wait for idle ones to expire"
                )
            self.held += size

    def give(self, size: int) -> None:
        with self._lock:
            self.held -= size

    def grow(self, size: int) -> None:
        """Count `size` more bytes without a check: what was capped beforehand to the room there was."""
        with self._lock:
            self.held += size


def held_size(value: Any, stop: int) -> int:
    """The bytes of `value`'s Python objects (containers, strings, numbers: what JSON decodes to), walked until
    they pass `stop` (then any number over it): the walk costs at most as much as the budget it checks."""
    total, pending, seen = 0, [value], set()
    while pending and total <= stop:
        item = pending.pop()
        if id(item) in seen:  # an object held twice (a key every record repeats, a small int) is held once
            continue
        seen.add(id(item))
        total += sys.getsizeof(item)
        if isinstance(item, dict):
            pending.extend(item.keys())
            pending.extend(item.values())
        elif isinstance(item, list | tuple):
            pending.extend(item)
    return total


RECORD_TOO_DEEP = f"the record nests deeper than {MAX_DEPTH} levels"  # the scorer's own reject reason


def check_event(event: Call | Message) -> bytes:
    """The event's canonical JSON, or InvalidRecord with the reason `pexec score` would reject its rollout for
    (the guard refuses a call the nightly rescore could not read)."""
    if type(event) is Call:
        check_call_names(event, "call")
    record = event_record(event)
    placed = {"events": [record]}  # an event sits two levels below its rollout record: checked in that place
    try:
        text = orjson.dumps(record)
    except TypeError as exc:  # orjson also refuses more levels than it writes
        if too_deep(placed):
            raise InvalidRecord(RECORD_TOO_DEEP) from None
        raise InvalidRecord(f"the event is not JSON: {exc}") from exc
    # Its levels are at most its brackets (those in strings included): the walk only when they could be too many,
    # which a call's few brackets never are (it cost more than the rest of a check).
    if text.count(b"[") + text.count(b"{") > MAX_DEPTH - 2 and too_deep(placed):
        raise InvalidRecord(RECORD_TOO_DEEP)
    return text


def check_start(env: dict[str, Any]) -> None:
    """A session's start as the record's `env` (one level below the record)."""
    if too_deep({"env": env}):
        raise InvalidRecord(RECORD_TOO_DEEP)


POOL_FREE = 8  # unused environment instances a pool keeps, per environment


class EnvironmentPool:
    """Environment instances to lend to sessions, one per live session, reused once it closes; at most
    `max_free` of each are kept unused (the others are dropped: their memory is not held for a peak gone by)."""

    def __init__(self, max_free: int = POOL_FREE) -> None:
        self.max_free = max_free
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
            free = self._free.setdefault((name, options), [])
            if len(free) < self.max_free:
                free.append(env)


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
        memory: MemoryBudget | None = None,
        base: int = 0,
    ) -> None:
        check_start(start.env)
        self.env = env
        self.rollout = replace(start, events=[])
        self.budget = budget  # None: no budget (the library's default; the services set theirs)
        self.memory = memory  # the guard's, shared by its sessions (None: not counted together)
        self.base = base  # what an empty session of the environment costs, measured by the guard
        self.bytes = 0  # held: events (their canonical JSON and EVENT_OVERHEAD each), `env`, the word index
        self._index = 0  # word index entries counted in `bytes`
        self._own = repeated_chars(start)  # what the steps table would repeat on each call (records.check_repeated)
        stop = budget.max_bytes if budget is not None else sys.maxsize
        env_size = with_slack(ENV_COPIES * held_size(start.env, stop // ENV_COPIES))
        if budget is not None and env_size > budget.max_bytes:
            raise SessionFull(
                f"the session's env takes over {budget.max_bytes} bytes in memory (its budget): start from less"
            )
        if memory is not None:
            memory.take(base + env_size, "a new session")
        self.bytes = env_size
        self._on_close = on_close
        try:
            self._session = Session(env, start)
            self._counted()
        except BaseException:
            self._give_back()
            raise

    @property
    def cost(self) -> int:
        """The memory the session takes: what it holds and what its environment costs empty."""
        return self.base + self.bytes

    def _admit(self, event: Call | Message) -> None:
        """Count `event` against the budgets before it is kept (SessionFull when it would not fit)."""
        size = len(check_event(event)) + EVENT_OVERHEAD
        budget = self.budget
        if budget is not None:
            if len(self.rollout.events) >= budget.max_events:
                raise SessionFull(
                    f"the session holds its limit of {budget.max_events} events: close it, open a new one"
                )
            if self.bytes + size > budget.max_bytes:
                raise SessionFull(
                    f"the session would hold more than {budget.max_bytes} bytes of events: close it, open a new one"
                )
        if self.memory is not None:
            self.memory.take(size, "the event")
        self.bytes += size

    def _indexing(self) -> None:
        """Cap the word index to what the budgets leave, before the history grows it."""
        history = self._session.history
        room = sys.maxsize
        if self.budget is not None:
            room = self.budget.max_bytes - self.bytes
        if self.memory is not None:
            room = min(room, self.memory.room())
        history.index_budget = history.indexed + max(room, 0) // INDEX_ENTRY_BYTES

    def _counted(self) -> None:
        """Count what the word index grew (or gave back) by."""
        indexed = self._session.history.indexed
        grown = (indexed - self._index) * INDEX_ENTRY_BYTES
        self._index = indexed
        self.bytes += grown
        if self.memory is not None:
            self.memory.grow(grown)  # within the room `_indexing` left (or less: given back)

    def _give_back(self) -> None:
        if self.memory is not None:
            self.memory.give(self.cost)
            self.memory = None

    @property
    def depth(self) -> int:
        """The number of calls recorded so far."""
        return len(self._session.steps)

    @property
    def steps(self) -> list[StepResult]:
        return self._session.steps

    def check(self, call: Call) -> GuardVerdict:
        """The verdict on `call` as the next step. Nothing is recorded: check again after a repair. A call the
        batch scorer would reject with its rollout (nested too deep, or one call too many for the text its steps
        repeat) raises InvalidRecord with that reason."""
        check_event(call)
        check_repeated(self._own, self.depth + 1)
        self._indexing()
        try:
            return GuardVerdict.of(self.depth + 1, self._session.check(call), self.env.simulated)
        finally:
            self._counted()

    def record(self, call: Call, output: Any = NOT_LOGGED, error: bool | None = None) -> StepResult:
        """Add `call` as the next step with its real outcome: the production tool's output (or, in a
        simulated environment, what the simulator returned) and whether it was an error. An output of None
        is "not known", as `null` is in a canonical log."""
        if output is not NOT_LOGGED or error is not None:
            call = replace(call, output=NOT_LOGGED if output is None else output, error=error)
        check_repeated(self._own, self.depth + 1)
        self._admit(call)
        self.rollout.events.append(call)
        self._indexing()
        try:
            return self._session.record(call)
        finally:
            self._counted()

    def message(self, role: str, content: str, turn: int = 0) -> None:
        message = Message(role, content, turn)
        self._admit(message)
        self.rollout.events.append(message)
        self._session.message(role, content)

    def result(self) -> RolloutResult:
        return RolloutResult(self.rollout, list(self._session.steps))

    def close(self) -> None:
        self._give_back()
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
    memory: MemoryBudget | None = None,
    base: int = 0,
) -> GuardSession:
    """A guard session in environment `name` (any registered one, as `pexec score --env`), starting from
    `env` (a rollout's `env` field) and the rollout-level fields an environment may read. `budget`: what the
    session may hold (None: no limit but the batch scorer's record limits, which every session applies)."""
    options = options or EnvOptions()
    start = Rollout(rollout_id, task_id, name, labels=dict(labels or {}), env=dict(env or {}))
    instance = pool.lease(name, options)
    try:
        return GuardSession(instance, start, lambda e: pool.release(name, options, e), budget, memory, base)
    except Exception:
        pool.release(name, options, instance)
        raise
