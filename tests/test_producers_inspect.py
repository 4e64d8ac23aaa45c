"""`inspect` on what Inspect AI itself writes: a real eval (mock model provider, real @tool tools, one of which
raises) writes a real `.eval` log; `ingest` and `score` read it back. The script and its known answer are in
tests/producers.py."""

from __future__ import annotations

import functools
import inspect
import json
from pathlib import Path
from typing import Any

import pytest
from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.model import ChatMessageAssistant, ModelOutput, ModelUsage, get_model
from inspect_ai.scorer import includes
from inspect_ai.solver import Generate, Solver, TaskState, generate, solver, use_tools
from inspect_ai.tool import Tool, ToolCall, ToolError, tool
from producers import (
    CALLS,
    CANCEL_ERROR,
    DESCRIPTIONS,
    EXPECTED_STEPS,
    FINAL,
    SCRIPT,
    TOOLS,
    USER,
    ToolFailure,
    assert_logged_definitions,
    ingest_and_score,
    score_with_log_definitions,
    verdicts,
)

from pipeline.ingest import ingest

CRASH = "Where is order O7777?"  # the second sample: its tool fails with an exception that is not a ToolError


def support_tool(name: str) -> Tool:
    """The script's tool `name` as an Inspect @tool: its failure is a ToolError (what Inspect shows the model);
    `get_order("O7777")` raises an error that is not one, so Inspect halts that sample."""
    fn = TOOLS[name]

    @functools.wraps(fn)
    async def execute(**arguments: Any) -> str:
        if arguments.get("order_id") == "O7777":
            raise RuntimeError("order service unreachable")
        try:
            return fn(**arguments)
        except ToolFailure as exc:
            raise ToolError(str(exc)) from exc

    params = "".join(f"\n        {p}: {p.replace('_', ' ')}" for p in inspect.signature(fn).parameters)
    execute.__doc__ = f"{DESCRIPTIONS[name]}\n\n    Args:{params}\n    "
    return tool(name=name)(lambda: execute)()


def model_turn(messages: list, tools: list, tool_choice: Any, config: Any) -> ModelOutput:
    """The mock model: SCRIPT's turn for the main sample, one `get_order` call and then an answer for CRASH."""
    turn = sum(1 for m in messages if m.role == "assistant")
    script = SCRIPT if messages[0].text == USER else [[c] for c in CALLS[1:2]]
    if turn >= len(script):
        return counted(ModelOutput.from_content(model="mockllm/model", content=FINAL))
    calls = [ToolCall(id=c.call_id, function=c.tool, arguments=dict(c.arguments)) for c in script[turn]]
    if messages[0].text == CRASH:
        calls = [ToolCall(id="call_9", function="get_order", arguments={"order_id": "O7777"})]
    message = ChatMessageAssistant(content="", tool_calls=calls, model="mockllm/model")
    return counted(ModelOutput.from_message(message, stop_reason="tool_calls"))


def counted(output: ModelOutput) -> ModelOutput:
    # With usage given, mockllm does not count tokens itself (tiktoken would download its encoding).
    output.usage = ModelUsage(input_tokens=50, output_tokens=12, total_tokens=62)
    return output


@pytest.fixture(scope="module")
def eval_log(tmp_path_factory) -> Path:
    logs = tmp_path_factory.mktemp("inspect-logs")
    task = Task(
        dataset=[Sample(input=USER, target="shipped", id="cancel"), Sample(input=CRASH, target="transit", id="crash")],
        solver=[use_tools(*map(support_tool, TOOLS)), generate()],
        scorer=includes(),
        name="support",
    )
    model = get_model("mockllm/model", custom_outputs=model_turn)
    [log] = eval(task, model=model, log_dir=str(logs), log_format="eval", display="none", fail_on_error=False)
    assert log.status == "success", log.error
    [path] = logs.glob("*.eval")
    return path


def test_a_real_eval_log_ingests_with_exact_calls_errors_and_pairing(eval_log):
    records = {r["task_id"]: r for r in ingest("inspect", [str(eval_log)])}
    assert sorted(records) == ["cancel", "crash"]
    rec = records["cancel"]
    assert rec["status"] == "ok" and rec["success"] is True and rec["labels"]["model"] == "mockllm/model"
    calls = [e for e in rec["events"] if e["type"] == "call"]
    assert [(c["tool"], c["call_id"], c["arguments"]) for c in calls] == [
        (c.tool, c.call_id, c.arguments) for c in CALLS
    ]
    # ids repeat across turns: each result answers the earliest unanswered call with its id
    assert [json.loads(c["output"]).get("customer_id") for c in calls[:1]] == ["C104"]
    assert json.loads(calls[1]["output"])["status"] == "shipped"
    assert (calls[2]["output"], calls[2]["error"]) == (CANCEL_ERROR, True)
    assert json.loads(calls[3]["output"])["carrier"] == "UPS"
    assert [c["error"] for c in calls] == [False, False, True, False]
    assert "orphan_results" not in rec["attributes"]
    assert_logged_definitions(rec)  # the tools of its model events
    assert all("tools_version" not in c for c in calls)  # one set throughout
    crash = records["crash"]
    assert crash["status"] == "harness_error" and "order service unreachable" in crash["attributes"]["harness_error"]
    [call] = [e for e in crash["events"] if e["type"] == "call"]
    assert (call["tool"], call["arguments"], "output" in call) == ("get_order", {"order_id": "O7777"}, False)


def test_a_real_eval_log_scores_through_the_cli(eval_log, tmp_path):
    # a process without inspect_ai: its zipfile patch for zstd members is absent there
    steps = ingest_and_score("inspect", eval_log, tmp_path)
    [cancel] = [k for k in steps if k.endswith("/cancel/1")]
    [crash] = [k for k in steps if k.endswith("/crash/1")]
    assert verdicts(steps[cancel]) == EXPECTED_STEPS
    assert verdicts(steps[crash]) == [("get_order", True, None)]  # O7777 is in the question; no result logged
    logged = [s for s in score_with_log_definitions(tmp_path) if s["rollout_id"] == cancel]
    assert verdicts(logged) == EXPECTED_STEPS and [s["schema_source"] for s in logged] == ["log"] * 4


def test_tools_that_change_within_a_sample_are_versions_each_call_under_the_set_in_force(tmp_path):
    # A solver that gives the model two tools for its first generation, then all four: Inspect's model events
    # record each generation's tools, so the first two calls are under one set and the last two under another.
    @solver
    def narrowed_then_all() -> Solver:
        async def solve(state: TaskState, generate: Generate) -> TaskState:
            state.tools = [support_tool("find_customer"), support_tool("get_order")]
            state = await generate(state, tool_calls="single")
            state.tools = [support_tool(name) for name in TOOLS]
            return await generate(state, tool_calls="loop")

        return solve

    task = Task(dataset=[Sample(input=USER, id="cancel")], solver=narrowed_then_all(), scorer=includes(), name="narrow")
    model = get_model("mockllm/model", custom_outputs=model_turn)
    [log] = eval(task, model=model, log_dir=str(tmp_path / "logs"), log_format="eval", display="none")
    assert log.status == "success", log.error
    [path] = (tmp_path / "logs").glob("*.eval")
    [record] = ingest("inspect", [str(path)])
    first, later = record["env"]["tool_versions"]
    assert sorted(first) == ["find_customer", "get_order"] and sorted(later) == sorted(TOOLS)
    assert record["env"]["tools"] == first
    calls = [e for e in record["events"] if e["type"] == "call"]
    assert [(c["tool"], c.get("tools_version", 0)) for c in calls] == [
        ("find_customer", 0), ("get_order", 0), ("cancel_order", 1), ("track_shipment", 1)
    ]  # fmt: skip
    steps = score_with_log_definitions_of(path, tmp_path)
    assert verdicts(steps) == EXPECTED_STEPS and [s["schema_source"] for s in steps] == ["log"] * 4


def score_with_log_definitions_of(path: Path, tmp: Path) -> list[dict[str, Any]]:
    from producers import pexec

    pexec("ingest", "inspect", str(path), "--out", "store", cwd=tmp)
    return score_with_log_definitions(tmp)
