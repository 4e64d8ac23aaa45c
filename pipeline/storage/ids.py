"""Rollout ids are unique per run (docs/explanation/data-model.md, "Stores and shards"): find every id carried by more
than one record of a store, within a file or across files, from the ids each shard's records carry.

The rule: the first copy in source order (files by URL, then their order within the file) is scored; every
later copy is rejected with "duplicate rollout_id '…' (first at FILE LOCATION)", LOCATION as a whole-file read
names it. A record counts as a copy when it carries a valid id, even if it is rejected for another reason.
The outcome does not depend on how the store is cut into shards: each shard is told, for the duplicated ids
it holds, where the first copy is and how many copies come before the shard.

Scoring a shard returns its ids (pipeline.scoring.shard), so finding duplicates costs no read of its own: a shard
scored before they were known is scored again when it was told other than what is found here.

Two ways to find them, with one outcome: `duplicate_ids` over every shard's ids in one process (the inline
executor), or in hash partitions (what Ray runs, pipeline.scoring.id_check): `partition_ids` cuts each shard's ids
by a hash of the id, `partition_copies` finds the repeated ids of one partition with where their copies are, and
`told` turns those copies into what each shard is told. A partition's memory is bounded by its share of the ids,
and only the duplicates leave it.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import orjson
import pyarrow.compute as pc

from pipeline.core.arrow import pa
from pipeline.core.records import record_id
from pipeline.storage.fs import StorageOptions
from pipeline.storage.inputs import line_numbers, read_shard
from pipeline.storage.shards import InputFile, RecordError, Shard

# shard key -> {rollout id -> (where the first copy is, copies of the id in earlier shards)}
Duplicates = dict[str, dict[str, tuple[str, int]]]

_BYTE = "byte "  # how a record of a byte-range shard is located (pipeline.storage.inputs.read_shard)
_SCHEMA = pa.schema([("location", pa.string()), ("rollout_id", pa.string())])


def ids_table(ids: Iterable[tuple[str, str]]) -> pa.Table:
    """(location, rollout id) of every record of a shard that carries a valid id, in shard order, as the
    columns `location` and `rollout_id`: compact to return from a task, and checked in bulk."""
    pairs = list(ids)
    return pa.table([pa.array([p[0] for p in pairs], pa.string()), pa.array([p[1] for p in pairs], pa.string())],
                    schema=_SCHEMA)  # fmt: skip


def shard_ids(shard: Shard, storage_options: StorageOptions | None = None) -> pa.Table:
    """The ids of a shard's records, read as scoring reads them (for a shard whose committed output is reused)."""
    return ids_table(
        (location, rid)
        for location, record in read_shard(shard, storage_options)
        if not isinstance(record, RecordError) and (rid := record_id(record)) is not None
    )


def duplicate_ids(
    shards: Sequence[Shard], ids: Mapping[str, pa.Table], storage_options: StorageOptions | None = None
) -> Duplicates:
    """What each shard needs to apply the rule, for the shards of a plan (in source order) and their ids
    (`ids_table`s by shard key), all in this process (the inline executor; Ray checks them in hash partitions,
    `partition_ids` and `partition_copies`, with the same outcome).

    A shard is only told about an id when the rule rejects one of its copies, so the shard holding the one
    first copy of an id is unaffected by later copies (and stays reusable)."""
    # In bulk, without copying the ids: which occur more than once; then, shard by shard in source order, the
    # copies of those only.
    rids = pa.chunked_array([chunk for s in shards for chunk in ids[s.key]["rollout_id"].chunks], pa.string())
    counts = pa.table({"rollout_id": rids}).group_by("rollout_id").aggregate([("rollout_id", "count")])
    repeated = counts.filter(pc.greater(counts["rollout_id_count"], 1))["rollout_id"]
    copies: dict[str, Copies] = {}
    for index, shard in enumerate(shards if len(repeated) else ()):
        table = ids[shard.key]
        found = table.filter(pc.is_in(table["rollout_id"], value_set=repeated)).to_pydict()
        for location, rid in zip(found["location"], found["rollout_id"], strict=True):
            _add_copy(copies, rid, index, location)
    return told(copies, shards, storage_options)


@dataclass(frozen=True)
class Copies:
    """Where the copies of one repeated id are: its first copy (shard index in source order, location in that
    shard) and how many copies each shard holding one has, shards in source order."""

    first: tuple[int, str]
    per_shard: list[tuple[int, int]]  # (shard index, copies in it)


def _add_copy(copies: dict[str, Copies], rid: str, index: int, location: str) -> None:
    """Count one more copy of `rid`, copies coming in source order."""
    found = copies.get(rid)
    if found is None:
        copies[rid] = Copies((index, location), [(index, 1)])
    elif found.per_shard[-1][0] == index:
        found.per_shard[-1] = (index, found.per_shard[-1][1] + 1)
    else:
        found.per_shard.append((index, 1))


def told(
    copies: Mapping[str, Copies], shards: Sequence[Shard], storage_options: StorageOptions | None = None
) -> Duplicates:
    """Duplicates from the copies of every repeated id: a shard is told about an id when a copy it holds is not
    the first (earlier shards hold one, or it holds several)."""
    where = _whole_file_names([c.first for c in copies.values()], shards, storage_options)
    out: Duplicates = {}
    for rid, found in copies.items():
        before = 0
        for index, copies_here in found.per_shard:
            if before or copies_here > 1:
                out.setdefault(shards[index].key, {})[rid] = (where[found.first], before)
            before += copies_here
    return out


_PARTITION_SCHEMA = pa.schema([("shard", pa.int32()), ("location", pa.string()), ("rollout_id", pa.string())])


def partition_ids(ids: pa.Table, index: int, partitions: int) -> list[pa.Table]:
    """A shard's ids (`ids_table`, the shard at `index` in source order) cut into `partitions` tables by a hash
    of the rollout id, each in shard order with the shard's index: every copy of an id, whatever shard holds
    it, lands in the same partition, so each partition is checked on its own."""
    rids = ids["rollout_id"].to_pylist()
    part = pa.array([zlib.crc32(rid.encode()) % partitions for rid in rids], pa.int32())
    shard = pa.array(np.full(len(rids), index, dtype=np.int32))
    keyed = pa.table([shard, ids["location"], ids["rollout_id"]], schema=_PARTITION_SCHEMA)
    order = pc.sort_indices(part)  # stable: shard order within each partition
    keyed, sizes = keyed.take(order), np.bincount(part.to_numpy(), minlength=partitions)
    starts = np.concatenate([[0], np.cumsum(sizes)])
    return [keyed.slice(int(starts[p]), int(sizes[p])) for p in range(partitions)]


def partition_copies(tables: Sequence[pa.Table]) -> dict[str, Copies]:
    """The copies of every id repeated within one partition, from every shard's part of it in source order
    (`partition_ids`); only repeated ids, so what comes back is as small as the duplicates."""
    keyed = pa.concat_tables([t.cast(_PARTITION_SCHEMA) for t in tables]) if tables else _PARTITION_SCHEMA.empty_table()
    counts = keyed.group_by("rollout_id").aggregate([("rollout_id", "count")])
    repeated = counts.filter(pc.greater(counts["rollout_id_count"], 1))["rollout_id"]
    found = keyed.filter(pc.is_in(keyed["rollout_id"], value_set=repeated))
    found = found.take(pc.sort_indices(found["shard"])).to_pydict()  # a stable sort: shard order kept within
    copies: dict[str, Copies] = {}
    for index, location, rid in zip(found["shard"], found["location"], found["rollout_id"], strict=True):
        _add_copy(copies, rid, index, location)
    return copies


def _whole_file_names(
    firsts: Sequence[tuple[int, str]], shards: Sequence[Shard], storage_options: StorageOptions | None
) -> dict[tuple[int, str], str]:
    """ "FILE LOCATION" of each (shard index, location), a byte range's "byte N" turned into the "line N" of
    a whole-file read (one pass over each file that needs it, only when some first copy lies in a range)."""
    offsets: dict[str, tuple[InputFile, list[int]]] = {}  # file URL -> the file, offsets to name as lines
    for index, location in firsts:
        if location.startswith(_BYTE):
            file = shards[index].file
            offsets.setdefault(file.url, (file, []))[1].append(int(location.removeprefix(_BYTE)))
    lines = {url: line_numbers(file, found, storage_options) for url, (file, found) in offsets.items()}
    out = {}
    for index, location in firsts:
        url = shards[index].file.url
        named = f"line {lines[url][int(location.removeprefix(_BYTE))]}" if location.startswith(_BYTE) else location
        out[index, location] = f"{url} {named}"
    return out


def digest(duplicates: dict[str, tuple[str, int]]) -> str:
    """A short fingerprint of one shard's duplicate ids ("" for none): part of what decides its reuse."""
    if not duplicates:
        return ""
    return hashlib.sha1(orjson.dumps(duplicates, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]
