"""The guard as a service, independent of any web framework: live sessions with a time-to-live and a
maximum count, the stateless mode whose requests carry the session's events, and the JSON they speak.

Stateless requests are answered from a cache of sessions keyed by a hash chain over the start and the
events: a request that extends a cached prefix replays only its new events, so an agent's loop of
check → record → check costs O(1) per request at any depth on the replica that saw the previous request
(docs/explanation/architecture.md, "The guard"). Any replica answers any request; a miss replays the prefix.
"""

from __future__ import annotations

import hashlib
import resource
import secrets
import threading
import time
import tracemalloc
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

import orjson

from pipeline.apps.guard.session import (
    POOL,
    EnvironmentPool,
    GuardSession,
    MemoryBudget,
    SessionBudget,
    VerdictJSON,
    check_event,
    check_start,
    open_session,
    with_slack,
)
from pipeline.core.errors import GuardFull, GuardRequestError, InvalidRecord, PexecError, SessionFull
from pipeline.core.model import Call, Message, Rollout
from pipeline.core.records import parse_event, parse_rollout
from pipeline.envs import EnvOptions, get_environment, new_environment

# A request's body as the client sent it: decoded JSON, every value checked before it is used.
Body = dict[str, object]


class SessionStart(TypedDict):
    """What a session starts from (a create request, a stateless request's `start`): a rollout's `env` and the
    rollout-level fields an environment may read."""

    env: dict[str, Any]  # environment-specific (a rollout's `env` field)
    rollout_id: str
    task_id: str
    labels: dict[str, str]


class SessionCounts(TypedDict):
    sessions: int  # live
    cached: int  # kept by the stateless cache
    cached_bytes: int  # what the cached sessions take (as `held_bytes` counts them)
    held_bytes: int  # what the live sessions take: their events, `env`s and word indexes, and `session_base_bytes` each
    session_base_bytes: int  # what an empty session of the environment takes, measured when the guard started
    rss_bytes: int | None  # the process's resident memory now (None where /proc is not)


class StatelessVerdict(VerdictJSON):
    """The answer to a stateless check: the verdict, and how many of the request's events were replayed (the
    rest came from the cache)."""

    replayed: int


@dataclass(frozen=True)
class Limits:
    max_sessions: int = 1000  # live sessions, and sessions kept by the stateless cache
    ttl_s: float = 600.0  # a session (live or cached) unused this long is closed
    max_session_events: int = SessionBudget.max_events  # events of one session (and of one stateless request)
    max_session_bytes: int = SessionBudget.max_bytes  # their bytes as canonical JSON
    max_cache_bytes: int = 128 * 1024 * 1024  # the stateless cache's sessions' bytes together
    # Live and cached sessions together, empty sessions' cost included: 16 GiB of the documented 24 GiB machine.
    max_memory_bytes: int = 16 * 1024 * 1024 * 1024

    @property
    def budget(self) -> SessionBudget:
        return SessionBudget(self.max_session_events, self.max_session_bytes)


# What an empty session takes besides its environment instance and state: the session's and checker's objects.
SESSION_FLOOR = 16 * 1024


def empty_session_cost(name: str, options: EnvOptions, pool: EnvironmentPool) -> int:
    """The memory one more empty session of environment `name` takes: a new instance and its start, measured
    (tracemalloc) as it is built; an environment that cannot start from an empty `env` is measured built.
    The instance goes to `pool`, where the first session takes it."""
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        instance = new_environment(name, options)
        try:
            GuardSession(instance, Rollout("guard", "guard", name)).close()
            size = tracemalloc.get_traced_memory()[0] - before
        except PexecError:  # it starts only from a real `env`, counted as each session's own
            size = tracemalloc.get_traced_memory()[0] - before
    finally:
        if not tracing:
            tracemalloc.stop()
    pool.release(name, options, instance)
    return with_slack(max(size, 0)) + SESSION_FLOOR  # tracemalloc counts what Python asked for


def resident_bytes() -> int | None:
    """The process's resident memory (Linux: /proc/self/statm), None elsewhere."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * resource.getpagesize()


def parse_call(raw: object) -> Call:
    """A call in the canonical form (docs/reference/canonical-rollout.md, "Fields"): `tool`, `arguments`,
    optional `turn`, `call_id`, `output`, `error`."""
    if not isinstance(raw, dict):
        raise GuardRequestError("'call' must be an object")
    event = _event({**raw, "type": "call"}, "call")
    assert isinstance(event, Call)
    return event


def parse_start(body: object) -> SessionStart:
    """The session's start: a rollout's `env` and the rollout-level fields an environment may read."""
    if not isinstance(body, dict):
        raise GuardRequestError("the session's start must be an object")
    env = body.get("env", {})
    if not isinstance(env, dict):
        raise GuardRequestError("'env' must be an object")
    try:
        check_start(env)
    except InvalidRecord as exc:
        raise GuardRequestError(f"'env': {exc}") from exc
    rollout_id, task_id = (_name(body, key) for key in ("rollout_id", "task_id"))
    labels = body.get("labels", {})
    if not isinstance(labels, dict) or not all(isinstance(v, str) for v in labels.values()):
        raise GuardRequestError("'labels' must be an object of strings")
    start: SessionStart = {"env": env, "rollout_id": rollout_id, "task_id": task_id, "labels": labels}
    try:  # the rest of what the batch scorer requires of a record's start (label names, say)
        parse_rollout({**start, "benchmark": "guard", "events": []})
    except InvalidRecord as exc:
        raise GuardRequestError(str(exc)) from exc
    return start


def _name(body: dict[str, object], key: str) -> str:
    value = body.get(key, "guard")
    if not isinstance(value, str) or not value:
        raise GuardRequestError(f"{key!r} must be a non-empty string")
    return value


def _event(raw: object, where: str) -> Call | Message:
    try:
        return parse_event(raw, where)
    except InvalidRecord as exc:
        raise GuardRequestError(str(exc)) from exc


class Guard:
    """The sessions of one environment: live ones by id, and the stateless cache."""

    def __init__(
        self,
        name: str,
        options: EnvOptions | None = None,
        limits: Limits | None = None,
        pool: EnvironmentPool = POOL,
    ) -> None:
        self.name = name
        self.options = options or EnvOptions()
        self.limits = limits or Limits()
        self._pool = pool
        self._live: OrderedDict[str, tuple[GuardSession, float]] = OrderedDict()  # least recently used first
        # The stateless cache, least recently used first: the session after a prefix, and when it was last used.
        self._prefixes: OrderedDict[bytes, tuple[GuardSession, float]] = OrderedDict()
        self._cache_bytes = 0
        self._lock = threading.Lock()
        self.version = get_environment(name, self.options).version  # an unknown name fails here, once
        self.base = empty_session_cost(name, self.options, pool)
        # Live sessions get what the cache's share leaves; the cache keeps to its own (`max_cache_bytes`).
        self.memory = MemoryBudget(max(self.limits.max_memory_bytes - self.limits.max_cache_bytes, 0))

    # -- live sessions ------------------------------------------------------------------------------------
    def create(self, body: Body) -> str:
        start = parse_start(body)
        with self._lock:
            self._expire()
            if len(self._live) + len(self._prefixes) >= self.limits.max_sessions and self._prefixes:
                self._evict()  # the cache gives way to live sessions
            if len(self._live) >= self.limits.max_sessions:
                raise GuardRequestError(
                    f"session limit reached ({self.limits.max_sessions} live sessions): close one, or wait "
                    f"for an idle one to expire ({self.limits.ttl_s:g} s)",
                    status=429,
                )
        session = self._open(start)
        session_id = secrets.token_urlsafe(16)
        with self._lock:
            self._live[session_id] = (session, time.monotonic())
        return session_id

    def session(self, session_id: str) -> GuardSession:
        with self._lock:
            self._expire()
            found = self._live.get(session_id)
            if found is None:
                raise GuardRequestError(f"no session {session_id!r} (closed, expired or never created)", 404)
            self._live[session_id] = (found[0], time.monotonic())
            self._live.move_to_end(session_id)
            return found[0]

    def close(self, session_id: str) -> GuardSession:
        with self._lock:
            found = self._live.pop(session_id, None)
        if found is None:
            raise GuardRequestError(f"no session {session_id!r} (closed, expired or never created)", 404)
        found[0].close()
        return found[0]

    @property
    def live(self) -> int:
        return len(self._live)

    @property
    def cached(self) -> int:
        """Sessions kept by the stateless cache."""
        return len(self._prefixes)

    @property
    def cached_bytes(self) -> int:
        """Memory the stateless cache's sessions take (`GuardSession.cost`)."""
        return self._cache_bytes

    def counts(self) -> SessionCounts:
        """Live and cached sessions now, the idle ones expired first, and the memory they take (what `/health`
        reports)."""
        with self._lock:
            self._expire()
            return {
                "sessions": len(self._live),
                "cached": len(self._prefixes),
                "cached_bytes": self._cache_bytes,
                "held_bytes": self.memory.held,
                "session_base_bytes": self.base,
                "rss_bytes": resident_bytes(),
            }

    def expire(self) -> None:
        """Close the sessions, live and cached, unused for longer than the TTL (the service calls this on a
        timer too, so an idle service frees them)."""
        with self._lock:
            self._expire()

    def shutdown(self) -> None:
        with self._lock:
            sessions = [s for s, _ in self._live.values()] + [s for s, _ in self._prefixes.values()]
            self._live.clear()
            self._prefixes.clear()
            self._cache_bytes = 0
        for session in sessions:
            session.close()

    def _expire(self) -> None:
        horizon = time.monotonic() - self.limits.ttl_s
        while self._live:
            session_id, (session, used) = next(iter(self._live.items()))
            if used > horizon:
                break
            del self._live[session_id]
            session.close()
        while self._prefixes and next(iter(self._prefixes.values()))[1] <= horizon:
            self._evict()

    def _evict(self) -> None:
        """Drop the least recently used cached session (the lock held)."""
        session = self._prefixes.popitem(last=False)[1][0]
        self._cache_bytes -= session.cost
        session.close()

    def _open(self, start: SessionStart, live: bool = True) -> GuardSession:
        """A session from `start`: a live one counts against the guard's memory, a stateless one against the
        cache's share when it is kept."""
        memory = self.memory if live else None
        try:
            return open_session(
                self.name,
                **start,
                options=self.options,
                pool=self._pool,
                budget=self.limits.budget,
                memory=memory,
                base=self.base,
            )
        except GuardFull as exc:
            raise GuardRequestError(f"cannot start a session: {exc}", 429) from exc
        except SessionFull as exc:
            raise GuardRequestError(f"cannot start a session: {exc}", 413) from exc
        except PexecError as exc:
            raise GuardRequestError(f"cannot start a session: {exc}") from exc

    # -- stateless ----------------------------------------------------------------------------------------
    def check_stateless(self, body: Body) -> StatelessVerdict:
        """The verdict on `call` after `events` (canonical events, calls with their outcomes) from `start`."""
        start = parse_start(body.get("start", {}))
        events = body.get("events", [])
        if not isinstance(events, list):
            raise GuardRequestError("'events' must be a list")
        if len(events) > self.limits.max_session_events:
            raise GuardRequestError(f"more than {self.limits.max_session_events} events in one request", 413)
        parsed = [_event(e, f"events[{i}]") for i, e in enumerate(events)]
        call = parse_call(body.get("call"))
        _admissible(call, "call")  # the events are checked as they are replayed (a cached prefix was, once)
        keys = [_hash(b"", start)]
        for i, raw in enumerate(events):
            try:
                keys.append(_hash(keys[-1], raw))
            except GuardRequestError:
                _admissible(parsed[i], f"events[{i}]")  # the scorer's reason, when that is why it is not JSON
                raise
        hit, cached = 0, None  # the events before `hit` are those of the cached session (none: replay them all)
        with self._lock:
            self._expire()
            longest = next((i for i in range(len(keys) - 1, -1, -1) if keys[i] in self._prefixes), None)
            if longest is not None:
                hit, cached = longest, self._prefixes.pop(keys[longest])[0]
                self._cache_bytes -= cached.cost
        session = self._open(start, live=False) if cached is None else cached
        try:
            for i, event in enumerate(parsed[hit:], hit):
                try:
                    if isinstance(event, Message):
                        session.message(event.role, event.content, event.turn)
                    else:
                        session.record(event, output=event.output, error=event.error)
                except InvalidRecord as exc:
                    raise GuardRequestError(f"events[{i}]: {exc}") from exc
            verdict = session.check(call)
        except SessionFull as exc:
            session.close()
            raise GuardRequestError(str(exc), 413) from exc
        except Exception:
            session.close()
            raise
        limits = self.limits
        with self._lock:
            if session.cost > limits.max_cache_bytes:
                session.close()  # larger than the whole cache: answered, not kept
            else:
                self._prefixes[keys[-1]] = (session, time.monotonic())
                self._cache_bytes += session.cost
                while self._prefixes and (
                    len(self._prefixes) + len(self._live) > limits.max_sessions
                    or self._cache_bytes > limits.max_cache_bytes
                ):
                    self._evict()
        return {**verdict.to_json(), "replayed": len(parsed) - hit}


def _admissible(event: Call | Message, where: str) -> None:
    """GuardRequestError with the batch scorer's reason when `event` would make its rollout unreadable."""
    try:
        check_event(event)
    except InvalidRecord as exc:
        raise GuardRequestError(f"{where}: {exc}") from exc


def _hash(previous: bytes, value: object) -> bytes:
    try:
        data = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError as exc:
        raise GuardRequestError(f"not JSON: {exc}") from exc
    return hashlib.blake2b(previous + data, digest_size=16).digest()
