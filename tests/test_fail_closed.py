"""Zero is a failure: logs given to `pexec score` without their `--format` are refused before scoring, naming the
format they look like; a run that holds no rollout fails `score`, `run` and `metrics` with one line giving the
reject count and where to look, unless `--allow-empty` (a job's `allow_empty`) says empty is fine."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
from typer.testing import CliRunner

from pipeline.apps.cli import app
from pipeline.synthetic.support_logs import write_samples

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data" / "real"
RUNNER = CliRunner()
SEE = "to see why: pexec sql {run} 'SELECT reason, source, location FROM rejects'"


def test_openai_logs_scored_without_their_format_are_refused_before_scoring(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    write_samples(tmp_path / "logs", ("2026-11-27",), 10, 2)  # the demo's writer of OpenAI chat logs
    result = RUNNER.invoke(app, ["score", "logs", "--out", "run", "--inline"])
    first = tmp_path / "logs" / "date=2026-11-27" / "conversations.jsonl"
    assert (result.exit_code, result.stderr.strip()) == (
        2,
        f"error: these look like openai logs: add --format openai (line 1 of {first} is no canonical rollout)",
    )
    assert not (tmp_path / "run").exists()  # refused before anything was written
    scored = RUNNER.invoke(app, ["score", "logs", "--format", "openai", "--out", "run", "--inline"])
    assert scored.exit_code == 0, scored.stderr


def test_a_pretty_printed_tau2_results_file_is_named_too(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "logs").mkdir()
    shutil.copy(SHARED / "tau2" / "retail_gpt-4.1.json", tmp_path / "logs")
    result = RUNNER.invoke(app, ["score", "logs", "--out", "run", "--inline"])
    assert result.exit_code == 2
    assert result.stderr.startswith("error: these look like tau2 logs: add --format tau2 (the whole file of ")


def rejected_store(tmp_path: Path) -> None:
    (tmp_path / "store").mkdir()
    (tmp_path / "store" / "a.jsonl").write_text('{"x": 1}\n{"rollout_id": "r"}\n[]\n')


def test_a_run_where_every_record_was_rejected_fails_score_and_metrics_unless_allowed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rejected_store(tmp_path)
    result = RUNNER.invoke(app, ["score", "store", "--out", "run", "--inline"])
    said = f"error: run holds no rollout: 3 record(s) read, 3 rejected; {SEE.format(run='run')}"
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines()[-1] == f"{said} (--allow-empty accepts an empty run)"
    assert (tmp_path / "run" / "_manifest.json").exists()  # the rejects are there to be read

    metrics = RUNNER.invoke(app, ["metrics", "run"])
    assert (metrics.exit_code, metrics.stderr.strip()) == (2, f"{said} (--allow-empty accepts an empty run)")
    assert not (tmp_path / "run" / "metrics").exists()

    report = RUNNER.invoke(app, ["report", "run", "--out", "rep", "--no-figures"])
    assert (report.exit_code, report.stderr.strip()) == (2, f"{said} (--allow-empty accepts an empty run)")
    assert not (tmp_path / "rep").exists()
    assert RUNNER.invoke(app, ["report", "run", "--out", "rep", "--no-figures", "--allow-empty"]).exit_code == 0
    assert RUNNER.invoke(app, ["score", "store", "--out", "run2", "--inline", "--allow-empty"]).exit_code == 0
    assert RUNNER.invoke(app, ["metrics", "run2", "--allow-empty", "--json"]).exit_code == 0


def test_a_job_whose_run_holds_no_rollout_fails_before_its_metrics_unless_allowed(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rejected_store(tmp_path)
    (tmp_path / "store" / "a.jsonl").rename(tmp_path / "store" / "b.jsonl")
    (tmp_path / "store" / "a.jsonl").write_text("")  # the job's check reads the first file: it holds nothing
    job = 'name = "j"\ninput = "store"\noutput = "run"\ninline = true\n'
    (tmp_path / "job.toml").write_text(job)
    result = RUNNER.invoke(app, ["run", "job.toml"])
    assert result.exit_code == 2
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .endswith(f"{SEE.format(run=tmp_path / 'run')} (allow_empty = true in the job file accepts an empty run)")
    )
    assert not (tmp_path / "run" / "metrics").exists()
    (tmp_path / "job.toml").write_text(job.replace('"run"', '"run2"') + "allow_empty = true\n")
    assert RUNNER.invoke(app, ["run", "job.toml"]).exit_code == 0


def test_metrics_says_how_many_records_were_rejected_and_left_out_of_every_n(tmp_path, monkeypatch):
    # A cut-short gzip scored its whole lines and rejected the cut one: the table's N leaves that record out, and
    # the table must say so (the count from the shards' markers, equal to the rows of `rejects`).
    monkeypatch.chdir(tmp_path)
    assert RUNNER.invoke(app, ["synth", "shop", "--rollouts", "40", "--tasks", "8", "--out", "store"]).exit_code == 0
    lines = next((tmp_path / "store").rglob("*.jsonl")).read_text().splitlines(keepends=True)
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "a.jsonl").write_text("".join(lines[:30]) + '{"x": 1}\n[]\n' + lines[30][:50])
    assert RUNNER.invoke(app, ["score", "logs", "--out", "run", "--inline"]).exit_code == 0
    table = RUNNER.invoke(app, ["metrics", "run", "--bootstrap", "50"])
    assert table.exit_code == 0
    said = "3 record(s) rejected at scoring are in no N; why: pexec sql run 'SELECT reason, count(*) AS n FROM rejects"
    assert said in table.stdout.replace("\n", " ")
    rows = RUNNER.invoke(app, ["sql", "run", "SELECT count(*) FROM rejects", "--format", "csv"]).stdout
    assert rows.split()[-1] == "3"
    # A JSON reader gets the same count on every cohort, and so does the metrics table `sql` reads.
    cohorts = [orjson.loads(line) for line in RUNNER.invoke(app, ["metrics", "run", "--json"]).stdout.splitlines()]
    assert cohorts and {c["n_rejected_in_run"] for c in cohorts} == {3}
    kept = RUNNER.invoke(app, ["sql", "run", "SELECT DISTINCT n_rejected_in_run FROM metrics", "--format", "csv"])
    assert kept.stdout.split()[-1] == "3"
    (tmp_path / "logs" / "a.jsonl").write_text("".join(lines))
    assert RUNNER.invoke(app, ["score", "logs", "--out", "clean", "--inline"]).exit_code == 0
    assert "rejected at scoring" not in RUNNER.invoke(app, ["metrics", "clean", "--bootstrap", "50"]).stdout
    clean = RUNNER.invoke(app, ["metrics", "clean", "--json", "--bootstrap", "50"]).stdout.splitlines()
    assert {orjson.loads(line)["n_rejected_in_run"] for line in clean} == {0}
