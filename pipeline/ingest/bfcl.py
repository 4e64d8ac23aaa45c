"""`bfcl`: BFCL multi-turn model result files -> canonical rollouts (benchmark `bfcl_v3` or `bfcl_v4`).

Sources are result files `BFCL_v{3,4}_multi_turn_<category>_result.json` or folders holding them (searched
recursively). Each line (`id`, `result` [turn][step][calls], token counts, latency, `inference_log`) is
joined with
- the dataset of its naming (questions -> user messages per turn; initial_config, involved_classes,
  missed_function -> `env`), from the release that replays that naming, or `--option dataset=PATH`;
- the score file of the same name (`..._score.json`, beside the result file, under the mirrored `score/`
  folder, or in `--option scores=DIR`): success = the id is not listed as failed. No score file: null.
Calls are `{name: "<JSON arguments>"}` (function-calling models; the raw text is kept, so a call whose
arguments do not parse is an S failure), decoded call strings, or a prompt-mode model's raw text per step,
decoded as BFCL does (its logged `model_response_decoded`, else `[f(a=1), g()]` parsed with `ast`).
The tool outputs the live run saw (`inference_log`) become each call's logged `output`.
Labels (conditions): `model` (the result file's folder, above any `multi_turn/`), `category`, plus `--label`.
A result that is BFCL's record of an inference crash (`"result": "Error during inference: ..."`) is a rollout
with no calls and status `harness_error` (attribute `harness_error` = BFCL's message): the model never ran.
Options: `dataset=PATH` (a folder or a bfcl-eval wheel), `scores=DIR`, `model=NAME` (overrides the folder).
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path
from typing import Any

from pipeline.core.errors import IngestError
from pipeline.core.records import CallRecord, EventRecord
from pipeline.envs import EnvError
from pipeline.envs.bfcl.calls import CallSyntaxError, ParameterOrder, parse_call, parse_call_list
from pipeline.envs.bfcl.env import BfclEnvironment, error_message
from pipeline.ingest.base import (
    MAX_RECORD_BYTES,
    RECORD_ERRORS,
    IngestOptions,
    Option,
    OptionSchema,
    Part,
    ShardedFormat,
    check_document,
    record_error,
    source_inputs,
)
from pipeline.storage.fs import StorageOptions, exists, list_files, open_for_read
from pipeline.storage.inputs import MAX_RECORD_ITEMS, over_items, raw_text, shard_lines
from pipeline.storage.shards import RecordError, Shard

_CATEGORIES = ("base", "miss_func", "miss_param", "long_context")
FILE_NAME = re.compile(rf"BFCL_(v\d+)_multi_turn_({'|'.join(_CATEGORIES)})_result\.json$")
_RESULT_FILES = tuple(f"BFCL_v*_multi_turn_{category}_result.json" for category in _CATEGORIES)
_CONTAINER_FOLDERS = {"multi_turn", "result", "results"}


OPTIONS = OptionSchema(
    (
        Option("dataset", "the dataset: a folder or a bfcl-eval wheel (default: the release that replays the naming)"),
        Option("scores", "a folder of score files (default: beside the result file, or the mirrored score/ folder)"),
        Option("model", "the `model` label (default: the result file's folder, above multi_turn/ and result/)"),
    )
)


class Bfcl(ShardedFormat):
    name = "bfcl"
    options = OPTIONS

    def looks_like(self, doc: Any) -> bool:
        """A multi-turn result entry: `{"id": "multi_turn_…", "result": …}` (its calls, or the crash's text)."""
        return isinstance(doc, dict) and str(doc.get("id", "")).startswith("multi_turn_") and "result" in doc

    def plan(self, sources: Sequence[str], options: IngestOptions, target_bytes: int) -> list[Shard]:
        """One shard per result file (JSON Lines under a `.json` name), read whole."""
        files = [f for source in sources for f in source_inputs("bfcl", source, options, _RESULT_FILES)]
        return [Shard(replace(f, fmt="jsonl"), 0, None) for f in files]

    def read_shard(self, shard: Shard, options: IngestOptions) -> Iterator[Part]:
        """The rollouts of one result file; a line that is not a result entry of a known task is a RecordError."""
        url = shard.file.url
        named = FILE_NAME.search(url.rsplit("/", 1)[-1])
        if named is None:  # a file named directly (folders are searched for these names only)
            raise IngestError(f"bfcl: {url} is not named BFCL_v<N>_multi_turn_<category>_result.json")
        tag, category = named.groups()
        benchmark = f"bfcl_{tag}"
        from pipeline.envs.bfcl import official as official

        try:
            dataset = {e["id"]: e for e in official.read_dataset(tag, category, source=options.extra.get("dataset"))}
        except EnvError as exc:
            raise IngestError(f"bfcl: {url}: {exc}") from exc
        failed, _ = read_scores(_score_file(url, options), options.storage_options, options.limits.record_bytes)
        model = options.extra.get("model") or model_from_path(url)
        labels = {"model": model, "category": category, **options.labels}
        for location, line in shard_lines(shard, options.storage_options, options.limits.line_bytes):
            if isinstance(line, RecordError) or not line.strip():
                if isinstance(line, RecordError):
                    yield location, line
                continue
            where = f"{url} {location}"
            try:
                entry = decode(line, options.limits.record_items)
            except IngestError as exc:
                yield location, RecordError(f"bfcl: {where}: {exc}", raw_text(line))
                continue
            rid = entry.get("id") if isinstance(entry, dict) else None
            if not isinstance(entry, dict):
                reason = (
                    f"bfcl: {where}: a result entry is an object with 'id' and 'result', got {type(entry).__name__}"
                )
                yield location, RecordError(reason, raw_text(line))
                continue
            task = dataset.get(rid) if isinstance(rid, str) else None
            if task is None:
                reason = f"bfcl: {where}: id {rid!r:.200} is not a {tag} {category} task"
                yield location, RecordError(reason, raw_text(line))
                continue
            success = None if failed is None else rid not in failed
            try:
                yield location, build_record(task, entry, benchmark, category, labels, success, where)
            except RECORD_ERRORS as exc:
                yield location, record_error("bfcl", where, exc, raw_text(line))


FORMAT = Bfcl()


def decode(data: bytes | str, max_items: int = MAX_RECORD_ITEMS) -> Any:
    """One JSON value decoded as BFCL's own reader does (the stdlib decoder: it keeps its number types), or an
    IngestError saying why it is not one: more than `max_items` objects and lists (counted before decoding),
    invalid UTF-8, not JSON, an integer of more digits than Python converts (ValueError), nesting deeper than the
    interpreter's recursion limit (RecursionError) or, decoded, than MAX_DOCUMENT_DEPTH."""
    if (items := over_items(data, max_items)) is not None:
        raise IngestError(f"{items:,} objects and lists are over the limit of {max_items:,} (max_record_items)")
    try:
        return check_document(json.loads(data))
    except UnicodeDecodeError as exc:
        raise IngestError(f"invalid UTF-8: {exc}") from None
    except json.JSONDecodeError as exc:
        raise IngestError(f"not JSON: {exc}") from None
    except ValueError as exc:  # e.g. an integer of more than sys.get_int_max_str_digits() digits
        raise IngestError(f"not readable JSON: {exc}") from None
    except RecursionError:
        raise IngestError("not readable JSON: nested deeper than the decoder's recursion limit") from None


def ground_truth_records(tag: str, benchmark: str) -> Iterator[dict[str, Any]]:
    """The ground truth of all multi-turn tasks of a data naming ("v3", "v4") as canonical records of
    `benchmark`, one call per step, success true: the known answers of the BFCL environments."""
    from pipeline.envs.bfcl import official as official

    for category in official.CATEGORIES:
        answers = official.read_dataset(tag, category, answers=True)
        truth = {a["id"]: a["ground_truth"] for a in answers}
        for task in official.read_dataset(tag, category):
            entry = {"id": task["id"], "result": [[[c] for c in turn] for turn in truth[task["id"]]]}
            yield build_record(task, entry, benchmark, category, {"model": "ground_truth"}, True)


def build_record(
    task: dict[str, Any],
    entry: dict[str, Any],
    benchmark: str,
    category: str,
    labels: dict[str, str],
    success: bool | None,
    where: str = "",
) -> dict[str, Any]:
    """One canonical rollout from a dataset task and a model result entry."""
    turns = entry.get("result")
    # A string result is BFCL's record of an inference error: the run made no calls (BFCL scores it failed).
    crash = turns.strip() if isinstance(turns, str) else None
    turns = turns if isinstance(turns, list) else []
    logged = _step_logs(entry.get("inference_log"), turns)
    # Function-calling results hold a step's calls as a list; a string step is then the model's text answer.
    # In prompt mode every step is the model's raw text, which BFCL decodes into calls.
    prompt_mode = not any(isinstance(step, list) for turn in turns if isinstance(turn, list) for step in turn)
    events: list[EventRecord] = []
    for index, question in enumerate(task.get("question", [])):
        for message in question:
            events.append(
                {
                    "type": "message",
                    "role": message.get("role", "user"),
                    "content": message.get("content", ""),
                    "turn": index,
                }
            )
        steps = turns[index] if index < len(turns) and isinstance(turns[index], list) else []
        for step_index, step in enumerate(steps):
            log = logged.get((index, step_index))
            if isinstance(step, list):
                calls = _calls(step, benchmark, where)
            elif isinstance(step, str) and (prompt_mode or (log is not None and log.decoded is not None)):
                calls = _prompt_calls(step, log, benchmark)
            else:
                continue  # a text answer: BFCL ends the turn, no call was made
            outputs = log.outputs if log is not None else []
            for call_index, call in enumerate(calls):
                if call_index < len(outputs):
                    call["output"] = outputs[call_index]
                    call["error"] = is_error_output(outputs[call_index])
                events.append({**call, "turn": index})
    return {
        "rollout_id": f"{labels.get('model', '')}:{entry['id']}",
        "task_id": entry["id"],
        "benchmark": benchmark,
        "labels": labels,
        "env": {
            "initial_config": task.get("initial_config", {}),
            "involved_classes": task.get("involved_classes", []),
            "missed_function": task.get("missed_function", {}),
            "long_context": category == "long_context",
        },
        "events": events,
        "success": success,
        "cost": _cost(entry),
        "status": "ok" if crash is None else "harness_error",
        "attributes": {} if crash is None else {"harness_error": crash},
    }


def _calls(step: list[Any], benchmark: str, where: str) -> list[CallRecord]:
    calls: list[CallRecord] = []
    for item in step:
        if isinstance(item, dict):  # function-calling: {name: "<JSON arguments>"} (one or more names)
            for name, arguments in item.items():
                calls.append({"type": "call", "tool": str(name), "arguments": arguments})
        elif isinstance(item, str):  # prompt mode: a decoded call string
            calls.append(_string_call(item, benchmark))
        else:
            raise IngestError(f"bfcl: {where}: a call is neither an object nor a string: {item!r}")
    return calls


def _prompt_calls(text: str, log: _StepLog | None, benchmark: str) -> list[CallRecord]:
    """The calls of a prompt-mode response: those BFCL decoded live (`model_response_decoded`) when the step
    is in the inference log (none if it logged a decoding error), else BFCL's default decoding of the text.
    Text that does not decode is an answer, not a call (BFCL ends the turn)."""
    if log is not None:
        return [_string_call(str(c), benchmark) for c in log.decoded or []]
    try:
        decoded = parse_call_list(text, _parameter_order(benchmark))
    except CallSyntaxError:
        return []
    return [{"type": "call", "tool": name, "arguments": args} for name, args in decoded]


def _string_call(text: str, benchmark: str) -> CallRecord:
    try:
        name, args = parse_call(text, _parameter_order(benchmark))
    except CallSyntaxError as exc:
        # Kept as a call whose arguments cannot parse: the checker reports it as an S failure.
        name = text.split("(", 1)[0].strip() or "<unparsed>"
        return {"type": "call", "tool": name, "arguments": f"<unparsed: {exc}>"}
    return {"type": "call", "tool": name, "arguments": args}


@cache
def _parameter_order(benchmark: str) -> ParameterOrder:
    from pipeline.envs import get_environment

    try:
        env = get_environment(benchmark)
    except EnvError as exc:
        raise IngestError(f"bfcl: prompt-mode call strings need the simulators: {exc}") from exc
    if not isinstance(env, BfclEnvironment):  # a plug-in registered under a BFCL name
        raise IngestError(
            f"bfcl: prompt-mode call strings need the BFCL simulators; {benchmark!r} is another environment"
        )
    return env.parameter_order


@dataclass(frozen=True)
class _StepLog:
    outputs: list[str]  # the tool outputs the live run returned, in call order
    decoded: list[Any] | None  # the call strings BFCL decoded from a text response (prompt mode)


def _step_logs(log: Any, turns: list[Any]) -> dict[tuple[int, int], _StepLog]:
    """(turn, step) -> what the live run logged. BFCL's inference_log holds a dict per turn (`step_<k>` ->
    messages: tool outputs have role `tool`, the handler's record has `model_response_decoded`) between state
    snapshots."""
    if not isinstance(log, list):
        return {}
    turn_logs = [item for item in log if isinstance(item, dict)]
    if len(turn_logs) != len(turns):
        return {}  # cannot be aligned with the result: outputs count as not logged
    out: dict[tuple[int, int], _StepLog] = {}
    for turn, turn_log in enumerate(turn_logs):
        for key, messages in turn_log.items():
            if key.startswith("step_") and key[5:].isdigit() and isinstance(messages, list):
                entries = [m for m in messages if isinstance(m, dict)]
                tools = [m.get("content") for m in entries if m.get("role") == "tool"]
                decoded = next((m["model_response_decoded"] for m in entries if "model_response_decoded" in m), None)
                out[(turn, int(key[5:]))] = _StepLog(
                    [t if isinstance(t, str) else json.dumps(t) for t in tools],
                    decoded if isinstance(decoded, list) else None,
                )
    return out


def is_error_output(text: str) -> bool:
    """Whether a logged tool output shows one of BFCL's error conventions: a raised exception (`Error during
    execution: ...`), `{"error": ...}` (JSON), or a one-element error list (logged through str())."""
    if text.startswith("Error during execution"):
        return True
    if not text.startswith(("{", "[")):
        return False
    try:
        value = decode(text)
    except IngestError:
        try:
            value = ast.literal_eval(text)  # a Python repr: literals only, never evaluated as code
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            return False
    try:
        return error_message(value) is not None
    except (ValueError, RecursionError):  # too deep or too long a number to print: not an error convention
        return False


def _cost(entry: dict[str, Any]) -> dict[str, float]:
    cost = {}
    for key, name in (
        ("input_token_count", "input_tokens"),
        ("output_token_count", "output_tokens"),
        ("latency", "latency_s"),
    ):
        total = _sum(entry.get(key))
        if total is not None:
            cost[name] = total
    if "input_tokens" in cost and "output_tokens" in cost:
        cost["tokens"] = cost["input_tokens"] + cost["output_tokens"]
    return cost


def _sum(value: Any) -> float | None:
    # Token counts and latency are numbers, or nested per turn and step.
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, list):
        parts = [p for p in (_sum(v) for v in value) if p is not None]
        return float(sum(parts)) if parts else None
    return None


def model_from_path(url: str) -> str:
    """The model's name: the result file's folder, skipping BFCL's `multi_turn/` and `result/` levels."""
    for folder in reversed(url.split("/")[:-1]):
        if folder and folder not in _CONTAINER_FOLDERS:
            return folder
    return "unknown"


def _score_file(result: str, options: IngestOptions) -> str | None:
    parts = result.split("/")
    name = parts[-1].replace("_result.json", "_score.json")
    candidates = []
    if scores := options.extra.get("scores"):
        candidates.append(f"{scores.rstrip('/')}/{name}")
        candidates += list(list_files(scores, options.storage_options, patterns=[name]) or {})
    candidates.append("/".join([*parts[:-1], name]))
    if "result" in parts:  # BFCL layout: result/<model>/multi_turn/x_result.json -> score/<model>/...
        i = len(parts) - 1 - parts[::-1].index("result")
        candidates.append("/".join([*parts[:i], "score", *parts[i + 1 : -1], name]))
    return next((c for c in candidates if exists(c, options.storage_options)), None)


def read_scores(
    url: str | Path | None, storage_options: StorageOptions | None = None, limit: int = MAX_RECORD_BYTES
) -> tuple[set[str] | None, dict[str, Any] | None]:
    """(ids BFCL scored as failed, the summary line) of a score file; (None, None) when there is none. Never read
    past `limit` bytes: a larger file, or a line that is not JSON, is an IngestError."""
    if url is None:
        return None, None
    failed: set[str] = set()
    summary = None
    with open_for_read(str(url), storage_options) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise IngestError(
            f"bfcl: {url}: score file over the limit of {limit:,} bytes (--option max_record_bytes=N raises it)"
        )
    for number, line in enumerate(data.split(b"\n"), 1):
        if not line.strip():
            continue
        try:
            row = decode(line)
        except IngestError as exc:
            raise IngestError(f"bfcl: {url} line {number}: {exc}") from None
        if not isinstance(row, dict):
            continue
        if number == 1 and "accuracy" in row:
            summary = row
        elif isinstance(row.get("id"), str):
            failed.add(row["id"])
    return failed, summary
