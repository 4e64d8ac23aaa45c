"""Which log format a decoded document looks like, so that an adapter given another format's logs says so in
one line instead of writing rollouts with no calls."""

from __future__ import annotations

from typing import Any

_ANTHROPIC_BLOCKS = {"tool_use", "tool_result"}


def likely_format(doc: Any) -> str | None:
    """The format `doc` (one decoded JSON document, or a conversation record) looks like, when it is clear."""
    if isinstance(doc, dict):
        for key, fmt in (("resourceSpans", "otel"), ("simulations", "tau2"), ("per_scenario_results", "toolsandbox")):
            if key in doc:
                return fmt
        doc = doc.get("messages")
    if not isinstance(doc, list):
        return None
    for m in doc:
        if not isinstance(m, dict):
            continue
        if m.get("tool_calls") or m.get("role") in ("tool", "function") or m.get("function_call"):
            return "openai"
        content = m.get("content")
        if isinstance(content, list) and any(
            isinstance(b, dict) and b.get("type") in _ANTHROPIC_BLOCKS for b in content
        ):
            return "anthropic"
    return None


def mismatch(fmt: str, doc: Any) -> str | None:
    """` (it looks like X logs: pexec ingest X)` when `doc` clearly belongs to another format X, else None."""
    other = likely_format(doc)
    return f" (it looks like {other} logs: pexec ingest {other})" if other not in (None, fmt) else None
