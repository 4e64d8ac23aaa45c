"""The scoring driver's completion handling at cluster scale (`pexec bench driver`,
`python -m pipeline.apps.perf.driver`).

Local Ray runs many tiny tasks (each returns one small shard report) with `window` of them in flight, and the
driver retires them with `pipeline.scoring.driver.completed`, beside the loop it replaced (one `ray.wait` over
every pending task per finished shard) in the same run, interleaved. Measured over the steady phase only
(exactly `window` tasks in flight): the driver process's CPU time per retired shard (all its threads: Ray's
own per-task cost included), so the shards per second one driver core can retire; shards retired per second
on the wall clock (bounded here by the local CPUs that run the tasks); and the driver's memory growth.

The need it is set against: 2,048 cores each finishing default-size shards at the per-core rate measured
here by scoring a small synthetic `shop` store in this process (reading and writing included).
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any, Literal, TypedDict

import orjson

from pipeline.apps.perf import CLUSTER_CORES
from pipeline.apps.perf._processes import local_ray
from pipeline.apps.perf.figures import Bench, figure, load_average, n_runs, show
from pipeline.core.arrow import pa
from pipeline.core.errors import ScoringFailed
from pipeline.core.run_folder import ShardMarker
from pipeline.scoring.driver import completed, run_scoring
from pipeline.scoring.settings import DEFAULT_SHARD_BYTES, ScoreSettings
from pipeline.scoring.shard import ScoredShard
from pipeline.storage.ids import duplicate_ids, ids_table
from pipeline.storage.shards import InputFile, Shard
from pipeline.storage.stores import write_store
from pipeline.synthetic.rollouts import synthesize


def finish(shard: Shard, ids: int = 0) -> ScoredShard:
    """The bench's task: no scoring, a report of the size a real one has, with the ids of `ids` records."""
    marker = ShardMarker(
        shard=shard.key, source=shard.file.url, start=shard.start, stop=shard.stop, fingerprint=shard.file.fingerprint,
        read=1, scored=1,
    )  # fmt: skip
    return ScoredShard(marker, _ids(ids))


@functools.cache
def _ids(n: int, shard: int = 0) -> pa.Table:
    """The ids a shard of `n` rollouts returns, distinct across `shard`s; built once per process, so a bench task
    stays tiny while the driver still receives them."""
    return ids_table((f"line {i + 1}", f"shop-{shard:05d}-{i:08d}") for i in range(n))


def one_wait_per_shard(
    shards: Iterable[Shard], submit: Callable[[Shard], Any], window: int, still_held: Callable[[], None]
) -> Iterator[tuple[Shard, Any]]:
    """The baseline: the driver loop as it first was — `ray.wait` over every pending task for each finished shard."""
    import ray

    queue = list(shards)
    pending: dict[Any, Shard] = {}
    while queue or pending:
        while queue and len(pending) < window:
            shard = queue.pop(0)
            pending[submit(shard)] = shard
        done, _ = ray.wait(list(pending), num_returns=1)
        still_held()
        for ref in done:
            shard = pending.pop(ref)
            try:
                yield shard, ray.get(ref)
            except Exception as exc:
                raise ScoringFailed(str(exc)) from exc


def _rss_mib() -> float:
    found = re.search(r"VmRSS:\s+(\d+)", Path("/proc/self/status").read_text())
    if found is None:
        raise RuntimeError("/proc/self/status has no VmRSS line")
    return int(found.group(1)) / 1024


class Retired(TypedDict):
    """The steady phase of one loop: driver CPU per shard, shards per second of it and of the wall clock, and the
    driver's memory growth."""

    cpu_us_per_shard: float
    driver_capacity: float
    retired_per_s: float
    rss_mib_per_10k: float


RetiredKey = Literal["cpu_us_per_shard", "driver_capacity", "retired_per_s", "rss_mib_per_10k"]


class IdCheck(TypedDict):
    """The duplicate-id check of a run's end, per id: time, the ids held until it, and Arrow's peak."""

    ns_per_id: float
    held_b_per_id: float
    peak_b_per_id: float


def retire(loop: Callable[..., Iterator[tuple[Shard, Any]]], window: int, steady: int, ids: int) -> Retired:
    """Run `steady + window` tiny tasks through `loop`, each returning the ids of `ids` records; measure the
    `steady` retirements made while exactly `window` tasks were in flight."""
    import ray

    task = ray.remote(finish)
    file = InputFile("bench://driver", "jsonl", None, 0, "0")
    shards = (Shard(file, i, i + 1) for i in range(steady + window))
    began = cpu = rss = 0.0

    def submit(shard: Shard) -> Any:
        # Ray's stubs take `finish`, whose `ids` has a default, for a function of one argument.
        return task.remote(shard, ids)  # type: ignore[call-arg]

    for n, _ in enumerate(loop(shards, submit, window, lambda: None), 1):
        if n == 1:  # the window is full: the steady phase starts
            began, cpu = time.perf_counter(), time.process_time()
        elif n == steady // 2 + 1:  # memory from half-way on, once Ray's own buffers have grown
            rss = _rss_mib()
        elif n == steady + 1:
            seconds, cpu_s = time.perf_counter() - began, time.process_time() - cpu
            grown = _rss_mib() - rss
    return {
        "cpu_us_per_shard": cpu_s / steady * 1e6,
        "driver_capacity": steady / cpu_s,
        "retired_per_s": steady / seconds,
        "rss_mib_per_10k": grown / (steady - steady // 2) * 10_000,
    }


def id_check(ids: int, per_shard: int) -> IdCheck:
    """The driver's duplicate-id check at the end of a run (`pipeline.storage.ids.duplicate_ids`) over `ids`
    distinct ids returned by shards of `per_shard` rollouts: time per id, and Arrow memory per id, held until the
    check and at its peak (measured in a fresh process, whose Arrow high-water mark is then the check's)."""
    out = subprocess.run([sys.executable, "-m", "pipeline.apps.perf.driver", "--id-check", str(ids), str(per_shard)],
                         capture_output=True, text=True, check=True).stdout  # fmt: skip
    measured: IdCheck = orjson.loads(out)  # _id_check_here's, from that process
    return measured


def _id_check_here(ids: int, per_shard: int) -> IdCheck:
    file = InputFile("bench://ids", "jsonl", None, 0, "0")
    shards = [Shard(file, i, i + 1) for i in range(-(-ids // per_shard))]
    tables = {s.key: _ids(per_shard, i) for i, s in enumerate(shards)}
    n = len(shards) * per_shard
    began = time.perf_counter()
    if duplicate_ids(shards, tables):
        raise AssertionError("the bench's ids are distinct")
    seconds = time.perf_counter() - began
    return {
        "ns_per_id": seconds / n * 1e9,
        "held_b_per_id": sum(t.nbytes for t in tables.values()) / n,
        "peak_b_per_id": pa.default_memory_pool().max_memory() / n,
    }


def _store(rollouts: int, root: Path) -> tuple[Path, int]:
    """A synthetic `shop` store of `rollouts` (written once under `root`) and its size in bytes."""
    store = root / "store"
    if not store.exists():
        write_store(synthesize("shop", rollouts, max(1, rollouts // 10), seed=0), str(store), per_file=rollouts)
    return store, sum(f.stat().st_size for f in store.iterdir())


def per_core_shard_rate(rollouts: int, root: Path) -> float:
    """Default-size shards finished per second by one core, from scoring `rollouts` synthetic `shop` rollouts in
    this process: the shards' own time (read, replay, write), not the job's (planning, the lease)."""
    store, size = _store(rollouts, root)
    run = root / "run"
    shutil.rmtree(run, ignore_errors=True)
    manifest = run_scoring(str(store), str(run), ScoreSettings(inline=True, force=True))
    return size / sum(s.seconds for s in manifest.shards) / DEFAULT_SHARD_BYTES


def bench_driver(
    windows: tuple[int, ...] = (256, 4096),
    steady: int = 8192,
    repeats: int = 3,
    cpus: int = 2,
    rollouts: int = 4000,
    cores: int = CLUSTER_CORES,
    distinct_ids: int = 2_000_000,  # in the measurement of the duplicate-id check
) -> Bench:
    root = Path(tempfile.mkdtemp(prefix="pexec-bench-driver-"))
    load = os.getloadavg()[0]
    loops = {"batched": completed, "one wait per shard": one_wait_per_shard}
    runs: dict[tuple[str, int], list[Retired]] = {}
    need: list[float] = []
    checks: list[IdCheck] = []
    try:
        ids = round(rollouts * DEFAULT_SHARD_BYTES / _store(rollouts, root)[1])  # rollouts in a default-size shard
        with local_ray(cpus):
            retire(completed, 64, 256, ids)  # warm-up: the workers start
            for _ in range(repeats):
                for window, (name, loop) in itertools.product(windows, loops.items()):
                    runs.setdefault((name, window), []).append(retire(loop, window, steady, ids))
                need.append(cores * per_core_shard_rate(rollouts, root))
                checks.append(id_check(distinct_ids, ids))
    finally:
        shutil.rmtree(root, ignore_errors=True)

    def values(name: str, window: int, key: RetiredKey) -> list[float]:
        return [r[key] for r in runs[(name, window)]]

    baseline = "one `ray.wait` over all pending per shard"
    figures = []
    for window in windows:
        figures += [
            figure(f"driver CPU per retired shard, {window:,} in flight", "µs",
                   values("batched", window, "cpu_us_per_shard"), baseline,
                   values("one wait per shard", window, "cpu_us_per_shard")),
            figure(f"shards retired per second of driver CPU, {window:,} in flight", "shards/s",
                   values("batched", window, "driver_capacity"), baseline,
                   values("one wait per shard", window, "driver_capacity")),
            figure(f"shards retired per second (wall, {cpus} local CPUs run the tasks), {window:,} in flight",
                   "shards/s", values("batched", window, "retired_per_s"), baseline,
                   values("one wait per shard", window, "retired_per_s")),
            figure(f"driver memory growth per 10,000 shards (second half), {window:,} in flight", "MiB",
                   values("batched", window, "rss_mib_per_10k"), baseline,
                   values("one wait per shard", window, "rss_mib_per_10k")),
        ]  # fmt: skip
    top = max(windows)
    figures += [
        figure(f"need: shards/s finished by {cores:,} cores, {DEFAULT_SHARD_BYTES >> 20} MiB shards", "shards/s",
               need, f"none: {cores:,} × the per-core rate of scoring {rollouts:,} `shop` rollouts here"),
        figure(f"driver capacity ({top:,} in flight) against that need", "shards/s",
               values("batched", top, "driver_capacity"), f"the need of {cores:,} cores", need),
    ]  # fmt: skip
    per_id = f"{distinct_ids:,} distinct ids, in shards of {ids:,}"
    figures += [
        figure(f"duplicate-id check at the end of a run, {per_id}", "ns per id", [c["ns_per_id"] for c in checks],
               "none: no pass over the store before scoring any more (pipeline.storage.ids)"),
        figure("ids the driver holds until that check (Arrow)", "bytes per id",
               [c["held_b_per_id"] for c in checks], "none: memory"),
        figure("Arrow memory at the check's peak, those ids included", "bytes per id",
               [c["peak_b_per_id"] for c in checks], "none: memory"),
    ]  # fmt: skip
    caption = (
        f"{steady:,} tiny tasks retired per run with the window full, each returning the ids of {ids:,} rollouts (a "
        f"{DEFAULT_SHARD_BYTES >> 20} MiB shard of `shop`), {n_runs(repeats)} interleaved, local Ray with {cpus} CPUs, "
        f"{load_average(load)}"
    )
    details: dict[str, object] = {f"{name} {window}": rows for (name, window), rows in runs.items()}
    details["need"] = need
    details["id check"] = checks
    return Bench("driver", caption, figures, details)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--windows", default="256,4096", help="tasks in flight, comma-separated")
    parser.add_argument("--steady", type=int, default=8192, help="shards retired per run with the window full")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--id-check", nargs=2, type=int, metavar=("IDS", "PER_SHARD"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.id_check:
        print(orjson.dumps(_id_check_here(*args.id_check)).decode())
        return
    windows = tuple(int(w) for w in args.windows.split(","))
    show(bench_driver(windows, args.steady, args.repeats, args.cpus))


if __name__ == "__main__":
    main()
