"""Conditions vs attributes and harness errors through the canonical format (docs/explanation/data-model.md, "Canonical
rollout"): a small `observed` store with known numbers, scored for real, then metrics, report, CLI and job settings."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import duckdb
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

from pipeline.apps.cli import app
from pipeline.apps.jobs.definition import load_job
from pipeline.core.errors import InvalidRecord, JobFileError, MetricsError
from pipeline.core.records import parse_rollout
from pipeline.metrics.run import open_run
from pipeline.metrics.settings import BootstrapSettings, Population
from pipeline.report import Compare, build_report
from pipeline.scoring.driver import run_scoring
from pipeline.scoring.settings import ScoreSettings
from pipeline.storage.stores import write_store

SMALL = BootstrapSettings(B=50)


def record(rid: str, task: str, model: str, calls: list[bool], success: bool, **extra: Any) -> dict[str, Any]:
    """A rollout of `observed` whose calls are valid or not as the logged error flags say (`calls`: error?)."""
    events: list[dict[str, Any]] = [{"type": "message", "role": "user", "content": "hi"}]
    events += [{"type": "call", "tool": "t", "arguments": {}, "output": "x", "error": e} for e in calls]
    return {"rollout_id": rid, "task_id": task, "benchmark": "observed", "labels": {"model": model},
            "events": events, "success": success, **extra}  # fmt: skip


def crash(rid: str, task: str, model: str, calls: list[bool]) -> dict[str, Any]:
    return record(rid, task, model, calls, False, status="harness_error", attributes={"harness_error": "boom"})


RECORDS = [
    record("a1", "t1", "m", [False, False], True, attributes={"trial": "0"}),  # executable, successful
    record("a2", "t2", "m", [False], True, attributes={"trial": "1"}),  # executable, successful
    record("a3", "t3", "m", [True, False], True, attributes={"trial": "0"}),  # invalid prefix, recovered
    record("a4", "t4", "m", [False, True], False, attributes={"trial": "1"}),  # invalid prefix, failed
    crash("a5", "t1", "m", [False]),  # a crash after one valid call: would count as executable
    crash("a6", "t5", "m", []),  # a crash before any call
    crash("z1", "t1", "z", []),  # a model whose every rollout crashed
]


@pytest.fixture(scope="module", params=["jsonl", "parquet"])
def run(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp(f"harness-{request.param}")
    write_store(iter(RECORDS), str(tmp / "store"), request.param)
    run_scoring(str(tmp / "store"), str(tmp / "run"), ScoreSettings(inline=True))
    return tmp / "run"


def by_model(cohorts: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {c["model"]: c for c in cohorts}


def test_status_and_attributes_are_columns_and_steps_are_still_written(run: Path) -> None:
    rows = duckdb.sql(
        f"SELECT rollout_id, status, attr_trial, attr_harness_error, T FROM '{run}/rollouts/*.parquet' ORDER BY 1"
    ).fetchall()
    assert rows == [
        ("a1", "ok", "0", None, 2),
        ("a2", "ok", "1", None, 1),
        ("a3", "ok", "0", None, 2),
        ("a4", "ok", "1", None, 2),
        ("a5", "harness_error", None, "boom", 1),
        ("a6", "harness_error", None, "boom", 0),
        ("z1", "harness_error", None, "boom", 0),
    ]
    steps = duckdb.sql(f"SELECT status, count(*) FROM '{run}/steps/*.parquet' GROUP BY ALL ORDER BY 1").fetchall()
    assert steps == [("harness_error", 1), ("ok", 7)]


def test_harness_errors_are_left_out_and_counted(run: Path) -> None:
    cohorts = by_model(open_run(str(run)).cohorts(settings=SMALL))
    m = cohorts["m"]
    assert (m["n"], m["n_tasks"], m["n_harness_error"], m["harness_errors"]) == (4, 4, 2, "exclude")
    assert (m["ter"]["value"], m["success"]["value"], m["rr"]["value"], m["rr"]["eligible"]) == (0.5, 0.75, 0.5, 2)
    # A cohort made only of harness errors is listed: N = 0, nothing to measure, its errors counted.
    z = cohorts["z"]
    assert (z["n"], z["n_harness_error"], z["ter"]["value"], z["pec"]) == (0, 1, None, [])


def test_harness_errors_fail_counts_them_as_non_executable_failures(run: Path) -> None:
    cohorts = by_model(open_run(str(run)).cohorts(settings=SMALL, population=Population("fail")))
    m = cohorts["m"]
    assert (m["n"], m["n_tasks"], m["n_harness_error"], m["harness_errors"]) == (6, 5, 2, "fail")
    assert (m["ter"]["value"], m["success"]["value"], m["auc_pec"]["value"]) == (2 / 6, 3 / 6, (1 + 1 + 0 + 0.5) / 6)
    assert (m["rr"]["value"], m["rr"]["eligible"]) == (1 / 4, 4)
    assert {p["k"]: p["value"] for p in m["pec"]}[1] == 3 / 6  # a1, a2, a4: T >= 1 and FED > 1
    assert (cohorts["z"]["n"], cohorts["z"]["ter"]["value"]) == (1, 0.0)


def test_attributes_are_not_default_cohorts_but_work_in_by(run: Path) -> None:
    assert {c["model"] for c in open_run(str(run)).cohorts(settings=SMALL)} == {"m", "z"}
    by_trial = open_run(str(run)).cohorts(["model", "trial"], SMALL)
    assert {(c["model"], c["attr_trial"]): c["n"] for c in by_trial if c["n"]} == {("m", "0"): 2, ("m", "1"): 2}
    assert open_run(str(run)).cohorts(["attr_trial"], SMALL)[0]["attr_trial"] == "0"
    with pytest.raises(MetricsError, match=r"attributes: harness_error, trial"):
        open_run(str(run)).cohorts(["nope"], SMALL)


def test_pools_and_their_errors(run: Path) -> None:
    pooled = open_run(str(run)).cohorts(settings=SMALL, population=Population(pools=(("all", ("observed",)),)))
    assert {c["benchmark"] for c in pooled} == {"all"}
    with pytest.raises(MetricsError, match="in two pools"):
        Population(pools=(("a", ("x",)), ("b", ("x",))))
    with pytest.raises(MetricsError, match="harness_errors is exclude or fail, got 'maybe'"):
        Population("maybe")  # type: ignore[arg-type]


def test_cli_metrics_say_how_harness_errors_were_counted(run: Path) -> None:
    cli = CliRunner()
    shown = cli.invoke(app, ["metrics", str(run), "--bootstrap", "50", "--harness-errors", "fail"])
    assert shown.exit_code == 0, shown.output
    assert "harness" in shown.output and "Harness errors: 3, counted in N as non-executable" in shown.output
    table = pq.read_table(run / "metrics" / "metrics" / "metrics.parquet").to_pylist()  # metrics over every label
    assert {(r["model"], r["n"], r["n_harness_error"], r["harness_errors"]) for r in table} == {
        ("m", 6, 2, "fail"),
        ("z", 1, 1, "fail"),
    }
    as_json = cli.invoke(app, ["metrics", str(run), "--bootstrap", "50", "--by", "model,trial", "--json"])
    assert as_json.exit_code == 0, as_json.output
    assert {json.loads(line)["attr_trial"] for line in as_json.output.splitlines()} == {"0", "1", None}
    for args, message in (
        (["--harness-errors", "maybe"], "--harness-errors is exclude or fail"),
        (["--pool", "tau3"], "--pool takes key=value"),
        (["--pool", "x=tau_airline"], "tau_airline"),
    ):
        bad = cli.invoke(app, ["metrics", str(run), *args])
        assert bad.exit_code == 2 and message in bad.output


def test_report_counts_harness_errors_in_its_tables(run: Path, tmp_path: Path) -> None:
    failed = build_report(
        open_run(str(run)), tmp_path / "fail", settings=SMALL, population=Population("fail"), figures=False
    )
    md = (Path(failed.out) / "report.md").read_text()
    assert "| harness errors |" in md and "Harness errors: 3, counted in N as non-executable failures" in md
    assert {(r["model"], r["cause"], r["n"]) for r in failed.tables.causes if r["cause"] == "harness_error"} == {
        ("m", "harness_error", 2),
        ("z", "harness_error", 1),
    }
    excluded = build_report(open_run(str(run)), tmp_path / "exclude", settings=SMALL, figures=False)
    assert "Harness errors: 3, left out of N" in (Path(excluded.out) / "report.md").read_text()
    assert {r["model"]: r["n"] for r in excluded.tables.recovery} == {"m": 4}


def test_canonical_records_keep_conditions_and_attributes_apart() -> None:
    r = parse_rollout({**RECORDS[0], "attributes": {"trial": 0, "seed": None}})
    assert (r.labels, r.attributes, r.status) == ({"model": "m"}, {"trial": "0"}, "ok")
    assert parse_rollout(RECORDS[4]).status == "harness_error"
    for bad, reason in (
        ({"status": "crashed"}, "'status' must be one of ok, harness_error"),
        ({"attributes": {"model": "x"}}, "'model' is both a label and an attribute"),
        ({"labels": {"attr_x": "1"}}, "label 'attr_x' clashes"),
        ({"attributes": [1]}, "'attributes' must be an object"),
    ):
        with pytest.raises(InvalidRecord, match=reason):
            parse_rollout({**RECORDS[0], **bad})


def test_jobs_take_harness_errors_from_their_metrics_table(tmp_path: Path) -> None:
    job = tmp_path / "job.toml"
    job.write_text('name = "j"\ninput = "in"\noutput = "out"\n[metrics]\nharness_errors = "fail"\n')
    assert load_job(job).metrics.population == Population("fail")
    job.write_text('name = "j"\ninput = "in"\noutput = "out"\n[metrics]\nharness_errors = "drop"\n')
    with pytest.raises(JobFileError, match=r"\[metrics\]: harness_errors is exclude or fail, got 'drop'"):
        load_job(job)


def test_report_pools_and_compares_an_attribute(tmp_path: Path) -> None:
    more = [
        record("b1", "t1", "m", [False], True, attributes={"trial": "1"}),
        record("b2", "t2", "m", [True], False, attributes={"trial": "0"}),
    ]
    write_store(iter(RECORDS + more), str(tmp_path / "store"))
    run_scoring(str(tmp_path / "store"), str(tmp_path / "run"), ScoreSettings(inline=True))
    pooled = Population(pools=(("all", ("observed",)),))
    run = open_run(str(tmp_path / "run"))
    compare = Compare("trial", "0", "1")
    report = build_report(
        run, tmp_path / "report", ["model", "trial"], compare, settings=SMALL, population=pooled, figures=False
    )
    assert report.tables.keys == ["benchmark", "model", "attr_trial"]
    cohorts = {
        (c["benchmark"], c["model"], c["attr_trial"]): (c["n"], c["n_harness_error"]) for c in report.tables.cohorts
    }
    # The crashes carry no trial: a cohort of their own, with nothing to measure.
    assert cohorts == {("all", "m", "0"): (3, 0), ("all", "m", "1"): (3, 0), ("all", "m", None): (0, 2),
                       ("all", "z", None): (0, 1)}  # fmt: skip
    # trial 0 vs 1 over the tasks both have (t1, t2): success 1/2 vs 2/2.
    success = next(p for p in report.paired if p["metric"] == "success")
    assert (success["shared_tasks"], success["value_a"], success["value_b"], success["value"]) == (2, 0.5, 1.0, -0.5)
