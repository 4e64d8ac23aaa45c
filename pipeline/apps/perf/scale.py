"""Scale-out benchmark: a synthetic store in a local S3-compatible server (moto, started by
infra/local/s3-server.sh), scored end to end through local Ray with 1 and with 2 worker CPUs; and the
driver's peak memory with few and with many shards.

Each scoring run is a separate driver process; its peak memory is read from /proc (VmHWM, which starts
afresh at exec, unlike ru_maxrss that keeps the forking parent's high-water mark), and so are its CPU-seconds and
those of its children, Ray's processes included, read before it exits.
Run: `pexec bench scale [--rollouts N]` or `python -m pipeline.apps.perf.scale`.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from typing import Literal, TypedDict

import msgspec
import s3fs

from pipeline.apps.perf import cluster_projection
from pipeline.apps.perf._processes import COUNTED_BY, counted_by, cpu_seconds, moto_server
from pipeline.apps.perf.figures import Bench, figure, load_average, n_runs, show
from pipeline.scoring.driver import run_scoring
from pipeline.scoring.memory import peak_mib
from pipeline.scoring.settings import ScoreSettings
from pipeline.storage.stores import write_store
from pipeline.synthetic.rollouts import synthesize

SETUPS = (("1 cpu", 1, 16), ("2 cpu", 2, 16), ("2 cpu, 4x more shards", 2, 4))  # label, worker CPUs, shard MiB
_DRIVER = (
    "import sys, json\n"
    "from pipeline.scoring.driver import run_scoring\n"
    "from pipeline.scoring.settings import ScoreSettings\n"
    "from pipeline.apps.perf._processes import counting\nfrom pipeline.scoring.memory import peak_mib\n"
    "import msgspec\n"
    "with counting() as cpu:\n"
    "    m = run_scoring(sys.argv[1], sys.argv[2], ScoreSettings(num_cpus=int(sys.argv[3]),\n"
    "                    shard_mb=float(sys.argv[4]), storage_options={'endpoint_url': sys.argv[5]}, force=True,\n"
    "                    address=sys.argv[6] or None))\n"
    "    used = cpu()\n"
    "print(json.dumps({'counts': msgspec.to_builtins(m.counts), 'peak_mib': peak_mib(), 'cpu_s': used}))\n"
)


class ScaleRun(TypedDict):
    """One scoring by a separate driver process."""

    seconds: float
    shards: int
    rollouts_per_s: float
    steps_per_s: float
    steps_per_rollout: float
    driver_peak_mib: float
    cpu_s: float  # the driver process and every process it started, Ray's included (`counting`)


class _DriverReport(TypedDict):
    """What the driver process prints (_DRIVER): the manifest's counts, its peak RSS."""

    counts: dict[str, int]
    peak_mib: float
    cpu_s: float


def bench_scale(
    n_rollouts: int = 1_000_000,
    n_tasks: int = 100_000,
    port: int = 5557,
    repeats: int = 1,
    address: str = "",
    in_process: bool = False,
) -> Bench:
    """`address`: the drivers score on this running Ray instead of starting one each; `in_process`: this process
    is the driver, on the Ray it is connected to (both for tests: the code paths only; the CPU limits, the
    start-up and the driver's own peak memory are then not measured)."""
    load = os.getloadavg()[0]
    with moto_server(port, "`pexec bench scale`") as endpoint:
        s3fs.S3FileSystem(endpoint_url=endpoint).mkdir("bench")
        store = "s3://bench/store"
        write_store(
            synthesize("shop", n_rollouts, n_tasks, seed=0),
            store,
            per_file=20_000,
            storage_options={"endpoint_url": endpoint},
        )
        runs: dict[str, list[ScaleRun]] = {label: [] for label, *_ in SETUPS}
        for _ in range(repeats):
            for label, cpus, shard_mb in SETUPS:
                run = f"s3://bench/run-{cpus}-{shard_mb}"
                runs[label].append(_score(store, run, cpus, shard_mb, endpoint, address, in_process))
    one, two, more = (runs[label] for label, *_ in SETUPS)

    def of(rows: list[ScaleRun], key: Literal["rollouts_per_s", "driver_peak_mib", "cpu_s"]) -> list[float]:
        return [r[key] for r in rows]

    figures = [
        figure("2 worker CPUs, all cores", "rollouts/s", of(two, "rollouts_per_s"), "1 worker CPU",
               of(one, "rollouts_per_s"), cpu=of(two, "cpu_s"), baseline_cpu=of(one, "cpu_s")),
        figure("2 worker CPUs, per core", "steps/s", [r["steps_per_s"] / 2 for r in two], "none: see the row above"),
        figure(f"driver peak RSS, {more[0]['shards']} shards (4 MiB)", "MiB", of(more, "driver_peak_mib"),
               f"{two[0]['shards']} shards (16 MiB)", of(two, "driver_peak_mib")),
        figure(f"2 worker CPUs, 4 MiB shards ({more[0]['shards']})", "rollouts/s", of(more, "rollouts_per_s"),
               f"16 MiB shards ({two[0]['shards']})", of(two, "rollouts_per_s"), cpu=of(more, "cpu_s"),
               baseline_cpu=of(two, "cpu_s")),
        cluster_projection([r["steps_per_s"] / 2 for r in two], [r["steps_per_rollout"] for r in two],
                           "scoring from and to S3 (moto, on the same 2 cores) with 2 worker CPUs"),
    ]  # fmt: skip
    caption = (
        f"{n_rollouts:,} synthetic `shop` rollouts in a local S3-compatible server (moto), scored end to end through "
        f"local Ray by a separate driver process each time (Ray start-up included; its CPU-seconds and those of every "
        f"process it started, {COUNTED_BY[counted_by()]}); {n_runs(repeats)}; "
        f"{load_average(load)}"
    )
    return Bench("scale", caption, figures, runs)


def _score(
    store: str, run: str, cpus: int, shard_mb: int, endpoint: str, address: str, in_process: bool = False
) -> ScaleRun:
    t0 = time.perf_counter()
    report: _DriverReport
    if in_process:
        options = {"endpoint_url": endpoint}
        manifest = run_scoring(store, run, ScoreSettings(shard_mb=shard_mb, storage_options=options, force=True))
        report = {"counts": msgspec.to_builtins(manifest.counts), "peak_mib": peak_mib(), "cpu_s": cpu_seconds()}
    else:
        proc = subprocess.run(
            [sys.executable, "-c", _DRIVER, store, run, str(cpus), str(shard_mb), endpoint, address],
            capture_output=True,
            text=True,
            check=True,
        )
        report = json.loads(re.findall(r"^\{.*\}$", proc.stdout, re.M)[-1])
    seconds = time.perf_counter() - t0
    c = report["counts"]
    return {
        "seconds": seconds,
        "shards": c["shards"],
        "rollouts_per_s": c["scored"] / seconds,
        "steps_per_s": c["steps"] / seconds,
        "steps_per_rollout": c["steps"] / c["scored"],
        "driver_peak_mib": report["peak_mib"],
        "cpu_s": report["cpu_s"],
    }


if __name__ == "__main__":
    show(bench_scale(int(sys.argv[1]) if len(sys.argv) > 1 else 1_000_000))
