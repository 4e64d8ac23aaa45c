"""What the production-log adapters (openai, anthropic, otel, inspect) share: options, ids, labels,
success (a field of the log or a join with an outcomes table), source files, call events, and which chat
dialect a conversation's tool messages speak.

Options (`--option k=v`), the same for every format (`log_options`, where each has its one-line doc):
- `id_field`, `task_field`, `success_field`: dotted paths into a conversation record (a key that itself
  contains dots, such as `gen_ai.conversation.id`, is matched whole first);
- `label.NAME=PATH`: condition label NAME from field PATH (defaults: `model`, `agent_version`, `date`, each
  also looked up under `metadata.`);
- `attr.NAME=PATH`: per-rollout attribute NAME from field PATH (no defaults; e.g. a seed or an end reason);
- `outcomes=PATH`: a CSV or JSON Lines table with `rollout_id` (or `id`) and `success` columns; it
  overrides the log's own success field, and a rollout absent from it has success null;
- `benchmark=NAME`: the canonical `benchmark` (default `observed`, the environment that needs no simulator).
"""

from __future__ import annotations

import csv
import io
from abc import abstractmethod
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import orjson

from pipeline.core.errors import IngestError
from pipeline.core.model import NOT_LOGGED, Call, Event, Rollout
from pipeline.core.records import CallRecord, EventRecord, MessageRecord, event_record, rollout_record
from pipeline.ingest.base import (
    FIELD_PREFIXES,
    RECORD_ERRORS,
    IngestOptions,
    Option,
    OptionSchema,
    Part,
    ShardedFormat,
    TypedPart,
    decode_json,
    line_shards,
    one_line,
    record_error,
    source_inputs,
)
from pipeline.ingest.registry import mismatch
from pipeline.storage.fs import StorageOptions, open_for_read
from pipeline.storage.inputs import MAX_RECORD_ITEMS, line_numbers, raw_text, read_whole, shard_lines
from pipeline.storage.shards import RAW_LIMIT, RecordError, Shard

DEFAULT_LABELS = {"model": "model", "agent_version": "agent_version", "date": "date"}
# what a folder of logs is searched for
LOG_FILES = ("*.json", "*.jsonl", "*.ndjson", "*.jsonl.gz", "*.jsonl.zst", "*.ndjson.gz", "*.ndjson.zst")
_TRUE = {"true", "success", "succeeded", "pass", "passed", "correct", "c", "yes", "1"}
_FALSE = {"false", "failure", "failed", "fail", "incorrect", "i", "partial", "p", "no", "0"}


def log_options(*own: Option, id_field: str = "id", success_field: str = "success") -> OptionSchema:
    """The options of a production-log format: the shared ones (with the format's default id and success
    fields), its `own`, and `label.NAME` / `attr.NAME`."""
    shared = (
        Option("id_field", "dotted path of the rollout id (a key that contains dots is matched whole first)", id_field),
        Option("task_field", "dotted path of the task id (missing: the rollout id)", "task_id"),
        Option("success_field", "dotted path of success (true/false, a score >= 1, C/I, pass/fail...)", success_field),
        Option("outcomes", "CSV or JSON Lines table of rollout_id (or id) and success; overrides the log's success"),
        Option("benchmark", "the rollouts' benchmark: the environment that scores them", "observed"),
    )
    return OptionSchema(shared + own, fields=True)


_SHARED = frozenset(o.key for o in log_options().options)


@dataclass(frozen=True)
class LogSettings:
    fmt: str
    id_field: str
    task_field: str
    success_field: str
    benchmark: str
    label_fields: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_LABELS))
    attribute_fields: dict[str, str] = field(default_factory=dict)
    extra_labels: dict[str, str] = field(default_factory=dict)
    outcomes: dict[str, bool | None] | None = None
    own: dict[str, str] = field(default_factory=dict)  # the format's own options


def settings(fmt: str, options: IngestOptions, labels: Mapping[str, str] | None = None) -> LogSettings:
    """Settings from `--option` values (checked and completed with the defaults of `log_options` by `ingest`);
    `labels`: the format's label fields over `DEFAULT_LABELS`."""
    extra = options.extra
    given = {k.removeprefix("label."): v for k, v in extra.items() if k.startswith("label.")}
    attributes = {k.removeprefix("attr."): v for k, v in extra.items() if k.startswith("attr.")}
    return LogSettings(
        fmt=fmt,
        id_field=extra["id_field"],
        task_field=extra["task_field"],
        success_field=extra["success_field"],
        benchmark=extra["benchmark"],
        label_fields=DEFAULT_LABELS | dict(labels or {}) | given,
        attribute_fields=attributes,
        extra_labels=dict(options.labels),
        outcomes=read_outcomes(fmt, extra["outcomes"], options) if "outcomes" in extra else None,
        own={k: v for k, v in extra.items() if k not in _SHARED and not k.startswith(FIELD_PREFIXES)},
    )


def get_path(obj: Any, path: str) -> Any:
    """The value at a dotted path; None when any part is missing."""
    if not path:
        return obj
    if type(obj) is not dict and not isinstance(obj, Mapping):  # a decoded object is a dict: no ABC check
        return None
    if path in obj:
        return obj[path]
    head, _, rest = path.partition(".")
    return get_path(obj.get(head), rest) if rest else None


def as_success(value: Any, where: str) -> bool | None:
    """A log's success value as true/false/null: booleans, scores (>= 1 is success) and common words."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return value >= 1 - 1e-6
    word = str(value).strip().lower()
    if word in _TRUE:
        return True
    if word in _FALSE:
        return False
    raise IngestError(f"{where}: cannot read {value!r} as success (true/false, a score, C/I, pass/fail)")


def rollout(
    s: LogSettings,
    record: Mapping[str, Any],
    events: list[EventRecord],
    where: str,
    attributes: Mapping[str, str] | None = None,
    harness_error: str | None = None,
    env: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A canonical rollout record for one conversation; `where` names its file and place for errors
    and is the id of last resort. `attributes`: the format's own; `harness_error`: why the harness never
    really ran it (status `harness_error`), None when it did; `env`: the rollout's start (the tool definitions
    the log recorded, `ToolVersions.env`)."""
    head = _head(s, record, where, attributes, harness_error)
    out = {
        "rollout_id": head.rollout_id,
        "task_id": head.task_id,
        "benchmark": head.benchmark,
        "labels": head.labels,
        "attributes": head.attributes,
        "status": head.status,
        "events": events,
        "success": head.success,
    }
    if env:
        out["env"] = dict(env)
    return out


def rollout_of(
    s: LogSettings,
    record: Mapping[str, Any],
    events: list[Event],
    where: str,
    attributes: Mapping[str, str] | None = None,
    env: Mapping[str, Any] | None = None,
) -> Rollout:
    """`rollout` built as the model's Rollout (the checker's input, unchecked: `check_rollout`), whose canonical
    record (`rollout_record`) is the one `rollout` gives."""
    head = _head(s, record, where, attributes, None)
    head.events = events
    if env:
        head.env = dict(env)
    return head


def _head(
    s: LogSettings,
    record: Mapping[str, Any],
    where: str,
    attributes: Mapping[str, str] | None,
    harness_error: str | None,
) -> Rollout:
    """A rollout's ids, labels, attributes, status and success (no events yet)."""
    rollout_id = get_path(record, s.id_field)
    rollout_id = str(rollout_id) if rollout_id not in (None, "") else where
    task_id = get_path(record, s.task_field)
    labels = {}
    for name, path in s.label_fields.items():
        value = get_path(record, path)
        if value is None and path == DEFAULT_LABELS.get(name):
            value = get_path(record, f"metadata.{path}")
        if value is not None:
            labels[name] = _string(value)
    attrs = {name: _string(v) for name, path in s.attribute_fields.items() if (v := get_path(record, path)) is not None}
    attrs |= dict(attributes or {})
    if harness_error is not None:
        attrs["harness_error"] = harness_error
    if s.outcomes is not None:
        success = s.outcomes.get(rollout_id)
    else:
        success = get_path(record, s.success_field)
        if success is not None and type(success) is not bool:  # as_success's answer to these, without its place
            success = as_success(success, f"{where} {s.success_field}")
    return Rollout(
        rollout_id=rollout_id,
        task_id=str(task_id) if task_id not in (None, "") else rollout_id,
        benchmark=s.benchmark,
        labels=labels | s.extra_labels,
        attributes=attrs,
        status="ok" if harness_error is None else "harness_error",
        success=success,
    )


def _string(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return orjson.dumps(value).decode()
    except orjson.JSONEncodeError as exc:  # nested past orjson's 255 levels, or an integer past 64 bits
        raise IngestError(f"a label or attribute value cannot be written as JSON text: {exc}") from None


def call(
    tool: Any, arguments: Any, call_id: Any, turn: int, result: tuple[Any, bool | None] | None, where: str
) -> CallRecord:
    """A call event's canonical record (`call_event`'s)."""
    return cast(CallRecord, event_record(call_event(tool, arguments, call_id, turn, result, where)))


def call_event(
    tool: Any, arguments: Any, call_id: Any, turn: int, result: tuple[Any, bool | None] | None, where: str
) -> Call:
    """A call event. `arguments`: an object, raw JSON text (kept as is: text that does not parse is an S
    failure) or None (not captured: S and D unknown). `result`: (output, error) or None when no result was
    logged (a None output: none logged)."""
    if not isinstance(tool, str) or not tool:
        raise no_tool_name(where)
    output, error = result if result is not None else (None, None)
    return Call(
        tool,
        arguments,
        NOT_LOGGED if output is None else output,
        error,
        turn,
        str(call_id) if call_id is not None else None,
    )


def no_tool_name(where: str) -> IngestError:
    """The error of a call at `where` that has no tool name (a `str` that is not empty)."""
    return IngestError(f"{where}: a tool call without a tool name")


def message(role: str, content: str, turn: int) -> MessageRecord:
    return {"type": "message", "role": role, "content": content, "turn": turn}


def text(content: Any) -> str:
    """Plain text of a message content: a string, or a list of parts/blocks with `text`/`content`."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(t for t in (text(p) for p in content) if t)
    if isinstance(content, dict):
        for key in ("text", "content"):
            if isinstance(content.get(key), str | list):
                return text(content[key])
        return ""
    return str(content)


@dataclass
class Document:
    """One JSON document of a shard: where it is (`place` names it as a whole-file read does, for messages and
    ids) and its value, or why it is not one."""

    location: str  # within the file: `line N`, `byte N` (a byte-range shard), `[i]` (an item of a JSON list), ``
    value: Any
    shard: Shard
    index: int  # line index within a line-delimited shard
    storage_options: StorageOptions | None = field(default=None, repr=False)
    _first_line: list[int] = field(default_factory=list, repr=False)  # shared by a shard's documents

    def place(self, need_line: bool = True) -> str:
        """`FILE line N` / `FILE [i]` / `FILE`. In a byte-range shard, the line number is counted (once per
        shard, from the file's start) only when `need_line` says it is needed: a document with no id of its own
        is named by it; otherwise its place is `FILE byte N`."""
        url = self.shard.file.url
        if not self.location.startswith("byte "):
            return f"{url} {self.location}".rstrip()
        if not need_line:
            return f"{url} {self.location}"
        if not self._first_line:  # the line number of the shard's first line, counted once
            offset = int(self.location.removeprefix("byte "))
            self._first_line.append(line_numbers(self.shard.file, [offset], self.storage_options)[offset] - self.index)
        return f"{url} line {self._first_line[0] + self.index}"


def shard_documents(fmt: str, shard: Shard, options: IngestOptions) -> Iterator[Document | tuple[str, RecordError]]:
    """Every JSON document of a shard, read as it streams: one per line of a line-delimited file (a line over
    the limit, or not JSON, is a RecordError), the items of a top-level JSON list, else the whole JSON file
    (read whole up to `max_record_bytes`)."""
    first: list[int] = []
    if shard.file.fmt == "jsonl":
        for index, (location, line) in enumerate(
            shard_lines(shard, options.storage_options, options.limits.line_bytes)
        ):
            if isinstance(line, RecordError):
                yield location, line
            elif line.strip():
                try:
                    value = decode_json(line, options.limits.record_items)
                except IngestError as exc:
                    yield location, RecordError(f"{fmt}: {exc}", raw_text(line))
                else:
                    yield Document(location, value, shard, index, options.storage_options, first)
        return
    data = read_whole(shard.file, options.storage_options, options.limits.record_bytes)
    if isinstance(data, RecordError):
        yield "", data
        return
    try:
        value = decode_json(data, options.limits.record_items)
    except IngestError as exc:
        yield "", RecordError(f"{fmt}: {exc}", raw_text(data))
        return
    if isinstance(value, list) and all(isinstance(v, dict | list) for v in value) and not _is_messages(value):
        for i, item in enumerate(value):
            yield Document(f"[{i}]", item, shard, i, options.storage_options, first)
    else:
        yield Document("", value, shard, 0, options.storage_options, first)


def documents(fmt: str, url: str, options: IngestOptions) -> Iterator[tuple[str, Any]]:
    """(place, value) for every JSON document of a file (`shard_documents` of the whole file); a part that is
    not one is an IngestError naming its place."""
    for file in source_inputs(fmt, url, options, ("*",)):
        for doc in shard_documents(fmt, Shard(file, 0, None), options):
            if isinstance(doc, tuple):
                location, error = doc
                raise IngestError(one_line(fmt, f"{file.url} {location}".rstrip(), error.reason))
            yield doc.place(), doc.value


def chat_record(fmt: str, where: str, doc: Any) -> dict[str, Any]:
    """A conversation record of chat-style logs: an object with a `messages` list, or a bare message list
    (then wrapped as `{"messages": [...]}`)."""
    record = {"messages": doc} if isinstance(doc, list) else doc
    hint = mismatch(fmt, record)
    if not isinstance(record, dict) or not isinstance(record.get("messages"), list):
        raise IngestError(f"{fmt}: {where}: expected an object with a 'messages' list{hint or ''}")
    if hint:
        raise IngestError(f"{fmt}: {where}: not in the {fmt} format{hint}")
    return record


class ChatFormat(ShardedFormat):
    """A chat-style format (openai, anthropic): files of JSON documents (`LOG_FILES`) cut by `line_shards`, each
    conversation record (`chat_record`) converted to a rollout by `convert`; a document it cannot convert is a
    RecordError with the reason."""

    @abstractmethod
    def convert(self, s: LogSettings, where: str, record: dict[str, Any]) -> Rollout:
        """The rollout of one conversation record found at `where`, built as the model's objects (unchecked:
        `check_rollout`)."""

    def plan(self, sources: Sequence[str], options: IngestOptions, target_bytes: int) -> list[Shard]:
        files = [f for source in sources for f in source_inputs(self.name, source, options, LOG_FILES)]
        return line_shards(files, target_bytes, options.storage_options)

    def read_shard(self, shard: Shard, options: IngestOptions) -> Iterator[Part]:
        for location, part in self.read_rollouts(shard, options):
            yield location, rollout_record(part) if isinstance(part, Rollout) else part

    def read_rollouts(self, shard: Shard, options: IngestOptions) -> Iterator[TypedPart]:
        fmt = self.name
        s = settings(fmt, options)
        for doc in shard_documents(fmt, shard, options):
            if isinstance(doc, tuple):
                yield doc
                continue
            value = doc.value
            has_id = isinstance(value, dict) and get_path(value, s.id_field) not in (None, "")
            where = doc.place(need_line=not has_id)
            try:
                yield doc.location, self.convert(s, where, chat_record(fmt, where, value))
            except RECORD_ERRORS as exc:
                yield doc.location, record_error(fmt, where, exc, _raw_value(value))


def _raw_value(value: Any) -> str:
    try:
        return orjson.dumps(value)[: 4 * RAW_LIMIT + 4].decode("utf-8", "replace")[:RAW_LIMIT]
    except TypeError:  # orjson.JSONEncodeError: too deep, or an integer past 64 bits
        return ""


def conversations(fmt: str, sources: Sequence[str], options: IngestOptions) -> Iterator[tuple[str, dict[str, Any]]]:
    """(place, record) for every conversation of chat-style logs (`chat_record`)."""
    for source in sources:
        for file in source_inputs(fmt, source, options, LOG_FILES):
            for where, doc in documents(fmt, file.url, options):
                yield where, chat_record(fmt, where, doc)


_ANTHROPIC_BLOCKS = {"tool_use", "tool_result"}


def tool_dialect(doc: Any) -> str | None:
    """`openai` or `anthropic`: the dialect of the first message of a conversation (a record with a `messages`
    list, or the list) that carries tool traffic; None when none does. The `looks_like` of both formats."""
    messages = doc.get("messages") if isinstance(doc, dict) else doc
    if not isinstance(messages, list):
        return None
    for m in messages:
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


def _is_messages(value: list[Any]) -> bool:
    # A bare message list is one conversation, not a list of conversations.
    return bool(value) and all(isinstance(v, dict) and "role" in v for v in value)


def loads(fmt: str, data: bytes, where: str, kind: type | None = None, max_items: int = MAX_RECORD_ITEMS) -> Any:
    """Decoded JSON within the record limits (`decode_json`), or an IngestError naming the place; with `kind`,
    the value must be of that type."""
    try:
        value = decode_json(data, max_items)
    except IngestError as exc:
        raise IngestError(f"{fmt}: {where}: {exc}") from None
    if kind is not None and not isinstance(value, kind):
        raise IngestError(f"{fmt}: {where}: expected a JSON {'object' if kind is dict else kind.__name__}")
    return value


def read_outcomes(fmt: str, path: str, options: IngestOptions) -> dict[str, bool | None]:
    """rollout id -> success, from a CSV or JSON Lines table with `rollout_id` (or `id`) and `success`."""
    try:
        with open_for_read(path, options.storage_options) as f:
            content = f.read().decode("utf-8")
    except OSError as exc:
        raise IngestError(f"{fmt}: --option outcomes={path}: cannot read: {exc}") from exc
    rows: list[tuple[str, Any]]  # (where, a CSV row or a decoded JSON line)
    if path.endswith(".csv"):
        rows = [(f"{path} line {i + 2}", row) for i, row in enumerate(csv.DictReader(io.StringIO(content)))]
    else:
        rows = [(f"{path} line {i}", loads(fmt, line.encode(), f"{path} line {i}"))
                for i, line in enumerate(content.splitlines(), 1) if line.strip()]  # fmt: skip
    table: dict[str, bool | None] = {}
    for where, row in rows:
        key = row.get("rollout_id", row.get("id")) if isinstance(row, dict) else None
        if key in (None, "") or "success" not in row:
            raise IngestError(f"{fmt}: {where}: an outcome needs 'rollout_id' (or 'id') and 'success'")
        value = row["success"]
        table[str(key)] = as_success(None if value == "" else value, where)
    return table


def tool_definitions(value: Any) -> dict[str, Any] | None:
    """The tool definitions a model was given, as tool name -> JSON Schema of its arguments; None when `value`
    holds none. Read from every shape the production logs write: a list (or JSON text of one) of OpenAI
    chat-completions tools (`{"type": "function", "function": {"name", "parameters"}}`), Responses API and OTel
    GenAI tools (`{"type": "function", "name", "parameters"}`), legacy `functions`, Anthropic tools
    (`input_schema`), MCP tools (`inputSchema`) and Inspect's tools (`parameters`). An entry without a name (a
    provider's built-in tool such as web search) is skipped; a function without parameters takes any object."""
    if isinstance(value, str):
        try:
            value = orjson.loads(value)
        except orjson.JSONDecodeError:
            return None
    if not isinstance(value, list):
        return None
    out: dict[str, Any] = {}
    for item in value:
        if not isinstance(item, dict):
            continue
        nested = item.get("function")
        fn: dict[str, Any] = nested if isinstance(nested, dict) else item
        name = fn.get("name")
        if not isinstance(name, str) or not name:
            continue
        schema = next(
            (fn[k] for k in ("parameters", "input_schema", "inputSchema") if isinstance(fn.get(k), dict)), None
        )
        out[name] = schema if schema is not None else {"type": "object"}
    return out or None


class ToolVersions:
    """The tool definitions of one conversation, in the order the model was given them: each distinct set is a
    version (`env.tool_versions`, the first also `env.tools`), and a call is stamped with the version in force
    when it was made — the set given last at or before it; a call before any is under the first."""

    def __init__(self) -> None:
        self.versions: list[dict[str, Any]] = []
        self._keys: dict[bytes, int] = {}
        self.current = 0

    def given(self, definitions: dict[str, Any] | None) -> None:
        """The model was given `definitions` (None: the log recorded none at this call: the last stay in force)."""
        if definitions is None:
            return
        key = orjson.dumps(definitions, option=orjson.OPT_SORT_KEYS)
        if key not in self._keys:
            self._keys[key] = len(self.versions)
            self.versions.append(definitions)
        self.current = self._keys[key]

    def stamp(self, event: CallRecord, version: int | None = None) -> CallRecord:
        """`event` marked with the version in force (or `version`); version 0 is left implicit."""
        version = self.current if version is None else version
        if version:
            event["tools_version"] = version
        return event

    def env(self) -> dict[str, Any]:
        """The rollout's `env` entries: none when no definitions were logged."""
        if not self.versions:
            return {}
        out: dict[str, Any] = {"tools": self.versions[0]}
        if len(self.versions) > 1:
            out["tool_versions"] = self.versions
        return out
