"""How every adapter pairs logged tool results with tool calls (docs/explanation/data-model.md, "Canonical rollout").

Real agent frameworks reuse call ids within one conversation, so an id alone does not name a call. The rule,
the same for every format: walking the log in order, a result answers the earliest call logged before it that
has the same id and no result yet (a missing id is an id like any other: such results answer such calls in
order). A result that answers no call is an orphan: kept as a `tool` message event where it was logged and
counted in the rollout's attribute `orphan_results` (the CLI warns), never dropped or given to another call.
A call that no result answers has no logged output and no error.
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Callable, Hashable, Sequence
from typing import Any, NamedTuple

import orjson

from pipeline.core.model import Event, Message
from pipeline.core.records import EventRecord, MessageRecord


# Named tuples, not dataclasses: one is made for every logged call and result.
class Call(NamedTuple):
    key: Hashable  # the call's id as logged (None when it has none)
    build: Callable[[Any], Any]  # its call event (a CallRecord, or the model's Call), given its result's `value`


class Result(NamedTuple):
    key: Hashable  # the id of the call it answers, as logged
    value: Any  # what the call's `build` takes
    content: Any  # what an orphan message keeps
    turn: int = 0


Entry = MessageRecord | Call | Result  # a ready event (a message), a call, a result
TypedEntry = Message | Call | Result  # the same, for events built as the model's types


def pair(log: Sequence[Entry | TypedEntry]) -> dict[int, int]:
    """Position of each answered call -> position of its result (positions index `log`)."""
    answers: dict[int, int] = {}
    waiting: dict[Hashable, deque[int]] = defaultdict(deque)
    for position, entry in enumerate(log):
        if type(entry) is Call:
            waiting[id_key(entry.key)].append(position)
        elif type(entry) is Result:
            calls = waiting.get(id_key(entry.key))
            if calls:
                answers[calls.popleft()] = position
    return answers


def id_key(key: Any) -> Hashable:
    """A logged id as a dictionary key: a value a log gives as an id may be a list or an object (hostile, or a
    writer's bug); equal values are the same id."""
    if key is None or isinstance(key, str | int | float):
        return key
    try:
        return ("json", orjson.dumps(key, option=orjson.OPT_SORT_KEYS))
    except TypeError:  # not JSON at all: an id no other entry can repeat
        return ("object", id(key))


def assemble(log: Sequence[Entry]) -> tuple[list[EventRecord], dict[str, str]]:
    """(events in log order, attributes): calls carry their results, orphan results become `tool` messages;
    the attributes count the orphans (`orphan_results`, absent when there are none)."""
    return _assemble(log, _orphan_record)


def assemble_events(log: Sequence[TypedEntry]) -> tuple[list[Event], dict[str, str]]:
    """`assemble` of entries whose messages and calls are built as the model's types."""
    return _assemble(log, Message)


def _orphan_record(role: str, content: str, turn: int) -> MessageRecord:
    return {"type": "message", "role": role, "content": content, "turn": turn}


def _assemble(log: Sequence[Any], orphan: Callable[[str, str, int], Any]) -> tuple[list[Any], dict[str, str]]:
    answers = pair(log)
    answered = set(answers.values())
    events: list[Any] = []
    orphans = 0
    for position, entry in enumerate(log):
        kind = type(entry)
        if kind is Call:
            answer = answers.get(position)
            events.append(entry.build(None if answer is None else log[answer].value))
        elif kind is Result:
            if position not in answered:
                orphans += 1
                events.append(orphan("tool", _text(entry.content), entry.turn))
        else:
            events.append(entry)
    return events, ({"orphan_results": str(orphans)} if orphans else {})


def _text(content: Any) -> str:
    return content if isinstance(content, str) else "" if content is None else str(content)
