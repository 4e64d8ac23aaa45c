"""A loopback stand-in for the OpenAI chat completions API that plays scripted turns (used by record.py).

Upstream's OpenAI roles build their client with base_url="https://api.openai.com/v1" written into the code, so the
recording reaches this stub the way any HTTPS client reaches a server through a proxy: the upstream process gets
HTTPS_PROXY=http://127.0.0.1:PORT and SSL_CERT_FILE=<a CA made for the recording>; the stub answers CONNECT,
terminates TLS with a certificate for api.openai.com signed by that CA, and serves POST /v1/chat/completions.
Nothing leaves the machine: every other host is refused.

A request is routed to its scenario by the scenario's first user message, which opens what both roles are sent
(record.py runs scenarios that share one in separate invocations). The turn is counted from the request itself (the
role's own earlier answers), so a retried request gets the same answer.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from typing import Any

HOST = "api.openai.com"
MAX_BODY = 8 << 20


@dataclass(frozen=True)
class Say:
    """A text answer (the agent to the user, or the user to the agent)."""

    text: str


@dataclass(frozen=True)
class Calls:
    """One answer with tool calls: (tool, arguments or a function of the request's messages giving them)."""

    calls: tuple[tuple[str, dict[str, Any] | Callable[[list[dict[str, Any]]], dict[str, Any]]], ...]


@dataclass(frozen=True)
class Drop:
    """Close the connection without an answer (upstream's client retries, then gives up)."""


Turn = Say | Calls | Drop


@dataclass(frozen=True)
class Script:
    scenario: str
    agent: tuple[Turn, ...]
    user: tuple[Turn, ...] = ()
    note: str = ""
    crash: str | None = None  # the exception upstream's runner is to catch, when the script provokes one


def call(tool: str, **arguments: Any) -> tuple[str, dict[str, Any]]:
    return tool, arguments


def output_of(tool: str, messages: list[dict[str, Any]]) -> Any:
    """The last logged output of `tool` in the request, read back from upstream's repr (literals only)."""
    for m in reversed(messages):
        if m.get("role") == "tool" and m.get("name") == tool:
            return ast.literal_eval(m["content"])
    raise LookupError(f"no output of {tool} in the request")


@dataclass
class Routes:
    """Scenario first messages (from upstream's scenario definitions) -> scripts; requests seen, for provenance."""

    by_first_message: dict[str, Script]
    log: list[dict[str, Any]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, request: dict[str, Any]) -> dict[str, Any] | None:
        """The scripted answer to a request (None: drop the connection). Both roles get the scenario's messages
        after their system messages (the user simulator's few-shot examples and instruction come first): the
        scenario's first user message opens them, as the user's to the agent, as its own answer to the simulator."""
        messages = request.get("messages") or []
        last_system = max((i for i, m in enumerate(messages) if m.get("role") == "system"), default=-1)
        spoken = messages[last_system + 1 :]
        script = self.by_first_message.get(str(spoken[0].get("content"))) if spoken else None
        if script is None:
            raise LookupError(f"no script for a request that starts {spoken[:1]!r}")
        own = sum(m.get("role") == "assistant" for m in spoken)
        if spoken[0].get("role") == "assistant":
            role, turn = "user", own - 1
            turns, default = script.user, Calls((call("end_conversation"),))
        else:
            role, turn = "agent", own
            turns, default = script.agent, Say("Done.")
        played = turns[turn] if turn < len(turns) else default
        with self.lock:
            self.log.append({"scenario": script.scenario, "role": role, "turn": turn, "played": type(played).__name__})
        if isinstance(played, Drop):
            return None
        return completion(played, script.scenario, role, turn, messages, request.get("model", ""))


def completion(turn: Say | Calls, scenario: str, role: str, index: int, messages: list[dict[str, Any]],
               model: str) -> dict[str, Any]:  # fmt: skip
    if isinstance(turn, Say):
        message: dict[str, Any] = {"role": "assistant", "content": turn.text}
        finish = "stop"
    else:
        calls = []
        for k, (tool, arguments) in enumerate(turn.calls):
            values = arguments(messages) if callable(arguments) else arguments
            ident = "call_" + hashlib.sha1(f"{scenario}/{role}/{index}/{k}".encode()).hexdigest()[:24]
            calls.append({"id": ident, "type": "function",
                          "function": {"name": tool, "arguments": json.dumps(values)}})  # fmt: skip
        message = {"role": "assistant", "content": None, "tool_calls": calls}
        finish = "tool_calls"
    return {"id": f"chatcmpl-stub-{index}", "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
            "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0}}  # fmt: skip


class _Api(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    routes: Routes

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        if not self.path.endswith("/chat/completions") or size > MAX_BODY:
            self._send(404, {"error": {"message": f"not served: {self.path}"}})
            return
        request = json.loads(self.rfile.read(size))
        answer = self.server_routes.answer(request)
        if answer is None:  # a dropped connection, mid-run
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        self._send(200, answer)

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class _Proxy(socketserver.StreamRequestHandler):
    """CONNECT api.openai.com:443 -> TLS with the recording's certificate -> the scripted API."""

    def handle(self) -> None:
        line = self.rfile.readline(65536).decode("latin-1")
        while self.rfile.readline(65536) not in (b"\r\n", b"\n", b""):
            pass
        parts = line.split()
        if len(parts) < 2 or parts[0] != "CONNECT" or parts[1].split(":")[0] != HOST:
            self.wfile.write(b"HTTP/1.1 403 Forbidden\r\nContent-Length: 0\r\n\r\n")
            return
        self.wfile.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        self.wfile.flush()
        try:
            tls = self.server.tls.wrap_socket(self.connection, server_side=True)  # type: ignore[attr-defined]
        except (ssl.SSLError, OSError):
            return
        handler = type("Api", (_Api,), {"server_routes": self.server.routes})  # type: ignore[attr-defined]
        with contextlib.suppress(ssl.SSLError, OSError):  # the client hung up
            handler(tls, self.client_address, self.server)


class StubServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, routes: Routes, cert: str, key: str) -> None:
        super().__init__(("127.0.0.1", 0), _Proxy)
        self.routes = routes
        self.tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.tls.load_cert_chain(cert, key)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"
