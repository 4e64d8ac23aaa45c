"""Jobs on a Ray cluster through the Ray Jobs API: `pexec submit`, `status`, `logs`, `stop`, `jobs`.

A submitted job is `pexec run JOB.toml --date D` on the cluster. How it finds pexec there (the job's
`[submit] runtime`, `--runtime`):
- `local`: the cluster is this machine (infra/local/ray-head.sh). The entrypoint is the submitter's own
  interpreter and package, started in the submitter's working directory, so the job's relative paths mean
  what they mean to `pexec run` here. Nothing is uploaded.
- `image`: the cluster's image has pexec installed (infra/Dockerfile); the entrypoint is `PYTHON -m
  pipeline.apps.cli` (`[submit] python`, `--python`; default `python`). The job file alone is uploaded, so its
  input and output must be object-store URLs or absolute paths the cluster shares: a relative one is refused.
- `package`: as `image`, but the cluster lacks pexec (or has another version of it): the submitter's pexec
  is built into a wheel from its source checkout and travels with the job, unpacked, as Ray `py_modules`
  (Ray would `pip install` a .whl with all its dependencies; the unpacked wheel is the package and its
  metadata alone). The cluster's interpreter must have pexec's dependencies (the image without pexec).
The default is `local` for a loopback address, else `image`. Credentials are never uploaded: the cluster's
own environment provides them.
"""

from __future__ import annotations

import ipaddress
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from pipeline.apps.jobs.definition import RUNTIMES, Job, relative_paths
from pipeline.core.errors import AlreadyRunning, ClusterApiError, PexecError

CHECKOUT = Path(__file__).resolve().parents[3]  # the folder that holds the `pipeline` package

ADDRESS_ENV = ("RAY_API_SERVER_ADDRESS", "RAY_ADDRESS")  # the order Ray's own job CLI reads them in
TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
# What the wheel's build reads from the source checkout (pyproject.toml: the package, its data, the readme).
BUILD_INPUTS = ("pyproject.toml", "README.md", "pipeline", "specs")


@dataclass(frozen=True)
class Submission:
    """What the Jobs API is asked to run: the entrypoint and its runtime environment."""

    entrypoint: str
    runtime_env: dict[str, Any]
    upload: Path | None  # the job file sent as the working directory (image and package runtimes)
    ship_package: bool = False  # this pexec travels with the job (package runtime)


def jobs_api_address(address: str | None) -> str:
    """The dashboard URL from --address, else $RAY_API_SERVER_ADDRESS, else $RAY_ADDRESS. `HOST:PORT` gets
    http://; anything else that is not an http(s) URL (a GCS or ray:// address) is refused here, before
    Ray's client would spend its GCS timeout on it."""
    given = address or next((os.environ[name] for name in ADDRESS_ENV if os.environ.get(name)), None)
    if not given:
        raise ClusterApiError("no Jobs API address: give --address http://HEAD:8265 or set RAY_API_SERVER_ADDRESS")
    url = given if "://" in given else f"http://{given}"
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or given == "auto":
        raise ClusterApiError(
            f"the Jobs API address is the Ray dashboard's http(s)://HOST:PORT (http://127.0.0.1:8265); got {given!r}"
        )
    return url.rstrip("/")


def default_runtime(address: str) -> str:
    host = urlsplit(address).hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    return "local" if loopback else "image"


def plan_submission(job_file: Path, job: Job, runtime: str, python: str | None, cwd: Path) -> Submission:
    """The entrypoint and runtime environment of `pexec run` of this job on the cluster (pure)."""
    if runtime not in RUNTIMES:
        raise ClusterApiError(f"runtime is one of {', '.join(RUNTIMES)}, got {runtime!r}")
    args = f"run {{job}} --date {job.date}"
    if runtime == "local":
        interpreter = python or sys.executable
        package_root = CHECKOUT
        command = f"{shlex.quote(interpreter)} -m pipeline.apps.cli " + args.format(
            job=shlex.quote(str(job_file.resolve()))
        )
        return Submission(
            entrypoint=f"cd {shlex.quote(str(cwd))} && {command}",
            runtime_env={"env_vars": {"PYTHONPATH": str(package_root)}},
            upload=None,
        )
    relative = relative_paths(job)
    if relative:
        raise ClusterApiError(
            f"{job_file}: relative path(s) {', '.join(relative)} would land in the cluster's temporary copy of "
            "the job: use an object-store URL (s3://...) or an absolute path the cluster shares"
        )
    command = f"{shlex.quote(python or 'python')} -m pipeline.apps.cli " + args.format(job=shlex.quote(job_file.name))
    return Submission(entrypoint=command, runtime_env={}, upload=job_file, ship_package=runtime == "package")


def submit_job(job_file: Path, job: Job, address: str, runtime: str | None = None, python: str | None = None) -> str:
    """Submit `pexec run` of this job to a Ray cluster; returns the submission id. Refused (AlreadyRunning)
    while the cluster has a job of the same name and date pending or running: never two at once."""
    runtime = runtime or job.runtime or default_runtime(address)
    plan = plan_submission(job_file, job, runtime, python or job.python, Path.cwd())
    if plan.ship_package:
        source_checkout()  # refused before the cluster is asked anything
    for row in list_jobs(address):
        if (row["job"], row["date"]) == (job.name, job.date) and row["state"] not in TERMINAL:
            raise AlreadyRunning(f"{job.name} ({job.date})", address, row["id"], row["state"])
    with tempfile.TemporaryDirectory(prefix="pexec-submit-") as folder:
        runtime_env = dict(plan.runtime_env)
        if plan.upload is not None:  # a folder holding the job file and nothing else
            (Path(folder) / "job").mkdir()
            shutil.copyfile(plan.upload, Path(folder) / "job" / plan.upload.name)
            runtime_env["working_dir"] = str(Path(folder) / "job")
        if plan.ship_package:
            runtime_env["py_modules"] = [str(p) for p in unpacked(build_wheel(Path(folder)), Path(folder) / "package")]
        with _jobs_api(f"submit to {address}"):
            return str(
                _client(address).submit_job(
                    entrypoint=plan.entrypoint,
                    runtime_env=runtime_env,
                    submission_id=f"pexec-{job.name}-{job.date}-{datetime.now(UTC):%H%M%S}",
                    metadata={"job": job.name, "date": job.date, "runtime": runtime},
                )
            )


def build_wheel(folder: Path) -> Path:
    """A wheel of the running pexec, built (pip wheel --no-deps) from a copy of its source checkout in
    `folder`: the build writes build/ and *.egg-info beside its sources, and must not in the checkout."""
    root = source_checkout()
    source = copy_sources(root, folder / "source")
    command = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "-w", str(folder / "dist"), str(source)]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise ClusterApiError(f"cannot build the wheel of pexec from {root}: pip wheel failed: {last}")
    return next((folder / "dist").glob("pexec-*.whl"))


def source_checkout() -> Path:
    """The source checkout the running pexec comes from (its pyproject.toml beside the package)."""
    root = CHECKOUT
    if not (root / "pyproject.toml").is_file():
        raise ClusterApiError(
            f"runtime package builds pexec from its source checkout, and this pexec ({root}) is an installed "
            "copy: submit from a checkout, or use runtime image"
        )
    return root


def copy_sources(root: Path, folder: Path) -> Path:
    """A copy of what the wheel's build reads from the checkout at `root` (no __pycache__)."""
    folder.mkdir(parents=True)
    for name in BUILD_INPUTS:
        if (root / name).is_dir():
            shutil.copytree(root / name, folder / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(root / name, folder / name)
    return folder


def unpacked(wheel: Path, folder: Path) -> list[Path]:
    """The wheel's top-level folders (the package and its .dist-info metadata), unpacked into `folder`: what
    Ray's `py_modules` puts on the job's PYTHONPATH, ahead of any pexec installed on the cluster."""
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(folder)
    return sorted(folder.iterdir())


def job_status(address: str, submission: str) -> str:
    """The state of a submitted job: PENDING, RUNNING, SUCCEEDED, FAILED or STOPPED."""
    with _jobs_api(f"get the status of {submission} from {address}"):
        return str(_client(address).get_job_status(submission))


def job_logs(address: str, submission: str) -> str:
    """The driver log of a submitted job."""
    with _jobs_api(f"get the logs of {submission} from {address}"):
        return str(_client(address).get_job_logs(submission))


def follow_job(address: str, submission: str, write: Callable[[str], object], poll: float = 1.0) -> str:
    """Write the driver log as it grows until the job ends; returns its final state."""
    client = _client_for(address)
    shown = 0
    while True:
        with _jobs_api(f"follow {submission} on {address}"):
            state = str(client.get_job_status(submission))
            text = client.get_job_logs(submission)  # read after the state: complete once the state is final
        write(text[shown:])
        shown = len(text)
        if state in TERMINAL:
            return state
        time.sleep(poll)


def stop_job(address: str, submission: str, timeout: float = 60.0) -> str:
    """Ask the cluster to stop a job and wait (up to `timeout` seconds) for it to end; returns its state."""
    client = _client_for(address)
    with _jobs_api(f"stop {submission} on {address}"):
        client.stop_job(submission)
    deadline = time.monotonic() + timeout
    while True:
        with _jobs_api(f"get the status of {submission} from {address}"):
            state = str(client.get_job_status(submission))
        if state in TERMINAL or time.monotonic() > deadline:
            return state
        time.sleep(0.5)


def list_jobs(address: str) -> list[dict[str, Any]]:
    """Every job the cluster knows, oldest first: id, state, job name and date, start and end (UTC)."""
    with _jobs_api(f"list the jobs of {address}"):
        jobs = _client(address).list_jobs()
    rows = []
    for j in sorted(jobs, key=lambda j: j.start_time or 0):
        meta = j.metadata or {}
        rows.append({
            "id": j.submission_id or j.job_id,
            "state": str(j.status),
            "job": meta.get("job", ""),
            "date": meta.get("date", ""),
            "start": _utc(j.start_time),
            "end": _utc(j.end_time),
        })  # fmt: skip
    return rows


def _utc(ms: int | None) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S") if ms else ""


def _client_for(address: str) -> Any:
    with _jobs_api(f"reach the Jobs API at {address}"):
        return _client(address)


def _client(address: str) -> Any:
    from ray.job_submission import JobSubmissionClient

    # Ray's client lets these variables override its argument; `address` was already resolved from them,
    # with --address first.
    saved = {name: os.environ.pop(name) for name in ADDRESS_ENV if name in os.environ}
    try:
        return JobSubmissionClient(address)  # connects (and checks the server's version) here
    finally:
        os.environ.update(saved)


@contextmanager
def _jobs_api(action: str) -> Iterator[None]:
    try:
        yield
    except PexecError:
        raise
    except Exception as exc:  # the client's errors: connection, authentication, unknown id, upload
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ClusterApiError(f"cannot {action}: {type(exc).__name__}: {first}") from exc
