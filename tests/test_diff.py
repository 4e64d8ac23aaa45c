"""pexec diff: drift between runs with disjoint tasks, two-sample task bootstrap, --fail-on."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import orjson
import pytest
from test_aggregate import rollout, weights
from test_ingest_observed import ROOT, ingest_day, write_samples
from test_tools import write_run
from typer.testing import CliRunner

from pipeline.apps.cli import app
from pipeline.apps.jobs.definition import load_job, previous_run
from pipeline.core.errors import DiffError, JobFileError
from pipeline.metrics.drift import SEED_B, diff_runs, parse_threshold
from pipeline.metrics.run import open_run
from pipeline.metrics.settings import BootstrapSettings
from pipeline.scoring.driver import run_scoring

SETTINGS = BootstrapSettings(B=400, seed=4)


def nightly(run: Path, prefix: str, n_exec: int, second_tool: str, cause_tool: str = "search") -> np.ndarray:
    """40 tasks named <prefix>NN, one rollout each of two calls (search, then `second_tool`); the first n_exec are
    fully executable, the others fail at their second call. Returns the per-task executable counts."""
    rollouts, calls = [], []
    for t in range(40):
        ok = t < n_exec
        rollouts.append(rollout(f"{prefix}{t:02d}", 2, 3 if ok else 2, ok))
        calls.append([("search", True, None), (second_tool, ok, None)])
    write_run(run, rollouts, calls)
    return np.array([1 if t < n_exec else 0 for t in range(40)])


def test_two_sample_bootstrap_known_answer(tmp_path: Path) -> None:
    ex_a = nightly(tmp_path / "a", "a", 20, "pay")
    ex_b = nightly(tmp_path / "b", "b", 10, "pay")
    result = diff_runs(open_run(str(tmp_path / "a")), open_run(str(tmp_path / "b")), settings=SETTINGS)
    ter = next(r for r in result.rows if r["metric"] == "ter")
    assert (ter["a"], ter["b"], ter["diff"]) == (0.5, 0.25, -0.25)
    # Independent resampling of each run's 40 tasks: A with seed 4, B with seed 4 XOR SEED_B.
    rep_a = weights(4, 400, 40, "multinomial") @ ex_a / 40
    rep_b = weights(4 ^ SEED_B, 400, 40, "multinomial") @ ex_b / 40
    lo, hi = np.quantile(rep_b - rep_a, [0.025, 0.975])
    assert ter["lo"] == pytest.approx(lo) and ter["hi"] == pytest.approx(hi)
    assert result.shared_tasks == 0 and result.seed_b == 4 ^ SEED_B
    pay = next(r for r in result.tools if r["tool"] == "pay")
    assert (pay["a"], pay["b"]) == (0.5, 0.75)


def test_new_vanished_tools_and_causes(tmp_path: Path) -> None:
    nightly(tmp_path / "a", "a", 20, "pay")
    nightly(tmp_path / "b", "b", 20, "refund")
    result = diff_runs(open_run(str(tmp_path / "a")), open_run(str(tmp_path / "b")), settings=SETTINGS)
    assert [(r["tool"], r["calls"]) for r in result.new_tools] == [("refund", 40)]
    assert [(r["tool"], r["calls"]) for r in result.vanished_tools] == [("pay", 40)]
    assert [(r["tool"], r["cause"], r["n"]) for r in result.new_causes] == [("refund", "refund_bad", 20)]


def test_fail_on_exit_codes(tmp_path: Path) -> None:
    nightly(tmp_path / "a", "a", 20, "pay")
    nightly(tmp_path / "b", "b", 10, "pay")
    args = ["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--bootstrap", "100"]
    breached = CliRunner().invoke(app, [*args, "--fail-on", "ter<-0.2", "--fail-on", "invalid_rate>0.1"])
    assert breached.exit_code == 1, breached.output
    lines = [line for line in breached.output.splitlines() if line.startswith("breach")]
    assert len(lines) == 2
    assert lines[0].startswith("breach ter<-0.2: ter B − A = -0.2500") and "benchmark=bench" in lines[0]
    assert "tool=pay" in lines[1]
    quiet = CliRunner().invoke(app, [*args, "--fail-on", "ter<-0.3"])
    assert quiet.exit_code == 0, quiet.output
    assert "Drift per cohort" in quiet.output and "-0.250" in quiet.output
    rows = [orjson.loads(x) for x in CliRunner().invoke(app, [*args, "--json"]).output.splitlines()]
    assert {r["metric"] for r in rows if r["kind"] == "metric"} >= {"ter", "auc_pec", "success"}


@pytest.mark.parametrize("text", ["ter<<1", "__import__('os')<1", "ter<1; rm", "ter", "nope<1", "ter<1e"])
def test_threshold_grammar_refuses(text: str) -> None:
    with pytest.raises(DiffError):
        parse_threshold(text)


def test_threshold_grammar() -> None:
    t = parse_threshold(" auc_pec >= -.05 ")
    assert (t.metric, t.op, t.value) == ("auc_pec", ">=", -0.05)
    assert t.breached(0.0) and not t.breached(-0.1) and not t.breached(None)


def test_no_interval_where_either_run_is_below_the_bootstraps_floor(tmp_path: Path) -> None:
    """One task against one gives the same difference in every replicate: a zero-width interval that would read as
    certain drift. Below 30 tasks (or 30 units of the denominator) in either run there is no interval, as in
    `metrics` and the paired diff; 40 tasks against 40 keep theirs."""
    nightly(tmp_path / "big", "a", 20, "pay")
    write_run(tmp_path / "one", [rollout("x", 1, 2, True)], [[("search", True, None), ("pay", False, None)]])
    few = diff_runs(open_run(str(tmp_path / "big")), open_run(str(tmp_path / "one")), settings=SETTINGS)
    ter = next(r for r in few.rows if r["metric"] == "ter")
    assert ter["diff"] == 0.5 and ter["small_sample"] and (ter["lo"], ter["hi"]) == (None, None)
    assert all(r["small_sample"] and r["lo"] is None for r in few.tools)  # 1 call of each tool in B
    shown = CliRunner().invoke(app, ["diff", str(tmp_path / "big"), str(tmp_path / "one"), "--bootstrap", "50"])
    assert shown.exit_code == 0, shown.output
    assert "–: no interval where either run has fewer than 30 tasks" in shown.output
    nightly(tmp_path / "big2", "b", 10, "pay")
    many = diff_runs(open_run(str(tmp_path / "big")), open_run(str(tmp_path / "big2")), settings=SETTINGS)
    ter = next(r for r in many.rows if r["metric"] == "ter")
    assert not ter["small_sample"] and ter["lo"] is not None and ter["lo"] < ter["diff"] < ter["hi"]
    rr = next(r for r in many.rows if r["metric"] == "rr")  # over the 20 non-executable rollouts of A: too few
    assert rr["small_sample"] and rr["lo"] is None


@pytest.mark.parametrize(
    ("a", "b", "text", "fires"),
    [
        (13 / 25, 0.5, "ter<-0.02", False),  # computed: -0.020000000000000018, exactly the threshold
        (13 / 25, 0.5, "ter<=-0.02", True),
        (0.3, 0.2, "ter<=-0.1", True),  # computed: -0.09999999999999998
        (0.3, 0.2, "ter<-0.1", False),
        (0.2, 0.3, "ter>=0.1", True),
        (0.2, 0.3, "ter>0.1", False),
        (0.5, 0.52, "ter<-0.02", False),
        (0.52, 0.49, "ter<-0.02", True),  # a real crossing by 0.01 still fires
    ],
)
def test_a_difference_equal_to_the_threshold_compares_as_equal(a: float, b: float, text: str, fires: bool) -> None:
    assert parse_threshold(text).breached(b - a) is fires


def test_no_common_cohort_is_said(tmp_path: Path) -> None:
    nightly(tmp_path / "a", "a", 20, "pay")
    write_run(tmp_path / "b", [rollout("x", 1, 2, True, benchmark="other")], [[("search", True, None)]])
    result = CliRunner().invoke(app, ["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--bootstrap", "50"])
    assert result.exit_code == 0, result.output
    assert "No cohort is in both runs" in result.output
    assert "cohort only in A: benchmark=bench" in result.output and "cohort only in B: benchmark=other" in result.output
    # An alert that cannot be evaluated is refused (exit 2), never read as "no drift" (exit 0).
    refused = CliRunner().invoke(app, ["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--fail-on", "ter<-0.02"])
    assert refused.exit_code == 2 and "--fail-on ter<-0.02 cannot be evaluated" in refused.output, refused.output
    # --json says the same, never an empty output: the settings first, then what each run alone has.
    shown = CliRunner().invoke(app, ["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--bootstrap", "50", "--json"])
    assert shown.exit_code == 0, shown.output
    rows = [orjson.loads(x) for x in shown.output.splitlines()]
    head = rows[0]
    assert head["kind"] == "diff" and head["cohorts_compared"] == 0 and head["shared_tasks"] == 0
    assert head["bootstrap"] | {"duckdb_version": None} == {
        "B": 50,
        "seed": 0,
        "seed_b": SEED_B,
        "method": "multinomial",
        "level": 0.95,
        "unit": "task",
        "duckdb_version": None,
    }
    assert (head["harness_errors"], head["strict_replay"], head["pools"]) == ("exclude", False, {})
    assert [(r["kind"], r["benchmark"]) for r in rows if r["kind"].startswith("only")] == [
        ("only_a", "bench"),
        ("only_b", "other"),
    ]
    assert {r["kind"] for r in rows} >= {"new_tool", "vanished_tool"} and "metric" not in {r["kind"] for r in rows}


def test_metrics_per_tool_of_a_run_without_steps_fails_closed_in_json_too(tmp_path: Path) -> None:
    write_run(tmp_path / "run", [rollout("x", 0, 1, True)], [[]])
    for extra in ([], ["--json"]):
        done = CliRunner().invoke(app, ["metrics", str(tmp_path / "run"), "--by", "tool", *extra])
        assert done.exit_code == 2 and "has no steps: nothing to profile per tool" in done.output, done.output


def test_two_real_nights_of_support_logs(tmp_path: Path) -> None:
    """The support sample's two nights, scored as the nightly job scores them, then `pexec diff` between them. The
    sample reuses its scenario task ids every night: the diff says how many tasks the runs share."""
    days = ("2026-11-28", "2026-11-29")
    write_samples(tmp_path / "logs", days, per_date=60, seed=3)
    job = load_job(ROOT / "jobs" / "nightly_support.toml", days[1])
    for d in days:
        ingest_day(tmp_path / "logs", tmp_path / "store", d)
        scoring = replace(job.scoring, format="canonical", options={}, inline=True)  # the store ingested above
        run_scoring(str(tmp_path / "store" / f"date={d}"), str(tmp_path / f"date={d}"), scoring)
    a, b = str(tmp_path / f"date={days[0]}"), str(tmp_path / f"date={days[1]}")
    result = diff_runs(open_run(a), open_run(b), ["model"], SETTINGS)
    metrics_a = {(c["model"], "ter"): c["ter"]["value"] for c in open_run(a).cohorts(["model"], SETTINGS)}
    metrics_b = {(c["model"], "ter"): c["ter"]["value"] for c in open_run(b).cohorts(["model"], SETTINGS)}
    for r in (r for r in result.rows if r["metric"] == "ter"):
        key = (r["model"], "ter")
        assert r["diff"] == pytest.approx(metrics_b[key] - metrics_a[key])
        if r["small_sample"]:  # a night's model has fewer than 30 tasks
            assert min(r["tasks_a"], r["tasks_b"]) < 30 and r["lo"] is None and r["hi"] is None
        else:
            assert r["lo"] <= r["diff"] <= r["hi"]
    assert {r["tool"] for r in result.tools} >= {"cancel_order"}
    assert result.shared_tasks > 0
    cli = CliRunner().invoke(app, ["diff", a, b, "--by", "model", "--bootstrap", "100", "--fail-on", "ter>=-1"])
    assert cli.exit_code == 1 and cli.output.count("breach ter>=-1") == 2, cli.output
    assert "The runs share" in cli.output


def test_job_diff_resolves_the_previous_night(tmp_path: Path) -> None:
    job = load_job(ROOT / "jobs" / "nightly_support.toml", "2026-11-29")
    assert job.diff is not None and job.diff.fail_on == ("ter<-0.02",)
    assert job.diff.candidates[:2] == ("out/support/runs/date=2026-11-28", "out/support/runs/date=2026-11-27")
    assert len(job.diff.candidates) == 7 and job.diff.by == ("model", "agent_version")
    for day in ("2026-11-26", "2026-11-27"):
        write_run(tmp_path / f"date={day}", [rollout("x", 1, 2, True)], [[("search", True, None)]])
    spec = tmp_path / "job.toml"
    spec.write_text(f'name = "n"\ninput = "in/{{date}}"\noutput = "{tmp_path}/date={{date}}"\n'
                    '[diff]\nagainst = "previous"\nlook_back_days = 3\n')  # fmt: skip
    assert previous_run(load_job(spec, "2026-11-29")) == f"{tmp_path}/date=2026-11-27"
    assert previous_run(load_job(spec, "2026-11-26")) is None
    spec.write_text('name = "n"\ninput = "i"\noutput = "o/{date}"\n[diff]\nfail_on = ["ter<<0"]\n')
    with pytest.raises(JobFileError, match="--fail-on takes"):
        load_job(spec, "2026-11-29")
    spec.write_text('name = "n"\ninput = "i"\noutput = "o"\n[diff]\n')
    with pytest.raises(JobFileError, match="needs \\{date\\}"):
        load_job(spec, "2026-11-29")


def test_shared_tasks_counted_past_the_query_row_cap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tasks both runs have are counted by digest, not read as rows through `pexec sql`'s capped query: a
    night with more tasks than the cap (1M rows by default) must still be compared. Ids that a joined text
    could confuse count apart."""
    from pipeline.metrics import query
    from pipeline.metrics.query_limits import QueryLimits

    monkeypatch.setattr(query, "QueryLimits", lambda: QueryLimits(max_rows=3))
    ids_a = [f"t{i:02d}" for i in range(10)] + ["x:1", "x", "y\x00z"]
    ids_b = [f"t{i:02d}" for i in range(5, 15)] + ["x:1", "x:", "y"]
    for name, ids in (("a", ids_a), ("b", ids_b)):
        write_run(tmp_path / name, [rollout(t, 1, 2, True) for t in ids], [[("search", True, None)] for _ in ids])
    result = diff_runs(open_run(str(tmp_path / "a")), open_run(str(tmp_path / "b")), settings=SETTINGS)
    assert result.shared_tasks == len(set(ids_a) & set(ids_b)) == 6


def test_unpaired_reads_no_rollout_ids_of_both_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--unpaired goes straight to drift: the scan of both runs' rollout ids that picks the default (paired or
    not) is not made, so drift on Ray has no step that reads every rollout in one process."""
    from pipeline.metrics import verdicts

    nightly(tmp_path / "a", "a", 20, "pay")
    nightly(tmp_path / "b", "b", 10, "pay")

    def refuse(*_: object) -> None:
        raise AssertionError("both runs' rollout ids were read")

    monkeypatch.setattr(verdicts, "shared_rollouts", refuse)
    cli = CliRunner().invoke(app, ["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--unpaired", "--bootstrap", "50"])
    assert cli.exit_code == 0, cli.output
    assert "ter" in cli.output


def test_labels_and_tools_from_the_logs_print_as_text(tmp_path: Path) -> None:
    """A missing label prints as a dash, never as "None" (a label can hold that text); a tool name or label with
    control characters prints them escaped, never as a terminal sequence."""
    rows = [rollout("a", 1, 2, True, model="None"), rollout("b", 1, 2, True, model=None)]
    write_run(tmp_path / "a", rows, [[("search", True, None)], [("search", True, None)]])
    shown = CliRunner().invoke(app, ["metrics", str(tmp_path / "a"), "--bootstrap", "50"])
    assert shown.exit_code == 0, shown.output
    assert "│ bench     │ None      │" in shown.output and "│ bench     │ –         │" in shown.output
    red = "pay\x1b[31m"
    write_run(tmp_path / "b", [rollout("c", 1, 2, True, model="None")], [[(red, False, None)]])
    drift = CliRunner().invoke(app, ["diff", str(tmp_path / "a"), str(tmp_path / "b"), "--unpaired"])
    assert drift.exit_code == 0, drift.output
    assert "\x1b" not in drift.output and "tool=pay\\x1b[31m" in drift.output and "model=–" in drift.output


def test_a_run_without_rollouts_is_refused_in_one_line(tmp_path: Path) -> None:
    nightly(tmp_path / "a", "a", 20, "pay")
    (tmp_path / "bad.jsonl").write_text("{not json\n")
    scored = CliRunner().invoke(app, ["score", str(tmp_path / "bad.jsonl"), "--out", str(tmp_path / "empty"),
                                      "--env", "observed", "--inline"])  # fmt: skip
    assert scored.exit_code == 2, scored.output  # the run is committed, with its one reject
    for args in (["empty", "a"], ["a", "empty", "--unpaired"]):
        done = CliRunner().invoke(app, ["diff", *(str(tmp_path / x) if x[0] != "-" else x for x in args)])
        assert done.exit_code == 2, done.output
        assert "empty holds no rollout (1 record(s) rejected): nothing to compare" in done.output
