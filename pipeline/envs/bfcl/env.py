"""The BFCL multi-turn environment over the official simulator classes of `bfcl-eval`.

Calls run by direct method dispatch (`getattr(instance, tool)(**args)`), never through eval. A call is
rejected (P) when the method returns an error (`{"error": ...}`, or a one-element list of one) or raises;
the message is kept.

State: one instance per involved class, built as BFCL does (`cls()`, then `_load_scenario(copy of config,
long_context=...)`; a scenario loaded before is copied instead, see `scenarios`), plus a journal of the
accepted calls. A rejected call leaves no state change behind:
some rejections mutate the instance (a wrong travel token decrements `token_expires_in`, seeded random
generators advance), so the touched instance is rebuilt from its scenario by re-running the journal's
accepted calls of that class. Rejections are rarer than acceptances and per-class journals are short, so
this costs less than snapshotting the instance before every call (a deep copy of a long-context file
system, or even pickling a seeded random generator, costs more than the call itself). `checkpoint` is the
journal length; `rollback` marks stale only the classes that the undone calls touched. A stale instance is
rebuilt when it is next used, so the state-consistency walk-back, which rolls back once per earlier state,
rebuilds only the class of the call it re-tests.
"""

from __future__ import annotations

import inspect
import json
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from pipeline.core.effects import FILE, load_effects
from pipeline.core.errors import EnvError, InvalidRecord
from pipeline.core.model import Call, Rollout
from pipeline.core.values import ATOMS, NotExact, json_copy
from pipeline.envs.base import Outcome, ToolInfo, captured, with_effects
from pipeline.envs.bfcl import official as official
from pipeline.envs.bfcl._scenarios import Scenario, Scenarios, deep_copy
from pipeline.envs.bfcl._schema import parameters_schema
from pipeline.envs.data import BUILTIN_SPECS, files_fingerprint

GROUNDED_FILE = BUILTIN_SPECS / "bfcl_v3" / "grounded.toml"


JournalEntry = tuple[str, str, dict[str, Any]]  # an accepted call: (class, tool, arguments)


class Rejection(NamedTuple):
    """A rejected call, with its class's journal when it was rejected (`BfclEnvironment.execute` reuses it)."""

    tool: str
    args: dict[str, Any]
    entries: list[JournalEntry]
    outcome: Outcome


@dataclass(slots=True)
class BfclState:
    config: dict[str, Any]  # BFCL initial_config: class -> scenario
    long_context: bool
    withheld: dict[str, int]  # tool -> the turn from which it is available (miss_func)
    classes: frozenset[str]
    scenarios: dict[str, Scenario] = field(default_factory=dict)  # class -> its initial state
    known: list[str] = field(default_factory=list)  # the initial state's texts (BfclEnvironment.knowledge)
    instances: dict[str, Any] = field(default_factory=dict)  # read through BfclEnvironment.instance
    journal: list[JournalEntry] = field(default_factory=list)  # the accepted calls
    stale: set[str] = field(default_factory=set)  # classes whose instance differs from scenario + journal
    rejected: Rejection | None = None  # the last rejection


class BfclEnvironment:
    simulated = True

    def __init__(self, name: str, grounded_file: Path = GROUNDED_FILE) -> None:
        self.name = name
        self._release = official.release(name.removeprefix("bfcl_"))
        self._scenarios = Scenarios()
        effects_file = grounded_file.with_name(FILE)
        self.version = (
            f"{self._release.pin}+{files_fingerprint(grounded_file, *[effects_file] * effects_file.is_file())}"
        )
        self._class_of: dict[str, str] = {}
        self._tools: dict[str, ToolInfo] = {}
        self._order: dict[str, tuple[str, ...]] = {}
        # One grounded file serves both releases: a function that this release lacks is skipped
        # (v3 has no get_booking_history); tests check every entry names a function of some release.
        grounded = _read_grounded(grounded_file)
        for cls, docs in self._release.function_docs.items():
            simulator = self._release.simulator_class(cls)
            for doc in docs:
                tool = doc["name"]
                method = getattr(simulator, tool, None)
                if method is None:
                    raise EnvError(f"{self.version}: {cls} documents {tool!r} but has no such method")
                signature = inspect.signature(method)
                params = [p for p in signature.parameters.values() if p.name != "self"]
                open_keys = any(p.kind is p.VAR_KEYWORD for p in params)
                nullable = frozenset(p.name for p in params if p.default is None)
                schema = parameters_schema(doc["parameters"], open_keys, nullable)
                unknown = set(grounded.get(tool, ())) - set(schema["properties"])
                if unknown:
                    raise EnvError(f"{grounded_file}: {tool} has no parameters {sorted(unknown)}")
                self._class_of[tool] = cls
                self._order[tool] = tuple(
                    p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.POSITIONAL_ONLY)
                )
                self._tools[tool] = ToolInfo.from_schema(tool, schema, frozenset(grounded.get(tool, ())))
        # One effects file serves both releases too (specs/bfcl_v3/effects.toml, written by hand).
        declared = load_effects(grounded_file.parent)
        self._tools = with_effects(self._tools, {t: e for t, e in declared.items() if t in self._tools}, self.name)

    # -- catalogue -------------------------------------------------------------------------------------
    def tool(self, name: str) -> ToolInfo | None:
        return self._tools.get(name)

    def open_catalogue(self) -> bool:
        return False

    def parameter_order(self, tool: str) -> tuple[str, ...] | None:
        """Positional parameter names of a function (for call strings with positional arguments)."""
        return self._order.get(tool)

    def class_of(self, tool: str) -> str | None:
        return self._class_of.get(tool)

    # -- state -----------------------------------------------------------------------------------------
    def knowledge(self, state: BfclState) -> list[Any]:
        # BFCL's ground truth uses ids of the scenario's initial configuration that the conversation never
        # states ('USR002' for "Bob", order 12446 for "my most recent order"): BFCL treats them as known. The
        # configuration is the loaded one (initial_config over each class's defaults), as text.
        return state.known

    def start(self, rollout: Rollout) -> BfclState:
        env = rollout.env
        classes = env.get("involved_classes")
        config = env.get("initial_config") or {}
        if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
            raise InvalidRecord("bfcl: env.involved_classes must be a list of class names")
        unknown = [c for c in classes if c not in official.CLASSES]
        if unknown:
            raise InvalidRecord(f"bfcl: unknown simulator classes {unknown}")
        if not isinstance(config, dict):
            raise InvalidRecord("bfcl: env.initial_config must be an object")
        state = BfclState(
            config=config,
            long_context=bool(env.get("long_context", False)),
            withheld=_withheld(env.get("missed_function") or {}),
            classes=frozenset(classes),
        )
        for cls in dict.fromkeys(classes):
            simulator, stateless = self._release.simulator_class(cls), cls in official.STATELESS
            scenario, instance = self._scenarios.start(simulator, config.get(cls, {}), state.long_context, stateless)
            state.scenarios[cls], state.instances[cls] = scenario, instance
            text = scenario.knowledge(instance)
            if text is not None:
                state.known.append(text)
        return state

    def available(self, state: BfclState, tool: str, turn: int) -> bool:
        if self._class_of.get(tool) not in state.classes:
            return False
        return turn >= state.withheld.get(tool, turn)

    def execute(self, state: BfclState, tool: str, args: dict[str, Any] | None, call: Call) -> Outcome:
        args = captured(args, tool)
        cls = self._class_of[tool]
        # An instance's state is its scenario plus its class's accepted calls, so a call rejected in that state
        # is rejected again: the walk-back re-tests a call in every earlier state and most of them differ only
        # in other classes. The same arguments object and the same journal entries (by identity) are required.
        last = state.rejected
        if (
            last is not None
            and last.tool == tool
            and last.args is args
            and _same_entries(last.entries, _of(state, cls))
        ):
            return last.outcome
        outcome = _run(self.instance(state, cls), tool, args)
        if outcome.accepted:
            state.journal.append((cls, tool, args))
            state.rejected = None
        else:
            state.stale.add(cls)
            state.rejected = Rejection(tool, args, _of(state, cls), outcome)
        return outcome

    def checkpoint(self, state: BfclState) -> int:
        return len(state.journal)

    def rollback(self, state: BfclState, mark: int) -> None:
        state.stale.update(cls for cls, _, _ in state.journal[mark:])
        del state.journal[mark:]

    def instance(self, state: BfclState, cls: str) -> Any:
        """The simulator instance of `cls` in the current state (rebuilt first if it is stale)."""
        if cls in state.stale:
            instance = state.scenarios[cls].instance()
            for journaled, tool, args in state.journal:
                if journaled == cls and error_of(instance, tool, args) is not None:
                    raise EnvError(f"{self.name}: {tool} was accepted once and rejected when rebuilding the state")
            state.instances[cls] = instance
            state.stale.discard(cls)
        return state.instances[cls]


def _run(instance: Any, tool: str, args: dict[str, Any]) -> Outcome:
    """Both BFCL error conventions reject: a returned `{"error": ...}` and a raised exception (BFCL's own path
    reports `Error during execution: ...`). A rejection keeps what the simulator returned, as BFCL logs it,
    so that replay fidelity compares error outputs too."""
    try:
        result = getattr(instance, tool)(**_given(args))
    except Exception as exc:  # the simulator refuses the call; anything it raises is its answer
        return Outcome(False, output=f"Error during execution: {exc}", message=f"Error during execution: {exc}")
    message = error_message(result)
    return Outcome(message is None, output=_as_logged(result), message=message)


def error_of(instance: Any, tool: str, args: dict[str, Any]) -> str | None:
    """`_run`'s rejection message alone, without building the output (for rebuilding a state)."""
    try:
        return error_message(getattr(instance, tool)(**_given(args)))
    except Exception as exc:  # as in _run
        return f"Error during execution: {exc}"


def _given(args: dict[str, Any]) -> dict[str, Any]:
    """The arguments a simulator is given: a copy, since it may keep or change them and the journal keeps
    them for rebuilding a state; arguments that are all immutable need none (`**` makes a mapping of its own)."""
    for value in args.values():
        if type(value) not in ATOMS:
            copied: dict[str, Any] = deep_copy(args)
            return copied
    return args


def _of(state: BfclState, cls: str) -> list[JournalEntry]:
    return [entry for entry in state.journal if entry[0] == cls]


def _same_entries(a: list[JournalEntry], b: list[JournalEntry]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def error_message(result: Any) -> str | None:
    """The simulator's rejection message, if `result` is one: `{"error": ...}`, or (ticket and trading
    listings) a one-element list holding such a dict or an "Error: ..." string."""
    if isinstance(result, list) and len(result) == 1:
        result = result[0]
        if isinstance(result, str) and result.startswith("Error:"):
            return result
    if isinstance(result, dict) and "error" in result:
        return str(result["error"])
    return None


def _as_logged(result: Any) -> Any:
    # BFCL logs dicts as JSON text and everything else through str(); keep the JSON form as an object so
    # that references and grounding can look inside it, and never alias the live state.
    if isinstance(result, str):
        return result
    if isinstance(result, dict):
        try:
            return json_copy(result)
        except NotExact:  # e.g. mpmath numbers: the standard library decides, as BFCL logs them
            pass
        try:
            return json.loads(json.dumps(result))
        except (TypeError, ValueError):
            return str(result)
    return str(result)


def _withheld(missed: Any) -> dict[str, int]:
    if not isinstance(missed, dict):
        raise InvalidRecord("bfcl: env.missed_function must map a turn to function names")
    out: dict[str, int] = {}
    for turn, names in missed.items():
        if not str(turn).isdigit() or not isinstance(names, list):
            raise InvalidRecord("bfcl: env.missed_function must map a turn to function names")
        for name in names:
            # BFCL's own loader may have replaced names by docs; accept both.
            out[name["name"] if isinstance(name, dict) else str(name)] = int(turn)
    return out


def _read_grounded(path: Path) -> dict[str, list[str]]:
    try:
        data = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise EnvError(f"{path}: {exc}") from exc
    table: dict[str, list[str]] = data.get("grounded", {})
    if set(data) - {"grounded"} or not all(isinstance(v, list) for v in table.values()):
        raise EnvError(f"{path}: expected one [grounded] table of function = [parameter, ...]")
    return table
