"""Canonical rollout records (docs/design.md §4): validate a decoded JSON object and build a Rollout.

A record that cannot be scored raises InvalidRecord with a reason that ends up in `rejects/`. Records are
walked recursively further on (references, hashing, comparisons, Arrow), so nesting is limited here.
"""

from __future__ import annotations

import math
from typing import Any

import orjson

from pipeline.errors import PexecError
from pipeline.model import NOT_LOGGED, Call, Event, Message, Rollout
from pipeline.schema import RESERVED_COLUMNS

MAX_DEPTH = 64  # levels of objects and lists in a record (and in JSON text it carries); deeper is a reject
_RESERVED = frozenset(c.lower() for c in RESERVED_COLUMNS)  # SQL names are case-insensitive


class InvalidRecord(PexecError, ValueError):
    """The record is not a canonical rollout; the message is the reject reason."""


class _TooDeep(Exception):
    pass


def too_deep(value: Any, limit: int = MAX_DEPTH) -> bool:
    """Whether `value` has more than `limit` levels of objects and lists (recursion stops at the limit)."""
    try:
        _descend(value, limit)
    except _TooDeep:
        return True
    return False


def _descend(value: Any, room: int) -> None:
    kind = type(value)
    if kind is not dict and kind is not list:
        return
    if room == 0:
        raise _TooDeep
    for item in value.values() if kind is dict else value:
        kind = type(item)
        if kind is dict or kind is list:  # leaves skip the call: this runs on every record
            _descend(item, room - 1)


def check_depth(value: Any, what: str) -> None:
    if too_deep(value):
        raise InvalidRecord(f"{what} nests deeper than {MAX_DEPTH} levels")


def parse_rollout(record: dict[str, Any]) -> Rollout:
    check_depth(record, "the record")
    for key in ("rollout_id", "task_id", "benchmark"):
        value = record.get(key)
        if not isinstance(value, str | int) or isinstance(value, bool) or value == "":
            raise InvalidRecord(f"missing or invalid {key!r}")
    labels = _labels(record.get("labels"))
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
        events=[_event(e, i) for i, e in enumerate(events)],
        success=success,
        cost=_cost(record.get("cost")),
        truth=_json_field(record.get("truth"), "truth"),
    )


def _labels(raw: Any) -> dict[str, str]:
    raw = _json_field(raw, "labels") or {}
    if isinstance(raw, list):  # Parquet maps arrive as [(key, value), ...]
        try:
            raw = dict(raw)
        except (TypeError, ValueError):
            raise InvalidRecord("'labels' must be an object") from None
    if not isinstance(raw, dict):
        raise InvalidRecord("'labels' must be an object")
    labels = {}
    for key, value in raw.items():
        name = str(key)
        if not name:
            raise InvalidRecord("a label name is empty")
        if name.lower() in _RESERVED or name.lower().startswith("cost_"):
            raise InvalidRecord(f"label {name!r} clashes with an output column name")
        if value is not None:
            labels[name] = value if isinstance(value, str) else orjson.dumps(value).decode()
    return labels


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


def _event(raw: Any, index: int) -> Event:
    if not isinstance(raw, dict):
        raise InvalidRecord(f"events[{index}] is not an object")
    kind = raw.get("type")
    turn = raw.get("turn") or 0
    if not isinstance(turn, int):
        raise InvalidRecord(f"events[{index}].turn must be an integer")
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
            raise InvalidRecord(f"events[{index}]: a call needs a 'tool' name")
        error = raw.get("error")
        if error is not None and not isinstance(error, bool):
            raise InvalidRecord(f"events[{index}].error must be true, false or null")
        call_id = raw.get("call_id")
        return Call(
            tool=tool,
            arguments=raw.get("arguments", {}),
            # null and absent both mean "nothing logged" (Parquet cannot tell them apart).
            output=raw["output"] if raw.get("output") is not None else NOT_LOGGED,
            error=error,
            turn=turn,
            call_id=str(call_id) if call_id is not None else None,
        )
    raise InvalidRecord(f"events[{index}]: unknown event type {kind!r} (expected 'message' or 'call')")


def _json_field(value: Any, name: str) -> Any:
    # Parquet stores free-form objects as JSON text.
    if isinstance(value, str):
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise InvalidRecord(f"{name!r} is a string that is not JSON: {exc}") from exc
        check_depth(value, repr(name))
    return value
