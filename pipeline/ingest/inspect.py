"""`inspect`: Inspect AI `.eval` logs (zip archives of JSON) -> canonical rollouts, one per sample and epoch.

Read with zipfile/json (no inspect_ai dependency); Inspect compresses the members with zstd (ZIP method 93),
which zipfile reads only from Python 3.14, so those are decompressed here with zstandard. A source is a `.eval`
file or a folder searched recursively. Layout used: `header.json` (or, for a log still being written,
`_journal/start.json`) gives `eval` (task, model, eval_id, created); `samples/<id>_epoch_<n>.json` one sample
each. Mapping:
- the record for ids/labels/success is the sample plus `model`, `task`, `eval_id`, `run_id`, `created`,
  `date` (day of `created`), `rollout_id` = `<eval_id>/<sample id>/<epoch>` (the default id field) and
  `score` = the value of the first scorer in `scores`, or of `--option scorer=NAME` (the default success
  field: `C`/`I`, booleans, numbers >= 1 are success);
- `system`/`user` messages -> message events (a user message starts a new turn), assistant text too;
- assistant `tool_calls[]` -> calls in logged order (`function`, `arguments`, `id`); a call Inspect could
  not parse (`parse_error`) carries the parse error text as its raw arguments, so it is an S failure;
- `role: tool` messages (paired by `tool_call_id` as `pipeline.ingest._pairing` says) -> `output` (the
  content text, or the error message) and `error` = whether `error` is set. A call with no tool message has
  no output and no error; a result that answers no call is a `tool` message (`orphan_results`).
- tool definitions: the `tools` of the sample's model events (`events[]` with `event: model`: what the model
  was given at that generation) -> `env.tools`; each call is under the definitions of the model event whose
  output requested it (by call id; a change within the sample is a new version: `env.tool_versions`, the
  call's `tools_version`). A sample without model events: no definitions (a spec's schemas, else only
  well-formedness);
- attributes: `epoch`, and `limit` (the limit that ended the sample: message, token, time...) when set;
- a sample with an `error` (Inspect: an error halted the sample, it was not scored) has status
  `harness_error`, attribute `harness_error` = the error's message.
"""

from __future__ import annotations

import re
import struct
import zipfile
import zlib
from collections import Counter, defaultdict, deque
from collections.abc import Iterator, Sequence
from dataclasses import replace
from functools import partial
from typing import Any

import orjson
import zstandard

from pipeline.core.errors import IngestError
from pipeline.core.records import CallRecord
from pipeline.ingest._logs import (
    LogSettings,
    ToolVersions,
    call,
    loads,
    log_options,
    message,
    rollout,
    settings,
    text,
    tool_definitions,
)
from pipeline.ingest._pairing import Call, Entry, Result, assemble
from pipeline.ingest.base import RECORD_ERRORS, IngestOptions, Option, Part, ShardedFormat, record_error, source_inputs
from pipeline.storage.fs import open_for_read
from pipeline.storage.inputs import raw_text
from pipeline.storage.shards import RecordError, Shard

_SAMPLE = re.compile(r"^samples/(.+)_epoch_(\d+)\.json$")
_ZSTD = 93  # the ZIP compression method number of zstd
_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, ..., file name length, extra field length


def _sample_sizes(url: str, options: IngestOptions) -> list[int]:
    try:
        with open_for_read(url, options.storage_options) as f, zipfile.ZipFile(f) as z:
            return [z.getinfo(n).compress_size for n in _samples(z.namelist())]
    except (zipfile.BadZipFile, ValueError, EOFError) as exc:
        raise IngestError(f"inspect: {url}: cannot read the .eval archive: {exc}") from exc


def sample_record(sample: dict[str, Any], info: dict[str, Any], where: str = "sample") -> dict[str, Any]:
    """The canonical record `pexec ingest inspect` (default options) makes of one sample: `sample` as a `.eval`
    log stores it (`id`, `epoch`, `messages`, `scores`...; a live sample's messages dumped the same way),
    `info` the log's `eval` header (task, model, eval_id...)."""
    options = IngestOptions(extra=FORMAT.options.defaults())
    return _rollout(sample, info, settings("inspect", options), where)


def _shared(z: zipfile.ZipFile) -> set[str]:
    """The members whose local header lies inside the data of a member before it, or is the same as another's:
    decompressing them would decompress the same bytes again (an archive writes each member once, apart)."""
    shared: set[str] = set()
    end = -1
    for member in sorted(z.infolist(), key=lambda m: m.header_offset):
        if member.header_offset < end:
            shared.add(member.filename)
        end = max(end, member.header_offset + _LOCAL_HEADER.size + len(member.filename.encode()) + member.compress_size)
    names = Counter(m.filename for m in z.infolist())
    shared.update(n for n, copies in names.items() if copies > 1)
    return shared


def _samples(names: list[str]) -> list[str]:
    return sorted((n for n in names if _SAMPLE.match(n)), key=_sample_order)


class Inspect(ShardedFormat):
    name = "inspect"
    options = log_options(
        Option("scorer", "the scorer whose value is the `score` field (default: the sample's first scorer)"),
        id_field="rollout_id",
        success_field="score",
    )

    def plan(self, sources: Sequence[str], options: IngestOptions, target_bytes: int) -> list[Shard]:
        """Each `.eval` log cut into ranges of its sample members (in sample order) of about `target_bytes`
        compressed; only the archive's directory is read here."""
        shards: list[Shard] = []
        for source in sources:
            for file in source_inputs("inspect", source, options, ("*.eval",)):
                file = replace(file, fmt="eval")
                try:
                    sizes = _sample_sizes(file.url, options)
                except IngestError:  # a damaged archive: one shard, whose reading reports it (a reject when scoring)
                    shards.append(Shard(file, 0, None))
                    continue
                begin, held = 0, 0
                for i, size in enumerate(sizes):
                    held += size
                    if held >= target_bytes and i + 1 < len(sizes):
                        shards.append(Shard(file, begin, i + 1, i + 1 - begin))
                        begin, held = i + 1, 0
                shards.append(Shard(file, begin, len(sizes) if shards and shards[-1].file == file else None))
        return shards

    def read_shard(self, shard: Shard, options: IngestOptions) -> Iterator[Part]:
        """The rollouts of a range of sample members; a member over `max_member_bytes` decompressed, damaged, or not a
        sample is a RecordError. An archive whose header cannot be read is an IngestError."""
        s = settings("inspect", options)
        url = shard.file.url
        limit = options.limits.member_bytes
        try:
            with open_for_read(url, options.storage_options) as f, zipfile.ZipFile(f) as z:
                names = z.namelist()
                head = "header.json" if "header.json" in names else "_journal/start.json"
                if head not in names:
                    raise IngestError(
                        f"inspect: {url}: no header.json or _journal/start.json: not an Inspect .eval log"
                    )
                data = _member(f, z, head, limit)
                if isinstance(data, RecordError):
                    raise IngestError(f"inspect: {url}!{head}: {data.reason}")
                info = loads("inspect", data, f"{url}!{head}", dict).get("eval") or {}
                samples = _samples(names)
                shared = _shared(z)
                budget = options.limits.archive_bytes
                # what the earlier shards of this archive decompress counts against the archive's budget too
                spent = sum(min(z.getinfo(n).file_size, limit) for n in samples[: shard.start] if n not in shared)
                for name in samples[shard.start : len(samples) if shard.stop is None else shard.stop]:
                    where = f"{url}!{name}"
                    if name in shared:
                        yield name, RecordError(f"inspect: {where}: its data lies inside another member's (a zip "
                                                "bomb's overlap): not read", "")  # fmt: skip
                        continue
                    spent += min(z.getinfo(name).file_size, limit)
                    if spent > budget:
                        yield name, RecordError(f"inspect: {where}: the archive's members decompress to more than "
                                                f"{budget:,} bytes (max_archive_bytes): not read", "")  # fmt: skip
                        continue
                    data = _member(f, z, name, limit)
                    if isinstance(data, RecordError):
                        yield name, data
                        continue
                    try:
                        sample = loads("inspect", data, where, dict, options.limits.record_items)
                        yield name, _rollout(sample, info, s, where)
                    except RECORD_ERRORS as exc:
                        yield name, record_error("inspect", where, exc, raw_text(data))
        except (OSError, zipfile.BadZipFile, zstandard.ZstdError, EOFError) as exc:
            raise IngestError(f"inspect: {url}: cannot read the .eval archive: {exc}") from exc


FORMAT = Inspect()

_PIECE = 1 << 20  # decompressed bytes read at a time


def _member(f: Any, z: zipfile.ZipFile, name: str, limit: int) -> bytes | RecordError:
    """A member's bytes, decompressed as a stream and never past `limit` (a RecordError then, as for a member
    that does not match its CRC); a zstd member's compressed bytes are read from after its local header (where
    the ZIP format puts them)."""
    member = z.getinfo(name)
    if member.compress_type != _ZSTD:
        stream: Any = z.open(name)
    else:
        f.seek(member.header_offset)
        signature, name_length, extra_length = _LOCAL_HEADER.unpack(f.read(_LOCAL_HEADER.size))
        if signature != b"PK\x03\x04":
            return RecordError(f"inspect: {name}: no local file header", "")
        f.seek(member.header_offset + _LOCAL_HEADER.size + name_length + extra_length)
        # Inspect writes several zstd frames per member: read across them
        # zstandard's stub asks for IO[bytes]; its reader calls only read(), which _Slice has
        source = _Slice(f, member.compress_size)
        stream = zstandard.ZstdDecompressor().stream_reader(source, read_across_frames=True)  # type: ignore[arg-type]
    parts, held, crc = [], 0, 0
    try:
        with stream:
            while piece := stream.read(_PIECE):
                held += len(piece)
                if held > limit or held > member.file_size:
                    what = f"over the limit of {limit:,} bytes (max_member_bytes)" if held > limit else (
                        f"larger than its declared {member.file_size:,} bytes")  # fmt: skip
                    return RecordError(f"inspect: member {name} decompresses {what}", "")
                crc = zlib.crc32(piece, crc)
                parts.append(piece)
    except (zipfile.BadZipFile, zstandard.ZstdError, zlib.error, EOFError) as exc:
        return RecordError(f"inspect: member {name} cannot be decompressed: {exc}", "")
    if crc != member.CRC or held != member.file_size:
        return RecordError(f"inspect: member {name}: the decompressed member does not match its CRC or size", "")
    return b"".join(parts)


class _Slice:
    """The next `size` bytes of a file, as a readable stream (a zstd member's compressed bytes)."""

    def __init__(self, f: Any, size: int) -> None:
        self._f, self._left = f, size

    def read(self, n: int = -1) -> bytes:
        n = self._left if n < 0 else min(n, self._left)
        data = self._f.read(n) if n else b""
        self._left -= len(data)
        return data


def _sample_order(name: str) -> tuple[int, str]:
    m = _SAMPLE.match(name)
    assert m is not None  # filtered by the caller
    return int(m.group(2)), m.group(1)


def _rollout(sample: dict[str, Any], info: dict[str, Any], s: LogSettings, where: str) -> dict[str, Any]:
    scores = sample.get("scores") or {}
    scorer = s.own.get("scorer") or next(iter(scores), None)
    if scorer is not None and scorer not in scores:
        raise IngestError(f"inspect: {where}: no scorer {scorer!r} (scores: {', '.join(scores) or 'none'})")
    created = str(info.get("created") or "")
    record = {
        **sample,
        "model": info.get("model"),
        "task": info.get("task"),
        "eval_id": info.get("eval_id"),
        "run_id": info.get("run_id"),
        "created": created or None,
        "date": created[:10] or None,
        "rollout_id": f"{info.get('eval_id') or info.get('task')}/{sample.get('id')}/{sample.get('epoch', 1)}",
        "task_id": sample.get("id"),
        "score": (scores.get(scorer) or {}).get("value") if scorer else None,
    }
    messages = sample.get("messages")
    if not isinstance(messages, list):
        raise IngestError(f"inspect: {where}: the sample has no 'messages' list")
    limit = sample.get("limit")
    attributes = {"epoch": str(sample.get("epoch", 1))}
    if isinstance(limit, dict) and limit.get("type"):
        attributes["limit"] = str(limit["type"])
    error = sample.get("error")
    if isinstance(error, dict):
        error = error.get("message") or orjson.dumps(error).decode()
    crash = str(error) if error else None
    versions = ToolVersions()
    requested = _requested(sample.get("events"), versions)
    events, orphans = assemble(_log(messages, where, versions, requested))
    return rollout(s, record, events, where, attributes | orphans, crash, env=versions.env())


def _requested(events: Any, versions: ToolVersions) -> dict[Any, deque[int]]:
    """Call id -> the versions of the tool definitions in force at the model events that requested a call with
    it, in order (ids may repeat); `versions` collects the definitions."""
    out: dict[Any, deque[int]] = defaultdict(deque)
    for event in events if isinstance(events, list) else []:
        if not isinstance(event, dict) or event.get("event") != "model":
            continue
        versions.given(tool_definitions(event.get("tools")))
        output = event.get("output")
        for choice in output.get("choices") or [] if isinstance(output, dict) else []:
            message = choice.get("message") if isinstance(choice, dict) else None
            for tc in message.get("tool_calls") or [] if isinstance(message, dict) else []:
                if isinstance(tc, dict):
                    out[tc.get("id")].append(versions.current)
    return out


def _log(messages: list[Any], where: str, versions: ToolVersions, requested: dict[Any, deque[int]]) -> list[Entry]:
    out: list[Entry] = []
    turn = 0
    version = 0  # of a call no model event is found for: the last found before it
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise IngestError(f"inspect: {where} messages[{i}]: a message must be an object")
        role, said = m.get("role"), text(m.get("content"))
        turn += role == "user"
        if role in ("system", "user", "assistant") and said:
            out.append(message(role, said, turn))
        if role == "tool":
            result = _result(m)
            out.append(Result(m.get("tool_call_id"), result, result[0], turn))
        if role != "assistant":
            continue
        for j, tc in enumerate(m.get("tool_calls") or []):
            if not isinstance(tc, dict):
                raise IngestError(f"inspect: {where} messages[{i}].tool_calls[{j}]: expected an object")
            args = tc.get("arguments")
            if tc.get("parse_error"):
                args = str(tc["parse_error"])  # Inspect keeps no raw text: its error stands in for it
            at = f"{where} messages[{i}].tool_calls[{j}]"
            queue = requested.get(tc.get("id"))
            version = queue.popleft() if queue else version
            build = partial(_stamped, versions, version, tc.get("function"), args, tc.get("id"), turn, where=at)
            out.append(Call(tc.get("id"), build))
    return out


def _stamped(
    versions: ToolVersions, version: int, tool: Any, args: Any, call_id: Any, turn: int, result: Any, where: str
) -> CallRecord:
    return versions.stamp(call(tool, args, call_id, turn, result, where), version)


def _result(m: dict[str, Any]) -> tuple[Any, bool]:
    error = m.get("error")
    if error:
        return (error.get("message") if isinstance(error, dict) else str(error)) or text(m.get("content")), True
    return text(m.get("content")), False
