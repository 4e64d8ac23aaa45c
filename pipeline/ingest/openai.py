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

from collections.abc import Callable
from functools import partial
from typing import Any

from pipeline.core.errors import IngestError
from pipeline.core.model import Message, Rollout
from pipeline.ingest._logs import (
    ChatFormat,
    LogSettings,
    call_event,
    log_options,
    rollout_of,
    text,
    tool_definitions,
    tool_dialect,
)
from pipeline.ingest._pairing import Call, Result, TypedEntry, assemble_events
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
        events, attributes = assemble_events(log(record["messages"], s, where))
        tools = tool_definitions(record.get("tools")) or tool_definitions(record.get("functions"))
        return rollout_of(s, record, events, where, attributes, env={"tools": tools} if tools else None)


FORMAT = OpenAI()

_LEGACY = ("legacy function call",)  # the key of legacy calls and results: they pair in order


def log(messages: list[Any], s: LogSettings, where: str) -> list[TypedEntry]:
    out: list[TypedEntry] = []
    append = out.append
    prefix = s.own.get("error_prefix")
    turn = 0
    # Runs for every message of every conversation: places are formatted only when something needs one.
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
            if role == "assistant":
                _calls(m, where, i, turn, append)
        elif role in ("tool", "function"):
            append(_result(m, prefix, where, i, turn))
    return out


def _calls(m: dict[str, Any], where: str, i: int, turn: int, append: Callable[[TypedEntry], None]) -> None:
    """An assistant message's calls: `tool_calls`, then a legacy `function_call`."""
    for j, tc in enumerate(m.get("tool_calls") or ()):
        fn = tc.get("function") if isinstance(tc, dict) else None
        here = f"{where} messages[{i}].tool_calls[{j}]"
        if not isinstance(fn, dict):
            raise IngestError(f"openai: {here}: expected {{'id', 'function': {{'name', 'arguments'}}}}")
        call_id = tc.get("id")
        append(Call(call_id, partial(call_event, fn.get("name"), fn.get("arguments"), call_id, turn, where=here)))
    fc = m.get("function_call")
    if isinstance(fc, dict):
        at = f"{where} messages[{i}]"
        append(Call(_LEGACY, partial(call_event, fc.get("name"), fc.get("arguments"), None, turn, where=at)))


def _result(m: dict[str, Any], prefix: str | None, where: str, i: int, turn: int) -> Result:
    """A `role: tool` result (keyed by `tool_call_id`) or a legacy `role: function` one."""
    content = m.get("content")
    if type(content) is not str:
        content = text(content)
    error = m.get("error")
    if not isinstance(error, bool):
        error = content.startswith(prefix) if prefix else None
    if m["role"] == "function":
        return Result(_LEGACY, (content, error), content, turn)
    key = m.get("tool_call_id")
    if key is None:
        raise IngestError(f"openai: {where} messages[{i}]: a tool message without 'tool_call_id'")
    return Result(key, (content, error), content, turn)
