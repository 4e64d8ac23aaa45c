"""When the raylet of the driver's own machine dies, the driver's waits end with one line (RayNodeLost) instead of
lasting for ever: the duplicate-id check after every shard's ids were kept, and the scoring loop with a task in
flight. Each in a process of its own with its own local Ray (the raylet is killed), the GCS's health checks made
fast so that it declares the node dead within seconds."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_KILLED = """
import os, signal, sys, time
from pathlib import Path
import psutil, ray
from pipeline.core import ray_waits
from pipeline.core.errors import RayNodeLost, ScoringFailed
from pipeline.core.ray_start import start_ray
from pipeline.scoring.driver import completed
from pipeline.scoring.id_check import RayIdCheck
from pipeline.storage.ids import shard_ids
from pipeline.storage.inputs import list_inputs, plan_shards

ray_waits.CHECK_S = 0.5
store = Path(sys.argv[1])
(store / "a.jsonl").write_text("".join(f'{{"rollout_id": "r{i % 7}"}}\\n' for i in range(40)))
start_ray(None, 1)
files, _ = list_inputs(str(store))
shards = plan_shards(files, 200)
check = RayIdCheck(shards, 2)
check.read(shard_ids, shards, None)
ray.get(check.reads)
in_flight = ray.remote(lambda: time.sleep(3600)).remote()
raylet = next(p for p in psutil.Process().children(recursive=True) if p.name() == "raylet")
os.kill(raylet.pid, signal.SIGKILL)
for name, waits in (
    ("id check", lambda: check.duplicates()),
    ("scoring loop", lambda: next(completed(shards[:1], lambda s: in_flight, 2, lambda: None, poll_s=0.2))),
):
    started = time.monotonic()
    try:
        waits()
        print(name, "returned")
    except ScoringFailed as exc:
        print(name, type(exc).__name__, exc, f"after {time.monotonic() - started:.1f} s", flush=True)
os._exit(0)  # Ray's own shutdown, at exit, waits on the dead raylet
"""


@pytest.mark.ray
def test_the_driver_stops_waiting_once_its_node_is_dead(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    # The GCS checks each node every 0.5 s and gives up after 3 misses (by default about 17 s).
    env |= {"RAY_health_check_period_ms": "500", "RAY_health_check_failure_threshold": "3"}
    env |= {"RAY_health_check_initial_delay_ms": "0", "RAY_health_check_timeout_ms": "500"}
    done = subprocess.run(
        [sys.executable, "-c", _KILLED, str(tmp_path)], env=env, capture_output=True, text=True, timeout=150
    )
    # Ray forwards its own log lines to this stdout as they come, and one may end without a newline just before a
    # line of the script: each line is found where it starts, not only at the start of a line.
    lines = re.findall(r"(id check|scoring loop) (RayNodeLost [^\n]*)", done.stdout)
    said = "RayNodeLost Ray's node on this machine ("
    assert [name for name, _ in lines] == ["id check", "scoring loop"], done.stdout + done.stderr[-3000:]
    assert all(line.startswith(said) for _, line in lines), lines
    assert all("died while pexec waited on it" in line and "was committed after" in line for _, line in lines), lines
