"""The evidence a draft spec is proposed from, as small sums: what one shard's rollouts show (`observe`), merged
across shards by adding counts (`Evidence.merge`), so no process holds more than one shard's rollouts and the
evidence itself is bounded by the number of tools, parameters and distinct definitions, not by the night.

Per tool: the calls; the distinct definitions the log recorded (each with the conversations and calls under it and
the first and last date); per argument path (`order_id`, `address.zip`, `items[].product_id`), over the calls the
log does not show failing (a failing call may fail for the very value it invented), how many values were seen, how
many occurred earlier in the conversation (a user or system message, an earlier output: the sources D checks, by the
checker's own `History`), how many of those only in a message (what the user or the operator said, not what a tool
returned), how many look like identifiers, and two bottom-k sketches (the k smallest hashes, which merge exactly:
the k smallest of a union are the k smallest of the parts' k smallest): of the values, with their counts (how many
distinct values, and whether one of them is nearly every call's), and of the (task, value) pairs (how many tasks
use each value). Per tool and error template: the failing calls, and per
candidate condition over what the agent had seen (`seen.<tool>.<field>` of an earlier accepted output linked to the
call by a shared value) how many calls it held for and how many of those failed with that template.
"""

from __future__ import annotations

import bisect
import hashlib
import re
from collections import Counter
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import orjson

from pipeline.core.model import NOT_LOGGED, Call, Message, Rollout
from pipeline.replay.dependencies import History, resolve_references

# Bounds of the evidence (docs/reference/limits.md): past them a shard counts what it drops.
MAX_TOOLS = 1_000  # distinct tool names
MAX_PATHS = 64  # argument paths per tool
MAX_VARIANTS = 16  # distinct definitions kept per tool
MAX_TEMPLATES = 32  # error templates per tool
MAX_CONDITIONS = 512  # candidate conditions per tool
MAX_ITEMS = 64  # items of a list argument looked into
MAX_TEXT = 200  # characters of a value or field considered (longer is free text)
SKETCH = 64  # hashes a bottom-k sketch keeps per argument path (distinct values counted exactly up to it)
# An identifier: no spaces, and a digit, an `@` or a `/` in it (C104, O5521, ava@example.com, /srv/a1).
_IDENTIFIER = re.compile(r"^(?=.*[\d@/])[\w.:/#@+-]{2,128}$")
_VARIABLE = re.compile(r"'[^']*'|\"[^\"]*\"|[\w.:/#@+-]*\d[\w.:/#@+-]*")  # quoted text, tokens holding a digit

Condition = tuple[str, str, str, str, str]  # (seen tool, its field linked to, argument, field, value as JSON)


@dataclass
class Variant:
    conversations: int = 0
    calls: int = 0
    first: str = ""
    last: str = ""


@dataclass
class PathCount:
    values: int = 0  # values seen at the path, in calls the log does not show failing
    known: int = 0  # of which occurred earlier in the conversation
    identifiers: int = 0  # of which look like identifiers
    from_messages: int = 0  # of the known, those that occurred earlier only in a message, in no earlier output
    distinct: dict[int, int] = field(default_factory=dict)  # bottom-k: value hash -> calls with the value
    pairs: list[int] = field(default_factory=list)  # bottom-k, ascending: hashes of (task, value)

    def add(self, value: Any, task: str, known: bool, from_messages: bool, identifier: bool) -> None:
        self.values += 1
        self.known += known
        self.from_messages += from_messages
        self.identifiers += identifier
        try:
            text = orjson.dumps(value)
        except orjson.JSONEncodeError:  # an integer past 64 bits
            text = str(value).encode()
        key = _hash(text)
        if key in self.distinct or len(self.distinct) < SKETCH or key < max(self.distinct):
            self.distinct[key] = self.distinct.get(key, 0) + 1
            if len(self.distinct) > SKETCH:
                del self.distinct[max(self.distinct)]
        pair = _hash(task.encode() + b"\x00" + text)
        at = bisect.bisect_left(self.pairs, pair)
        if at < SKETCH and (at == len(self.pairs) or self.pairs[at] != pair):
            self.pairs.insert(at, pair)
            del self.pairs[SKETCH:]

    def merge(self, other: PathCount) -> None:
        self.values += other.values
        self.known += other.known
        self.from_messages += other.from_messages
        self.identifiers += other.identifiers
        for key, n in other.distinct.items():
            self.distinct[key] = self.distinct.get(key, 0) + n
        for key in sorted(self.distinct)[SKETCH:]:
            del self.distinct[key]
        self.pairs = _smallest(self.pairs, other.pairs)


def _hash(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "big")


def _smallest(a: list[int], b: list[int]) -> list[int]:
    """The SKETCH smallest distinct hashes of two sketches."""
    return sorted(set(a).union(b))[:SKETCH]


def estimate(sketch: Collection[int]) -> float:
    """The distinct hashes a bottom-k sketch stands for: exact below SKETCH, else (k - 1) / the k-th smallest hash
    as a share of the hash space."""
    if len(sketch) < SKETCH:
        return float(len(sketch))
    return (SKETCH - 1) / (max(sketch) / 2**64)


@dataclass
class ToolEvidence:
    calls: int = 0
    captured: int = 0  # calls whose arguments were captured and parse as an object
    failed: int = 0  # calls the log shows failing
    variants: dict[bytes, Variant] = field(default_factory=dict)  # definition (sorted JSON) -> where it was seen
    paths: dict[str, PathCount] = field(default_factory=dict)
    templates: Counter[str] = field(default_factory=Counter)  # error template -> failing calls
    examples: dict[str, str] = field(default_factory=dict)  # error template -> one message with it
    held: Counter[Condition] = field(default_factory=Counter)  # condition -> calls it held for
    failed_with: Counter[tuple[Condition, str]] = field(default_factory=Counter)  # (condition, template) -> failing
    dropped: int = 0  # paths, variants, templates or conditions past the bounds


@dataclass
class Evidence:
    rollouts: int = 0
    calls: int = 0
    first_date: str = ""
    last_date: str = ""
    tools: dict[str, ToolEvidence] = field(default_factory=dict)
    dropped_tools: int = 0

    def merge(self, other: Evidence) -> Evidence:
        """The sum of two shards' evidence (in place; returns self)."""
        self.rollouts += other.rollouts
        self.calls += other.calls
        self.first_date = (
            min(d for d in (self.first_date, other.first_date) if d) if (self.first_date or other.first_date) else ""
        )
        self.last_date = max(self.last_date, other.last_date)
        self.dropped_tools += other.dropped_tools
        for name, theirs in other.tools.items():
            mine = self._tool(name)
            if mine is None:
                self.dropped_tools += 1
                continue
            mine.calls += theirs.calls
            mine.captured += theirs.captured
            mine.failed += theirs.failed
            mine.dropped += theirs.dropped
            for key, v in theirs.variants.items():
                here = _bounded(mine, mine.variants, key, MAX_VARIANTS, Variant)
                if here is not None:
                    here.conversations += v.conversations
                    here.calls += v.calls
                    here.first = _earliest(here.first, v.first)
                    here.last = max(here.last, v.last)
            for path, c in theirs.paths.items():
                count = _bounded(mine, mine.paths, path, MAX_PATHS, PathCount)
                if count is not None:
                    count.merge(c)
            for template, n in theirs.templates.items():
                if template in mine.templates or len(mine.templates) < MAX_TEMPLATES:
                    mine.templates[template] += n
                    mine.examples.setdefault(template, theirs.examples.get(template, ""))
                else:
                    mine.dropped += 1
            for cond, n in theirs.held.items():
                if cond in mine.held or len(mine.held) < MAX_CONDITIONS:
                    mine.held[cond] += n
                else:
                    mine.dropped += 1
            mine.failed_with.update({k: n for k, n in theirs.failed_with.items() if k[0] in mine.held})
        return self

    def _tool(self, name: str) -> ToolEvidence | None:
        if name not in self.tools:
            if len(self.tools) >= MAX_TOOLS:
                return None
            self.tools[name] = ToolEvidence()
        return self.tools[name]


def _earliest(a: str, b: str) -> str:
    """The earlier of two dates, either of which may be unknown (empty)."""
    return min(a, b) if a and b else a or b


def _bounded(tool: ToolEvidence, table: dict[Any, Any], key: Any, limit: int, make: Any) -> Any:
    if key not in table:
        if len(table) >= limit:
            tool.dropped += 1
            return None
        table[key] = make()
    return table[key]


def observe(rollouts: list[Rollout] | Any, evidence: Evidence | None = None) -> Evidence:
    """The evidence of `rollouts` (any iterable), added to `evidence` when given."""
    out = evidence if evidence is not None else Evidence()
    for rollout in rollouts:
        _observe(rollout, out)
    return out


def _observe(rollout: Rollout, out: Evidence) -> None:
    out.rollouts += 1
    day = rollout.labels.get("date", "")
    if day:
        out.first_date = min(out.first_date, day) if out.first_date else day
        out.last_date = max(out.last_date, day)
    versions = _versions(rollout)
    # What D checks, in two parts: the earlier outputs (and the references to them), and the user and system
    # messages; a value is known when either holds it, and came from a message when only the messages do.
    history = History()
    messages = History()
    seen: dict[str, Any] = {}  # tool -> last output of an accepted call, decoded
    used: set[tuple[str, bytes]] = set()  # (tool, definition) already counted for this conversation
    depth = 0
    for event in rollout.events:
        if isinstance(event, Message):
            if event.role in ("user", "system"):
                messages.add_message(event.content)
            continue
        depth += 1
        out.calls += 1
        tool = out._tool(event.tool)
        if tool is None:
            out.dropped_tools += 1
            continue
        tool.calls += 1
        definition = _definition(versions, event)
        if definition is not None:
            variant = _bounded(tool, tool.variants, definition, MAX_VARIANTS, Variant)
            if variant is not None:
                variant.calls += 1
                if (event.tool, definition) not in used:
                    used.add((event.tool, definition))
                    variant.conversations += 1
                    variant.first = _earliest(variant.first, day)
                    variant.last = max(variant.last, day)
        args = _arguments(event)
        if args is not None:
            tool.captured += 1
        if args is not None and not event.error:  # a failing call may fail for the very value it invented
            # An explicit reference to an earlier output is grounded by construction, as the checker has it.
            resolved, _, holders = resolve_references(args, history, depth)
            for path, value in _values(resolved):
                count = _bounded(tool, tool.paths, path, MAX_PATHS, PathCount)
                if count is not None:
                    referenced = path.split(".")[0].removesuffix("[]") in holders
                    in_outputs = referenced or history.knows(value)
                    from_messages = not in_outputs and messages.knows(value)
                    known = in_outputs or from_messages
                    identifier = isinstance(value, str) and bool(_IDENTIFIER.match(value))
                    count.add(value, rollout.task_id, known, from_messages, identifier)
        template = None
        if event.error:
            tool.failed += 1
            message = "" if event.output is NOT_LOGGED or event.output is None else str(event.output)
            template = template_of(message)
            if template in tool.templates or len(tool.templates) < MAX_TEMPLATES:
                tool.templates[template] += 1
                tool.examples.setdefault(template, message[:MAX_TEXT])
            else:
                tool.dropped += 1
                template = None
        if args is not None:
            for cond in _conditions(seen, args):
                if cond in tool.held or len(tool.held) < MAX_CONDITIONS:
                    tool.held[cond] += 1
                    if template is not None:
                        tool.failed_with[(cond, template)] += 1
                else:
                    tool.dropped += 1
        accepted = not event.error
        output = None if event.output is NOT_LOGGED else event.output
        history.add_result(depth, event.call_id, accepted, output)
        if accepted:
            seen[event.tool] = _decoded(output)


def template_of(message: str) -> str:
    """An error message with what varies between calls (quoted text, tokens holding a digit) as `<…>`."""
    return _VARIABLE.sub("<…>", " ".join(message.split())[:MAX_TEXT]) or "(no message)"


def _versions(rollout: Rollout) -> list[bytes]:
    env = rollout.env
    sets = env.get("tool_versions")
    if not isinstance(sets, list):
        sets = [env["tools"]] if isinstance(env.get("tools"), dict) else []
    return [orjson.dumps(s, option=orjson.OPT_SORT_KEYS) for s in sets if isinstance(s, dict)]


def _definition(versions: list[bytes], call: Call) -> bytes | None:
    """The definition of the called tool in the set in force at the call (sorted JSON); None when none."""
    if call.tools_version >= len(versions):
        return None
    schema = orjson.loads(versions[call.tools_version]).get(call.tool)
    return None if schema is None else orjson.dumps(schema, option=orjson.OPT_SORT_KEYS)


def _arguments(call: Call) -> dict[str, Any] | None:
    args = call.arguments
    if isinstance(args, str):
        try:
            args = orjson.loads(args) if args.strip() else {}
        except orjson.JSONDecodeError:
            return None
    return args if isinstance(args, dict) else None


def _values(args: dict[str, Any]) -> list[tuple[str, Any]]:
    """(path, value) of the scalar values a grounded parameter could name: top-level arguments, the items of a list
    argument (the path is the argument's, as the checker reads it), and the fields of an object argument (`a.b`)."""
    out: list[tuple[str, Any]] = []
    for key, value in sorted(args.items()):
        if isinstance(value, dict):
            out += [(f"{key}.{k}", v) for k, v in sorted(value.items()) if _groundable(v)]
        elif isinstance(value, list):
            out += [(key, v) for v in value if _groundable(v)]
            for item in value[:MAX_ITEMS]:  # a list of objects: `items[].product_id`
                if isinstance(item, dict):
                    out += [(f"{key}[].{k}", v) for k, v in sorted(item.items()) if _groundable(v)]
        elif _groundable(value):
            out.append((key, value))
    return out


def _groundable(value: Any) -> bool:
    if isinstance(value, bool) or value is None:
        return False
    if isinstance(value, str):
        return 0 < len(value) <= MAX_TEXT
    return isinstance(value, int | float)


def _conditions(seen: dict[str, Any], args: dict[str, Any]) -> list[Condition]:
    """The conditions that hold at a call: for each earlier accepted output (an object) that shares a value with a
    top-level argument (its link), each of its short scalar fields with its value."""
    out: list[Condition] = []
    scalars = {k: v for k, v in args.items() if isinstance(v, str | int) and not isinstance(v, bool)}
    for tool, output in sorted(seen.items()):
        if not isinstance(output, dict):
            continue
        link = next(((k, a) for k, v in sorted(output.items()) for a, w in sorted(scalars.items()) if v == w), None)
        if link is None:
            continue
        for name, value in sorted(output.items()):
            if name != link[0] and _categorical(value):
                out.append((tool, link[0], link[1], name, orjson.dumps(value).decode()))
    return out


def _categorical(value: Any) -> bool:
    return isinstance(value, bool) or (isinstance(value, str) and 0 < len(value) <= 40)


def _decoded(output: Any) -> Any:
    if isinstance(output, str):
        try:
            return orjson.loads(output)
        except orjson.JSONDecodeError:
            return output
    return output
