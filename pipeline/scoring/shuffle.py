"""The hash shuffle of a format whose rollouts span files (OTel spans): items are partitioned by a hash of
their key, in tasks, through Arrow files in the run's staging area (`<run>/_staging/`), so that no task holds
more than its input shard or its partition, never the night.

Round 1 (one task per input shard): read the shard's items, write each to partition hash(key) mod P.
Round 2, when the format regroups (`Shuffle.regroup`; OTel: a trace joins the conversation one of its spans
names), one task per partition: group its items by key, give every item of a group the new key, write each to
partition hash(new key) mod P. Scoring (one task per final partition, pipeline.scoring.shard): group by key,
assemble each group into a rollout (`Shuffle.assemble`), score it.

Each task of a round writes one object, `<run>/_staging/round<R>/<task>.shuffle`: for each partition it has rows
of, in partition order, an Arrow IPC stream (zstd-compressed) of those rows, then a trailer saying where each
partition's stream starts and ends. A partition is read from every object of its round with two ranged reads each:
the object's trailer, then the partition's range. So a round writes one object per task, not one per task and
partition (at P = 1,600 partitions: 1,600 objects instead of 2.5 million). A worker process keeps the trailers it
has read (they are the same for every partition), so it reads each object's trailer once, then one range per
partition it scores.

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
from collections.abc import Iterable, Iterator
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.ingest import IngestError
from pipeline.ingest.sharded import RawSource, shuffle_items
from pipeline.storage.fs import filesystem, list_files, open_for_write
from pipeline.storage.inputs import InputFile, RecordError, Shard, fingerprint

STAGING = "_staging"
SPILL_AFTER_SHARDS = 1  # staged rows a round-1 task holds, in shard sizes, before it spills them to local disk
_ROW_BYTES = 200  # a held row's own cost beyond its strings and payload (the tuple, the objects' headers)
_SCHEMA = pa.schema(
    [
        ("key", pa.string()),
        ("start", pa.int64()),
        ("item_id", pa.string()),
        ("payload", pa.binary()),  # the item as JSON; the offending bytes of an error row
        ("location", pa.string()),  # "FILE LOCATION" of the item
        ("error", pa.string()),  # the reason of an error row, else null
    ]
)


# Staged rows are JSON and places that repeat from row to row: zstd makes them about 18 times smaller (432 MB of
# rows from an 83 MB OTLP protobuf file -> 23 MB) for about a quarter more CPU than writing them plain, and the
# staging area is read and written once per round over object storage.
_COMPRESSED = pa.ipc.IpcWriteOptions(compression="zstd")


def partition_of(key: str, partitions: int) -> int:
    """A stable hash (the same in every process, unlike `hash`) of `key`, mod `partitions`."""
    return zlib.crc32(key.encode("utf-8", "surrogatepass")) % partitions


def staging(run: str) -> str:
    return f"{run.rstrip('/')}/{STAGING}"


def partition_shards(source: RawSource, run: str, inputs: list[Shard], partitions: int, round_: int) -> list[Shard]:
    """The partitions of round `round_` as shards: what scoring (or the next round) runs over. Their fingerprint
    covers every input shard, so any change to the night's files shows in every partition."""
    digest = hashlib.sha1(f"{partitions}\n{round_}".encode())
    for s in inputs:
        digest.update(f"{s.file.url}\n{s.file.fingerprint}\n{s.start}\n{s.stop}\n".encode())
    size = sum(s.file.size for s in inputs if s.whole_file) + sum(
        (s.stop or s.file.size) - s.start for s in inputs if not s.whole_file
    )
    fingerprint = f"{size}-{digest.hexdigest()[:12]}"
    return [
        Shard(
            InputFile(
                f"{source.fmt} partition {p + 1} of {partitions}", "partition", None, size // partitions, fingerprint
            ),
            p,
            p + 1,
        )
        for p in range(partitions)
    ]


def map_shard(source: RawSource, run: str, shard: Shard, partitions: int, rounds: int, shard_bytes: int) -> int:
    """Round 1 over one input shard: its items written to their partitions (of round 2 when the format regroups,
    else of scoring), holding at most SPILL_AFTER_SHARDS × `shard_bytes` of rows at once. Returns how many rows it
    wrote."""
    rows: dict[int, list[tuple[Any, ...]]] = {}
    held = written = 0
    with _Spill() as spill:
        for location, item in shuffle_items(source, shard):
            where = f"{shard.file.url} {location}".rstrip()
            if isinstance(item, RecordError):
                row = (where, 0, "", item.raw.encode(), where, item.reason)
            else:
                key, (start, item_id), payload = item
                try:
                    data = orjson.dumps(payload)
                except TypeError as exc:  # an integer past 64 bits: the item cannot be staged
                    row = (where, 0, "", b"", where, f"{source.fmt}: {where}: cannot be staged: {exc}")
                else:
                    row = (key, start, item_id, data, where, None)
            rows.setdefault(partition_of(row[0], partitions), []).append(row)
            written += 1
            held += len(row[0]) + len(row[3]) + 2 * len(where) + _ROW_BYTES
            if held >= SPILL_AFTER_SHARDS * shard_bytes:
                spill.add(rows)
                rows, held = {}, 0
        round_ = 1 if rounds == 2 else 2
        _write(run, round_, shard.key, spill.drained(rows), partitions, source.options.storage_options)
    return written


class _Spill:
    """Rows spilled to local disk: one Arrow file per spill, a record batch per partition in partition order."""

    def __init__(self) -> None:
        self.folder: str | None = None
        self.files: list[tuple[str, dict[int, int]]] = []  # (path, partition -> its batch in the file)

    def __enter__(self) -> _Spill:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)

    def add(self, rows: dict[int, list[tuple[Any, ...]]]) -> None:
        if not rows:
            return
        self.folder = self.folder or tempfile.mkdtemp(prefix="pexec-shuffle-")
        path = f"{self.folder}/{len(self.files):05d}.arrow"
        order = sorted(rows)
        with pa.OSFile(path, "wb") as f, pa.ipc.new_file(f, _SCHEMA, options=_COMPRESSED) as writer:
            for partition in order:
                writer.write_batch(_batch(rows[partition]))
        self.files.append((path, {partition: i for i, partition in enumerate(order)}))

    def drained(self, rows: dict[int, list[tuple[Any, ...]]]) -> Iterator[tuple[int, pa.RecordBatch]]:
        """(partition, its rows) for every partition that has rows, in partition order: from `rows` alone when
        nothing was spilled, else with `rows` spilled too, each partition gathered from every spill file. The files
        are read, not mapped (mapped pages would count in the task's resident memory), and opened one at a time: a
        large file cut into small shards spills thousands of them, past a process's open-file limit."""
        if not self.files:
            yield from ((partition, _batch(rows[partition])) for partition in sorted(rows))
            return
        self.add(rows)
        for partition in sorted({p for _, index in self.files for p in index}):
            batches = []
            for path, index in self.files:
                if partition in index:
                    with pa.OSFile(path) as f:
                        batches.append(pa.ipc.open_file(f).get_batch(index[partition]))
            yield partition, pa.concat_batches(batches)


def regroup_partition(source: RawSource, run: str, shard: Shard, partitions: int) -> int:
    """Round 2 over one partition: every key group regrouped by the format (`Shuffle.regroup`), each item written
    to the partition of its new key."""
    shuffle = source.shuffle
    assert shuffle is not None and shuffle.regroup is not None
    out: dict[int, list[tuple[Any, ...]]] = {}
    for key, table in _groups(_read(run, 1, shard.start, source.options.storage_options)):
        cols = table.to_pydict()
        if key is None:  # error rows keep their place
            for row in zip(*cols.values(), strict=True):
                out.setdefault(partition_of(row[0], partitions), []).append(row)
            continue
        where = cols["location"][0]
        for new_key, item in shuffle.regroup(key, [orjson.loads(p) for p in cols["payload"]]):
            row = (new_key, item["start"], item["span_id"], orjson.dumps(item), where, None)
            out.setdefault(partition_of(new_key, partitions), []).append(row)
    batches = ((partition, _batch(out[partition])) for partition in sorted(out))
    _write(run, 2, f"from-{shard.start:05d}", batches, partitions, source.options.storage_options)
    return sum(len(r) for r in out.values())


def read_partition(source: RawSource, run: str, shard: Shard) -> Iterator[tuple[str, dict[str, Any] | RecordError]]:
    """The rollouts of one final partition, a group at a time, in key order; an error row is a RecordError at
    its own place, and a group the format cannot assemble is one at `key KEY`."""
    shuffle = source.shuffle
    assert shuffle is not None
    for key, table in _groups(_read(run, 2, shard.start, source.options.storage_options)):
        cols = table.to_pydict()
        if key is None:
            for location, payload, error in zip(cols["location"], cols["payload"], cols["error"], strict=True):
                yield location, RecordError(error, payload.decode("utf-8", "replace"))
            continue
        try:
            yield f"key {key}", shuffle.assemble(key, [orjson.loads(p) for p in cols["payload"]], source.options)
        except IngestError as exc:
            yield f"key {key}", RecordError(str(exc), "")


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


def _batch(rows: list[tuple[Any, ...]]) -> pa.RecordBatch:
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


def _write(
    run: str,
    round_: int,
    name: str,
    batches: Iterable[tuple[int, pa.RecordBatch]],
    partitions: int,
    storage: dict[str, Any] | None,
) -> None:
    """One task's output of a round (`batches`: the partitions that have rows, in partition order) as one object."""
    offsets = []
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


def _read(run: str, round_: int, partition: int, storage: dict[str, Any] | None) -> pa.Table:
    """Partition `partition` of a round: its stream from every task's object."""
    found = list_files(_round(run, round_), storage, patterns=["*.shuffle"], max_depth=1) or {}
    fs, folder = filesystem(_round(run, round_), storage)  # once: every object is a file of this folder
    tables = []
    for url, info in found.items():
        path, size = f"{folder}/{url.rsplit('/', 1)[1]}", int(info["size"])
        start, stop = _range_of(path, _trailer(path, size, fingerprint(size, info), fs), partition)
        if stop > start:
            tables.append(pa.ipc.open_stream(fs.cat_file(path, start=start, end=stop)).read_all())
    return pa.concat_tables(tables) if tables else _SCHEMA.empty_table()


def _trailer(path: str, size: int, version: str, fs: Any) -> bytes:
    """The trailer of the object at `path` (`size` bytes, `version` its fingerprint), from this process's cache or
    read from the object's end."""
    key = (path, version)
    if (cached := _trailers.get(key)) is not None:
        _trailers.move_to_end(key)
        return cached
    tail = fs.cat_file(path, start=max(0, size - _TAIL), end=size)
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


def _range_of(path: str, trailer: bytes, partition: int) -> tuple[int, int]:
    """Where partition `partition`'s stream is in the object at `path`, from the object's `trailer`."""
    (partitions,) = struct.unpack_from("<q", trailer, len(trailer) - len(_MAGIC) - 8)
    if not 0 <= partition < partitions:
        raise OSError(f"{path}: holds {partitions} partitions, not partition {partition}")
    start, stop = struct.unpack_from("<2q", trailer, 8 * partition)
    return start, stop
