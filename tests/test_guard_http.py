"""The guard's HTTP service: `pexec guard serve` in a subprocess on a free loopback port, real HTTP requests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from conftest import free_port, starts, stop_group, wait_for

from pipeline.envs import get_environment

PEXEC = str(Path(sys.executable).parent / "pexec")
TOKEN = "s3cret-token"
AVA = "Hi, I'm Ava Lopez (ava.lopez@example.com, zip 78701)."
SIGN_IN = {"tool": "authenticate", "arguments": {"email": "ava.lopez@example.com", "zip": "78701"}}


class Client:
    def __init__(self, port: int, token: str | None = TOKEN, timeout: float = 30) -> None:
        self.base, self.token, self.timeout = f"http://127.0.0.1:{port}", token, timeout

    def __call__(self, method: str, path: str, body: Any = None, raw: bytes | None = None) -> tuple[int, Any]:
        data = raw if raw is not None else (orjson.dumps(body) if body is not None else None)
        request = urllib.request.Request(self.base + path, data=data, method=method)
        request.add_header("Content-Type", "application/json")
        if self.token:
            request.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                self.headers = response.headers
                return response.status, orjson.loads(response.read())
        except urllib.error.HTTPError as exc:
            return exc.code, orjson.loads(exc.read())


def start_server(*args: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen(
        [PEXEC, "guard", "serve", "--port", str(port), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    client = Client(port)

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited: {proc.stderr.read().decode()}")
        try:
            return client("GET", "/health")[0] == 200
        except OSError:
            return False

    try:
        wait_for(up, 60, "the guard service")
    except BaseException:  # not up in time: stop it, or it outlives the suite in a session of its own
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        raise
    return proc, port


@pytest.fixture(scope="module")
@starts("server")
def shop() -> Iterator[Client]:
    proc, port = start_server("--env", "shop", "--token", TOKEN, "--max-sessions", "3", "--ttl", "5")
    try:
        yield Client(port)
    finally:
        stop_group(proc)


def pending_order() -> str:
    state = get_environment("shop").spec.initial_state
    return next(o for o in state["users"]["U1001"]["orders"] if state["orders"][o]["status"] == "pending")


def test_a_session_over_http(shop):
    status, health = shop("GET", "/health")
    assert status == 200 and health["environment"] == "shop" and health["version"].startswith("shop@")
    status, created = shop("POST", "/sessions", {"env": {}, "rollout_id": "live-1"})
    assert status == 201
    sid = created["session"]
    status, verdict = shop("POST", f"/sessions/{sid}/check", {"call": SIGN_IN})
    assert status == 200
    assert (verdict["valid"], verdict["failed_check"], verdict["cause"]) == (False, "D", "information")
    assert shop("POST", f"/sessions/{sid}/message", {"role": "user", "content": AVA}) == (200, {"depth": 0})
    status, verdict = shop("POST", f"/sessions/{sid}/check", {"call": SIGN_IN})
    assert verdict["valid"] and verdict["output"] == {"user_id": "U1001"} and verdict["step"] == 1
    assert 0 < float(shop.headers["server-timing"].removeprefix("guard;dur=")) < 1000  # ms, in the guard
    status, step = shop("POST", f"/sessions/{sid}/record", {"call": {**SIGN_IN, "output": {"user_id": "U1001"}}})
    assert status == 200 and step["valid"] and step["output_match"] is True and step["step"] == 1
    oid = pending_order()
    cancel = {"tool": "cancel_order", "arguments": {"order_id": oid, "reason": "no longer needed"}}
    shop("POST", f"/sessions/{sid}/message", {"role": "user", "content": f"cancel {oid}"})
    shop("POST", f"/sessions/{sid}/record", {"call": cancel})
    status, verdict = shop("POST", f"/sessions/{sid}/check", {"call": cancel})
    assert (verdict["valid"], verdict["failed_check"], verdict["cause"]) == (False, "P", "state_consistency")
    assert verdict["message"] and verdict["step"] == 3
    assert shop("DELETE", f"/sessions/{sid}") == (200, {"closed": sid, "depth": 2})
    status, error = shop("POST", f"/sessions/{sid}/check", {"call": SIGN_IN})
    assert status == 404 and "closed, expired or never created" in error["error"]


def test_bad_requests_get_one_line_4xx(shop):
    sid = shop("POST", "/sessions", {})[1]["session"]
    cases = [
        (("POST", f"/sessions/{sid}/check", None, b"{not json"), 400, "not JSON"),
        (("POST", f"/sessions/{sid}/check", [1, 2]), 400, "must be a JSON object"),
        (("POST", f"/sessions/{sid}/check", {}), 400, "'call' must be an object"),
        (("POST", f"/sessions/{sid}/check", {"call": {"arguments": {}}}), 400, "needs a 'tool' name"),
        (("POST", f"/sessions/{sid}/record", {"call": {"tool": "x", "error": "yes"}}), 400, "error must be"),
        (("POST", f"/sessions/{sid}/message", {"role": "user"}), 400, "'role' and 'content'"),
        (("POST", "/sessions", {"env": []}), 400, "'env' must be an object"),
        (("GET", "/nowhere"), 404, "no route GET /nowhere"),
        (("GET", f"/sessions/{sid}/check"), 405, "no route"),
    ]
    for (method, path, *body), status, reason in cases:
        got, answer = shop(method, path, *body)
        assert got == status and reason in answer["error"] and "\n" not in answer["error"], (path, answer)
    schema = shop("POST", f"/sessions/{sid}/check", {"call": {"tool": "get_user", "arguments": "{oops"}})[1]
    assert (schema["valid"], schema["failed_check"]) == (False, "S")  # a malformed call is a verdict, not a bad request
    assert Client(int(shop.base.rsplit(":", 1)[1]), token="wrong")("GET", "/health") == (
        401,
        {"error": "missing or wrong bearer token"},
    )
    shop("DELETE", f"/sessions/{sid}")


def test_sessions_are_bounded_in_number_and_time(shop):
    ids = [shop("POST", "/sessions", {})[1]["session"] for _ in range(3)]
    status, error = shop("POST", "/sessions", {})
    assert status == 429 and "session limit reached (3 live sessions)" in error["error"]
    shop("DELETE", f"/sessions/{ids[0]}")
    ids[0] = shop("POST", "/sessions", {})[1]["session"]
    time.sleep(5.5)  # the TTL
    assert shop("POST", f"/sessions/{ids[1]}/message", {"role": "user", "content": "hi"})[0] == 404
    assert shop("GET", "/health")[1]["sessions"] == 0
    assert shop("POST", "/sessions", {})[0] == 201


def test_stateless_checks_replay_only_what_the_cache_has_not_seen(shop):
    oid = pending_order()
    cancel = {"tool": "cancel_order", "arguments": {"order_id": oid, "reason": "no longer needed"}}
    events = [{"type": "message", "role": "user", "content": f"{AVA} cancel {oid}"}]
    start = {"env": {}, "rollout_id": "stateless"}
    status, verdict = shop("POST", "/check", {"start": start, "events": events, "call": SIGN_IN})
    assert status == 200 and verdict["valid"] and verdict["replayed"] == 1
    events.append({"type": "call", **SIGN_IN, "output": verdict["output"]})
    verdict = shop("POST", "/check", {"start": start, "events": events, "call": cancel})[1]
    assert verdict["valid"] and verdict["replayed"] == 1 and verdict["step"] == 2  # only the new event
    again = shop("POST", "/check", {"start": start, "events": events, "call": cancel})[1]
    assert {**again, "replayed": 1} == verdict and again["replayed"] == 0  # a repeated check: nothing replayed
    events.append({"type": "call", **cancel})
    verdict = shop("POST", "/check", {"start": start, "events": events, "call": cancel})[1]
    assert (verdict["valid"], verdict["cause"], verdict["replayed"]) == (False, "state_consistency", 1)
    fresh = shop("POST", "/check", {"start": {**start, "rollout_id": "other"}, "events": events, "call": cancel})[1]
    assert {**fresh, "replayed": 1} == verdict and fresh["replayed"] == 3  # another start: replayed in full
    bad = shop("POST", "/check", {"start": start, "events": [{"type": "nope"}], "call": cancel})
    assert bad[0] == 400 and "events[0]: unknown event type 'nope'" in bad[1]["error"]
    for i in range(5):  # more prefixes than --max-sessions: the cache keeps the most recent
        shop("POST", "/check", {"start": {"rollout_id": f"s{i}"}, "events": events, "call": cancel})
    health = shop("GET", "/health")[1]
    assert health["cached"] + health["sessions"] == 3
    assert shop("POST", "/check", {"start": {"rollout_id": "s4"}, "events": events, "call": cancel})[1]["replayed"] == 0
    assert shop("POST", "/check", {"start": {"rollout_id": "s0"}, "events": events, "call": cancel})[1]["replayed"] == 3


@pytest.mark.server
def test_a_bfcl_session_and_a_malformed_start():
    proc, port = start_server("--env", "bfcl_v4", "--token", TOKEN)
    client = Client(port)
    try:
        status, error = client("POST", "/sessions", {"env": {"involved_classes": "GorillaFileSystem"}})
        assert status == 400 and "involved_classes must be a list" in error["error"]
        start = {"involved_classes": ["MathAPI"], "initial_config": {}}
        sid = client("POST", "/sessions", {"env": start})[1]["session"]
        verdict = client("POST", f"/sessions/{sid}/check", {"call": {"tool": "add", "arguments": {"a": 1, "b": 2}}})[1]
        assert verdict["valid"] and verdict["output"] == {"result": 3}
        wrong = client("POST", f"/sessions/{sid}/check", {"call": {"tool": "add", "arguments": {"a": "x"}}})[1]
        assert (wrong["valid"], wrong["failed_check"], wrong["cause"]) == (False, "S", "schema")
    finally:
        stop_group(proc)


@pytest.mark.server
def test_a_stopping_service_cuts_off_a_request_at_its_shutdown_timeout():
    # Creating a session with a 7.8 MiB env takes about a second here; SIGTERM comes while it is being built.
    proc, port = start_server("--env", "shop", "--token", TOKEN, "--session-mb", "256", "--shutdown-timeout", "0.1")
    body = orjson.dumps({"env": {"state": {"notes": [{"id": f"x{i}", "v": i} for i in range(300_000)]}}})
    answers: list[tuple[int, Any]] = []
    sending = threading.Thread(target=lambda: answers.append(Client(port, timeout=120)("POST", "/sessions", raw=body)))
    try:
        before = resident_bytes(proc.pid)
        sending.start()
        wait_for(lambda: resident_bytes(proc.pid) > before + 16 * 2**20, 60, "the guard to build the env")
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)
        sending.join(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    # Without the bound the service answered 201 first: the stop waited for as long as the request ran.
    assert answers == [(503, {"error": "the service is stopping: this request was cut off after 0.1 s"})]
    assert proc.returncode == -signal.SIGTERM
    assert b"Traceback" not in proc.stderr.read()


def resident_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_listening_beyond_loopback_needs_a_token():
    result = subprocess.run(
        [PEXEC, "guard", "serve", "--env", "shop", "--host", "0.0.0.0", "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=60,
        env={k: v for k, v in os.environ.items() if k != "PEXEC_GUARD_TOKEN"},
    )
    assert result.returncode == 2
    assert result.stderr.strip().startswith("error: refusing to listen on 0.0.0.0 without a bearer token")
