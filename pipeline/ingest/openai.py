"""`openai`: chat-completions message lists -> canonical rollouts, one per conversation.

A source is a file or folder (searched recursively) of `.json`/`.jsonl` files. A conversation is an object
with a `messages` list (its other fields give ids, labels and success, see `pipeline.ingest._logs`), or a bare
message list. Mapping:
- `system`/`developer`/`user`/`assistant` text -> message events (`developer` as `system`); a user message
  starts a new turn;
- assistant `tool_calls[]` -> calls in logged order: `function.name`, `function.arguments` kept as raw JSON
  text (text that does not parse is an S failure), `id` -> `call_id`; legacy `function_call` -> one call;
- `role: tool` (paired by `tool_call_id` as `pipeline.ingest._pairing` says: a repeated id answers the
  earliest unanswered call) and legacy `role: function` (answering legacy calls in order) -> the call's
  `output`; `error` = the message's own boolean `error` field when the logger wrote one, else whether the
  content starts with `--option error_prefix=TEXT` when given, else not logged. A call with no result
  message has no output and no error; a result that answers no call is a `tool` message (`orphan_results`);
- the record's `tools` (chat-completions or Responses API tools; legacy `functions`) -> `env.tools`, the
  definitions S is checked against when no spec declares the tool. Absent: no definitions (a spec's schemas,
  else only well-formedness).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Hashable
from typing import Any

from pipeline.core.errors import IngestError
from pipeline.core.model import NOT_LOGGED, Call, Event, Message, Rollout
from pipeline.ingest._logs import (
    ChatFormat,
    LogSettings,
    log_options,
    no_tool_name,
    rollout_of,
    text,
    tool_definitions,
    tool_dialect,
)
from pipeline.ingest._pairing import id_key
from pipeline.ingest.base import Option

_CONTEXT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
ERROR_PREFIX = Option("error_prefix", "a tool message with no boolean `error` is an error if it starts with this text")


class OpenAI(ChatFormat):
    name = "openai"
    options = log_options(ERROR_PREFIX)

    def looks_like(self, doc: Any) -> bool:
        return tool_dialect(doc) == "openai"

    def convert(self, s: LogSettings, where: str, record: dict[str, Any]) -> Rollout:
        """The rollout of one conversation record."""
        events, attributes = paired_events(record["messages"], s, where)
        tools = tool_definitions(record.get("tools")) or tool_definitions(record.get("functions"))
        return rollout_of(s, record, events, where, attributes, env={"tools": tools} if tools else None)


FORMAT = OpenAI()

_LEGACY = ("legacy function call",)  # the key of legacy calls and results: they pair in order
_LEGACY_ID = id_key(_LEGACY)


def paired_events(messages: list[Any], s: LogSettings, where: str) -> tuple[list[Event], dict[str, str]]:
    """A conversation's events, in one walk: each call is built as it is logged, and a result fills in the earliest
    unanswered call of its id (`pipeline.ingest._pairing`'s rule, ids compared as `pair` compares them) or is kept
    as an orphan `tool` message where it was logged. What the shared rule's `assemble_events` makes of the
    conversation as pairing entries, errors included and in the same order (the walk's own first, then the first
    call without a tool name); tests/test_pairing.py holds the two to each other, without an entry per call and
    result here."""
    out: list[Event] = []
    append = out.append
    prefix = s.own.get("error_prefix")
    waiting: dict[Hashable, deque[Call]] = {}
    unnamed: IngestError | None = None  # the first call without a tool name, raised once the walk has ended
    orphans = 0
    turn = 0
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise IngestError(f"openai: {where} messages[{i}]: a message must be an object")
        role = m.get("role")
        if role == "user":
            turn += 1
        if role in _CONTEXT_ROLES:
            content = m.get("content")
            said = content if type(content) is str else text(content)
            if said:
                append(Message(_CONTEXT_ROLES[role], said, turn))
            if role != "assistant":
                continue
            for j, tc in enumerate(m.get("tool_calls") or ()):
                fn = tc.get("function") if isinstance(tc, dict) else None
                if not isinstance(fn, dict):
                    here = f"{where} messages[{i}].tool_calls[{j}]"
                    raise IngestError(f"openai: {here}: expected {{'id', 'function': {{'name', 'arguments'}}}}")
                call_id = tc.get("id")
                name = fn.get("name")
                if not isinstance(name, str) or not name:
                    if unnamed is None:
                        unnamed = no_tool_name(f"{where} messages[{i}].tool_calls[{j}]")
                    continue
                logged_id = None if call_id is None else str(call_id)
                call = Call(name, fn.get("arguments"), NOT_LOGGED, None, turn, logged_id)
                append(call)
                key = call_id if call_id is None or type(call_id) is str else id_key(call_id)
                queue = waiting.get(key)
                if queue is None:
                    waiting[key] = deque((call,))
                else:
                    queue.append(call)
            fc = m.get("function_call")
            if isinstance(fc, dict):
                name = fc.get("name")
                if not isinstance(name, str) or not name:
                    if unnamed is None:
                        unnamed = no_tool_name(f"{where} messages[{i}]")
                    continue
                call = Call(name, fc.get("arguments"), NOT_LOGGED, None, turn, None)
                append(call)
                queue = waiting.get(_LEGACY_ID)
                if queue is None:
                    waiting[_LEGACY_ID] = deque((call,))
                else:
                    queue.append(call)
        elif role in ("tool", "function"):
            content = m.get("content")
            if type(content) is not str:
                content = text(content)
            error = m.get("error")
            if not isinstance(error, bool):
                error = content.startswith(prefix) if prefix else None
            if role == "function":
                key = _LEGACY_ID
            else:
                key = m.get("tool_call_id")
                if key is None:
                    raise IngestError(f"openai: {where} messages[{i}]: a tool message without 'tool_call_id'")
                if type(key) is not str:
                    key = id_key(key)
            queue = waiting.get(key)
            if queue:
                answered = queue.popleft()
                answered.output = content
                answered.error = error
            else:
                orphans += 1
                append(Message("tool", content, turn))
    if unnamed is not None:
        raise unnamed
    return out, ({"orphan_results": str(orphans)} if orphans else {})
