"""End to end: synthetic stores with known truth -> scoring (inline and through a real local Ray) -> Parquet."""

from __future__ import annotations

import gzip
import shutil
import textwrap
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest
from msgspec import structs
from typer.testing import CliRunner

from pipeline.apps.cli import app
from pipeline.apps.jobs.definition import load_job
from pipeline.core.errors import JobFileError
from pipeline.metrics.run import open_run
from pipeline.metrics.settings import BootstrapSettings
from pipeline.scoring._code_version import PACKAGE_ROOT, scoring_sources
from pipeline.scoring.driver import run_scoring
from pipeline.scoring.settings import ScoreSettings
from pipeline.storage.run import read_manifest
from pipeline.storage.stores import write_store
from pipeline.synthetic.rollouts import synthesize

N_ROLLOUTS, N_TASKS = 1200, 150


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("store")
    write_store(synthesize("shop", N_ROLLOUTS, N_TASKS, seed=3), str(root), per_file=400)
    return root


@pytest.fixture(scope="module")
def records(store: Path) -> dict[str, dict]:
    out = {}
    for path in sorted(store.glob("*.jsonl")):
        for line in path.read_bytes().splitlines():
            rec = orjson.loads(line)
            out[rec["rollout_id"]] = rec
    return out


@pytest.fixture
def local_ray(shared_ray):
    """Scoring through Ray: the session's shared local Ray."""


def table(run: Path, name: str) -> list[dict]:
    rows = pq.read_table(run / name).to_pylist()
    key = (
        ("rollout_id", "step") if name == "steps" else ("rollout_id",) if name == "rollouts" else ("source", "location")
    )
    return sorted(rows, key=lambda r: tuple(r[k] for k in key))


def assert_matches_truth(run: Path, records: dict[str, dict]) -> None:
    rollouts = table(run, "rollouts")
    assert len(rollouts) == len(records)
    for row in rollouts:
        truth = records[row["rollout_id"]]["truth"]
        assert (row["fed"], row["first_cause"]) == (truth["fed"], truth["first_cause"]), row["rollout_id"]
        assert row["T"] == len(truth["steps"])
    steps: dict[str, list] = {}
    for s in table(run, "steps"):
        steps.setdefault(s["rollout_id"], []).append({"valid": s["valid"], "cause": s["cause"]})
    for rid, rec in records.items():
        assert steps.get(rid, []) == rec["truth"]["steps"], rid


def test_synthetic_truth_is_recovered_exactly_through_ray(store, records, tmp_path, local_ray):
    run = tmp_path / "run"
    manifest = run_scoring(str(store), str(run), ScoreSettings(shard_mb=0.25))
    assert manifest.counts.read == N_ROLLOUTS and manifest.counts.rejected == 0
    assert manifest.reconciled and len(manifest.shards) > 3  # several Ray tasks, some per byte range
    assert_matches_truth(run, records)
    # every cause occurs, and recoveries exist
    causes = {r["first_cause"] for r in table(run, "rollouts")}
    assert causes == {None, "schema", "dependency", "information", "state_consistency", "precondition"}
    assert any(r["recovered"] for r in table(run, "rollouts"))
    # the synthetic logs carry the simulator's outputs: replay fidelity is perfect
    assert all(s["output_match"] for s in table(run, "steps"))


def test_ray_and_inline_write_the_same_rows_and_reruns_do_not_duplicate(store, tmp_path, local_ray):
    ray_run, inline_run = tmp_path / "ray", tmp_path / "inline"
    run_scoring(str(store), str(ray_run), ScoreSettings(shard_mb=0.25), run_id="x")
    run_scoring(str(store), str(inline_run), ScoreSettings(shard_mb=0.25, inline=True), run_id="x")
    run_scoring(str(store), str(ray_run), ScoreSettings(shard_mb=0.25), run_id="x")  # rerun into the same folder
    for name in ("steps", "rollouts", "rejects"):
        assert table(ray_run, name) == table(inline_run, name)
    assert len(table(ray_run, "rollouts")) == N_ROLLOUTS


def test_rerun_with_another_shard_plan_leaves_no_stale_parts(store, tmp_path):
    run = tmp_path / "run"
    run_scoring(str(store), str(run), ScoreSettings(inline=True, shard_mb=64))
    coarse = len(list((run / "steps").iterdir()))
    run_scoring(str(store), str(run), ScoreSettings(inline=True, shard_mb=0.125))
    assert len(list((run / "steps").iterdir())) > coarse
    assert len(table(run, "rollouts")) == N_ROLLOUTS
    assert len({r["rollout_id"] for r in table(run, "rollouts")}) == N_ROLLOUTS


def test_rerun_rescores_only_changed_inputs(records, tmp_path):
    recs = list(records.values())
    store, run = tmp_path / "store", tmp_path / "run"
    write_store(iter(recs), str(store), per_file=300)  # 4 files
    first = run_scoring(str(store), str(run), ScoreSettings(inline=True))
    assert first.counts.shards_reused == 0
    again = run_scoring(str(store), str(run), ScoreSettings(inline=True))
    assert again.counts.shards_reused == again.counts.shards == 4
    changed = store / "part-00002.jsonl"
    changed.write_bytes(changed.read_bytes() + orjson.dumps(recs[0] | {"rollout_id": "new"}) + b"\n")
    third = run_scoring(str(store), str(run), ScoreSettings(inline=True))
    assert third.counts.shards_reused == 3 and third.counts.scored == N_ROLLOUTS + 1
    assert [s.reused for s in third.shards] == [True, True, False, True]
    assert len(table(run, "rollouts")) == N_ROLLOUTS + 1
    forced = run_scoring(str(store), str(run), ScoreSettings(inline=True, force=True))
    assert forced.counts.shards_reused == 0
    other_settings = run_scoring(str(store), str(run), ScoreSettings(inline=True), run_id="renamed")
    assert other_settings.counts.shards_reused == 0


def test_a_rerun_with_nothing_new_starts_no_ray_and_one_after_a_cut_rerun_checks_the_ids_again(
    records, tmp_path, local_ray, monkeypatch
):
    """A committed run whose shards are all reusable, over exactly the same shards, keeps its id check: the rerun
    reads no ids and starts no Ray (seconds on every rerun). A run whose manifest is gone (a rerun cut short) has
    lost that proof: its ids are checked again, and the duplicate verdicts are the same."""
    import pipeline.scoring.driver as driver

    recs = list(records.values())
    store, run = tmp_path / "store", tmp_path / "run"
    write_store(iter([*recs, recs[0] | {"events": []}]), str(store), per_file=400)  # a later copy of an id
    first = run_scoring(str(store), str(run))
    rejects = table(run, "rejects")
    assert [r["reason"] for r in rejects if "duplicate" in r["reason"]], rejects

    def refused(*args, **kwargs):
        raise AssertionError("Ray or the id check used for a run with nothing new")

    with monkeypatch.context() as m:
        m.setattr(driver, "_start_ray", refused)
        m.setattr(driver, "RayIdCheck", refused)
        again = run_scoring(str(store), str(run))
    assert again.counts == structs.replace(first.counts, shards_reused=first.counts.shards)
    assert table(run, "rejects") == rejects

    checked = []
    real = driver.RayIdCheck
    monkeypatch.setattr(driver, "RayIdCheck", lambda *a: checked.append(1) or real(*a))
    (run / "_manifest.json").unlink()
    cut = run_scoring(str(store), str(run))
    assert checked and cut.counts == again.counts and table(run, "rejects") == rejects


def test_a_relative_out_is_where_the_driver_is_not_where_the_workers_started(records, tmp_path, local_ray, monkeypatch):
    """Ray's workers keep the working directory they started in (the shared Ray's: where the suite began; a
    cluster's: its own): a relative --out is made absolute in the driver before any task sees it."""
    write_store(iter(list(records.values())[:50]), str(tmp_path / "store"))
    monkeypatch.chdir(tmp_path)
    name = f"relative-run-{tmp_path.name}"
    manifest = run_scoring("store", name)
    assert manifest.counts.scored == 50
    assert len(list((tmp_path / name / "steps").glob("*.parquet"))) == 1
    assert not (Path(__file__).resolve().parents[1] / name).exists()


def test_date_partitions_are_queryable_together(records, tmp_path):
    recs = list(records.values())
    for day, part in (("2026-11-28", recs[:500]), ("2026-11-29", recs[500:])):
        write_store(iter(part), str(tmp_path / "logs" / f"date={day}"))
        run_scoring(
            str(tmp_path / "logs" / f"date={day}"), str(tmp_path / "runs" / f"date={day}"), ScoreSettings(inline=True)
        )
    nightly = str(tmp_path / "runs")
    assert open_run(nightly).sql("SELECT count(*) AS n FROM rollouts").to_pylist() == [{"n": N_ROLLOUTS}]
    assert open_run(nightly).sql("SELECT count(DISTINCT run_id) AS n FROM steps").to_pylist() == [{"n": 2}]
    assert sum(c["n"] for c in open_run(nightly).cohorts([], BootstrapSettings(B=50))) == N_ROLLOUTS
    one_day = open_run(str(tmp_path / "runs" / "date=2026-11-29")).cohorts([], BootstrapSettings(B=50))
    assert one_day[0]["n"] == N_ROLLOUTS - 500


def test_parquet_and_compressed_stores_score_like_json_lines(records, tmp_path):
    recs = list(records.values())
    variants = {"jsonl": ("jsonl", None), "zst": ("jsonl", "zstd"), "gz": ("jsonl", "gzip"), "pq": ("parquet", None)}
    results = {}
    for name, (fmt, compression) in variants.items():
        write_store(iter(recs), str(tmp_path / name), fmt=fmt, per_file=500, compression=compression)
        run = tmp_path / f"run-{name}"
        run_scoring(str(tmp_path / name), str(run), ScoreSettings(inline=True), run_id="same")
        results[name] = (table(run, "rollouts"), table(run, "steps"))
    assert results["zst"] == results["jsonl"] == results["gz"] == results["pq"]
    assert_matches_truth(tmp_path / "run-pq", records)


def test_bad_records_are_rejected_with_reasons_and_counts_reconcile(records, tmp_path):
    good = list(records.values())[:5]
    lines = [orjson.dumps(r) for r in good]
    no_id = dict(good[0]).copy()
    del no_id["rollout_id"]
    bad_event = {**good[1], "rollout_id": "bad-event", "events": [{"type": "thought"}]}
    unknown = {**good[2], "rollout_id": "unknown-bench", "benchmark": "nowhere"}
    dup = good[3]
    lines += [b"{not json", b"[1, 2]", orjson.dumps(no_id), orjson.dumps(bad_event), orjson.dumps(unknown)]
    lines += [orjson.dumps(dup), b"", b"   "]
    store = tmp_path / "store"
    store.mkdir()
    (store / "mixed.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    (store / "notes.txt").write_text("ignored, not data")
    packed = gzip.compress(b"".join(orjson.dumps(good[4] | {"rollout_id": f"gz-{i}"}) + b"\n" for i in range(40)))
    (store / "cut.jsonl.gz").write_bytes(packed[: len(packed) * 2 // 3])  # a transfer cut short
    run = tmp_path / "run"
    manifest = run_scoring(str(store), str(run), ScoreSettings(inline=True))
    counts = manifest.counts
    from_gz = sum(s.read for s in manifest.shards if s.source.endswith(".gz"))
    assert 1 < from_gz < 41
    assert (counts.read, counts.scored, counts.rejected) == (11 + from_gz, 5 + from_gz - 1, 7)
    assert manifest.reconciled and manifest.input.ignored == (str(store / "notes.txt"),)
    rejects = {(Path(r["source"]).name, r["location"]): r["reason"] for r in table(run, "rejects")}
    assert rejects[("mixed.jsonl", "line 6")].startswith("invalid JSON")
    assert rejects[("mixed.jsonl", "line 7")] == "record is not a JSON object (got list)"
    assert rejects[("mixed.jsonl", "line 8")] == "missing or invalid 'rollout_id'"
    assert "unknown event type 'thought'" in rejects[("mixed.jsonl", "line 9")]
    assert "unknown environment 'nowhere'" in rejects[("mixed.jsonl", "line 10")]
    assert "duplicate rollout_id" in rejects[("mixed.jsonl", "line 11")]
    assert "gzip" in next(v for (src, _), v in rejects.items() if src == "cut.jsonl.gz")
    assert read_manifest(str(run)).counts == counts


def test_bad_spec_fails_before_scoring(tmp_path, store):
    spec = tmp_path / "broken"
    shutil.copytree(Path(__file__).parents[1] / "specs" / "shop", spec)
    (spec / "spec.toml").write_text(
        (spec / "spec.toml").read_text().replace("has(state.products", "has(state.products,")
    )
    from pipeline.envs import SpecError

    with pytest.raises(SpecError, match=r"broken/spec.toml: \[tool.get_product\] preconditions\[0\]"):
        run_scoring(str(store), str(tmp_path / "run"), ScoreSettings(env=str(spec), inline=True))
    assert not (tmp_path / "run").exists()


def test_code_version_covers_what_scoring_executes_and_nothing_else():
    sources = {p.relative_to(PACKAGE_ROOT).as_posix() for p in scoring_sources()}
    # the scoring task, the checker, and modules reached only through imports (records via the shard, the
    # expression language via the rule engine, the BFCL wheel importer via its environment)
    assert {"scoring/shard.py", "replay/checker.py", "core/records.py", "expr/__init__.py"} <= sources
    assert "envs/bfcl/_wheel_import.py" in sources
    assert not {"metrics/cohorts.py", "cli/app.py", "scoring/driver.py", "report/_html.py", "ingest/bfcl.py"} & sources


def test_a_job_with_a_report_table_writes_metrics_and_report(tmp_path, local_ray):
    job = tmp_path / "job.toml"
    job.write_text(
        textwrap.dedent(f"""\
        name = "audit"
        input = "{tmp_path}/store"
        output = "{tmp_path}/runs/date={{date}}"
        [synth]
        spec = "shop"
        rollouts = 300
        tasks = 30
        [metrics]
        by = ["model", "method"]
        bootstrap = 100
        strict_replay = true
        [report]
        compare = ["method=react", "method=plan_execute"]
        k = [1, 2]
        within = "model"
        """)
    )
    result = CliRunner().invoke(app, ["run", str(job), "--date", "2026-11-29"])
    assert result.exit_code == 0, result.output
    run = tmp_path / "runs" / "date=2026-11-29"
    assert (run / "metrics" / "metrics_by_model_and_method" / "metrics.parquet").is_file()
    md = (run / "report" / "report.md").read_text()
    assert "| PEC@2 |" in md and "## Paired comparison — method: react − plan\\_execute" in md
    assert "## Ranking divergence — shop · model=model-a" in md and "--strict-replay: 0 rollout(s)" in md
    metrics = pq.read_table(run / "metrics" / "metrics_by_model_and_method" / "metrics.parquet")
    assert all(metrics.column("strict_replay").to_pylist())
    paired = pq.read_table(run / "report" / "tables" / "paired.parquet").to_pylist()
    assert {r["model"] for r in paired} == {"model-a", "model-b"}


def test_a_job_report_table_is_checked_when_the_job_loads(tmp_path):
    job = tmp_path / "job.toml"
    job.write_text('name = "x"\ninput = "a"\noutput = "b"\n[report]\ncompare = ["method=react"]\n')
    with pytest.raises(JobFileError, match=r"\[report\]: compare: --compare takes exactly two"):
        load_job(job)
    job.write_text('name = "x"\ninput = "a"\noutput = "b"\n[report]\nk = [0]\nlayout = "wide"\n')
    with pytest.raises(JobFileError, match=r"\[report\]"):
        load_job(job)
    job.write_text('name = "x"\ninput = "a"\noutput = "b"\n[metrics]\nstrict_replay = "yes"\n')
    with pytest.raises(JobFileError, match=r"\[metrics\]: strict_replay is true or false"):
        load_job(job)


def test_an_environment_that_appears_between_runs_in_one_process_is_used(records, tmp_path):
    # The registry remembers names that do not resolve (one lookup per process, not per record); a new
    # scoring run must look again, or a notebook rerun after adding the spec would keep rejecting.
    store, specs = tmp_path / "store", tmp_path / "specs"
    write_store(({**r, "benchmark": "late_shop"} for r in list(records.values())[:50]), str(store))
    settings = ScoreSettings(spec_dirs=(str(specs),), inline=True)
    first = run_scoring(str(store), str(tmp_path / "run"), settings)
    assert first.counts.rejected == 50 and first.environments == {"late_shop": None}
    shutil.copytree(Path(__file__).resolve().parents[1] / "specs" / "shop", specs / "late_shop")
    second = run_scoring(str(store), str(tmp_path / "run"), settings)
    assert second.counts.scored == 50 and second.counts.shards_reused == 0
