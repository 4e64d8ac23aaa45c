"""Replay one rollout against an environment and decide S/D/P for every call (docs/explanation/definitions.md;
docs/explanation/causes.md).

Pure with respect to IO: an environment and a rollout in, a RolloutResult out. Independent of any benchmark.
The batch scorer and the guard (pipeline.apps.guard) share one incremental `Session`: `replay` is a loop over it,
so a live session's verdicts equal the scorer's by construction (docs/explanation/architecture.md, "The guard").
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Any, cast

import fastjsonschema
import orjson

from pipeline.core.model import NOT_LOGGED, Actor, Call, Cause, Check, Message, Rollout, RolloutResult, StepResult
from pipeline.core.records import MAX_DEPTH, decoded_too_deep
from pipeline.core.text import clipped
from pipeline.core.values import same
from pipeline.envs.base import CallCatalogue, Environment, Outcome, ToolInfo
from pipeline.replay.dependencies import History, grounded_values, no_references, resolve_references

# The `detail` of every step whose arguments the log did not capture (S and D not checked).
UNCAPTURED = "arguments not captured: S and D unknown"
# A step's `detail` may quote what a log or a simulator said (a value, a message): kept to this many characters, the
# rest counted, so a long argument does not fill the steps table once per step that names it.
MAX_DETAIL_CHARS = 2000
MAX_QUOTED_CHARS = 200  # of an argument's path or value quoted in a grounding detail
# The checks `--checks` selects from: S's schema fit, D (references and grounding), P (the environment's
# acceptance). A call that cannot be replayed at all (unknown or unavailable tool, arguments that are not an
# object) is an S failure whatever is selected.
CHECKS = ("schema", "dependency", "precondition")


def parse_checks(text: str) -> tuple[str, ...]:
    """The checks named in `text` (comma-separated), in canonical order; ValueError for an unknown or no name."""
    names = {n.strip() for n in text.split(",") if n.strip()}
    unknown = sorted(names - set(CHECKS))
    if unknown or not names:
        raise ValueError(f"checks are a comma-separated subset of {','.join(CHECKS)}, got {text!r}")
    return tuple(c for c in CHECKS if c in names)


class ReplayError(Exception):
    """The environment misbehaved (e.g. a call it accepted once is rejected when replayed again)."""


@dataclass(slots=True)
class Verdict:
    """The decision on one call, before it is recorded as a step."""

    valid: bool
    check: Check | None = None
    cause: Cause | None = None
    detail: str | None = None
    outcome: Outcome | None = None
    args: dict[str, Any] | None = None

    @property
    def message(self) -> str | None:
        """The environment's own rejection message (P), if it gave one."""
        return self.outcome.message if self.outcome else None

    @property
    def decided_by(self) -> str | None:
        return self.outcome.decided_by if self.outcome else None


def replay(env: Environment, rollout: Rollout, checks: tuple[str, ...] = CHECKS) -> RolloutResult:
    session = Session(env, rollout, checks)
    for event in rollout.events:
        if isinstance(event, Message):
            session.message(event.role, event.content)
        else:
            session.step(event)
    return RolloutResult(rollout, session.steps, session.user_steps)


class Session:
    """A rollout replayed event by event, with everything a next check needs kept incrementally: the state,
    its checkpoints, the accepted calls, the grounding history. A check costs the same at any depth, except
    the state-consistency walk-back, which re-tests the first P failure in earlier states.

    `check` decides the next call; a simulator's execution of an accepted call stays in the state as pending
    until `record` commits it (the same call) or anything else discards it.

    Calls of the user simulator (actor `user`, τ telecom's phone) run on the same state in logged order and are
    scored on their own: their own depth, prefix and grounding (what the agent said to the user), never the
    agent's prefix. A P failure whose call was accepted in an earlier state is state_consistency either way, and
    when the call that made it impossible was the other actor's, `detail` names that step.
    """

    def __init__(self, env: Environment, rollout: Rollout, checks: tuple[str, ...] = CHECKS) -> None:
        self.env = env
        self.checks = _check_set(checks)
        self.state = env.start(rollout)
        self.history = History()
        for known in env.knowledge(self.state):
            self.history.add_known(known)
        self.marks = [env.checkpoint(self.state)]  # marks[i] = state after the i-th accepted call; marks[0] = s_0
        self.accepted: list[tuple[Call, dict[str, Any] | None]] = []  # None: arguments not captured
        self.accepted_steps: list[tuple[Actor, int]] = []  # who made each accepted call, at which depth
        self.steps: list[StepResult] = []
        self.prefix_ok = True
        self.user_steps: list[StepResult] = []
        self.user_prefix_ok = True
        self.user_history = History()  # what the user simulator could know: the agent's messages, its own outputs
        self._pending: tuple[Call, Verdict] | None = None
        self._catalogue = cast(CallCatalogue, env) if _is_catalogue(type(env)) else None
        self._simulated = env.simulated

    def message(self, role: str, content: str) -> None:
        if self._pending is not None:
            self._discard()
        if role in ("user", "system"):
            self.history.add_message(content)
        if role in ("assistant", "system"):
            self.user_history.add_message(content)

    def check(self, call: Call) -> Verdict:
        """The verdict on `call` as the next step, before it is recorded."""
        if self._pending is not None:
            self._discard()
        env, state = self.env, self.state
        user = call.actor == "user"
        steps, history = (self.user_steps, self.user_history) if user else (self.steps, self.history)
        if self._catalogue is not None:
            self._catalogue.select(call)
        verdict = _check(env, state, call, len(steps) + 1, history, self.checks)
        if not verdict.valid and verdict.check == "P":
            # Without a simulator an earlier state is only less of what the agent saw, where rules cannot be
            # evaluated and would accept vacuously: the walk-back is for simulated environments.
            prefix_ok = self.user_prefix_ok if user else self.prefix_ok
            if prefix_ok and len(self.marks) > 1 and env.simulated:
                earlier = _accepted_earlier(env, state, self.marks, self.accepted, call, verdict.args)
                verdict.cause = "state_consistency" if earlier is not None else "precondition"
                if earlier is not None and self.accepted_steps[earlier][0] != call.actor:
                    actor, depth = self.accepted_steps[earlier]
                    made = f"made impossible by the {actor}'s step {depth} ({self.accepted[earlier][0].tool})"
                    verdict.detail = f"{verdict.detail}; {made}" if verdict.detail else made
            else:
                verdict.cause = "precondition"
        self._pending = (call, verdict)
        return verdict

    def record(self, call: Call) -> StepResult:
        """Add `call` (with its logged outcome) as the next step. The pending verdict is reused when it is
        for the same call and could not have read the outcome: a simulator decided it, and its output is the
        recorded one. Otherwise the call is checked again, now with its outcome: without a simulator P reads
        it, and a simulator may too (ToolSandbox maps the ids it creates to the logged ones)."""
        pending = self._pending
        if pending is not None and (
            pending[0] is call
            or (
                self.env.simulated
                and _same_call(pending[0], call)
                and _output_match(self.env, call, pending[1]) is not False
            )
        ):
            return self._commit(call, pending[1])
        return self._commit(call, self.check(call))

    def step(self, call: Call) -> StepResult:
        return self._commit(call, self.check(call))

    def _commit(self, call: Call, verdict: Verdict) -> StepResult:
        self._pending = None
        user = call.actor == "user"
        steps = self.user_steps if user else self.steps
        depth = len(steps) + 1
        # Executed: valid, and the environment accepted it (with P not checked a rejected call is valid too).
        executed = verdict.valid and (verdict.outcome is None or verdict.outcome.accepted)
        if executed:
            self.accepted.append((call, verdict.args))
            self.accepted_steps.append((call.actor, depth))
            self.marks.append(self.env.checkpoint(self.state))
        output = verdict.outcome.output if verdict.outcome and executed else None
        if user:
            self.user_history.add_result(depth, call.call_id, executed, output)
            self.user_prefix_ok = prefix_ok = self.user_prefix_ok and verdict.valid
        else:
            self.history.add_result(depth, call.call_id, executed, output)
            self.prefix_ok = prefix_ok = self.prefix_ok and verdict.valid
        tool = call.tool
        if self._catalogue is not None:
            self._catalogue.select(call)
            schema_source = self._catalogue.schema_source(tool)
        info = self.env.tool(tool)
        if self._catalogue is None:
            schema_source = "spec" if info is not None else None
        effect = info.effect if info is not None else None
        outcome = verdict.outcome
        step = StepResult(
            depth,
            call.turn,
            tool,
            verdict.valid,
            prefix_ok,
            verdict.check,
            verdict.cause,
            verdict.detail if verdict.detail is None else clipped(verdict.detail, MAX_DETAIL_CHARS),
            outcome.decided_by if outcome else None,
            None if call.output is NOT_LOGGED or not self._simulated else _output_match(self.env, call, verdict),
            effect.effect if effect else None,
            effect.weight if effect else 1.0,
            call.actor,
            len(self.steps) + len(self.user_steps) + 1,
            schema_source,
        )
        steps.append(step)
        return step

    def _discard(self) -> None:
        # A checked call that was not recorded never happened: undo its execution (a rejection left none).
        pending, self._pending = self._pending, None
        if pending is not None and pending[1].valid:
            self.env.rollback(self.state, self.marks[-1])


@lru_cache(maxsize=64)
def _check_set(checks: tuple[str, ...]) -> frozenset[str]:
    return frozenset(checks)


@lru_cache(maxsize=64)
def _is_catalogue(kind: type) -> bool:
    # A runtime-checkable protocol's isinstance walks its members on every call: asked once per class.
    return issubclass(kind, CallCatalogue)


def _same_call(a: Call, b: Call) -> bool:
    return a.tool == b.tool and a.turn == b.turn and a.arguments == b.arguments


def _check(
    env: Environment, state: Any, call: Call, depth: int, history: History, checks: frozenset[str] = frozenset(CHECKS)
) -> Verdict:
    # S: the tool is known and available, the arguments parse and fit the schema.
    info = env.tool(call.tool)
    if info is None and not env.open_catalogue():
        return Verdict(False, "S", "schema", f"unknown tool {call.tool!r}")
    if not env.available(state, call.tool, call.turn):
        return Verdict(False, "S", "schema", f"tool {call.tool!r} is not available at turn {call.turn}")
    args = call.arguments
    if args is None:
        return _uncaptured(env, state, call)
    plain = False  # whether the arguments cannot hold a reference (decided from their text)
    if isinstance(args, str):
        text = args
        try:
            args = orjson.loads(text) if text.strip() else {}
        except orjson.JSONDecodeError as exc:
            return Verdict(False, "S", "schema", f"arguments do not parse as JSON: {exc}")
        if decoded_too_deep(text, args):  # as a record's own values are (pipeline/core/records.py)
            return Verdict(False, "S", "schema", f"arguments nest deeper than {MAX_DEPTH} levels")
        plain = no_references(text)
    if not isinstance(args, dict):
        return Verdict(False, "S", "schema", f"arguments must be an object, got {type(args).__name__}")

    if plain:  # decoded here: nobody else holds them, and no reference to substitute
        ref_failures: dict[str, str] = {}
        ref_holders: set[str] = set()
    else:
        args, ref_failures, ref_holders = resolve_references(args, history, depth)
    if info is not None and "schema" in checks:
        failed = _schema_failure(info, args, ref_failures, ref_holders)
        if failed:
            return failed
    # S: a tool discovered at run time (τ banking_knowledge) is available only from the step that discovered it.
    undiscovered = getattr(env, "undiscovered", None)
    if undiscovered is not None:
        missing = undiscovered(state, call.tool, args, call)
        if missing:
            return Verdict(False, "S", "schema", f"not available: {missing}")
    # D: explicit references resolve, grounded values occur in what the agent could know.
    if ref_failures and "dependency" in checks:
        return Verdict(False, "D", "dependency", "; ".join(ref_failures.values()))
    if info is not None and "dependency" in checks:
        for path, head in _grounded_order(info.grounded):
            if head in ref_holders:
                continue  # a resolved reference is grounded by construction
            for value in grounded_values(args, path):
                if not history.knows(value):
                    quoted = clipped(repr(value), MAX_QUOTED_CHARS)
                    detail = f"{clipped(path, MAX_QUOTED_CHARS)}={quoted} occurs in no earlier output or message"
                    return Verdict(False, "D", "information", detail)
    # P: the environment accepts the call in the current state.
    outcome = env.execute(state, call.tool, args, call)
    if not outcome.accepted:
        if "precondition" not in checks:  # the environment's rejection is not a check here: the state stays
            return Verdict(True, detail=f"P not checked: {outcome.message}", outcome=outcome, args=args)
        return Verdict(False, "P", None, outcome.message, outcome, args)
    return Verdict(True, None, None, None, outcome, args)  # positional: the verdict of most calls, made often


@lru_cache(maxsize=256)
def _grounded_order(grounded: frozenset[str]) -> tuple[tuple[str, str], ...]:
    """Grounded paths in a fixed order (a frozenset's own changes with the hash seed), each with its argument."""
    return tuple((path, path.split(".")[0].removesuffix("[]")) for path in sorted(grounded))


def _uncaptured(env: Environment, state: Any, call: Call) -> Verdict:
    """The log did not capture the arguments (`arguments: null`): S and D are unknown, never passed or failed.

    Only an environment that reads outcomes from the log can decide P without them; a simulator cannot run
    the call, which is reported as a schema failure that says so rather than guessed either way.
    """
    if env.simulated:
        return Verdict(False, "S", "schema", f"{UNCAPTURED}: a simulator cannot replay the call")
    outcome = env.execute(state, call.tool, None, call)
    if not outcome.accepted:
        return Verdict(False, "P", None, f"{outcome.message} ({UNCAPTURED})", outcome)
    return Verdict(True, detail=UNCAPTURED, outcome=outcome)


def _schema_failure(
    info: ToolInfo, args: dict[str, Any], ref_failures: dict[str, str], ref_holders: set[str]
) -> Verdict | None:
    # An unresolved reference stands for a value of the right type, so S judges the rest of the call.
    # (validate never changes what it is given: compiled without filling in defaults)
    probe = {k: (_stand_in(info, k) if k in ref_failures else v) for k, v in args.items()} if ref_failures else args
    try:
        info.validate(probe)
    except fastjsonschema.JsonSchemaValueException as exc:
        key = exc.path[1] if len(exc.path) > 1 else None
        if key in ref_holders and key not in ref_failures:
            return Verdict(False, "D", "dependency", f"referenced value for {key!r} does not fit: {exc.message}")
        return Verdict(False, "S", "schema", _schema_message(exc))
    return None


def _schema_message(exc: fastjsonschema.JsonSchemaValueException) -> str:
    # fastjsonschema names unexpected properties as a set, whose order changes with the hash seed: sort them.
    definition = exc.definition if isinstance(exc.definition, dict) else {}
    if exc.rule == "additionalProperties" and isinstance(exc.value, dict) and "patternProperties" not in definition:
        allowed = definition.get("properties", {})
        extra = sorted(k for k in exc.value if k not in allowed)
        if extra:
            return f"{exc.name} must not contain {{{', '.join(map(repr, extra))}}} properties"
    return exc.message


def _stand_in(info: ToolInfo, key: str) -> Any:
    schema = info.parameters.get("properties", {}).get(key, {})
    if "enum" in schema:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    kind = schema.get("type")
    kind = kind[0] if isinstance(kind, list) else kind
    return {"string": "", "integer": 0, "number": 0, "boolean": False, "array": [], "object": {}}.get(kind)


def _accepted_earlier(
    env: Environment,
    state: Any,
    marks: list[Any],
    accepted: list[tuple[Call, dict[str, Any] | None]],
    call: Call,
    args: dict[str, Any] | None,
) -> int | None:
    """The latest earlier state of this rollout (s_0 … s_{t-2}) in which `call` would have been accepted, as the
    index of the accepted call that came after it (the one that made it impossible); None when there is none.

    Walks back through the marks, most recent first, then brings the state forward again by replaying the
    accepted calls after the mark where the walk stopped (only those: the state below it was never undone).
    """
    found: int | None = None
    for i in range(len(marks) - 2, -1, -1):
        env.rollback(state, marks[i])
        if env.execute(state, call.tool, args, call).accepted:
            found = i
            break
    start = found or 0
    env.rollback(state, marks[start])
    del marks[start + 1 :]
    for earlier, earlier_args in accepted[start:]:
        if not env.execute(state, earlier.tool, earlier_args, earlier).accepted:
            raise ReplayError(f"{env.name}: {earlier.tool} was accepted once and rejected on a second replay")
        marks.append(env.checkpoint(state))
    return found


def _output_match(env: Environment, call: Call, verdict: Verdict) -> bool | None:
    if call.output is NOT_LOGGED or not env.simulated:
        return None
    if verdict.valid:
        return same(verdict.outcome.output if verdict.outcome else None, call.output)
    if verdict.outcome is not None and verdict.outcome.output is not None:  # the simulator's own error output
        return same(verdict.outcome.output, call.output)
    if call.error is not None:
        return bool(call.error)
    return same(verdict.detail, call.output)
