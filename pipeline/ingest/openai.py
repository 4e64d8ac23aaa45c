"""`openai`: chat-completions message lists -> canonical rollouts, one per conversation.

A source is a file or folder (searched recursively) of `.json`/`.jsonl` files. A conversation is an object
with a `messages` list (its other fields give ids, labels and success, see `pipeline.ingest._logs`), or a bare
message list. Mapping:
- `system`/`developer`/`user`/`assistant` text -> message events (`developer` as `system`); a user message
  starts a new turn;
- assistant `tool_calls[]` -> calls in logged order: `function.name`, `function.arguments` kept as raw JSON
  text (text that does not parse is an S failure), `id` -> `call_id`; legacy `function_call` -> one call;
- `role: tool` (matched by `tool_call_id`) and legacy `role: function` (matched by `name`) -> the call's
  `output`; `error` = the message's own boolean `error` field when the logger wrote one, else whether the
  content starts with `--option error_prefix=TEXT` when given, else not logged. A call with no result
  message has no output and no error.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from pipeline.ingest import IngestError, IngestOptions
from pipeline.ingest._logs import LogSettings, call, conversations, message, rollout, settings, text

OPTIONS = frozenset({"error_prefix"})
_CONTEXT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def read(sources: Sequence[str], options: IngestOptions) -> Iterator[dict]:
    s = settings("openai", options, OPTIONS)
    for where, record in conversations("openai", sources, options):
        yield rollout(s, record, events(record["messages"], s, where), where)


def events(messages: list[Any], s: LogSettings, where: str) -> list[dict[str, Any]]:
    results = _results(messages, s, where)
    out: list[dict[str, Any]] = []
    turn = 0
    legacy = 0  # legacy calls are answered in order by `role: function` messages
    for i, m in enumerate(messages):
        at = f"{where} messages[{i}]"
        if not isinstance(m, dict):
            raise IngestError(f"openai: {at}: a message must be an object")
        role = m.get("role")
        if role == "user":
            turn += 1
        if role in _CONTEXT_ROLES and text(m.get("content")):
            out.append(message(_CONTEXT_ROLES[role], text(m.get("content")), turn))
        if role != "assistant":
            continue
        for j, tc in enumerate(m.get("tool_calls") or []):
            fn = tc.get("function") if isinstance(tc, dict) else None
            here = f"{at}.tool_calls[{j}]"
            if not isinstance(fn, dict):
                raise IngestError(f"openai: {here}: expected {{'id', 'function': {{'name', 'arguments'}}}}")
            out.append(call(fn.get("name"), fn.get("arguments"), tc.get("id"), turn, results.get(tc.get("id")), here))
        fc = m.get("function_call")
        if isinstance(fc, dict):
            out.append(call(fc.get("name"), fc.get("arguments"), None, turn, results.get(("legacy", legacy)), at))
            legacy += 1
    return out


def _results(messages: list[Any], s: LogSettings, where: str) -> dict[Any, tuple[Any, bool | None]]:
    """Tool results by `tool_call_id`, and legacy function results by ("legacy", n) in order."""
    found: dict[Any, tuple[Any, bool | None]] = {}
    legacy = 0
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or m.get("role") not in ("tool", "function"):
            continue
        content = text(m.get("content"))
        error = m.get("error")
        if not isinstance(error, bool):
            prefix = s.own.get("error_prefix")
            error = content.startswith(prefix) if prefix else None
        if m["role"] == "function":
            found[("legacy", legacy)] = (content, error)
            legacy += 1
        elif m.get("tool_call_id") is None:
            raise IngestError(f"openai: {where} messages[{i}]: a tool message without 'tool_call_id'")
        else:
            found[m["tool_call_id"]] = (content, error)
    return found
