"""`anthropic`: Messages API conversations -> canonical rollouts, one per conversation.

A source is a file or folder (searched recursively) of `.json`/`.jsonl` files. A conversation is an object
with a `messages` list and an optional `system` prompt (its other fields give ids, labels and success, see
`pipeline.ingest._logs`), or a bare message list. Mapping:
- `system` and `text` blocks (or string content) -> message events; a user message with text starts a
  new turn (a user message holding only `tool_result` blocks does not);
- `tool_use` blocks -> calls in logged order: `name`, `input` (an object, or raw JSON text when the logger
  kept the streamed text), `id` -> `call_id`;
- `tool_result` blocks (paired by `tool_use_id` as `pipeline.ingest._pairing` says) -> the call's `output`
  (text of `content`) and `error` = `is_error` (false when absent). A call with no result block has no output
  and no error; a result that answers no call is a `tool` message (`orphan_results`);
- the record's `tools` (`name`, `input_schema`) -> `env.tools`, the definitions S is checked against when no
  spec declares the tool. Absent: no definitions (a spec's schemas, else only well-formedness).
"""

from __future__ import annotations

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


class Anthropic(ChatFormat):
    name = "anthropic"
    options = log_options()

    def looks_like(self, doc: Any) -> bool:
        return tool_dialect(doc) == "anthropic"

    def convert(self, s: LogSettings, where: str, record: dict[str, Any]) -> Rollout:
        """The rollout of one conversation record."""
        events, attributes = assemble_events(log(record, where))
        tools = tool_definitions(record.get("tools"))
        return rollout_of(s, record, events, where, attributes, env={"tools": tools} if tools else None)


FORMAT = Anthropic()


def log(record: dict[str, Any], where: str) -> list[TypedEntry]:
    out: list[TypedEntry] = []
    if text(record.get("system")):
        out.append(Message("system", text(record["system"]), 0))
    turn = 0
    for i, m in enumerate(record["messages"]):
        role, bs = m.get("role") if isinstance(m, dict) else None, _blocks(m, f"{where} messages[{i}]")
        said = "\n".join(b["text"] for b in bs if b.get("type") == "text" and isinstance(b.get("text"), str))
        if role == "user" and said:
            turn += 1
        if said and role in ("user", "assistant"):
            out.append(Message(role, said, turn))
        for j, b in enumerate(bs):
            if b.get("type") == "tool_use" and role == "assistant":
                at = f"{where} messages[{i}].content[{j}]"
                build = partial(call_event, b.get("name"), b.get("input"), b.get("id"), turn, where=at)
                out.append(Call(b.get("id"), build))
            elif b.get("type") == "tool_result":
                content = text(b.get("content"))
                out.append(Result(b.get("tool_use_id"), (content, bool(b.get("is_error", False))), content, turn))
    return out


def _blocks(m: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(m, dict):
        raise IngestError(f"anthropic: {where}: a message must be an object")
    content = m.get("content")
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list) or not all(isinstance(b, dict) for b in content):
        raise IngestError(f"anthropic: {where}: 'content' must be a string or a list of blocks")
    return content
