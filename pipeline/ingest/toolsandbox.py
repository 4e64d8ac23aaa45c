"""`toolsandbox`: ToolSandbox run folders -> canonical rollouts, one per scenario.

A source is a run folder holding `result_summary.json` and `trajectories/<scenario>/` (conversation.json,
execution_context.json), or a folder of such run folders. Options (`--option k=v`):
- `threshold` (default 1.0): success = milestone_similarity >= threshold (and the scenario did not crash);
- `now`: the scenario clock (POSIX) when the log does not give it; `tz` (default UTC): the clock's zone.

Upstream writes execution_context.json for every scenario it begins to play and conversation.json only after
evaluating it. A crashed scenario (its summary entry has a `traceback` and `exception_type`) therefore has only
execution_context.json: it is a rollout with status `harness_error` (attribute `harness_error` =
`<exception_type>: <last traceback line>`), success false, and whatever calls that file recovers: the sandbox
database's messages, converted to the conversation format the way upstream converts them (`<id>_parameters =
{...}` code -> a tool call). Upstream's namespaces and roles are `strenum` members written as their names
(`_dbs.SANDBOX`, `AGENT`, `EXECUTION_ENVIRONMENT`); every upstream version does so, and lower-case spellings are
read as the same names.

`env` = {"scenario", "settings", "now", "tz"}: the settings variant the scenario started in, read from
execution_context.json (the settings snapshot in force at the scenario's first user message), else from the
scenario name (`..._wifi_off`, `..._low_battery_mode_on`, ...); `now` is the clock upstream's seed was written at
(a seed reminder's logged creation timestamp less its offset), else the first logged get_current_timestamp
output, else the earliest creation_timestamp in the log's database updates, else the run folder's start time
(upstream names it `agent_<model>_user_<model>_MM_DD_YYYY_HH_MM_SS`), else `--option now`.
Tool messages answer calls by `tool_call_id`, paired as `pipeline.ingest._pairing` says (a result that answers
no call is a `tool` message, attribute `orphan_results`); a tool message whose first or last line names an
exception (`Traceback ...`, `ValueError: ...`: upstream ends it with the exception line) is `error: true`, its text
the output; any other is the output, read back from upstream's repr (JSON, else a Python literal, else text).
Labels (conditions): `model` (from the folder name), plus `--label`. Attributes: `user_model` (the user
simulator, from the folder name), `categories` (the scenario's, comma-joined). The scenario is the task id.
"""

from __future__ import annotations

import ast
import datetime as dt
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import orjson

from pipeline.core.errors import IngestError
from pipeline.core.records import CallRecord, EventRecord
from pipeline.core.values import decoded
from pipeline.ingest._pairing import Call, Entry, Result, assemble
from pipeline.ingest.base import IngestOptions, LogFormat, Option, OptionSchema, read_document, source_files
from pipeline.storage.fs import exists

RUN_NAME = re.compile(r"agent_(?P<agent>.+)_user_(?P<user>.+)_(?P<ts>\d\d_\d\d_\d{4}_\d\d_\d\d_\d\d)")
ERROR_TEXT = re.compile(r"^(Traceback|[A-Za-z_.]*(Error|Exception)\b)")
SWITCH_TOKENS = (("wifi", "off"), ("location_service", "off"), ("cellular", "off"))
SWITCHES = ("low_battery_mode", "wifi", "location_service", "cellular")  # upstream's variant names, in its order
# Upstream's code for one tool call (message_conversion.openai_tool_call_to_python_code).
CALL_CODE = re.compile(r"^(?P<id>.+)_parameters = (?P<arguments>[^\n]+)\n(?P=id)_response = (?P<name>[^(]+)")


OPTIONS = OptionSchema(
    (
        Option("threshold", "success = milestone_similarity >= X (and the scenario did not crash)", "1.0"),
        Option("now", "the scenario clock (POSIX seconds) when the log gives no time"),
        Option("tz", "the clock's time zone", "UTC"),
    )
)


class ToolSandbox(LogFormat):
    name = "toolsandbox"
    options = OPTIONS

    def looks_like(self, doc: Any) -> bool:
        return isinstance(doc, dict) and "per_scenario_results" in doc

    def read(self, sources: Sequence[str], options: IngestOptions) -> Iterator[dict[str, Any]]:
        threshold = _number(options.extra["threshold"], "threshold")
        now = _number(options.extra["now"], "now") if "now" in options.extra else None
        for source in sources:
            for run in _runs(source, options):
                yield from _read_run(run, threshold, now, options.extra["tz"], options)


FORMAT = ToolSandbox()


def _number(text: str, name: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise IngestError(f"toolsandbox: option {name}={text!r} is not a number") from None


def _runs(source: str, options: IngestOptions) -> list[str]:
    """The folders of the result_summary.json files in `source` or one folder below (or the one named)."""
    return [url.rsplit("/", 1)[0] for url in source_files("toolsandbox", source, options, ("result_summary.json",), 2)]


def _load(url: str, options: IngestOptions) -> Any:
    try:
        return orjson.loads(read_document("toolsandbox", url, options))
    except (OSError, orjson.JSONDecodeError) as exc:
        raise IngestError(f"toolsandbox: {url}: cannot read JSON: {exc}") from exc


def _read_run(
    run: str, threshold: float, now: float | None, tz: str, options: IngestOptions
) -> Iterator[dict[str, Any]]:
    summary = _load(f"{run}/result_summary.json", options)
    results = summary.get("per_scenario_results") if isinstance(summary, dict) else None
    if not isinstance(results, list):
        raise IngestError(f"toolsandbox: {run}/result_summary.json: no 'per_scenario_results' list")
    folder = run.rstrip("/").rsplit("/", 1)[-1]
    named = RUN_NAME.fullmatch(folder)
    labels = {"model": named["agent"]} if named else {}
    started = (
        dt.datetime.strptime(named["ts"], "%m_%d_%Y_%H_%M_%S").replace(tzinfo=dt.UTC).timestamp() if named else None
    )
    for i, result in enumerate(results):
        if not isinstance(result, dict) or not isinstance(result.get("name"), str):
            raise IngestError(f"toolsandbox: {run}/result_summary.json: per_scenario_results[{i}] has no name")
        name = result["name"]
        crash = _crash(result)
        scenario = _scenario(f"{run}/trajectories/{name}", crash is not None, tz, options)
        events, orphans = _events(scenario.turns, scenario.where)
        clock = scenario.seeded_at or _first_timestamp(events) or _earliest_update(scenario.turns) or started or now
        if clock is None:
            raise IngestError(f"toolsandbox: {run}: scenario {name}: no time in the log; give --option now=POSIX")
        similarity = result.get("milestone_similarity")
        attributes = {
            "user_model": named["user"] if named else None,
            "categories": ",".join(map(str, result.get("categories") or [])),
            "harness_error": crash,
        } | orphans
        yield {
            "rollout_id": f"{folder}/{name}",
            "task_id": name,
            "benchmark": "toolsandbox",
            "labels": {**labels, **options.labels},
            "attributes": {k: v for k, v in attributes.items() if v is not None},
            "status": "ok" if crash is None else "harness_error",
            "env": {"scenario": name, "settings": scenario.settings or settings_variant(name), "now": clock, "tz": tz},
            "events": events,
            "success": None if similarity is None else (crash is None and float(similarity) >= threshold),
        }


def _crash(result: dict[str, Any]) -> str | None:
    """`<exception_type>: <last line of the traceback>` of a scenario upstream's run_scenario caught, else None."""
    if result.get("exception_type") is None:
        return None
    lines = [line for line in str(result.get("traceback") or "").splitlines() if line.strip()]
    return f"{result['exception_type']}: {lines[-1].strip() if lines else 'no traceback'}"


@dataclass(frozen=True)
class Scenario:
    """What a scenario's trajectory folder says: the file its messages came from, the messages in conversation.json
    form, and (from execution_context.json, when upstream wrote one) the settings variant it started in and the
    clock upstream's seed was written at."""

    where: str
    turns: list[Any]
    settings: str | None = None
    seeded_at: float | None = None


def _scenario(folder: str, crashed: bool, tz: str, options: IngestOptions) -> Scenario:
    """Upstream writes execution_context.json for every scenario it began to play and conversation.json only after
    evaluating: a crashed scenario's messages come from the former, or there are none."""
    conversation, context_url = f"{folder}/conversation.json", f"{folder}/execution_context.json"
    context = _load(context_url, options) if exists(context_url, options.storage_options) else None
    settings = start_settings(context, context_url) if context is not None else None
    # Imported here: the simulator's module loads pint, holidays, phonenumbers and rapidfuzz (0.1 CPU-s), and this
    # module is imported wherever a log's format is sniffed (`likely_format`), on every other format's read path.
    from pipeline.envs.toolsandbox.env import seed_clock

    seeded_at = seed_clock(_table(context, "reminder", context_url), tz) if context is not None else None
    if crashed and not exists(conversation, options.storage_options):
        turns = sandbox_messages(context, context_url) if context is not None else []
        return Scenario(context_url, turns, settings, seeded_at)
    turns = _load(conversation, options)
    if not isinstance(turns, list):
        raise IngestError(f"toolsandbox: {conversation}: expected a list of messages")
    return Scenario(conversation, turns, settings, seeded_at)


def sandbox_messages(context: Any, where: str) -> list[dict[str, Any]]:
    """The agent's messages of an execution_context.json (the `sandbox` database), in conversation.json form, as
    upstream's to_openai_messages converts them; messages only the user simulator sees are left out."""
    rows = _table(context, "sandbox", where)
    out: list[dict[str, Any]] = []
    for k, row in enumerate(rows):
        if not isinstance(row, dict) or _roles(row.get("visible_to")) == ["user"]:
            continue
        sender, recipient = _role(row.get("sender")), _role(row.get("recipient"))
        content = row.get("content") or ""
        if (sender, recipient) in (("system", "agent"), ("user", "agent")):
            out.append({"role": sender, "content": content})
        elif (sender, recipient) == ("agent", "user"):
            out.append({"role": "assistant", "content": content})
        elif (sender, recipient) == ("execution_environment", "agent"):
            out.append({"role": "tool", "tool_call_id": row.get("openai_tool_call_id"), "content": content})
        elif (sender, recipient) == ("agent", "execution_environment"):
            if not out or "tool_calls" not in out[-1]:
                out.append({"role": "assistant", "content": "", "tool_calls": []})
            out[-1]["tool_calls"].append(_code_call(content, row.get("openai_function_name"), f"{where} sandbox[{k}]"))
    return out


def _table(context: Any, name: str, where: str) -> list[Any]:
    """A database of execution_context.json's `_dbs`. Upstream's namespaces are strenum members, written as their
    names (`SANDBOX`); the lower-case spelling is read too."""
    dbs = context.get("_dbs") if isinstance(context, dict) else None
    rows = next((v for k, v in dbs.items() if str(k).lower() == name), None) if isinstance(dbs, dict) else None
    if not isinstance(rows, list):
        raise IngestError(f"toolsandbox: {where}: no _dbs.{name.upper()} list")
    return rows


def _role(value: Any) -> str | None:
    """A sender or recipient (`AGENT`, `EXECUTION_ENVIRONMENT`, ...: strenum names) in lower case."""
    return value.lower() if isinstance(value, str) else None


def _roles(value: Any) -> list[str | None] | None:
    return [_role(v) for v in value] if isinstance(value, list) else None


def start_settings(context: Any, where: str) -> str | None:
    """The settings variant a scenario started in, from execution_context.json: the `setting` database's snapshot
    in force at the scenario's first user message (snapshots are keyed by sandbox message index; an all-null row
    marks where one begins). None when the file does not say."""
    opening = next((row.get("sandbox_message_index") for row in _table(context, "sandbox", where)
                    if isinstance(row, dict) and _roles([row.get("sender"), row.get("recipient")]) == ["user", "agent"]
                    and _roles(row.get("visible_to")) != ["user"]), None)  # fmt: skip
    if not isinstance(opening, int):
        return None
    states = [row for row in _table(context, "setting", where) if isinstance(row, dict)
              and isinstance(row.get("sandbox_message_index"), int) and row["sandbox_message_index"] <= opening
              and all(isinstance(row.get(c), bool) for c in SWITCHES)]  # fmt: skip
    if not states:
        return None
    state = max(states, key=lambda row: row["sandbox_message_index"])
    if state["low_battery_mode"]:
        return "base_low_battery_mode_on_wifi_off_location_service_off_cellular_off"
    return "_".join(["base", *(f"{c}_off" for c in SWITCHES[1:] if not state[c])])


def _code_call(code: str, name: Any, where: str) -> dict[str, Any]:
    matched = CALL_CODE.match(code)
    if matched is None:
        raise IngestError(f"toolsandbox: {where}: not upstream's tool call code: {code[:80]!r}")
    try:  # a Python literal (upstream writes the arguments' repr); literals only, never evaluated as code
        arguments = json.dumps(ast.literal_eval(matched["arguments"]))
    except (ValueError, SyntaxError, MemoryError, RecursionError, TypeError):
        arguments = matched["arguments"]  # kept raw: arguments that do not parse are an S failure
    function = {"name": name or matched["name"].strip(), "arguments": arguments}
    return {"id": matched["id"], "type": "function", "function": function}


def settings_variant(scenario: str) -> str:
    """The upstream starting variant the scenario name says (base_<column>_<on|off>... in a fixed order)."""
    if "low_battery_mode_on" in scenario:
        return "base_low_battery_mode_on_wifi_off_location_service_off_cellular_off"
    flipped = [f"{col}_{state}" for col, state in SWITCH_TOKENS if f"{col}_{state}" in scenario]
    return "_".join(["base", *flipped])


def _events(turns: list[Any], where: str) -> tuple[list[EventRecord], dict[str, str]]:
    """(events, attributes): the scenario's calls paired with their tool messages by `tool_call_id`."""
    log: list[Entry] = []
    for k, turn in enumerate(turns):
        if not isinstance(turn, dict) or not isinstance(turn.get("role"), str):
            raise IngestError(f"toolsandbox: {where}: message #{k} has no role")
        role = turn["role"]
        if role in ("system", "user") or (role == "assistant" and turn.get("content")):
            log.append({"type": "message", "role": role, "content": str(turn.get("content") or "")})
        if role == "tool":
            log.append(Result(turn.get("tool_call_id"), str(turn.get("content")), turn.get("content")))
        for call in turn.get("tool_calls") or []:
            log.append(Call(call.get("id"), partial(_call, call)))
    return assemble(log)


def _call(call: dict[str, Any], answer: str | None) -> CallRecord:
    fn: Any = call.get("function") or {}  # decoded JSON of the log
    event: CallRecord = {
        "type": "call",
        "tool": fn.get("name"),
        "arguments": fn.get("arguments") or "{}",
        "call_id": call.get("id"),
    }
    if answer is not None:
        error = is_error(answer)
        event["error"] = error
        event["output"] = answer if error else _output(answer)
    return event


def is_error(text: str) -> bool:
    """Whether a tool message reports an exception: upstream writes the traceback, whose last line names the
    exception (`ValueError: ...`); a bare exception line may also stand first."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return bool(lines) and any(ERROR_TEXT.match(line) for line in (lines[0], lines[-1]))


def _output(text: str) -> Any:
    # Upstream logs the repr of the returned value (a quoted string for created ids, dicts and lists in
    # Python's quotes): read back as a value, never evaluated as code.
    return decoded(text)


def _first_timestamp(events: list[EventRecord]) -> float | None:
    for e in events:
        if e["type"] == "call" and e["tool"] == "get_current_timestamp":
            output = e.get("output")
            if isinstance(output, int | float):
                return float(output)
    return None


def _earliest_update(turns: list[Any]) -> float | None:
    stamps = [
        row["creation_timestamp"]
        for t in turns
        if isinstance(t, dict)
        for key, details in t.items()
        if key.endswith("_details") and isinstance(details, dict)
        for rows in (details.get("database_update") or {}).values()
        for row in rows
        if isinstance(row, dict) and isinstance(row.get("creation_timestamp"), int | float)
    ]
    return min(stamps) if stamps else None
