"""`pexec synth tau_banking_knowledge`: synthetic τ banking_knowledge rollouts with known truth, for scale tests.

banking_knowledge is replayed against a user-given τ source (a tau2-bench >= 1.0.1 checkout, `tau2_source`, run by
`tau2_python`), so synth reads its tasks there: each task is one of the source's tasks with gold actions. A task's
calls are a BM25 search and a grep of the knowledge base, then its gold actions of both actors (`requestor`),
discovery included; they are run once on the domain's own code through the environment (`tau_banking_knowledge`,
its worker), so the logged outputs are real. A rollout of a task belongs to a condition (model × method) and may get
one invalid agent call injected at a chosen depth among the agent's calls, of a cause that holds whatever the
state: schema (an unknown tool; an unknown argument; a discoverable tool called before the step that unlocks it)
or precondition (a discoverable tool the domain does not have: the domain's error answer); and a user call of a
discoverable tool before any was given to the user (the user's diagnostic). The expected per-step truth of the
agent's calls is recorded in every record (`truth`), as the shop synth does.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from pipeline.core.errors import EnvError, SynthError
from pipeline.core.model import Actor, Call, Rollout
from pipeline.core.records import RolloutRecord
from pipeline.synthetic.telecom import ActorStep, ActorTask, dual_control_record

BENCHMARK = "tau_banking_knowledge"
DOMAIN = "banking_knowledge"
RETRIEVAL = "bm25_grep"  # deterministic: every retrieval call replays
CONDITIONS: dict[tuple[str, str], tuple[float, float]] = {  # (p of an invalid agent call, p of a user's one)
    ("model-a", "react"): (0.5, 0.2),
    ("model-b", "react"): (0.8, 0.4),
}
# What a customer asks the knowledge base about (the searches' queries, the greps' patterns).
QUERIES = ("replacement credit card", "close a credit card account", "wire transfer fee", "dispute a transaction")
PATTERNS = ("overdraft", "annual fee", "referral", "expedited shipping")
UNLOCK, CALL = "unlock_discoverable_agent_tool", "call_discoverable_agent_tool"
GIVE, USER_CALL = "give_discoverable_user_tool", "call_discoverable_user_tool"


def synthesize_banking(
    n_rollouts: int, n_tasks: int, seed: int, options: Mapping[str, str] | None = None
) -> Iterator[RolloutRecord]:
    from pipeline.envs import EnvOptions, get_environment
    from pipeline.envs.tau.banking import VERSION_KEY, source_version

    options = options or {}
    given = options.get("tau2_source")
    if not given:
        raise SynthError(
            "synth tau_banking_knowledge replays against a τ source: --option tau2_source=PATH (a tau2-bench "
            ">= 1.0.1 checkout) and, when its Python is not python3.12, --option tau2_python=PATH"
        )
    source = str(Path(given).resolve())
    try:
        version = source_version(source)
    except (EnvError, OSError) as exc:
        raise SynthError(f"synth tau_banking_knowledge: {exc}") from None
    env_fields = {
        "domain": DOMAIN,
        "tau2_source": source,
        "tau2_python": options.get("tau2_python") or "python3.12",
        VERSION_KEY: version,
        "retrieval": RETRIEVAL,
    }
    env = get_environment(BENCHMARK, EnvOptions())
    rng = random.Random(f"{seed}/tasks")
    official = _source_tasks(Path(source))
    picked = rng.sample(official, min(n_tasks, n_rollouts, len(official)))
    tasks = [t for t in (_gold(env, raw, env_fields, rng) for raw in picked) if t is not None]
    if not tasks:
        raise SynthError("no banking_knowledge task's gold actions replay on the source's own code")
    user_tools = sorted({str(s.args.get("discoverable_tool_name")) for t in tasks for s in t.gold if s.tool == GIVE})
    conditions = sorted(CONDITIONS)
    for r in range(n_rollouts):
        task = tasks[r % len(tasks)]
        model, method = conditions[(r // len(tasks)) % len(conditions)]
        rollout_rng = random.Random(f"{seed}/rollout/{r}")
        yield _record(f"b{r:07d}", task, model, method, env_fields, user_tools, rollout_rng)


def _source_tasks(source: Path) -> list[dict[str, Any]]:
    """The source's tasks (`tasks/task_*.json`, as upstream reads them) that have gold actions."""
    folder = source / "data" / "tau2" / "domains" / DOMAIN / "tasks"
    tasks = []
    for path in sorted(folder.glob("task_*.json")):
        try:
            task = json.loads(path.read_text())
        except (OSError, ValueError) as exc:
            raise SynthError(f"synth tau_banking_knowledge: {path}: {exc}") from None
        if isinstance(task, dict) and (task.get("evaluation_criteria") or {}).get("actions"):
            tasks.append(task)
    return tasks


def _gold(env: Any, raw: dict[str, Any], env_fields: dict[str, Any], rng: random.Random) -> ActorTask | None:
    """The task's retrieval calls and gold actions run once (None when upstream's own gold does not replay)."""
    task = ActorTask(str(raw["id"]), raw.get("initial_state"))
    task.gold += [
        ActorStep("KB_search", {"query": rng.choice(QUERIES)}, "agent"),
        ActorStep("grep", {"pattern": rng.choice(PATTERNS)}, "agent"),
    ]
    for action in raw["evaluation_criteria"]["actions"]:
        actor: Actor = "user" if action.get("requestor") == "user" else "agent"
        task.gold.append(ActorStep(action["name"], dict(action.get("arguments") or {}), actor))
    rollout = Rollout("gold", task.task_id, BENCHMARK, env=env_fields | {"initial_state": task.initial_state})
    state = env.start(rollout)
    for step in task.gold:
        outcome = env.execute(state, step.tool, step.args, Call(step.tool, step.args, actor=step.actor))
        if not outcome.accepted:
            return None
        step.output = outcome.output
    return task


def _record(
    rollout_id: str,
    task: ActorTask,
    model: str,
    method: str,
    env_fields: dict[str, Any],
    user_tools: list[str],
    rng: random.Random,
) -> RolloutRecord:
    p_agent, p_user = CONDITIONS[(model, method)]
    steps = list(task.gold)
    if rng.random() < p_agent:
        pos, injected = _invalid_agent_call(steps, rng)
        steps.insert(pos, injected)
    if user_tools and rng.random() < p_user:
        # Before any call, nothing has been given to the user yet.
        args = {"discoverable_tool_name": rng.choice(user_tools), "arguments": "{}"}
        steps.insert(0, ActorStep(USER_CALL, args, "user", valid=False, cause="schema"))
    env = env_fields | {"task_id": task.task_id, "initial_state": task.initial_state}
    labels = {"model": model, "method": method}
    return dual_control_record(rollout_id, task, steps, BENCHMARK, labels, env, "I need help with my account.", rng)


def _invalid_agent_call(steps: list[ActorStep], rng: random.Random) -> tuple[int, ActorStep]:
    """Where to insert an invalid agent call, and the call: its cause holds in any state the gold reaches."""
    unlocked: dict[Any, int] = {}  # tool -> the step that first unlocks it
    for i, s in enumerate(steps):
        if s.tool == UNLOCK:
            unlocked.setdefault(s.args.get("agent_tool_name"), i)
    early = [s for s in steps if s.tool == CALL and s.args.get("agent_tool_name") in unlocked]
    if early and rng.random() < 0.4:
        # A discoverable tool called before the step that unlocks it: S, unavailable.
        call = rng.choice(early)
        pos = rng.randint(0, unlocked[call.args["agent_tool_name"]])
        return pos, replace(call, valid=False, cause="schema", output=None)
    agent_positions = [i for i, s in enumerate(steps) if s.actor == "agent"]
    pos = rng.choice([*agent_positions, len(steps)])
    cause, tool, args = rng.choice(
        [
            ("schema", "close_all_accounts", {}),  # no such tool
            ("schema", "get_user_information_by_email", {"email": "a@example.com", "verbose": True}),
            # a discoverable tool the domain does not have: its own error answer
            ("precondition", CALL, {"agent_tool_name": f"waive_all_fees_{rng.randint(1000, 9999)}", "arguments": "{}"}),
        ]
    )
    return pos, ActorStep(tool, args, "agent", valid=False, cause=cause)
