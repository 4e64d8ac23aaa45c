"""Tool definitions read from the log: the shapes the production formats write them in, their versions within
a conversation, S checked against the set in force at each call, which schema decided, and runs scored before
steps recorded it."""

from __future__ import annotations

import json

import duckdb
import pyarrow.parquet as pq
import pytest

from pipeline.core.errors import InvalidRecord
from pipeline.core.model import Call, Message, Rollout
from pipeline.core.records import event_record, parse_event, parse_rollout
from pipeline.envs import EnvOptions, get_environment
from pipeline.ingest import IngestOptions, ingest
from pipeline.ingest._logs import ToolVersions, tool_definitions
from pipeline.metrics.duck import run_sql, set_variables
from pipeline.metrics.run import open_run
from pipeline.replay.checker import replay
from pipeline.scoring.driver import run_scoring
from pipeline.scoring.settings import ScoreSettings
from pipeline.storage.stores import write_store

ORDER = {"type": "object", "properties": {"order_id": {"type": "string"}}, "required": ["order_id"]}
EMAIL = {"type": "object", "properties": {"email": {"type": "string"}}, "required": ["email"]}


@pytest.mark.parametrize(
    "given",
    [
        [{"type": "function", "function": {"name": "get_order", "description": "d", "parameters": ORDER}}],  # chat
        [{"type": "function", "name": "get_order", "parameters": ORDER}],  # Responses API, OTel GenAI
        [{"name": "get_order", "description": "d", "input_schema": ORDER}],  # Anthropic
        [{"name": "get_order", "inputSchema": ORDER}],  # MCP
        json.dumps([{"type": "function", "name": "get_order", "parameters": ORDER}]),  # a span attribute's text
    ],
)
def test_every_shape_the_logs_write_reads_as_name_to_schema(given):
    assert tool_definitions(given) == {"get_order": ORDER}


def test_nothing_usable_is_no_definitions_and_a_function_without_parameters_takes_any_object():
    assert tool_definitions(None) is None and tool_definitions([]) is None and tool_definitions("not json") is None
    assert tool_definitions([{"type": "web_search"}]) is None  # a provider's built-in tool has no name
    assert tool_definitions([{"type": "function", "function": {"name": "now"}}]) == {"now": {"type": "object"}}


def test_versions_are_distinct_sets_in_order_of_first_use_and_a_call_is_under_the_last_given():
    v = ToolVersions()
    stamped = [v.stamp({"type": "call", "tool": "x", "arguments": {}})]  # before any: the first
    for given in ({"a": ORDER}, None, {"a": ORDER, "b": EMAIL}, {"a": ORDER}):
        v.given(given)
        stamped.append(v.stamp({"type": "call", "tool": "x", "arguments": {}}))
    assert [e.get("tools_version", 0) for e in stamped] == [0, 0, 0, 1, 0]
    assert v.env() == {"tools": {"a": ORDER}, "tool_versions": [{"a": ORDER}, {"a": ORDER, "b": EMAIL}]}
    single = ToolVersions()
    single.given({"a": ORDER})
    single.given({"a": ORDER})
    assert single.env() == {"tools": {"a": ORDER}} and ToolVersions().env() == {}


def test_the_version_survives_the_canonical_record_and_a_bad_one_is_refused():
    call = parse_event({"type": "call", "tool": "x", "arguments": {}, "tools_version": 2}, "events[0]")
    assert isinstance(call, Call) and call.tools_version == 2
    assert event_record(call)["tools_version"] == 2
    assert "tools_version" not in event_record(parse_event({"type": "call", "tool": "x"}, "events[0]"))
    with pytest.raises(InvalidRecord, match="tools_version"):
        parse_event({"type": "call", "tool": "x", "tools_version": -1}, "events[0]")


def observed_steps(env: dict, *calls: Call, spec: str | None = None) -> list[tuple]:
    rollout = Rollout("r", "t", "observed", env=env, events=[Message("user", "order O1, ava@example.com"), *calls])
    result = replay(get_environment("observed", EnvOptions(spec=spec)), rollout)
    return [(s.tool, s.valid, s.failed_check, s.schema_source) for s in result.steps]


def test_s_is_checked_against_the_set_in_force_at_each_call():
    env = {"tools": {"get_order": ORDER}, "tool_versions": [{"get_order": ORDER}, {"find_customer": EMAIL}]}
    assert observed_steps(
        env,
        Call("get_order", {"order_id": "O1"}),  # version 0 has it
        Call("find_customer", {"email": "ava@example.com"}),  # not yet given to the model: unknown
        Call("find_customer", {"email": "ava@example.com"}, tools_version=1),
        Call("find_customer", {"mail": "ava@example.com"}, tools_version=1),  # against the logged schema
        Call("get_order", {"order_id": "O1"}, tools_version=1),  # withdrawn by then
    ) == [
        ("get_order", True, None, "log"),
        ("find_customer", False, "S", None),
        ("find_customer", True, None, "log"),
        ("find_customer", False, "S", "log"),
        ("get_order", False, "S", None),
    ]


def test_a_spec_decides_the_tools_it_declares_and_no_definitions_leave_only_well_formedness():
    logged = {"tools": {"get_order": {"type": "object"}, "nap": {"type": "object"}}}
    calls = (Call("get_order", {"order_id": 5}), Call("nap", {}))
    assert observed_steps(logged, *calls, spec="support") == [
        ("get_order", False, "S", "spec"),  # the spec's schema wins over the looser logged one
        ("nap", True, None, "log"),
    ]
    assert observed_steps({}, *calls) == [("get_order", True, None, None), ("nap", True, None, None)]


def test_a_simulated_environment_records_its_own_schema_as_spec(tmp_path):
    rollout = Rollout("r", "t", "support", events=[Message("user", "O1"), Call("get_order", {"order_id": "O1"})])
    [step] = replay(get_environment("support", EnvOptions()), rollout).steps
    assert step.schema_source == "spec"


def test_chat_logs_carry_their_request_tools_and_score_against_them(tmp_path):
    chat = {
        "id": "c1",
        "tools": [{"type": "function", "function": {"name": "get_order", "parameters": ORDER}}],
        "messages": [
            {"role": "user", "content": "where is O1?"},
            {
                "role": "assistant",
                "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "get_order", "arguments": '{"id": "O1"}'}}
                ],
            },
            {"role": "tool", "tool_call_id": "a", "content": "{}"},
        ],
    }
    anthropic = {
        "id": "a1",
        "tools": [{"name": "get_order", "input_schema": ORDER}],
        "messages": [
            {"role": "user", "content": "where is O1?"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t", "name": "get_order", "input": {"order_id": "O1"}}],
            },
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t", "content": "{}"}]},
        ],
    }
    (tmp_path / "openai.json").write_text(json.dumps(chat))
    (tmp_path / "anthropic.json").write_text(json.dumps(anthropic))
    [o] = ingest("openai", [str(tmp_path / "openai.json")], IngestOptions())
    [a] = ingest("anthropic", [str(tmp_path / "anthropic.json")], IngestOptions())
    assert o["env"] == {"tools": {"get_order": ORDER}} == a["env"]
    assert [(s.valid, s.failed_check, s.schema_source) for r in (o, a) for s in _replayed(r)] == [
        (False, "S", "log"),  # `id` is not `order_id`: the schema the model saw says so
        (True, None, "log"),
    ]


def _replayed(record: dict) -> list:
    return replay(get_environment("observed", EnvOptions()), parse_rollout(record)).steps


def test_a_run_scored_before_steps_recorded_the_schema_source_reads_it_as_null(tmp_path):
    record = {"rollout_id": "r", "task_id": "t", "benchmark": "observed", "labels": {}, "success": True,
              "env": {"tools": {"get_order": ORDER}},
              "events": [{"type": "message", "role": "user", "content": "O1"},
                         {"type": "call", "tool": "get_order", "arguments": {"order_id": "O1"}}]}  # fmt: skip
    write_store([record], str(tmp_path / "store"))
    run_scoring(str(tmp_path / "store"), str(tmp_path / "run"), ScoreSettings(inline=True))
    assert open_run(str(tmp_path / "run")).steps().column("schema_source").to_pylist() == ["log"]
    [part] = (tmp_path / "run" / "steps").glob("*.parquet")
    old = tmp_path / "old.parquet"  # the same part as a run scored before the column wrote it
    pq.write_table(pq.read_table(part).drop_columns(["schema_source"]), old)
    con = duckdb.connect()
    set_variables(con, steps_files=[str(part), str(old)])
    run_sql(con, "metrics/view_steps")
    assert con.sql("SELECT schema_source FROM steps ORDER BY schema_source NULLS LAST").fetchall() == [
        ("log",),
        (None,),
    ]
