"""The `toolsandbox` environment: ToolSandbox's five tables as a journaled JSON document.

State document: `setting` (one row), `contact`, `reminder` and `messaging` (lists of rows in upstream's table
order: a modified row is deleted and appended, as upstream's remove + add does, and searches list rows in
that order; upstream's seed has two messages with the same id), `clock.now` (the scenario's "now", from the
rollout's `env`) and the created-id maps `ids` (logged id -> replay id) and `shown` (replay id -> logged id).
Rules live in specs/toolsandbox/rules.toml; tool bodies below only do what rules cannot say.

Before the rules, two checks upstream makes first: its `typechecked` decorator (a float where an integer is
expected is a TypeError; JSON Schema counts 13.0 as an integer, so the schema check lets it through) and
libphonenumber's parse of every phone-number argument.

Id mapping: replay creates ids deterministically (uuid5 of the rollout id and a counter). When the call
carries the id the live run logged, the pair is recorded: later arguments are mapped logged -> replay
before checking, outputs replay -> logged, so grounding and output comparison see the ids of the log.
"""

from __future__ import annotations

import tomllib
import uuid
from collections.abc import Callable, Mapping
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import orjson

from pipeline.core.effects import FILE, load_effects
from pipeline.core.errors import EnvError, SpecError
from pipeline.core.model import NOT_LOGGED, Call, Rollout
from pipeline.envs._rules import Precondition, check_rules, compile_field
from pipeline.envs.base import Outcome, ToolInfo, captured, with_effects
from pipeline.envs.data import BUILTIN_SPECS, files_fingerprint
from pipeline.envs.document import JournaledDoc
from pipeline.envs.spec.loader import load_tools_json, tool_rules
from pipeline.envs.toolsandbox import _utilities as u
from pipeline.envs.toolsandbox._text import fuzzy_filter
from pipeline.expr import compile_expr, render

SPEC = BUILTIN_SPECS / "toolsandbox"
SWITCHES = {"low_battery_mode": "low_battery_mode", "location_service": "location_service",
            "cellular_service": "cellular", "wifi": "wifi"}  # fmt: skip
SEARCH_EXACT, SEARCH_FUZZY, SEARCH_MIN, SEARCH_MAX = "exact", "fuzzy", "min", "max"
# The phone-number parameters upstream validates with libphonenumber (validators.validate_phone_number).
PHONES = {"add_contact": ("phone_number",), "modify_contact": ("phone_number",),
          "search_contacts": ("phone_number",), "send_message_with_phone_number": ("phone_number",),
          "search_messages": ("sender_phone_number", "recipient_phone_number")}  # fmt: skip


def seed_id(payload: str) -> str:
    return str(uuid.uuid5(uuid.NAMESPACE_URL, payload))  # upstream's deterministic_uuid


def load_rules(folder: Path = SPEC) -> tuple[dict[str, ToolInfo], dict[str, tuple[Precondition, ...]], str]:
    schemas = load_tools_json(folder / "tools.json")
    grounded = _toml(folder / "grounded.toml").get("tool", {})
    raw = _toml(folder / "rules.toml")
    templates, tables = raw.get("template", {}), raw.get("tool", {})
    for name in set(grounded) | set(tables):
        if name not in schemas:
            raise SpecError(f"{folder}: rules for {name!r}, which is not a tool of tools.json")
    tools = {n: tool_rules(n, p, grounded.get(n, {}), f"{folder}: {n}").info for n, p in schemas.items()}
    tools = with_effects(tools, load_effects(folder), str(folder))
    rules = {n: _compile(t, templates, f"{folder}/rules.toml [tool.{n}]") for n, t in tables.items()}
    files = [folder / f for f in ("tools.json", "grounded.toml", "rules.toml", FILE) if (folder / f).is_file()]
    return tools, rules, files_fingerprint(*files)


def _toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise SpecError(f"{path}: {exc}") from exc


def _compile(table: dict[str, Any], templates: dict[str, Any], where: str) -> tuple[Precondition, ...]:
    raw = []
    for use in table.get("use", []):
        kind, _, field = use.partition(":")
        if kind not in templates:
            raise SpecError(f"{where}: unknown template {kind!r}")
        raw.append({k: v.replace("{field}", field) for k, v in templates[kind].items()})
    raw.extend(table.get("preconditions", []))
    names = {"args", "state"}
    return tuple(
        Precondition(
            compile_field(r["require"], names, where, compile_expr),
            compile_field(r["error"], names, where, render),
            r.get("clause"),
        )
        for r in raw
    )


def initial_doc(seed: dict[str, Any], env: dict[str, Any], rollout_id: str) -> dict[str, Any]:
    """The start document of a rollout: upstream's seed relative to `env.now`, in settings variant `env.settings`."""
    now = env.get("now")
    if not isinstance(now, int | float) or isinstance(now, bool):
        raise EnvError("toolsandbox: the rollout's env needs 'now' (a POSIX timestamp taken from the log)")
    variant = env.get("settings", "base")
    try:
        tz = ZoneInfo(env.get("tz", "UTC"))
    except (ZoneInfoNotFoundError, ValueError, TypeError) as exc:
        raise EnvError(f"toolsandbox: unknown time zone {env.get('tz')!r} in the rollout's env") from exc
    if variant not in seed["variants"]:
        raise EnvError(f"toolsandbox: unknown settings variant {variant!r} (known: {', '.join(seed['variants'])})")
    setting = dict(seed["settings"])
    for column in seed["variants"][variant]:
        setting[column] = not setting[column]
    contacts = [{"person_id": seed_id(c["id_payload"]), **_without(c, "id_payload")} for c in seed["contacts"]]
    # Upstream writes the seed as `datetime.now() - timedelta(...)` on naive local time: wall-clock offsets.
    at = lambda offset: u.shift(now, {"seconds": offset}, tz)  # noqa: E731
    messages = [_seed_message(m, at) for m in seed["messages"]]
    reminders = [_seed_reminder(r, at) for r in seed["reminders"]]
    return {"setting": setting, "contact": contacts, "messaging": messages, "reminder": reminders,
            "clock": {"now": float(now), "tz": env.get("tz", "UTC"), "created": 0, "rollout": rollout_id},
            "ids": {}, "shown": {}}  # fmt: skip


def seed_clock(reminders: list[Any], tz: str = "UTC", folder: Path = SPEC) -> float | None:
    """The "now" upstream wrote its seed at, from logged reminder rows (execution_context.json's `reminder`
    database): the first seed reminder found with its creation timestamp, moved back by its offset on the wall
    clock. This is the clock the seed was built with, which a scenario's first get_current_timestamp postdates."""
    offsets = _reminder_offsets(folder)
    try:
        zone = ZoneInfo(tz)
    except (ZoneInfoNotFoundError, ValueError, TypeError):
        return None
    for row in reminders:
        created = row.get("creation_timestamp") if isinstance(row, dict) else None
        if row.get("reminder_id") in offsets and isinstance(created, int | float) and not isinstance(created, bool):
            return u.shift(float(created), {"seconds": -offsets[row["reminder_id"]]}, zone)
    return None


@cache
def _reminder_offsets(folder: Path) -> dict[str, float]:
    """Seed reminder id -> its creation time's offset from "now" (seconds), as seed.json gives them."""
    seed = orjson.loads((folder / "seed.json").read_bytes())
    return {seed_id(r["id_payload"]): r["created_offset_s"] for r in seed["reminders"]}


def _without(row: dict[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in row.items() if k not in keys}


def _seed_message(m: dict[str, Any], at: Callable[[float], float]) -> dict[str, Any]:
    def person(name: str | None) -> str | None:
        return seed_id(name) if name else None

    return {"message_id": seed_id(m["id_payload"]), "sender_person_id": person(m["sender"]),
            "sender_phone_number": m["sender_phone_number"], "recipient_person_id": person(m["recipient"]),
            "recipient_phone_number": m["recipient_phone_number"], "content": m["content"],
            "creation_timestamp": at(m["created_offset_s"])}  # fmt: skip


def _seed_reminder(r: dict[str, Any], at: Callable[[float], float]) -> dict[str, Any]:
    return {"reminder_id": seed_id(r["id_payload"]), "content": r["content"],
            "creation_timestamp": at(r["created_offset_s"]), "reminder_timestamp": at(r["reminder_offset_s"]),
            "latitude": r["latitude"], "longitude": r["longitude"]}  # fmt: skip


class ToolSandboxEnvironment:
    name = "toolsandbox"
    simulated = True

    def __init__(self, folder: Path = SPEC) -> None:
        self.tools, self.rules, fingerprint = load_rules(folder)
        self.seed = orjson.loads((folder / "seed.json").read_bytes())
        # The libraries decide outcomes too: a run scored with other versions is not reused (pipeline.scoring.driver).
        libraries = ",".join(f"{n}=={metadata.version(n)}" for n in u.LIBRARIES)
        self.version = f"toolsandbox-native@{fingerprint}+{libraries}"
        self.integers = {name: frozenset(_integer_parameters(info)) for name, info in self.tools.items()}
        missing = sorted(set(self.tools) - set(TOOLS))
        if missing:
            raise EnvError(f"toolsandbox: no implementation for {', '.join(missing)}")

    def tool(self, name: str) -> ToolInfo | None:
        return self.tools.get(name)

    def open_catalogue(self) -> bool:
        return False

    def knowledge(self, state: Any) -> list[Any]:
        return []  # the agent knows only the conversation and earlier outputs

    def start(self, rollout: Rollout) -> JournaledDoc:
        return JournaledDoc(initial_doc(self.seed, rollout.env, rollout.rollout_id))

    def available(self, state: JournaledDoc, tool: str, turn: int) -> bool:
        return True

    def execute(self, state: JournaledDoc, tool: str, args: dict[str, Any] | None, call: Call) -> Outcome:
        ids = state.doc["ids"]
        args = {k: ids.get(v, v) if isinstance(v, str) else v for k, v in captured(args, tool).items()}
        mark = len(state.journal)
        try:
            for name in self.integers.get(tool, ()):
                if isinstance(args.get(name), float):
                    raise u.ToolError(f"TypeError: Parameter {name!r} is of type 'float', but expected 'int'")
            for name in PHONES.get(tool, ()):
                if name in args:
                    u.check_phone(args[name])
            ctx = {"args": args, "state": state.doc}
            check = check_rules(self.rules.get(tool, ()), ctx, unknown_violates=True)
            if check.violated:
                return Outcome(False, message=check.message, decided_by="precondition")
            output = TOOLS[tool](state, args, call)
        except u.ToolError as exc:
            state.rollback(mark)
            return Outcome(False, message=str(exc), decided_by="simulator")
        return Outcome(True, output=_shown(output, state.doc["shown"]), decided_by="simulator")

    def checkpoint(self, state: JournaledDoc) -> int:
        return len(state.journal)

    def rollback(self, state: JournaledDoc, mark: int) -> None:
        state.rollback(mark)


def _integer_parameters(info: ToolInfo) -> list[str]:
    properties = info.parameters.get("properties", {})
    return [k for k, p in properties.items() if "integer" in _types(p) and "number" not in _types(p)]


def _types(schema: dict[str, Any]) -> list[str]:
    kind = schema.get("type", [])
    return [kind] if isinstance(kind, str) else kind


def _shown(value: Any, shown: dict[str, str]) -> Any:
    # Outputs show the ids of the live run, so later grounding and output comparison use the log's ids.
    if isinstance(value, str):
        return shown.get(value, value)
    if isinstance(value, list):
        return [_shown(v, shown) for v in value]
    if isinstance(value, dict):
        return {k: _shown(v, shown) for k, v in value.items()}
    return value


def _new_id(state: JournaledDoc, call: Call) -> str:
    clock = state.doc["clock"]
    state.set(clock, "created", clock["created"] + 1)
    new = str(uuid.uuid5(uuid.NAMESPACE_URL, f"pexec-toolsandbox/{clock['rollout']}/{clock['created']}"))
    logged = _logged_id(call)
    if logged is not None and logged != new:
        state.set(state.doc["ids"], logged, new)
        state.set(state.doc["shown"], new, logged)
    return new


def _logged_id(call: Call) -> str | None:
    if call.output is NOT_LOGGED or call.error or not isinstance(call.output, str):
        return None
    text = call.output.strip().strip("'\"")  # upstream logs the repr of the returned string
    return text or None


def _tz(state: JournaledDoc) -> ZoneInfo:
    try:
        return ZoneInfo(state.doc["clock"]["tz"])
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise u.ToolError(f"unknown time zone {state.doc['clock']['tz']!r}") from exc


# --- tool bodies: (state, args after id mapping, call) -> output; u.ToolError rejects the call.
def _search(
    rows: list[dict[str, Any]], args: dict[str, Any], plan: Mapping[str, tuple[str, str, float]]
) -> list[dict[str, Any]]:
    for param, (column, how, threshold) in plan.items():
        if param not in args:
            continue
        want = args[param]
        if how == SEARCH_FUZZY:  # best first, at most five
            rows = fuzzy_filter(rows, column, want, threshold)
            continue
        # Upstream filters a polars table: a comparison with a null (cell or value) keeps no row.
        rows = [r for r in rows if r[column] is not None and want is not None]
        if how == SEARCH_EXACT:
            rows = [r for r in rows if r[column] == want]
        elif how == SEARCH_MIN:
            rows = [r for r in rows if r[column] >= want]
        else:
            rows = [r for r in rows if r[column] <= want]
    return [dict(r) for r in rows]


def _replace(state: JournaledDoc, table: str, key: str, changes: dict[str, Any]) -> None:
    """Upstream's modify: the row is removed and the changed row appended at the end of the table."""
    rows = state.doc[table]
    index = next(i for i, r in enumerate(rows) if r[key] == changes[key])  # the rules guarantee one
    row = {**rows[index], **changes}
    state.delete(rows, index)
    state.set(rows, len(rows), row)


def _remove(state: JournaledDoc, table: str, key: str, value: str) -> None:
    rows = state.doc[table]
    for index in reversed([i for i, r in enumerate(rows) if r[key] == value]):
        state.delete(rows, index)


def add_contact(state: JournaledDoc, args: dict[str, Any], call: Call) -> str:
    pid = _new_id(state, call)
    row = {"person_id": pid, "name": args["name"], "phone_number": args["phone_number"],
           "relationship": args.get("relationship"), "is_self": args.get("is_self", False)}  # fmt: skip
    state.set(state.doc["contact"], len(state.doc["contact"]), row)
    return pid


def modify_contact(state: JournaledDoc, args: dict[str, Any], call: Call) -> None:
    _replace(state, "contact", "person_id", args)


def remove_contact(state: JournaledDoc, args: dict[str, Any], call: Call) -> None:
    _remove(state, "contact", "person_id", args["person_id"])


CONTACT_SEARCH = {
    "person_id": ("person_id", SEARCH_EXACT, 0),
    "name": ("name", SEARCH_FUZZY, 90),
    "phone_number": ("phone_number", SEARCH_EXACT, 0),
    "relationship": ("relationship", SEARCH_FUZZY, 90),
    "is_self": ("is_self", SEARCH_EXACT, 0),
}


def search_contacts(state: JournaledDoc, args: dict[str, Any], call: Call) -> list[dict[str, Any]]:
    return _search(state.doc["contact"], args, CONTACT_SEARCH)


def send_message(state: JournaledDoc, args: dict[str, Any], call: Call) -> str:
    contacts = state.doc["contact"]
    me = next(c for c in contacts if c["is_self"])  # the rules guarantee exactly one
    recipient = next((c["person_id"] for c in contacts if c["phone_number"] == args["phone_number"]), None)
    mid = _new_id(state, call)
    row = {"message_id": mid, "sender_person_id": me["person_id"], "sender_phone_number": me["phone_number"],
           "recipient_person_id": recipient, "recipient_phone_number": args["phone_number"],
           "content": args["content"], "creation_timestamp": state.doc["clock"]["now"]}  # fmt: skip
    state.set(state.doc["messaging"], len(state.doc["messaging"]), row)
    return mid


MESSAGE_SEARCH = {
    **{k: (k, SEARCH_EXACT, 0) for k in ("message_id", "sender_person_id", "sender_phone_number",
                                          "recipient_person_id", "recipient_phone_number")},
    "content": ("content", SEARCH_FUZZY, 50),
    "creation_timestamp_lowerbound": ("creation_timestamp", SEARCH_MIN, 0),
    "creation_timestamp_upperbound": ("creation_timestamp", SEARCH_MAX, 0),
}  # fmt: skip


def search_messages(state: JournaledDoc, args: dict[str, Any], call: Call) -> list[dict[str, Any]]:
    return _search(state.doc["messaging"], args, MESSAGE_SEARCH)


def add_reminder(state: JournaledDoc, args: dict[str, Any], call: Call) -> str:
    rid = _new_id(state, call)
    row = {"reminder_id": rid, "content": args["content"], "creation_timestamp": state.doc["clock"]["now"],
           "reminder_timestamp": args["reminder_timestamp"], "latitude": args.get("latitude"),
           "longitude": args.get("longitude")}  # fmt: skip
    state.set(state.doc["reminder"], len(state.doc["reminder"]), row)
    return rid


def modify_reminder(state: JournaledDoc, args: dict[str, Any], call: Call) -> None:
    _replace(state, "reminder", "reminder_id", {**args, "creation_timestamp": state.doc["clock"]["now"]})


REMINDER_SEARCH = {
    "reminder_id": ("reminder_id", SEARCH_EXACT, 0), "content": ("content", SEARCH_FUZZY, 50),
    "creation_timestamp_lowerbound": ("creation_timestamp", SEARCH_MIN, 0),
    "creation_timestamp_upperbound": ("creation_timestamp", SEARCH_MAX, 0),
    "reminder_timestamp_lowerbound": ("reminder_timestamp", SEARCH_MIN, 0),
    "reminder_timestamp_upperbound": ("reminder_timestamp", SEARCH_MAX, 0),
    "latitude": ("latitude", SEARCH_EXACT, 0), "longitude": ("longitude", SEARCH_EXACT, 0),
}  # fmt: skip


def search_reminder(state: JournaledDoc, args: dict[str, Any], call: Call) -> list[dict[str, Any]]:
    return _search(state.doc["reminder"], args, REMINDER_SEARCH)


def remove_reminder(state: JournaledDoc, args: dict[str, Any], call: Call) -> None:
    _remove(state, "reminder", "reminder_id", args["reminder_id"])


def _getter(column: str) -> Callable[[JournaledDoc, dict[str, Any], Call], bool]:
    return lambda state, args, call: state.doc["setting"][column]


def _setter(column: str) -> Callable[[JournaledDoc, dict[str, Any], Call], None]:
    def set_switch(state: JournaledDoc, args: dict[str, Any], call: Call) -> None:
        setting = state.doc["setting"]
        state.set(setting, column, args["on"])
        if column == "low_battery_mode" and args["on"]:  # low-battery mode switches the radios off
            for dependent in ("cellular", "wifi", "location_service"):
                state.set(setting, dependent, False)

    return set_switch


def current_timestamp(state: JournaledDoc, args: dict[str, Any], call: Call) -> float:
    # The clock advances to the time the live run read, so later "now"-relative values match the log.
    clock = state.doc["clock"]
    logged = call.output if isinstance(call.output, int | float) and not isinstance(call.output, bool) else None
    if logged is None and isinstance(call.output, str):
        try:
            logged = float(call.output)
        except ValueError:
            logged = None
    if logged is not None and logged >= clock["now"]:
        state.set(clock, "now", float(logged))
    now: float = clock["now"]
    return now


def search_holiday(state: JournaledDoc, args: dict[str, Any], call: Call) -> float | None:
    year = args.get("year")
    if year is None:
        year = u.local(state.doc["clock"]["now"], _tz(state)).year
    return u.holiday(args["holiday_name"], year, _tz(state))


def _seconds(state: JournaledDoc, args: dict[str, Any], call: Call) -> dict[str, int]:
    info = u.datetime_info(args["seconds"], _tz(state))
    return {"hour": info["hour"], "minute": info["minute"], "second": info["second"]}


def _to_timestamp(state: JournaledDoc, args: dict[str, Any], call: Call) -> float:
    year, month, day, hour, minute, second = (args[k] for k in ("year", "month", "day", "hour", "minute", "second"))
    return u.to_timestamp(year, month, day, hour, minute, second, _tz(state))


_DELTAS = ("weeks", "days", "hours", "minutes", "seconds")

TOOLS: dict[str, Callable[[JournaledDoc, dict[str, Any], Call], Any]] = {
    "add_contact": add_contact,
    "modify_contact": modify_contact,
    "remove_contact": remove_contact,
    "search_contacts": search_contacts,
    "send_message_with_phone_number": send_message,
    "search_messages": search_messages,
    "add_reminder": add_reminder,
    "modify_reminder": modify_reminder,
    "search_reminder": search_reminder,
    "remove_reminder": remove_reminder,
    **{f"get_{name}_status": _getter(column) for name, column in SWITCHES.items()},
    **{f"set_{name}_status": _setter(column) for name, column in SWITCHES.items()},
    "get_current_location": lambda s, a, c: {k: s.doc["setting"][k] for k in ("latitude", "longitude")},
    "get_current_timestamp": current_timestamp,
    "timestamp_to_datetime_info": lambda s, a, c: u.datetime_info(a["timestamp"], _tz(s)),
    "datetime_info_to_timestamp": _to_timestamp,
    "shift_timestamp": lambda s, a, c: u.shift(a["timestamp"], {k: a.get(k, 0) for k in _DELTAS}, _tz(s)),
    "timestamp_diff": lambda s, a, c: u.diff(a["timestamp_0"], a["timestamp_1"], _tz(s)),
    "seconds_to_hours_minutes_seconds": _seconds,
    "unit_conversion": lambda s, a, c: u.convert(a["amount"], a["from_unit"], a["to_unit"]),
    "calculate_lat_lon_distance": lambda s, a, c: u.geodesic_km(
        a["latitude_0"], a["longitude_0"], a["latitude_1"], a["longitude_1"]
    ),
    "search_holiday": search_holiday,
    "end_conversation": lambda s, a, c: None,
}
