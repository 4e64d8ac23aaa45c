"""Fixtures shared by test modules: a real S3-compatible server (moto, server mode) on loopback, started by
the script developers use (infra/local/s3-server.sh)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import fsspec
import pytest
import s3fs

ROOT = Path(__file__).resolve().parents[1]

# A suite started in the background by a non-interactive shell (`make test &`) inherits Ctrl-C ignored, and so
# would every `pexec` it starts: the tests of what Ctrl-C does need it delivered. A handled signal is back to
# its default in a child at exec, so this reaches them too.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


@contextmanager
def fresh_ray(**options) -> Iterator[None]:
    """A local Ray of 2 CPUs for this block, stopped after it. `run_scoring` keeps the Ray it started (a caller
    may score twice), so one left by an earlier test is stopped first: `ray.init` would refuse to run twice."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.shutdown()
    ray.init(**{"num_cpus": 2, "include_dashboard": False, "logging_level": "WARNING", **options})
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(autouse=True, scope="module")
def _no_ray_across_modules() -> Iterator[None]:
    """No module inherits a Ray from another: the order of test modules then changes nothing."""
    yield
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        ray.shutdown()


@pytest.fixture(scope="module")
def s3() -> Iterator[dict]:
    """A moto S3 server on a free loopback port with the bucket `pexec-test`; yields storage options for pexec."""
    os.environ.update(CREDENTIALS)  # Ray workers started later inherit them
    port = free_port()
    proc = subprocess.Popen(
        ["bash", str(ROOT / "infra/local/s3-server.sh"), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    options = {"endpoint_url": f"http://127.0.0.1:{port}"}
    try:
        wait_for(lambda: _answers(port), 30, "the S3 server")
        s3fs.S3FileSystem(**options).mkdir("pexec-test")
        yield options
    finally:
        os.killpg(proc.pid, signal.SIGKILL)


def _answers(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    except OSError:
        return False


@pytest.fixture
def mem_root() -> Iterator[str]:
    """A fresh folder on fsspec's in-memory filesystem, removed afterwards."""
    root = f"memory://t-{uuid.uuid4().hex}"
    yield root
    fs = fsspec.filesystem("memory")
    if fs.exists(root):
        fs.rm(root, recursive=True)
