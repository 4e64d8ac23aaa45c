"""ToolSandbox run folders written by upstream's own runner, read by `pexec ingest toolsandbox` and replayed.

tests/toolsandbox_runs/runs.tar.gz holds run folders that upstream ToolSandbox's command line wrote, its OpenAI
agent and user roles answered by a loopback stub model playing scripted turns (tests/toolsandbox_runs/record.py
says how, against which commit, and how to record them again; PROVENANCE.json what was played). The tests check
the adapter against upstream's own files: every scenario of every result_summary.json is a rollout; success is
upstream's milestone similarity at the threshold; a crashed scenario is a harness error carrying upstream's
exception; and replaying each rollout's calls through pexec's simulator agrees with what upstream logged, step by
step (validity: upstream's tool raised or not; outputs, where both accepted and upstream logged a value).

Upstream logs a tool that returns nothing as the text `None`; the canonical record cannot tell a logged null from
no output, so those steps (setters, modify, remove) have no output comparison.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
import tarfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from pipeline.core.records import parse_rollout
from pipeline.core.values import same
from pipeline.envs import get_environment
from pipeline.ingest import IngestOptions, ingest
from pipeline.replay.checker import Session

RUNS = Path(__file__).parent / "toolsandbox_runs"
SAMPLE = Path(__file__).parent / "data" / "toolsandbox"
REQUIRED = 0.995


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("toolsandbox_runs")
    with tarfile.open(RUNS / "runs.tar.gz") as tar:
        tar.extractall(folder, filter="data")
    return folder


@pytest.fixture(scope="module")
def records(runs: Path) -> dict[str, dict[str, Any]]:
    return {r["rollout_id"]: r for r in ingest("toolsandbox", [str(runs)])}


def summaries(runs: Path) -> dict[str, dict[str, Any]]:
    """rollout id (run folder/scenario) -> upstream's per-scenario result."""
    return {
        f"{run.name}/{entry['name']}": entry
        for run in sorted(runs.iterdir())
        for entry in json.loads((run / "result_summary.json").read_text())["per_scenario_results"]
    }


def sandbox_rows(runs: Path) -> list[dict[str, Any]]:
    return [
        row
        for context in sorted(runs.glob("*/trajectories/*/execution_context.json"))
        for row in json.loads(context.read_text())["_dbs"]["SANDBOX"]
    ]


def test_the_recording_is_what_it_says(runs: Path, records: dict[str, dict[str, Any]]) -> None:
    provenance = json.loads((RUNS / "PROVENANCE.json").read_text())
    assert provenance["upstream"] == "https://github.com/apple/ToolSandbox" and len(provenance["commit"]) == 40
    assert sorted(p.name for p in runs.iterdir()) == sorted(provenance["runs"])
    for run in runs.iterdir():  # upstream's runner records the commit it ran from
        assert json.loads((run / "result_summary.json").read_text())["git_sha"] == provenance["commit"]
    # Upstream's strenum names, as written: what the hand-written fixtures once got wrong.
    rows = sandbox_rows(runs)
    assert {r["sender"] for r in rows} == {None, "SYSTEM", "USER", "AGENT", "EXECUTION_ENVIRONMENT"}
    # All 29 local tools: the agent's calls, and the user simulator's end_conversation (only the execution context
    # shows the user's calls; its few-shot examples, visible to the user alone, are left out).
    called = Counter(e["tool"] for r in records.values() for e in r["events"] if e["type"] == "call")
    ended = [r for r in rows if r["sender"] == "USER" and r["recipient"] == "EXECUTION_ENVIRONMENT"
             and r["visible_to"] != ["USER"] and "_response = end_conversation(**" in r["content"]]  # fmt: skip
    assert set(called) | ({"end_conversation"} if ended else set()) == set(get_environment("toolsandbox").tools)
    results = summaries(runs)
    finished = [e for e in results.values() if e["exception_type"] is None]
    assert {e["milestone_similarity"] == 1.0 for e in finished} == {True, False}  # passes and fails
    assert sum("MULTIPLE_USER_TURN" in e["categories"] for e in finished) >= 3
    assert sum(e.get("error") is True for r in records.values() for e in r["events"]) >= 10  # tool exceptions
    crashed = {rid.rsplit("/", 1)[1]: e["exception_type"] for rid, e in results.items() if e["exception_type"]}
    assert crashed == {"get_wifi": "APIConnectionError", "find_current_city_low_battery_mode": "APIConnectionError",
                       "get_cellular": "KeyError"}  # fmt: skip
    for rid in (rid for rid, e in results.items() if e["exception_type"]):  # the crashed form, as upstream leaves it
        folder = runs / rid.split("/")[0] / "trajectories" / rid.split("/")[1]
        assert (folder / "execution_context.json").exists() and not (folder / "conversation.json").exists()


def test_every_scenario_is_a_rollout(runs: Path, records: dict[str, dict[str, Any]]) -> None:
    assert sorted(records) == sorted(summaries(runs))
    assert {r["task_id"] for r in records.values()} == {rid.split("/")[1] for rid in records}


@pytest.mark.parametrize("threshold", [1.0, 0.9, 0.5])
def test_success_is_milestone_similarity_at_the_threshold(runs: Path, threshold: float) -> None:
    options = IngestOptions(extra={"threshold": str(threshold)})
    success = {r["rollout_id"]: r["success"] for r in ingest("toolsandbox", [str(runs)], options)}
    expected = {rid: e["exception_type"] is None and e["milestone_similarity"] >= threshold
                for rid, e in summaries(runs).items()}  # fmt: skip
    assert success == expected
    assert set(expected.values()) == {True, False}


def test_crashed_scenarios_are_harness_errors_with_upstreams_exception(
    runs: Path, records: dict[str, dict[str, Any]]
) -> None:
    for rid, entry in summaries(runs).items():
        record = records[rid]
        if entry["exception_type"] is None:
            assert record["status"] == "ok" and "harness_error" not in record["attributes"]
            continue
        last = entry["traceback"].strip().splitlines()[-1].strip()
        assert record["status"] == "harness_error" and record["success"] is False
        assert record["attributes"]["harness_error"] == f"{entry['exception_type']}: {last}"
    by_task = {r["task_id"]: r for r in records.values()}
    calls = lambda task: [e["tool"] for e in by_task[task]["events"] if e["type"] == "call"]  # noqa: E731
    # The calls before the crash are recovered from execution_context.json, with upstream's outputs.
    assert calls("find_current_city_low_battery_mode") == ["get_low_battery_mode_status", "set_low_battery_mode_status"]
    assert by_task["find_current_city_low_battery_mode"]["events"][-2]["output"] is True  # low battery mode was on
    assert calls("get_wifi") == [] and calls("get_cellular") == []  # dropped at once; KeyError before executing


def test_the_settings_and_clock_come_from_the_execution_context(records: dict[str, dict[str, Any]]) -> None:
    by_task = {r["task_id"]: r for r in records.values()}
    low = "base_low_battery_mode_on_wifi_off_location_service_off_cellular_off"
    # The scenario names do not say it ("_low_battery_mode", no "_on"): upstream's settings snapshot does.
    assert by_task["turn_on_wifi_low_battery_mode"]["env"]["settings"] == low
    assert by_task["find_current_city_low_battery_mode"]["env"]["settings"] == low
    assert by_task["find_days_till_holiday_wifi_off"]["env"]["settings"] == "base_wifi_off"
    # The clock is the one upstream built the scenario's seed world at, when its command line started: before the
    # run folder was named, and before any call the scenario made to get_current_timestamp.
    for rid, record in records.items():
        named = dt.datetime.strptime(rid.split("/")[0][-19:], "%m_%d_%Y_%H_%M_%S").replace(tzinfo=dt.UTC)
        assert named.timestamp() - 120 < record["env"]["now"] <= named.timestamp() + 1, rid
        asked = [e["output"] for e in record["events"] if e["type"] == "call" and e["tool"] == "get_current_timestamp"]
        assert all(record["env"]["now"] < t for t in asked)


@dataclass(frozen=True)
class Step:
    rollout: str
    tool: str
    arguments: Any
    valid: bool
    detail: str | None
    logged_error: bool
    output: Any
    logged: Any

    @property
    def validity_agrees(self) -> bool:
        return self.valid == (not self.logged_error)

    @property
    def output_agrees(self) -> bool | None:
        """None when either side rejected the call or upstream logged no value."""
        if not self.valid or self.logged_error or self.logged is None:
            return None
        return same(self.output, self.logged)


def replayed(records: dict[str, dict[str, Any]]) -> list[Step]:
    """Each call checked (schema and precondition: grounding is pexec's own judgement) in the state its
    predecessors left, then recorded with its logged outcome."""
    env, steps = get_environment("toolsandbox"), []
    for rid, record in sorted(records.items()):
        rollout = parse_rollout(record)
        session = Session(env, rollout, checks=("schema", "precondition"))
        for call, event in zip(rollout.calls, [e for e in record["events"] if e["type"] == "call"], strict=True):
            verdict = session.check(call)
            session.record(call)
            output = verdict.outcome.output if verdict.valid and verdict.outcome else None
            steps.append(Step(rid, call.tool, call.arguments, verdict.valid, verdict.detail,
                              bool(event.get("error")), output, event.get("output")))  # fmt: skip
    return steps


def test_replay_agrees_with_what_upstream_logged(records: dict[str, dict[str, Any]]) -> None:
    steps = replayed(records)
    compared = [s for s in steps if s.output_agrees is not None]
    disagree = [s for s in steps if not s.validity_agrees or s.output_agrees is False]
    for s in disagree:
        print(f"{s.rollout} {s.tool}({s.arguments}): upstream error={s.logged_error} output={s.logged!r}; "
              f"pexec valid={s.valid} output={s.output!r} {s.detail or ''}")  # fmt: skip
    validity = sum(s.validity_agrees for s in steps) / len(steps)
    outputs = sum(bool(s.output_agrees) for s in compared) / len(compared)
    print(f"{len(steps)} steps: validity {validity:.2%}; outputs {outputs:.2%} of {len(compared)} compared")
    assert len(steps) >= 50 and len(compared) >= 30
    assert sum(s.logged_error for s in steps) >= 10 and sum(not s.logged_error for s in steps) >= 30
    assert validity >= REQUIRED and outputs >= REQUIRED
    assert disagree == []  # none known: a new one is named here when it appears


def test_a_replay_with_the_names_clock_disagrees(records: dict[str, dict[str, Any]]) -> None:
    """The comparison can fail: with the clock of a scenario's first get_current_timestamp instead of the seed's
    (what the adapter used before it read execution_context.json), the seed's timestamps in search outputs move."""
    shifted = {rid: {**r, "env": {**r["env"], "now": r["env"]["now"] + 90.0}} for rid, r in records.items()}
    steps = replayed(shifted)
    assert any(s.output_agrees is False and s.tool in ("search_messages", "search_reminder") for s in steps)


def lower_cased(value: Any) -> Any:
    """The same JSON with every strenum name spelled in lower case (the `_dbs` keys, senders, recipients)."""
    names = {"SANDBOX", "SETTING", "CONTACT", "MESSAGING", "REMINDER", "SYSTEM", "USER", "AGENT",
             "EXECUTION_ENVIRONMENT"}  # fmt: skip
    if isinstance(value, dict):
        return {(k.lower() if k in names else k): lower_cased(v) for k, v in value.items()}
    if isinstance(value, list):
        return [lower_cased(v) for v in value]
    return value.lower() if isinstance(value, str) and value in names else value


def test_both_spellings_read_the_same(runs: Path, records: dict[str, dict[str, Any]], tmp_path: Path) -> None:
    """Every upstream version writes the names (strenum 0.4.15 throughout its history); the lower-case spelling is
    read as the same names, so a conversion of the files by another tool still ingests."""
    copy = tmp_path / "lower"
    shutil.copytree(runs, copy)
    for context in copy.glob("*/trajectories/*/execution_context.json"):
        context.write_text(json.dumps(lower_cased(json.loads(context.read_text()))))
    again = {r["rollout_id"]: r for r in ingest("toolsandbox", [str(copy)])}
    assert again == records


def test_the_sample_folder_is_one_of_the_recorded_runs(runs: Path) -> None:
    [sample] = list(SAMPLE.iterdir())
    files = sorted(p.relative_to(sample) for p in sample.rglob("*") if p.is_file())
    assert files and all((sample / f).read_bytes() == (runs / sample.name / f).read_bytes() for f in files)
    assert files == sorted(p.relative_to(runs / sample.name) for p in (runs / sample.name).rglob("*") if p.is_file())
