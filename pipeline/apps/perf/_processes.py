"""What benches share about processes: a local S3-compatible server (moto, infra/local/s3-server.sh) for the
duration of a measurement, and a process's own peak memory.

A peak is read from /proc (VmHWM), which a new program starts afresh at exec; ru_maxrss is not used for a
measured process, as a forked child keeps the high-water mark of the process that started it.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from pipeline.apps.perf import require_dev

ROOT = Path(__file__).resolve().parents[3]
BENCH_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}


def peak_mib(pid: int | str = "self") -> float:
    """The peak RSS of process `pid` (this one by default): its VmHWM in MiB."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line for line in status.splitlines() if line.startswith("VmHWM:")).split()[1]) / 1024


def free_port() -> int:
    """A loopback port nothing listens on now (the server binds it a moment later)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def moto_server(port: int | None = None, needed_by: str = "this bench") -> Iterator[str]:
    """A moto S3 server on loopback for the block's duration: yields its endpoint URL, with bench credentials
    in the environment (inherited by the processes the bench starts); the server's process group is killed on
    the way out, whatever happened."""
    require_dev("moto", f"the S3 server of {needed_by} (infra/local/s3-server.sh)")
    os.environ.update(BENCH_CREDENTIALS)
    port = port or free_port()
    server = subprocess.Popen(["bash", str(ROOT / "infra/local/s3-server.sh"), str(port)], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, start_new_session=True)  # fmt: skip
    try:
        wait_for_port(port)
        yield f"http://127.0.0.1:{port}"
    finally:
        os.killpg(server.pid, signal.SIGKILL)
        server.wait()


def wait_for_port(port: int, seconds: float = 30) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"the S3 server on port {port} did not start within {seconds:g} s")


@contextmanager
def local_ray(cpus: int) -> Iterator[str]:
    """A local Ray of `cpus` CPUs for the block, stopped after it; yields its GCS address (for drivers in other
    processes). A Ray this process already runs (a test's, shared by the smoke runs) is used as it is and left
    running: its CPUs are then its own, not `cpus`, so such a run exercises the code paths and measures nothing."""
    import ray

    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=cpus, include_dashboard=False, logging_level=logging.WARNING)
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        if started:
            ray.shutdown()
