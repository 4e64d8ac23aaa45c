"""τ³-bench banking_knowledge (`tau_banking_knowledge`) over the domain's own code from a user-given τ source.

banking_knowledge is only in upstream tau2-bench (≥ 1.0.1, Python ≥ 3.12), not in the pinned wheel: each rollout
names the source it replays against (`tau2_source`, and the interpreter to run it with, `tau2_python`, both from the
tau2 reader's `--option`s), and its code runs in that interpreter, in a worker process per source
(pipeline/envs/tau/_tau2_worker.py, JSON lines over a pipe), so its Python may differ from pexec's.

- Database tools and both actors' calls replay on the domain's own toolkits (agent and user share one DB), each
  followed by upstream's sync, in logged order.
- Discovery: a discoverable tool is available from the step at which it was discovered (the agent's: unlocked by
  `unlock_discoverable_agent_tool`; the user's: given by `give_discoverable_user_tool`). Calling one through its
  wrapper before that is S, unavailable (BFCL's `miss_func` likewise), where upstream answers with an error text.
- Retrieval (`KB_search`, `grep`, …) replays when the run's retriever is deterministic (BM25, grep: no model);
  with any other retriever (embeddings, rerankers, a shell) the output and its acceptance come from the log, and
  the step's `decided_by` says `log` instead of `simulator`. A replayed retrieval answer's wall-clock timing line
  is not compared.
- The domain's tools answer most refusals with an `Error: …` text (upstream's `error` flag stays false): such an
  answer is a rejection (P), as an exception is.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.core.errors import EnvError
from pipeline.core.model import NOT_LOGGED, Call, Rollout
from pipeline.envs.base import Outcome, ToolInfo, captured
from pipeline.envs.spec.loader import tool_rules

DOMAIN = "banking_knowledge"
WORKER = Path(__file__).with_name("_tau2_worker.py")
RETRIEVAL_TOOLS = frozenset({"KB_search", "grep", "KB_search_bm25", "KB_search_dense", "shell", "rewrite_context"})
# Retrievers that need no model and give the same answer on every run: their tools replay.
DETERMINISTIC = frozenset({"bm25", "bm25_grep", "grep_only", "no_knowledge", "full_kb"})
WRAPPERS = frozenset({"call_discoverable_agent_tool", "call_discoverable_user_tool"})
MAX_LINE = 64 << 20  # bytes of one worker answer


@dataclass
class _Worker:
    """One τ source's interpreter, serving one rollout at a time."""

    process: subprocess.Popen[str]
    hello: dict[str, Any]
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ask(self, **request: Any) -> dict[str, Any]:
        with self.lock:
            assert self.process.stdin is not None and self.process.stdout is not None
            try:
                self.process.stdin.write(json.dumps(request) + "\n")
                self.process.stdin.flush()
                line = self.process.stdout.readline(MAX_LINE)
            except OSError as exc:
                raise EnvError(f"tau_banking_knowledge: the τ source's worker stopped: {exc}") from exc
        if not line:
            raise EnvError("tau_banking_knowledge: the τ source's worker stopped (see its stderr)")
        answer: dict[str, Any] = json.loads(line)
        if "error" in answer:
            raise EnvError(f"tau_banking_knowledge: the τ source failed: {answer['error']}")
        return answer


@dataclass
class BankingState:
    worker: _Worker
    retrieval: str
    observed_retrieval: bool


class BankingEnvironment:
    simulated = True

    def __init__(self) -> None:
        self.name = f"tau_{DOMAIN}"
        self.version = "tau2-source"  # the source each rollout names; its commit is in the rollout's attributes
        self._workers: dict[tuple[str, str], _Worker] = {}
        self._tools: dict[str, ToolInfo] = {}

    def tool(self, name: str) -> ToolInfo | None:
        return self._tools.get(name)

    def open_catalogue(self) -> bool:
        return False

    def knowledge(self, state: Any) -> list[Any]:
        return []

    def start(self, rollout: Rollout) -> BankingState:
        env = rollout.env
        if env.get("domain", DOMAIN) != DOMAIN:
            raise EnvError(f"{self.name}: rollout is for domain {env.get('domain')!r}")
        source, python = env.get("tau2_source"), env.get("tau2_python")
        if not source or not python:
            raise EnvError(
                f"{self.name}: the rollout names no τ source: ingest with --option tau2_source=PATH "
                "(a tau2-bench >= 1.0.1 checkout) and --option tau2_python=PATH (its Python)"
            )
        worker = self._worker(str(source), str(python))
        retrieval = str(env.get("retrieval") or "alltools")
        observed = retrieval not in DETERMINISTIC
        started = worker.ask(
            op="start",
            domain=DOMAIN,
            initial_state=env.get("initial_state"),
            retrieval=retrieval if not observed else "bm25_grep",
        )
        for name, (actor, _kind, params) in started["tools"].items():
            if name not in self._tools:
                where = f"{source}: {actor} tool {name}"
                self._tools[name] = tool_rules(name, _closed(params), {}, where).info
        return BankingState(worker, retrieval, observed)

    def available(self, state: BankingState, tool: str, turn: int) -> bool:
        return True

    def undiscovered(self, state: BankingState, tool: str, args: dict[str, Any], call: Call) -> str | None:
        """Why the discoverable tool this wrapper call names is not yet available, or None."""
        if tool not in WRAPPERS:
            return None
        missing = state.worker.ask(op="discovered", tool=tool, arguments=args, actor=call.actor)["missing"]
        return str(missing) if missing else None

    def execute(self, state: BankingState, tool: str, args: dict[str, Any] | None, call: Call) -> Outcome:
        args = captured(args, tool)
        if tool in RETRIEVAL_TOOLS and state.observed_retrieval:
            output = None if call.output is NOT_LOGGED else call.output
            if call.error:
                return Outcome(False, output=output, message=str(output), decided_by="log")
            return Outcome(True, output=output, decided_by="log")
        mark = self.checkpoint(state)
        answer = state.worker.ask(op="call", tool=tool, arguments=args, actor=call.actor)
        output = _timed_as_logged(answer["output"], call.output)
        # The domain's tools answer most refusals with an `Error: …` text rather than an exception.
        if not answer["accepted"] or (isinstance(output, str) and output.startswith("Error:")):
            self.rollback(state, mark)
            return Outcome(False, output=output, message=output, decided_by="simulator")
        return Outcome(True, output=output)

    def checkpoint(self, state: BankingState) -> int:
        return int(state.worker.ask(op="checkpoint")["mark"])

    def rollback(self, state: BankingState, mark: int) -> None:
        state.worker.ask(op="rollback", mark=mark)

    def _worker(self, source: str, python: str) -> _Worker:
        key = (source, python)
        if key not in self._workers:
            root = Path(source)
            if not (root / "src" / "tau2").is_dir() or not (root / "data" / "tau2" / "domains" / DOMAIN).is_dir():
                raise EnvError(f"{self.name}: {source} is not a tau2-bench checkout (no src/tau2, data/tau2/domains)")
            environ = {"PYTHONPATH": str(root / "src"), "TAU2_DATA_DIR": str(root / "data"), "PATH": "/usr/bin:/bin"}
            try:
                process = subprocess.Popen(
                    [python, str(WORKER)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                    env=environ,
                    cwd=str(root),
                )
            except OSError as exc:
                raise EnvError(f"{self.name}: cannot run the τ source's Python {python}: {exc}") from exc
            worker = _Worker(process, {})
            worker.hello = worker.ask(op="hello")
            self._workers[key] = worker
        return self._workers[key]


_TIMING = re.compile(r"\n*\[Timing: retrieval=\d+ms, reranking=\d+ms, total=\d+ms\]$")


def _timed_as_logged(output: Any, logged: Any) -> Any:
    """A retrieval answer ends with the retriever's wall-clock timing line: when the answers agree but for it,
    the logged line is kept (what was found is compared, not how fast)."""
    if not isinstance(output, str) or not isinstance(logged, str):
        return output
    mine, theirs = _TIMING.search(output), _TIMING.search(logged)
    if mine and theirs and output[: mine.start()] == logged[: theirs.start()]:
        return logged
    return output


def _closed(params: dict[str, Any]) -> dict[str, Any]:
    """Upstream's parameter schema without titles, unknown top-level keys refused (the call would raise)."""
    out = {k: v for k, v in params.items() if k != "title"}
    out["additionalProperties"] = False
    return out
