"""The guard's HTTP service (`pexec guard serve`): a Starlette app over pipeline.apps.guard.service.Guard, behind
the hardened server layer (pipeline.apps.web: body limit while streaming, timeouts, concurrency, Host/Origin, token,
`application/json` only).

JSON in and out; every error is one line (`{"error": "..."}`) with a 4xx status for a bad request, never a
traceback. Requests are parsed and answered in one worker thread, in arrival order, so a large replay never
stalls the event loop (`/health` answers meanwhile) and each session's requests stay serialised without locks.
"""

from __future__ import annotations

import contextlib
import socket
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import asdict
from typing import TypedDict

import anyio
import anyio.to_thread
import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from pipeline.apps.guard.service import Body, Guard, SessionCounts, StatelessVerdict, parse_call
from pipeline.apps.guard.session import VerdictJSON
from pipeline.apps.web import ServerLimits, WebGuard, allowed_hosts, listen, run_server
from pipeline.apps.web import require_token as _require_token
from pipeline.apps.web.server import DEFAULT_LIMITS
from pipeline.core.errors import (
    GuardFull,
    GuardRequestError,
    InvalidRecord,
    PexecError,
    SessionFull,
    WebServerError,
)

MAX_BODY = DEFAULT_LIMITS.max_body  # a stateless request carries the session's events
Handler = Callable[[Request], Awaitable[Response]]
GuardServerError = WebServerError  # the service cannot start as asked (e.g. beyond loopback without a token)
Answer = Mapping[str, object]  # a response's JSON object
Endpoint = Callable[[Request, Body], Answer]  # a route's answer to a request and its parsed body


class Health(SessionCounts):
    """`GET /health`: the environment, the sessions now (idle ones expired first) and the limits."""

    environment: str
    version: str
    max_sessions: int
    ttl_s: float
    max_cache_bytes: int
    max_session_bytes: int
    max_memory_bytes: int


class Created(TypedDict):
    session: str  # the id the session's requests name
    environment: str
    version: str


class Depth(TypedDict):
    depth: int  # calls recorded so far


class Closed(Depth):
    closed: str  # the session's id


def require_token(host: str, token: str | None) -> None:
    _require_token(host, token, "the guard")


def _json(value: Answer, status: int = 200) -> Response:
    return Response(orjson.dumps(value), status_code=status, media_type="application/json")


def _error(message: str, status: int) -> Response:
    return _json({"error": message.splitlines()[0] if message else "error"}, status)


def _refusal(exc: Exception) -> Response:
    """The one-line answer to a request that failed with `exc`."""
    if isinstance(exc, GuardRequestError):
        return _error(str(exc), exc.status)
    if isinstance(exc, InvalidRecord):  # what `pexec score` would reject the rollout for, with its reason
        return _error(str(exc), 400)
    if isinstance(exc, GuardFull):  # the guard's memory, not the session's: retry once sessions close
        return _error(str(exc), 429)
    if isinstance(exc, SessionFull):
        return _error(str(exc), 413)
    if isinstance(exc, PexecError):  # the environment refused the input (a malformed start, say)
        return _error(str(exc), 422)
    return _error(f"internal error: {type(exc).__name__}: {exc}", 500)  # a fault: one line, not a traceback


def _forget_frames(exc: BaseException) -> None:
    """Clear the locals of the frames `exc` (and what caused it) passed through. A frame that caught an error and
    raised another keeps both in a reference cycle with its locals, a refused request's body among them (86 MiB
    for a 7.8 MiB `env`), until the garbage collector's next full pass: measured, three refused sessions left
    +303 MiB."""
    pending: list[BaseException | None] = [exc]
    seen: set[int] = set()
    while pending:
        error = pending.pop()
        if error is None or id(error) in seen:
            continue
        seen.add(id(error))
        if error.__traceback__ is not None:
            traceback.clear_frames(error.__traceback__)
        pending += [error.__cause__, error.__context__]


def _parse(raw: bytes) -> Body:
    try:
        body = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError as exc:
        raise GuardRequestError(f"the body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise GuardRequestError("the body must be a JSON object")
    return body


def create_app(
    guard: Guard,
    token: str | None = None,
    hosts: frozenset[str] | None = None,
    limits: ServerLimits = DEFAULT_LIMITS,
) -> WebGuard:
    """The ASGI app: sessions (create, check, record, message, close), stateless checks, health; behind
    WebGuard (`hosts`: the Host values served, None for any; `token`: the bearer token)."""
    worker = anyio.CapacityLimiter(1)  # one thread answers every request but /health, in arrival order

    def answer(handler: Endpoint, request: Request, raw: bytes) -> tuple[Answer, float]:
        body = _parse(raw) if request.method == "POST" else {}
        began = time.perf_counter()
        return handler(request, body), time.perf_counter() - began

    def endpoint(handler: Endpoint, status: int = 200, inline: bool = False) -> Handler:
        async def run(request: Request) -> Response:
            try:
                raw = await request.body()  # already counted and bounded by WebGuard
                if inline:
                    value, took = answer(handler, request, raw)
                else:
                    value, took = await anyio.to_thread.run_sync(answer, handler, request, raw, limiter=worker)
                response = _json(value, status)
                # The guard's own time, apart from the network and the server's queue (W3C Server-Timing).
                response.headers["server-timing"] = f"guard;dur={took * 1000:.3f}"
                return response
            except Exception as exc:
                _forget_frames(exc)
                return _refusal(exc)

        return run

    def health(request: Request, body: Body) -> Health:
        limits = guard.limits
        return {
            "environment": guard.name,
            "version": guard.version,
            **guard.counts(),  # idle sessions expired first: the counts are current
            "max_sessions": limits.max_sessions,
            "ttl_s": limits.ttl_s,
            "max_cache_bytes": limits.max_cache_bytes,
            "max_session_bytes": limits.max_session_bytes,
            "max_memory_bytes": limits.max_memory_bytes,
        }

    def create(request: Request, body: Body) -> Created:
        return {"session": guard.create(body), "environment": guard.name, "version": guard.version}

    def check(request: Request, body: Body) -> VerdictJSON:
        session = guard.session(request.path_params["session"])
        return session.check(parse_call(body.get("call"))).to_json()

    def record(request: Request, body: Body) -> Answer:
        session = guard.session(request.path_params["session"])
        call = parse_call(body.get("call"))
        return asdict(session.record(call, output=call.output, error=call.error))  # the StepResult's fields

    def message(request: Request, body: Body) -> Depth:
        session = guard.session(request.path_params["session"])
        role, content, turn = body.get("role"), body.get("content"), body.get("turn", 0)
        if not isinstance(role, str) or not isinstance(content, str) or not isinstance(turn, int):
            raise GuardRequestError("a message needs 'role' and 'content' strings (and an integer 'turn')")
        session.message(role, content, turn)
        return {"depth": session.depth}

    def close(request: Request, body: Body) -> Closed:
        session = guard.close(request.path_params["session"])
        return {"closed": request.path_params["session"], "depth": session.depth}

    def stateless(request: Request, body: Body) -> StatelessVerdict:
        return guard.check_stateless(body)

    async def not_found(request: Request, exc: Exception) -> Response:
        return _error(f"no route {request.method} {request.url.path}", getattr(exc, "status_code", 404))

    routes = [
        Route("/health", endpoint(health, inline=True), methods=["GET"]),
        Route("/sessions", endpoint(create, 201), methods=["POST"]),
        Route("/sessions/{session}/check", endpoint(check), methods=["POST"]),
        Route("/sessions/{session}/record", endpoint(record), methods=["POST"]),
        Route("/sessions/{session}/message", endpoint(message), methods=["POST"]),
        Route("/sessions/{session}", endpoint(close), methods=["DELETE"]),
        Route("/check", endpoint(stateless), methods=["POST"]),
    ]

    async def sweep() -> None:
        # Idle sessions and cache entries are closed on a timer too, not only when a request comes.
        while True:
            await anyio.sleep(min(guard.limits.ttl_s / 4, 30.0))
            await anyio.to_thread.run_sync(guard.expire, limiter=worker)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(sweep)
            yield
            tasks.cancel_scope.cancel()
        guard.shutdown()  # the sessions' environment instances go back to the pool

    app = Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found}, lifespan=lifespan)
    return WebGuard(app, limits, hosts, token, json_only=True)


def serve(
    guard: Guard,
    host: str,
    port: int,
    token: str | None,
    limits: ServerLimits = DEFAULT_LIMITS,
    extra_hosts: tuple[str, ...] = (),
    sock: socket.socket | None = None,
) -> None:
    """Run the service until interrupted (uvicorn, hardened by pipeline.apps.web); `sock`: the socket already
    listening on host:port (pipeline.apps.web.listen), else it is bound here."""
    require_token(host, token)
    sock = sock if sock is not None else listen(host, port)
    port = sock.getsockname()[1]
    app = create_app(guard, token, allowed_hosts(host, port, extra_hosts), limits)
    run_server(app, host, port, limits, sock)
