"""The duplicate-id check on Ray, in hash partitions: the driver never holds the ids.

Each scoring task (or, for a shard whose committed output is reused, a task that reads its ids) cuts the ids of
its shard into `partitions` tables by a hash of the id (pipeline.storage.ids.partition_ids) and puts each in Ray's
object store through a holder actor that owns them (returned, a small table would land in the driver's own
memory); the driver keeps only their references. Then one task per partition
receives that partition's table from every shard, in source order, and returns the repeated ids with where their
copies are (pipeline.storage.ids.partition_copies); the driver turns those into what each shard is told
(pipeline.storage.ids.told), exactly as the inline check does. The driver's memory grows with the shards (a
report and `partitions` references each) and the duplicates found, not with the ids; a partition task's with
its share of the ids.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable, Sequence
from typing import Any

from pipeline.scoring.shard import ScoredShard
from pipeline.storage.ids import Copies, Duplicates, ids_table, partition_copies, partition_ids, shard_ids, told
from pipeline.storage.inputs import Shard

_HOLDER_THREADS = 8  # shards whose tables the holder puts at once
MAX_PARTITIONS = 64  # a partition holds 1/64 of the ids at most: ~1.6M ids of 100M (~300 MB at the check's peak)


def partition_count(shards: int) -> int:
    """As many partitions as shards, up to MAX_PARTITIONS: a partition then holds about a shard's worth of ids
    until the store has more shards than that; shards x partitions references stay few per shard."""
    return max(1, min(shards, MAX_PARTITIONS))


def scored_in_partitions(
    score: Callable[..., ScoredShard], index: int, partitions: int, holder: Any, *args: Any
) -> tuple[ScoredShard, list[Any]]:
    """Run `score(*args)` (a shard's scoring) in a Ray task: its report with its ids dropped, and the references of
    its ids in `partitions` tables, put in Ray's object store on behalf of `holder` (_IdHolder)."""
    scored = score(*args)
    return dataclasses.replace(scored, ids=ids_table(())), _put(partition_ids(scored.ids, index, partitions), holder)


def read_in_partitions(
    shard: Shard, index: int, partitions: int, holder: Any, storage_options: dict | None
) -> list[Any]:
    """The ids of a shard whose output is reused, read as scoring reads them, as `partitions` references."""
    return _put(partition_ids(shard_ids(shard, storage_options), index, partitions), holder)


def _put(tables: list[Any], holder: Any) -> list[Any]:
    # Not returned: Ray hands a task's small return values (under 100 KiB, as a partition of a shard's ids often
    # is) to the caller's own memory, which would put every id in the driver. Put by the holder actor instead:
    # objects it owns outlive the worker that made them.
    import ray

    return ray.get(holder.keep.remote(*tables))


class _IdHolder:
    """An actor that puts the partitions' tables in Ray's object store and owns them until the check is done."""

    def keep(self, *tables: Any) -> list[Any]:
        import ray

        return [ray.put(t) for t in tables]


def _copies(*tables: Any) -> dict[str, Copies]:
    return partition_copies(tables)


@functools.cache
def _remote(function: Callable[..., Any]) -> Any:
    """`function` as a Ray remote function, made once per process (each making exports it again)."""
    import ray

    return ray.remote(function)


class RayIdCheck:
    """The ids of a plan's shards (in source order) as partitioned Ray objects, gathered as shards are scored
    or read, then checked one partition per task."""

    def __init__(self, shards: Sequence[Shard], partitions: int | None = None) -> None:
        self.shards = list(shards)
        self.index = {s.key: i for i, s in enumerate(self.shards)}
        self.partitions = partitions or partition_count(len(self.shards))
        self.refs: dict[str, Any] = {}  # shard key -> the reference of its partitions' references
        self._holder: Any = None

    def holder(self) -> Any:
        if self._holder is None:
            self._holder = _remote(_IdHolder).options(num_cpus=0, max_concurrency=_HOLDER_THREADS).remote()
        return self._holder

    def submit(self, score: Callable[..., ScoredShard], shard: Shard, *args: Any, **options: Any) -> Any:
        """Start `score(shard, *args)` as a Ray task (with `options`, e.g. retries); returns the reference of its
        ScoredShard (ids dropped) and keeps that of its ids' partitions."""
        task = _remote(scored_in_partitions).options(num_returns=2, **options)
        scored, parts = task.remote(score, self.index[shard.key], self.partitions, self.holder(), shard, *args)
        self.refs[shard.key] = parts
        return scored

    def read(self, shards: Sequence[Shard], storage_options: dict | None, **options: Any) -> None:
        """Start reading the ids of `shards` (reused ones: not scored again) as Ray tasks."""
        task = _remote(read_in_partitions).options(**options)
        for shard in shards:
            self.refs[shard.key] = task.remote(
                shard, self.index[shard.key], self.partitions, self.holder(), storage_options
            )

    def duplicates(self, storage_options: dict | None = None) -> Duplicates:
        """Check every partition in a task of its own; what each shard is told (pipeline.storage.ids.told). Every
        shard's ids must have been submitted or read. The partitions' objects are released."""
        import ray

        missing = [s.key for s in self.shards if s.key not in self.refs]
        if missing:
            raise ValueError(f"the ids of shard(s) {', '.join(missing[:3])} were never submitted")
        parts = ray.get([self.refs[s.key] for s in self.shards])  # per shard, its partitions' references
        self.refs.clear()
        check = _remote(_copies)
        pending = [check.remote(*(shard_parts[p] for shard_parts in parts)) for p in range(self.partitions)]
        del parts
        copies: dict[str, Copies] = {}
        while pending:  # each partition's copies as it finishes; an id lies in one partition only
            done, pending = ray.wait(pending, num_returns=1)
            copies |= ray.get(done[0])
        if self._holder is not None:
            ray.kill(self._holder)  # its objects with it: every partition is checked
            self._holder = None
        return told(copies, self.shards, storage_options)
