"""Benchmark of the DuckDB bootstrap stage (docs/design.md §7): compute_metrics on a synthetic rollouts table.

    python -m pipeline.perf.metrics [--rollouts N] [--tasks M] [-B B] [--workdir DIR]

Each method runs in a fresh process, so the peak RSS reported is that method's own.
"""

from __future__ import annotations

import argparse
import multiprocessing
import resource
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from pipeline.storage.run import commit_parts


def write_synthetic_rollouts(
    run: Path, n_rollouts: int, n_tasks: int, seed: int = 0, parts: int = 4, n_models: int = 1
) -> None:
    """A rollouts table shaped like a real run: T in 0..15, ~20% executable, success tied to both.

    With n_models > 1 every rollout gets a random `model` label: that many cohorts over the same tasks.
    """
    rng = np.random.default_rng(seed)
    task = rng.integers(0, n_tasks, n_rollouts)
    # Per-task difficulty drives both executability and success (within-task correlation, as in real runs).
    hard = rng.beta(2, 2, n_tasks)[task]
    T = rng.integers(0, 16, n_rollouts).astype(np.int32)
    exec_p = np.clip(0.4 - 0.4 * hard, 0.0, 1.0)  # mean ~0.2
    executable = (T == 0) | (rng.random(n_rollouts) < exec_p)
    fed = np.where(executable, T + 1, 1 + np.floor(rng.random(n_rollouts) * np.maximum(T, 1))).astype(np.int32)
    auc = np.where(T == 0, 1.0, (fed - 1) / np.maximum(T, 1))
    success_p = np.where(executable, 0.9 - 0.3 * hard, 0.75 - 0.5 * hard)
    success = rng.random(n_rollouts) < success_p
    success_known = rng.random(n_rollouts) >= 0.01  # 1% of logs carry no verdict
    success_arr = pa.array(success, mask=~success_known)
    recovered = pa.array(~executable & success, mask=~success_known)
    n_invalid = np.where(executable, 0, 1 + (rng.random(n_rollouts) * np.maximum(T - fed, 0)).astype(np.int32))
    causes = np.array(["schema", "dependency", "information", "state_consistency", "precondition"])
    first_cause = pa.array(causes[rng.integers(0, 5, n_rollouts)], mask=executable)
    task_ids = np.char.add("task-", np.char.zfill(task.astype(str), 6))
    table = pa.table(
        {
            "run_id": pa.array(["bench"] * n_rollouts),
            "rollout_id": pa.array(np.char.add("r", np.arange(n_rollouts).astype(str))),
            "task_id": pa.array(task_ids),
            "benchmark": pa.array(["synthetic"] * n_rollouts),
            "model": pa.array(np.char.add("model-", rng.integers(0, n_models, n_rollouts).astype(str))),
            "T": pa.array(T),
            "fed": pa.array(fed),
            "executable": pa.array(executable),
            "auc_term": pa.array(auc),
            "success": success_arr,
            "recovered": recovered,
            "first_cause": first_cause,
            "n_invalid": pa.array(n_invalid.astype(np.int32)),
            "n_output_mismatch": pa.array(np.zeros(n_rollouts, np.int32)),
            "n_output_compared": pa.array(T),
            "diverged_before_fed": pa.array(np.zeros(n_rollouts, bool)),
            "cost_tokens": pa.array(rng.gamma(2.0, 500.0, n_rollouts)),
        }
    )
    folder = run / "rollouts"
    folder.mkdir(parents=True, exist_ok=True)
    step = -(-n_rollouts // parts)
    for i in range(parts):
        pq.write_table(table.slice(i * step, step), folder / f"part-{i:04d}.parquet")
    commit_parts(str(run))


def _time_one(run: str, method: str, B: int, max_k: int) -> tuple[float, int, int]:
    from pipeline.aggregate import BootstrapSettings, compute_metrics

    start = time.perf_counter()
    cohorts = compute_metrics(run, None, BootstrapSettings(B=B, method=method), max_k=max_k)
    seconds = time.perf_counter() - start
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    return seconds, peak_kib, len(cohorts)


def bench_metrics(
    n_rollouts: int = 1_000_000,
    n_tasks: int = 100_000,
    B: int = 1000,
    workdir: str | Path | None = None,
    max_k: int = 10,
    n_models: int = 1,
) -> dict[str, Any]:
    """Time compute_metrics (both bootstrap methods) on synthetic data; returns and prints the numbers."""
    base = Path(workdir) if workdir is not None else Path(tempfile.mkdtemp(prefix="pexec-bench-metrics-"))
    run = base / "run"
    if run.exists():
        shutil.rmtree(run)
    start = time.perf_counter()
    write_synthetic_rollouts(run, n_rollouts, n_tasks, n_models=n_models)
    result: dict[str, Any] = {
        "n_rollouts": n_rollouts,
        "n_tasks": n_tasks,
        "B": B,
        "K": max_k,
        "models": n_models,
        "generate_s": round(time.perf_counter() - start, 2),
    }
    ctx = multiprocessing.get_context("spawn")  # a fresh process per method: peak RSS is its own
    for method in ("multinomial", "poisson"):
        with ctx.Pool(1) as pool:
            seconds, peak_kib, n_cohorts = pool.apply(_time_one, (str(run), method, B, max_k))
        result[method] = {"seconds": round(seconds, 2), "peak_rss_mib": round(peak_kib / 1024), "cohorts": n_cohorts}
        print(
            f"{method:12s} {seconds:7.2f} s   peak RSS {peak_kib / 1024:7.0f} MiB   {n_cohorts} cohort(s)", flush=True
        )
    if workdir is None:
        shutil.rmtree(base, ignore_errors=True)
    print(result, flush=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rollouts", type=int, default=1_000_000)
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("-B", type=int, default=1000)
    parser.add_argument("--max-k", type=int, default=10)
    parser.add_argument("--models", type=int, default=1, help="cohorts over the same tasks (model label)")
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    bench_metrics(args.rollouts, args.tasks, args.B, args.workdir, args.max_k, args.models)


if __name__ == "__main__":
    main()
