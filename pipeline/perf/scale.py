"""Scale-out benchmark: a synthetic store in a local S3-compatible server (moto, started by
infra/local/s3-server.sh), scored end to end through local Ray with 1 and with 2 worker CPUs; and the
driver's peak memory with few and with many shards.

Each scoring run is a separate driver process; its peak memory is read from /proc (VmHWM, which starts
afresh at exec, unlike ru_maxrss that keeps the forking parent's high-water mark).
Run: `pexec bench scale [--rollouts N]` or `python -m pipeline.perf.scale`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import s3fs

from pipeline.perf import require_dev
from pipeline.storage.stores import write_store
from pipeline.synth import synthesize

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
_DRIVER = (
    "import re, sys, json\n"
    "from pipeline.distributed import run_scoring\n"
    "m = run_scoring(sys.argv[1], sys.argv[2], num_cpus=int(sys.argv[3]), shard_bytes=int(sys.argv[4]),\n"
    "                storage_options={'endpoint_url': sys.argv[5]}, force=True)\n"
    "peak = int(re.search(r'VmHWM:\\s+(\\d+)', open('/proc/self/status').read()).group(1)) / 1024\n"
    "print(json.dumps({'counts': m['counts'], 'peak_mib': peak}))\n"
)


def bench_scale(n_rollouts: int = 1_000_000, n_tasks: int = 100_000, port: int = 5557) -> dict[str, Any]:
    require_dev("moto", "the S3 server of `pexec bench scale` (infra/local/s3-server.sh)")
    os.environ.update(
        {"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench", "AWS_DEFAULT_REGION": "us-east-1"}
    )
    server = subprocess.Popen(
        ["bash", str(ROOT / "infra/local/s3-server.sh"), str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        _wait(port)
        s3fs.S3FileSystem(endpoint_url=endpoint).mkdir("bench")
        store = "s3://bench/store"
        t0 = time.perf_counter()
        write_store(
            synthesize("shop", n_rollouts, n_tasks, seed=0),
            store,
            per_file=20_000,
            storage_options={"endpoint_url": endpoint},
        )
        print(f"synth: {n_rollouts:,} rollouts to {store} in {time.perf_counter() - t0:.0f}s")
        results: dict[str, Any] = {}
        for label, cpus, shard_mb in (("1 cpu", 1, 16), ("2 cpu", 2, 16), ("2 cpu, 4x more shards", 2, 4)):
            results[label] = row = _score(store, f"s3://bench/run-{cpus}-{shard_mb}", cpus, shard_mb, endpoint)
            print(
                f"{label}: {row['shards']} shards, {row['seconds']:.0f}s, {row['rollouts_per_s']:,.0f} rollouts/s, "
                f"{row['steps_per_s']:,.0f} steps/s, driver peak {row['driver_peak_mib']:,.0f} MiB"
            )
        speedup = results["2 cpu"]["rollouts_per_s"] / results["1 cpu"]["rollouts_per_s"]
        results["speedup_1_to_2"] = speedup
        print(f"1 -> 2 CPUs: {speedup:.2f}x (scaling efficiency {speedup / 2:.0%})")
        return results
    finally:
        os.killpg(server.pid, signal.SIGKILL)


def _score(store: str, run: str, cpus: int, shard_mb: int, endpoint: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", _DRIVER, store, run, str(cpus), str(shard_mb * 2**20), endpoint],
        capture_output=True,
        text=True,
        check=True,
    )
    seconds = time.perf_counter() - t0
    report = json.loads(re.findall(r"^\{.*\}$", proc.stdout, re.M)[-1])
    c = report["counts"]
    return {
        "seconds": seconds,
        "shards": c["shards"],
        "rollouts_per_s": c["scored"] / seconds,
        "steps_per_s": c["steps"] / seconds,
        "driver_peak_mib": report["peak_mib"],
    }


def _wait(port: int) -> None:
    for _ in range(150):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"the S3 server on port {port} did not start")


if __name__ == "__main__":
    bench_scale(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000)
