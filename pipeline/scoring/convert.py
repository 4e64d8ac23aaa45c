"""`pexec ingest`: raw logs converted to canonical rollouts by the same shard path scoring reads them with — the
format's shards (files, byte ranges, archive members; a shuffle's partitions for formats whose rollouts span
files) decoded one per task, in this process or as Ray tasks, the records handed back in source order to the
store writer. All or nothing: the first part of a log that is not a rollout fails the conversion, and the
store writer publishes nothing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from contextlib import nullcontext
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from pipeline.core import ray_waits
from pipeline.core.errors import InvalidRecord
from pipeline.core.model import Rollout
from pipeline.core.records import check_rollout, parse_rollout, rollout_record
from pipeline.ingest import IngestError
from pipeline.ingest.base import TypedPart, one_line
from pipeline.ingest.sharded import RawSource, plan_raw, read_raw_rollouts
from pipeline.scoring.shuffle import (
    map_shard,
    partition_shards,
    partitions_per_task,
    read_partition,
    regroup_partition,
)
from pipeline.storage.fs import StorageOptions, remove_all
from pipeline.storage.inputs import supplied, with_batches
from pipeline.storage.shards import RecordError, Shard

if TYPE_CHECKING:
    from ray import ObjectRef

DEFAULT_SHARD_BYTES = 64 * 2**20
Lines = tuple[StorageOptions | None, int] | None  # how ranges of compressed files are read: options, line limit
Result = TypeVar("Result")


@dataclass(frozen=True)
class Executor:
    """Where the shards are decoded: "inline" (this process, one after another) or "ray"."""

    kind: str = "inline"
    address: str | None = None
    num_cpus: int | None = None

    def map(
        self, fn: Callable[..., Result], shards: list[Shard], *args: object, lines: Lines = None
    ) -> Iterator[Result]:
        """fn(shard, *args) for every shard, results in shard order; at most 2 × CPUs tasks in flight. `lines`
        (storage options, line limit): ranges of a compressed file get their lines from one streaming read of it
        (pipeline.scoring.driver.batch_refs), not each from the file's start."""
        if self.kind == "inline":
            for shard, batch in with_batches(shards, *lines) if lines else ((s, None) for s in shards):
                with nullcontext() if batch is None else supplied(batch):
                    result = fn(shard, *args)
                yield result
            return
        import ray

        from pipeline.scoring.driver import _remote, _start_ray, batch_refs, with_lines

        _start_ray(self.address, self.num_cpus)
        task, in_range = _remote(fn), _remote(with_lines)
        window = 2 * max(1, int(ray.cluster_resources().get("CPU", 1)))
        pending: deque[ObjectRef[Result]] = deque()
        for shard, batch in batch_refs(shards, *lines) if lines else ((s, None) for s in shards):
            pending.append(task.remote(shard, *args) if batch is None else in_range.remote(fn, shard, batch, *args))
            if len(pending) >= window:
                yield _get(pending.popleft())
        while pending:
            yield _get(pending.popleft())

    def cpus(self) -> int:
        """The CPUs the tasks run on (inline: one)."""
        if self.kind == "inline":
            return 1
        import ray

        from pipeline.scoring.driver import _start_ray

        _start_ray(self.address, self.num_cpus)
        return max(1, int(ray.cluster_resources().get("CPU", 1)))


def _get(ref: ObjectRef[Result]) -> Result:
    import ray

    try:
        result: Result = ray_waits.get(ref)
    except ray.exceptions.RayTaskError as exc:  # the task's own error, as one line
        cause = exc.cause if isinstance(exc.cause, Exception) else exc
        raise IngestError(str(cause)) from None
    return result


def converted(
    source: RawSource, executor: Executor, scratch: str, shard_bytes: int = DEFAULT_SHARD_BYTES
) -> Iterator[dict[str, Any]]:
    """Every canonical record of the raw source, in source order (a shuffled format: in partition order, its
    partitions staged under `scratch`, a hidden folder of the output store, removed at the end)."""
    shards = plan_raw(source, shard_bytes)
    shuffle = source.shuffle
    lines = (source.options.storage_options, source.options.limits.line_bytes)
    if shuffle is None:
        for records in executor.map(_records, shards, source, "", lines=lines):
            yield from records
        return
    partitions = max(1, -(-sum(s.file.size for s in shards) // shard_bytes))
    per_task = partitions_per_task(partitions, executor.cpus())  # as scoring takes them
    rounds = 2 if shuffle.regroup is not None else 1
    try:
        list(executor.map(_map, shards, source, scratch, partitions, rounds, shard_bytes, lines=lines))
        if rounds == 2:
            list(executor.map(_regroup, partition_shards(source, scratch, shards, partitions, 1, per_task), source,
                              scratch, partitions, shard_bytes))  # fmt: skip
        # In this process the records stream to the writer a partition at a time; a Ray task hands back the list of
        # its run of partitions (a quarter of a night on one CPU, were it held here).
        final = _records if executor.kind == "ray" else _record_stream
        for partition_records in executor.map(final, partition_shards(source, scratch, shards, partitions, 2,
                                                                      per_task), source, scratch):  # fmt: skip
            yield from partition_records
    finally:
        remove_all(scratch, source.options.storage_options)


def _records(shard: Shard, source: RawSource, scratch: str) -> list[dict[str, Any]]:
    """The records of one shard, each checked to be a scorable rollout; the first that is not fails it."""
    return list(_record_stream(shard, source, scratch))


def _record_stream(shard: Shard, source: RawSource, scratch: str) -> Iterator[dict[str, Any]]:
    """The records of `_records`, one at a time."""
    parts: Iterator[TypedPart] = (
        read_partition(source, scratch, shard) if shard.file.fmt == "partition" else read_raw_rollouts(source, shard)
    )
    for location, record in parts:
        where = f"{shard.file.url} {location}".rstrip()
        if isinstance(record, RecordError):  # named where it is, unless its reason names the place already
            raise IngestError(one_line(source.fmt, where, record.reason))
        try:
            if isinstance(record, Rollout):  # built as the model's objects: checked, then written as its record
                yield rollout_record(check_rollout(record))
            else:
                parse_rollout(record)
                yield record
        except InvalidRecord as exc:  # an adapter bug, not bad input: say which record
            rid = record.rollout_id if isinstance(record, Rollout) else record.get("rollout_id")
            raise IngestError(f"{source.fmt}: {where}: produced an invalid record {rid!r}: {exc}") from exc


def _map(shard: Shard, source: RawSource, scratch: str, partitions: int, rounds: int, shard_bytes: int) -> int:
    return map_shard(source, scratch, shard, partitions, rounds, shard_bytes)


def _regroup(shard: Shard, source: RawSource, scratch: str, partitions: int, shard_bytes: int) -> int:
    return regroup_partition(source, scratch, shard, partitions, shard_bytes)
