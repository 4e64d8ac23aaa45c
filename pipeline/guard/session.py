"""The guard's library API: a live agent's session checks its next call before it runs, then records what
happened (docs/explanation/architecture.md, "The guard").

A session is the batch checker's own `Session` (pipeline.replay.checker), so its steps equal what `pexec score`
writes for the same rollout. It holds an environment instance of its own, leased from a pool: the spec and
τ environments keep one state per instance.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, replace
from typing import Any

from pipeline.core.model import NOT_LOGGED, Call, Message, Rollout, RolloutResult, StepResult
from pipeline.envs import Environment, EnvOptions, get_environment, new_environment
from pipeline.replay.checker import Session, Verdict


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

    def to_json(self) -> dict[str, Any]:
        return {f: getattr(self, f) for f in self.__slots__}


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

    def __init__(self, env: Environment, start: Rollout, on_close: Any = None) -> None:
        self.env = env
        self.rollout = replace(start, events=[])
        self._session = Session(env, start)
        self._on_close = on_close

    @property
    def depth(self) -> int:
        """The number of calls recorded so far."""
        return len(self._session.steps)

    @property
    def steps(self) -> list[StepResult]:
        return self._session.steps

    def check(self, call: Call) -> GuardVerdict:
        """The verdict on `call` as the next step. Nothing is recorded: check again after a repair."""
        return GuardVerdict.of(self.depth + 1, self._session.check(call), self.env.simulated)

    def record(self, call: Call, output: Any = NOT_LOGGED, error: bool | None = None) -> StepResult:
        """Add `call` as the next step with its real outcome: the production tool's output (or, in a
        simulated environment, what the simulator returned) and whether it was an error. An output of None
        is "not known", as `null` is in a canonical log."""
        if output is not NOT_LOGGED or error is not None:
            call = replace(call, output=NOT_LOGGED if output is None else output, error=error)
        self.rollout.events.append(call)
        return self._session.record(call)

    def message(self, role: str, content: str, turn: int = 0) -> None:
        self.rollout.events.append(Message(role, content, turn))
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
) -> GuardSession:
    """A guard session in environment `name` (any registered one, as `pexec score --env`), starting from
    `env` (a rollout's `env` field) and the rollout-level fields an environment may read."""
    options = options or EnvOptions()
    start = Rollout(rollout_id, task_id, name, labels=dict(labels or {}), env=dict(env or {}))
    instance = pool.lease(name, options)
    try:
        return GuardSession(instance, start, lambda e: pool.release(name, options, e))
    except Exception:
        pool.release(name, options, instance)
        raise
