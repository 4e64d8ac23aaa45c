"""The hardened server layer the guard and the viewer share (pipeline.apps.web), at the ASGI level: what reaches the
app and what is answered before it; the served `Host` names; where a token comes from. The same layer over real
sockets: tests/test_guard_bounds.py and tests/test_view.py."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import orjson
import pytest

from pipeline.apps.web import ServerLimits, WebGuard, allowed_hosts, read_token, require_token
from pipeline.core.errors import WebServerError


async def echo(scope: Any, receive: Any, send: Any) -> None:
    message = await receive()
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": message["body"]})


def call(app: WebGuard, chunks: list[bytes], headers: dict[str, str], delay: float = 0.0) -> tuple[int, bytes, dict]:
    """One request through `app`: the body in `chunks` (each after `delay` seconds), the answer's status, body and
    headers."""
    sent: list[dict] = []
    pending = list(chunks)

    async def receive() -> dict:
        if not pending:
            await asyncio.sleep(3600)  # a client that stops sending
        await asyncio.sleep(delay)
        chunk = pending.pop(0)
        return {"type": "http.request", "body": chunk, "more_body": bool(pending)}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/x",
        "query_string": b"",
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }
    asyncio.run(app(scope, receive, send))
    start = sent[0]
    body = b"".join(m.get("body", b"") for m in sent[1:])
    return start["status"], body, {k.decode(): v.decode() for k, v in start["headers"]}


HOSTS = allowed_hosts("127.0.0.1", 8765)
JSON = {"host": "127.0.0.1:8765", "content-type": "application/json"}


def test_the_body_reaches_the_app_whole_when_within_the_limit() -> None:
    app = WebGuard(echo, ServerLimits(max_body=10), HOSTS, json_only=True)
    assert call(app, [b"12345", b"67890"], JSON)[:2] == (200, b"1234567890")


def test_a_streamed_body_is_refused_at_the_limit_and_the_connection_closed() -> None:
    app = WebGuard(echo, ServerLimits(max_body=10), HOSTS)
    status, body, headers = call(app, [b"123456", b"789012", b"never read"], JSON)
    assert status == 413 and orjson.loads(body) == {"error": "request body over 10 bytes"}
    assert headers["connection"] == "close"


def test_a_slow_body_is_refused_after_the_body_timeout() -> None:
    app = WebGuard(echo, ServerLimits(body_timeout=0.3), HOSTS)
    status, body, headers = call(app, [b"{", b"}"], {**JSON, "content-length": "2"}, delay=0.2)
    assert status == 408 and "not received within 0.3 s" in orjson.loads(body)["error"]
    assert headers["connection"] == "close"


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"host": "127.0.0.1:8765"}, 415),  # no content type
        ({**JSON, "origin": "null"}, 403),  # a sandboxed page or a file: URL
        ({**JSON, "origin": "http://127.0.0.1:8765"}, 200),  # the service's own pages
        ({**JSON, "host": "localhost:8765"}, 200),
        ({**JSON, "host": "127.0.0.1:9999"}, 403),
        ({**JSON, "content-type": "application/json; charset=utf-8"}, 200),
    ],
)
def test_what_is_answered_before_the_app(headers: dict[str, str], status: int) -> None:
    app = WebGuard(echo, ServerLimits(), HOSTS, json_only=True)
    assert call(app, [b"{}"], headers)[0] == status


def test_the_served_host_names() -> None:
    assert allowed_hosts("127.0.0.1", 80) >= {"127.0.0.1", "localhost:80", "[::1]:80"}
    assert allowed_hosts("::1", 8000) == {"[::1]:8000", "localhost:8000", "127.0.0.1:8000"}
    assert allowed_hosts("10.0.0.5", 8000, ("guard.internal",)) == {"10.0.0.5:8000", "guard.internal:8000"}
    assert allowed_hosts("0.0.0.0", 8000) is None  # names unknown: the token, required there, stands in


def test_a_token_from_a_file_and_the_refusals(tmp_path: Path) -> None:
    (tmp_path / "t").write_text("s3cret\n")
    assert read_token(None, str(tmp_path / "t")) == "s3cret"
    (tmp_path / "empty").write_text("\n")
    with pytest.raises(WebServerError, match="is empty"):
        read_token(None, str(tmp_path / "empty"))
    with pytest.raises(WebServerError, match="exclude each other"):
        read_token("a", str(tmp_path / "t"))
    with pytest.raises(WebServerError, match="cannot read the token file"):
        read_token(None, str(tmp_path / "missing"))
    with pytest.raises(WebServerError, match=r"refusing to listen on 0\.0\.0\.0 without a bearer token"):
        require_token("0.0.0.0", None, "the viewer")
    require_token("::1", None, "the viewer")  # loopback: no token needed


def get(app: WebGuard, path: str, query: bytes, headers: dict[str, str], port: int = 8765) -> tuple[int, dict]:
    """A GET of `path?query` through `app` served on `port`: the answer's status and headers."""
    sent: list[dict] = []

    async def receive() -> dict:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(message: dict) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "method": "GET",
        "path": path,
        "raw_path": path.encode("utf-8", "surrogateescape"),
        "query_string": query,
        "server": ("127.0.0.1", port),
        "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()],
    }
    asyncio.run(app(scope, receive, send))
    return sent[0]["status"], {k.decode(): v.decode("latin-1") for k, v in sent[0]["headers"]}


@pytest.mark.parametrize(
    ("path", "location"),
    [
        ("/rollouts", "/rollouts?fed=0"),
        ("//evil.example", "/evil.example?fed=0"),  # measured before: Location //evil.example (another host)
        ("/\\evil.example", "/evil.example?fed=0"),  # a browser reads /\ as // too
        ("///evil.example/x y", "/evil.example/x%20y?fed=0"),
        ("/caf\u00e9", "/caf%C3%A9?fed=0"),
    ],
)
def test_a_token_link_redirects_on_this_origin_only(path: str, location: str) -> None:
    app = WebGuard(echo, ServerLimits(), HOSTS, "t0ken", browser=True)
    status, headers = get(app, path, b"fed=0&token=t0ken", {"host": "127.0.0.1:8765"})
    assert status == 303 and headers["location"] == location
    assert headers["set-cookie"].startswith("pexec_token_8765=t0ken;")


@pytest.mark.parametrize("path", ["/a\r\nSet-Cookie: x=1", "/a\nb", "/\x00"])
def test_a_control_character_in_a_token_links_path_is_a_400(path: str) -> None:
    # Measured before: CR/LF in the path reached the Location header, an uncaught error in the server.
    app = WebGuard(echo, ServerLimits(), HOSTS, "t0ken", browser=True)
    assert get(app, path, b"token=t0ken", {"host": "127.0.0.1:8765"})[0] == 400


def test_the_token_cookie_is_the_ports_own() -> None:
    # Measured before: one cookie `pexec_token` for every port of the host, so another service there got it.
    app = WebGuard(echo, ServerLimits(), allowed_hosts("127.0.0.1", 9001), "t0ken", browser=True)
    host = {"host": "127.0.0.1:9001"}
    assert get(app, "/", b"", {**host, "cookie": "pexec_token_9001=t0ken"}, port=9001)[0] == 200
    assert get(app, "/", b"", {**host, "cookie": "pexec_token_8765=t0ken"}, port=9001)[0] == 401
    assert get(app, "/", b"", {**host, "cookie": "pexec_token=t0ken"}, port=9001)[0] == 401
    assert get(app, "/", b"", {**host, "cookie": 'pexec_token_9001="un\\closed'}, port=9001)[0] == 401


def test_a_head_over_the_limit_is_a_431_however_it_arrives() -> None:
    app = WebGuard(echo, ServerLimits(), HOSTS)
    assert call(app, [b"{}"], {**JSON, "x-big": "a" * 16_000})[0] == 200
    status, body, headers = call(app, [b"{}"], {**JSON, "x-big": "a" * 123_000})
    assert status == 431 and b"over 16384 bytes" in body and headers["connection"] == "close"
    many = {**JSON, **{f"x-{i}": "b" * 100 for i in range(200)}}  # many small headers add up the same
    assert call(app, [b"{}"], many)[0] == 431


def test_content_length_with_transfer_encoding_is_a_400_and_closes() -> None:
    app = WebGuard(echo, ServerLimits(), HOSTS)
    status, body, headers = call(app, [b"{}"], {**JSON, "content-length": "2", "transfer-encoding": "chunked"})
    assert status == 400 and b"both Content-Length and Transfer-Encoding" in body
    assert headers["connection"] == "close"
