"""The hardened HTTP server of the guard (`pexec guard serve`) and the viewer (`pexec view`).

Two layers, because an ASGI app never sees a connection that has not sent a whole request head:
- the connection protocol (uvicorn's h11 one) closes a connection that sends no complete request head within
  `header_timeout` of opening, or of its previous response: silent or slow sockets cannot pile up;
- `WebGuard`, an ASGI layer in front of the app, answers before the app runs: a `Host` that is not the served
  address (DNS rebinding) and a foreign `Origin` (a browser on another site) get 403, a missing or wrong bearer
  token 401, a POST that is not `application/json` (when asked) 415; it then reads the body itself, counting
  while it streams, and refuses it at `max_body` bytes with 413 — or at `body_timeout` with 408 — and closes
  the connection, so a chunked body is never read past the limit. The app gets the body it counted.
uvicorn's own settings add the keep-alive idle timeout, the request-head size and the concurrency limit (503
beyond it).
"""

from __future__ import annotations

import asyncio
import errno
import hmac
import ipaddress
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from http.cookies import SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit

import orjson

from pipeline.core.errors import WebServerError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

TOKEN_COOKIE = "pexec_token"
_WILDCARD = ("0.0.0.0", "::", "")


@dataclass(frozen=True)
class ServerLimits:
    """What one connection and one request may take; every service states these in its manual page."""

    max_body: int = 8 * 1024 * 1024  # bytes of one request body, counted as it streams
    header_timeout: float = 10.0  # seconds for a connection to send a complete request head
    idle_timeout: float = 5.0  # seconds a kept-alive connection may idle between requests
    body_timeout: float = 30.0  # seconds for the whole body to arrive after the head
    max_concurrency: int = 64  # open connections and requests in flight; one more gets 503
    max_head: int = 16 * 1024  # bytes of a request line and headers


DEFAULT_LIMITS = ServerLimits()


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def require_token(host: str, token: str | None, what: str) -> None:
    """Refuse to listen beyond loopback without a token: every request could read (or drive) the service."""
    if not token and not is_loopback(host):
        raise WebServerError(
            f"refusing to listen on {host} without a bearer token ({what} would be open to anyone who reaches it): "
            "pass --token-file (or --token, or set the environment variable its help names), or listen on 127.0.0.1"
        )


def read_token(token: str | None, token_file: str | None) -> str | None:
    """The bearer token of `--token` (or its environment variable) or `--token-file` (its first line); a file
    keeps the token out of the process list."""
    if token and token_file:
        raise WebServerError("--token and --token-file exclude each other")
    if token_file:
        try:
            lines = Path(token_file).read_text(encoding="utf-8").splitlines()
        except OSError as exc:
            raise WebServerError(f"cannot read the token file {token_file}: {exc.strerror or exc}") from exc
        token = lines[0].strip() if lines else ""
        if not token:
            raise WebServerError(f"the token file {token_file} is empty")
    return token or None


def allowed_hosts(host: str, port: int, extra: tuple[str, ...] = ()) -> frozenset[str] | None:
    """The `Host` values a request may carry: the served address (and, on loopback, its other loopback names)
    with the port, and `extra` names (a DNS name the service is reached by). None on a wildcard address, whose
    names are not known: the bearer token, required there, stands in."""
    if host in _WILDCARD and not extra:
        return None
    names = {host} if host not in _WILDCARD else set()
    if is_loopback(host):
        names |= {"localhost", "127.0.0.1", "[::1]"}
    names |= set(extra)
    out = set()
    for name in names:
        name = name.lower()
        if ":" in name and not name.startswith("["):
            name = f"[{name}]"  # an IPv6 literal, as a Host header writes it
        out |= {f"{name}:{port}"} | ({name} if port == 80 else set())
    return frozenset(out)


def _header(scope: Scope, name: bytes) -> str | None:
    headers: Iterable[tuple[bytes, bytes]] = scope.get("headers", ())  # ASGI: (name, value) byte pairs
    for key, value in headers:
        if key == name:
            return value.decode("latin-1")
    return None


async def _refuse(send: Send, status: int, message: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = orjson.dumps({"error": message})
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),  # uvicorn closes the connection after this response
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


class WebGuard:
    """The ASGI layer every request crosses before the app (see the module's docstring).

    `hosts`: the `Host` values served (None: any, compared only with `Origin`); `token`: the bearer token
    (None: none asked); `browser`: the token may also come as a cookie, set by a `?token=` link that then
    redirects to the page without it (the viewer); `json_only`: a POST must be `application/json`."""

    def __init__(
        self,
        app: App,
        limits: ServerLimits = DEFAULT_LIMITS,
        hosts: frozenset[str] | None = None,
        token: str | None = None,
        browser: bool = False,
        json_only: bool = False,
    ) -> None:
        self.app, self.limits, self.hosts, self.browser, self.json_only = app, limits, hosts, browser, json_only
        self._token = token.encode() if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            self._check_host(scope)
            redirect = self._check_token(scope)
            if redirect is not None:
                await send({"type": "http.response.start", "status": 303, "headers": redirect})
                await send({"type": "http.response.body", "body": b""})
                return
            self._check_type(scope)
            body = await self._read_body(scope, receive)
        except _Refused as exc:
            await _refuse(send, exc.status, str(exc))
            return
        delivered = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # the disconnect, when it comes

        await self.app(scope, replay, send)

    def _check_host(self, scope: Scope) -> None:
        host = (_header(scope, b"host") or "").lower()
        if self.hosts is not None and host not in self.hosts:
            raise _Refused(403, f"Host {host!r} is not an address this service serves")
        origin = _header(scope, b"origin")
        if origin is not None:
            served = self.hosts if self.hosts is not None else frozenset({host})
            if origin == "null" or urlsplit(origin).netloc.lower() not in served:
                raise _Refused(403, f"cross-origin request from {origin!r} refused")
        if (_header(scope, b"sec-fetch-site") or "") == "cross-site":
            raise _Refused(403, "cross-site request refused")

    def _check_token(self, scope: Scope) -> list[tuple[bytes, bytes]] | None:
        """None when the request may go on; the headers of a redirect that sets the cookie (viewer links)."""
        if self._token is None:
            return None
        scheme, _, given = (_header(scope, b"authorization") or "").partition(" ")
        if scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self._token):
            return None
        if self.browser:
            cookie = SimpleCookie(_header(scope, b"cookie") or "").get(TOKEN_COOKIE)
            if cookie is not None and hmac.compare_digest(cookie.value.encode(), self._token):
                return None
            pairs = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
            linked = [v for k, v in pairs if k == "token"]
            if linked and hmac.compare_digest(linked[0].encode(), self._token):
                rest = urlencode([(k, v) for k, v in pairs if k != "token"])
                where = scope["path"] + (f"?{rest}" if rest else "")
                cookie_value = f"{TOKEN_COOKIE}={linked[0]}; HttpOnly; SameSite=Strict; Path=/"
                return [(b"location", where.encode()), (b"set-cookie", cookie_value.encode())]
        raise _Refused(401, "missing or wrong bearer token")

    def _check_type(self, scope: Scope) -> None:
        if self.json_only and scope["method"] == "POST":
            kind = (_header(scope, b"content-type") or "").split(";")[0].strip().lower()
            if kind != "application/json":
                raise _Refused(415, f"the body must be application/json, got {kind or 'no content type'!r}")

    async def _read_body(self, scope: Scope, receive: Receive) -> bytes:
        limit = self.limits.max_body
        declared = _header(scope, b"content-length")
        if declared is not None and (not (declared.isascii() and declared.isdigit()) or int(declared) > limit):
            raise _Refused(413, f"request body over {limit} bytes")
        if scope["method"] in ("GET", "HEAD", "OPTIONS") and declared is None:
            return b""
        deadline = time.monotonic() + self.limits.body_timeout
        chunks, size = [], 0
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(deadline - time.monotonic(), 0.0))
            except TimeoutError:
                raise _Refused(408, f"request body not received within {self.limits.body_timeout:g} s") from None
            if message["type"] != "http.request":
                raise _Refused(400, "the client went away")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise _Refused(413, f"request body over {limit} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                return b"".join(chunks)


def _protocol(header_timeout: float) -> type[asyncio.Protocol]:
    from uvicorn.protocols.http.h11_impl import H11Protocol, RequestResponseCycle

    class HeadTimeoutProtocol(H11Protocol):
        """uvicorn's h11 protocol, closing a connection with no complete request head after `header_timeout`."""

        # As uvicorn's own H11Protocol: it takes the stream Transport asyncio gives it, not any BaseTransport.
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def _arm(self) -> None:
            self.loop.call_later(header_timeout, self._head_overdue, self.cycle)

        def _head_overdue(self, armed: RequestResponseCycle | None) -> None:
            if self.transport.is_closing():
                return
            current: RequestResponseCycle | None = self.cycle  # None until a request begins (uvicorn types it not)
            if current is armed and (armed is None or armed.response_complete):
                self.transport.close()  # no new request began since the timer was set

    return HeadTimeoutProtocol


def listen(host: str, port: int) -> socket.socket:
    """A socket listening on host:port (port 0: one the system picks), bound before anything says the server is
    up: an address that cannot be listened on is one line here (a port in use suggests --port), never a banner
    followed by the server's log."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        return socket.create_server((host, port), family=family, backlog=2048)
    except OSError as exc:
        reason = os.strerror(exc.errno) if exc.errno else str(exc)  # without "while attempting to bind on …"
        busy = exc.errno == errno.EADDRINUSE
        hint = " (another server holds it: choose another port with --port)" if busy else ""
        raise WebServerError(f"cannot listen on {host}:{port}: {reason}{hint}") from exc


def run_server(
    app: App, host: str, port: int, limits: ServerLimits = DEFAULT_LIMITS, sock: socket.socket | None = None
) -> None:
    """Serve `app` (already wrapped in WebGuard) until interrupted, with `limits`; on `sock` when given (a
    socket `listen` bound), else binding host:port itself."""
    import uvicorn

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=_protocol(limits.header_timeout),
        limit_concurrency=limits.max_concurrency,
        # uvicorn annotates an int, and hands it to loop.call_later, which takes any number of seconds.
        timeout_keep_alive=limits.idle_timeout,  # type: ignore[arg-type]
        h11_max_incomplete_event_size=limits.max_head,
        log_level="warning",
        access_log=False,
        server_header=False,
    )
    uvicorn.Server(config).run(sockets=[sock] if sock is not None else None)
