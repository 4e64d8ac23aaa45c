"""pexec diff between two runs of the same rollouts: step-level verdict flips paired by rollout, the flip rate and
the paired TER / AUC-PEC / FED changes with task-level bootstrap intervals (known answers), --fail-on, JSON."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from test_aggregate import rollout, weights, write_rollouts
from typer.testing import CliRunner

from pipeline.apps.cli import app
from pipeline.core.errors import DiffError
from pipeline.metrics.run import open_run
from pipeline.metrics.settings import BootstrapSettings
from pipeline.metrics.verdicts import paired_breaches, paired_diff, parse_paired_threshold

SETTINGS = BootstrapSettings(B=300, seed=7)
TASKS = 40

# verdict of a step: (valid, failed_check, cause)
OK = (True, None, None)
PRE = (False, "P", "precondition")
INFO = (False, "D", "information")


def write_verdicts(
    run: Path, verdicts: list[list[tuple[bool, str | None, str | None]]], prefix: str = "part-0", **labels: str
) -> None:
    """Rollout i (id <prefix>-i, task tNN = i mod 40) with its steps' verdicts and `labels`; rollouts and steps."""
    cols: dict[str, list] = {k: [] for k in ("run_id", "rollout_id", "task_id", "benchmark", "step", "tool", "valid",
                                             "failed_check", "cause", "detail", "output_match")}  # fmt: skip
    rows = []
    for i, steps in enumerate(verdicts):
        task = f"t{i % TASKS:02d}"
        for j, (valid, check, cause) in enumerate(steps, start=1):
            row = {"run_id": "run", "rollout_id": f"{prefix}-{i}", "task_id": task, "benchmark": "shop", "step": j,
                   "tool": ("search", "pay")[j - 1], "valid": valid, "failed_check": check, "cause": cause,
                   "detail": None if valid else "no", "output_match": None}  # fmt: skip
            for k in cols:
                cols[k].append(row[k])
        fed = next((j for j, v in enumerate(steps, start=1) if not v[0]), len(steps) + 1)
        rows.append(rollout(task, len(steps), fed, True, benchmark="shop", **labels))
    types = {"step": pa.int32(), "valid": pa.bool_(), "output_match": pa.bool_()}
    (run / "steps").mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({k: pa.array(v, types.get(k, pa.string())) for k, v in cols.items()}),
                   run / "steps" / f"{prefix}.parquet")  # fmt: skip
    write_rollouts(run, rows, prefix)


def pair(tmp_path: Path) -> tuple[Path, Path]:
    """40 tasks, one rollout each of two calls (search, pay). A: pay valid in tasks 0-19, a precondition failure
    elsewhere. B: pay valid in tasks 0-9 and 35-39 (10 valid -> invalid, 5 invalid -> valid), tasks 30-34 fail on
    grounding instead (5 check changes), task 29 with another cause of a P failure (1 cause change)."""
    a = [[OK, OK if t < 20 else PRE] for t in range(TASKS)]
    b = []
    for t in range(TASKS):
        pay = (
            OK if t < 10 or t >= 35 else INFO if 30 <= t < 35 else (False, "P", "state_consistency") if t == 29 else PRE
        )
        b.append([OK, pay])
    write_verdicts(tmp_path / "a", a)
    write_verdicts(tmp_path / "b", b)
    return tmp_path / "a", tmp_path / "b"


def test_flips_and_paired_changes_known_answer(tmp_path: Path) -> None:
    a, b = pair(tmp_path)
    result = paired_diff(open_run(str(a)), open_run(str(b)), SETTINGS)
    assert result.counts["shared"] == 40 and result.counts["compared"] == 40 and result.counts["tasks"] == 40
    steps = {k: v["steps"] for k, v in result.kinds.items()}
    assert steps == {"same": 80 - 21, "valid_to_invalid": 10, "invalid_to_valid": 5, "check_changed": 5,
                     "cause_changed": 1}  # fmt: skip
    assert result.flips == 21
    assert {(r["kind"], r["tool"]): r["steps"] for r in result.by_tool} == {
        ("valid_to_invalid", "pay"): 10, ("invalid_to_valid", "pay"): 5, ("check_changed", "pay"): 5,
        ("cause_changed", "pay"): 1,
    }  # fmt: skip
    assert [(r["check_a"], r["check_b"], r["steps"]) for r in result.by_check if r["kind"] == "check_changed"] == [
        ("P", "D", 5)
    ]
    assert [(r["cause_a"], r["cause_b"]) for r in result.by_cause if r["kind"] == "cause_changed"] == [
        ("precondition", "state_consistency")
    ]
    # The same task draws for every quantity: the flip rate and the TER change per replicate, over the 40 tasks.
    flips = np.array([0] * 10 + [1] * 10 + [0] * 9 + [1] * 6 + [1] * 5, dtype=float)
    d_exec = np.array([0] * 10 + [-1] * 10 + [0] * 15 + [1] * 5, dtype=float)
    w = weights(7, 300, 40, "multinomial")
    rate = result.changes["flip_rate"]
    assert rate["value"] == pytest.approx(21 / 80)
    lo, hi = np.quantile((w @ flips) / (w @ np.full(40, 2.0)), [0.025, 0.975])
    assert (rate["lo"], rate["hi"]) == (pytest.approx(lo), pytest.approx(hi))
    ter = result.changes["ter"]
    assert (ter["a"], ter["b"], ter["value"]) == (0.5, 0.375, pytest.approx(-0.125))
    lo, hi = np.quantile((w @ d_exec) / 40, [0.025, 0.975])
    assert (ter["lo"], ter["hi"]) == (pytest.approx(lo), pytest.approx(hi))
    assert result.changes["auc_pec"]["value"] == pytest.approx(-0.125 / 2)
    assert result.changes["fed"]["value"] == pytest.approx(-5 / 40)
    first = [e for e in result.examples if e["kind"] == "valid_to_invalid"]
    assert [e["rollout_id"] for e in first] == ["part-0-10", "part-0-11", "part-0-12", "part-0-13", "part-0-14"]
    assert first[0]["link_b"] == "http://127.0.0.1:8765/rollout?run=run&shard=0&id=part-0-10"


def test_thresholds(tmp_path: Path) -> None:
    a, b = pair(tmp_path)
    result = paired_diff(open_run(str(a)), open_run(str(b)), SETTINGS)
    lines = paired_breaches(result, [parse_paired_threshold(t) for t in ("flips>20", "to_valid>5", "ter<-0.1")])
    assert [line.split(":")[0] for line in lines] == ["breach flips>20", "breach ter<-0.1"]
    with pytest.raises(DiffError, match="not a measure of the paired diff"):
        parse_paired_threshold("rr<0")


def test_cli_pairs_by_itself_prints_json_and_fails_on(tmp_path: Path) -> None:
    a, b = pair(tmp_path)
    runner = CliRunner()
    shown = runner.invoke(app, ["diff", str(a), str(b), "--bootstrap", "200"])
    assert shown.exit_code == 0, shown.output
    assert "the runs share 40 rollout id(s)" in shown.output and "valid → invalid" in shown.output
    done = runner.invoke(app, ["diff", str(a), str(b), "--json", "--bootstrap", "200"])
    assert done.exit_code == 0, done.output
    data = orjson.loads(done.stdout.splitlines()[0])
    assert data["kind"] == "paired" and data["flips"] == 21 and data["bootstrap"]["clusters"] == "task"
    failed = runner.invoke(app, ["diff", str(a), str(b), "--fail-on", "flips>0", "--bootstrap", "200"])
    assert failed.exit_code == 1 and "breach flips>0" in failed.output
    pooled = runner.invoke(app, ["diff", str(a), str(b), "--strict-replay"])
    assert pooled.exit_code == 2 and "do not apply to the paired diff" in pooled.output
    drift = runner.invoke(app, ["diff", str(a), str(b), "--unpaired", "--bootstrap", "200"])
    assert drift.exit_code == 0 and "Drift per cohort" in drift.output


def test_runs_of_other_rollouts_are_refused_when_paired_is_asked(tmp_path: Path) -> None:
    write_verdicts(tmp_path / "a", [[OK, OK]] * TASKS)
    write_verdicts(tmp_path / "c", [[OK, PRE]] * TASKS, prefix="part-1")
    done = CliRunner().invoke(app, ["diff", str(tmp_path / "a"), str(tmp_path / "c"), "--paired"])
    assert done.exit_code == 2 and "share no rollout id (40 in A, 40 in B)" in done.output
    assert len(done.output.strip().splitlines()) == 1
    with pytest.raises(DiffError, match="share no scored rollout"):
        paired_diff(open_run(str(tmp_path / "a")), open_run(str(tmp_path / "c")), SETTINGS)
    auto = CliRunner().invoke(app, ["diff", str(tmp_path / "a"), str(tmp_path / "c"), "--bootstrap", "100"])
    assert auto.exit_code == 0 and "Drift per cohort" in auto.output  # not the same rollouts: drift


def test_example_links_open_the_rollout_in_pexec_view(tmp_path: Path) -> None:
    from starlette.testclient import TestClient

    from pipeline.apps.view import RunView
    from pipeline.apps.view._app import create_app
    from pipeline.scoring.driver import run_scoring
    from pipeline.scoring.settings import ScoreSettings
    from pipeline.storage.stores import write_store
    from pipeline.synthetic.rollouts import synthesize

    write_store(iter(synthesize("shop", 60, 10, 3)), str(tmp_path / "store"))
    run_scoring(str(tmp_path / "store"), str(tmp_path / "a"), ScoreSettings(inline=True))
    run_scoring(
        str(tmp_path / "store"), str(tmp_path / "b"), ScoreSettings(inline=True, checks=("schema", "precondition"))
    )
    run_a, run_b = open_run(str(tmp_path / "a")), open_run(str(tmp_path / "b"))
    result = paired_diff(run_a, run_b, SETTINGS)
    assert result.flips and result.examples
    example = result.examples[0]
    for run, link in ((run_a, example["link_a"]), (run_b, example["link_b"])):
        view = RunView(run)
        try:
            page = TestClient(create_app(view)).get(link.removeprefix("http://127.0.0.1:8765"))
        finally:
            view.close()
        assert page.status_code == 200 and example["rollout_id"] in page.text


def test_ids_that_collide_under_other_labels_are_not_paired_by_default(tmp_path: Path) -> None:
    """Two models' logs numbered alike share every rollout id: by default that is refused in one line, never paired
    as if they were the same rollouts; --paired pairs them with a warning, --unpaired compares them as drift."""
    write_verdicts(tmp_path / "x", [[OK, OK]] * TASKS, model="X")
    write_verdicts(tmp_path / "y", [[OK, PRE]] * TASKS, model="Y")
    args = ["diff", str(tmp_path / "x"), str(tmp_path / "y"), "--bootstrap", "50"]
    refused = CliRunner().invoke(app, args)
    assert refused.exit_code == 2, refused.output
    assert "40 of the 40 rollout ids both runs have carry other labels in B" in refused.output
    assert "{'model': X} in A, {'model': Y} in B" in refused.output and "--unpaired" in refused.output
    forced = CliRunner().invoke(app, [*args, "--paired"])
    assert forced.exit_code == 0 and "compared step by step as --paired asks" in forced.output, forced.output
    drift = CliRunner().invoke(app, [*args, "--unpaired"])
    assert drift.exit_code == 0 and "Differences B − A" in drift.output and "other labels" not in drift.output
    write_verdicts(tmp_path / "x2", [[OK, PRE]] * TASKS, model="X")  # the same rollouts rescored: paired as before
    same = CliRunner().invoke(app, ["diff", str(tmp_path / "x"), str(tmp_path / "x2"), "--bootstrap", "50"])
    assert same.exit_code == 0 and "Paired step-level diff" in same.output and "other labels" not in same.output
