"""How many (benchmark, task_id) pairs two runs share (`pexec diff`: drift assumes two independent samples, and
says when they are not).

Each pair is counted by the 128-bit md5 of both (sql/task_digests.sql), 16 bytes a task, never as rows of strings.
On one node, each run's distinct digests are read and intersected here. With a Ray address no process reads every
rollout: one task per rollouts part gives its part's digests cut into partitions by their high bits, and one task
per partition intersects both runs' digests of it, so a task holds about a partition of the two runs' tasks.
"""

from __future__ import annotations

import numpy as np

from pipeline.core import ray_waits
from pipeline.metrics.completeness import Snapshot
from pipeline.metrics.duck import connect, run_sql, set_variables
from pipeline.storage.run import RunPrefix

DIGEST = np.dtype([("hi", "<u8"), ("lo", "<u8")])  # ordered as one 128-bit number: sorts, compares, intersects


def shared_tasks(a: Snapshot, b: Snapshot, address: str | None = None) -> int:
    """(benchmark, task_id) pairs both runs' scored rollouts have; `address`: counted in Ray tasks there."""
    files_a, files_b = a.parts("rollouts"), b.parts("rollouts")
    if address is None:
        return len(np.intersect1d(digests(a.root, files_a), digests(b.root, files_b), assume_unique=True))
    from pipeline.metrics.partials import object_list, partition_count, remote_function, start_ray

    start_ray(address)
    n = partition_count(max(len(files_a), len(files_b)))
    cut = remote_function(part_digests).options(num_returns=n)
    parts_a = [object_list(cut.remote(a.root, f, n)) for f in files_a]
    parts_b = [object_list(cut.remote(b.root, f, n)) for f in files_b]
    count = remote_function(shared_in_partition)
    counts = [count.remote(len(parts_a), *(o[p] for o in parts_a), *(o[p] for o in parts_b)) for p in range(n)]
    return sum(ray_waits.get(counts))


def digests(root: RunPrefix, files: list[str]) -> np.ndarray:
    """The distinct digests of the rollouts in `files` (parts of the run under `root`), sorted."""
    if not files:
        return np.zeros(0, DIGEST)
    con = connect(root)
    try:
        set_variables(con, rollouts_files=files)
        run_sql(con, "metrics/view_rollouts")
        run_sql(con, "metrics/task_digests")
        got = con.sql("SELECT hi, lo FROM task_digests").fetchnumpy()
    finally:
        con.close()
    out = np.empty(len(got["hi"]), DIGEST)
    out["hi"], out["lo"] = got["hi"], got["lo"]
    out.sort()
    return out


def part_digests(root: RunPrefix, file: str, partitions: int) -> tuple[np.ndarray, ...] | np.ndarray:
    """One part's digests, in `partitions` arrays by their high 64 bits (so a task's digest from any part of either
    run lands in the same partition); one partition: the array itself, the one object Ray makes of a return."""
    found = digests(root, [file])
    if partitions == 1:
        return found
    which = found["hi"] % np.uint64(partitions)
    return tuple(found[which == p] for p in range(partitions))


def shared_in_partition(n_a: int, *pieces: np.ndarray) -> int:
    """The digests both runs have in one partition: `pieces` are the first run's parts' (n_a of them), then the
    second's."""
    a = _union(pieces[:n_a])
    b = _union(pieces[n_a:])
    return len(np.intersect1d(a, b, assume_unique=True))


def _union(pieces: tuple[np.ndarray, ...]) -> np.ndarray:
    return np.unique(np.concatenate(pieces)) if pieces else np.zeros(0, DIGEST)
