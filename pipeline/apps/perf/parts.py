"""A scoring task over a run of shuffle partitions (`pexec bench parts`): its peak memory when it takes 16
partitions against when it takes 1, the rest equal.

The support sample's conversations as OTel spans over 16 files (as `pexec bench spans`), scored in one process
(`--inline`) through the whole shuffle, once with every scoring task taking 16 consecutive partitions and once with
each taking 1 (the scoring module's runs-of-partitions setting, set in that process). Each case is a process of its
own; in it, every scoring task's peak is its VmHWM, reset (/proc/self/clear_refs) as the task starts: what the
task added to the process is that peak less the resident memory it started with. Held whole, a task's converted
steps and rollouts grew with its run of partitions; spilled past the held-parts limit, they do not.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from pipeline.apps.perf.figures import Bench, figure, load_average, n_runs
from pipeline.apps.perf.spans import SPANS_PER_CONVERSATION
from pipeline.scoring.shard import ScoredShard, TaskSettings, score_shard
from pipeline.storage.shards import Shard
from pipeline.synthetic.support_spans import write_spans

# What a case's process runs: argv = spans folder, run folder, partitions per task, shard MiB. Prints, as JSON, a
# row per scoring task: [partitions, peak MiB, resident MiB before it scored, rollouts scored].
_CASE = """
import json, multiprocessing, sys
from concurrent.futures import ProcessPoolExecutor
from pipeline.apps.perf.parts import scored_alone
from pipeline.scoring import driver, shuffle
from pipeline.scoring.settings import ScoreSettings

spans, run, per_task, shard_mb = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
shuffle.PARTITIONS_PER_TASK, shuffle.TASKS_PER_CPU = per_task, 1
tasks = []

def measured(shard, *args):
    with ProcessPoolExecutor(1, multiprocessing.get_context("spawn")) as pool:
        scored, peak, start = pool.submit(scored_alone, shard, *args).result()
    tasks.append([(shard.stop or shard.start) - shard.start, peak, start, scored.report.scored])
    return scored

driver.score_shard = measured
settings = ScoreSettings(env="observed", spec="support", format="otel", inline=True, shard_mb=shard_mb)
driver.run_scoring(spans, run, settings)
print(json.dumps(tasks))
"""


def scored_alone(
    shard: Shard, settings: TaskSettings, duplicates: dict[str, tuple[str, int]] | None
) -> tuple[ScoredShard, float, float]:
    """A scoring task in a process of its own (a case's): what it returns, its peak RSS (VmHWM) and its resident
    memory before it scored (the interpreter and the modules scoring imports)."""
    start = _status_mib("VmRSS")
    scored = score_shard(shard, settings, duplicates)
    return scored, _status_mib("VmHWM"), start


def _status_mib(key: str) -> float:
    line = next(x for x in Path("/proc/self/status").read_text().splitlines() if x.startswith(f"{key}:"))
    return int(line.split()[1]) / 1024


def bench_parts(n_spans: int = 1_000_000, workdir: Path | None = None, shard_mb: float = 16, repeats: int = 3) -> Bench:
    load = os.getloadavg()[0]
    base = Path(workdir or tempfile.mkdtemp(prefix="pexec-parts-"))
    spans = base / "spans"
    shutil.rmtree(spans, ignore_errors=True)
    written = write_spans(spans, max(1, n_spans // SPANS_PER_CONVERSATION), files=16)
    grown: dict[int, list[float]] = {16: [], 1: []}
    peaks: dict[int, list[float]] = {16: [], 1: []}
    rollouts: dict[int, list[float]] = {16: [], 1: []}
    partitions: list[int] = []
    for _ in range(repeats):
        for per_task in (16, 1):  # interleaved: the machine's load falls on both alike
            tasks = case(spans, base / "run", per_task, shard_mb)
            took = [t for t in tasks if t[0] == per_task] or tasks  # the full runs (the last may be shorter)
            peaks[per_task].append(max(t[1] for t in took))
            grown[per_task].append(max(t[1] - t[2] for t in took))
            rollouts[per_task].append(max(t[3] for t in took))
            if per_task == 1:
                partitions.append(len(tasks))
    caption = (f"{written:,} spans of {written // SPANS_PER_CONVERSATION:,} conversations over 16 files, partitions "
               f"of about {shard_mb:g} MiB of spans ({partitions[0]:,}), shuffled in one process, each scoring task "
               f"in a process of its own (its VmHWM); {n_runs(repeats)}; {load_average(load)}")  # fmt: skip
    return Bench(
        "parts",
        caption,
        [
            figure(
                "peak RSS of a scoring task over 16 partitions",
                "MiB",
                peaks[16],
                "the same task over 1 partition",
                peaks[1],
            ),
            figure(
                "memory a scoring task over 16 partitions adds to its process",
                "MiB",
                grown[16],
                "the same over 1 partition",
                grown[1],
            ),
            figure(
                "rollouts a scoring task over 16 partitions scored",
                "rollouts",
                rollouts[16],
                "the same over 1 partition",
                rollouts[1],
            ),
        ],
        {"spans": written, "partitions": partitions},
    )


def case(spans: Path, run: Path, per_task: int, shard_mb: float) -> list[list[float]]:
    """One case in a process of its own: [partitions, peak MiB, resident MiB at start, rollouts] per scoring task."""
    shutil.rmtree(run, ignore_errors=True)
    out = subprocess.run(
        [sys.executable, "-c", _CASE, str(spans), str(run), str(per_task), str(shard_mb)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    tasks: list[list[float]] = json.loads(out.strip().splitlines()[-1])
    return tasks
