"""The Inspect AI scorer (pipeline.apps.integrations.inspect) in a real Inspect eval — mock model provider, real @tool
tools, two epochs — against what `pexec ingest inspect` + `pexec score` make of the `.eval` log that eval wrote:
every sample's FED, T and per-step verdicts, and TER and AUC-PEC, are the same."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.log import read_eval_log
from inspect_ai.model import ChatMessageAssistant, ModelOutput, get_model
from inspect_ai.scorer import includes
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import ToolCall
from producers import EXPECTED_STEPS, TOOLS, USER, ingest_and_score
from test_producers_inspect import CRASH, counted, model_turn, support_tool

from pipeline import open_run
from pipeline.apps.integrations.inspect import executability

TRACK = "Where is my order O5521?"  # a third sample: one valid call, then the answer


def model(messages: list, tools: list, tool_choice: Any, config: Any) -> ModelOutput:
    if messages[0].text != TRACK:
        return model_turn(messages, tools, tool_choice, config)
    if any(m.role == "assistant" for m in messages):
        return counted(ModelOutput.from_content(model="mockllm/model", content="It is in transit with UPS."))
    call = ToolCall(id="call_1", function="track_shipment", arguments={"order_id": "O5521"})
    message = ChatMessageAssistant(content="", tool_calls=[call], model="mockllm/model")
    return counted(ModelOutput.from_message(message, stop_reason="tool_calls"))


@pytest.fixture(scope="module")
def scored_eval(tmp_path_factory) -> Path:
    logs = tmp_path_factory.mktemp("inspect-scored")
    task = Task(
        dataset=[
            Sample(input=USER, target="shipped", id="cancel"),
            Sample(input=CRASH, target="transit", id="crash"),
            Sample(input=TRACK, target="transit", id="track"),
        ],
        solver=[use_tools(*map(support_tool, TOOLS)), generate()],
        scorer=[includes(), executability(env="observed", spec="support")],
        name="support",
        epochs=2,
    )
    [log] = eval(task, model=get_model("mockllm/model", custom_outputs=model), log_dir=str(logs), log_format="eval",
                 display="none", fail_on_error=False)  # fmt: skip
    assert log.status == "success", log.error
    [path] = logs.glob("*.eval")
    return path


def test_the_scores_in_the_eval_log_equal_pexec_score_of_that_log(scored_eval: Path, tmp_path: Path) -> None:
    log = read_eval_log(str(scored_eval))
    scored = {(s.id, s.epoch): s.scores["executability"] for s in log.samples or [] if s.scores}
    assert sorted(scored) == [("cancel", 1), ("cancel", 2), ("track", 1), ("track", 2)]  # crash: halted, unscored

    steps = ingest_and_score("inspect", scored_eval, tmp_path)
    assert len(steps) == 6  # the crashed samples too: harness errors in pexec, outside its metrics
    for (sample, epoch), score in scored.items():
        [rows] = [v for k, v in steps.items() if k.endswith(f"/{sample}/{epoch}")]
        first = next((r["step"] for r in rows if not r["valid"]), len(rows) + 1)
        assert score.value == {
            "fed": first, "T": len(rows), "executable": first == len(rows) + 1,
            "auc_term": (first - 1) / len(rows) if rows else 1.0,
        }  # fmt: skip
        keys = ("step", "tool", "valid", "failed_check", "cause", "detail")
        assert score.metadata["steps"] == [{k: r[k] for k in keys} for r in rows]
    cancel = scored[("cancel", 1)]
    assert [(s["tool"], s["valid"], s["failed_check"]) for s in cancel.metadata["steps"]] == EXPECTED_STEPS
    assert cancel.value["fed"] == 3 and cancel.value["T"] == 4

    [result] = [r for r in log.results.scores if r.name == "executability"]
    [metrics] = open_run(str(tmp_path / "run")).metrics(bootstrap=50).to_pylist()
    assert result.metrics["ter"].value == pytest.approx(metrics["ter"]) == 0.5
    assert result.metrics["auc_pec"].value == pytest.approx(metrics["auc_pec"]) == 0.75
    assert metrics["n"] == 4 and metrics["n_harness_error"] == 2
