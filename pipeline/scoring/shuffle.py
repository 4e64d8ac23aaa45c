"""The hash shuffle of a format whose rollouts span files (OTel spans): items are partitioned by a hash of
their key, in tasks, through Arrow files in the run's staging area (`<run>/_staging/`), so that no task holds
more than its input shard or its partition, never the night.

There are P partitions, one per shard size of input: what a task decodes and holds at once. A task of round 2 or
of scoring takes a run of consecutive partitions (`partitions_per_task`) and works through them one at a time.
Round 1 (one task per input shard): read the shard's items, write each to partition hash(key) mod P.
Round 2, when the format regroups (`Shuffle.regroup`; OTel: a trace joins the conversation one of its spans
names), one task per run of partitions: group each partition's items by key, give every item of a group the new
key, write each to partition hash(new key) mod P. Scoring (one task per run of final partitions,
pipeline.scoring.shard): group by key, assemble each group into a rollout (`Shuffle.assemble`), score it.

Each task of a round writes one object, `<run>/_staging/round<R>/<task>.shuffle`: for each partition it has rows
of, in partition order, an Arrow IPC stream (zstd-compressed) of those rows, then a trailer saying where each
partition's stream starts and ends. A task reads its partitions from every object of its round: the object's
trailer (a worker process keeps the trailers it has read), then one ranged read of its partitions' streams, which
are consecutive, held compressed while they are decoded one partition at a time. So a round writes one object per
task, not one per task and partition, and the reads of a round are (tasks writing it) × (tasks reading it): on a
small cluster a task takes up to PARTITIONS_PER_TASK partitions, which divides the reads by its square (a night
of 4 GB of spans cut at 16 MiB: 251 partitions, 63,000 reads in one at a time, 256 in runs of 16).

A part of a log that is not an item travels as an error row to a partition of its own place, and is that
partition's reject: rows read = scored + rejected still holds per partition. The staging area is removed once
the run is committed; partitions are scored afresh on every run (a late file changes every partition).

A round-1 task reads a whole file when the file cannot be cut into byte ranges (protobuf, compressed), so its
input is not bounded by the shard size. It holds at most a shard size of rows (as staged: the item's JSON, its key
and place): past that they are spilled, sorted by partition, to a folder of the node's temporary directory, and
each partition is then written from the spilled files one at a time. Memory stays flat in the file's size; the
node's disk holds the file's rows for the task's duration.
"""

from __future__ import annotations

import hashlib
import shutil
import struct
import tempfile
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import fsspec
import orjson
import pyarrow.compute as pc

from pipeline.core.arrow import pa
from pipeline.core.records import MAX_ID_CHARS
from pipeline.ingest.base import RECORD_ERRORS, record_error
from pipeline.ingest.sharded import RawSource, shuffle_items
from pipeline.storage.fs import filesystem, list_files, open_for_write
from pipeline.storage.shards import InputFile, Record, RecordError, Shard, fingerprint

STAGING = "_staging"
# A task of round 2 or of scoring takes at most this many consecutive partitions, and fewer when that would leave
# fewer than TASKS_PER_CPU tasks per CPU to balance the load (a large cluster: one partition a task).
PARTITIONS_PER_TASK = 16
TASKS_PER_CPU = 4
_REJECTED = "\x00rejected"  # the item id of StagedRow.rejected
SPILL_AFTER_SHARDS = 1  # staged rows a round-1 task holds, in shard sizes, before it spills them to local disk
_ROW_BYTES = 200  # a held row's own cost beyond its strings and payload (the tuple, the objects' headers)
# The staged rows' columns (what each holds: StagedRow).
_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("start", pa.int64()),
        ("item_id", pa.string()),
        ("payload", pa.binary()),
        ("location", pa.string()),
        ("error", pa.string()),
        ("names", pa.string()),
        ("whole", pa.bool_()),
    ]
)


class StagedRow(NamedTuple):
    """A row of the staged schema, one value per column, in its order (a tuple: a batch of them is transposed
    into the schema's columns)."""

    key: str  # the group the item belongs to (a place, for an error row)
    start: int  # the item's start time, which orders a group's items
    item_id: str
    payload: bytes  # the item as JSON; the offending bytes of an error row
    location: str  # "FILE LOCATION" of the item
    error: str | None = None  # the reason of an error row
    names: str | None = None  # the key the item names for its group in round 2 (`Shuffle.rekey`)
    whole: bool = True  # whether round 2 must decode the item's group

    @classmethod
    def failed(cls, where: str, reason: str, raw: bytes) -> StagedRow:
        """The row of a part of a log that is not an item: that partition's reject."""
        return cls(where, 0, "", raw, where, reason, None, False)

    @classmethod
    def rejected(cls, key: str, where: str, reason: str) -> StagedRow:
        """The row that stands for items of group `key` that were not staged (past its limit, or not writable as
        JSON): its group is a reject for `reason`, never assembled from the items that were."""
        return cls(key, 0, _REJECTED, reason.encode(), where, None, None, True)


assert StagedRow._fields == tuple(_SCHEMA.names), "a staged row is a value per column of the staged schema"


# Staged rows are JSON and places that repeat from row to row: zstd makes them about 18 times smaller (432 MB of
# rows from an 83 MB OTLP protobuf file -> 23 MB) for about a quarter more CPU than writing them plain, and the
# staging area is read and written once per round over object storage.
_COMPRESSED = pa.ipc.IpcWriteOptions(compression="zstd")


def partition_of(key: str, partitions: int) -> int:
    """A stable hash (the same in every process, unlike `hash`) of `key`, mod `partitions`."""
    return zlib.crc32(key.encode("utf-8", "surrogatepass")) % partitions


def partitions_per_task(partitions: int, cpus: int) -> int:
    """How many consecutive partitions one task takes, given the CPUs the tasks run on."""
    return max(1, min(PARTITIONS_PER_TASK, partitions // (TASKS_PER_CPU * max(1, cpus))))


def staging(run: str) -> str:
    return f"{run.rstrip('/')}/{STAGING}"


def partition_shards(
    source: RawSource, run: str, inputs: list[Shard], partitions: int, round_: int, per_task: int = 1
) -> list[Shard]:
    """The partitions of round `round_` as shards, `per_task` consecutive partitions each: what scoring (or the next
    round) runs over, a task per shard. Their fingerprint covers every input shard, so any change to the night's
    files shows in every partition."""
    digest = hashlib.sha1(f"{partitions}\n{round_}".encode())
    for s in inputs:
        digest.update(f"{s.file.url}\n{s.file.fingerprint}\n{s.start}\n{s.stop}\n".encode())
    size = sum(s.file.size for s in inputs if s.whole_file) + sum(
        (s.stop or s.file.size) - s.start for s in inputs if not s.whole_file
    )
    fingerprint = f"{size}-{digest.hexdigest()[:12]}"
    shards = []
    for start in range(0, partitions, per_task):
        stop = min(partitions, start + per_task)
        which = f"partition {stop} of" if stop == start + 1 else f"partitions {start + 1}-{stop} of"
        name = f"{source.fmt} {which} {partitions}"
        shards.append(Shard(InputFile(name, "partition", None, size * (stop - start) // partitions, fingerprint),
                            start, stop))  # fmt: skip
    return shards


def shuffle_rounds(
    source: RawSource,
    run: str,
    inputs: list[Shard],
    total_bytes: int,
    shard_bytes: int,
    cpus: int,
    run_tasks: Callable[..., object],
) -> list[Shard]:
    """The shuffle's rounds over the planned `inputs` (round 2 when the format regroups): their items partitioned
    by key, about one partition per `shard_bytes` of input; the final partitions as shards of one or more
    consecutive partitions each. `run_tasks(fn, shards, *args)` runs fn(shard, *args) for every shard, to the end
    (Ray tasks or in this process)."""
    partitions = max(1, -(-total_bytes // shard_bytes))
    per_task = partitions_per_task(partitions, cpus)
    rounds = 2 if source.shuffle is not None and source.shuffle.regroup is not None else 1
    run_tasks(_map_task, inputs, source, run, partitions, rounds, shard_bytes)
    if rounds == 2:
        regroup = partition_shards(source, run, inputs, partitions, 1, per_task)
        run_tasks(_regroup_task, regroup, source, run, partitions, shard_bytes)
    return partition_shards(source, run, inputs, partitions, 2, per_task)


def _map_task(shard: Shard, source: RawSource, run: str, partitions: int, rounds: int, shard_bytes: int) -> int:
    return map_shard(source, run, shard, partitions, rounds, shard_bytes)


def _regroup_task(shard: Shard, source: RawSource, run: str, partitions: int, shard_bytes: int) -> int:
    return regroup_partition(source, run, shard, partitions, shard_bytes)


def map_shard(source: RawSource, run: str, shard: Shard, partitions: int, rounds: int, shard_bytes: int) -> int:
    """Round 1 over one input shard: its items written to their partitions (of round 2 when the format regroups,
    else of scoring), holding at most SPILL_AFTER_SHARDS × `shard_bytes` of rows at once. Returns how many rows it
    wrote."""
    rekey = source.shuffle.rekey if source.shuffle is not None and rounds == 2 else None
    limit = source.options.limits.conversation_items
    seen: dict[str, int] = {}  # items of each key so far: past the limit, a group's items are not staged
    with _Staged(partitions, SPILL_AFTER_SHARDS * shard_bytes) as staged:
        for location, item in shuffle_items(source, shard):
            where = f"{shard.file.url} {location}".rstrip()
            if isinstance(item, RecordError):
                staged.put(StagedRow.failed(where, item.reason, item.raw.encode()))
                continue
            key, (start, item_id), payload = item
            if len(key) > MAX_ID_CHARS:  # its group is kept together under a stand-in, and a reject
                long_key, key = key, _stand_in(key)
                if key not in seen:
                    staged.put(StagedRow.rejected(key, where, _too_long(source, where, "its key", long_key)))
            seen[key] = seen.get(key, 0) + 1
            if seen[key] > limit:
                if seen[key] == limit + 1:
                    staged.put(StagedRow.rejected(key, where, _over_limit(source, key, f"more than {limit:,}")))
                continue
            names, whole = rekey(payload) if rekey is not None else (None, True)
            if names is not None and len(names) > MAX_ID_CHARS:  # so is the conversation it names, in round 2
                staged.put(StagedRow.rejected(key, where, _too_long(source, where, "the key it names", names)))
                names = _stand_in(names)
            try:
                data = orjson.dumps(payload)
            except TypeError as exc:  # nested past orjson's 255 levels, or an integer past 64 bits
                reason = f"{source.fmt}: {where}: an item of key {key} cannot be written as JSON: {exc}"
                staged.put(StagedRow.rejected(key, where, reason))  # not the rest of its conversation without it
            else:
                staged.put(StagedRow(key, start, item_id, data, where, names=names, whole=whole))
        round_ = 1 if rounds == 2 else 2
        _write(run, round_, shard.key, staged.drained(), partitions, source.options.storage_options)
    return staged.count


class _Staged:
    """The rows a task writes to the partitions of the next round: held until `limit` bytes of them, then spilled
    to local disk, one Arrow file per spill with a record batch per partition in partition order."""

    def __init__(self, partitions: int, limit: int) -> None:
        self.partitions, self.limit = partitions, limit
        self.rows: dict[int, list[StagedRow]] = {}
        self.tables: dict[int, list[pa.Table]] = {}  # rows put as Arrow already
        self.held = self.count = 0
        self.folder: str | None = None
        self.files: list[tuple[str, dict[int, int]]] = []  # (path, partition -> its batch in the file)

    def __enter__(self) -> _Staged:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)

    def put(self, row: StagedRow) -> None:
        """A row to the partition of its key."""
        self.rows.setdefault(partition_of(row.key, self.partitions), []).append(row)
        self.count += 1
        self.held += len(row.key) + len(row.payload) + 2 * len(row.location) + _ROW_BYTES
        if self.held >= self.limit:
            self._spill()

    def put_table(self, table: pa.Table) -> None:
        """Rows of the staged schema, each to the partition of its key (a hash per distinct key, not per row)."""
        if not table.num_rows:
            return
        keys = pc.unique(table["key"])
        where = pc.take(pa.array([partition_of(k, self.partitions) for k in keys.to_pylist()], pa.int64()),
                        pc.index_in(table["key"], keys))  # fmt: skip
        order = pc.sort_indices(where)
        table, where = table.take(order), where.take(order)
        counts = pc.value_counts(where)  # in order of first appearance: ascending, as sorted
        begin = 0
        for partition, n in zip(counts.field(0).to_pylist(), counts.field(1).to_pylist(), strict=True):
            self.tables.setdefault(partition, []).append(table.slice(begin, n))
            begin += n
        self.count += table.num_rows
        self.held += table.nbytes
        if self.held >= self.limit:
            self._spill()

    def _held(self, partition: int) -> pa.RecordBatch:
        rows = [pa.Table.from_batches([_batch(self.rows[partition])])] if partition in self.rows else []
        return pa.concat_tables(rows + self.tables.get(partition, [])).combine_chunks().to_batches()[0]

    def _spill(self) -> None:
        order = sorted(self.rows.keys() | self.tables.keys())
        if order:
            self.folder = self.folder or tempfile.mkdtemp(prefix="pexec-shuffle-")
            path = f"{self.folder}/{len(self.files):05d}.arrow"
            with pa.OSFile(path, "wb") as f, pa.ipc.new_file(f, _SCHEMA, options=_COMPRESSED) as writer:
                for partition in order:
                    writer.write_batch(self._held(partition))
            self.files.append((path, {partition: i for i, partition in enumerate(order)}))
        self.rows, self.tables, self.held = {}, {}, 0

    def drained(self) -> Iterator[tuple[int, pa.RecordBatch]]:
        """(partition, its rows) for every partition that has rows, in partition order: from the held rows alone
        when nothing was spilled, else with them spilled too, each partition gathered from every spill file. The
        files are read, not mapped (mapped pages would count in the task's resident memory), and opened one at a
        time: a large file cut into small shards spills thousands of them, past a process's open-file limit."""
        if not self.files:
            yield from (
                (partition, self._held(partition)) for partition in sorted(self.rows.keys() | self.tables.keys())
            )
            return
        self._spill()
        for partition in sorted({p for _, index in self.files for p in index}):
            batches = []
            for path, index in self.files:
                if partition in index:
                    with pa.OSFile(path) as f:
                        batches.append(pa.ipc.open_file(f).get_batch(index[partition]))
            yield partition, pa.concat_batches(batches)


def regroup_partition(source: RawSource, run: str, shard: Shard, partitions: int, shard_bytes: int) -> int:
    """Round 2 over one shard's partitions: every key group regrouped by the format (`Shuffle.regroup`), each item
    written to the partition of its new key, holding at most SPILL_AFTER_SHARDS × `shard_bytes` of rows at once."""
    shuffle = source.shuffle
    assert shuffle is not None and shuffle.regroup is not None
    storage = source.options.storage_options
    with _Staged(partitions, SPILL_AFTER_SHARDS * shard_bytes) as staged:
        for table in _read(run, 1, *_partition_range(shard), storage):
            rekeyed, rest = _rekeyed(table)  # without `Shuffle.rekey` every item is marked whole: none rekeyed
            staged.put_table(rekeyed)
            for key, group, reject in _limited_groups(source, rest):
                if key is None:  # error rows keep their place
                    for row in zip(*group.to_pydict().values(), strict=True):
                        staged.put(StagedRow(*row))
                    continue
                if reject is None:
                    where = group["location"][0].as_py()
                    try:
                        regrouped = shuffle.regroup(key, [orjson.loads(p) for p in group["payload"].to_pylist()])
                    except RECORD_ERRORS as exc:
                        reject = record_error(source.fmt, where, exc)
                if reject is not None:
                    # the conversation it names (as rekeying would) is a reject, never assembled without its items
                    names = group["names"].drop_null()
                    staged.put(StagedRow.rejected(names[0].as_py() if len(names) else key, f"key {key}", reject.reason))
                    continue
                for new_key, item in regrouped:
                    if len(new_key) > MAX_ID_CHARS:
                        reason = _too_long(source, f"key {key}", "a key it joins", new_key)
                        new_key = _stand_in(new_key)
                        staged.put(StagedRow.rejected(new_key, f"key {key}", reason))
                    staged.put(
                        StagedRow(new_key, item["start"], item["span_id"], orjson.dumps(item), where, whole=False)
                    )
        _write(run, 2, f"from-{shard.start:05d}", staged.drained(), partitions, storage)
    return staged.count


def _rekeyed(table: pa.Table) -> tuple[pa.Table, pa.Table]:
    """The item rows of `table`'s key groups that round 2 rekeys without decoding them (`Shuffle.rekey`: no item of
    the group must be seen), each with its group's new key; and the other rows, as they were."""
    items = table.filter(pc.is_null(table["error"])).sort_by([("key", "ascending"), ("start", "ascending"),
                                                               ("item_id", "ascending")])  # fmt: skip
    groups = items.group_by("key", use_threads=False).aggregate([("names", "first"), ("whole", "any")])
    plain = groups.filter(pc.invert(pc.fill_null(groups["whole_any"], True)))
    chosen = pc.is_in(items["key"], plain["key"])
    rekeyed = items.filter(chosen)
    named = pc.take(plain["names_first"], pc.index_in(rekeyed["key"], plain["key"]))
    rekeyed = rekeyed.set_column(0, "key", pc.coalesce(named, rekeyed["key"]))
    rest = pa.concat_tables([table.filter(pc.invert(pc.is_null(table["error"]))), items.filter(pc.invert(chosen))])
    return rekeyed, rest


def read_partition(source: RawSource, run: str, shard: Shard) -> Iterator[tuple[str, Record]]:
    """The rollouts of one shard's final partitions, a partition at a time and a group at a time in key order;
    an error row is a RecordError at its own place, and a group the format cannot assemble is one at `key KEY`."""
    shuffle = source.shuffle
    assert shuffle is not None
    for partition in _read(run, 2, *_partition_range(shard), source.options.storage_options):
        for key, table, reject in _limited_groups(source, partition):
            if reject is not None:
                yield f"key {key}", reject
                continue
            cols = table.to_pydict()
            if key is None:
                for location, payload, error in zip(cols["location"], cols["payload"], cols["error"], strict=True):
                    yield location, RecordError(error, payload.decode("utf-8", "replace"))
                continue
            try:
                yield f"key {key}", shuffle.assemble(key, [orjson.loads(p) for p in cols["payload"]], source.options)
            except RECORD_ERRORS as exc:
                yield f"key {key}", record_error(source.fmt, f"key {key}", exc)


def _limited_groups(source: RawSource, table: pa.Table) -> Iterator[tuple[str | None, pa.Table, RecordError | None]]:
    """`_groups` of `table`, each with its reject (None for the error rows): marked by round 1 (StagedRow.rejected),
    or gathering more items than one conversation may. The marked groups are found once per table: two compute
    calls per group cost more than the rest of reading a small conversation."""
    marked = table.filter(pc.equal(table["item_id"], _REJECTED))
    reasons = dict(zip(marked["key"].to_pylist(), marked["payload"].to_pylist(), strict=True))
    limit = source.options.limits.conversation_items
    for key, group in _groups(table):
        if key is None:
            yield key, group, None
        elif key in reasons:
            yield key, group, RecordError(reasons[key].decode("utf-8", "replace"), "")
        else:
            over = group.num_rows > limit
            yield key, group, RecordError(_over_limit(source, key, f"{group.num_rows:,}"), "") if over else None


def _over_limit(source: RawSource, key: str, items: str) -> str:
    """Why a key group of `items` items, more than one conversation may gather, is a reject (found before any is
    decoded)."""
    limit = source.options.limits.conversation_items
    return (f"{source.fmt}: key {key}: {items} items (spans, log records) are over the limit of {limit:,} for one "
            "conversation (max_conversation_items)")  # fmt: skip


def _stand_in(key: str) -> str:
    """What stands for a key longer than MAX_ID_CHARS, whose group is a reject: its start, length and digest, so
    that its items still gather in one group (and one reject) without carrying it."""
    digest = hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()
    return f"{key[:64]}… ({len(key):,} characters, sha256 {digest})"


def _too_long(source: RawSource, where: str, what: str, key: str) -> str:
    return f"{source.fmt}: {where}: {what} is {len(key):,} characters, over the limit of {MAX_ID_CHARS:,} for an id"


def _groups(table: pa.Table) -> Iterator[tuple[str | None, pa.Table]]:
    """(key, its rows) in key order; the error rows first, as (None, rows)."""
    errors = table.filter(pc.invert(pc.is_null(table["error"])))
    if errors.num_rows:
        yield None, errors
    items = table.filter(pc.is_null(table["error"])).sort_by([("key", "ascending"), ("start", "ascending")])
    keys = items["key"].to_pylist()
    begin = 0
    for i in range(1, len(keys) + 1):
        if i == len(keys) or keys[i] != keys[begin]:
            yield keys[begin], items.slice(begin, i - begin)
            begin = i


def _round(run: str, round_: int) -> str:
    return f"{staging(run)}/round{round_}"


def _batch(rows: list[StagedRow]) -> pa.RecordBatch:
    columns = list(zip(*rows, strict=True))
    return pa.RecordBatch.from_arrays([pa.array(c, f.type) for c, f in zip(columns, _SCHEMA, strict=True)],
                                      schema=_SCHEMA)  # fmt: skip


# The trailer of a task's object: P + 1 little-endian int64 offsets (partition p's stream is bytes [offset p,
# offset p + 1); empty when it has no rows), then P, then the magic.
_MAGIC = b"PXSHUF01"
_TAIL = 64 * 1024  # bytes read from an object's end for its trailer: enough for 8,000 partitions, else read again
# The trailers a worker process has read, by object path and fingerprint (size and ETag or mtime: an object
# rewritten by a rerun is read afresh), least recently used first, at most this many bytes of them.
TRAILER_CACHE_BYTES = 16 * 2**20
_trailers: OrderedDict[tuple[str, str], bytes] = OrderedDict()


def _partition_range(shard: Shard) -> tuple[int, int]:
    """The partitions a partition shard covers, first and past the last (partition_shards sets both)."""
    if shard.stop is None:
        raise ValueError(f"{shard.file.url}: not a shard of a shuffle's partitions (it names no last partition)")
    return shard.start, shard.stop


def _write(
    run: str,
    round_: int,
    name: str,
    batches: Iterable[tuple[int, pa.RecordBatch]],
    partitions: int,
    storage: dict[str, Any] | None,
) -> None:
    """One task's output of a round (`batches`: the partitions that have rows, in partition order) as one object."""
    offsets: list[int] = []
    with open_for_write(f"{_round(run, round_)}/{name}.shuffle", storage) as f:
        position = 0
        for partition, batch in batches:
            offsets += [position] * (partition + 1 - len(offsets))  # where it and the empty ones before it start
            stream = pa.BufferOutputStream()
            with pa.ipc.new_stream(stream, _SCHEMA, options=_COMPRESSED) as writer:
                writer.write_batch(batch)
            position += f.write(stream.getvalue())
        offsets += [position] * (partitions + 1 - len(offsets))
        f.write(struct.pack(f"<{partitions + 2}q", *offsets, partitions) + _MAGIC)


def _read(run: str, round_: int, start: int, stop: int, storage: dict[str, Any] | None) -> Iterator[pa.Table]:
    """Partitions `start` to `stop` - 1 of a round, a table each, in order: from every task's object one ranged read
    of those partitions' streams (consecutive in it), held compressed while they are decoded one at a time."""
    found = list_files(_round(run, round_), storage, patterns=["*.shuffle"], max_depth=1) or {}
    fs, folder = filesystem(_round(run, round_), storage)  # once: every object is a file of this folder
    streams = []  # (the bytes of an object's streams of these partitions, where each stream starts in them)
    for url, info in found.items():
        path, size = f"{folder}/{url.rsplit('/', 1)[1]}", int(info["size"])
        offsets = _offsets(path, _trailer(path, size, fingerprint(size, info), fs), start, stop)
        if offsets[-1] > offsets[0]:
            data = pa.py_buffer(fs.cat_file(path, start=offsets[0], end=offsets[-1]))
            streams.append((data, [o - offsets[0] for o in offsets]))
    for i in range(stop - start):
        tables = [
            pa.ipc.open_stream(data.slice(at[i], at[i + 1] - at[i])).read_all()
            for data, at in streams
            if at[i + 1] > at[i]
        ]
        yield pa.concat_tables(tables) if tables else _SCHEMA.empty_table()


def _trailer(path: str, size: int, version: str, fs: fsspec.AbstractFileSystem) -> bytes:
    """The trailer of the object at `path` (`size` bytes, `version` its fingerprint), from this process's cache or
    read from the object's end."""
    key = (path, version)
    if (cached := _trailers.get(key)) is not None:
        _trailers.move_to_end(key)
        return cached
    tail: bytes = fs.cat_file(path, start=max(0, size - _TAIL), end=size)
    damaged = OSError(f"{path}: not a shuffle object (its staging area was changed while the run was written)")
    if len(tail) < 8 + len(_MAGIC) or tail[-len(_MAGIC) :] != _MAGIC:
        raise damaged
    (partitions,) = struct.unpack_from("<q", tail, len(tail) - len(_MAGIC) - 8)
    length = 8 * (partitions + 2) + len(_MAGIC)
    if partitions < 1 or length > size:
        raise damaged
    if length > len(tail):  # more partitions than the first read covers
        tail = fs.cat_file(path, start=size - length, end=size)
    trailer = _trailers[key] = tail[-length:]
    held = sum(len(t) for t in _trailers.values())
    while held > TRAILER_CACHE_BYTES and len(_trailers) > 1:
        held -= len(_trailers.popitem(last=False)[1])
    return trailer


def _offsets(path: str, trailer: bytes, start: int, stop: int) -> tuple[int, ...]:
    """Where the streams of partitions `start` to `stop` - 1 begin in the object at `path`, and where the last
    ends (`stop` - `start` + 1 offsets), from the object's `trailer`."""
    (partitions,) = struct.unpack_from("<q", trailer, len(trailer) - len(_MAGIC) - 8)
    if not 0 <= start < stop <= partitions:
        raise OSError(f"{path}: holds {partitions} partitions, not partitions {start} to {stop - 1}")
    return struct.unpack_from(f"<{stop - start + 1}q", trailer, 8 * start)
