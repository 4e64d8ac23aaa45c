"""Typed data model: the canonical rollout (input) and the per-step / per-rollout results (output).

Everything downstream of ingest speaks these types; nothing downstream knows an original log format.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

# Marks "the log recorded no output for this call" (distinct from a logged `null`).
NOT_LOGGED: Any = type("NotLogged", (), {"__repr__": lambda self: "NOT_LOGGED", "__bool__": lambda self: False})()

Check = Literal["S", "D", "P"]
Cause = Literal["schema", "dependency", "information", "state_consistency", "precondition"]
CAUSES: tuple[Cause, ...] = ("schema", "dependency", "information", "state_consistency", "precondition")
# A rollout's status (docs/explanation/data-model.md, "Canonical rollout"): `harness_error` = the harness never really
# ran it (an inference crash, a crashed scenario, an infrastructure termination); its reason is the attribute
# HARNESS_REASON.
Status = Literal["ok", "harness_error"]
# Who made a call: the agent (the headline metrics are over its calls), or the user simulator acting on its own side
# of a shared world (τ telecom's phone), replayed in logged order on the same state and scored as a diagnostic.
Actor = Literal["agent", "user"]
ACTORS: tuple[Actor, ...] = ("agent", "user")
STATUSES: tuple[Status, ...] = ("ok", "harness_error")
HARNESS_REASON = "harness_error"


@dataclass(slots=True)
class Message:
    role: str
    content: str
    turn: int = 0


@dataclass(slots=True)
class Call:
    tool: str
    # A dict once parsed; a string when the log kept the raw argument text (it may not parse: an S failure).
    arguments: Any
    output: Any = NOT_LOGGED
    error: bool | None = None
    turn: int = 0
    call_id: str | None = None
    actor: Actor = "agent"
    # Which of the rollout's logged tool-definition versions was in force at this call (`env.tool_versions`,
    # pipeline.envs.observed); 0, the first, when the definitions never changed.
    tools_version: int = 0


Event = Message | Call


@dataclass(slots=True)
class Rollout:
    rollout_id: str
    task_id: str
    benchmark: str
    # Condition labels: what a cohort is (model, method, agent version, date...).
    labels: dict[str, str] = field(default_factory=dict)
    env: dict[str, Any] = field(default_factory=dict)
    events: list[Event] = field(default_factory=list)
    success: bool | None = None
    cost: dict[str, float] = field(default_factory=dict)
    # Per-rollout attributes: what happened to this rollout (termination reason, trial, seed, user simulator...).
    attributes: dict[str, str] = field(default_factory=dict)
    status: Status = "ok"
    # Known per-step truth, present only in synthetic stores (see pipeline.synthetic.rollouts).
    truth: dict[str, Any] | None = None

    @property
    def calls(self) -> list[Call]:
        return [e for e in self.events if isinstance(e, Call)]


@dataclass(slots=True)
class StepResult:
    step: int  # 1-based depth among calls
    turn: int
    tool: str
    valid: bool
    prefix_executable: bool
    failed_check: Check | None  # S, D or P; None when valid
    cause: Cause | None
    detail: str | None
    decided_by: str | None  # which source decided P: "simulator", "precondition", "log", ...
    output_match: bool | None
    effect: str | None = None  # the tool's effect class (pipeline.core.effects); None when undeclared
    effect_weight: float = 1.0  # its weight in the weighted executability
    actor: Actor = "agent"  # `step` counts the calls of this actor
    seq: int = 0  # 1-based position among both actors' calls, in logged order (as `step` when all are the agent's)
    # Which schema S was checked against: "spec" (a spec's or the environment's own), "log" (the definitions the
    # log recorded for this call), None (none: well-formedness only, or an unknown tool).
    schema_source: str | None = None


@dataclass(slots=True)
class RolloutResult:
    rollout: Rollout
    steps: list[StepResult]  # the agent's, complete when the result is built: what follows is derived from it once
    user_steps: list[StepResult] = field(default_factory=list)  # the user simulator's calls (a diagnostic)
    first_invalid: StepResult | None = field(init=False)

    def __post_init__(self) -> None:
        self.first_invalid = next((s for s in self.steps if not s.valid), None)

    @property
    def all_steps(self) -> list[StepResult]:
        """Both actors' steps in logged order."""
        if not self.user_steps:
            return self.steps
        return sorted(self.steps + self.user_steps, key=lambda s: s.seq)

    @property
    def user_fed(self) -> int | None:
        """The user simulator's first-error depth among its own calls; None when it made none."""
        if not self.user_steps:
            return None
        return next((s.step for s in self.user_steps if not s.valid), len(self.user_steps) + 1)

    @property
    def T(self) -> int:
        return len(self.steps)

    @property
    def fed(self) -> int:
        return self.first_invalid.step if self.first_invalid else self.T + 1

    @property
    def executable(self) -> bool:
        return self.fed == self.T + 1

    @property
    def auc_term(self) -> float:
        return 1.0 if self.T == 0 else (self.fed - 1) / self.T

    @property
    def first_cause(self) -> str | None:
        return self.first_invalid.cause if self.first_invalid else None

    @property
    def recovered(self) -> bool | None:
        if self.rollout.success is None:
            return None
        return (not self.executable) and self.rollout.success


@dataclass(slots=True)
class Reject:
    source: str  # file URL
    location: str  # "line 12", "row 40", "bytes 0-1000"
    reason: str
    raw: str  # the offending text, truncated
