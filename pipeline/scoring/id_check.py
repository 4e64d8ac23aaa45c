"""The duplicate-id check on Ray, in hash partitions: the driver never holds the ids.

Each scoring task (or, for a shard whose committed output is reused, a task that reads its ids) cuts the ids of
its shard into `partitions` tables by a hash of the id (pipeline.storage.ids.partition_ids) and hands them to a
holder actor, which puts them in Ray's object store and keeps their references by shard (returned, a small table
would land in the driver's own memory, and every reference would cost the driver some). Then one task per
partition takes that partition's table of every shard, in source order, and returns the repeated ids with where
their copies are (pipeline.storage.ids.partition_copies); the driver turns those into what each shard is told
(pipeline.storage.ids.told), exactly as the inline check does. The driver's memory grows with the shards (a
report each) and the duplicates found, not with the ids; a partition task's with its share of the ids; the
holder's with the shards x partitions references.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

from pipeline.core import ray_waits
from pipeline.scoring.shard import ScoredShard
from pipeline.storage.ids import Copies, Duplicates, ids_table, partition_copies, partition_ids, told
from pipeline.storage.shards import Shard

_HOLDER_THREADS = 8  # shards whose tables the holder puts at once
MAX_PARTITIONS = 64  # a partition holds 1/64 of the ids at most: ~1.6M ids of 100M (~300 MB at the check's peak)
PARTITION_BYTES = 64 * 2**20  # of input per partition: a default shard's worth (pipeline.scoring.driver)


def partition_count(input_bytes: int) -> int:
    """One partition per PARTITION_BYTES of input, up to MAX_PARTITIONS: a partition holds about a default
    shard's ids, whatever size the store was cut into. Every shard puts one table per partition (the holder keeps
    shards x partitions references), so small shards must not multiply the partitions too: 45 shards of 128 KiB
    made 2,025 tables of a few ids each, most of the scoring's time on a small store."""
    return max(1, min(-(-input_bytes // PARTITION_BYTES), MAX_PARTITIONS))


def scored_in_partitions(
    score: Callable[..., ScoredShard], index: int, partitions: int, holder: Any, *args: Any
) -> ScoredShard:
    """Run `score(*args)` (a shard's scoring) in a Ray task: its ids go to `holder` (_IdHolder) in `partitions`
    tables, its report comes back with its ids dropped."""
    scored = score(*args)
    _keep(holder, index, partition_ids(scored.ids, index, partitions))
    return dataclasses.replace(scored, ids=ids_table(()))


def read_in_partitions(
    read: Callable[..., Any], shard: Shard, index: int, partitions: int, holder: Any, *args: Any
) -> None:
    """The ids of a shard whose output is reused, `read(shard, *args)` (as scoring reads them), to `holder` in
    `partitions` tables."""
    _keep(holder, index, partition_ids(read(shard, *args), index, partitions))


def _keep(holder: Any, index: int, tables: list[Any]) -> None:
    # Not returned: Ray hands a task's small return values (under 100 KiB, as a partition of a shard's ids often
    # is) to the caller's own memory, which would put every id in the driver, and even their references cost the
    # driver memory per (shard, partition). The holder actor puts them and keeps the references.
    import ray

    ray.get(holder.keep.remote(index, *tables))


class _IdHolder:
    """An actor that puts the partitions' tables in Ray's object store and owns them, by shard index, until the
    check is done. A retried task's tables replace those of its first attempt."""

    def __init__(self) -> None:
        self.parts: dict[int, list[Any]] = {}

    def keep(self, index: int, *tables: Any) -> None:
        import ray

        self.parts[index] = [ray.put(t) for t in tables]

    def shards(self) -> list[int]:
        return sorted(self.parts)

    def partition(self, p: int) -> list[Any]:
        """The references of partition p of every shard, in source order."""
        return [self.parts[i][p] for i in sorted(self.parts)]


def _copies(holder: Any, p: int) -> dict[str, Copies]:
    import ray

    return partition_copies(ray.get(ray.get(holder.partition.remote(p))))


@functools.cache
def _remote(function: Callable[..., Any]) -> Any:
    """`function` as a Ray remote function, made once per process (each making exports it again)."""
    import ray

    return ray.remote(function)


class RayIdCheck:
    """The ids of a plan's shards (in source order) as partitioned Ray objects, gathered as shards are scored
    or read, then checked one partition per task."""

    def __init__(self, shards: Sequence[Shard], partitions: int) -> None:
        """`partitions`: partition_count of the plan's input bytes (a bench may cut its own)."""
        self.shards = list(shards)
        self.index = {s.key: i for i, s in enumerate(self.shards)}
        self.partitions = partitions
        self.reads: list[Any] = []  # the tasks reading reused shards' ids
        self._holder: Any = None

    def holder(self) -> Any:
        if self._holder is None:
            import ray
            from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

            # On the driver's node: a worker node lost mid-run takes its tasks along (Ray runs them again), never
            # the ids already kept.
            here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
            self._holder = (
                _remote(_IdHolder)
                .options(num_cpus=0, max_concurrency=_HOLDER_THREADS, scheduling_strategy=here)
                .remote()
            )
        return self._holder

    def submit(self, score: Callable[..., ScoredShard], shard: Shard, *args: Any, **options: Any) -> Any:
        """Start `score(shard, *args)` as a Ray task (with `options`, e.g. retries); returns the reference of its
        ScoredShard (ids dropped), its ids kept by the holder."""
        task = _remote(scored_in_partitions).options(**options)
        return task.remote(score, self.index[shard.key], self.partitions, self.holder(), shard, *args)

    def read(self, read: Callable[..., Any], shards: Sequence[Shard], *args: Any, **options: Any) -> list[Any]:
        """Start reading the ids of `shards` (reused ones: not scored again) as Ray tasks, `read(shard, *args)`;
        their ObjectRefs (each done once its ids are with the holder)."""
        task = _remote(read_in_partitions).options(**options)
        holder = self.holder()
        started = [task.remote(read, shard, self.index[shard.key], self.partitions, holder, *args) for shard in shards]
        self.reads += started
        return started

    def duplicates(self, storage_options: dict[str, Any] | None = None) -> Duplicates:
        """Check every partition in a task of its own; what each shard is told (pipeline.storage.ids.told). Every
        shard must have been scored (its task finished) or read. The partitions' objects are released. Raises
        RayNodeLost, not waiting for ever, if this machine's Ray node dies meanwhile."""
        import ray

        ray_waits.get(self.reads)
        self.reads = []
        kept = set(ray_waits.get(self.holder().shards.remote()))
        missing = [s.key for i, s in enumerate(self.shards) if i not in kept]
        if missing:
            raise ValueError(f"the ids of shard(s) {', '.join(missing[:3])} were never submitted")
        check = _remote(_copies)
        pending = [check.remote(self._holder, p) for p in range(self.partitions)]
        copies: dict[str, Copies] = {}
        watch = ray_waits.NodeWatch()
        while pending:  # each partition's copies as it finishes; an id lies in one partition only
            done, pending = ray_waits.wait(pending, watch=watch)
            copies |= ray_waits.get(done[0], watch)
        ray.kill(self._holder)  # its objects with it: every partition is checked
        self._holder = None
        return told(copies, self.shards, storage_options)
