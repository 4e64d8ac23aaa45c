"""The environment protocol every simulator implements, the tool catalogue it exposes, and the errors of
building one.

The checker (pipeline.replay.checker) only talks to this protocol, so adding a benchmark never touches it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol, runtime_checkable

import fastjsonschema

from pipeline.core.effects import Effect
from pipeline.core.errors import EffectsError, EnvError
from pipeline.core.model import Call, Rollout


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the environment said about one call."""

    accepted: bool
    output: Any = None  # the tool's output when accepted; for a rejection, what the simulator returned if any
    message: str | None = None  # the environment's own rejection message
    decided_by: str = "simulator"  # which source decided P: simulator | precondition | log


@dataclass(frozen=True)
class ToolInfo:
    """A tool's JSON Schema (compiled once) and its grounded parameters."""

    name: str
    parameters: Mapping[str, Any]
    grounded: frozenset[str] = frozenset()
    validate: Callable[[Any], Any] = field(repr=False, default=lambda args: args)
    effect: Effect | None = None  # read / write / irreversible and weight (pipeline.core.effects); None: undeclared

    @classmethod
    def from_schema(cls, name: str, parameters: Mapping[str, Any], grounded: frozenset[str]) -> ToolInfo:
        try:
            validate = fastjsonschema.compile(dict(parameters), use_default=False)
        except fastjsonschema.JsonSchemaDefinitionException as exc:
            raise EnvError(f"tool {name!r}: parameters are not a valid JSON Schema: {exc}") from exc
        return cls(name=name, parameters=parameters, grounded=grounded, validate=validate)


def with_effects(tools: Mapping[str, ToolInfo], effects: Mapping[str, Effect], where: str) -> dict[str, ToolInfo]:
    """The tool catalogue with each tool's declared effect; an effect for a tool the catalogue lacks is an error
    (a typo would leave the real tool unclassified)."""
    unknown = sorted(set(effects) - set(tools))
    if unknown:
        raise EffectsError(f"{where}: effects for tool(s) {', '.join(unknown)}, which the environment does not have")
    return {name: replace(info, effect=effects.get(name)) for name, info in tools.items()}


def captured(args: dict[str, Any] | None, tool: str) -> dict[str, Any]:
    """A simulator's arguments of a call. The checker never hands a simulator a call whose arguments the log did not
    capture (it rejects the call itself), so None here is a caller's bug: refused, never run with made-up ones."""
    if args is None:
        raise EnvError(f"{tool}: a simulator cannot run a call whose arguments were not captured")
    return args


@runtime_checkable
class Environment(Protocol):
    """A replayable environment: what the checker (pipeline.replay.checker) and the guard call, and nothing else.

    State objects are owned by the environment; the checker only passes them back. `execute` must leave the
    state unchanged when it rejects a call. `checkpoint`/`rollback` give cheap access to earlier states of
    the same rollout (an undo journal, a copy, whatever the environment does best). The plug-in is a factory
    `(EnvOptions) -> Environment` (pipeline.envs._registry); plain attributes satisfy the three properties.
    """

    @property
    def name(self) -> str:
        """The name it is resolved by (a rollout's `benchmark`, `--env`); a factory must build an environment of
        the name it is registered under."""

    @property
    def version(self) -> str:
        """Recorded in every shard marker and in the manifest: the spec's version, the simulator package's, a hash
        of its data files. Change it when behaviour changes: a shard scored under another version is rescored."""

    @property
    def simulated(self) -> bool:
        """False when outputs are read from the log rather than produced by a simulator (`observed`)."""

    def tool(self, name: str) -> ToolInfo | None:
        """The tool's catalogue entry; None if the environment does not know it."""

    def open_catalogue(self) -> bool:
        """True when the environment has no catalogue (any well-formed call is a known tool)."""

    def start(self, rollout: Rollout) -> Any:
        """The initial state s_0 for this rollout."""

    def knowledge(self, state: Any) -> list[Any]:
        """What the agent may know besides the conversation, given s_0 (docs/explanation/data-model.md, "Grounding
        sources"): values a grounded argument may come from, e.g. BFCL's scenario configuration. Empty for most."""

    def available(self, state: Any, tool: str, turn: int) -> bool:
        """Whether a known tool may be called at this point (e.g. withheld until a later turn)."""

    def execute(self, state: Any, tool: str, args: dict[str, Any] | None, call: Call) -> Outcome:
        """Run the call in `state` (mutating it only when accepted).

        `args` is None only when the log did not capture them, and only for environments with
        `simulated = False` (the checker rejects such calls itself for a simulator).
        """

    def checkpoint(self, state: Any) -> Any:
        """A mark of the current state to come back to."""

    def rollback(self, state: Any, mark: Any) -> None:
        """Return `state` to an earlier mark of the same rollout."""


@runtime_checkable
class CallCatalogue(Protocol):
    """An environment whose catalogue can change from call to call (`observed`: the tool definitions the log
    recorded at each call). The checker selects the call's catalogue before it asks `tool` about it."""

    def select(self, call: Call) -> None:
        """Make the catalogue in force at `call` the one `tool`, `open_catalogue` and `schema_source` answer from."""

    def schema_source(self, name: str) -> str | None:
        """Which schema decides S for `name`: "spec", "log", or None (none)."""
