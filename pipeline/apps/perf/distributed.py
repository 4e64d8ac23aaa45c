"""The driver's memory when the duplicate-id check and the metrics run in Ray tasks (`pexec bench distributed`,
`python -m pipeline.apps.perf.distributed`): flat in the ids and the rollouts, against the single-process ways.

Each measurement runs in a fresh process (a driver of the bench's local Ray with `cpus` CPUs): its peak RSS is its
own.
  - the duplicate-id check over `ids` ids, in shards of `per_shard`, made by Ray tasks (one id in every shard also
    in the shard before it): in hash partitions (pipeline.scoring.id_check), against every id returned to the
    driver and checked there (pipeline.storage.ids.duplicate_ids, the inline executor's way and Ray's before);
  - the poisson-merged metrics of a synthetic run of `rollouts` rollouts (10 per task, parts of 250,000): in Ray
    tasks (pipeline.metrics.partials), against the single-node computation (pipeline.metrics.cohorts).
Both at the given size and a tenth of it: the driver's peak at the larger over the smaller is the figure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Literal, TypedDict

import orjson

from pipeline.apps.perf._processes import local_ray
from pipeline.apps.perf.figures import Bench, figure, load_average, n_runs, show
from pipeline.apps.perf.metrics import write_synthetic_rollouts
from pipeline.core.run_folder import ShardMarker
from pipeline.scoring.memory import peak_mib
from pipeline.scoring.shard import ScoredShard
from pipeline.storage.ids import duplicate_ids, ids_table
from pipeline.storage.shards import InputFile, Shard

PART_ROLLOUTS = 250_000


def synthetic_ids(shard: Shard, n: int) -> ScoredShard:
    """A Ray task's result as scoring returns it: a report and the ids of `n` records, distinct across shards but
    for the first, which the shard before holds too."""
    s = shard.start
    report = ShardMarker(
        shard=shard.key, source=shard.file.url, start=s, stop=shard.stop, fingerprint=shard.file.fingerprint,
        read=n, scored=n,
    )  # fmt: skip
    first = f"r{s - 1:05d}-{n - 1:08d}" if s else f"r{s:05d}-{0:08d}"
    rows = [("line 1", first)] + [(f"line {i + 1}", f"r{s:05d}-{i:08d}") for i in range(1, n)]
    return ScoredShard(report, ids_table(rows))


def _start_ray(address: str) -> None:
    from pipeline.core.ray_start import start_ray

    start_ray(address)  # a driver of its own; in process (tests) the bench's Ray already is: nothing to do


class Measured(TypedDict):
    """One measured driver: its seconds and its peak RSS."""

    seconds: float
    peak_mib: float


def _id_check_here(ids: int, per_shard: int, gathered: bool, address: str) -> Measured:
    import ray

    from pipeline.scoring.id_check import MAX_PARTITIONS, RayIdCheck

    _start_ray(address)
    file = InputFile("bench://ids", "jsonl", None, 0, "0")
    shards = [Shard(file, i, i + 1) for i in range(-(-ids // per_shard))]
    began = time.perf_counter()
    if gathered:
        task = ray.remote(synthetic_ids)
        got = ray.get([task.remote(s, per_shard) for s in shards])
        found = duplicate_ids(shards, {s.key: g.ids for s, g in zip(shards, got, strict=True)})
        del got
    else:
        check = RayIdCheck(shards, min(len(shards), MAX_PARTITIONS))  # synthetic files have no size: as cut
        ray.get([check.submit(synthetic_ids, s, per_shard) for s in shards])
        found = check.duplicates()
    seconds = time.perf_counter() - began
    if len(found) != len(shards) - 1:
        raise AssertionError(f"expected a duplicate in each of {len(shards) - 1} shards, found {len(found)}")
    return {"seconds": seconds, "peak_mib": peak_mib()}


def _metrics_here(run: str, address: str | None, B: int) -> Measured:
    from pipeline.metrics.cohorts import compute_metrics
    from pipeline.metrics.partials import metrics_on_ray
    from pipeline.metrics.run import open_run
    from pipeline.metrics.settings import BootstrapSettings

    settings = BootstrapSettings(B=B, method="poisson-merged")
    if address:
        _start_ray(address)
    began = time.perf_counter()
    snapshot = open_run(run).snapshot
    if address:
        metrics_on_ray(snapshot, address, settings=settings)
    else:
        compute_metrics(snapshot, settings=settings)
    return {"seconds": time.perf_counter() - began, "peak_mib": peak_mib()}


def _fresh(*args: str, in_process: bool = False) -> Measured:
    """Measure in a fresh driver process (`main` with `args`), or in this one (`in_process`: the code paths
    only, for tests; its peak RSS is then this process's)."""
    if in_process:
        given = _parser().parse_args(list(args))
        return _measure(given)
    command = [sys.executable, "-m", "pipeline.apps.perf.distributed", *args]
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    measured: Measured = orjson.loads(out.strip().splitlines()[-1])  # _measure's, from that process
    return measured


def _measure(given: argparse.Namespace) -> Measured:
    """The measurement `main`'s arguments ask for (--ids or --metrics)."""
    if given.ids:
        ids, per_shard = given.ids
        return _id_check_here(ids, per_shard, given.gathered, given.address)
    return _metrics_here(given.metrics, given.address, given.B)


def bench_distributed(
    rollouts: int = 10_000_000,
    ids: int | None = None,
    per_shard: int = 40_000,
    B: int = 1000,
    cpus: int = 2,
    repeats: int = 1,
    workdir: Path | None = None,
    in_process: bool = False,
) -> Bench:
    load = os.getloadavg()[0]
    big_ids = ids or rollouts
    id_sizes = (big_ids // 10, big_ids)
    sizes = (rollouts // 10, rollouts)
    root = Path(workdir or tempfile.mkdtemp(prefix="pexec-bench-distributed-"))
    runs: dict[str, list[Measured]] = {}

    def add(name: str, *args: object) -> None:
        runs.setdefault(name, []).append(_fresh(*(str(a) for a in args), in_process=in_process))

    try:
        for n in sizes:
            run = root / f"run-{n}"
            if not run.exists():
                write_synthetic_rollouts(run, n, max(1, n // 10), parts=max(1, -(-n // PART_ROLLOUTS)))
        # One local Ray for the bench; each measured driver is a fresh process connecting to it.
        with local_ray(cpus) as address:
            for _ in range(repeats):
                for n in id_sizes:
                    add(f"ids ray {n}", "--ids", n, per_shard, "--address", address)
                    add(f"ids gathered {n}", "--ids", n, per_shard, "--gathered", "--address", address)
                for n in sizes:
                    add(f"metrics ray {n}", "--metrics", root / f"run-{n}", "--address", address, "-B", B)
                    add(f"metrics single {n}", "--metrics", root / f"run-{n}", "-B", B)
    finally:
        if workdir is None:
            shutil.rmtree(root, ignore_errors=True)

    def v(name: str, key: Literal["seconds", "peak_mib"]) -> list[float]:
        return [r[key] for r in runs[name]]

    def ratio(name: str, small: int, big: int) -> list[float]:
        return [b / s for s, b in zip(v(f"{name} {small}", "peak_mib"), v(f"{name} {big}", "peak_mib"), strict=True)]

    (i1, i2), (m1, m2) = id_sizes, sizes
    gathered, single = "every id returned to the driver and checked there", "one process (the single-node way)"
    figures = []
    for n in id_sizes:
        figures += [
            figure(f"duplicate-id check, {n:,} ids: driver peak RSS", "MiB", v(f"ids ray {n}", "peak_mib"),
                   gathered, v(f"ids gathered {n}", "peak_mib")),
            figure(f"duplicate-id check, {n:,} ids: seconds (tasks making the ids included)", "s",
                   v(f"ids ray {n}", "seconds"), gathered, v(f"ids gathered {n}", "seconds")),
        ]  # fmt: skip
    figures.append(figure(f"driver peak RSS of the check, {i2:,} over {i1:,} ids (target ≤ 1.1)", "×",
                          ratio("ids ray", i1, i2), gathered, ratio("ids gathered", i1, i2)))  # fmt: skip
    for n in sizes:
        figures += [
            figure(f"poisson-merged metrics, {n:,} rollouts: peak RSS of the process running `pexec metrics`", "MiB",
                   v(f"metrics ray {n}", "peak_mib"), single, v(f"metrics single {n}", "peak_mib")),
            figure(f"poisson-merged metrics, {n:,} rollouts: seconds", "s", v(f"metrics ray {n}", "seconds"),
                   single, v(f"metrics single {n}", "seconds")),
        ]  # fmt: skip
    figures.append(figure(f"driver peak RSS of the metrics, {m2:,} over {m1:,} rollouts", "×",
                          ratio("metrics ray", m1, m2), single, ratio("metrics single", m1, m2)))  # fmt: skip
    caption = (
        f"ids in shards of {per_shard:,} made by Ray tasks; synthetic runs of 10 rollouts per task in parts of "
        f"{PART_ROLLOUTS:,}, B = {B}; each measurement a fresh driver process of one local Ray with {cpus} CPUs; "
        f"{n_runs(repeats)}; {load_average(load)}"
    )
    return Bench("distributed", caption, figures, dict(runs))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=10_000_000)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("-B", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--ids", nargs=2, type=int, metavar=("IDS", "PER_SHARD"), help=argparse.SUPPRESS)
    parser.add_argument("--gathered", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--metrics", metavar="RUN", help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)  # the bench's Ray, for a measured driver
    return parser


def main() -> None:
    args = _parser().parse_args()
    if args.ids or args.metrics:
        print(orjson.dumps(_measure(args)).decode())
    else:
        show(bench_distributed(args.rollouts, B=args.B, cpus=args.cpus, repeats=args.repeats))


if __name__ == "__main__":
    main()
