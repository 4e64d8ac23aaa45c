"""Benchmark of the mergeable Poisson bootstrap (docs/design.md §7, pipeline.bootstrap "poisson-merged"): per-task
sums generated directly (not by scoring), cut into shards, each shard's partial sums timed, then the merge.

    python -m pipeline.perf.merged [--tasks M] [--rollouts-per-task R] [-B B] [--shards S] [--cores C]

Prints the seconds per shard and for the merge, the peak RSS, the throughput in (task, replicate) pairs per
second on one core, and what that projects to for `--tasks` on C cores (shards in parallel, then one merge).
"""

from __future__ import annotations

import argparse
import resource
import time
from typing import Any

import numpy as np

from pipeline import bootstrap

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


def bench_merged(n_tasks: int, per_task: int = 10, B: int = 1000, shards: int = 8, cores: int = 128 * 16,
                 target_tasks: int = 10_000_000) -> dict[str, Any]:  # fmt: skip
    keys, sums = task_sums(n_tasks, per_task)
    cohort = np.zeros(n_tasks, dtype=np.int64)
    bounds = np.linspace(0, n_tasks, shards + 1).astype(int)
    partials, seconds = [], []
    for s in range(shards):
        lo, hi = bounds[s], bounds[s + 1]
        start = time.perf_counter()
        partials.append(bootstrap.poisson_partial(["all"], cohort[lo:hi], keys[lo:hi], sums[lo:hi], COLUMNS, 0, B))
        seconds.append(time.perf_counter() - start)
    start = time.perf_counter()
    bootstrap.merge(partials)
    merge_s = time.perf_counter() - start
    pairs_per_s = n_tasks * B / sum(seconds)
    # Projection: the target's (task, replicate) pairs spread over `cores` shards, then one merge of that many
    # partials (merge time per partial as measured).
    projected = target_tasks * B / pairs_per_s / cores + merge_s / shards * cores
    result = {
        "tasks": n_tasks,
        "rollouts": n_tasks * per_task,
        "B": B,
        "shards": shards,
        "shard_s": [round(x, 2) for x in seconds],
        "merge_s": round(merge_s, 3),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "pairs_per_s_per_core": round(pairs_per_s),
        "one_core_s_for_target": round(target_tasks * B / pairs_per_s),
        "cluster_cores": cores,
        "cluster_s_for_target": round(projected, 1),
    }
    print(
        f"{n_tasks:,} tasks (~{n_tasks * per_task:,} rollouts), B = {B}, {shards} shards: "
        f"{sum(seconds):.1f} s of shard work ({pairs_per_s / 1e6:.0f} M task-replicates/s on one core), "
        f"merge {merge_s:.2f} s, peak RSS {result['peak_rss_mib']} MiB; {target_tasks:,} tasks: "
        f"{result['one_core_s_for_target']} s on one core, ~{projected:.1f} s on {cores} cores (projected)",
        flush=True,
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=1_000_000)
    parser.add_argument("--rollouts-per-task", type=int, default=10)
    parser.add_argument("-B", type=int, default=1000)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--cores", type=int, default=128 * 16)
    parser.add_argument("--target-tasks", type=int, default=10_000_000)
    args = parser.parse_args()
    bench_merged(args.tasks, args.rollouts_per_task, args.B, args.shards, args.cores, args.target_tasks)


if __name__ == "__main__":
    main()
