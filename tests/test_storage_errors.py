"""Every command that touches storage, against the S3 server (moto) with a bucket that does not exist and
with no credentials at all: one line starting with `error:`, exit 2, never a traceback; and `pexec run
--check` finds a job's problems before any scoring."""

from __future__ import annotations

import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from conftest import ROOT

from pipeline.storage.stores import write_store
from pipeline.synthetic.rollouts import synthesize

PEXEC = str(Path(sys.executable).parent / "pexec")
NO_CREDENTIALS = {"AWS_SHARED_CREDENTIALS_FILE": "/nonexistent", "AWS_CONFIG_FILE": "/nonexistent",
                  "AWS_EC2_METADATA_DISABLED": "true"}  # fmt: skip


def commands(bucket: str, endpoint: str, job: Path) -> list[list[str]]:
    e = ["--endpoint-url", endpoint]
    return [
        ["synth", "shop", "--rollouts", "20", "--tasks", "5", "--out", f"s3://{bucket}/new", *e],
        ["ingest", "canonical", f"s3://{bucket}/store", "--out", f"s3://{bucket}/copy", *e],
        ["score", f"s3://{bucket}/store", "--out", f"s3://{bucket}/run", "--inline", *e],
        ["metrics", f"s3://{bucket}/run", *e],
        ["report", f"s3://{bucket}/run", "--out", f"s3://{bucket}/report", *e],
        ["sql", f"s3://{bucket}/run", "SELECT 1", *e],
        ["diff", f"s3://{bucket}/run", f"s3://{bucket}/run", *e],
        ["view", f"s3://{bucket}/run", *e],
        ["run", str(job), "--check"],
        ["run", str(job)],
    ]


@pytest.fixture(scope="module")
def setup(s3, tmp_path_factory):
    write_store(synthesize("shop", 20, 5, seed=1), "s3://pexec-test/store", storage_options=s3)
    folder = tmp_path_factory.mktemp("errors")
    jobs = {}
    for bucket in ("pexec-test", "no-such-bucket"):
        jobs[bucket] = folder / f"{bucket}.toml"
        jobs[bucket].write_text(f'name = "j"\ninput = "s3://{bucket}/store"\noutput = "s3://{bucket}/run"\n'
                                f'endpoint_url = "{s3["endpoint_url"]}"\n[metrics]\nby = ["model"]\n')  # fmt: skip
    return s3["endpoint_url"], jobs, folder


def run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([PEXEC, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("fault", ["missing bucket", "no credentials"])
def test_every_storage_command_fails_on_one_line(setup, fault):
    endpoint, jobs, folder = setup
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if fault == "no credentials":
        env = {k: v for k, v in env.items() if not k.startswith("AWS_")} | NO_CREDENTIALS
    bucket = "no-such-bucket" if fault == "missing bucket" else "pexec-test"
    # Each command is a process of its own that changes nothing: they run side by side (most of each is Python
    # starting up), and are checked one by one.
    with ThreadPoolExecutor(4) as pool:
        ran = list(pool.map(lambda args: (args, run(args, env, folder)), commands(bucket, endpoint, jobs[bucket])))
    for args, done in ran:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        assert done.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), (args, done.stderr)
        assert "Traceback" not in done.stderr
        expected = "bucket" if fault == "missing bucket" else "credentials"
        assert expected in lines[0].lower() or "no such store" in lines[0] or "no run at" in lines[0], lines[0]


def test_run_check_finds_a_misspelled_column_before_scoring(setup):
    _, jobs, folder = setup
    job = folder / "typo.toml"
    job.write_text(jobs["pexec-test"].read_text().replace('"model"', '"modle"').replace("/run", "/typo-run"))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    checked = run(["run", str(job), "--check"], env, folder)
    assert checked.returncode == 2
    assert "unknown cohort column 'modle'; available label columns: method, model" in checked.stderr
    ran = run(["run", str(job)], env, folder)
    assert ran.returncode == 2 and "unknown cohort column 'modle'" in ran.stderr and "scoring" not in ran.stderr
    good = run(["run", str(jobs["pexec-test"]), "--check"], env, folder)
    assert good.returncode == 0, good.stderr
    assert "can run: input s3://pexec-test/store (1 file(s)" in good.stderr and "labels method, model" in good.stderr
