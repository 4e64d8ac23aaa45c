"""Production logs end to end: arguments not captured, `observed` with a spec's rules over what the agent
saw, the support sample through ingest, scoring and the nightly job, and the `pexec` console script."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest

from pipeline.apps.jobs.definition import load_job
from pipeline.core.model import Call, Message, Rollout
from pipeline.envs import EnvOptions, get_environment
from pipeline.ingest import IngestOptions, ingest
from pipeline.replay.checker import UNCAPTURED, replay
from pipeline.scoring.driver import run_scoring
from pipeline.storage.stores import write_store
from pipeline.synthetic.support_logs import write_samples

ROOT = Path(__file__).resolve().parents[1]
USER = "I'm ava@example.com (customer C104), about order O5521"
SHIPPED = {"order_id": "O5521", "status": "shipped", "total": 80.0}


def steps(*calls: Call, env: str = "observed", spec: str | None = "support") -> list[tuple]:
    rollout = Rollout("r", "t", "support", events=[Message("user", USER), *calls], success=True)
    options = EnvOptions(spec=spec) if env == "observed" else EnvOptions()
    result = replay(get_environment(env, options), rollout)
    return [(s.valid, s.failed_check, s.cause, s.decided_by, s.detail) for s in result.steps]


def test_uncaptured_arguments_are_never_valid_or_invalid_by_accident():
    assert steps(Call("get_order", None), Call("get_order", None, error=True), spec=None) == [
        (True, None, None, "log", UNCAPTURED),
        (False, "P", "precondition", "log", f"logged error ({UNCAPTURED})"),
    ]
    # A simulator cannot replay a call without its arguments, and says so.
    [step] = steps(Call("authenticate", None), env="shop")
    assert step[:3] == (False, "S", "schema") and UNCAPTURED in step[4]


def test_a_rule_over_an_unobserved_input_is_skipped_and_the_log_decides():
    assert steps(Call("cancel_order", {"order_id": "O5521", "reason": "other"}))[0][:4] == (True, None, None, "log")


def test_a_false_rule_rejects_even_when_the_log_shows_no_error():
    got = steps(
        Call("get_order", {"order_id": "O5521"}, output=orjson.dumps(SHIPPED).decode()),
        Call("cancel_order", {"order_id": "O5521", "reason": "other"}),
    )
    assert got[1] == (False, "P", "precondition", "precondition",
                      "order O5521 is shipped: only pending or processing orders can be cancelled "
                      "(the log shows no error)")  # fmt: skip


def test_a_holding_rule_accepts_and_a_logged_error_still_rejects():
    seen = Call("get_order", {"order_id": "O5521"}, output={**SHIPPED, "status": "delivered"})
    refund = {"order_id": "O5521", "amount": 30.0}
    assert steps(seen, Call("refund_order", refund))[1][:4] == (True, None, None, "precondition")
    assert steps(seen, Call("refund_order", refund, error=True, output="Error: payment gateway"))[1][:4] == (
        False, "P", "precondition", "log")  # fmt: skip
    too_much = steps(seen, Call("refund_order", {**refund, "amount": 95.0}))[1]
    assert (
        too_much[:4] == (False, "P", "precondition", "precondition") and "exceeds the order total 80.0" in too_much[4]
    )


def test_seen_is_the_last_accepted_output_of_the_tool():
    gold = Call("get_customer", {"customer_id": "C104"}, output={"customer_id": "C104", "tier": "gold"})
    silver = Call("get_customer", {"customer_id": "C104"}, output={"customer_id": "C104", "tier": "silver"})
    failed = Call("get_customer", {"customer_id": "C104"}, output={"tier": "gold"}, error=True)
    credit = Call("apply_credit", {"customer_id": "C104", "amount": 60})
    assert steps(gold, credit)[1][0] is True
    assert steps(gold, silver, credit)[2][:2] == (False, "P")
    assert steps(silver, failed, credit)[2][:2] == (False, "P")  # a rejected call's output is not an observation


def ingest_day(logs: Path, store: Path, day: str) -> int:
    options = IngestOptions(extra={"error_prefix": "Error:"})
    return write_store(ingest("openai", [str(logs / f"date={day}")], options), str(store / f"date={day}"))


def test_sample_store_scored_per_date_by_the_nightly_job(tmp_path):
    days = ("2026-11-28", "2026-11-29")
    files = write_samples(tmp_path / "logs", days, per_date=60, seed=3)
    assert [f.parent.name for f in files] == ["date=2026-11-28", "date=2026-11-29"]
    assert [ingest_day(tmp_path / "logs", tmp_path / "store", d) for d in days] == [60, 60]
    job = load_job(ROOT / "jobs" / "nightly_support.toml", "2026-11-29")
    assert (job.input, job.scoring.format) == ("out/support/logs/date=2026-11-29/", "openai")
    assert (job.scoring.env, job.scoring.spec) == ("observed", "support")
    assert job.scoring.options == {"error_prefix": "Error:"}
    run = tmp_path / "run"
    scoring = replace(job.scoring, format="canonical", options={}, inline=True)  # the store ingested above
    manifest = run_scoring(str(tmp_path / "store" / "date=2026-11-29"), str(run), scoring)
    assert manifest.counts.scored == 60
    steps = pq.read_table(run / "steps").to_pylist()
    rollouts = {r["rollout_id"]: r for r in pq.read_table(run / "rollouts").to_pylist()}
    by_task: dict[str, set[Any]] = {}
    for r in rollouts.values():
        by_task.setdefault(r["task_id"], set()).add((r["executable"], r["first_cause"]))
    assert by_task["cancel-bad_json"] == {(False, "schema")}
    assert by_task["cancel-shipped_cancel"] == {(False, "precondition")}
    assert {c for t, v in by_task.items() if t.endswith("invented_id") for c in v} == {(False, "information")}
    assert {c for t, v in by_task.items() if t.endswith("-clean") for c in v} == {(True, None)}
    assert by_task["address-backend_error"] == {(False, "precondition")}
    rejected = [s for s in steps if s["tool"] == "cancel_order" and not s["valid"] and s["failed_check"] == "P"]
    assert {s["decided_by"] for s in rejected} == {"precondition"}
    assert {r["model"] for r in rollouts.values()} == {"support-model-a", "support-model-b"}


def test_through_the_pexec_console_script(tmp_path):
    pexec = str(Path(sys.executable).with_name("pexec"))
    write_samples(tmp_path / "logs", ("2026-11-29",), per_date=20, seed=1)
    env = {"COLUMNS": "200", "PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin"}

    def run(*args: str) -> subprocess.CompletedProcess:
        proc = subprocess.run([pexec, *args], capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        return proc

    assert "wrote 20 rollouts" in run("ingest", "openai", "logs/date=2026-11-29", "--out", "store",
                                      "--option", "error_prefix=Error:").stderr  # fmt: skip
    run("score", "store", "--out", "run", "--env", "observed", "--spec", "support", "--inline")
    out = run("sql", "run", "SELECT count(*) AS n, count(DISTINCT decided_by) AS k FROM steps", "--format", "json")
    row = orjson.loads(out.stdout.strip().splitlines()[0])
    assert row["n"] > 20 and row["k"] >= 1
    bad = subprocess.run([pexec, "ingest", "openai", "nowhere", "--out", "x"], capture_output=True, text=True,
                         env=env, cwd=tmp_path)  # fmt: skip
    assert bad.returncode != 0 and "openai: nowhere: no such file or folder" in bad.stderr
    assert "Traceback" not in bad.stderr


@pytest.mark.parametrize("fmt", ["openai", "anthropic", "otel", "inspect"])
def test_formats_are_listed(fmt):
    from pipeline.ingest import formats

    assert fmt in formats()


@pytest.mark.ray
def test_a_spec_folder_named_relative_to_here_is_found_by_tasks_working_elsewhere(tmp_path, monkeypatch, shared_ray):
    # The shared Ray's workers run in the folder the suite started in: a spec folder named relative to this test's
    # folder names nothing there, and every record was rejected.
    import shutil

    from pipeline.envs.data import BUILTIN_SPECS
    from pipeline.scoring.settings import ScoreSettings

    write_samples(tmp_path / "logs", ("2026-11-29",), per_date=20, seed=1)
    shutil.copytree(BUILTIN_SPECS / "support", tmp_path / "own" / "support")
    monkeypatch.chdir(tmp_path)
    settings = ScoreSettings(env="observed", spec="own/support", format="openai", options={"error_prefix": "Error:"})
    manifest = run_scoring("logs/date=2026-11-29", "run", settings)
    assert (manifest.counts.scored, manifest.counts.rejected) == (20, 0)
    decided = pq.read_table(tmp_path / "run" / "steps").column("decided_by").to_pylist()
    assert "precondition" in decided  # the spec's rules were applied, not only the log's errors
