"""The declarative spec environment: tools, preconditions and effects from a `specs/<name>/` folder,
over a JSON document state.

One base document per worker process: each rollout starts by undoing the previous rollout's journal
instead of copying the document, so a reset costs as much as the changes the last rollout made.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import orjson

from pipeline.core.model import Call, Rollout
from pipeline.envs._rules import Effect, check_rules
from pipeline.envs.base import Outcome, ToolInfo, captured
from pipeline.envs.document import JournaledDoc
from pipeline.envs.spec.loader import Spec, load_spec
from pipeline.expr import EvalError, metered


def _fresh(value: Any) -> Any:
    # Values stored in the state or returned as outputs must not alias the log's arguments or the live state.
    return orjson.loads(orjson.dumps(value)) if isinstance(value, dict | list) else value


class SpecEnvironment:
    simulated = True

    def __init__(self, spec: Spec) -> None:
        self.spec = spec
        self.name = spec.name
        self.version = f"{spec.name}@{spec.version}+{spec.fingerprint}"
        self._state: JournaledDoc | None = None

    @classmethod
    def from_folder(cls, folder: str | Path) -> SpecEnvironment:
        return cls(load_spec(folder))

    def tool(self, name: str) -> ToolInfo | None:
        rules = self.spec.tools.get(name)
        return rules.info if rules else None

    def open_catalogue(self) -> bool:
        return False

    def knowledge(self, state: Any) -> list[Any]:
        return []  # the agent knows only the conversation and earlier outputs

    def start(self, rollout: Rollout) -> JournaledDoc:
        if self._state is None:
            self._state = JournaledDoc(copy.deepcopy(self.spec.initial_state))
        state = self._state
        state.rollback(0)
        # A task may replace top-level parts of the initial state (e.g. its own users or orders).
        for key, value in (rollout.env.get("state") or {}).items():
            state.set(state.doc, key, _fresh(value))
        return state

    def available(self, state: JournaledDoc, tool: str, turn: int) -> bool:
        return True

    def execute(self, state: JournaledDoc, tool: str, args: dict[str, Any] | None, call: Call) -> Outcome:
        rules = self.spec.tools[tool]
        ctx: dict[str, Any] = {"args": captured(args, tool), "state": state.doc}
        with metered():  # one evaluation budget for the whole call: rules, lets, effects, result
            check = check_rules(rules.preconditions, ctx, unknown_violates=True)
            if check.violated:
                return Outcome(False, message=check.message, decided_by="precondition")
            mark = len(state.journal)
            try:
                for var, expr in rules.let:
                    ctx[var] = expr(ctx)
                for effect in rules.effects:
                    _apply(state, effect, ctx)
                output = _fresh(rules.returns(ctx)) if rules.returns else None
            except EvalError as exc:
                state.rollback(mark)
                return Outcome(False, message=f"{tool} failed: {exc}", decided_by="simulator")
        return Outcome(True, output=output, decided_by="precondition")

    def checkpoint(self, state: JournaledDoc) -> int:
        return len(state.journal)

    def rollback(self, state: JournaledDoc, mark: int) -> None:
        state.rollback(mark)


def _apply(state: JournaledDoc, effect: Effect, ctx: dict[str, Any]) -> None:
    if effect.each is None:
        _apply_once(state, effect, ctx)
        return
    var, items = effect.each
    values = items(ctx)
    if not isinstance(values, list | dict):
        raise EvalError(f"'for' needs a list, got {type(values).__name__}")
    for item in list(values):
        _apply_once(state, effect, {**ctx, var: item})


def _apply_once(state: JournaledDoc, effect: Effect, ctx: dict[str, Any]) -> None:
    container, key = effect.target.locate(ctx)
    if effect.value is None:  # a delete, the one effect without a value
        state.delete(container, key)
        return
    value = _fresh(effect.value(ctx))
    if effect.op == "set":
        state.set(container, key, value)
        return
    try:
        target = container[key]
    except (KeyError, IndexError, TypeError) as exc:
        raise EvalError(f"cannot append: {effect.target.source} is missing") from exc
    if not isinstance(target, list):
        raise EvalError(f"cannot append: {effect.target.source} is not a list")
    state.set(target, len(target), value)
