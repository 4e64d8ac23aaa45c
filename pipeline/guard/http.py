"""The guard's HTTP service (`pexec guard serve`): a Starlette app over pipeline.guard.service.Guard.

JSON in and out; every error is one line (`{"error": "..."}`) with a 4xx status for a bad request, never a
traceback. Checks run on the event loop: they take microseconds, and one loop serialises each session's
requests without locks.
"""

from __future__ import annotations

import contextlib
import hmac
import ipaddress
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict
from typing import Any

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from pipeline.core.errors import PexecError
from pipeline.guard.service import Guard, GuardRequestError, parse_call

MAX_BODY = 8 * 1024 * 1024  # a stateless request carries the session's events
Handler = Callable[[Request], Awaitable[Response]]


class GuardServerError(PexecError):
    """The service cannot start as asked (e.g. beyond loopback without a token)."""


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def require_token(host: str, token: str | None) -> None:
    if not token and not is_loopback(host):
        raise GuardServerError(
            f"refusing to listen on {host} without a bearer token: pass --token (or set PEXEC_GUARD_TOKEN), "
            "or listen on 127.0.0.1"
        )


def _json(value: Any, status: int = 200) -> Response:
    return Response(orjson.dumps(value), status_code=status, media_type="application/json")


def _error(message: str, status: int) -> Response:
    return _json({"error": message.splitlines()[0] if message else "error"}, status)


async def _body(request: Request) -> dict[str, Any]:
    declared = request.headers.get("content-length")
    if declared is not None and (not declared.isdigit() or int(declared) > MAX_BODY):
        raise GuardRequestError(f"request body over {MAX_BODY} bytes", 413)
    raw = await request.body()
    if len(raw) > MAX_BODY:
        raise GuardRequestError(f"request body over {MAX_BODY} bytes", 413)
    try:
        body = orjson.loads(raw) if raw else {}
    except orjson.JSONDecodeError as exc:
        raise GuardRequestError(f"the body is not JSON: {exc}") from exc
    if not isinstance(body, dict):
        raise GuardRequestError("the body must be a JSON object")
    return body


def create_app(guard: Guard, token: str | None = None) -> Starlette:
    """The ASGI app: sessions (create, check, record, message, close), stateless checks, health."""
    expected = f"Bearer {token}".encode() if token else None

    def endpoint(handler: Callable[[Request, dict[str, Any]], Any], status: int = 200) -> Handler:
        async def run(request: Request) -> Response:
            if expected is not None:
                given = request.headers.get("authorization", "").encode()
                if not hmac.compare_digest(given, expected):
                    return _error("missing or wrong bearer token", 401)
            try:
                body = await _body(request) if request.method == "POST" else {}
                began = time.perf_counter()
                response = _json(handler(request, body), status)
                # The guard's own time, apart from the network and the server's queue (W3C Server-Timing).
                response.headers["server-timing"] = f"guard;dur={(time.perf_counter() - began) * 1000:.3f}"
                return response
            except GuardRequestError as exc:
                return _error(str(exc), exc.status)
            except PexecError as exc:  # the environment refused the input (a malformed start, say)
                return _error(str(exc), 422)
            except Exception as exc:  # a fault of the guard or its environment: one line, not a traceback
                return _error(f"internal error: {type(exc).__name__}: {exc}", 500)

        return run

    def health(request: Request, body: dict[str, Any]) -> dict[str, Any]:
        limits = guard.limits
        return {
            "environment": guard.name,
            "version": guard.version,
            "sessions": guard.live,
            "cached": guard.cached,
            "max_sessions": limits.max_sessions,
            "ttl_s": limits.ttl_s,
        }

    def create(request: Request, body: dict[str, Any]) -> dict[str, Any]:
        return {"session": guard.create(body), "environment": guard.name, "version": guard.version}

    def check(request: Request, body: dict[str, Any]) -> dict[str, Any]:
        session = guard.session(request.path_params["session"])
        return session.check(parse_call(body.get("call"))).to_json()

    def record(request: Request, body: dict[str, Any]) -> dict[str, Any]:
        session = guard.session(request.path_params["session"])
        call = parse_call(body.get("call"))
        return asdict(session.record(call, output=call.output, error=call.error))

    def message(request: Request, body: dict[str, Any]) -> dict[str, Any]:
        session = guard.session(request.path_params["session"])
        role, content, turn = body.get("role"), body.get("content"), body.get("turn", 0)
        if not isinstance(role, str) or not isinstance(content, str) or not isinstance(turn, int):
            raise GuardRequestError("a message needs 'role' and 'content' strings (and an integer 'turn')")
        session.message(role, content, turn)
        return {"depth": session.depth}

    def close(request: Request, body: dict[str, Any]) -> dict[str, Any]:
        session = guard.close(request.path_params["session"])
        return {"closed": request.path_params["session"], "depth": session.depth}

    def stateless(request: Request, body: dict[str, Any]) -> dict[str, Any]:
        return guard.check_stateless(body)

    async def not_found(request: Request, exc: Exception) -> Response:
        return _error(f"no route {request.method} {request.url.path}", getattr(exc, "status_code", 404))

    routes = [
        Route("/health", endpoint(health), methods=["GET"]),
        Route("/sessions", endpoint(create, 201), methods=["POST"]),
        Route("/sessions/{session}/check", endpoint(check), methods=["POST"]),
        Route("/sessions/{session}/record", endpoint(record), methods=["POST"]),
        Route("/sessions/{session}/message", endpoint(message), methods=["POST"]),
        Route("/sessions/{session}", endpoint(close), methods=["DELETE"]),
        Route("/check", endpoint(stateless), methods=["POST"]),
    ]

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        guard.shutdown()  # the sessions' environment instances go back to the pool

    return Starlette(routes=routes, exception_handlers={404: not_found, 405: not_found}, lifespan=lifespan)


def serve(guard: Guard, host: str, port: int, token: str | None) -> None:
    """Run the service until interrupted (uvicorn)."""
    import uvicorn

    require_token(host, token)
    uvicorn.run(create_app(guard, token), host=host, port=port, log_level="warning", access_log=False)
