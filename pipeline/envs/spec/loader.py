"""The spec family's data: loading and validating a `specs/<name>/` folder, and finding one by name.

A spec folder holds `spec.toml` (tools' grounded parameters, preconditions, effects, outputs),
`tools.json` (the tools' JSON Schemas, OpenAI `tools` format accepted as is) and `initial_state.json`.
Every error names the file and the place in it, and is raised before any scoring starts.
"""

from __future__ import annotations

import os
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pipeline.core import effects as effect_classes
from pipeline.core.errors import EnvError, SpecError, check_fields, read_json_file
from pipeline.envs._rules import (
    Effect,
    Precondition,
    compile_effects,
    compile_field,
    compile_lets,
    compile_preconditions,
)
from pipeline.envs.base import ToolInfo, with_effects
from pipeline.envs.data import BUILTIN_SPECS, files_fingerprint
from pipeline.expr import Expr

SPEC_FILE = "spec.toml"
SPEC_PATH_ENV = "PEXEC_SPEC_PATH"

_TOP_KEYS = {"name", "version", "description", "tools", "initial_state", "tool"}
_TOOL_KEYS = {"grounded", "preconditions", "observed", "let", "effects", "returns", "description"}
# `observed` rules read what the agent saw (`seen`), for logs scored by the `observed` environment.
OBSERVED_NAMES = frozenset({"args", "seen"})


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


def load_tools_json(path: Path) -> dict[str, dict[str, Any]]:
    """Tool name -> JSON Schema of its parameters, from an OpenAI `tools` list (or bare function objects)."""
    items = read_json_file(path, list, "tools", SpecError)
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
    check_fields(raw, _TOP_KEYS, f"{spec_path}", SpecError)
    for key in ("name", "version"):
        if not isinstance(raw.get(key), str):
            raise SpecError(f"{spec_path}: '{key}' (a string) is required")

    tools_path = folder / raw.get("tools", "tools.json")
    schemas = load_tools_json(tools_path)
    state_path = folder / raw.get("initial_state", "initial_state.json")
    initial_state = read_json_file(state_path, dict, "the initial state", SpecError)

    tables = raw.get("tool", {})
    for name in tables:
        if name not in schemas:
            raise SpecError(f"{spec_path}: [tool.{name}] has no schema in {tools_path.name}")
    tools = {
        name: tool_rules(name, params, tables.get(name, {}), f"{spec_path}: [tool.{name}]")
        for name, params in schemas.items()
    }
    declared = with_effects({n: r.info for n, r in tools.items()}, effect_classes.load_effects(folder), str(folder))
    tools = {n: replace(r, info=declared[n]) for n, r in tools.items()}
    effects_path = folder / effect_classes.FILE
    return Spec(
        name=raw["name"],
        version=raw["version"],
        description=raw.get("description", ""),
        folder=str(folder),
        fingerprint=files_fingerprint(spec_path, tools_path, state_path, *[effects_path] * effects_path.is_file()),
        tools=tools,
        initial_state=initial_state,
    )


def tool_rules(name: str, params: dict[str, Any], table: dict[str, Any], where: str) -> ToolRules:
    check_fields(table, _TOOL_KEYS, where, SpecError)
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
    effects = compile_effects(table.get("effects", []), names, f"{where} effects")
    returns = compile_field(table["returns"], names, f"{where} returns") if "returns" in table else None
    try:
        info = ToolInfo.from_schema(name, params, frozenset(grounded))
    except EnvError as exc:
        raise SpecError(f"{where}: {exc}") from exc
    return ToolRules(info, pres, lets, effects, returns, observed)
