"""A head and two worker nodes on loopback (separate raylets, one CPU each; the head only drives), a job
submitted through the Jobs API: a worker node's raylet SIGKILLed mid-run, then the job's driver SIGKILLed
mid-run and the same submission rerun. Each time the tables equal a clean run's, row for row.
Small on purpose (1000 rollouts, 36 shards of 0.1 MiB): it runs in `make test` in about a minute."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from cluster import start_cluster, stop_cluster
from conftest import wait_for
from test_scale import rows

from pipeline.jobs.cluster import job_logs, job_status, submit_job
from pipeline.jobs.definition import load_job
from pipeline.scoring.driver import run_scoring
from pipeline.storage.run import read_manifest, read_shard_markers
from pipeline.storage.stores import write_store
from pipeline.synthetic.rollouts import synthesize

pytestmark = pytest.mark.cluster
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


@pytest.fixture(scope="module")
def three_nodes():
    cluster = start_cluster(head_cpus=0, workers=2)
    yield cluster
    stop_cluster(cluster)


@pytest.fixture(scope="module")
def store_and_reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("multinode")
    write_store(synthesize("shop", 1000, 100, seed=11), str(root / "store"), per_file=250)
    reference = str(root / "reference")
    run_scoring(str(root / "store"), reference, executor="inline", run_id="r")
    return root / "store", reference


def submit(cluster, store: Path, run: Path) -> str:
    path = run.parent / f"{run.name}.toml"
    path.write_text(f'name = "{run.name}"\ninput = "{store}"\noutput = "{run}"\nshard_mb = 0.1\n'
                    '[metrics]\nbootstrap = 50\n')  # fmt: skip
    return submit_job(path, load_job(path), cluster.address, "local")


def finish(cluster, submission: str) -> str:
    wait_for(lambda: job_status(cluster.address, submission) in TERMINAL, 300, f"job {submission}")
    return job_status(cluster.address, submission)


def test_a_worker_node_killed_mid_job_changes_nothing(three_nodes, store_and_reference, tmp_path):
    store, reference = store_and_reference
    run = tmp_path / "run"
    started = time.monotonic()
    submission = submit(three_nodes, store, run)
    wait_for(lambda: len(read_shard_markers(str(run))) >= 1, 180, "a first shard")
    worker_session = three_nodes.sessions()[1]  # the first worker node (sessions: head, worker, worker)
    raylets = [p for p in three_nodes.pids() if os.getsid(p) == worker_session and _name(p) == "raylet"]
    assert len(raylets) == 1
    os.kill(raylets[0], signal.SIGKILL)
    state = finish(three_nodes, submission)
    assert state == "SUCCEEDED", job_logs(three_nodes.address, submission)
    print(f"worker node killed: job done in {time.monotonic() - started:.0f}s")
    assert read_manifest(str(run))["counts"]["scored"] == 1000
    for table in ("steps", "rollouts"):
        assert rows(str(run), table) == rows(reference, table)


def test_a_driver_killed_mid_job_then_resubmitted_gives_the_same_tables(three_nodes, store_and_reference, tmp_path):
    from ray.job_submission import JobSubmissionClient

    store, reference = store_and_reference
    run = tmp_path / "run"
    submission = submit(three_nodes, store, run)
    wait_for(lambda: len(read_shard_markers(str(run))) >= 2, 180, "two shards")
    driver = JobSubmissionClient(three_nodes.address).get_job_info(submission).driver_info.pid
    os.kill(int(driver), signal.SIGKILL)
    assert finish(three_nodes, submission) == "FAILED"
    committed = len(read_shard_markers(str(run)))
    assert read_manifest(str(run)) is None, "a killed run must not look complete"
    started = time.monotonic()
    again = submit(three_nodes, store, run)
    assert finish(three_nodes, again) == "SUCCEEDED", job_logs(three_nodes.address, again)
    print(f"driver killed after {committed} shard(s): rerun done in {time.monotonic() - started:.0f}s")
    assert read_manifest(str(run))["counts"]["shards_reused"] >= min(committed, 2)
    for table in ("steps", "rollouts"):
        assert rows(str(run), table) == rows(reference, table)


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""
