"""Benchmark of the mergeable Poisson bootstrap (docs/explanation/measured-facts.md; pipeline.metrics.bootstrap
"poisson-merged"): per-task sums generated directly (not by scoring), cut into shards, each shard's partial sums timed,
then the merge.

    python -m pipeline.apps.perf.merged [--tasks M] [--rollouts-per-task R] [-B B] [--shards S] [--cores C]

Prints the throughput in (task, replicate) pairs per second on one core, the merge's seconds, the peak RSS, and
what that projects to for `--target-tasks` on C cores (shards in parallel, then one merge).
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from pipeline.apps.perf import CLUSTER_CORES
from pipeline.apps.perf.figures import Bench, figure, load_average, n_runs, show
from pipeline.metrics import bootstrap
from pipeline.scoring.memory import peak_mib

# Columns as metrics_prepare.sql makes them: the catalogue's 11 parts and a PEC histogram with K = 10.
COLUMNS = [f"s_{p}" for p in ("n", "exec", "auc", "known", "succ", "elig", "rec", "exec_known", "succ_exec", "cmp",
                              "match")] + [f"s_h{d}" for d in range(1, 11)]  # fmt: skip


def task_sums(n_tasks: int, per_task: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(64-bit task keys, int64 per-task sums) shaped like a run's: `per_task` rollouts per task on average."""
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 2**64, n_tasks, dtype=np.uint64)  # md5-derived keys are uniform as well
    n = rng.poisson(per_task, n_tasks).astype(np.int64)
    sums = np.empty((n_tasks, len(COLUMNS)), dtype=np.int64)
    sums[:, 0] = n
    p = rng.random(n_tasks)
    for j in range(1, len(COLUMNS)):
        sums[:, j] = rng.binomial(n, p * 0.9)
    sums[:, 2] = (sums[:, 2] * rng.random(n_tasks) * 2**40).astype(np.int64)  # auc in 2^-40 units
    return keys, sums


def bench_merged(n_tasks: int, per_task: int = 10, B: int = 1000, shards: int = 8, cores: int = CLUSTER_CORES,
                 target_tasks: int = 10_000_000, repeats: int = 3) -> Bench:  # fmt: skip
    load = os.getloadavg()[0]
    keys, sums = task_sums(n_tasks, per_task)
    cohort = np.zeros(n_tasks, dtype=np.int64)
    bounds = np.linspace(0, n_tasks, shards + 1).astype(int)
    shard_s, merge_s = [], []
    for _ in range(repeats):
        partials, seconds = [], 0.0
        for s in range(shards):
            lo, hi = bounds[s], bounds[s + 1]
            start = time.perf_counter()
            partials.append(bootstrap.poisson_partial(["all"], cohort[lo:hi], keys[lo:hi], sums[lo:hi], COLUMNS, 0, B))
            seconds += time.perf_counter() - start
        start = time.perf_counter()
        bootstrap.merge(partials)
        merge_s.append(time.perf_counter() - start)
        shard_s.append(seconds)
    pairs = [n_tasks * B / s for s in shard_s]
    # Projection: the target's (task, replicate) pairs spread over `cores` shards, then one merge of that many
    # partials (merge time per partial as measured).
    projected = [target_tasks * B / p / cores + m / shards * cores for p, m in zip(pairs, merge_s, strict=True)]
    peak = peak_mib()
    none = "none: one implementation"
    figures = [
        figure("shard work, (task, replicate) pairs per second on one core", "pairs/s", pairs, none),
        figure(f"merge of {shards} partials", "s", merge_s, none),
        figure("peak RSS (the generated per-task sums included)", "MiB", [peak], "none: peak memory"),
        figure(f"projection: {target_tasks:,} tasks on {cores:,} cores (one shard per core, then one merge)", "s",
               projected, "none: from the per-core rate and the merge time per partial measured here"),
    ]  # fmt: skip
    caption = (
        f"{n_tasks:,} tasks (≈ {n_tasks * per_task:,} rollouts; per-task sums generated, not scored), B = {B}, "
        f"{shards} shards computed in turn on one core, then merged; {n_runs(repeats)}; {load_average(load)}"
    )
    details = {"shard_s": shard_s, "merge_s": merge_s, "peak_rss_mib": peak, "projected_s": projected}
    return Bench("merged", caption, figures, details)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--rollouts-per-task", type=int, default=10)
    parser.add_argument("-B", type=int, default=1000)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--cores", type=int, default=CLUSTER_CORES)
    parser.add_argument("--target-tasks", type=int, default=10_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    show(bench_merged(args.tasks, args.rollouts_per_task, args.B, args.shards, args.cores, args.target_tasks,
                      args.repeats))  # fmt: skip


if __name__ == "__main__":
    main()
