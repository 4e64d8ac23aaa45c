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
- attributes: `epoch`, and `limit` (the limit that ended the sample: message, token, time...) when set;
- a sample with an `error` (Inspect: an error halted the sample, it was not scored) has status
  `harness_error`, attribute `harness_error` = the error's message.
"""

from __future__ import annotations

import io
import re
import struct
import zipfile
import zlib
from collections.abc import Iterator, Sequence
from functools import partial
from typing import Any

import orjson
import zstandard

from pipeline.ingest._logs import LogSettings, call, loads, log_options, message, rollout, settings, text
from pipeline.ingest._pairing import Call, Entry, Result, assemble
from pipeline.ingest.base import Format, IngestError, IngestOptions, Option, source_files
from pipeline.storage.fs import open_for_read

_SAMPLE = re.compile(r"^samples/(.+)_epoch_(\d+)\.json$")
_ZSTD = 93  # the ZIP compression method number of zstd
_LOCAL_HEADER = struct.Struct("<4s22xHH")  # signature, ..., file name length, extra field length


def read(sources: Sequence[str], options: IngestOptions) -> Iterator[dict]:
    s = settings("inspect", options)
    for source in sources:
        for url in source_files("inspect", source, options, ("*.eval",)):
            yield from _read_log(url, s, options)


FORMAT = Format(
    "inspect",
    read,
    log_options(
        Option("scorer", "the scorer whose value is the `score` field (default: the sample's first scorer)"),
        id_field="rollout_id",
        success_field="score",
    ),
)


def sample_record(sample: dict[str, Any], info: dict[str, Any], where: str = "sample") -> dict:
    """The canonical record `pexec ingest inspect` (default options) makes of one sample: `sample` as a `.eval`
    log stores it (`id`, `epoch`, `messages`, `scores`...; a live sample's messages dumped the same way),
    `info` the log's `eval` header (task, model, eval_id...)."""
    options = IngestOptions(extra=FORMAT.options.defaults())
    return _rollout(sample, info, settings("inspect", options), where)


def _read_log(url: str, s: LogSettings, options: IngestOptions) -> Iterator[dict]:
    try:
        with open_for_read(url, options.storage_options) as f, zipfile.ZipFile(f) as z:
            names = z.namelist()
            head = "header.json" if "header.json" in names else "_journal/start.json"
            if head not in names:
                raise IngestError(f"inspect: {url}: no header.json or _journal/start.json: not an Inspect .eval log")
            info = loads("inspect", _member(f, z, head), f"{url}!{head}", dict).get("eval") or {}
            samples = sorted((n for n in names if _SAMPLE.match(n)), key=_sample_order)
            for name in samples:
                sample = loads("inspect", _member(f, z, name), f"{url}!{name}", dict)
                yield _rollout(sample, info, s, f"{url}!{name}")
    except (OSError, zipfile.BadZipFile, zstandard.ZstdError) as exc:
        raise IngestError(f"inspect: {url}: cannot read the .eval archive: {exc}") from exc


def _member(f: Any, z: zipfile.ZipFile, name: str) -> bytes:
    """A member's bytes; a zstd member's compressed bytes are read from after its local header (where the
    ZIP format puts them) and checked against the member's CRC."""
    member = z.getinfo(name)
    if member.compress_type != _ZSTD:
        return z.read(name)
    f.seek(member.header_offset)
    signature, name_length, extra_length = _LOCAL_HEADER.unpack(f.read(_LOCAL_HEADER.size))
    if signature != b"PK\x03\x04":
        raise zipfile.BadZipFile(f"{name}: no local file header")
    f.seek(member.header_offset + _LOCAL_HEADER.size + name_length + extra_length)
    compressed = f.read(member.compress_size)
    # Inspect writes several zstd frames per member: read across them, never past the declared size (a member
    # that inflates further is refused below, not held in memory)
    reader = zstandard.ZstdDecompressor().stream_reader(io.BytesIO(compressed), read_across_frames=True)
    data = reader.read(member.file_size + 1)
    if zlib.crc32(data) != member.CRC or len(data) != member.file_size:
        raise zipfile.BadZipFile(f"{name}: the decompressed member does not match its CRC or size")
    return data


def _sample_order(name: str) -> tuple[int, str]:
    m = _SAMPLE.match(name)
    assert m is not None  # filtered by the caller
    return int(m.group(2)), m.group(1)


def _rollout(sample: dict[str, Any], info: dict[str, Any], s: LogSettings, where: str) -> dict:
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
    events, orphans = assemble(_log(messages, where))
    return rollout(s, record, events, where, attributes | orphans, crash)


def _log(messages: list[Any], where: str) -> list[Entry]:
    out: list[Entry] = []
    turn = 0
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
            out.append(Call(tc.get("id"), partial(call, tc.get("function"), args, tc.get("id"), turn, where=at)))
    return out


def _result(m: dict[str, Any]) -> tuple[Any, bool]:
    error = m.get("error")
    if error:
        return (error.get("message") if isinstance(error, dict) else str(error)) or text(m.get("content")), True
    return text(m.get("content")), False
