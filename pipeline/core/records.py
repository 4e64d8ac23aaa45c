"""Canonical rollout records (docs/explanation/data-model.md, "Canonical rollout"): validate a decoded JSON object and
build a Rollout.

A record that cannot be scored raises InvalidRecord with a reason that ends up in `rejects/`. Records are
walked recursively further on (references, hashing, comparisons, Arrow), so nesting is limited here.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping
from typing import Any, Literal, NotRequired, TypedDict

import orjson

from pipeline.core.errors import InvalidRecord
from pipeline.core.model import ACTORS, NOT_LOGGED, STATUSES, Call, Event, Message, Rollout, Status
from pipeline.core.run_schema import ATTRIBUTE_PREFIX, RESERVED_COLUMNS

MAX_DEPTH = 64  # levels of objects and lists in a record (and in JSON text it carries); deeper is a reject
# Characters of an id or a name: rollout, task, benchmark, label (name and value), attribute name, tool, call id.
# They fill the tables' key columns, the duplicate-id check and reject locations: longer is a reject, never kept.
MAX_ID_CHARS = 4096
# Labels, and attributes, of one rollout: each is a column of the steps and rollouts tables (and a label a cohort
# column); more is a reject (20,000 labels on one rollout made `pexec metrics` run 130 s and crash).
MAX_LABELS = 64
# Characters of a rollout's own text that its steps repeat (ids, label and attribute values), times its calls: a
# rollout past it is a reject (its steps would hold a long value once per call: a 10 MB attribute on 240 calls took
# 3.4 GB), the guard refuses the call that would take a session past it, and the scorer converts a batch of results
# to Arrow before its rollouts reach it together.
MAX_REPEATED_CHARS = 32 << 20
_RESERVED = frozenset(c.lower() for c in RESERVED_COLUMNS)  # SQL names are case-insensitive


# The canonical record as pexec's own code builds it (ingest's formats, synth, `event_record`). What is read from a
# store is a decoded JSON object of any shape until `parse_rollout` has validated it.


class MessageRecord(TypedDict):
    type: Literal["message"]
    role: str
    content: str
    turn: NotRequired[int]  # absent: 0


class CallRecord(TypedDict):
    type: Literal["call"]
    tool: str
    arguments: Any  # the arguments object, or the raw text the log kept (it may not parse)
    turn: NotRequired[int]  # absent: 0
    call_id: NotRequired[str | None]
    actor: NotRequired[Literal["agent", "user"]]  # absent: agent
    output: NotRequired[Any]  # absent: the log recorded no output
    error: NotRequired[bool]
    tools_version: NotRequired[int]  # index into `env.tool_versions`; absent: 0 (the first, or only, definitions)


EventRecord = MessageRecord | CallRecord


class RolloutRecord(TypedDict):
    rollout_id: str
    task_id: str
    benchmark: str
    labels: dict[str, str]
    env: NotRequired[dict[str, Any]]  # environment-specific start (free-form JSON)
    events: list[EventRecord]
    success: bool | None
    cost: NotRequired[dict[str, float]]
    attributes: NotRequired[dict[str, str]]
    status: NotRequired[Status]
    truth: NotRequired[Any]  # synthetic stores only (pipeline.synthetic.rollouts)


_CONTAINERS = (dict, list)


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether `value` has more than `limit` levels of objects and lists (the walk stops at the limit)."""
    if 0 < limit < _ORJSON_LEVELS and _written_padded(value, _ORJSON_LEVELS - limit):
        return False
    level = [value] if type(value) in _CONTAINERS else []
    for _ in range(limit):
        if not level:
            return False
        # One level at a time, in a comprehension rather than a call per container: this runs on every record.
        level = [
            item
            for container in level
            for item in (container.values() if type(container) is dict else container)
            if type(item) in _CONTAINERS
        ]
    return bool(level)


# orjson writes at most 254 levels of lists and objects (each counts, empty or not; checked below) and refuses
# more: inside _ORJSON_LEVELS - L lists, a value is written when it has at most L levels of its own.
_ORJSON_LEVELS = 254
_PADDING = _ORJSON_LEVELS - MAX_DEPTH
_padded = threading.local()  # per thread: padding -> a box inside padding - 1 lists, reused (the guard serves threads)


def _written_padded(value: Any, padding: int = _PADDING) -> bool:
    """Whether orjson writes `value` inside `padding` lists: then it has at most _ORJSON_LEVELS - `padding`
    levels of objects and lists, decided in C. False says nothing (deeper, or something orjson does not write):
    walk it then."""
    if not _ORJSON_LIMIT_HOLDS:
        return False
    boxes: dict[int, tuple[list[Any], Any]] | None = getattr(_padded, "boxes", None)
    if boxes is None:
        boxes = _padded.boxes = {}
    if padding not in boxes:
        box: list[Any] = [None]
        boxes[padding] = (box, _nested(box, padding - 1))
    box, outer = boxes[padding]
    box[0] = value
    try:
        orjson.dumps(outer)
    except TypeError:  # orjson.JSONEncodeError: too deep, or a value it does not write
        return False
    finally:
        box[0] = None
    return True


def _nested(value: Any, levels: int) -> Any:
    for _ in range(levels):
        value = [value]
    return value


def _orjson_limit_holds() -> bool:
    """orjson writes _PADDING + MAX_DEPTH levels and refuses one more (else `_written_padded` never answers)."""
    try:
        orjson.dumps(_nested([], _ORJSON_LEVELS - 1))
    except TypeError:
        return False
    try:
        orjson.dumps(_nested([], _ORJSON_LEVELS))
    except TypeError:
        return True
    return False


_ORJSON_LIMIT_HOLDS = _orjson_limit_holds()


def decoded_too_deep(text: str | bytes, value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether `value`, decoded from the JSON text `text`, has more than `limit` levels of objects and lists.
    A value has no more levels than its text opens objects and lists, and the text's brackets (those inside
    strings too: an upper bound) are counted in C; only a text with more of them is walked (`too_deep`)."""
    if type(value) not in _CONTAINERS:
        return False
    if isinstance(text, str):
        if text.count("{") + text.count("[") <= limit:
            return False
    elif text.count(b"{") + text.count(b"[") <= limit:
        return False
    return too_deep(value, limit)


def check_depth(value: Any, what: str) -> None:
    if too_deep(value):
        raise InvalidRecord(f"{what} nests deeper than {MAX_DEPTH} levels")


def parse_rollout(record: Mapping[str, Any]) -> Rollout:
    check_depth(record, "the record")
    for key in ("rollout_id", "task_id", "benchmark"):
        value = record.get(key)
        if not isinstance(value, str | int) or isinstance(value, bool) or value == "":
            raise InvalidRecord(f"missing or invalid {key!r}")
        check_length(str(value), repr(key))
    labels = _labels(record.get("labels"))
    attributes = _strings(record.get("attributes"), "attributes")
    _check_name_lengths(attributes, "an attribute name")
    cost = _cost(record.get("cost"))
    _check_counts(labels, attributes, cost)
    both = sorted(set(labels) & set(attributes))
    if both:
        raise InvalidRecord(f"{', '.join(map(repr, both))} is both a label and an attribute")
    status = _status(record.get("status") or "ok")
    env = _json_field(record.get("env"), "env") or {}
    if not isinstance(env, dict):
        raise InvalidRecord("'env' must be an object")
    events = record.get("events")
    if not isinstance(events, list):
        raise InvalidRecord("'events' must be a list")
    success = record.get("success")
    if success is not None and not isinstance(success, bool):
        raise InvalidRecord(f"'success' must be true, false or null, got {success!r}")
    return Rollout(
        rollout_id=str(record["rollout_id"]),
        task_id=str(record["task_id"]),
        benchmark=str(record["benchmark"]),
        labels=labels,
        env=env,
        events=[parse_event(e, f"events[{i}]") for i, e in enumerate(events)],
        success=success,
        cost=cost,
        truth=_json_field(record.get("truth"), "truth"),
        attributes=attributes,
        status=status,
    )


def check_rollout(rollout: Rollout) -> Rollout:
    """`rollout`, built by an adapter from the model's own types (its events already well-formed), checked as
    `parse_rollout` checks a record, in the same order with the same reasons: depth, ids, label and attribute
    names. Only its free-form values (the env, a call's arguments and output when they are objects or lists)
    are walked for depth, at their own place in the canonical record."""
    too_deep_value, long_call_name = _scan_events(rollout)
    if too_deep_value:
        raise InvalidRecord(f"the record nests deeper than {MAX_DEPTH} levels")
    for key in ("rollout_id", "task_id", "benchmark"):
        value = getattr(rollout, key)
        if value == "":
            raise InvalidRecord(f"missing or invalid {key!r}")
        if len(value) > MAX_ID_CHARS:  # the test inline, the call only to say why: this runs on every rollout
            check_length(value, repr(key))
    if "" in rollout.labels:
        raise InvalidRecord("'labels' has an empty name")
    _check_label_names(rollout.labels)
    if "" in rollout.attributes:
        raise InvalidRecord("'attributes' has an empty name")
    if rollout.attributes and max(map(len, rollout.attributes)) > MAX_ID_CHARS:
        _check_name_lengths(rollout.attributes, "an attribute name")
    _check_counts(rollout.labels, rollout.attributes, rollout.cost)
    both = sorted(rollout.labels.keys() & rollout.attributes.keys())
    if both:
        raise InvalidRecord(f"{', '.join(map(repr, both))} is both a label and an attribute")
    if long_call_name:  # found while the events were walked for depth; which one is said after the record's own
        for i, event in enumerate(rollout.events):
            if type(event) is Call:
                check_call_names(event, f"events[{i}]")
    return rollout


def repeated_chars(rollout: Rollout) -> int:
    """Characters of `rollout`'s own columns, which the steps table repeats on each of its steps."""
    return (
        len(rollout.rollout_id)
        + len(rollout.task_id)
        + len(rollout.benchmark)
        + sum(map(len, rollout.labels.values()))
        + sum(map(len, rollout.attributes.values()))
    )


def check_repeated(own: int, calls: int) -> None:
    """InvalidRecord when a rollout of `own` repeated characters (repeated_chars) on `calls` calls would make its
    steps repeat more than MAX_REPEATED_CHARS."""
    if own * calls > MAX_REPEATED_CHARS:
        raise InvalidRecord(
            f"its ids, labels and attributes ({own:,} characters) on each of its {calls:,} calls make "
            f"{own * calls:,} characters of steps, over the limit of {MAX_REPEATED_CHARS:,}"
        )


def check_length(value: str, what: str) -> None:
    """An InvalidRecord when `value`, an id or a name, is longer than MAX_ID_CHARS (said without quoting it)."""
    if len(value) > MAX_ID_CHARS:
        raise InvalidRecord(f"{what} is {len(value):,} characters, over the limit of {MAX_ID_CHARS:,} (ids and names)")


def check_call_names(call: Call, where: str) -> None:
    """A call's tool name and call id within MAX_ID_CHARS (`where` names the call: `events[3]`)."""
    check_length(call.tool, f"{where}.tool")
    if call.call_id is not None:
        check_length(call.call_id, f"{where}.call_id")


def _check_counts(labels: Mapping[str, str], attributes: Mapping[str, str], cost: Mapping[str, float]) -> None:
    for values, what in ((labels, "labels"), (attributes, "attributes")):
        if len(values) > MAX_LABELS:
            raise InvalidRecord(f"{len(values):,} {what} are over the limit of {MAX_LABELS} for one rollout")
    for names, what in ((labels, "labels"), (attributes, "attributes"), (cost, "costs")):
        if len(names) > 1 and len({name.lower() for name in names}) < len(names):
            _one_spelling(names, what)


def _one_spelling(names: Iterable[str], what: str) -> None:
    """Each name is a column, and SQL names are case-insensitive: two that differ only in letter case would be read
    as one column (of the run's tables, one spelling names it: pipeline.scoring.run_tables)."""
    seen: dict[str, str] = {}
    for name in names:
        if name.lower() in seen:
            raise InvalidRecord(f"{what} {seen[name.lower()][:64]!r} and {name[:64]!r} differ only in letter case")
        seen[name.lower()] = name


def _check_name_lengths(values: Mapping[str, str], what: str) -> None:
    for name in values:
        check_length(name, what)


# Levels above a free-form value in the canonical record: record > env; record > events > event > arguments.
_ENV_LIMIT = MAX_DEPTH - 1
_EVENT_VALUE_LIMIT = MAX_DEPTH - 3


def _scan_events(rollout: Rollout) -> tuple[bool, bool]:
    """Whether a free-form value nests too deep, and whether a call's tool name or id is too long: one walk."""
    if rollout.env and too_deep(rollout.env, _ENV_LIMIT):
        return True, False
    long_name = False
    for event in rollout.events:
        if type(event) is Call:
            for value in (event.arguments, event.output):
                if type(value) in _CONTAINERS and too_deep(value, _EVENT_VALUE_LIMIT):
                    return True, False
            if len(event.tool) > MAX_ID_CHARS or (event.call_id is not None and len(event.call_id) > MAX_ID_CHARS):
                long_name = True
    return False, long_name


def rollout_record(rollout: Rollout) -> dict[str, Any]:
    """The canonical record of a rollout an adapter built (`check_rollout`), its keys in the order the store
    has always been written in: what `pexec ingest` writes, and what `parse_rollout` reads back as `rollout`."""
    out: dict[str, Any] = {
        "rollout_id": rollout.rollout_id,
        "task_id": rollout.task_id,
        "benchmark": rollout.benchmark,
        "labels": rollout.labels,
        "attributes": rollout.attributes,
        "status": rollout.status,
        "events": [event_record(e) for e in rollout.events],
        "success": rollout.success,
    }
    if rollout.env:
        out["env"] = rollout.env
    if rollout.cost:
        out["cost"] = rollout.cost
    if rollout.truth is not None:
        out["truth"] = rollout.truth
    return out


def _status(value: Any) -> Status:
    for status in STATUSES:
        if value == status:
            return status
    raise InvalidRecord(f"'status' must be one of {', '.join(STATUSES)}, got {value!r}")


def record_id(record: Mapping[str, Any]) -> str | None:
    """The record's rollout id as `parse_rollout` reads it, or None when it has no valid one."""
    value = record.get("rollout_id")
    if not isinstance(value, str | int) or isinstance(value, bool) or value == "":
        return None
    return str(value)


def _labels(raw: Any) -> dict[str, str]:
    return _check_label_names(_strings(raw, "labels"))


def _check_label_names(labels: dict[str, str]) -> dict[str, str]:
    for key, value in labels.items():
        if len(value) > MAX_ID_CHARS:
            check_length(value, f"the value of label {key[:64]!r}")
        if key in _LABEL_NAMES:  # a name seen fit before: every rollout of a store repeats the same few
            continue
        check_length(key, "a label name")
        # SQL names are case-insensitive: a label `t` would be read as the column `T`.
        if key.lower() in _RESERVED or key.lower().startswith(("cost_", ATTRIBUTE_PREFIX)):
            raise InvalidRecord(f"label {key!r} clashes with an output column name")
        if len(_LABEL_NAMES) < _KEPT_LABEL_NAMES:
            _LABEL_NAMES.add(key)
    return labels


_LABEL_NAMES: set[str] = set()  # label names that clash with no output column, as found so far
_KEPT_LABEL_NAMES = 4096  # at most (a store whose every rollout names new labels only pays the check each time)


def _strings(raw: Any, name: str) -> dict[str, str]:
    """An object of labels or attributes as string values (others as JSON text; null values dropped)."""
    raw = _json_field(raw, name) or {}
    if isinstance(raw, list) and all(isinstance(kv, list | tuple) and len(kv) == 2 for kv in raw):
        raw = dict(raw)  # Parquet maps arrive as [(key, value), ...]
    if not isinstance(raw, dict):
        raise InvalidRecord(f"'{name}' must be an object")
    if any(str(key) == "" for key in raw):
        raise InvalidRecord(f"'{name}' has an empty name")
    return {
        str(key): value if isinstance(value, str) else orjson.dumps(value).decode()
        for key, value in raw.items()
        if value is not None
    }


def _cost(raw: Any) -> dict[str, float]:
    raw = _json_field(raw, "cost") or {}
    if not isinstance(raw, dict):
        raise InvalidRecord("'cost' must be an object")
    cost = {}
    for key, value in raw.items():
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise InvalidRecord(f"cost {key!r} must be a number, got {value!r}")
        try:
            number = float(value)
        except OverflowError:
            raise InvalidRecord(f"cost {key!r} is an integer beyond any float") from None
        if not math.isfinite(number):  # NaN or infinity would poison every mean it enters
            raise InvalidRecord(f"cost {key!r} must be a finite number, got {value!r}")
        cost[str(key)] = number
    return cost


def parse_event(raw: Any, where: str) -> Event:
    """One event of a canonical record; `where` names it in the error (`events[3]`)."""
    if not isinstance(raw, dict):
        raise InvalidRecord(f"{where} is not an object")
    kind = raw.get("type")
    turn = raw.get("turn") or 0
    if not isinstance(turn, int):
        raise InvalidRecord(f"{where}.turn must be an integer")
    if kind == "message":
        content = raw.get("content")
        if content is None:
            content = ""
        elif not isinstance(content, str):
            content = orjson.dumps(content).decode()
        return Message(role=str(raw.get("role", "")), content=content, turn=turn)
    if kind == "call":
        tool = raw.get("tool")
        if not isinstance(tool, str) or not tool:
            raise InvalidRecord(f"{where}: a call needs a 'tool' name")
        error = raw.get("error")
        if error is not None and not isinstance(error, bool):
            raise InvalidRecord(f"{where}.error must be true, false or null")
        call_id = raw.get("call_id")
        actor = raw.get("actor") or "agent"
        if actor not in ACTORS:
            raise InvalidRecord(f"{where}.actor must be agent or user")
        version = raw.get("tools_version") or 0
        if not isinstance(version, int) or isinstance(version, bool) or version < 0:
            raise InvalidRecord(f"{where}.tools_version must be a non-negative integer")
        call = Call(
            tool=tool,
            arguments=raw.get("arguments", {}),
            # null and absent both mean "nothing logged" (Parquet cannot tell them apart).
            output=raw["output"] if raw.get("output") is not None else NOT_LOGGED,
            error=error,
            turn=turn,
            call_id=str(call_id) if call_id is not None else None,
            actor=actor,
            tools_version=version,
        )
        check_call_names(call, where)
        return call
    raise InvalidRecord(f"{where}: unknown event type {kind!r} (expected 'message' or 'call')")


def event_record(event: Event) -> dict[str, Any]:
    """The canonical form of an event, as `parse_event` reads it."""
    if isinstance(event, Message):
        return {"type": "message", "role": event.role, "content": event.content, "turn": event.turn}
    out: dict[str, Any] = {"type": "call", "tool": event.tool, "arguments": event.arguments, "turn": event.turn}
    if event.call_id is not None:
        out["call_id"] = event.call_id
    if event.output is not NOT_LOGGED:
        out["output"] = event.output
    if event.error is not None:
        out["error"] = event.error
    if event.actor != "agent":
        out["actor"] = event.actor
    if event.tools_version:
        out["tools_version"] = event.tools_version
    return out


def _json_field(value: Any, name: str) -> Any:
    # Parquet stores free-form objects as JSON text.
    if isinstance(value, str):
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise InvalidRecord(f"{name!r} is a string that is not JSON: {exc}") from exc
        check_depth(value, repr(name))
    return value
