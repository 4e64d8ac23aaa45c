"""A loopback stand-in for an OpenAI-compatible chat completions API that plays scripted turns (used by record.py).

Upstream τ calls its models through litellm; `tau2 run --agent-llm openai/stub-agent --agent-llm-args
'{"api_base": "http://127.0.0.1:PORT/v1", ...}'` (and the same for the user) sends every request here, so nothing
leaves the machine.

A request is routed to its scenario by what only that scenario's conversation holds: the agent's by the user's
first message (the script's first user line, unique per scenario); the user simulator's by its system prompt,
which carries the task's user instructions (each script's task names the strings its
instructions and persona hold; the task matching the most wins, so a persona's variant is told from the plain
task). The
role is read from the conversation's opening: upstream greets first, so the agent sees its greeting as its own
first (assistant) message and the user simulator sees it as a user message. The turn is counted from the request
(the role's own earlier answers), so a request that upstream retries gets the same answer.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MAX_BODY = 16 << 20


@dataclass(frozen=True)
class Say:
    """A text answer (the agent to the user, or the user to the agent)."""

    text: str


@dataclass(frozen=True)
class Calls:
    """One answer with tool calls: (tool, arguments)."""

    calls: tuple[tuple[str, dict[str, Any]], ...]


@dataclass(frozen=True)
class Empty:
    """An answer with neither text nor tool calls (upstream cannot build a message from it and raises)."""


@dataclass(frozen=True)
class Fail:
    """An HTTP 500 (litellm raises; upstream's runner retries the simulation, then records infrastructure_error)."""


Turn = Say | Calls | Empty | Fail


def call(tool: str, **arguments: Any) -> tuple[str, dict[str, Any]]:
    return tool, arguments


def calls(*items: tuple[str, dict[str, Any]]) -> Calls:
    return Calls(tuple(items))


@dataclass(frozen=True)
class Script:
    domain: str
    task_id: str
    agent: tuple[Turn, ...]
    user: tuple[Turn, ...]
    note: str = ""
    termination: str = "user_stop"  # the termination_reason upstream is to write
    reward: float | None = None  # the reward upstream is to give (None: not checked)

    @property
    def first_user_line(self) -> str:
        first = self.user[0]
        assert isinstance(first, Say), f"{self.task_id}: the user's first turn must be a line"
        return first.text


@dataclass
class Routes:
    """Scripts by their routing keys; every request answered, for provenance."""

    scripts: list[Script]
    user_keys: dict[str, tuple[str, ...]]  # task id -> strings only that task's user system prompt holds
    log: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        messages = request.get("messages") or []
        system = "\n".join(str(m.get("content") or "") for m in messages if m.get("role") == "system")
        spoken = [m for m in messages if m.get("role") != "system"]
        if spoken and spoken[0].get("role") == "assistant":
            role = "agent"
            first = next((str(m.get("content")) for m in spoken if m.get("role") == "user"), None)
            found = [s for s in self.scripts if s.first_user_line == first]
            turn = sum(m.get("role") == "assistant" for m in spoken) - 1
        else:
            role = "user"
            flat = _squash(system)  # upstream re-indents the instruction texts
            found = [s for s in self.scripts if all(_squash(k) in flat for k in self.user_keys[s.task_id])]
            most = max((len(self.user_keys[s.task_id]) for s in found), default=0)
            found = [s for s in found if len(self.user_keys[s.task_id]) == most]  # a persona's task over its plain one
            turn = sum(m.get("role") == "assistant" for m in spoken)
        if len(found) != 1:
            opening = (system or str(spoken[:2]))[:3000]
            return self._error(f"{role} request routed to {len(found)} scripts {[s.task_id for s in found]}: {opening}")
        script = found[0]
        turns = script.agent if role == "agent" else script.user
        if turn >= len(turns):
            return self._error(f"{script.domain}/{script.task_id}: {role} script has no turn {turn}")
        played = turns[turn]
        with self.lock:
            self.log.append({"domain": script.domain, "task_id": script.task_id, "role": role, "turn": turn,
                             "played": type(played).__name__})  # fmt: skip
        if isinstance(played, Fail):
            return 500, {"error": {"message": "scripted server error", "type": "server_error"}}
        return 200, completion(played, script, role, turn, str(request.get("model", "")))

    def _error(self, message: str) -> tuple[int, dict[str, Any]]:
        with self.lock:
            self.errors.append(message)
        return 400, {"error": {"message": f"stub: {message}", "type": "invalid_request_error"}}


def _squash(text: str) -> str:
    return "".join(text.split())


def completion(turn: Say | Calls | Empty, script: Script, role: str, index: int, model: str) -> dict[str, Any]:
    message: dict[str, Any]
    if isinstance(turn, Say):
        message, finish = {"role": "assistant", "content": turn.text}, "stop"
    elif isinstance(turn, Empty):
        message, finish = {"role": "assistant", "content": ""}, "stop"
    else:
        tool_calls = []
        for k, (tool, arguments) in enumerate(turn.calls):
            key = f"{script.domain}/{script.task_id}/{role}/{index}/{k}"
            ident = "call_" + hashlib.sha1(key.encode()).hexdigest()[:24]
            tool_calls.append(
                {"id": ident, "type": "function", "function": {"name": tool, "arguments": json.dumps(arguments)}}
            )
        message, finish = {"role": "assistant", "content": None, "tool_calls": tool_calls}, "tool_calls"
    return {
        "id": f"chatcmpl-stub-{role}-{index}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": finish, "logprobs": None}],
        "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    }


class _Api(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: StubServer

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        if not self.path.endswith("/chat/completions") or size > MAX_BODY:
            self._send(404, {"error": {"message": f"not served: {self.path}"}})
            return
        status, body = self.server.routes.answer(json.loads(self.rfile.read(size)))
        self._send(status, body)

    def _send(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class StubServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, routes: Routes) -> None:
        super().__init__(("127.0.0.1", 0), _Api)
        self.routes = routes

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"
