"""A night of OTel spans scored where it lies (`pexec bench spans`): the support sample's conversations as GenAI
spans dealt over 16 files (`pipeline.synthetic.support_spans`), scored by `pexec score --format otel` on local
Ray (the hash shuffle by trace, then by conversation, then scoring tasks over runs of partitions), beside `pexec ingest
otel` then `pexec score` of the same spans in the same run (ingest holds every span of the night in one process).

Figures: spans per second end to end (raw spans to a committed run); the peak RSS of the largest process of each
path (the shuffle: the largest Ray worker that scored partitions, as its shard report records it; the baseline:
the ingest process); and how many partitions the night was cut into.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pipeline.apps.perf.figures import Bench, figure, load_average, n_runs
from pipeline.scoring.driver import run_scoring
from pipeline.scoring.settings import ScoreSettings
from pipeline.synthetic.support_spans import write_spans

SPANS_PER_CONVERSATION = 9  # about, in the support sample


def bench_spans(
    n_spans: int = 1_000_000, workdir: Path | None = None, shard_mb: float = 16, cpus: int = 2, repeats: int = 1
) -> Bench:
    load = os.getloadavg()[0]
    base = Path(workdir or tempfile.mkdtemp(prefix="pexec-spans-"))
    spans = base / "spans"
    shutil.rmtree(spans, ignore_errors=True)
    written = write_spans(spans, max(1, n_spans // SPANS_PER_CONVERSATION), files=16)
    spans_read = ScoreSettings(env="observed", spec="support", num_cpus=cpus, shard_mb=shard_mb, format="otel")
    store_read = ScoreSettings(env="observed", spec="support", num_cpus=cpus)
    rates, peaks, base_rates, base_peaks, partitions = [], [], [], [], []
    for _ in range(repeats):
        run = base / "run"
        shutil.rmtree(run, ignore_errors=True)
        began = time.perf_counter()
        manifest = run_scoring(str(spans), str(run), spans_read)
        rates.append(written / (time.perf_counter() - began))
        peaks.append(max(s.peak_rss_mib for s in manifest.shards))
        partitions.append(sum((s.stop or s.start) - s.start for s in manifest.shards))  # a shard: a run of them
        store, baseline_run = base / "store", base / "baseline-run"
        shutil.rmtree(store, ignore_errors=True)
        shutil.rmtree(baseline_run, ignore_errors=True)
        began = time.perf_counter()
        peak = _ingest_peak_mib(spans, store)
        run_scoring(str(store), str(baseline_run), store_read)
        base_rates.append(written / (time.perf_counter() - began))
        base_peaks.append(peak)
    caption = (f"{written:,} spans of {written // SPANS_PER_CONVERSATION:,} conversations over 16 files, shards of "
               f"{shard_mb:g} MiB, local Ray on {cpus} CPUs; {n_runs(repeats)}; {load_average(load)}")  # fmt: skip
    return Bench(
        "spans",
        caption,
        [
            figure(
                "spans scored per second, raw spans → run",
                "spans/s",
                rates,
                "ingest otel, then score (same spans)",
                base_rates,
            ),
            figure("peak RSS of the largest process", "MiB", peaks, "the ingest process (every span held)", base_peaks),
            figure("partitions the night was cut into", "partitions", partitions, "none: a count"),
        ],
        {"spans": written, "partitions": partitions},
    )


def _ingest_peak_mib(spans: Path, store: Path) -> float:
    """`pexec ingest otel` in a process of its own; its peak RSS, read by that process from /proc (VmHWM) once the
    command is done."""
    code = ("import sys\nfrom pipeline.apps.cli import app\nfrom pipeline.scoring.memory import peak_mib\n"
            "app(sys.argv[1:], standalone_mode=False)\nprint(peak_mib())")  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code, "ingest", "otel", str(spans), "--out", str(store)], check=True,
                         capture_output=True, text=True)  # fmt: skip
    return float(out.stdout.strip().splitlines()[-1])
