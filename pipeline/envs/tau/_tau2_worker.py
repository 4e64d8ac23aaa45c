"""A τ domain's own code, run in the interpreter of a user-given τ source (a tau2-bench checkout or installed wheel,
which may need another Python than pexec's): `python _tau2_worker.py` reads one JSON request per line on stdin and
answers one JSON line on stdout. Only the standard library and `tau2` are imported here (pexec is not installed
there). Requests:

- `{"op": "hello"}` -> `{"tau2": version, "commit": git commit of the source or null}`;
- `{"op": "start", "domain", "initial_state", "retrieval"}` -> `{"tools": {name: [actor, tool type, schema]}}`:
  the domain's environment, freshly built by upstream's `get_environment`, with the task's initial state applied
  by upstream's `set_state`; only the knowledge base and the retrievers' indexes are built once per worker and
  shared by every rollout (see `Worker.share_retrieval`);
- `{"op": "call", "tool", "arguments", "actor"}` -> `{"accepted", "output"}`: upstream's own `make_tool_call`,
  then `sync_tools`, the output as upstream writes it (`to_json_str`), an exception as `Error: …`;
- `{"op": "discovered", "tool", "arguments", "actor"}` -> `{"missing": null | what is not yet discovered}`;
- `{"op": "checkpoint"}` -> `{"mark": n}`; `{"op": "rollback", "mark": n}` -> `{}`: copies (pickled) of the
  mutable state (the DB and the discovery state), kept until the next `start`.
Errors of the worker itself are `{"error": text}`.
"""

from __future__ import annotations

import functools
import json
import pickle
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
        self.shared = False
        self.tools: dict[tuple[str, ...], dict[str, list[Any]]] = {}

    def share_retrieval(self) -> None:
        """Upstream's `get_environment` loads the knowledge base and indexes it for each retriever (BM25 over every
        document: most of a rollout's time) on every call. Retrieval only reads them once built, so the worker
        builds them once per retriever spec and hands the same ones to every rollout's environment; the DB, the
        toolkits and the discovery state are still upstream's fresh build per rollout. A worker serves one source
        at one version (pipeline/envs/tau/banking.py starts another when the source changes), so what is kept is
        what a fresh build would make."""
        if self.shared:
            return
        from tau2.domains.banking_knowledge import environment, retrieval

        environment.get_knowledge_base = functools.cache(environment.get_knowledge_base)
        for name in ("_create_kb_pipeline", "_create_grep_pipeline"):
            setattr(retrieval, name, _once_per_spec(getattr(retrieval, name)))
        self.shared = True

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
        self.share_retrieval()
        from tau2.domains.banking_knowledge.environment import get_environment

        self.env = get_environment(retrieval_variant=request.get("retrieval") or "bm25_grep")
        initial = request.get("initial_state")
        if initial:
            parsed = InitialState.model_validate(initial)
            self.env.set_state(parsed.initialization_data, parsed.initialization_actions, [])
        self.marks = []
        # A toolkit's tools are its class's (upstream collects them per class): listed once per pair of classes,
        # building their schemas is most of a start otherwise.
        kits = (("agent", self.env.tools), ("user", self.env.user_tools))
        key = tuple(f"{type(kit).__module__}.{type(kit).__qualname__}" for _, kit in kits)
        if key not in self.tools:
            tools = {}
            for actor, kit in kits:
                for name, tool in kit.get_tools().items():
                    kind = str(getattr(kit.tool_type(name), "value", kit.tool_type(name)))
                    tools[name] = [actor, kind, tool.openai_schema["function"]["parameters"]]
            self.tools[key] = tools
        return {"tools": self.tools[key]}

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
        # Pickled rather than deep-copied: a checkpoint precedes every call and a rollback is rare; pickling the
        # DB is several times faster than copying it, and unpickling gives the same copy.
        self.marks.append(pickle.dumps(self._state(), protocol=pickle.HIGHEST_PROTOCOL))
        return {"mark": len(self.marks) - 1}

    def rollback(self, request: dict[str, Any]) -> dict[str, Any]:
        mark = int(request["mark"])
        db, agent_state, user_state = pickle.loads(self.marks[mark])  # marks stay valid until the next start
        tools = self.env.tools
        tools.db = db
        self.env.user_tools.db = db  # one DB, as upstream builds it
        tools._agent_discoverable_tools_state = agent_state
        tools._user_discoverable_tools_state = user_state
        return {}


def _once_per_spec(build: Any) -> Any:
    """`build(spec, knowledge_base)` run once per spec (a dataclass: its repr names every field) and knowledge base."""
    built: dict[tuple[str, int], Any] = {}

    def shared(spec: Any, knowledge_base: Any) -> Any:
        key = (repr(spec), id(knowledge_base))
        if key not in built:
            built[key] = build(spec, knowledge_base)
        return built[key]

    return shared


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
