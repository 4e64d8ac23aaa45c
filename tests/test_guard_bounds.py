"""No request, connection or session can take the guard's machine: `pexec guard serve` in a subprocess, real
sockets and HTTP, the server's resident memory measured (psutil) against a stated ceiling.

Each test is one of the measured failures: a chunked body read to the end before its 413, silent connections
piling up, an unbounded stateless cache, a session growing without limit, a large check stalling `/health`, a
foreign Host or Origin, a `text/plain` form post, a lower-case `bearer`.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import orjson
import psutil
import pytest
from conftest import starts, stop_group
from test_guard_http import AVA, SIGN_IN, TOKEN, Client, start_server

pytestmark = pytest.mark.fuzz  # an adversarial suite: `make fuzz` runs it too
MIB = 1024 * 1024


class Guard:
    def __init__(self, proc, port: int) -> None:
        self.proc, self.port, self.client = proc, port, Client(port)

    def rss(self) -> int:
        return psutil.Process(self.proc.pid).memory_info().rss

    def head(self, request_line: str, *headers: str, host: str | None = None) -> bytes:
        lines = [request_line, f"Host: {host or f'127.0.0.1:{self.port}'}", "Connection: close", *headers, "", ""]
        return "\r\n".join(lines).encode()

    def exchange(self, data: bytes, timeout: float = 10) -> bytes:
        with socket.create_connection(("127.0.0.1", self.port), timeout=timeout) as s:
            s.sendall(data)
            return read_all(s)


def closed_by_server(s: socket.socket) -> bool:
    s.settimeout(0.5)
    try:
        return s.recv(1) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def read_all(s: socket.socket) -> bytes:
    out = b""
    try:
        while chunk := s.recv(65536):
            out += chunk
    except (ConnectionResetError, TimeoutError):
        pass
    return out


@pytest.fixture(scope="module")
@starts("server")
def guard(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Guard]:
    token_file = tmp_path_factory.mktemp("guard") / "token"
    token_file.write_text(TOKEN + "\n")
    proc, port = start_server(
        *("--env", "shop", "--token-file", str(token_file), "--header-timeout", "1", "--max-concurrency", "20"),
        *("--session-mb", "1", "--cache-mb", "4", "--ttl", "3"),
    )
    try:
        yield Guard(proc, port)
    finally:
        stop_group(proc)


def test_a_token_file_keeps_the_token_out_of_the_process_list(guard):
    # Measured before: --token was visible in `ps`.
    assert TOKEN not in " ".join(psutil.Process(guard.proc.pid).cmdline())
    assert guard.client("GET", "/health")[0] == 200


def test_a_chunked_body_is_refused_at_the_limit_and_its_connection_closed(guard):
    # Measured before: 600 x 1 MiB chunks were all read (RSS 151 -> 747 MB) before the 413.
    before = guard.rss()
    head = guard.head(
        "POST /check HTTP/1.1",
        f"Authorization: Bearer {TOKEN}",
        "Content-Type: application/json",
        "Transfer-Encoding: chunked",
    )
    chunk = b"%x\r\n" % MIB + b" " * MIB + b"\r\n"
    sent = 0
    with socket.create_connection(("127.0.0.1", guard.port), timeout=10) as s:
        s.sendall(head)
        try:
            for _ in range(64):
                s.sendall(chunk)
                sent += 1
        except (BrokenPipeError, ConnectionResetError):
            pass
        answer = read_all(s)
    assert sent < 40, "the server kept reading past its 8 MiB limit"
    if answer:  # the reply can be lost to the reset that the unread bytes cause; the close is what counts
        assert answer.startswith(b"HTTP/1.1 413") and b"request body over 8388608 bytes" in answer
    assert guard.rss() - before < 40 * MIB


def test_a_declared_length_over_the_limit_is_refused_before_the_body(guard):
    head = guard.head(
        "POST /check HTTP/1.1",
        f"Authorization: Bearer {TOKEN}",
        "Content-Type: application/json",
        f"Content-Length: {600 * MIB}",
    )
    answer = guard.exchange(head)
    assert answer.startswith(b"HTTP/1.1 413") and b"connection: close" in answer.lower()


def test_silent_and_slow_connections_are_closed_and_health_comes_back(guard):
    # Measured before: 450 idle sockets stayed open after 60 s, and with 256 descriptors /health failed.
    idle = [socket.create_connection(("127.0.0.1", guard.port), timeout=10) for _ in range(25)]
    slow = socket.create_connection(("127.0.0.1", guard.port), timeout=10)
    try:
        status = guard.exchange(guard.head("GET /health HTTP/1.1", f"Authorization: Bearer {TOKEN}"))
        assert status.startswith(b"HTTP/1.1 200")  # open sockets take no work slot of --max-concurrency 20
        for part in (b"GET /hea", b"lth HTTP/1.1\r\n", b"Host: x\r\n"):  # a request head dribbled out
            slow.sendall(part)
            time.sleep(0.3)
        time.sleep(1.0)  # the --header-timeout
        assert all(closed_by_server(s) for s in [*idle, slow])
        assert guard.client("GET", "/health")[0] == 200
    finally:
        for s in [*idle, slow]:
            s.close()


@pytest.mark.parametrize(
    ("headers", "status", "reason"),
    [
        (["Host: evil.example:80"], 403, b"Host 'evil.example:80' is not an address this service serves"),
        (["Origin: http://evil.example"], 403, b"cross-origin request from 'http://evil.example' refused"),
        (["Content-Type: text/plain"], 415, b"the body must be application/json, got 'text/plain'"),
        (["Content-Type: application/x-www-form-urlencoded"], 415, b"must be application/json"),
        (["Sec-Fetch-Site: cross-site"], 403, b"cross-site request refused"),
    ],
)
def test_foreign_hosts_origins_and_form_posts_get_nothing(guard, headers, status, reason):
    body = orjson.dumps({"env": {}})
    host = next((h.split(": ", 1)[1] for h in headers if h.startswith("Host:")), None)
    others = [h for h in headers if not h.startswith("Host:")]
    if not any(h.startswith("Content-Type") for h in others):
        others.append("Content-Type: application/json")
    head = guard.head(
        "POST /sessions HTTP/1.1", f"Authorization: Bearer {TOKEN}", f"Content-Length: {len(body)}", *others, host=host
    )
    answer = guard.exchange(head + body)
    assert answer.startswith(b"HTTP/1.1 %d" % status) and reason in answer, answer[:300]
    assert guard.client("GET", "/health")[1]["sessions"] == 0  # nothing was created


def test_the_bearer_scheme_is_case_insensitive(guard):
    for scheme in ("bearer", "BEARER", "Bearer"):
        answer = guard.exchange(guard.head("GET /health HTTP/1.1", f"Authorization: {scheme} {TOKEN}"))
        assert answer.startswith(b"HTTP/1.1 200"), answer[:200]
    answer = guard.exchange(guard.head("GET /health HTTP/1.1", "Authorization: Basic " + TOKEN))
    assert answer.startswith(b"HTTP/1.1 401")


def big_events(n: int, size: int) -> list[dict]:
    return [{"type": "message", "role": "user", "content": f"{i} " + "w" * size} for i in range(n)]


def test_a_session_has_a_byte_budget(guard):
    # Measured before: one live session grew 133 MB from 20 large messages.
    sid = guard.client("POST", "/sessions", {})[1]["session"]
    statuses = [
        guard.client("POST", f"/sessions/{sid}/message", {"role": "user", "content": "m" * 300_000})[0]
        for _ in range(5)
    ]
    assert statuses[:3] == [200, 200, 200] and statuses[3:] == [413, 413]  # --session-mb 1
    error = guard.client("POST", f"/sessions/{sid}/message", {"role": "user", "content": "m" * 300_000})[1]
    assert "would hold more than 1048576 bytes of events" in error["error"]
    assert guard.client("POST", f"/sessions/{sid}/message", {"role": "user", "content": AVA})[0] == 200  # small fits
    guard.client("DELETE", f"/sessions/{sid}")


def small_calls(n: int) -> list[dict]:
    # Small events cost the most memory per byte of JSON (the guard counts 1 KiB each besides their text).
    return [
        {"type": "call", "tool": "get_user", "arguments": {"user_id": f"U{j}"}, "output": {"a": [1]}} for j in range(n)
    ]


@pytest.fixture(scope="module")
@starts("server")
def roomy() -> Iterator[Guard]:
    """A guard whose sessions may be large (16 MiB) while its stateless cache is small (4 MiB)."""
    proc, port = start_server("--env", "shop", "--token", TOKEN, "--cache-mb", "4", "--ttl", "2")
    try:
        yield Guard(proc, port)
    finally:
        stop_group(proc)


def test_the_stateless_cache_has_a_byte_budget_and_a_ttl(roomy):
    # Measured before: ~48 MB per entry for 6.4 MB requests, still there 30 minutes after the TTL. Unbounded, these
    # 10 sessions grow the RSS by ~30 MiB; the 4 MiB cache (--cache-mb 4) keeps it under the ceiling below.
    guard = roomy
    before = guard.rss()
    for i in range(10):
        body = {"start": {"rollout_id": f"big{i}"}, "events": small_calls(2000), "call": SIGN_IN}
        status, verdict = guard.client("POST", "/check", body)
        assert status == 200 and verdict["replayed"] == 2000
        health = guard.client("GET", "/health")[1]
        assert 0 < health["cached_bytes"] <= 4 * MIB
    grown = guard.rss() - before
    assert grown < 20 * MIB, f"RSS grew {grown / MIB:.0f} MiB for a 4 MiB cache"
    over = {"start": {}, "events": small_calls(10_001), "call": SIGN_IN}  # more events than a session holds
    assert guard.client("POST", "/check", over)[0] == 413
    time.sleep(2.0 + 0.8)  # the --ttl, and the sweep that runs every quarter of it
    health = guard.client("GET", "/health")[1]
    assert (health["cached"], health["cached_bytes"], health["sessions"]) == (0, 0, 0)


def test_a_large_check_does_not_stall_health(roomy):
    # Measured before: a 6.4 MB /check blocked the event loop for 2.1 s (/health took 1.9 s meanwhile).
    guard = roomy
    body = {"start": {"rollout_id": "stall"}, "events": small_calls(8000), "call": SIGN_IN}
    done = threading.Event()

    def check() -> None:
        Client(guard.port)("POST", "/check", body)
        done.set()

    worker = threading.Thread(target=check)
    began = time.perf_counter()
    worker.start()
    waits = []
    while not done.is_set() and len(waits) < 100:
        asked = time.perf_counter()
        assert guard.client("GET", "/health")[0] == 200
        waits.append(time.perf_counter() - asked)
    worker.join(60)
    took = time.perf_counter() - began
    # A stalled loop answers /health only after the check: one wait nearly as long as the whole check (1.9 s of
    # 2.1 s before), and few answers. On a machine busy with other work a wait can lose a time slice or two (0.22 s
    # of a 0.40 s check has been seen), so the bound is three quarters of the check, not half.
    # (The check must take long enough to tell: 0.15-0.3 s on a quiet 2-core machine, over 2 s before.)
    assert took > 0.1 and len(waits) >= 5, (took, waits)
    assert max(waits) < 0.75 * took, (took, waits)
