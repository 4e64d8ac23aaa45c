"""Replay one rollout against an environment and decide S/D/P for every call (docs/design.md §2, §3).

Pure with respect to IO: an environment and a rollout in, a RolloutResult out. Independent of any benchmark.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import fastjsonschema
import orjson

from pipeline.dependencies import History, grounded_values, resolve_references
from pipeline.envs.base import Environment, Outcome, ToolInfo
from pipeline.model import NOT_LOGGED, Call, Message, Rollout, RolloutResult, StepResult

# The `detail` of every step whose arguments the log did not capture (S and D not checked).
UNCAPTURED = "arguments not captured: S and D unknown"


class ReplayError(Exception):
    """The environment misbehaved (e.g. a call it accepted once is rejected when replayed again)."""


@dataclass(slots=True)
class _Verdict:
    valid: bool
    check: str | None = None
    cause: str | None = None
    detail: str | None = None
    outcome: Outcome | None = None
    args: dict[str, Any] | None = None


def replay(env: Environment, rollout: Rollout) -> RolloutResult:
    state = env.start(rollout)
    history = History()
    marks = [env.checkpoint(state)]  # marks[i] = state after the i-th accepted call; marks[0] = s_0
    accepted: list[tuple[Call, dict[str, Any] | None]] = []  # None: arguments not captured
    steps: list[StepResult] = []
    prefix_ok = True
    depth = 0
    for event in rollout.events:
        if isinstance(event, Message):
            if event.role in ("user", "system"):
                history.add_message(event.content)
            continue
        depth += 1
        verdict = _check(env, state, event, depth, history)
        if not verdict.valid and verdict.check == "P":
            # Without a simulator an earlier state is only less of what the agent saw, where rules cannot be
            # evaluated and would accept vacuously: the walk-back is for simulated environments.
            if prefix_ok and len(marks) > 1 and env.simulated:
                earlier = _accepted_earlier(env, state, marks, accepted, event, verdict.args)
                verdict.cause = "state_consistency" if earlier else "precondition"
            else:
                verdict.cause = "precondition"
        if verdict.valid:
            accepted.append((event, verdict.args))
            marks.append(env.checkpoint(state))
        output = verdict.outcome.output if verdict.outcome and verdict.valid else None
        history.add_result(depth, event.call_id, verdict.valid, output)
        prefix_ok = prefix_ok and verdict.valid
        steps.append(
            StepResult(
                step=depth,
                turn=event.turn,
                tool=event.tool,
                valid=verdict.valid,
                prefix_executable=prefix_ok,
                failed_check=verdict.check,
                cause=verdict.cause,
                detail=verdict.detail,
                decided_by=verdict.outcome.decided_by if verdict.outcome else None,
                output_match=_output_match(env, event, verdict),
            )
        )
    return RolloutResult(rollout, steps)


def _check(env: Environment, state: Any, call: Call, depth: int, history: History) -> _Verdict:
    # S: the tool is known and available, the arguments parse and fit the schema.
    info = env.tool(call.tool)
    if info is None and not env.open_catalogue():
        return _Verdict(False, "S", "schema", f"unknown tool {call.tool!r}")
    if not env.available(state, call.tool, call.turn):
        return _Verdict(False, "S", "schema", f"tool {call.tool!r} is not available at turn {call.turn}")
    args = call.arguments
    if args is None:
        return _uncaptured(env, state, call)
    if isinstance(args, str):
        try:
            args = orjson.loads(args) if args.strip() else {}
        except orjson.JSONDecodeError as exc:
            return _Verdict(False, "S", "schema", f"arguments do not parse as JSON: {exc}")
    if not isinstance(args, dict):
        return _Verdict(False, "S", "schema", f"arguments must be an object, got {type(args).__name__}")

    args, ref_failures, ref_holders = resolve_references(args, history, depth)
    if info is not None:
        failed = _schema_failure(info, args, ref_failures, ref_holders)
        if failed:
            return failed
    # D: explicit references resolve, grounded values occur in what the agent could know.
    if ref_failures:
        return _Verdict(False, "D", "dependency", "; ".join(ref_failures.values()))
    if info is not None:
        for path in info.grounded:
            if path.split(".")[0].removesuffix("[]") in ref_holders:
                continue  # a resolved reference is grounded by construction
            for value in grounded_values(args, path):
                if not history.knows(value):
                    detail = f"{path}={value!r} occurs in no earlier output or message"
                    return _Verdict(False, "D", "information", detail)
    # P: the environment accepts the call in the current state.
    outcome = env.execute(state, call.tool, args, call)
    if not outcome.accepted:
        return _Verdict(False, "P", None, outcome.message, outcome, args)
    return _Verdict(True, outcome=outcome, args=args)


def _uncaptured(env: Environment, state: Any, call: Call) -> _Verdict:
    """The log did not capture the arguments (`arguments: null`): S and D are unknown, never passed or failed.

    Only an environment that reads outcomes from the log can decide P without them; a simulator cannot run
    the call, which is reported as a schema failure that says so rather than guessed either way.
    """
    if env.simulated:
        return _Verdict(False, "S", "schema", f"{UNCAPTURED}: a simulator cannot replay the call")
    outcome = env.execute(state, call.tool, None, call)
    if not outcome.accepted:
        return _Verdict(False, "P", None, f"{outcome.message} ({UNCAPTURED})", outcome)
    return _Verdict(True, detail=UNCAPTURED, outcome=outcome)


def _schema_failure(
    info: ToolInfo, args: dict[str, Any], ref_failures: dict[str, str], ref_holders: set[str]
) -> _Verdict | None:
    # An unresolved reference stands for a value of the right type, so S judges the rest of the call.
    probe = {k: (_stand_in(info, k) if k in ref_failures else v) for k, v in args.items()}
    try:
        info.validate(probe)
    except fastjsonschema.JsonSchemaValueException as exc:
        key = exc.path[1] if len(exc.path) > 1 else None
        if key in ref_holders and key not in ref_failures:
            return _Verdict(False, "D", "dependency", f"referenced value for {key!r} does not fit: {exc.message}")
        return _Verdict(False, "S", "schema", exc.message)
    return None


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
) -> bool:
    """Would `call` have been accepted in an earlier state of this rollout (s_0 … s_{t-2})?

    Walks back through the marks, then rebuilds the current state by replaying the accepted calls.
    """
    found = False
    for mark in reversed(marks[:-1]):
        env.rollback(state, mark)
        if env.execute(state, call.tool, args, call).accepted:
            found = True
            break
    env.rollback(state, marks[0])
    del marks[1:]
    for earlier, earlier_args in accepted:
        if not env.execute(state, earlier.tool, earlier_args, earlier).accepted:
            raise ReplayError(f"{env.name}: {earlier.tool} was accepted once and rejected on a second replay")
        marks.append(env.checkpoint(state))
    return found


def _output_match(env: Environment, call: Call, verdict: _Verdict) -> bool | None:
    if call.output is NOT_LOGGED or not env.simulated:
        return None
    if verdict.valid:
        return _same(verdict.outcome.output if verdict.outcome else None, call.output)
    if verdict.outcome is not None and verdict.outcome.output is not None:  # the simulator's own error output
        return _same(verdict.outcome.output, call.output)
    if call.error is not None:
        return bool(call.error)
    return _same(verdict.detail, call.output)


def _same(replayed: Any, logged: Any) -> bool:
    return _normal(replayed) == _normal(logged)


def _normal(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return orjson.loads(value)
        except orjson.JSONDecodeError:
            return value.strip()
    return value
