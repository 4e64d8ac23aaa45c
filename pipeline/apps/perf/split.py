"""One large gzip file scored split by its decompressed bytes (`pexec bench split`, `python -m
pipeline.apps.perf.split`).

The nightly bench's OpenAI conversations (`pipeline.synthetic.support_logs.write_night`) written as a single gzip
JSON Lines file on the local disk, scored raw → committed run (`pexec score FILE --format openai`, default shard
size) with local Ray limited to 1 and then 2 CPUs, each run a fresh process (Ray start-up included). A compressed
file is cut into ranges of its decompressed bytes that one streaming reader task per file hands to the scoring
tasks, so one file keeps both CPUs busy and each task holds one range.

Every run samples its process tree (the driver, Ray's own processes, its workers) twice a second: CPU-seconds (user
+ system of each process, its last sample for one that ended first), and each Ray worker's peak RSS (VmHWM). A
scoring task restarts its worker's peak as it begins and reports its own in its shard's marker; the largest
worker peak is the larger of the samples (the streaming readers') and the markers'. Ray workers run at the same
niceness in both runs (nice 0 under `pexec bench`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TypedDict

import orjson

from pipeline.apps.perf.figures import Bench, figure, load_average, n_runs, replace_block, show

DEFAULT_ROLLOUTS = 1_000_000
TASK_BOUND_MIB = 1024  # the memory a scoring task stays under, whatever the file's size
TARGET_SPEEDUP = 1.7
_SAMPLE_S = 0.5
SHARD_MB = 16.0  # as the nightly bench's: a file of 100k conversations (160 MiB) is ten ranges


class Run(TypedDict):
    seconds: float  # wall, Ray start-up included
    cpu_seconds: float  # the process tree's user + system
    count: int  # rollouts scored
    shards: int
    cpus: int
    worker_mib: float  # the largest Ray worker's VmHWM
    peaks: dict[str, float]  # the largest VmHWM by what the worker ran when it rose last
    task_seconds: float  # the scoring tasks' wall time, summed (their markers')
    driver_mib: float  # this process's VmHWM
    load: tuple[float, float]  # 1-minute load average before and after


def bench_split(
    rollouts: int = DEFAULT_ROLLOUTS,
    workdir: Path | None = None,
    repeats: int = 3,
    shard_mb: float = SHARD_MB,
    in_process: bool = False,
) -> Bench:
    """Score one gzip of `rollouts` conversations on 1 and on 2 CPUs, `repeats` times each (alternating).
    `in_process`: in this process and its Ray (the code paths only, for tests: the CPU limits, the CPU-seconds and
    the peaks are then not each run's own)."""
    load = os.getloadavg()[0]
    root = Path(workdir or tempfile.mkdtemp(prefix="pexec-bench-split-"))
    path = _data(root / "split-data", rollouts)
    size = path.stat().st_size  # read now: a folder of its own is removed below
    runs: dict[int, list[Run]] = {1: [], 2: []}
    try:
        for _ in range(repeats):
            for cpus in (1, 2):
                _progress(f"{rollouts:,} conversations on {cpus} CPU(s) …")
                where = (str(path), str(root / f"run-{cpus}"), cpus, shard_mb)
                run = _score(*where) if in_process else _fresh(*where)
                peaks = ", ".join(f"{k} {v:.0f}" for k, v in sorted(run["peaks"].items()))
                _progress(f"{run['seconds']:.1f} s, {run['cpu_seconds']:.0f} CPU-s, {run['shards']} shards, "
                          f"worker peaks (MiB) {peaks}, load {run['load'][0]:.1f} → {run['load'][1]:.1f}")  # fmt: skip
                if run["count"] != rollouts:
                    raise AssertionError(f"{run['count']:,} rollouts scored, {rollouts:,} written")
                runs[cpus].append(run)
                (root / "split-runs.json").write_bytes(orjson.dumps({str(c): r for c, r in runs.items()}))
    finally:
        for cpus in (1, 2):
            shutil.rmtree(root / f"run-{cpus}", ignore_errors=True)
        if workdir is None:
            shutil.rmtree(root, ignore_errors=True)
    return _bench(runs, rollouts, size, shard_mb, repeats, load)


def _bench(runs: dict[int, list[Run]], rollouts: int, size: int, shard_mb: float, repeats: int, load: float) -> Bench:
    def rate(cpus: int) -> list[float]:
        return [r["count"] / r["seconds"] for r in runs[cpus]]

    def per_cpu_s(cpus: int) -> list[float]:
        return [r["count"] / r["cpu_seconds"] for r in runs[cpus]]

    loads = [x for c in (1, 2) for r in runs[c] for x in r["load"]]
    shards = runs[2][0]["shards"]
    figures = [
        figure(f"one gzip file: raw → run, rollouts/s (wall) on 2 CPUs (target ≥ {TARGET_SPEEDUP}× 1 CPU)",
               "rollouts/s", rate(2), "1 CPU", rate(1)),
        figure("one gzip file: rollouts per CPU-second of the process tree, 2 CPUs", "rollouts/CPU-s",
               per_cpu_s(2), "1 CPU", per_cpu_s(1)),
        figure("one gzip file: CPU-seconds of the process tree, 2 CPUs", "CPU-s",
               [r["cpu_seconds"] for r in runs[2]], "1 CPU", [r["cpu_seconds"] for r in runs[1]]),
        figure(f"one gzip file: largest Ray worker peak RSS (VmHWM), 2 CPUs (stated bound {TASK_BOUND_MIB:,} MiB)",
               "MiB", [r["worker_mib"] for r in runs[2]], "1 CPU", [r["worker_mib"] for r in runs[1]]),
        figure("one gzip file: scoring tasks running at once (their wall time summed / the run's), 2 CPUs", "tasks",
               [_at_once(r) for r in runs[2]], "1 CPU", [_at_once(r) for r in runs[1]]),
        figure("one gzip file: driver peak RSS (VmHWM), 2 CPUs", "MiB", [r["driver_mib"] for r in runs[2]],
               "1 CPU", [r["driver_mib"] for r in runs[1]]),
    ]  # fmt: skip
    size_note = "" if rollouts >= DEFAULT_ROLLOUTS else f" (below the default {DEFAULT_ROLLOUTS:,}: a small run)"
    caption = (
        f"{rollouts:,} support conversations{size_note} in one gzip OpenAI JSON Lines file of {size / 2**20:,.1f} "
        f"MiB on the local disk, cut into {shards} ranges of {shard_mb:g} MiB of its decompressed bytes that one "
        f"streaming reader hands to the scoring tasks; every run a fresh process (Ray start-up included), 1 and 2 "
        f"CPUs alternating; CPU-seconds of the whole process tree (driver, Ray, workers); "
        f"{n_runs(repeats)}; load average during the runs {min(loads):.1f}–{max(loads):.1f}; {load_average(load)}"
    )
    details = {"runs": {str(c): list(r) for c, r in runs.items()}, "rollouts": rollouts}
    return Bench("split", caption, figures, details)


def _at_once(run: Run) -> float:
    return run["task_seconds"] / run["seconds"]


def _data(folder: Path, rollouts: int) -> Path:
    """The single gzip file of `rollouts` conversations, written unless the folder holds it already."""
    from pipeline.synthetic.support_logs import write_night

    path = folder / "conversations-000.jsonl.gz"
    marker = folder / "written.json"
    wanted = {"rollouts": rollouts, "writer": _writer_digest()}
    if path.exists() and marker.exists() and orjson.loads(marker.read_bytes()) == wanted:
        _progress(f"reusing {path}")
        return path
    shutil.rmtree(folder, ignore_errors=True)
    _progress(f"writing {rollouts:,} conversations as one gzip file …")
    write_night(folder, rollouts, files=1)
    marker.write_bytes(orjson.dumps(wanted))
    return path


def _writer_digest() -> str:
    import hashlib

    from pipeline.synthetic import support_logs

    return hashlib.sha256(Path(str(support_logs.__file__)).read_bytes()).hexdigest()[:12]


def _fresh(path: str, run: str, cpus: int, shard_mb: float) -> Run:
    argv = [sys.executable, "-m", "pipeline.apps.perf.split", "score", path, run, str(cpus), str(shard_mb)]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"scoring on {cpus} CPU(s) failed: {done.stderr.strip()[-2000:]}")
    result: Run = orjson.loads(done.stdout.strip().splitlines()[-1])
    return result


class _Tree:
    """This process and its descendants sampled until stopped: CPU-seconds and each Ray worker's VmHWM."""

    def __init__(self) -> None:
        import psutil

        self._me = psutil.Process()
        self.cpu: dict[int, float] = {}
        self.workers: dict[int, float] = {}
        self.titles: dict[int, str] = {}  # what each worker was running when its peak last rose (its process title)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> _Tree:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.sample()
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(_SAMPLE_S):
            self.sample()

    def sample(self) -> None:
        import psutil

        for p in [self._me, *self._me.children(recursive=True)]:
            try:
                times = p.cpu_times()
                self.cpu[p.pid] = times.user + times.system
                title = p.cmdline()[:1]
                if p.pid != self._me.pid and title and title[0].startswith("ray::"):
                    peak = _vm_hwm(p.pid)
                    if peak > self.workers.get(p.pid, 0.0):
                        self.workers[p.pid], self.titles[p.pid] = peak, title[0].removeprefix("ray::")
            except (psutil.NoSuchProcess, psutil.AccessDenied, FileNotFoundError, ProcessLookupError):
                continue


def _by_title(tree: _Tree) -> dict[str, float]:
    out: dict[str, float] = {}
    for pid, peak in tree.workers.items():
        title = tree.titles[pid]
        out[title] = max(out.get(title, 0.0), peak)
    return out


def _vm_hwm(pid: int) -> float:
    from pipeline.scoring.memory import peak_mib

    return peak_mib(pid)


def _score(path: str, run: str, cpus: int, shard_mb: float) -> Run:
    """One measured run in this process: score `path` into `run` on a local Ray of `cpus` CPUs."""
    from pipeline.scoring.driver import run_scoring
    from pipeline.scoring.memory import peak_mib
    from pipeline.scoring.settings import ScoreSettings

    settings = ScoreSettings(env="observed", spec="support", num_cpus=cpus, shard_mb=shard_mb, force=True,
                             format="openai", options={"error_prefix": "Error:"})  # fmt: skip
    before = os.getloadavg()[0]
    with _Tree() as tree:
        began = time.perf_counter()
        manifest = run_scoring([path], run, settings)
        seconds = time.perf_counter() - began
    return Run(
        seconds=seconds,
        cpu_seconds=sum(tree.cpu.values()),
        count=manifest.counts.scored,
        shards=manifest.counts.shards,
        cpus=cpus,
        task_seconds=sum(s.seconds for s in manifest.shards),
        # A scoring task restarts its worker's peak as it begins, so a sample can miss the end of the task before:
        # the markers hold each scoring task's own peak, the samples the readers'.
        worker_mib=max([*tree.workers.values(), *(s.peak_rss_mib for s in manifest.shards)], default=0.0),
        peaks=_by_title(tree),
        driver_mib=peak_mib(),
        load=(before, os.getloadavg()[0]),
    )


def _progress(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} bench split: {text}", file=sys.stderr, flush=True)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "score":
        path, run, cpus, shard_mb = argv[1:]
        print(orjson.dumps(_score(path, run, int(cpus), float(shard_mb))).decode())
        return
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=DEFAULT_ROLLOUTS)
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shard-mb", type=float, default=SHARD_MB)
    parser.add_argument("--readme", type=Path, help="replace the bench's block in this Markdown file")
    args = parser.parse_args(argv)
    result = bench_split(args.rollouts, args.workdir, args.repeats, args.shard_mb)
    show(result)
    if args.readme is not None:
        replace_block(args.readme, result)


if __name__ == "__main__":
    main()
