"""The hardened HTTP server of the guard (`pexec guard serve`) and the viewer (`pexec view`).

Two layers, because an ASGI app never sees a connection that has not sent a whole request head:
- the connection protocol (uvicorn's httptools one) refuses a request head over `max_head` bytes while it
  arrives, closes a connection that sends no complete request head within `header_timeout` of opening, or of its
  previous response, and one past `max_connections` at once: silent or slow sockets cannot pile up, and they
  hold no work slot;
- `WebGuard`, an ASGI layer in front of the app, answers before the app runs: a request head over `max_head`
  bytes gets 431 however it arrived, `Content-Length` with `Transfer-Encoding` 400, a `Host` that is not the
  served address (DNS rebinding) and a foreign `Origin` (a browser on another site) 403, a missing or wrong
  bearer token 401, a POST that is not `application/json` (when asked) 415; it then reads the body itself,
  counting while it streams, and refuses it at `max_body` bytes with 413 — or at `body_timeout` with 408 — and
  closes the connection, so a chunked body is never read past the limit. Only then does the request take one of
  the `max_concurrency` work slots (503 when none is free): the limit counts requests being answered, not
  sockets. The app gets the body it counted.
uvicorn's own settings add the keep-alive idle timeout.
"""

from __future__ import annotations

import asyncio
import errno
import hmac
import ipaddress
import logging
import os
import resource
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, MutableMapping
from dataclasses import dataclass
from http.cookies import CookieError, SimpleCookie
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlsplit

import orjson

from pipeline.core.errors import WebServerError

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

TOKEN_COOKIE = "pexec_token"  # the cookie's name is this and the served port: each service its own token
_WILDCARD = ("0.0.0.0", "::", "")
# Descriptors kept free besides the connections: the process's own files (logs, journals, a run's parts).
FD_RESERVE = 256
_CONTROL = frozenset(chr(c) for c in [*range(32), 127])


@dataclass(frozen=True)
class ServerLimits:
    """What one connection and one request may take; every service states these in its manual page."""

    max_body: int = 8 * 1024 * 1024  # bytes of one request body, counted as it streams
    header_timeout: float = 5.0  # seconds for a connection to send a complete request head
    idle_timeout: float = 5.0  # seconds a kept-alive connection may idle between requests
    body_timeout: float = 30.0  # seconds for the whole body to arrive after the head
    max_concurrency: int = 64  # requests being answered at once (their bodies read); one more gets 503
    max_connections: int = 1024  # open connections; one more is closed at once (each takes a file descriptor)
    max_head: int = 16 * 1024  # bytes of a request line and headers
    max_bodies: int = 256 * 1024 * 1024  # bytes of request bodies being received, all requests together (503)
    # Seconds the requests being answered get to finish after SIGTERM or Ctrl-C; then they are cut off and the
    # process ends (without a bound, one slow request held a stopping service for as long as it ran).
    shutdown_timeout: float = 10.0


def token_cookie(port: int) -> str:
    """The name of the token cookie of the service on `port`: a browser sends a host's cookies to all its ports,
    and a cookie per port keeps one service's token from standing in for, or overwriting, another's."""
    return f"{TOKEN_COOKIE}_{port}"


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
        # Counted on the event loop, which runs every call of this layer: no lock needed.
        self.working = 0  # requests the app is answering
        self.receiving = 0  # bytes of bodies being received

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        try:
            self._check_framing(scope)
            self._check_host(scope)
            redirect = self._check_token(scope)
            if redirect is not None:
                await send({"type": "http.response.start", "status": 303, "headers": redirect})
                await send({"type": "http.response.body", "body": b""})
                return
            self._check_type(scope)
            body = await self._read_body(scope, receive)
            if self.working >= self.limits.max_concurrency:
                raise _Refused(503, f"busy: {self.working} requests are being answered (the limit); retry shortly")
        except _Refused as exc:
            await _refuse(send, exc.status, str(exc), [(b"retry-after", b"1")] if exc.status == 503 else None)
            return
        self.working += 1
        try:
            await self._answer(scope, receive, send, body)
        finally:
            self.working -= 1

    async def _answer(self, scope: Scope, receive: Receive, send: Send, body: bytes) -> None:
        delivered = started = False

        async def replay() -> Message:
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()  # the disconnect, when it comes

        async def sending(message: Message) -> None:
            nonlocal started
            started = True
            await send(message)

        try:
            await self.app(scope, replay, sending)
        except asyncio.CancelledError:
            # The server cancels the requests still being answered when its shutdown timeout ends: the client
            # gets one line, the terminal no traceback (the task ends here, so nothing waits on the cancel).
            if not started:
                limit = self.limits.shutdown_timeout
                await _refuse(send, 503, f"the service is stopping: this request was cut off after {limit:g} s")

    def _check_framing(self, scope: Scope) -> None:
        """The head's size as parsed (the protocol refuses a longer one while it arrives, counting raw bytes), and one
        framing of the body: `Content-Length` beside `Transfer-Encoding` is how requests are smuggled past a
        proxy (RFC 9112: refuse it and close the connection)."""
        headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
        size = len(scope.get("raw_path", b"")) + len(scope.get("query_string", b"")) + 32
        size += sum(len(k) + len(v) + 4 for k, v in headers)
        if size > self.limits.max_head:
            raise _Refused(431, f"the request head is over {self.limits.max_head} bytes")
        names = {k for k, _ in headers}
        if b"content-length" in names and b"transfer-encoding" in names:
            raise _Refused(400, "a request may not carry both Content-Length and Transfer-Encoding")

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
            name = token_cookie(scope["server"][1]) if scope.get("server") else TOKEN_COOKIE
            try:
                cookie = SimpleCookie(_header(scope, b"cookie") or "").get(name)
            except CookieError:
                cookie = None
            if cookie is not None and hmac.compare_digest(cookie.value.encode(), self._token):
                return None
            pairs = parse_qsl(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
            linked = [v for k, v in pairs if k == "token"]
            if linked and hmac.compare_digest(linked[0].encode(), self._token):
                rest = urlencode([(k, v) for k, v in pairs if k != "token"])
                where = _same_origin(scope["path"]) + (f"?{rest}" if rest else "")
                cookie_value = f"{name}={linked[0]}; HttpOnly; SameSite=Strict; Path=/"
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
        try:
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
                if self.receiving + len(chunk) > self.limits.max_bodies:
                    raise _Refused(503, "busy: the bodies being received fill the server's buffer; retry shortly")
                self.receiving += len(chunk)
                chunks.append(chunk)
                if not message.get("more_body", False):
                    return b"".join(chunks)
        finally:
            self.receiving -= sum(map(len, chunks))


def _same_origin(path: str) -> str:
    """`path` as a redirect's target on this origin: one leading slash (`//evil.example` names another host, and
    so does `/\\evil.example` to a browser), percent-encoded; a control character in it is refused."""
    if any(c in _CONTROL for c in path):
        raise _Refused(400, "the link's path holds a control character")
    return "/" + quote(path.lstrip("/\\"), safe="/:@!$&'()*+,;=-._~")


def _protocol(header_timeout: float, max_connections: int, max_head: int) -> type[asyncio.Protocol]:
    from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

    class BoundedProtocol(HttpToolsProtocol):
        """uvicorn's httptools protocol (the compiled llhttp parser) with the bounds it lacks: a request head over
        `max_head` bytes is refused while it arrives (llhttp keeps any head in memory, however long); a connection
        with no complete request head after `header_timeout` is closed; one opened while `max_connections` are is
        dropped at once, before it reads a byte."""

        # Bytes of the request head being received; None inside a body. Counted per piece of at most
        # max_head + 1 bytes, so at most that much of a head is buffered before the count sees it.
        head_seen: int | None = 0

        # As uvicorn's own protocol: it takes the stream Transport asyncio gives it, not any BaseTransport.
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections:
                transport.abort()  # its descriptor is freed now, not after a close handshake
                return
            self._arm()

        def data_received(self, data: bytes) -> None:
            view, step = memoryview(data), max_head + 1
            for start in range(0, len(view), step):
                if self.transport.is_closing():
                    return  # refused: what follows is not read
                piece = view[start : start + step]
                if self.head_seen is not None:
                    self.head_seen += len(piece)
                super().data_received(piece)  # type: ignore[arg-type]  # llhttp reads any buffer
                if self.head_seen is not None and self.head_seen > max_head:
                    self._refuse_head()
                    return

        def on_headers_complete(self) -> None:
            self.head_seen = None
            super().on_headers_complete()

        def on_message_complete(self) -> None:
            super().on_message_complete()
            self.head_seen = 0  # the next request's head begins

        def on_response_complete(self) -> None:
            super().on_response_complete()
            if not self.transport.is_closing():
                self._arm()

        def _refuse_head(self) -> None:
            current: RequestResponseCycle | None = self.cycle  # None until a request begins
            if current is None or current.response_complete:
                body = orjson.dumps({"error": f"the request head is over {max_head} bytes"})
                self.transport.write(
                    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-type: application/json\r\n"
                    b"content-length: %d\r\nconnection: close\r\n\r\n%b" % (len(body), body)
                )
            # Else an earlier pipelined response is still being written: the connection closes after what is
            # buffered, with no answer of its own.
            self.transport.close()

        def _unsupported_upgrade_warning(self) -> None:
            pass  # no service here speaks WebSocket: an upgrade request is answered as an ordinary one, unlogged

        def _arm(self) -> None:
            self.loop.call_later(header_timeout, self._head_overdue, self.cycle)

        def _head_overdue(self, armed: RequestResponseCycle | None) -> None:
            if self.transport.is_closing():
                return
            current: RequestResponseCycle | None = self.cycle  # None until a request begins (uvicorn types it not)
            if current is armed and (armed is None or armed.response_complete):
                self.transport.close()  # no new request began since the timer was set

    return BoundedProtocol


def connection_limit(wanted: int) -> int:
    """The connections the process can hold open: `wanted`, its descriptor limit raised (up to the hard limit)
    to fit them and FD_RESERVE more; fewer when the hard limit is lower (said on stderr)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    needed = wanted + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < needed:
        raised = needed if hard == resource.RLIM_INFINITY else min(needed, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (raised, hard))
            soft = raised
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= needed:
        return wanted
    fitting = max(soft - FD_RESERVE, 1)
    logging.getLogger("uvicorn.error").warning(
        "at most %d connections at once: the process may open %d files (ulimit -n)", fitting, soft
    )
    return fitting


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
    socket `listen` bound), else binding host:port itself. uvicorn's own concurrency limit is not used: it counts
    open connections, so idle sockets would take the work slots."""
    import uvicorn

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        http=_protocol(limits.header_timeout, connection_limit(limits.max_connections), limits.max_head),
        ws="none",  # nothing here speaks WebSocket: an upgrade request is an ordinary one
        # uvicorn annotates ints, and hands them to loop.call_later and asyncio.wait_for, which take any seconds.
        timeout_keep_alive=limits.idle_timeout,  # type: ignore[arg-type]
        timeout_graceful_shutdown=limits.shutdown_timeout,  # type: ignore[arg-type]
        log_level="warning",
        access_log=False,
        server_header=False,
    )
    uvicorn.Server(config).run(sockets=[sock] if sock is not None else None)
