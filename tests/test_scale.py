"""Scale-out with real parts: an S3-compatible server (moto, server mode) on loopback, a Ray worker killed
with SIGKILL, a driver killed midway, storage faults. The S3 server is started by the script developers use
(infra/local). Jobs on a Ray cluster of several nodes, and nodes killed: test_cluster.py."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import free_port, s3_filesystem, wait_for
from typer.testing import CliRunner

from pipeline.apps.cli import app
from pipeline.core.errors import ScoringFailed
from pipeline.metrics.run import open_run
from pipeline.metrics.settings import BootstrapSettings
from pipeline.report import build_report
from pipeline.scoring.driver import run_scoring
from pipeline.scoring.settings import ScoreSettings
from pipeline.storage.run import read_manifest, read_shard_markers
from pipeline.storage.stores import write_store
from pipeline.synthetic.rollouts import synthesize

BIN = Path(sys.executable).parent


def rows(run: str, table: str, storage_options: dict | None = None) -> list[dict]:
    result = open_run(run, storage_options).sql(f"SELECT * EXCLUDE (run_id) FROM {table}").to_pylist()
    return sorted(result, key=lambda r: tuple(str(v) for v in r.values()))


@pytest.fixture(scope="module")
def local_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("scale-store")
    write_store(synthesize("shop", 1500, 150, seed=5), str(root), per_file=300)
    return root


@pytest.fixture(scope="module")
def reference_run(local_store: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    run = str(tmp_path_factory.mktemp("reference") / "run")
    run_scoring(str(local_store), run, ScoreSettings(inline=True), run_id="r")
    return run


def test_object_storage_end_to_end_through_ray(s3, local_store, reference_run, tmp_path, shared_ray):
    store, run = "s3://pexec-test/store", "s3://pexec-test/runs/a"
    write_store(synthesize("shop", 1500, 150, seed=5), store, per_file=300, storage_options=s3)
    manifest = run_scoring(store, run, ScoreSettings(storage_options=s3, shard_mb=0.25), run_id="r")
    assert manifest.counts.scored == 1500 and manifest.reconciled
    assert read_manifest(run, s3).counts == manifest.counts
    for table in ("steps", "rollouts"):
        assert rows(run, table, s3) == rows(reference_run, table)
    cohorts = open_run(run, s3).cohorts(["model"])
    assert [c["model"] for c in cohorts] == ["model-a", "model-b"] and sum(c["n"] for c in cohorts) == 1500
    # Nothing of the credentials is written anywhere in the run.
    fs = s3_filesystem(s3)
    assert "testing" not in fs.cat(f"{run[5:]}/_manifest.json").decode()
    # The report reads the run from the bucket and writes into it; its numbers equal a local report's.
    report = "s3://pexec-test/reports/a"
    args = ["report", run, "--out", report, "--by", "model", "--bootstrap", "200", "--endpoint-url", s3["endpoint_url"]]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    local = build_report(open_run(reference_run), tmp_path / "report", ["model"], settings=BootstrapSettings(B=200))
    remote_md = fs.cat(f"{report[5:]}/report.md").decode()
    assert remote_md.split("\n", 1)[1] == (tmp_path / "report" / "report.md").read_text().split("\n", 1)[1]
    assert len(fs.find(report[5:])) == len(local.files)


def test_unwritable_bucket_fails_clearly_and_commits_nothing(s3, local_store, shared_ray):
    with pytest.raises(ScoringFailed, match=r"NoSuchBucket|does not exist|not found"):
        run_scoring(str(local_store), "s3://no-such-bucket/run", ScoreSettings(storage_options=s3))
    assert not s3_filesystem(s3).exists("no-such-bucket/run/_manifest.json")


def test_a_missing_store_in_the_bucket_is_a_clear_error(s3, tmp_path):
    from pipeline.core.errors import StoreError

    with pytest.raises(StoreError, match="no such store: s3://pexec-test/nothing-here"):
        run_scoring(
            "s3://pexec-test/nothing-here", str(tmp_path / "run"), ScoreSettings(storage_options=s3, inline=True)
        )


def test_an_unreachable_store_fails_clearly(s3, tmp_path):  # s3: only for its credentials
    from pipeline.core.errors import StoreError

    closed = {"endpoint_url": f"http://127.0.0.1:{free_port()}", "config_kwargs": {"retries": {"max_attempts": 1}}}
    with pytest.raises(StoreError, match="cannot list store s3://pexec-test/store: EndpointConnectionError"):
        run_scoring("s3://pexec-test/store", str(tmp_path / "run"), ScoreSettings(storage_options=closed, inline=True))
    assert not (tmp_path / "run").exists()
    proc = subprocess.run(
        [
            str(BIN / "pexec"),
            "score",
            "s3://pexec-test/store",
            "--out",
            str(tmp_path / "run"),
            "--endpoint-url",
            closed["endpoint_url"],
            "--storage-option",
            'config_kwargs={"retries": {"max_attempts": 1}}',
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "cannot list store" in proc.stderr and "Traceback" not in proc.stderr


def of_this_process(pid: int) -> bool:
    """Whether `pid` descends from this process: a worker of the Ray it started, not of another Ray on the
    machine (a parallel test process's, another checkout's)."""
    while pid > 1:
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])  # the parent's pid
        except (OSError, IndexError, ValueError):
            return False
        if pid == os.getpid():
            return True
    return False


def test_a_worker_killed_mid_job_changes_nothing(local_store, reference_run, tmp_path, shared_ray):
    # On the shared Ray: a killed task worker is replaced by a new one, so the Ray stays fit for the next test.
    run = str(tmp_path / "run")
    killed: list[int] = []

    def kill_a_worker(report) -> None:
        # After the first shard commits, SIGKILL a worker that is running a scoring task right now (score_shard,
        # or scored_in_partitions when the ids go to the partitioned check).
        if killed:
            return
        pids = subprocess.run(["pgrep", "-f", "ray::score"], capture_output=True, text=True).stdout.split()
        for pid in filter(of_this_process, map(int, pids)):
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
            break

    manifest = run_scoring(str(local_store), run, ScoreSettings(shard_mb=0.125), run_id="r", on_shard=kill_a_worker)
    assert killed, "no scoring worker was found to kill"
    assert manifest.counts.scored == 1500
    for table in ("steps", "rollouts"):
        assert rows(run, table) == rows(reference_run, table)


@pytest.mark.ray  # the driver, a `pexec score` on Ray, killed midway
def test_a_driver_killed_midway_then_rerun_gives_the_same_output(local_store, reference_run, tmp_path):
    run = tmp_path / "run"
    cmd = [str(BIN / "pexec"), "score", str(local_store), "--out", str(run), "--shard-mb", "0.1", "--num-cpus", "1"]
    env = {**os.environ, "PATH": f"{BIN}:{os.environ['PATH']}"}
    driver = subprocess.Popen(
        [*cmd], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True, env=env
    )
    try:
        wait_for(lambda: len(read_shard_markers(str(run))) >= 3 or driver.poll() is not None, 120, "3 shards")
    finally:
        os.killpg(driver.pid, signal.SIGKILL)
        driver.wait()
    committed = len(read_shard_markers(str(run)))
    assert read_manifest(str(run)) is None, "a killed run must not look complete"
    done = subprocess.run([*cmd, "--inline"], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    manifest = read_manifest(str(run))
    assert manifest.counts.shards_reused >= min(committed, 3)
    for table in ("steps", "rollouts"):
        assert rows(str(run), table) == rows(reference_run, table)
