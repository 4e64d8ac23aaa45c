"""`observed`: for logs that come with no simulator.

S is checked against a spec's schemas when one is given (otherwise any well-formed call passes S), D as
usual, and P is decided by two sources, in this order:

1. the spec's `observed` rules of the tool (`[tool.X] observed = [{require, error, clause}]`), evaluated over
   `args` (the call's arguments) and `seen` (tool name -> the last output of an earlier accepted call of
   that tool in this rollout, JSON text decoded). A rule that cannot be evaluated — an input the agent has
   not observed yet, arguments the log did not capture — is skipped. The first false rule rejects the call
   (`decided_by = precondition`), even when the log shows no error: the declared rule is the stricter source;
2. the logged outcome: `error: true` rejects the call (`decided_by = log`).

An accepted call reports `decided_by = precondition` when at least one rule was evaluated (and held),
else `log`. Outputs are the logged ones, so downstream references and grounding see what the agent saw.

Schemas: a tool the spec declares is checked against the spec's schema. A rollout may carry the tool definitions
the model was given in `env.tools` (name -> JSON Schema: what the production-log adapters read from the log, and
what the guard's MCP proxy records of its upstream): they decide S for the tools the spec does not declare — the
one rule the live guard applies too. Where the definitions changed within the conversation, `env.tool_versions`
lists every distinct set in order of first use (`env.tools` is its first) and each call's `tools_version` names
the set in force at it. A rollout's tools close the catalogue at each call: a tool in neither the spec nor the
set in force is unknown. Each step records which schema decided (`schema_source`: spec, log, or none).
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

import orjson

from pipeline.core.errors import EnvError
from pipeline.core.model import NOT_LOGGED, Call, Rollout
from pipeline.envs._registry import EnvOptions
from pipeline.envs._rules import NO_RULES, Precondition, check_rules
from pipeline.envs.base import Outcome, ToolInfo
from pipeline.envs.spec.loader import find_spec, load_spec

Seen = dict[str, Any]  # tool name -> last output of an accepted call


# Said after a rule's refusal of a call the log shows succeeding; a check before the call runs (the guard's) drops it.
NO_ERROR_NOTE = " (the log shows no error)"


class ObservedEnvironment:
    name = "observed"
    simulated = False

    def __init__(
        self,
        tools: dict[str, ToolInfo] | None = None,
        spec_version: str = "",
        rules: dict[str, tuple[Precondition, ...]] | None = None,
    ) -> None:
        self._tools = tools
        self._rules = rules or {}
        self._rollout_tools: dict[str, ToolInfo] = {}  # the set in force at the current call (see the docstring)
        self._versions: list[dict[str, ToolInfo]] = []  # the current rollout's logged sets, by version
        self.version = f"observed+{spec_version}" if spec_version else "observed"

    def tool(self, name: str) -> ToolInfo | None:
        if self._tools is not None and name in self._tools:
            return self._tools[name]
        return self._rollout_tools.get(name)

    def open_catalogue(self) -> bool:
        return self._tools is None and not self._rollout_tools

    def schema_source(self, name: str) -> str | None:
        """Which schema decides S for `name` at the current call: "spec", "log" (the definitions the log recorded
        for it), or None (none: unknown, or an open catalogue)."""
        if self._tools is not None and name in self._tools:
            return "spec"
        return "log" if name in self._rollout_tools else None

    def select(self, call: Call) -> None:
        """Make the logged definitions in force at `call` the catalogue (a version the rollout lacks: none)."""
        version = call.tools_version
        self._rollout_tools = self._versions[version] if version < len(self._versions) else {}

    def knowledge(self, state: Any) -> list[Any]:
        return []  # the agent knows only the conversation and earlier outputs

    def start(self, rollout: Rollout) -> Seen:
        declared = rollout.env.get("tools")
        if declared is not None and not isinstance(declared, dict):
            raise EnvError("observed: env.tools must be an object of tool name -> JSON Schema")
        versions = rollout.env.get("tool_versions")
        if versions is None:
            versions = [declared] if declared else []
        elif not isinstance(versions, list) or not all(isinstance(v, dict) for v in versions):
            raise EnvError("observed: env.tool_versions must be a list of objects of tool name -> JSON Schema")
        self._versions = [
            {
                name: _tool_info(name, orjson.dumps(schema, option=orjson.OPT_SORT_KEYS))
                for name, schema in version.items()
                if self._tools is None or name not in self._tools
            }
            for version in versions
        ]
        self._rollout_tools = self._versions[0] if self._versions else {}
        return {}

    def available(self, state: Seen, tool: str, turn: int) -> bool:
        return True

    def execute(self, state: Seen, tool: str, args: dict[str, Any] | None, call: Call) -> Outcome:
        output = None if call.output is NOT_LOGGED else call.output
        rules = self._rules.get(tool)
        check = check_rules(rules, {"args": args, "seen": state}, unknown_violates=False) if rules else NO_RULES
        if check.violated:
            note = "" if call.error else NO_ERROR_NOTE
            return Outcome(False, message=f"{check.message}{note}", decided_by="precondition")
        if call.error:
            return Outcome(False, message=str(output) if output is not None else "logged error", decided_by="log")
        decoded = state[tool] = _decoded(output)
        if decoded is not output and isinstance(output, str) and output[:1] in ("{", "["):
            output = decoded  # JSON text of an object or list, which the grounding history would decode again
        # positional: keywords cost a frozen dataclass a third more, and this is every accepted call's
        return Outcome(True, output, None, "precondition" if check.evaluated else "log")

    def checkpoint(self, state: Seen) -> Seen:
        return dict(state)

    def rollback(self, state: Seen, mark: Seen) -> None:
        state.clear()
        state.update(mark)


@lru_cache(maxsize=1024)
def _tool_info(name: str, schema: bytes) -> ToolInfo:
    """A rollout-declared tool, compiled once per distinct schema (a store repeats the same few)."""
    parameters = orjson.loads(schema)
    if not isinstance(parameters, dict):
        raise EnvError(f"observed: env.tools[{name!r}] is not a JSON Schema object")
    return ToolInfo.from_schema(name, parameters, frozenset())


def _decoded(output: Any) -> Any:
    # Production tools usually return JSON text; rules read it as data.
    if isinstance(output, str):
        try:
            return orjson.loads(output)
        except orjson.JSONDecodeError:
            return output
    return output


def observed(options: EnvOptions) -> ObservedEnvironment:
    if options.spec is None:
        return ObservedEnvironment()
    folder = find_spec(options.spec, options.spec_dirs)
    if folder is None:
        raise EnvError(f"observed: no spec named {options.spec!r}")
    spec = load_spec(folder)
    return ObservedEnvironment(
        {n: r.info for n, r in spec.tools.items()},
        f"{spec.name}@{spec.version}+{spec.fingerprint}",
        {n: r.observed for n, r in spec.tools.items() if r.observed},
    )
