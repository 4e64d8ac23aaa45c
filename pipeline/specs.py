"""Environment specs as data: loading and validating a `specs/<name>/` folder.

A spec folder holds `spec.toml` (tools' grounded parameters, preconditions, effects, outputs),
`tools.json` (the tools' JSON Schemas, OpenAI `tools` format accepted as is) and `initial_state.json`.
Every error names the file and the place in it, and is raised before any scoring starts.
"""

from __future__ import annotations

import hashlib
import os
import re
import tomllib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from pipeline.envs.base import EnvError, ToolInfo
from pipeline.errors import PexecError
from pipeline.expr import EvalError, Expr, ExprError, Target, compile_expr, compile_target, render

SPEC_FILE = "spec.toml"
SPEC_PATH_ENV = "PEXEC_SPEC_PATH"
BUILTIN_SPECS = Path(__file__).resolve().parent.parent / "specs"

_TOP_KEYS = {"name", "version", "description", "tools", "initial_state", "tool"}
_TOOL_KEYS = {"grounded", "preconditions", "observed", "let", "effects", "returns", "description"}
# `observed` rules read what the agent saw (`seen`), for logs scored by the `observed` environment.
OBSERVED_NAMES = frozenset({"args", "seen"})
_PRE_KEYS = {"require", "error", "clause"}
_EFFECT_OPS = ("set", "append", "delete")
_FOR = re.compile(r"^\s*([A-Za-z_]\w*)\s+in\s+(.+)$", re.S)


class SpecError(PexecError, ValueError):
    """A spec that cannot be used; the message names the file and the place."""


@dataclass(frozen=True)
class Precondition:
    require: Expr
    error: Expr  # renders the rejection message
    clause: str | None = None  # where the rule comes from (e.g. a policy clause)


@dataclass(frozen=True)
class Effect:
    op: str  # set | append | delete
    target: Target
    value: Expr | None
    each: tuple[str, Expr] | None = None  # `for = "item in args.items"`: apply once per element


@dataclass(frozen=True)
class ToolRules:
    info: ToolInfo  # schema (compiled once) and grounded parameters
    preconditions: tuple[Precondition, ...] = ()
    let: tuple[tuple[str, Expr], ...] = ()
    effects: tuple[Effect, ...] = ()
    returns: Expr | None = None
    observed: tuple[Precondition, ...] = ()  # evaluated only by the `observed` environment


@dataclass(frozen=True)
class Spec:
    name: str
    version: str
    description: str
    folder: str
    fingerprint: str  # hash of the spec files: a changed spec is a new version
    tools: dict[str, ToolRules] = field(default_factory=dict)
    initial_state: dict[str, Any] = field(default_factory=dict)


def find_spec(name: str, extra_dirs: tuple[str, ...] = ()) -> Path | None:
    """The folder of spec `name` (or `name` itself when it is a spec folder), searched in order:
    `extra_dirs`, $PEXEC_SPEC_PATH (os.pathsep-separated), the project's `specs/`."""
    direct = Path(name)
    if (direct / SPEC_FILE).is_file():
        return direct
    for base in spec_search_path(extra_dirs):
        candidate = base / name
        if (candidate / SPEC_FILE).is_file():
            return candidate
    return None


def spec_search_path(extra_dirs: Sequence[str] = ()) -> list[Path]:
    env_dirs = [d for d in os.environ.get(SPEC_PATH_ENV, "").split(os.pathsep) if d]
    return [Path(d) for d in (*extra_dirs, *env_dirs)] + [BUILTIN_SPECS]


def spec_folders(extra_dirs: Sequence[str] = ()) -> dict[str, Path]:
    """Every spec on the search path by name; the first folder of a name wins, as in find_spec."""
    found: dict[str, Path] = {}
    for base in spec_search_path(extra_dirs):
        for spec_file in sorted(base.glob(f"*/{SPEC_FILE}")):
            found.setdefault(spec_file.parent.name, spec_file.parent)
    return found


def files_fingerprint(*paths: Path) -> str:
    """A short hash of the files' bytes, in order: part of an environment's version, so that editing its
    data files makes earlier scored shards stale."""
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def simulator_pins(wheels: bool = False) -> dict[str, str]:
    """Package -> pinned version of the official simulators: `specs/simulators.txt` (installed), or with
    `wheels` `specs/simulator-wheels.txt` (releases read from their wheel). The Makefile installs from them."""
    path = BUILTIN_SPECS / ("simulator-wheels.txt" if wheels else "simulators.txt")
    pins = {}
    for line in path.read_text().splitlines():
        requirement = line.split("#", 1)[0].strip()
        if requirement:
            package, _, pinned = requirement.partition("==")
            pins[package.strip()] = pinned.strip()
    return pins


def load_tools_json(path: Path) -> dict[str, dict[str, Any]]:
    """Tool name -> JSON Schema of its parameters, from an OpenAI `tools` list (or bare function objects)."""
    try:
        items = orjson.loads(path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise SpecError(f"{path}: cannot read tools: {exc}") from exc
    if not isinstance(items, list):
        raise SpecError(f"{path}: expected a JSON list of tools")
    tools: dict[str, dict[str, Any]] = {}
    for i, item in enumerate(items):
        fn = item.get("function", item) if isinstance(item, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise SpecError(f"{path}: tool #{i}: expected {{'type': 'function', 'function': {{'name', ...}}}}")
        params = fn.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(params, dict):
            raise SpecError(f"{path}: tool {fn['name']!r}: 'parameters' must be a JSON Schema object")
        if fn["name"] in tools:
            raise SpecError(f"{path}: tool {fn['name']!r} is defined twice")
        tools[fn["name"]] = params
    return tools


def load_spec(folder: str | Path) -> Spec:
    folder = Path(folder)
    spec_path = folder / SPEC_FILE
    try:
        raw = tomllib.loads(spec_path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SpecError(f"{spec_path}: {exc}") from exc
    check_fields(raw, _TOP_KEYS, f"{spec_path}")
    for key in ("name", "version"):
        if not isinstance(raw.get(key), str):
            raise SpecError(f"{spec_path}: '{key}' (a string) is required")

    tools_path = folder / raw.get("tools", "tools.json")
    schemas = load_tools_json(tools_path)
    state_path = folder / raw.get("initial_state", "initial_state.json")
    try:
        initial_state = orjson.loads(state_path.read_bytes())
    except (OSError, orjson.JSONDecodeError) as exc:
        raise SpecError(f"{state_path}: cannot read the initial state: {exc}") from exc
    if not isinstance(initial_state, dict):
        raise SpecError(f"{state_path}: the initial state must be a JSON object")

    tables = raw.get("tool", {})
    for name in tables:
        if name not in schemas:
            raise SpecError(f"{spec_path}: [tool.{name}] has no schema in {tools_path.name}")
    tools = {
        name: tool_rules(name, params, tables.get(name, {}), f"{spec_path}: [tool.{name}]")
        for name, params in schemas.items()
    }
    return Spec(
        name=raw["name"],
        version=raw["version"],
        description=raw.get("description", ""),
        folder=str(folder),
        fingerprint=files_fingerprint(spec_path, tools_path, state_path),
        tools=tools,
        initial_state=initial_state,
    )


def tool_rules(name: str, params: dict[str, Any], table: dict[str, Any], where: str) -> ToolRules:
    check_fields(table, _TOOL_KEYS, where)
    grounded = table.get("grounded", [])
    if not isinstance(grounded, list) or not all(isinstance(g, str) for g in grounded):
        raise SpecError(f"{where}: 'grounded' must be a list of parameter paths")
    props = params.get("properties", {})
    for path in grounded:
        if path.split(".")[0].removesuffix("[]") not in props:
            raise SpecError(f"{where}: grounded parameter {path!r} is not a parameter of the tool")

    names = {"args", "state"}
    pres = compile_preconditions(table.get("preconditions", []), names, f"{where} preconditions")
    observed = compile_preconditions(table.get("observed", []), set(OBSERVED_NAMES), f"{where} observed")
    lets, names = compile_lets(table.get("let"), names, f"{where} let")

    effects = []
    for i, eff in enumerate(table.get("effects", [])):
        at = f"{where} effects[{i}]"
        ops = [op for op in _EFFECT_OPS if op in eff]
        if len(ops) != 1:
            raise SpecError(f"{at}: exactly one of {', '.join(_EFFECT_OPS)} is required")
        op = ops[0]
        check_fields(eff, {op, "value", "for"} if op != "delete" else {op, "for"}, at)
        if op != "delete" and "value" not in eff:
            raise SpecError(f"{at}: '{op}' needs a 'value'")
        each, scope = None, names
        if "for" in eff:
            loop = _FOR.match(str(eff["for"]))
            if not loop or loop.group(1) in names:
                raise SpecError(f"{at}: 'for' must read '<new name> in <expression>', got {eff['for']!r}")
            each = (loop.group(1), compile_field(loop.group(2), names, f"{at} for"))
            scope = names | {loop.group(1)}
        try:
            target = compile_target(eff[op], scope)
        except ExprError as exc:
            raise SpecError(f"{at}: {exc}") from exc
        if target.root != "state":
            raise SpecError(f"{at}: effects may only change the state (target rooted at {target.root!r})")
        value = compile_field(eff["value"], scope, at) if op != "delete" else None
        effects.append(Effect(op, target, value, each))

    returns = compile_field(table["returns"], names, f"{where} returns") if "returns" in table else None
    try:
        info = ToolInfo.from_schema(name, params, frozenset(grounded))
    except EnvError as exc:
        raise SpecError(f"{where}: {exc}") from exc
    return ToolRules(info, pres, tuple(lets), tuple(effects), returns, observed)


@dataclass(frozen=True)
class RuleCheck:
    """The outcome of a tool's rules on one call."""

    violated: Precondition | None = None  # the first rule that does not hold
    message: str | None = None  # its rendered error
    evaluated: bool = False  # whether any rule could be evaluated at all


def check_rules(rules: Sequence[Precondition], ctx: dict[str, Any], unknown_violates: bool) -> RuleCheck:
    """Evaluate rules in order and stop at the first that does not hold.

    A rule that cannot be evaluated (a missing key, a type error) violates when `unknown_violates` — a
    simulator's own preconditions — and is skipped otherwise: an overlay or an observation-based rule
    without the evidence it needs says nothing.
    """
    evaluated = False
    for rule in rules:
        try:
            holds = rule.require(ctx)
        except EvalError as exc:
            if unknown_violates:
                return RuleCheck(rule, f"{_render(rule, ctx)} ({exc})", True)
            continue
        evaluated = True
        if not holds:
            return RuleCheck(rule, _render(rule, ctx), True)
    return RuleCheck(evaluated=evaluated)


def _render(rule: Precondition, ctx: dict[str, Any]) -> str:
    try:
        return rule.error(ctx)
    except EvalError:  # the message reads something the context lacks: fall back to the rule itself
        return f"precondition failed: {rule.require.source}"


def compile_lets(table: Any, names: set[str], where: str) -> tuple[tuple[tuple[str, Expr], ...], set[str]]:
    """Named values (`let = {name = "expr"}`), each seeing the ones before it; returns them and the names."""
    lets = []
    for var, source in (table or {}).items():
        if var in names:
            raise SpecError(f"{where}.{var}: the name is already taken")
        lets.append((var, compile_field(source, names, f"{where}.{var}")))
        names = names | {var}
    return tuple(lets), names


def compile_preconditions(
    items: Any, names: set[str], where: str, clause_required: bool = False
) -> tuple[Precondition, ...]:
    if not isinstance(items, list):
        raise SpecError(f"{where}: expected a list of {{require, error, clause}} tables")
    pres = []
    for i, pre in enumerate(items):
        at = f"{where}[{i}]"
        check_fields(pre, _PRE_KEYS, at)
        if "require" not in pre:
            raise SpecError(f"{at}: 'require' is required")
        if clause_required and not isinstance(pre.get("clause"), str):
            raise SpecError(f"{at}: every rule must cite its clause")
        message = pre.get("error", f"precondition failed: {pre['require']}")
        pres.append(
            Precondition(
                compile_field(pre["require"], names, at), compile_field(message, names, at, render), pre.get("clause")
            )
        )
    return tuple(pres)


def compile_field(source: Any, names: set[str], where: str, compiler: Callable[..., Expr] = compile_expr) -> Expr:
    """Compile one expression (or, with `compiler=render`, one message template) of a spec file."""
    if not isinstance(source, str):
        raise SpecError(f"{where}: expected a string, got {source!r}")
    try:
        return compiler(source, names)
    except ExprError as exc:
        raise SpecError(f"{where}: {exc}") from exc


def check_fields(table: Any, allowed: set[str], where: str, error: type[Exception] = SpecError) -> None:
    """Raise `error` naming `where` when `table` is not a table or has fields outside `allowed`."""
    if not isinstance(table, dict):
        raise error(f"{where}: expected a table, got {table!r}")
    unknown = sorted(set(table) - allowed)
    if unknown:
        raise error(f"{where}: unknown field(s) {', '.join(unknown)} (allowed: {', '.join(sorted(allowed))})")
