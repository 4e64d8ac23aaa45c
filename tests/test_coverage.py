"""Numbers a user can trust: readers refuse incomplete runs (pipeline.metrics.completeness) unless asked for a
partial read, whose every output states its coverage; every table is queryable; reports never mix folders.

The incomplete run is a real one: `pexec score` in a subprocess, interrupted (SIGINT) once its first shard
has committed.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest
from typer.testing import CliRunner

import pipeline.report._build as report_module
from pipeline.apps.cli import app
from pipeline.apps.jobs.definition import load_job, run_job
from pipeline.core.errors import JobFileError, RunIncomplete
from pipeline.metrics.cohorts import metrics_name
from pipeline.metrics.run import open_run
from pipeline.metrics.settings import BootstrapSettings
from pipeline.report import ReportError, build_report
from pipeline.scoring.driver import run_scoring
from pipeline.scoring.settings import ScoreSettings
from pipeline.storage.run import read_plan, read_shard_markers
from pipeline.storage.stores import write_store
from pipeline.synthetic.rollouts import synthesize

ROOT = Path(__file__).resolve().parents[1]
PEXEC = str(Path(sys.executable).with_name("pexec"))
ENV = {"PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
FAST = BootstrapSettings(B=50)
N_FILES, PER_FILE = 100, 60  # one shard per file: many small shards, so the interruption lands early
TABLES = ("steps", "rollouts", "rejects")


@pytest.fixture(scope="module")
def killed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(store, run): `pexec score --inline` interrupted with SIGINT right after its first shard committed."""
    root = tmp_path_factory.mktemp("killed")
    store, run = root / "store", root / "run"
    write_store(synthesize("shop", N_FILES * PER_FILE, 300, 4), str(store), "jsonl", PER_FILE, None)
    proc = subprocess.Popen([PEXEC, "score", str(store), "--out", str(run), "--inline"], env=ENV,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    deadline = time.monotonic() + 120
    while not list(run.glob("_shards/*.json")) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(60) != 0, "scoring finished before it could be interrupted"
    assert not (run / "_manifest.json").exists() and (run / "_plan.json").exists()
    return store, run


def committed(run: Path) -> list[str]:
    """Shards with a marker and all three parts: what a partial read may read, counted from the disk."""
    return [k for k in read_shard_markers(str(run)) if all((run / t / f"part-{k}.parquet").exists() for t in TABLES)]


def rows(run: Path, table: str, keys: list[str]) -> int:
    return sum(pq.read_metadata(run / table / f"part-{k}.parquet").num_rows for k in keys)


def cli(*args: str) -> object:
    return CliRunner().invoke(app, list(args))


# --- refusal ---------------------------------------------------------------------------------------------


def test_every_reader_refuses_a_killed_run_in_one_line(killed: tuple[Path, Path], tmp_path: Path) -> None:
    store, run = killed
    k = len(committed(run))
    assert 1 <= k < N_FILES
    expected = (
        f"error: run {run} is incomplete: no _manifest.json (scoring did not finish); {k} of {N_FILES} shards "
        f"committed; finish it with the same `pexec score {store} --out {run}` and the options that started it "
        "(committed shards are reused) "
        "(or pass --partial to read only the committed shards; every output says so)"
    )
    for args in (["metrics", str(run)], ["sql", str(run), "SELECT 1"], ["report", str(run), "--out", str(tmp_path)]):
        result = cli(*args)
        assert result.exit_code == 2, args
        assert result.stderr.strip().splitlines() == [expected], args
        assert result.stdout == ""
    for call in (
        lambda: open_run(str(run)).cohorts(settings=FAST),
        lambda: open_run(str(run)).sql("SELECT 1"),
        lambda: build_report(open_run(str(run)), tmp_path / "r", settings=FAST, figures=False),
        lambda: open_run(str(run)).connect().__enter__(),
    ):
        with pytest.raises(RunIncomplete, match=r"no _manifest\.json"):
            call()
    assert not (tmp_path / "r").exists() and not (run / "metrics").exists()  # nothing written


def test_partial_states_the_coverage_on_disk(killed: tuple[Path, Path], tmp_path: Path) -> None:
    store, run = killed
    keys = committed(run)
    scored, rejected = rows(run, "rollouts", keys), rows(run, "rejects", keys)
    sources = {m.source for k, m in read_shard_markers(str(run)).items() if k in keys}
    expected = {
        "shards": len(keys),
        "shards_total": N_FILES,
        "rollouts": scored + rejected,
        "rollouts_total": None,  # JSON Lines: the plan cannot count records
        "input_bytes": sum(Path(s).stat().st_size for s in sources),
        "input_bytes_total": sum(p.stat().st_size for p in store.glob("*.jsonl")),
        "incomplete_runs": [str(run)],
    }
    assert scored == len(keys) * PER_FILE and rejected == 0
    opened = open_run(str(run), partial=True)
    cohorts = opened.cohorts([], FAST)
    assert [c["partial"] for c in cohorts] == [expected] and cohorts[0]["n"] == scored
    assert opened.partial == expected  # Run.partial: the same JSON object

    # --json: one `partial` object per cohort; the table: a warning line; metrics.parquet: its columns.
    result = cli("metrics", str(run), "--partial", "--json", "--bootstrap", "50", "--by", "model")
    assert result.exit_code == 0, result.output
    assert {json.dumps(json.loads(line)["partial"]) for line in result.stdout.splitlines()} == {json.dumps(expected)}
    table = cli("metrics", str(run), "--partial", "--bootstrap", "50").stdout
    warning = f"PARTIAL RUN: these numbers cover {len(keys)} of {N_FILES} shards ({scored:,} of an unknown number"
    assert warning in " ".join(table.split())
    [row] = pq.read_table(run / "metrics" / "metrics_by_model" / "metrics.parquet").to_pylist()[:1]
    assert (row["partial"], row["partial_shards"], row["partial_shards_total"]) == (True, len(keys), N_FILES)
    assert (row["partial_rollouts"], row["partial_rollouts_total"]) == (scored, None)

    # sql: the result on stdout, the warning on stderr.
    result = cli("sql", str(run), "SELECT count(*) AS n FROM rollouts", "--partial", "--format", "csv")
    assert result.exit_code == 0 and result.stdout.split()[-1] == str(scored)
    assert warning in " ".join(result.stderr.split())

    # report: the warning heads report.md and report.html.
    build_report(open_run(str(run), partial=True), tmp_path / "rep", settings=FAST, figures=False)
    for name in ("report.md", "report.html"):
        assert warning in (tmp_path / "rep" / name).read_text()


def test_a_partial_read_never_reads_a_part_without_its_commit(killed: tuple[Path, Path], tmp_path: Path) -> None:
    _, original = killed
    run = tmp_path / "run"
    shutil.copytree(original, run)
    keys = committed(run)
    # A shard cut short between its parts and its marker: a rollouts part and no marker.
    shutil.copy(run / "rollouts" / f"part-{keys[0]}.parquet", run / "rollouts" / "part-0000000000000000.parquet")
    assert open_run(str(run), partial=True).sql("SELECT count(*) AS n FROM rollouts").to_pylist() == [
        {"n": len(keys) * PER_FILE}
    ]


def test_rerunning_the_same_command_finishes_the_run(killed: tuple[Path, Path], tmp_path: Path) -> None:
    store, original = killed
    run = tmp_path / "run"
    shutil.copytree(original, run)
    keys = committed(run)
    manifest = run_scoring(str(store), str(run), ScoreSettings(inline=True))
    assert manifest.counts.shards_reused >= len(keys), [s for s in manifest.reuse.shards if s.shard in keys]
    [c] = open_run(str(run)).cohorts([], FAST)
    assert c["partial"] is None and c["n"] == N_FILES * PER_FILE


# --- a run with its manifest but not all its parts; stopped after N shards; a folder of runs -------------


@pytest.fixture(scope="module")
def parquet_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("pq")
    store = root / "store"
    write_store(synthesize("shop", 600, 60, 5), str(store), "parquet", 100, None)
    run_scoring(str(store), str(root / "run"), ScoreSettings(inline=True))
    return store, root / "run"


def test_a_missing_part_file_is_refused_even_with_a_manifest(parquet_run: tuple[Path, Path], tmp_path: Path) -> None:
    store, original = parquet_run
    run = tmp_path / "run"
    shutil.copytree(original, run)
    manifest = json.loads((run / "_manifest.json").read_text())
    lost = manifest["shards"][2]
    (run / "rollouts" / f"part-{lost['shard']}.parquet").unlink()
    with pytest.raises(RunIncomplete) as info:
        open_run(str(run)).cohorts(settings=FAST)
    assert str(info.value).startswith(
        f"run {run} is incomplete: its manifest lists 6 shards but 1 part file(s) are missing "
        f"(rollouts/part-{lost['shard']}.parquet); rescore it with `pexec score {store} --out {run} --force`"
    )
    [c] = open_run(str(run), partial=True).cohorts([], FAST)
    assert c["n"] == 600 - lost["scored"]
    assert {k: c["partial"][k] for k in ("shards", "shards_total", "rollouts", "rollouts_total")} == {
        "shards": 5,
        "shards_total": 6,
        "rollouts": 600 - lost["read"],
        "rollouts_total": 600,
    }


def test_a_run_stopped_after_some_shards_knows_its_total_from_the_plan(
    parquet_run: tuple[Path, Path], tmp_path: Path
) -> None:
    _, original = parquet_run
    run = tmp_path / "run"
    shutil.copytree(original, run)
    (run / "_manifest.json").unlink()
    plan = read_plan(str(run))
    assert [s.rows for s in plan.shards] == [100] * 6  # Parquet: counted from the footers
    for shard in plan.shards[4:]:
        (run / "_shards" / f"{shard.shard}.json").unlink()  # these two never committed
    [c] = open_run(str(run), partial=True).cohorts([], FAST)
    assert c["n"] == 400
    assert {k: c["partial"][k] for k in ("shards", "shards_total", "rollouts", "rollouts_total")} == {
        "shards": 4,
        "shards_total": 6,
        "rollouts": 400,
        "rollouts_total": 600,
    }


def test_a_partial_report_reads_one_snapshot_while_the_run_gains_a_shard(
    parquet_run: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`report --partial` on a run still being written: a shard committed while the report is being built (here
    right after its first tables) reaches none of its tables, which all count the same rollouts."""
    _, original = parquet_run
    run = tmp_path / "run"
    shutil.copytree(original, run)
    (run / "_manifest.json").unlink()
    late = read_plan(str(run)).shards[5].shard
    marker = run / "_shards" / f"{late}.json"
    committed_later = marker.read_bytes()
    marker.unlink()  # the sixth shard is not committed when the report starts
    query = "SELECT count(*) AS n, sum(T) AS calls FROM rollouts"
    [(n, calls)] = [tuple(r.values()) for r in open_run(str(run), partial=True).sql(query).to_pylist()]
    assert n == 500

    real = report_module.run_tables

    def then_the_scorer_commits(*args: object, **kwargs: object) -> object:
        tables = real(*args, **kwargs)
        marker.write_bytes(committed_later)
        return tables

    monkeypatch.setattr(report_module, "run_tables", then_the_scorer_commits)
    args = ["report", str(run), "--partial", "--out", str(tmp_path / "rep"), "--by", "model,method"]
    args += ["--bootstrap", "20", "--sensitivity", "--compare", "method=react", "method=plan_execute", "--no-figures"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    assert marker.exists() and len(open_run(str(run), partial=True).snapshot.runs[0].keys) == 6

    def table(name: str) -> list[dict]:
        return pq.read_table(tmp_path / "rep" / "tables" / f"{name}.parquet").to_pylist()

    assert sum(r["n"] for r in table("metrics")) == n
    assert sum(r["n"] for r in table("recovery")) == n
    assert sum(r["n"] for r in table("sensitivity")) == n
    assert sum(r["n_calls"] for r in table("tools")) == calls
    assert {r["partial_rollouts_total"] for r in table("metrics")} == {600}  # the plan's total, read once
    assert {r["partial_rollouts"] for r in table("metrics")} == {n}


def test_every_run_under_a_folder_is_checked(parquet_run: tuple[Path, Path], tmp_path: Path) -> None:
    _, original = parquet_run
    nightly = tmp_path / "nightly"
    for day in ("date=2026-11-28", "date=2026-11-29"):
        shutil.copytree(original, nightly / day)
    (nightly / "date=2026-11-29" / "_manifest.json").unlink()
    with pytest.raises(RunIncomplete) as info:
        open_run(str(nightly)).sql("SELECT 1")
    message = str(info.value)
    assert message.startswith(f"1 of 2 runs under {nightly} are incomplete: {nightly}/date=2026-11-29: no _manifest")
    assert "2026-11-28" not in message
    assert sum(c["n"] for c in open_run(str(nightly), partial=True).cohorts([], FAST)) == 1200  # markers all there
    [c] = open_run(str(nightly / "date=2026-11-28")).cohorts([], FAST)
    assert c["n"] == 600 and c["partial"] is None


# --- every table is queryable ----------------------------------------------------------------------------


def test_rejects_is_a_view(tmp_path: Path) -> None:
    store = tmp_path / "store"
    write_store(synthesize("shop", 50, 10, 1), str(store), "jsonl", 50, None)
    [file] = store.glob("*.jsonl")
    with file.open("a") as f:
        f.write('{"not": "a rollout"}\n')
    run_scoring(str(store), str(tmp_path / "run"), ScoreSettings(inline=True))
    [reject] = open_run(str(tmp_path / "run")).sql("SELECT source, location, reason FROM rejects").to_pylist()
    assert reject["source"] == str(file) and reject["location"] == "line 51" and reject["reason"]


def test_each_by_is_kept_under_its_own_name(parquet_run: tuple[Path, Path], tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(parquet_run[1], run)
    for by in (None, ["model"], ["model", "method"], []):
        open_run(str(run)).write_metrics(open_run(str(run)).cohorts(by, FAST), by)
    assert [metrics_name(b) for b in (None, ["model"], ["model", "method"], [])] == [
        "metrics",
        "metrics_by_model",
        "metrics_by_model_and_method",
        "metrics_by_benchmark",
    ]
    query = " UNION ALL ".join(
        f"SELECT '{v}' AS v, count(*) AS n FROM {v}"
        for v in ("metrics", "pec", "metrics_by_model", "metrics_by_model_and_method", "metrics_by_benchmark")
    )
    counts = {r["v"]: r["n"] for r in open_run(str(run)).sql(query).to_pylist()}
    assert counts["metrics"] == counts["metrics_by_model_and_method"] == 4  # every label = model × method
    assert (counts["metrics_by_model"], counts["metrics_by_benchmark"]) == (2, 1)
    assert counts["pec"] > 4


def as_layout_1(run: Path) -> None:
    """The run's markers and manifest as an older pexec wrote them (layout 1), beside parts it rewrote: each part's
    size as it is now, no rows or digests (readers check such parts by size and footer only)."""
    for path in [run / "_manifest.json", *run.glob("_shards/*.json")]:
        doc = orjson.loads(path.read_bytes())
        for marker in doc.get("shards", [doc]):
            for table_name in marker["parts"]:
                marker["parts"][table_name] = (run / table_name / f"part-{marker['shard']}.parquet").stat().st_size
            marker.pop("part_rows"), marker.pop("part_digests")
            marker["schema_version"] = 1
        doc["schema_version"] = 1
        path.write_bytes(orjson.dumps(doc))


def test_old_runs_check_column_reads_as_failed_check(parquet_run: tuple[Path, Path], tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(parquet_run[1], run)
    query = "SELECT failed_check, count(*) AS n FROM steps GROUP BY ALL ORDER BY ALL"
    new = open_run(str(run)).sql(query).to_pylist()
    assert {r["failed_check"] for r in new} == {None, "S", "D", "P"}
    # Half the parts rewritten as an older pexec wrote them: the column named `check`, and the run folder of layout
    # 1, whose markers record each part's size but no digest.
    for part in sorted((run / "steps").glob("*.parquet"))[::2]:
        table = pq.read_table(part)
        pq.write_table(table.rename_columns(["check" if c == "failed_check" else c for c in table.column_names]), part)
    as_layout_1(run)
    assert open_run(str(run)).sql(query).to_pylist() == new
    assert "check" not in open_run(str(run)).sql("SELECT * FROM steps LIMIT 0").column_names


# --- reports never mix folders ---------------------------------------------------------------------------


def test_report_into_a_non_empty_folder_needs_overwrite(parquet_run: tuple[Path, Path], tmp_path: Path) -> None:
    run = str(parquet_run[1])
    out = tmp_path / "rep"
    out.mkdir()
    (out / "old-figure.png").write_bytes(b"stale")
    result = cli("report", run, "--out", str(out), "--bootstrap", "20")
    assert result.exit_code == 2
    message = f"error: report folder {out} is not empty: pass --overwrite to replace what it holds"
    assert result.stderr.strip() == message
    assert sorted(p.name for p in out.iterdir()) == ["old-figure.png"]  # untouched
    result = cli("report", run, "--out", str(out), "--bootstrap", "20", "--overwrite", "--no-figures")
    assert result.exit_code == 0, result.output
    assert not (out / "old-figure.png").exists() and (out / "report.md").exists()
    with pytest.raises(ReportError, match="holds the run"):
        build_report(open_run(run), Path(run).parent, settings=FAST, overwrite=True, figures=False)
    assert (Path(run) / "_manifest.json").exists()


def test_a_job_checks_its_report_folder_and_settings_before_any_work(tmp_path: Path) -> None:
    job_file = tmp_path / "job.toml"
    body = f'name = "j"\ninput = "{tmp_path}/store"\noutput = "{tmp_path}/run"\n'
    job_file.write_text(body + '[metrics]\npartial = "yes"\n')
    with pytest.raises(JobFileError, match="partial is true or false"):
        load_job(job_file)
    (tmp_path / "rep").mkdir()
    (tmp_path / "rep" / "old.md").write_text("old")
    job_file.write_text(body + f'[synth]\nrollouts = 20\ntasks = 5\n[report]\nout = "{tmp_path}/rep"\n')
    with pytest.raises(JobFileError, match=r"report folder .*/rep is not empty.*overwrite = true in \[report\]"):
        run_job(load_job(job_file))
    assert not (tmp_path / "store").exists() and not (tmp_path / "run").exists()  # nothing was done
    assert load_job(job_file.with_name("job.toml")).report.overwrite is False


def test_old_runs_without_actor_read_as_the_agents_calls(parquet_run: tuple[Path, Path], tmp_path: Path) -> None:
    run = tmp_path / "run"
    shutil.copytree(parquet_run[1], run)
    query = "SELECT actor, count(*) AS n, sum((seq = step)::INT) AS same FROM steps GROUP BY ALL ORDER BY ALL"
    new = open_run(str(run)).sql(query).to_pylist()
    assert [r["actor"] for r in new] == ["agent"] and new[0]["same"] == new[0]["n"]
    # Every part rewritten as a pexec from before dual control wrote them: no `actor`, no `seq`.
    for part in sorted((run / "steps").glob("*.parquet")):
        table = pq.read_table(part)
        pq.write_table(table.drop_columns(["actor", "seq"]), part)
    as_layout_1(run)
    assert open_run(str(run)).sql(query).to_pylist() == new
