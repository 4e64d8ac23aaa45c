"""A τ domain's own code, run in the interpreter of a user-given τ source (a tau2-bench checkout or installed wheel,
which may need another Python than pexec's): `python _tau2_worker.py` reads one JSON request per line on stdin and
answers one JSON line on stdout. Only the standard library and `tau2` are imported here (pexec is not installed
there). Requests:

- `{"op": "hello"}` -> `{"tau2": version, "commit": git commit of the source or null}`;
- `{"op": "start", "domain", "initial_state", "retrieval"}` -> `{"tools": {name: [actor, tool type, schema]}}`:
  the domain's environment, freshly built, with the task's initial state applied by upstream's `set_state`;
- `{"op": "call", "tool", "arguments", "actor"}` -> `{"accepted", "output"}`: upstream's own `make_tool_call`,
  then `sync_tools`, the output as upstream writes it (`to_json_str`), an exception as `Error: …`;
- `{"op": "discovered", "tool", "arguments", "actor"}` -> `{"missing": null | what is not yet discovered}`;
- `{"op": "checkpoint"}` -> `{"mark": n}`; `{"op": "rollback", "mark": n}` -> `{}`: deep copies of the mutable
  state (the DB and the discovery state), kept until the next `start`.
Errors of the worker itself are `{"error": text}`.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

AGENT_WRAPPER = "call_discoverable_agent_tool"
USER_WRAPPER = "call_discoverable_user_tool"


class Worker:
    def __init__(self) -> None:
        self.env: Any = None
        self.marks: list[Any] = []

    def hello(self, request: dict[str, Any]) -> dict[str, Any]:
        from importlib.metadata import PackageNotFoundError, version

        import tau2

        try:
            found = version("tau2")
        except PackageNotFoundError:
            found = None
        root = Path(tau2.__file__).resolve().parents[2]
        done = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
        commit = done.stdout.strip() if done.returncode == 0 else None
        return {"tau2": found, "commit": commit or None, "python": sys.version.split()[0]}

    def start(self, request: dict[str, Any]) -> dict[str, Any]:
        from loguru import logger

        logger.disable("tau2")
        from tau2.data_model.tasks import InitialState

        domain = request["domain"]
        if domain != "banking_knowledge":
            raise ValueError(f"domain {domain!r} is not served by this worker")
        from tau2.domains.banking_knowledge.environment import get_environment

        self.env = get_environment(retrieval_variant=request.get("retrieval") or "bm25_grep")
        initial = request.get("initial_state")
        if initial:
            parsed = InitialState.model_validate(initial)
            self.env.set_state(parsed.initialization_data, parsed.initialization_actions, [])
        self.marks = []
        tools = {}
        for actor, kit in (("agent", self.env.tools), ("user", self.env.user_tools)):
            for name, tool in kit.get_tools().items():
                kind = str(getattr(kit.tool_type(name), "value", kit.tool_type(name)))
                tools[name] = [actor, kind, tool.openai_schema["function"]["parameters"]]
        return {"tools": tools}

    def call(self, request: dict[str, Any]) -> dict[str, Any]:
        env = self.env
        requestor = "user" if request.get("actor") == "user" else "assistant"
        try:
            result = env.make_tool_call(request["tool"], requestor=requestor, **(request.get("arguments") or {}))
            env.sync_tools()
        except Exception as exc:  # upstream's get_response: every exception is an error message
            return {"accepted": False, "output": f"Error: {exc}"}
        return {"accepted": True, "output": env.to_json_str(result)}

    def discovered(self, request: dict[str, Any]) -> dict[str, Any]:
        """Whether a discoverable tool named by the wrapper call was discovered (the agent's: unlocked; the user's:
        given by the agent) before this call; an unknown name is left to the tool's own answer."""
        args = request.get("arguments") or {}
        tools = self.env.tools
        if request["tool"] == AGENT_WRAPPER:
            name = args.get("agent_tool_name")
            if tools.has_discoverable_tool(name) and name not in tools.get_agent_discoverable_tools_state():
                return {"missing": f"agent tool {name!r} was not unlocked before this call"}
        elif request["tool"] == USER_WRAPPER:
            name = args.get("discoverable_tool_name")
            user = self.env.user_tools
            if user.has_discoverable_tool(name) and user._check_tool_given(name) is not None:
                return {"missing": f"user tool {name!r} was not given to the user before this call"}
        return {"missing": None}

    def _state(self) -> Any:
        tools = self.env.tools
        return (tools.db, tools._agent_discoverable_tools_state, tools._user_discoverable_tools_state)

    def checkpoint(self, request: dict[str, Any]) -> dict[str, Any]:
        self.marks.append(copy.deepcopy(self._state()))
        return {"mark": len(self.marks) - 1}

    def rollback(self, request: dict[str, Any]) -> dict[str, Any]:
        mark = int(request["mark"])
        db, agent_state, user_state = copy.deepcopy(self.marks[mark])  # marks stay valid until the next start
        tools = self.env.tools
        tools.db = db
        self.env.user_tools.db = db  # one DB, as upstream builds it
        tools._agent_discoverable_tools_state = agent_state
        tools._user_discoverable_tools_state = user_state
        return {}


def main() -> None:
    worker = Worker()
    out = sys.stdout
    sys.stdout = sys.stderr  # anything upstream prints stays off the protocol
    for line in sys.stdin:
        try:
            request = json.loads(line)
            answer = getattr(worker, request["op"])(request)
        except Exception as exc:
            answer = {"error": f"{type(exc).__name__}: {exc}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()


if __name__ == "__main__":
    main()
