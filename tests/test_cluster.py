"""Jobs on a real Ray cluster on loopback (infra/local/ray-head.sh: a head that only drives and two worker nodes of
one CPU each) through the Jobs API: submitted from a shell without pexec on its PATH, outputs where the submitter
looks, nothing but the job file uploaded, every service on loopback; then a worker node's raylet SIGKILLed mid-job,
and a job's driver SIGKILLed mid-job and the same submission rerun, each time with tables equal to a clean run's
row for row; last, `stop` ending exactly what `start` launched. The module starts the cluster once."""

from __future__ import annotations

import ipaddress
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from cluster import BIN, listening, session_pids, start_cluster, stop_cluster
from conftest import ROOT, starts, wait_for
from test_scale import rows

from pipeline.apps.jobs.cluster import (
    copy_sources,
    default_runtime,
    job_logs,
    job_status,
    jobs_api_address,
    plan_submission,
    submit_job,
)
from pipeline.apps.jobs.definition import load_job
from pipeline.core.errors import ClusterApiError, JobFileError
from pipeline.scoring._code_version import code_version
from pipeline.scoring.driver import run_scoring
from pipeline.scoring.settings import ScoreSettings
from pipeline.storage.run import read_manifest, read_shard_markers
from pipeline.storage.stores import write_store
from pipeline.synthetic.rollouts import synthesize

TINY = (
    'name = "tiny"\ninput = "{input}"\noutput = "{output}/date={{date}}"\nshard_mb = 1\n'
    '[synth]\nrollouts = {rollouts}\ntasks = 30\n[metrics]\nby = ["model"]\nbootstrap = 100\n'
)


def write_job(folder: Path, input: str, output: str, rollouts: int = 300, extra: str = "") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "tiny.toml"
    path.write_text(TINY.format(input=input, output=output, rollouts=rollouts) + extra)
    return path


# --- without a cluster ---------------------------------------------------------------------------------


def test_the_address_comes_from_the_option_then_the_environment_and_gets_a_scheme(monkeypatch):
    monkeypatch.delenv("RAY_API_SERVER_ADDRESS", raising=False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(ClusterApiError, match="no Jobs API address"):
        jobs_api_address(None)
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:8265")
    assert jobs_api_address(None) == "http://10.0.0.5:8265"
    monkeypatch.setenv("RAY_API_SERVER_ADDRESS", "https://head.example:443/")
    assert jobs_api_address(None) == "https://head.example:443"
    assert jobs_api_address("127.0.0.1:8265") == "http://127.0.0.1:8265"
    for bad in ("ray://head:10001", "auto", "gcs://x:6379"):
        with pytest.raises(ClusterApiError, match="dashboard's http"):
            jobs_api_address(bad)
    assert default_runtime("http://127.0.0.1:8265") == default_runtime("http://localhost:1") == "local"
    assert default_runtime("http://pexec-head-svc:8265") == default_runtime("http://10.1.2.3:8265") == "image"


def test_a_local_submission_runs_the_submitters_interpreter_in_its_folder(tmp_path):
    path = write_job(tmp_path / "jobs", "out/store", "out/run")
    job = load_job(path, "2026-11-29")
    plan = plan_submission(path, job, "local", None, tmp_path)
    assert plan.entrypoint == (
        f"cd {tmp_path} && {sys.executable} -m pipeline.apps.cli run {path.resolve()} --date 2026-11-29"
    )
    assert plan.upload is None
    assert plan.runtime_env == {"env_vars": {"PYTHONPATH": str(ROOT)}}


def test_an_image_submission_uploads_the_job_file_and_refuses_relative_paths(tmp_path):
    relative = write_job(tmp_path / "a", "out/store", "s3://runs/x")
    with pytest.raises(ClusterApiError, match=r"relative path\(s\) input 'out/store' would land in the cluster's"):
        plan_submission(relative, load_job(relative), "image", None, tmp_path)
    absolute = write_job(tmp_path / "b", "s3://logs/{date}/", "/shared/runs")
    plan = plan_submission(absolute, load_job(absolute, "2026-11-29"), "image", "/opt/venv/bin/python", tmp_path)
    assert plan.entrypoint == "/opt/venv/bin/python -m pipeline.apps.cli run tiny.toml --date 2026-11-29"
    assert plan.upload == absolute and plan.runtime_env == {} and not plan.ship_package
    shipped = plan_submission(absolute, load_job(absolute, "2026-11-29"), "package", None, tmp_path)
    assert shipped.entrypoint == "python -m pipeline.apps.cli run tiny.toml --date 2026-11-29" and shipped.ship_package
    with pytest.raises(ClusterApiError, match=r"relative path\(s\) input 'out/store'"):
        plan_submission(relative, load_job(relative), "package", None, tmp_path)


def test_the_submit_table_is_checked(tmp_path):
    path = write_job(tmp_path, "/a", "/b", extra='[submit]\nruntime = "docker"\n')
    with pytest.raises(JobFileError, match=r"\[submit\]: runtime is one of local, image, package, got 'docker'"):
        load_job(path)
    path = write_job(tmp_path, "/a", "/b", extra='[submit]\nruntime = "image"\npython = "/usr/bin/python3"\n')
    job = load_job(path)
    assert (job.runtime, job.python) == ("image", "/usr/bin/python3")


# --- on a real local cluster ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
@starts("cluster")
def head():
    """The head and its two worker nodes, for every test below; the node-failure tests come after the others, and
    `stop` last."""
    cluster = start_cluster(head_cpus=0, workers=2)
    yield cluster
    stop_cluster(cluster)


def pexec(
    *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    """pexec as a user runs it from a plain shell: no virtualenv on PATH, no Ray variables."""
    plain = {"HOME": os.environ.get("HOME", "/tmp"), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), **(env or {})}
    return subprocess.run(
        [str(BIN / "pexec"), *args], cwd=cwd, env=plain, capture_output=True, text=True, timeout=timeout
    )


def test_every_service_of_the_local_head_listens_on_loopback_only(head):
    # The client server is a process of its own that may still be starting after `ray start` returns.
    client = f"127.0.0.1:{head.client_port}"
    wait_for(lambda: any(s[2] == client for s in listening(head.pids())), 60, "the Ray client server to listen")
    pids = head.pids()
    assert len(pids) >= 5, "the head's processes were not found"
    sockets = listening(pids)
    assert len(sockets) >= 5, sockets  # GCS, raylet, dashboard, client server, agents
    exposed = [s for s in sockets if not ipaddress.ip_address(s[2].rsplit(":", 1)[0]).is_loopback]
    assert exposed == [], exposed
    assert any(s[2] == f"127.0.0.1:{head.gcs_port}" for s in sockets)
    assert any(s[2] == client for s in sockets)


def test_a_job_submitted_from_a_plain_shell_writes_where_the_submitter_looks(head, tmp_path):
    job = write_job(tmp_path / "jobs", "out/store", "out/run")
    # An address without a scheme, from the environment; relative paths; --wait returns the job's outcome.
    done = pexec("submit", "jobs/tiny.toml", "--date", "2026-11-29", "--wait", cwd=tmp_path,
                 env={"RAY_API_SERVER_ADDRESS": head.address.removeprefix("http://")})  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "job SUCCEEDED" in done.stderr and "model-a" in done.stdout  # the driver log, followed
    submission = done.stdout.splitlines()[0].strip()
    assert job.exists() and read_manifest(str(tmp_path / "out/run/date=2026-11-29")).counts.scored == 300
    status = pexec("status", submission, "--address", head.address, cwd=tmp_path)
    assert status.stdout.strip() == "SUCCEEDED"
    listed = pexec("jobs", "--address", head.address, cwd=tmp_path)
    assert submission in listed.stdout and "SUCCEEDED" in listed.stdout
    logs = pexec("logs", submission, "--address", head.address, cwd=tmp_path)
    assert "job tiny (2026-11-29): out/store -> out/run/date=2026-11-29" in logs.stdout


def test_wait_exits_with_the_jobs_failure_and_stop_stops_a_job(head, tmp_path):
    failing = write_job(tmp_path / "a", str(tmp_path / "missing"), str(tmp_path / "run"))
    failing.write_text(failing.read_text().split("[synth]")[0])  # no [synth]: the input stays missing
    done = pexec("submit", str(failing), "--address", head.address, "--wait", cwd=tmp_path)
    assert done.returncode == 1 and "job FAILED" in done.stderr and "no such store" in done.stdout
    long = write_job(tmp_path / "b", str(tmp_path / "big"), str(tmp_path / "big-run"), rollouts=40_000)
    submitted = pexec("submit", str(long), "--address", head.address, cwd=tmp_path)
    assert submitted.returncode == 0, submitted.stderr
    stopped = pexec("stop", submitted.stdout.strip(), "--address", head.address, cwd=tmp_path)
    assert stopped.stdout.strip() == "STOPPED", stopped.stdout + stopped.stderr


def test_a_running_job_is_never_submitted_twice_and_a_terminated_wait_stops_it(head, tmp_path):
    # What a retried CronJob pod does: submit the same job and date again, then be killed at its deadline.
    job = write_job(tmp_path / "a", str(tmp_path / "big"), str(tmp_path / "big-run"), rollouts=40_000)
    args = ("submit", str(job), "--date", "2026-11-29", "--address", head.address)
    first = pexec(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    submission = first.stdout.strip()
    again = pexec(*args, cwd=tmp_path)
    assert again.returncode == 2 and len(again.stderr.splitlines()) == 1, again.stderr
    assert "job tiny (2026-11-29) is already " in again.stderr and f"as {submission}:" in again.stderr
    env = {"HOME": os.environ.get("HOME", "/tmp"), "PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)}
    waiting = subprocess.Popen([str(BIN / "pexec"), *args, "--wait"], cwd=tmp_path, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    try:
        assert waiting.stdout.readline().strip() == submission  # it follows the running job
        waiting.send_signal(signal.SIGTERM)
        err = waiting.communicate(timeout=60)[1]
    finally:
        waiting.kill()
    assert waiting.returncode == 128 + signal.SIGTERM and f"stopping {submission}" in err, err
    wait_for(lambda: job_status(head.address, submission) == "STOPPED", 60, "the job to be stopped")


def test_a_bad_address_fails_at_once_on_one_line(tmp_path):
    for args, message in [
        (["status", "x", "--address", "ray://head:10001"], "the Jobs API address is the Ray dashboard's"),
        (["jobs"], "no Jobs API address"),
        (["logs", "x", "--address", "127.0.0.1:9"], "cannot get the logs of x from http://127.0.0.1:9: Connection"),
    ]:
        done = pexec(*args, cwd=tmp_path, timeout=30)
        assert done.returncode == 2 and message in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr


def test_a_package_job_runs_the_submitters_pexec_not_the_clusters(head, tmp_path):
    # The submitter's checkout: another version, and a scoring source the cluster's pexec (this checkout, on
    # the head's PYTHONPATH) does not have, which leaves a mark from each process that imports it; so the
    # run's code version says whose pexec the driver ran, and the marks whose pexec the Ray workers ran.
    checkout = copy_sources(ROOT, tmp_path / "checkout")
    pyproject = checkout / "pyproject.toml"
    pyproject.write_text(pyproject.read_text().replace('version = "0.1.0"', 'version = "0.1.0.post7"', 1))
    marks = tmp_path / "marks"
    marks.mkdir()
    mark = f"open(f'{marks}/{{_os.getpid()}}-{{_os.path.basename(_sys.argv[0])}}', 'w')"  # PID-PROGRAM
    with (checkout / "pipeline" / "scoring" / "shard.py").open("a") as f:
        f.write(f"import os as _os, sys as _sys\n{mark}\n")
    theirs = subprocess.run(
        [sys.executable, "-c", "from pipeline.scoring._code_version import code_version; print(code_version())"],
        cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(checkout)}, capture_output=True, text=True,
    ).stdout.strip().split("+")[1]  # fmt: skip
    assert theirs != code_version().split("+")[1]
    job = write_job(tmp_path / "jobs", str(tmp_path / "store"), str(tmp_path / "run"))
    done = pexec("submit", str(job), "--date", "2026-11-29", "--address", head.address, "--runtime", "package",
                 "--python", sys.executable, "--wait", cwd=tmp_path, env={"PYTHONPATH": str(checkout)})  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    manifest = read_manifest(str(tmp_path / "run/date=2026-11-29"))
    assert manifest.code_version == f"0.1.0.post7+{theirs}" and manifest.counts.scored == 300
    importers = {name.split("-", 1)[1] for name in os.listdir(marks)}
    assert {"-m", "default_worker.py"} <= importers, importers  # the job's driver (python -m), and Ray workers


@pytest.mark.parametrize("runtime", ["image", "package"])
def test_a_submitted_job_uploads_only_its_job_file_and_the_package(head, tmp_path, runtime):
    folder = tmp_path / "jobs"
    job = write_job(folder, str(tmp_path / "store"), str(tmp_path / "run"))
    decoys = {
        ".env": "AWS_SECRET_ACCESS_KEY=decoy-env",
        "credentials": "[default]\naws_secret_access_key=decoy-ini",
        ".aws/credentials": "decoy-aws",
        "data/rollouts.jsonl": "decoy-data",
        ".git/config": "decoy-git",
    }
    for name, text in decoys.items():
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(text)
    before = set(Path(head.tmp).rglob("*"))
    done = pexec("submit", str(job), "--address", head.address, "--runtime", runtime, "--python", sys.executable,
                 "--wait", cwd=folder)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    shipped = [p for p in set(Path(head.tmp).rglob("*")) - before if p.is_file() and "runtime_resources" in p.parts]
    assert [p.name for p in shipped if p.name == "tiny.toml"], "the job file was not found on the cluster"
    # py_modules_files/_ray_pkg_<hash>/<the folder shipped>/...
    packaged = {p.parts[p.parts.index("py_modules_files") + 2] for p in shipped
                if "py_modules_files" in p.parts and len(p.parts) > p.parts.index("py_modules_files") + 3}  # fmt: skip
    assert packaged == ({"pipeline", "pexec-0.1.0.dist-info"} if runtime == "package" else set()), shipped
    for path in shipped:
        text = path.read_bytes()
        assert not any(d.encode() in text for d in decoys.values()), path
    assert not [p for p in shipped if p.name in {".env", "credentials", "config", "rollouts.jsonl"}]


# --- nodes and drivers killed mid-job (1000 rollouts, 0.1 MiB shards) ----------------------------------------


TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")


@pytest.fixture(scope="module")
def store_and_reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    root = tmp_path_factory.mktemp("multinode")
    write_store(synthesize("shop", 1000, 100, seed=11), str(root / "store"), per_file=250)
    reference = str(root / "reference")
    run_scoring(str(root / "store"), reference, ScoreSettings(inline=True), run_id="r")
    return root / "store", reference


def submit(cluster, store: Path, run: Path) -> str:
    path = run.parent / f"{run.name}.toml"
    path.write_text(f'name = "{run.name}"\ninput = "{store}"\noutput = "{run}"\nshard_mb = 0.1\n'
                    '[metrics]\nbootstrap = 50\n')  # fmt: skip
    return submit_job(path, load_job(path), cluster.address, "local")


def finish(cluster, submission: str) -> str:
    wait_for(lambda: job_status(cluster.address, submission) in TERMINAL, 300, f"job {submission}")
    return job_status(cluster.address, submission)


def test_a_worker_node_killed_mid_job_changes_nothing(head, store_and_reference, tmp_path):
    store, reference = store_and_reference
    run = tmp_path / "run"
    started = time.monotonic()
    submission = submit(head, store, run)
    wait_for(lambda: len(read_shard_markers(str(run))) >= 1, 180, "a first shard")
    worker_session = head.sessions()[1]  # the first worker node (sessions: head, worker, worker)
    named = [p for p in head.pids() if os.getsid(p) == worker_session and _name(p) == "raylet"]
    # A raylet forking a worker has a child named "raylet" until it execs: the node's raylet is not a raylet's child.
    raylets = [p for p in named if _parent(p) not in named]
    assert len(raylets) == 1, named
    os.kill(raylets[0], signal.SIGKILL)
    state = finish(head, submission)
    assert state == "SUCCEEDED", job_logs(head.address, submission)
    print(f"worker node killed: job done in {time.monotonic() - started:.0f}s")
    assert read_manifest(str(run)).counts.scored == 1000
    for table in ("steps", "rollouts"):
        assert rows(str(run), table) == rows(reference, table)


def test_a_driver_killed_mid_job_then_resubmitted_gives_the_same_tables(head, store_and_reference, tmp_path):
    from ray.job_submission import JobSubmissionClient

    store, reference = store_and_reference
    run = tmp_path / "run"
    submission = submit(head, store, run)
    wait_for(lambda: len(read_shard_markers(str(run))) >= 2, 180, "two shards")
    driver = JobSubmissionClient(head.address).get_job_info(submission).driver_info.pid
    os.kill(int(driver), signal.SIGKILL)
    assert finish(head, submission) == "FAILED"
    committed = len(read_shard_markers(str(run)))
    assert read_manifest(str(run)) is None, "a killed run must not look complete"
    started = time.monotonic()
    again = submit(head, store, run)
    assert finish(head, again) == "SUCCEEDED", job_logs(head.address, again)
    print(f"driver killed after {committed} shard(s): rerun done in {time.monotonic() - started:.0f}s")
    assert read_manifest(str(run)).counts.shards_reused >= min(committed, 2)
    for table in ("steps", "rollouts"):
        assert rows(str(run), table) == rows(reference, table)


def _parent(pid: int) -> int | None:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


def test_stop_ends_exactly_what_start_launched(head):
    # A process that a name pattern (`pkill -f PEXEC_RAY_TMP`, `ray stop`) would have taken for Ray.
    bystander = subprocess.Popen(["bash", "-c", f"exec -a 'ray::IDLE {head.tmp}' sleep 120"], start_new_session=True)
    try:
        sessions = head.sessions()
        assert sessions and head.pids()
        head.script("stop")
        assert session_pids(set(sessions)) == []
        assert bystander.poll() is None, "stop killed a process it did not start"
    finally:
        bystander.kill()
        bystander.wait()
