"""The customer-support sample as an Inspect AI `.eval` log of a chosen size, written by Inspect's own writer, for
the benchmark of reading `.eval` logs.

A tiny real eval (Inspect's `mockllm` provider, one sample) gives the log's header (task, model, plan); then every
conversation of `pipeline.synthetic.support_logs` becomes a sample (its messages, one model event per assistant
turn carrying the conversation so far as Inspect records it, the tool results, an error for `Error:` results, a
score `C`/`I` from the logger's success flag), handed to Inspect's `.eval` recorder (what `write_eval_log` uses)
in batches it flushes to the archive, until the file reaches the size asked for. The first `_DISTINCT`
conversations are built once and then repeated under new sample ids, so a log of hundreds of MB is written at the
recorder's own speed. Needs inspect-ai (a development dependency).
"""

from __future__ import annotations

import asyncio
import random
import tempfile
from pathlib import Path
from typing import Any

import orjson

from pipeline.synthetic.support_logs import conversation

_BATCH = 500  # samples handed to the recorder between flushes (its buffer, bounded)
_DISTINCT = 2000  # distinct conversations; later samples repeat them under ids of their own


def write_eval(out: str | Path, megabytes: float, seed: int = 0, day: str = "2026-11-29") -> int:
    """Write an Inspect `.eval` log of at least `megabytes` MiB at `out`; returns the samples written."""
    from inspect_ai import Task, eval
    from inspect_ai.dataset import Sample
    from inspect_ai.model import ModelOutput, ModelUsage, get_model

    # With usage given, mockllm does not count tokens itself (tiktoken would download its encoding).
    reply = ModelOutput.from_content(model="mockllm/model", content="Done.")
    reply.usage = ModelUsage(input_tokens=10, output_tokens=2, total_tokens=12)
    with tempfile.TemporaryDirectory(prefix="pexec-eval-seed-") as seed_dir:
        task = Task(dataset=[Sample(input="Hi", target="C", id="seed")], name="support")
        model = get_model("mockllm/model", custom_outputs=[reply])
        [log] = eval(task, model=model, log_dir=seed_dir, display="none")
    return asyncio.run(_write(log, Path(out), int(megabytes * 2**20), seed, day))


async def _write(log: Any, out: Path, target: int, seed: int, day: str) -> int:
    from inspect_ai.log._recorders.eval import EvalRecorder

    out.parent.mkdir(parents=True, exist_ok=True)
    out.unlink(missing_ok=True)
    recorder = EvalRecorder(str(out.parent))
    await recorder.log_init(log.eval, str(out), clean=True)
    await recorder.log_start(log.eval, log.plan)
    rng = random.Random(f"{seed}/{day}")
    pool: list[Any] = []
    n = 0
    while n == 0 or out.stat().st_size < target:
        for _ in range(_BATCH):
            if len(pool) < _DISTINCT:
                pool.append(_sample(conversation(rng, n, day)))
                sample = pool[-1]
            else:
                sample = pool[n % _DISTINCT].model_copy(update={"id": f"{day}-{n:07d}"})
            await recorder.log_sample(log.eval, sample)
            n += 1
        await recorder.flush(log.eval)
    await recorder.log_finish(log.eval, "success", log.stats, log.results, log.reductions)
    return n


def _sample(record: dict[str, Any]) -> Any:
    from inspect_ai.event import ModelEvent
    from inspect_ai.log import EvalSample
    from inspect_ai.model import (
        ChatMessageAssistant,
        ChatMessageTool,
        ChatMessageUser,
        GenerateConfig,
        ModelOutput,
    )
    from inspect_ai.scorer import Score
    from inspect_ai.tool import ToolCall, ToolCallError

    messages: list[Any] = []
    events: list[Any] = []
    for m in record["messages"]:
        if m["role"] == "user":
            messages.append(ChatMessageUser(content=m["content"]))
        elif m["role"] == "assistant":
            calls = [_tool_call(ToolCall, c) for c in m.get("tool_calls") or []]
            reply = ChatMessageAssistant(
                content=m.get("content") or "", tool_calls=calls or None, model="mockllm/model"
            )
            events.append(ModelEvent(model="mockllm/model", input=list(messages), tools=[], tool_choice="auto",
                                     config=GenerateConfig(), output=ModelOutput.from_message(reply)))  # fmt: skip
            messages.append(reply)
        elif m["role"] == "tool":
            content = str(m.get("content") or "")
            error = ToolCallError("unknown", content) if content.startswith("Error:") else None
            messages.append(ChatMessageTool(content=content, tool_call_id=m["tool_call_id"], error=error))
    return EvalSample(id=record["id"], epoch=1, input=messages[0].text, target="C", messages=messages, events=events,
                      scores={"includes": Score(value="C" if record["success"] else "I")})  # fmt: skip


def _tool_call(tool_call: Any, c: dict[str, Any]) -> Any:
    """An OpenAI tool call as Inspect records it; arguments that are not a JSON object are a parse error."""
    text = c["function"]["arguments"]
    try:
        arguments = orjson.loads(text)
    except orjson.JSONDecodeError:
        arguments = None
    if isinstance(arguments, dict):
        return tool_call(id=c["id"], function=c["function"]["name"], arguments=arguments)
    return tool_call(id=c["id"], function=c["function"]["name"], arguments={}, parse_error=f"not JSON: {text}")
