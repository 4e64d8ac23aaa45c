"""τ³ banking_knowledge on results upstream tau2-bench's own runner wrote (tests/data/tau3, made by
tests/tau3_runs/record.py), replayed against the domain's own code in the snapshot of upstream's repository, run by
its own Python (>= 3.12) in a worker process: discovery, retrieval, DB writes, both actors."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import orjson
import pytest
from conftest import starts

from pipeline.core.errors import IngestError
from pipeline.core.records import parse_rollout
from pipeline.envs import EnvOptions, get_environment
from pipeline.envs.tau.banking import source_version
from pipeline.ingest import IngestOptions, ingest
from pipeline.metrics.run import open_run
from pipeline.replay.checker import replay
from pipeline.scoring.driver import run_scoring
from pipeline.scoring.settings import ScoreSettings
from pipeline.storage.stores import write_store

HERE = Path(__file__).resolve().parent
BANKING = HERE / "data" / "tau3" / "banking_knowledge.json"
SOURCE = HERE.parents[1] / "shared" / "upstream" / "tau2-bench"
# `make test` builds this Python (the Makefile's $(VENV)/tau2) and names it here.
PYTHON = os.environ.get("PEXEC_TAU2_PYTHON", str(Path(sys.executable).parents[1] / "tau2" / "bin" / "python"))


def _python_ready() -> bool:
    probe = [PYTHON, "-c", "import loguru, pydantic, rank_bm25, deepdiff, addict, toml, yaml"]
    try:
        return subprocess.run(probe, capture_output=True).returncode == 0
    except OSError:
        return False


@pytest.fixture(scope="module")
@starts("other_python")
def python() -> str:
    """The Python that runs the snapshot (skipped without one)."""
    if not SOURCE.is_dir():
        pytest.fail(f"the tau2-bench snapshot is not at {SOURCE}")
    if not _python_ready():
        pytest.skip(
            f"no Python >= 3.12 with tau2-bench's dependencies at {PYTHON}: `make test` builds one (.venv/tau2), "
            "or point PEXEC_TAU2_PYTHON at one"
        )
    return PYTHON


@pytest.fixture(scope="module")
def results(python):
    options = IngestOptions(extra={"tau2_source": str(SOURCE), "tau2_python": python})
    records = list(ingest("tau2", [str(BANKING)], options))
    env = get_environment("tau_banking_knowledge", EnvOptions())
    return records, [replay(env, parse_rollout(r)) for r in records if r["status"] == "ok"]


def test_a_banking_run_needs_the_source_it_replays_against():
    with pytest.raises(IngestError, match="--option tau2_source=PATH"):
        list(ingest("tau2", [str(BANKING)], IngestOptions()))


def test_replay_agrees_with_the_log_and_success_is_upstreams_reward(results):
    records, replayed = results
    steps = [(r, s) for r in replayed for s in r.all_steps]
    agree = 0
    for r, s in steps:
        call = r.rollout.calls[s.seq - 1]
        failed = bool(call.error) or (isinstance(call.output, str) and call.output.startswith("Error:"))
        agree += (not s.valid) == failed and (s.output_match is not False or s.failed_check == "S")
    assert len(steps) == 17 and agree == 17
    rewards = {
        s["id"]: (s.get("reward_info") or {}).get("reward") for s in json.loads(BANKING.read_text())["simulations"]
    }
    for record in records:
        reward = rewards[record["rollout_id"]]
        assert record["success"] == (None if reward is None else reward >= 1 - 1e-6)


def test_a_discoverable_tool_is_available_from_its_discovery(results):
    _, replayed = results
    by_task = {r.rollout.task_id: r for r in replayed}
    fraud = by_task["task_036"]
    assert (fraud.T, fraud.fed, fraud.first_cause) == (9, 5, "schema")
    called_early, unlocked, called = fraud.steps[4:7]
    assert "was not unlocked before this call" in called_early.detail
    assert unlocked.valid and called.valid and called.output_match  # the replacement order, a DB write
    unknown = fraud.steps[7]
    assert (unknown.valid, unknown.failed_check, unknown.decided_by) == (False, "P", "simulator")
    assert [s.decided_by for s in fraud.steps[2:4]] == ["simulator", "simulator"]  # BM25 and grep replay
    referral = by_task["task_015"]
    assert [(s.tool, s.valid) for s in referral.user_steps] == [
        ("list_discoverable_user_tools", True),
        ("call_discoverable_user_tool", False),  # a tool the agent never gave
        ("call_discoverable_user_tool", True),
    ]
    assert "was not given to the user" in referral.user_steps[1].detail


def test_a_changed_source_rescores_what_was_read_against_it(python, tmp_path):
    # The source's version (its code and the domain's data) is pinned where the run is planned: a rerun over the
    # same logs after the source changed rescores them, and rollouts read before the change are refused, never
    # replayed against other code than the one they name.
    source = tmp_path / "tau2-bench"
    shutil.copytree(SOURCE / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__"))
    domain = Path("data", "tau2", "domains", "banking_knowledge")
    shutil.copytree(SOURCE / domain, source / domain)
    options = {"tau2_source": str(source), "tau2_python": python}
    raw, run = ScoreSettings(inline=True, format="tau2", options=options), tmp_path / "run"
    first = run_scoring([str(BANKING)], str(run), raw)
    assert (first.counts.scored, first.counts.shards_reused) == (4, 0)  # 3 replayed, 1 harness error
    store = tmp_path / "store"
    write_store(ingest("tau2", [str(BANKING)], IngestOptions(extra=options)), str(store))
    assert run_scoring([str(BANKING)], str(run), raw).counts.shards_reused == 1  # unchanged: reused

    tools = source / "src" / "tau2" / "domains" / "banking_knowledge" / "tools.py"
    tools.write_text(tools.read_text() + "\n# edited\n")
    last = run_scoring([str(BANKING)], str(run), raw)
    assert (last.counts.scored, last.counts.shards_reused) == (4, 0)
    [shard] = orjson.loads((run / "_manifest.json").read_bytes())["reuse"]["shards"]
    assert (shard["reused"], shard["why"]) == (False, "settings changed")
    stale = run_scoring(str(store), str(tmp_path / "stale"), ScoreSettings(inline=True, allow_empty=True))
    assert (stale.counts.scored, stale.counts.rejected) == (0, 4)
    reasons = open_run(str(tmp_path / "stale")).sql("SELECT DISTINCT reason FROM rejects").to_pylist()
    assert len(reasons) == 1 and f"the τ source {source} changed since this rollout was read" in reasons[0]["reason"]


def test_a_source_that_is_not_a_checkout_is_refused_where_the_run_is_planned(tmp_path):
    with pytest.raises(IngestError, match="is not a tau2-bench checkout"):
        list(ingest("tau2", [str(BANKING)], IngestOptions(extra={"tau2_source": str(tmp_path)})))


def test_synth_banking_rollouts_score_to_their_known_truth(python):
    # `pexec synth tau_banking_knowledge`: retrieval calls and the source's gold actions of both actors, run once on
    # the domain's own code, with injected invalid agent calls (an unknown tool or argument, a discoverable tool
    # called before its unlock, one the domain does not have) and user calls; the replay finds exactly the truth.
    from pipeline.synthetic.rollouts import synthesize

    options = {"tau2_source": str(SOURCE), "tau2_python": python}
    records = list(synthesize("tau_banking_knowledge", 24, 12, seed=3, options=options))
    env = get_environment("tau_banking_knowledge", EnvOptions())
    invalid_users, early, causes = 0, 0, set()
    for record in records:
        result = replay(env, parse_rollout(record))
        assert [{"valid": s.valid, "cause": s.cause} for s in result.steps] == record["truth"]["steps"]
        assert result.fed == record["truth"]["fed"]
        assert all(s.output_match is not False for s in result.all_steps if s.valid)  # real outputs, replayed
        retrieved = [s.decided_by for s in result.steps if s.tool in ("KB_search", "grep")]
        assert retrieved == ["simulator", "simulator"]  # BM25 and grep replay
        invalid_users += sum(not s.valid for s in result.user_steps)
        early += sum("was not unlocked before this call" in (s.detail or "") for s in result.steps)
        causes |= {s.cause for s in result.steps if s.cause}
    assert invalid_users > 0 and early > 0 and causes == {"schema", "precondition"}
    assert sum(r["truth"]["fed"] <= len(r["truth"]["steps"]) for r in records) > 0
    assert {r["env"]["tau2_source_version"] for r in records} == {source_version(str(SOURCE))}


def test_synth_banking_needs_a_source():
    from pipeline.core.errors import SynthError
    from pipeline.synthetic.rollouts import synthesize

    with pytest.raises(SynthError, match="--option tau2_source=PATH"):
        next(synthesize("tau_banking_knowledge", 2, 1))
    with pytest.raises(SynthError, match="takes no --option"):
        next(synthesize("shop", 2, 1, options={"tau2_source": str(SOURCE)}))
