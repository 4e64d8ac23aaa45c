"""S decided from the log's own tool definitions against S decided by the official environment, on the shared real
BFCL and τ runs: every rollout is turned into an OpenAI chat-completions log whose `tools` are the benchmark's own
published schemas (BFCL's function docs through BFCL's own OpenAI converter; τ's tools as tau2 gives them to the
agent, `Tool.openai_schema`), read back by the `openai` adapter and scored by `observed` with no spec. Every step
is compared; the disagreements are listed by class in docs/reference/log-formats.md ("Tool definitions")."""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path
from typing import Any
from unittest import mock

import orjson
import pytest

from pipeline.core.records import parse_rollout
from pipeline.envs import EnvOptions, get_environment
from pipeline.ingest import IngestOptions, ingest
from pipeline.replay.checker import replay

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "real"
TAU_RUNS = (
    "airline_claude-opus-4-6.json",
    "airline_claude-sonnet-4-5.json",
    "airline_gpt-4o.json",
    "airline_gpt-5.4.json",
    "airline_gpt-oss-120b_langchain.json",
    "retail_gpt-4.1.json",
)


def _need(path: Path) -> None:
    if not path.exists():
        pytest.fail(f"the shared real logs are missing: {path} (../shared/data must be beside the project)")


def bfcl_tools(involved: list[str]) -> list[dict[str, Any]]:
    """The OpenAI tools BFCL itself gives a chat-completions model for these classes: its function docs through
    its own converter (`convert_to_tool`, OpenAI-completions style). Its module imports the Java/JS call parsers,
    which need tree-sitter, unused here: they are stubbed for the import."""
    with mock.patch.dict(sys.modules, {m: mock.MagicMock() for m in ("tree_sitter", "tree_sitter_java",
                                                                       "tree_sitter_javascript")}):  # fmt: skip
        from bfcl_eval.constants.enums import ModelStyle
        from bfcl_eval.constants.type_mappings import GORILLA_TO_OPENAPI
        from bfcl_eval.model_handler.utils import convert_to_tool

    from pipeline.envs.bfcl.official import release

    docs = release("v4").function_docs
    functions = [doc for cls in involved for doc in docs[cls]]
    tools: list[dict[str, Any]] = convert_to_tool(functions, GORILLA_TO_OPENAPI, ModelStyle.OPENAI_COMPLETIONS)
    return tools


def tau_tools(domain: str) -> list[dict[str, Any]]:
    """The tools tau2 gives the agent of `domain`: each tool's own `openai_schema`."""
    from pipeline.envs.tau.env import load_toolkit

    return [tool.openai_schema for _, tool in sorted(load_toolkit(domain).get_tools().items())]


def as_openai(record: dict[str, Any], tools: list[dict[str, Any]]) -> dict[str, Any]:
    """A canonical rollout as a chat-completions log: user and system messages as they are, each call an assistant
    tool call answered by a tool message with the logged output and error."""
    messages: list[dict[str, Any]] = []
    for i, e in enumerate(record["events"]):
        if e["type"] == "message":
            if e["role"] in ("user", "system"):
                messages.append({"role": e["role"], "content": e["content"]})
            continue
        args = e["arguments"] if isinstance(e["arguments"], str) else orjson.dumps(e["arguments"]).decode()
        messages.append({"role": "assistant", "content": None, "tool_calls": [
            {"id": f"c{i}", "type": "function", "function": {"name": e["tool"], "arguments": args}}]})  # fmt: skip
        reply: dict[str, Any] = {"role": "tool", "tool_call_id": f"c{i}", "content": str(e.get("output") or "")}
        if e.get("error") is not None:
            reply["error"] = e["error"]
        messages.append(reply)
    return {"id": record["rollout_id"], "messages": messages, "tools": tools}


def compare(records: list[dict[str, Any]], tools_of: Any, benchmark_of: Any, tmp: Path) -> tuple[int, list[tuple]]:
    """(steps compared, disagreements as (rollout, step, tool, official S detail, log S detail))."""
    logs = tmp / "logs.jsonl"
    logs.write_bytes(b"\n".join(orjson.dumps(as_openai(r, tools_of(r))) for r in records))
    from_log = {r["rollout_id"]: r for r in ingest("openai", [str(logs)], IngestOptions())}
    observed = get_environment("observed", EnvOptions())
    official_envs: dict[str, Any] = {}
    compared, disagreements = 0, []
    for r in records:
        name = benchmark_of(r)
        env = official_envs.setdefault(name, get_environment(name, EnvOptions()))
        official = replay(env, parse_rollout(r)).steps
        logged = replay(observed, parse_rollout(from_log[r["rollout_id"]])).steps
        assert [s.tool for s in official] == [s.tool for s in logged]
        for a, b in zip(official, logged, strict=True):
            compared += 1
            assert b.schema_source == "log" or b.failed_check == "S"
            if (a.failed_check == "S") != (b.failed_check == "S"):
                detail_a = a.detail if a.failed_check == "S" else None
                detail_b = b.detail if b.failed_check == "S" else None
                disagreements.append((r["rollout_id"], a.step, a.tool, detail_a, detail_b))
    return compared, disagreements


def kind(d: tuple) -> str:
    """The class of a disagreement, by which side failed S and why."""
    _, _, _, official, logged = d
    if official and "not available at turn" in official:
        return WITHHELD
    if official and "must not contain" in official:
        return OPEN_KEYS
    if logged and "must be" in logged:
        return NULL_DEFAULT
    if official and "must contain" in official:
        return ANY_OBJECT
    return f"unclassified: official {official!r}, log {logged!r}"


# BFCL miss_func withholds a function until a later turn; a chat log has one `tools` list per conversation.
WITHHELD = "withheld until a later turn"
# BFCL's published parameters allow any key; the simulator's method refuses a keyword it does not take.
OPEN_KEYS = "a key the method does not take"
# The published type of a parameter whose Python default is None is not nullable; the simulator takes null.
NULL_DEFAULT = "null for a parameter that defaults to None"
# τ publishes a nested model as `anyOf: [the model, any object]`; its environment requires the model's fields.
ANY_OBJECT = "an object missing a nested model's required fields"


def test_bfcl_s_from_the_logged_definitions_against_the_official_environment(tmp_path):
    _need(SHARED / "bfcl" / "gpt-oss-120b")
    records = list(ingest("bfcl", [str(SHARED / "bfcl" / "gpt-oss-120b")], IngestOptions()))
    cache: dict[tuple[str, ...], list[dict[str, Any]]] = {}

    def tools_of(r: dict[str, Any]) -> list[dict[str, Any]]:
        involved = tuple(r["env"]["involved_classes"])
        return cache.setdefault(involved, bfcl_tools(list(involved)))

    compared, disagreements = compare(records, tools_of, lambda r: r["benchmark"], tmp_path)
    classes = Counter(kind(d) for d in disagreements)
    print(f"\nBFCL: {compared} steps compared, {len(disagreements)} disagreements: {dict(classes)}")
    for d in disagreements:
        print("  ", d)
    assert compared == 4459
    assert dict(classes) == EXPECTED_BFCL


def test_tau_s_from_the_logged_definitions_against_the_official_environment(tmp_path):
    for name in TAU_RUNS:
        _need(SHARED / "tau2" / name)
    records = list(ingest("tau2", [str(SHARED / "tau2" / n) for n in TAU_RUNS], IngestOptions()))
    cache: dict[str, list[dict[str, Any]]] = {}

    def tools_of(r: dict[str, Any]) -> list[dict[str, Any]]:
        domain = r["env"]["domain"]
        return cache.setdefault(domain, tau_tools(domain))

    compared, disagreements = compare(records, tools_of, lambda r: r["benchmark"], tmp_path)
    classes = Counter(kind(d) for d in disagreements)
    print(f"\nτ: {compared} steps compared, {len(disagreements)} disagreements: {dict(classes)}")
    for d in disagreements:
        print("  ", d)
    assert (compared, dict(classes)) == EXPECTED_TAU


EXPECTED_BFCL = {NULL_DEFAULT: 10, OPEN_KEYS: 8, WITHHELD: 1}  # of 4,459 steps
EXPECTED_TAU = (2661, {ANY_OBJECT: 3})  # book_reservation's payment_methods items
