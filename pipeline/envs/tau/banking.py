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
- The source's version: the tau2 reader records in each rollout the fingerprint of the source's code and
  banking_knowledge data it was read against (`tau2_source_version`, `source_version`), taken once where the run is
  planned, so it is part of the scoring settings and a changed source rescores. A rollout replays only against
  that version: a worker is started per source and version, and a rollout whose source changed since it was read
  is refused in one line (read the logs again), never replayed against other code than it names.
"""

from __future__ import annotations

import contextlib
import hashlib
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
VERSION_KEY = "tau2_source_version"
# What a source's version covers: the whole tau2 package's files (shared code: the environment, the retrievers)
# and the domain's data (DB, documents, tasks). Bytecode caches are left out: they follow the code.
VERSIONED = (("src", "tau2"), ("data", "tau2", "domains", DOMAIN))
MAX_SOURCE_FILES = 20_000  # files one source's version reads (1,071 in tau2-bench 1.0.1)
MAX_SOURCE_BYTES = 256 << 20  # and their bytes (6.5 MB)


def source_version(source: str) -> str:
    """The fingerprint of a τ source's code and banking_knowledge data: the SHA-256 of every file under
    `src/tau2` and `data/tau2/domains/banking_knowledge`, paths and bytes, in path order (short, like the other
    environments' data fingerprints). A folder that is not a tau2-bench checkout is an EnvError."""
    root = Path(source)
    try:
        return _digest(root, _source_files(root))
    except OSError as exc:
        raise EnvError(f"tau_{DOMAIN}: cannot read the τ source {source}: {exc}") from None


def _source_listing(source: str) -> str:
    """A hash of the versioned files' paths, sizes and modification times: unchanged while nothing was written."""
    root = Path(source)
    digest = hashlib.sha256()
    try:
        for path in _source_files(root):
            stat = path.stat()
            digest.update(f"{path.relative_to(root).as_posix()}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    except OSError as exc:
        raise EnvError(f"tau_{DOMAIN}: cannot read the τ source {source}: {exc}") from None
    return digest.hexdigest()


def _source_files(root: Path) -> list[Path]:
    """The files a source's version covers, in path order (at most MAX_SOURCE_FILES)."""
    folders = [root.joinpath(*parts) for parts in VERSIONED]
    if not all(f.is_dir() for f in folders):
        raise EnvError(f"tau_{DOMAIN}: {root} is not a tau2-bench checkout (no src/tau2, data/tau2/domains/{DOMAIN})")
    files: list[Path] = []
    for path in (p for f in folders for p in f.rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts:
            files.append(path)
            if len(files) > MAX_SOURCE_FILES:
                raise EnvError(
                    f"tau_{DOMAIN}: {root} holds over {MAX_SOURCE_FILES} files under src/tau2 and the domain's data"
                )
    return sorted(files)


def _digest(root: Path, files: list[Path]) -> str:
    digest = hashlib.sha256()
    size = 0
    for path in files:
        size += path.stat().st_size  # before reading: a file past the limit is never read
        if size > MAX_SOURCE_BYTES:
            raise EnvError(
                f"tau_{DOMAIN}: {root} holds over {MAX_SOURCE_BYTES >> 20} MiB under src/tau2 and the domain's data"
            )
        data = path.read_bytes()
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + len(data).to_bytes(8, "big") + data)
    return digest.hexdigest()[:16]


@dataclass
class _Worker:
    """One τ source's interpreter, serving one rollout at a time."""

    process: subprocess.Popen[str]
    version: str  # the source's version when the worker started: the code it imported, the data it reads
    hello: dict[str, Any] = field(default_factory=dict)
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

    def stop(self) -> None:
        """End the worker (its stdin closed: it leaves its loop), killed when it does not within seconds."""
        with self.lock:
            if self.process.stdin is not None:
                with contextlib.suppress(OSError):  # a pipe already broken: the process is going
                    self.process.stdin.close()
            try:
                self.process.wait(timeout=STOP_WAIT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


STOP_WAIT = 10  # seconds a replaced worker is given to exit


@dataclass
class BankingState:
    worker: _Worker
    retrieval: str
    observed_retrieval: bool


class BankingEnvironment:
    simulated = True

    def __init__(self) -> None:
        self.name = f"tau_{DOMAIN}"
        # The source and its version are each rollout's (`tau2_source`, `tau2_source_version`): part of the input a
        # shard reads, and of the settings when the logs are read where they lie.
        self.version = "tau2-source"
        self._workers: dict[tuple[str, str], _Worker] = {}
        # (source, a version it no longer is) -> (its file listing, its version) when that was found
        self._stale: dict[tuple[str, str], tuple[str, str]] = {}
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
        version = env.get(VERSION_KEY)
        if not version:
            raise EnvError(
                f"{self.name}: the rollout names no version of its τ source ({VERSION_KEY}): it was read by an "
                "earlier pexec; read the logs again"
            )
        worker = self._worker(str(source), str(python), str(version))
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

    def _worker(self, source: str, python: str, version: str) -> _Worker:
        """The worker of `source` at `version`: the running one, else a new one once the source is checked to be
        at that version now (the one it replaces is stopped)."""
        key = (source, python)
        running = self._workers.get(key)
        if running is not None and running.version == version:
            return running
        # A version found stale is refused again without hashing the source for each of its rollouts (a store read
        # before the change holds many) while the source's files keep their sizes and modification times.
        listing = _source_listing(source)
        stale = self._stale.get((source, version))
        now = stale[1] if stale is not None and stale[0] == listing else source_version(source)
        if now != version:
            self._stale[(source, version)] = (listing, now)
            raise EnvError(
                f"{self.name}: the τ source {source} changed since this rollout was read (read at version {version}, "
                f"now {now}): read the logs again to replay them against it"
            )
        if running is not None:
            running.stop()
            del self._workers[key]
        root = Path(source)
        environ = {
            "PYTHONPATH": str(root / "src"),
            "TAU2_DATA_DIR": str(root / "data"),
            "PATH": "/usr/bin:/bin",
            # tau2 imports litellm, which otherwise fetches its model price list at import (retried for about 20 s
            # offline); replay prices nothing.
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        }
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
        worker = _Worker(process, version)
        worker.hello = worker.ask(op="hello")
        self._workers[key] = worker
        return worker


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
