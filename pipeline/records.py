"""Canonical rollout records (docs/design.md §4): validate a decoded JSON object and build a Rollout.

A record that cannot be scored raises InvalidRecord with a reason that ends up in `rejects/`.
"""

from __future__ import annotations

from typing import Any

import orjson

from pipeline.errors import PexecError
from pipeline.model import NOT_LOGGED, STATUSES, Call, Event, Message, Rollout
from pipeline.schema import ATTRIBUTE_PREFIX, RESERVED_COLUMNS


class InvalidRecord(PexecError, ValueError):
    """The record is not a canonical rollout; the message is the reject reason."""


def parse_rollout(record: dict[str, Any]) -> Rollout:
    for key in ("rollout_id", "task_id", "benchmark"):
        value = record.get(key)
        if not isinstance(value, str | int) or isinstance(value, bool) or value == "":
            raise InvalidRecord(f"missing or invalid {key!r}")
    labels = _labels(record.get("labels"))
    attributes = _strings(record.get("attributes"), "attributes")
    both = sorted(set(labels) & set(attributes))
    if both:
        raise InvalidRecord(f"{', '.join(map(repr, both))} is both a label and an attribute")
    status = record.get("status") or "ok"
    if status not in STATUSES:
        raise InvalidRecord(f"'status' must be one of {', '.join(STATUSES)}, got {status!r}")
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
        attributes=attributes,
        status=status,
    )


def record_id(record: dict[str, Any]) -> str | None:
    """The record's rollout id as `parse_rollout` reads it, or None when it has no valid one."""
    value = record.get("rollout_id")
    if not isinstance(value, str | int) or isinstance(value, bool) or value == "":
        return None
    return str(value)


def _labels(raw: Any) -> dict[str, str]:
    labels = _strings(raw, "labels")
    for key in labels:
        if key in RESERVED_COLUMNS or key.startswith(("cost_", ATTRIBUTE_PREFIX)):
            raise InvalidRecord(f"label {key!r} clashes with an output column name")
    return labels


def _strings(raw: Any, name: str) -> dict[str, str]:
    """An object of labels or attributes as string values (others as JSON text; null values dropped)."""
    raw = _json_field(raw, name) or {}
    if isinstance(raw, list) and all(isinstance(kv, list | tuple) and len(kv) == 2 for kv in raw):
        raw = dict(raw)  # Parquet maps arrive as [(key, value), ...]
    if not isinstance(raw, dict):
        raise InvalidRecord(f"'{name}' must be an object")
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
        cost[str(key)] = float(value)
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
            return orjson.loads(value)
        except orjson.JSONDecodeError as exc:
            raise InvalidRecord(f"{name!r} is a string that is not JSON: {exc}") from exc
    return value
