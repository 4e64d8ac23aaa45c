"""ToolSandbox local tools: every rule passes and fails, id mapping and clock, injected failures with known
FED and cause, the ingest adapter, and an end-to-end scoring of a small store of run folders."""

from __future__ import annotations

import datetime as dt
from pathlib import Path
from typing import Any
from zoneinfo import ZoneInfo

import duckdb
import orjson
import pytest
from typer.testing import CliRunner

from pipeline.apps.cli import app
from pipeline.core.records import parse_rollout
from pipeline.envs import get_environment
from pipeline.envs.toolsandbox._utilities import ToolError, convert, geodesic_km, holiday
from pipeline.envs.toolsandbox.env import seed_id
from pipeline.ingest import IngestError, IngestOptions, ingest
from pipeline.replay.checker import replay
from pipeline.scoring.driver import run_scoring
from pipeline.scoring.settings import ScoreSettings

NOW = 1717591000.0  # 2024-06-05 12:36:40 UTC
# A run folder upstream's own runner wrote (tests/toolsandbox_runs/record.py: scripts.SAMPLE).
RUN = next((Path(__file__).parent / "data" / "toolsandbox").glob("agent_*"))
SELF, FRED = seed_id("Tomas Haake"), seed_id("Fredrik Thordendal")
REMINDER = seed_id("reminder_0")
KNOWN = f"ids {SELF} {FRED} {REMINDER} +12453344098 +19998887777 ghost-id"  # a user message that grounds these values


def call(tool: str, output: Any = None, **args: Any) -> dict[str, Any]:
    event = {"type": "call", "tool": tool, "arguments": args}
    return event if output is None else {**event, "output": output}


def run(calls: list[dict[str, Any]], settings: str = "base", now: float = NOW, rid: str = "r") -> Any:
    events = [{"type": "message", "role": "user", "content": KNOWN}, *calls]
    record = {"rollout_id": rid, "task_id": rid, "benchmark": "toolsandbox",
              "env": {"now": now, "settings": settings}, "events": events}  # fmt: skip
    return replay(get_environment("toolsandbox"), parse_rollout(record))


LOW = "base_low_battery_mode_on_wifi_off_location_service_off_cellular_off"
# (rule, settings variant, setup calls, passing call, failing call)
RULES = [
    (
        "send needs cellular",
        "base",
        [],
        call("send_message_with_phone_number", phone_number="+12453344098", content="hi"),
        None,
    ),
    (
        "send needs cellular (off)",
        "base_cellular_off",
        [call("set_cellular_service_status", on=True)],
        call("send_message_with_phone_number", phone_number="+12453344098", content="hi"),
        "cellular",
    ),
    (
        "send needs one self contact",
        "base",
        [call("modify_contact", person_id=SELF, is_self=False)],
        call("get_wifi_status"),
        "self",
    ),
    (
        "parseable phone number",
        "base",
        [],
        call("send_message_with_phone_number", phone_number="+19998887777", content="x"),
        "phone",
    ),
    (
        "radios need low battery off",
        LOW,
        [call("set_low_battery_mode_status", on=False)],
        call("set_wifi_status", on=True),
        "wifi",
    ),
    ("same value is an error", "base", [], call("set_wifi_status", on=False), "same"),
    ("location needs location service", "base", [], call("get_current_location"), "location"),
    ("holiday needs wifi", "base", [], call("search_holiday", holiday_name="Christmas", year=2024), "holiday"),
    ("unknown contact id", "base", [], call("remove_contact", person_id=FRED), "contact"),
    ("unknown reminder id", "base", [], call("remove_reminder", reminder_id=REMINDER), "reminder"),
    ("second self contact", "base", [], call("add_contact", name="Me", phone_number="+19998887777"), "second self"),
    ("search needs criteria", "base", [], call("search_contacts", name="Fredrik"), "criteria"),
    ("modify needs fields", "base", [], call("modify_contact", person_id=FRED, name="Fred"), "fields"),
    ("timestamp range", "base", [], call("timestamp_to_datetime_info", timestamp=NOW), "ts"),
    ("latitude range", "base", [], call("add_reminder", content="x", reminder_timestamp=NOW, latitude=45.0), "lat"),
    ("longitude range", "base", [], call("add_reminder", content="x", reminder_timestamp=NOW, longitude=-120.0), "lon"),
]
FAILING = {
    "cellular": (
        "base_cellular_off",
        call("send_message_with_phone_number", phone_number="+12453344098", content="hi"),
        "Cellular service is not enabled",
    ),
    "self": (
        "base",
        [
            call("modify_contact", person_id=SELF, is_self=False),
            call("send_message_with_phone_number", phone_number="+12453344098", content="hi"),
        ],
        "instead found 0",
    ),
    "phone": ("base", call("send_message_with_phone_number", phone_number="12453344098", content="x"), "NumberParse"),
    "wifi": (LOW, call("set_wifi_status", on=True), "cannot be turned on in low battery mode"),
    "same": ("base", call("set_wifi_status", on=True), "wifi already enabled"),
    "location": ("base_location_service_off", call("get_current_location"), "Location service is not enabled"),
    "holiday": ("base_wifi_off", call("search_holiday", holiday_name="Christmas", year=2024), "Wifi is not enabled"),
    "contact": ("base", call("remove_contact", person_id="ghost-id"), "No db entry"),
    "reminder": ("base", call("modify_reminder", reminder_id="ghost-id", content="x"), "No db entry"),
    "second self": (
        "base",
        call("add_contact", name="Me", phone_number="+19998887777", is_self=True),
        "Self entry already exists",
    ),
    "criteria": ("base", call("search_messages"), "No search criteria"),
    "fields": ("base", call("modify_reminder", reminder_id=REMINDER), "No update information"),
    "ts": ("base", call("timestamp_to_datetime_info", timestamp=NOW * 1000), "valid range"),
    "lat": ("base", call("add_reminder", content="x", reminder_timestamp=NOW, latitude=91.0), "-90 .. 90"),
    "lon": ("base", call("add_reminder", content="x", reminder_timestamp=NOW, longitude=-181.0), "-180 .. 180"),
}


@pytest.mark.parametrize("rule", RULES, ids=[r[0] for r in RULES])
def test_rule_passes(rule: tuple) -> None:
    _, settings, setup, passing, _ = rule
    steps = run([*setup, passing], settings).steps
    assert [s.valid for s in steps] == [True] * len(steps), [s.detail for s in steps]


@pytest.mark.parametrize("key", sorted(FAILING))
def test_rule_fails(key: str) -> None:
    settings, failing, message = FAILING[key]
    step = run(failing if isinstance(failing, list) else [failing], settings).steps[-1]
    assert (step.valid, step.failed_check) == (False, "P")
    assert message in step.detail


def test_setup_breaks_send_when_no_self_contact() -> None:
    steps = run([call("modify_contact", person_id=SELF, is_self=False),
                 call("send_message_with_phone_number", phone_number="+12453344098", content="hi")]).steps  # fmt: skip
    assert [s.valid for s in steps] == [True, False]
    assert steps[1].cause == "state_consistency"  # the agent's own change broke a call s_0 would accept


def test_low_battery_mode_turns_radios_off() -> None:
    steps = run([call("set_low_battery_mode_status", on=True), call("get_wifi_status", output=False),
                 call("get_cellular_service_status", output=False), call("set_low_battery_mode_status", on=False),
                 call("set_cellular_service_status", on=True)]).steps  # fmt: skip
    assert all(s.valid for s in steps) and steps[1].output_match and steps[2].output_match


def test_created_ids_are_mapped_to_the_replay() -> None:
    live = "0c2f9a44-5d7e-4b8e-9f31-6a2b1d3c4e5f"
    result = run([call("add_reminder", output=live, content="milk", reminder_timestamp=NOW + 60),
                  call("search_reminder", reminder_id=live), call("modify_reminder", reminder_id=live, content="oat"),
                  call("remove_reminder", reminder_id=live), call("remove_reminder", reminder_id=live)])  # fmt: skip
    assert [s.valid for s in result.steps] == [True, True, True, True, False]
    assert result.steps[0].output_match is True  # the replay shows the live id
    assert result.fed == 5


def test_clock_comes_from_the_log_not_today() -> None:
    day = 86400.0
    for now in (NOW, NOW + 400 * day):
        steps = run([call("search_reminder", reminder_timestamp_lowerbound=now - 2 * day,
                          reminder_timestamp_upperbound=now - 0.5 * day)], now=now).steps  # fmt: skip
        assert steps[0].valid
    env = get_environment("toolsandbox")
    state = env.start(parse_rollout({"rollout_id": "c", "task_id": "c", "benchmark": "toolsandbox",
                                     "env": {"now": NOW}, "events": []}))  # fmt: skip
    assert state.doc["reminder"][0]["reminder_timestamp"] == NOW - day
    stepped = run([call("get_current_timestamp", output=NOW + 30), call("get_current_timestamp")])
    assert stepped.steps[0].output_match is True


def test_missing_clock_is_a_clear_error() -> None:
    from pipeline.envs import EnvError

    record = {"rollout_id": "x", "task_id": "x", "benchmark": "toolsandbox", "env": {}, "events": []}
    with pytest.raises(EnvError, match="needs 'now'"):
        get_environment("toolsandbox").start(parse_rollout(record))


def test_injected_failures_have_known_fed_and_cause() -> None:
    ok = [call("get_wifi_status"), call("search_contacts", name="Fredrik Thordendal")]
    cases = {
        "schema": (call("search_lat_lon", latitude=1.0), "S"),  # a RapidAPI tool: not available
        "information": (call("remove_contact", person_id="made-up-id"), "D"),
        "precondition": (call("get_current_location"), "P"),
    }
    for cause, (bad, check) in cases.items():
        settings = "base_location_service_off" if cause == "precondition" else "base"
        result = run([*ok, bad, call("get_low_battery_mode_status")], settings)
        assert (result.fed, result.first_cause, result.steps[2].failed_check) == (3, cause, check), cause
        assert result.steps[3].valid


def test_utilities_match_upstream_values() -> None:
    # Textbook conversions, Vincenty's published test line (Flinders Peak -> Buninyong, 54,972.271 m), the US
    # calendar (Thanksgiving 2024 on Nov 28; a holiday on a Sunday is observed on the Monday, which upstream's
    # ranking returns, one on a Saturday is observed on the Friday, and the later date, the day itself, wins).
    utc = ZoneInfo("UTC")
    assert convert(100, "celsius", "fahrenheit") == pytest.approx(212.0)
    assert convert(1, "mile", "km") == pytest.approx(1.609344)
    assert convert(5, "Miles", "Kilometers") == pytest.approx(8.04672)  # unknown as written: lower-cased
    with pytest.raises(ToolError, match="UndefinedUnitError"):
        convert(1, "survey acre", "m**2")  # as upstream: "survey" is no pint unit
    flinders, buninyong = (-37.95103341666667, 144.42486788888888), (-37.65282113888889, 143.92649552777778)
    assert geodesic_km(*flinders, *buninyong) == pytest.approx(54.972271, abs=1e-6)
    assert holiday("thanksgiving", 2024, utc) == 1732752000.0
    assert holiday("Christmas", 2022, utc) == 1672012800.0  # Sunday Dec 25 -> Monday Dec 26
    assert holiday("Christmas Day", 2021, utc) == 1640390400.0  # Saturday Dec 25 (observed Friday the 24th)
    assert holiday("Halloween", 2024, utc) is None
    result = run([call("datetime_info_to_timestamp", year=2024, month=2, day=30, hour=0, minute=0, second=0),
                  call("unit_conversion", amount=1, from_unit="parsec_banana", to_unit="m")])  # fmt: skip
    assert [s.valid for s in result.steps] == [False, False]


def test_the_divergences_of_issue_14_behave_as_upstream() -> None:
    # Numbers libphonenumber parses are accepted (an extension, a vanity number); a null for an argument upstream
    # declares optional is accepted; a float where upstream's typechecked tool wants an int is a failed call, not
    # a crash of the run.
    result = run([call("add_contact", name="Office", phone_number="+1 415 555 0123 ext 12", relationship=None),
                  call("add_contact", name="Flowers", phone_number="+1-800-FLOWERS"),
                  call("search_contacts", name=None, output=[]),
                  call("add_reminder", content="milk", reminder_timestamp=NOW + 60, latitude=None),
                  call("datetime_info_to_timestamp", year=2024, month=5, day=13.0, hour=9, minute=0, second=0),
                  call("search_holiday", holiday_name="Christmas", year=2024.0),
                  call("get_wifi_status")])  # fmt: skip
    assert [s.valid for s in result.steps] == [True, True, True, True, False, False, True]
    assert result.steps[2].output_match is True
    assert "TypeError: Parameter 'day' is of type 'float'" in result.steps[4].detail
    assert result.steps[4].failed_check == "P" and result.steps[5].failed_check == "P"


def test_a_modified_row_moves_to_the_end_of_its_table() -> None:
    # Upstream's modify removes the row and appends the changed one: searches list it last afterwards.
    john = seed_id("John Petrucci")
    friends = lambda *ids: [{"person_id": i} for i in ids]  # noqa: E731
    env = get_environment("toolsandbox")
    state = env.start(parse_rollout({"rollout_id": "m", "task_id": "m", "benchmark": "toolsandbox",
                                     "env": {"now": NOW}, "events": []}))  # fmt: skip
    search = parse_rollout({"rollout_id": "m", "task_id": "m", "benchmark": "toolsandbox", "env": {"now": NOW},
                            "events": [call("search_contacts", relationship="friend")]}).calls[0]  # fmt: skip
    before = env.execute(state, "search_contacts", {"relationship": "friend"}, search).output
    assert [{"person_id": r["person_id"]} for r in before] == friends(FRED, john)
    assert env.execute(state, "modify_contact", {"person_id": FRED, "name": "Fredrik T"}, search).accepted
    after = env.execute(state, "search_contacts", {"relationship": "friend"}, search).output
    assert [{"person_id": r["person_id"]} for r in after] == friends(john, FRED)
    assert [r["person_id"] for r in state.doc["contact"]][-1] == FRED


def test_seed_timestamps_are_wall_clock_offsets_across_a_dst_change() -> None:
    # Upstream writes the seed as naive local `now - timedelta(days=3)`: across the 2024-03-10 switch to summer
    # time in New York, "three days ago at the same time" is 3 days minus one hour of real time.
    now = 1710172800.0  # 2024-03-11 12:00 EDT
    state = get_environment("toolsandbox").start(parse_rollout({
        "rollout_id": "d", "task_id": "d", "benchmark": "toolsandbox", "events": [],
        "env": {"now": now, "tz": "America/New_York"}}))  # fmt: skip
    reminder = state.doc["reminder"][0]  # created 3 days before now, due 1 day before
    assert reminder["creation_timestamp"] == now - 3 * 86400 + 3600
    assert reminder["reminder_timestamp"] == now - 86400  # Mar 10 12:00 EDT: after the switch
    utc = get_environment("toolsandbox").start(
        parse_rollout(
            {"rollout_id": "d", "task_id": "d", "benchmark": "toolsandbox", "events": [], "env": {"now": now}}
        )
    )
    assert utc.doc["reminder"][0]["creation_timestamp"] == now - 3 * 86400


def summary() -> dict[str, dict[str, Any]]:
    return {e["name"]: e for e in orjson.loads((RUN / "result_summary.json").read_bytes())["per_scenario_results"]}


SENT = "send_message_with_contact_content_cellular_off"
CRASHED = "find_current_city_low_battery_mode"


def test_ingest_run_folder() -> None:
    records = {r["task_id"]: r for r in ingest("toolsandbox", [str(RUN)])}
    assert set(records) == {SENT, CRASHED, "add_reminder_content_and_date_and_time_multiple_user_turn",
                            "find_temperature_f_with_location_all_tools"}  # fmt: skip
    send = records[SENT]
    assert send["env"]["settings"] == "base_cellular_off"
    assert 0.9 < summary()[SENT]["milestone_similarity"] < 1.0 and send["success"] is False
    assert send["labels"] == {"model": "gpt-4o-2024-05-13"}  # the condition; the rest describes the rollout
    categories = ",".join(summary()[SENT]["categories"])
    assert "STATE_DEPENDENCY" in categories
    assert send["attributes"] == {"user_model": "gpt-4o-2024-05-13", "categories": categories}
    assert send["status"] == "ok"
    # The clock upstream built the seed world at (once per settings variant), before the run folder is named.
    started = dt.datetime.strptime(RUN.name[-19:], "%m_%d_%Y_%H_%M_%S").replace(tzinfo=dt.UTC).timestamp()
    assert all(started - 120 < r["env"]["now"] <= started + 1 for r in records.values())
    assert records[CRASHED]["env"]["now"] == send["env"]["now"]
    assert records["add_reminder_content_and_date_and_time_multiple_user_turn"]["success"] is True
    lenient = {r["task_id"]: r for r in ingest("toolsandbox", [str(RUN)], IngestOptions(extra={"threshold": "0.5"}))}
    assert lenient[SENT]["success"] is True and lenient[CRASHED]["success"] is False
    with pytest.raises(IngestError, match=r"no result_summary\.json"):
        list(ingest("toolsandbox", [str(RUN / "trajectories")]))
    with pytest.raises(IngestError, match="unknown option"):
        list(ingest("toolsandbox", [str(RUN)], IngestOptions(extra={"bogus": "1"})))


def test_a_crashed_scenario_is_a_harness_error_with_its_recovered_calls(tmp_path: Path) -> None:
    """Upstream's own crash: the stub model dropped the connection after two calls; run_scenario caught the
    exception into the summary and play_and_evaluate wrote execution_context.json but never conversation.json."""
    records = {r["task_id"]: r for r in ingest("toolsandbox", [str(RUN)])}
    crashed = records[CRASHED]
    assert not (RUN / "trajectories" / CRASHED / "conversation.json").exists()
    assert crashed["status"] == "harness_error" and crashed["success"] is False
    assert crashed["attributes"]["harness_error"] == "APIConnectionError: openai.APIConnectionError: Connection error."
    calls = [e for e in crashed["events"] if e["type"] == "call"]
    assert [(c["tool"], orjson.loads(c["arguments"]), c["output"]) for c in calls] == [
        ("get_low_battery_mode_status", {}, True), ("set_low_battery_mode_status", {"on": False}, None)]  # fmt: skip
    assert [e["content"] for e in crashed["events"] if e["type"] == "message" and e["role"] == "user"] == [
        "What city am I in?"]  # the user simulator's few-shot examples are not the agent's conversation  # fmt: skip
    assert all(records[t]["status"] == "ok" for t in records if t != CRASHED)
    # The command line ingests the mixed folder whole and counts what it wrote.
    store = tmp_path / "store"
    shown = CliRunner().invoke(app, ["ingest", "toolsandbox", str(RUN), "--out", str(store)])
    # Compared without whitespace: where the line wraps, dropping a space, depends on the terminal's width (80
    # columns in a pytest-xdist worker) and on the length of the temporary path.
    said = f"wrote 4 rollouts to {store}: 3 ok, 1 harness error(s)"
    assert shown.exit_code == 0 and "".join(said.split()) in "".join(shown.output.split())
    # Without execution_context.json (a crash before play began) the rollout has no calls at all.
    import shutil

    copy = tmp_path / RUN.name
    shutil.copytree(RUN, copy)
    (copy / "trajectories" / CRASHED / "execution_context.json").unlink()
    bare = {r["task_id"]: r for r in ingest("toolsandbox", [str(copy)])}[CRASHED]
    assert bare["status"] == "harness_error" and bare["events"] == []


def test_end_to_end_scoring(tmp_path: Path) -> None:
    store, out = tmp_path / "store", tmp_path / "run"
    store.mkdir()
    (store / "ts.jsonl").write_bytes(b"\n".join(orjson.dumps(r) for r in ingest("toolsandbox", [str(RUN)])))
    run_scoring(str(store), str(out), ScoreSettings(inline=True))
    rows = duckdb.sql(f"SELECT task_id, T, fed, first_cause, success, recovered FROM '{out}/rollouts/*.parquet'"
                      " ORDER BY task_id").fetchall()  # fmt: skip
    assert rows == [  # upstream's verdicts: a unit pint does not know, a send with cellular off
        ("add_reminder_content_and_date_and_time_multiple_user_turn", 2, 3, None, True, False),
        (CRASHED, 2, 3, None, False, False),
        ("find_temperature_f_with_location_all_tools", 2, 2, "precondition", False, False),
        (SENT, 5, 2, "precondition", False, False),
    ]
    matches = duckdb.sql(f"SELECT output_match, count(*) FROM '{out}/steps/*.parquet' GROUP BY ALL ORDER BY ALL")
    assert matches.fetchall() == [(True, 9), (None, 2)]  # two setters: upstream logs None, nothing to compare
