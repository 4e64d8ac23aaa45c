"""The guard's library API (pipeline.apps.guard.session) on the shipped `shop` spec and BFCL: verdicts before
execution, recording, discarded checks, incremental cost, and the indexed grounding history."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path
from typing import Any
from unittest.mock import patch

import duckdb
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from pipeline.apps.guard import GuardSession, open_session
from pipeline.apps.perf.guard import SCENARIOS, library, rereplay
from pipeline.core.model import NOT_LOGGED, Call, Message, Rollout
from pipeline.core.records import parse_rollout
from pipeline.envs import EnvOptions, get_environment
from pipeline.ingest import IngestOptions, ingest
from pipeline.replay import dependencies
from pipeline.replay.dependencies import History
from pipeline.scoring.driver import run_scoring
from pipeline.scoring.settings import ScoreSettings
from pipeline.storage.stores import write_store
from pipeline.synthetic.rollouts import synthesize
from pipeline.synthetic.support_logs import write_samples

AVA = "Hi, I'm Ava Lopez (ava.lopez@example.com, zip 78701)."
SIGN_IN = Call("authenticate", {"email": "ava.lopez@example.com", "zip": "78701"})


def pending_order() -> str:
    state = get_environment("shop").spec.initial_state
    return next(o for o in state["users"]["U1001"]["orders"] if state["orders"][o]["status"] == "pending")


def signed_in() -> GuardSession:
    session = open_session("shop")
    session.message("user", AVA)
    verdict = session.check(SIGN_IN)
    session.record(SIGN_IN, output=verdict.output)
    return session


def test_a_check_decides_before_anything_is_recorded():
    session = open_session("shop")
    verdict = session.check(SIGN_IN)
    assert (verdict.step, verdict.valid, verdict.failed_check, verdict.cause) == (1, False, "D", "information")
    assert verdict.detail.startswith("email='ava.lopez@example.com'") and session.depth == 0
    session.message("user", AVA)
    verdict = session.check(SIGN_IN)  # repaired by what the user said since
    assert verdict.valid and verdict.output == {"user_id": "U1001"} and verdict.decided_by == "precondition"
    step = session.record(SIGN_IN, output={"user_id": "U1001"})
    assert (step.step, step.valid, step.prefix_executable, step.output_match) == (1, True, True, True)
    schema = session.check(Call("get_user", {"user_id": 1001}))
    assert (schema.valid, schema.failed_check, schema.cause) == (False, "S", "schema")
    unknown = session.check(Call("get_user", {"user_id": "U9999"}))
    assert (unknown.failed_check, unknown.cause) == ("D", "information")
    session.close()


def test_a_checked_call_that_is_not_recorded_leaves_no_trace():
    session = signed_in()
    oid = pending_order()
    cancel = Call("cancel_order", {"order_id": oid, "reason": "no longer needed"})
    session.message("user", f"please cancel {oid}")
    assert session.check(cancel).valid
    assert session.check(cancel).valid  # the first check's cancellation was undone
    session.message("user", "actually, wait")  # anything but recording discards a pending check
    assert session.check(cancel).valid
    step = session.record(cancel, output={"order_id": oid})
    assert step.valid and step.step == 2 and step.output_match is False  # the simulator returned the whole order
    again = session.check(cancel)
    assert (again.valid, again.failed_check, again.cause) == (False, "P", "state_consistency")
    assert again.message and again.detail == again.message
    session.close()


def test_recording_a_call_other_than_the_checked_one_checks_it():
    session = signed_in()
    oid = pending_order()
    session.message("user", f"order {oid}")
    assert session.check(Call("cancel_order", {"order_id": oid, "reason": "no longer needed"})).valid
    step = session.record(Call("get_order", {"order_id": oid}))
    assert step.valid and step.tool == "get_order"
    assert session.check(Call("cancel_order", {"order_id": oid, "reason": "no longer needed"})).valid  # never cancelled


def test_sessions_do_not_share_state():
    oid = pending_order()
    cancel = Call("cancel_order", {"order_id": oid, "reason": "no longer needed"})
    first, second = signed_in(), signed_in()
    for s in (first, second):
        s.message("user", oid)
    first.record(cancel)
    assert not first.check(cancel).valid
    assert second.check(cancel).valid
    first.close()
    second.close()


class CountingEnv:
    """The real shop environment, counting the executions the checker asks of it."""

    def __init__(self, env: Any) -> None:
        self._env, self.executed = env, 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._env, name)

    def execute(self, *args: Any) -> Any:
        self.executed += 1
        return self._env.execute(*args)


def test_a_check_costs_one_execution_at_any_depth():
    env = CountingEnv(get_environment("shop"))
    session = GuardSession(env, Rollout("r", "t", "shop"))  # type: ignore[arg-type]
    session.message("user", AVA)
    session.record(SIGN_IN)
    costs = []
    for _ in range(60):
        before = env.executed
        call = Call("get_user", {"user_id": "U1001"})
        session.check(call)
        session.record(call)
        costs.append(env.executed - before)
    assert costs == [1] * 60


def _linear_knows(texts: list[str], value: Any) -> bool:
    # The definition `History.knows` indexes: every text scanned.
    text = value if isinstance(value, str) else str(value)
    if not text:
        return False
    quoted = orjson.dumps(text).decode()
    word = re.compile(rf"(?<![\w.\-]){re.escape(text)}(?![\w\-]|\.\w)")
    return any(quoted in t for t in texts) or any(word.search(t) for t in texts)


WORDY = st.text(alphabet='ab1-._ @"\\\né', max_size=12)


@pytest.mark.parametrize("scanned", [dependencies._SCANNED_CHARS, 0])  # 0: always through the word index
@given(
    st.lists(st.one_of(WORDY, st.dictionaries(WORDY, WORDY, max_size=2)), max_size=6),
    st.lists(st.one_of(WORDY, st.integers(-20, 20)), min_size=1, max_size=6),
)
def test_the_indexed_history_knows_exactly_what_a_full_scan_finds(scanned, said, values):
    history = History()
    for step, item in enumerate(said, 1):  # text as a message, objects as a call's output
        history.add_result(step, None, True, item) if isinstance(item, dict) else history.add_message(item)
    with patch.object(dependencies, "_SCANNED_CHARS", scanned):
        for v in values:
            assert history.knows(v) == _linear_knows(history.texts, v), (history.texts, v)


# -- the guard's answers equal the scorer's ------------------------------------------------------------------

SHARED = Path(__file__).resolve().parents[1].parent / "shared" / "data"
DATA = Path(__file__).parent / "data"
LOGS = {  # format -> (sources, options): every shared real log, as tests/test_bfcl.py, test_tau.py read them
    "bfcl": ([SHARED / "real" / "bfcl" / "gpt-oss-120b", DATA / "bfcl"], {}),
    "tau2": ([SHARED / "real" / "tau2"], {"tasks": str(SHARED / "tau3")}),
    "toolsandbox": ([next((DATA / "toolsandbox").glob("agent_*"))], {}),
}
STEP_COLUMNS = ("step", "turn", "tool", "valid", "prefix_executable", "failed_check", "cause", "detail", "decided_by")


def drive(record: dict[str, Any], env: str | None = None, options: EnvOptions | None = None) -> tuple[list, list]:
    """A guard session through a logged rollout: each call checked before it is recorded with its outcome."""
    rollout = parse_rollout(record)
    session = open_session(
        env or rollout.benchmark, rollout.env, options=options, rollout_id=rollout.rollout_id, task_id=rollout.task_id
    )
    verdicts = []
    try:
        for event in rollout.events:
            if isinstance(event, Message):
                session.message(event.role, event.content, event.turn)
                continue
            verdicts.append(session.check(replace(event, output=NOT_LOGGED, error=None)))
            session.record(event, output=event.output, error=event.error)
        steps = [(*(getattr(s, c) for c in STEP_COLUMNS), s.output_match) for s in session.steps]
    finally:
        session.close()
    return steps, verdicts


def scored_steps(run: Path) -> dict[str, list[tuple]]:
    columns = ", ".join(f'"{c}"' for c in (*STEP_COLUMNS, "output_match"))
    rows = duckdb.sql(
        f"SELECT rollout_id, {columns} FROM read_parquet('{run}/steps/*.parquet') ORDER BY rollout_id, step"
    ).fetchall()
    scored: dict[str, list[tuple]] = {}
    for rollout_id, *row in rows:
        scored.setdefault(rollout_id, []).append(tuple(row))
    return scored


def test_a_guard_session_through_every_real_log_gives_the_scorers_flags_and_causes(tmp_path, shared_ray):
    if not SHARED.is_dir():
        pytest.fail(f"shared data not found at {SHARED} (expected ../shared/data next to the project)")
    store = tmp_path / "store"
    store.mkdir()
    records = {}
    for fmt, (sources, extra) in LOGS.items():
        part = list(ingest(fmt, [str(s) for s in sources], IngestOptions(extra=extra)))
        (store / f"{fmt}.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in part))
        records.update({r["rollout_id"]: r for r in part})
    shop = list(synthesize("shop", 300, 60, seed=3))
    write_store(shop, str(store / "shop"), per_file=1000)
    records.update({r["rollout_id"]: r for r in shop})
    assert len(records) == 600 + 2 + 290 + 4 + 300  # rollout ids are unique across the sources

    run = tmp_path / "run"
    manifest = run_scoring(str(store), str(run))
    assert manifest.counts.rejected == 0
    scored = scored_steps(run)
    failures = 0
    for rollout_id, record in records.items():
        steps, verdicts = drive(record)
        assert steps == scored.get(rollout_id, []), rollout_id
        failures += sum(not s[3] for s in steps)
        # With a simulator, the verdict before execution is already the step's: P is the simulator's own.
        for verdict, step in zip(verdicts, steps, strict=True):
            assert (verdict.step, verdict.valid, verdict.failed_check, verdict.cause, verdict.detail) == (
                step[0],
                step[3],
                step[5],
                step[6],
                step[7],
            ), rollout_id
    assert sum(len(s) for s in scored.values()) > 9000 and failures > 500


def test_a_guard_session_through_production_logs_in_observed_gives_the_scorers_steps(tmp_path):
    """`observed` decides P from the real outcome too: `record` decides the step again with it."""
    write_samples(tmp_path / "logs", ("2026-11-29",), per_date=80, seed=5)
    options = IngestOptions(extra={"error_prefix": "Error:"})
    records = list(ingest("openai", [str(tmp_path / "logs")], options))
    write_store(records, str(tmp_path / "store"))
    support = EnvOptions(spec="support")
    run = tmp_path / "run"
    run_scoring(str(tmp_path / "store"), str(run), ScoreSettings(env="observed", spec="support", inline=True))
    scored = scored_steps(run)
    outcomes = {"before": 0, "after": 0}
    for record in records:
        steps, verdicts = drive(record, "observed", support)
        assert steps == scored.get(record["rollout_id"], []), record["rollout_id"]
        outcomes["before"] += sum(not v.valid for v in verdicts)
        outcomes["after"] += sum(not s[3] for s in steps)
    assert 0 < outcomes["before"] < outcomes["after"]  # logged errors are known only once recorded


def test_the_latency_benchmarks_scenarios_stay_valid_to_depth_50():
    # `pexec bench guard` (not timed here): its call sequences must stay executable, and both paths measure.
    for scenario in SCENARIOS:
        checks, prefixes = library(scenario, 2), rereplay(scenario, 1)
        assert {d: len(t) for d, t in checks.items()} == {1: 2, 10: 2, 50: 2}
        assert {d: len(t) for d, t in prefixes.items()} == {1: 1, 10: 1, 50: 1}
