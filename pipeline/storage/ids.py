"""Rollout ids are unique per run (docs/explanation/data-model.md, "Stores and shards"): find every id carried by more
than one record of a store, within a file or across files, from the ids each shard's records carry.

The rule: the first copy in source order (files by URL, then their order within the file) is scored; every
later copy is rejected with "duplicate rollout_id '…' (first at FILE LOCATION)", LOCATION as a whole-file read
names it. A record counts as a copy when it carries a valid id, even if it is rejected for another reason.
The outcome does not depend on how the store is cut into shards: each shard is told, for the duplicated ids
it holds, where the first copy is and how many copies come before the shard.

Scoring a shard returns its ids (pipeline.scoring.shard), so finding duplicates costs no read of its own: a shard
scored before they were known is scored again when it was told other than what is found here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from itertools import groupby
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from pipeline.core.records import record_id
from pipeline.storage.inputs import InputFile, RecordError, Shard, line_numbers, read_shard

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


def shard_ids(shard: Shard, storage_options: dict[str, Any] | None = None) -> pa.Table:
    """The ids of a shard's records, read as scoring reads them (for a shard whose committed output is reused)."""
    return ids_table(
        (location, rid)
        for location, record in read_shard(shard, storage_options)
        if not isinstance(record, RecordError) and (rid := record_id(record)) is not None
    )


def duplicate_ids(
    shards: Sequence[Shard], ids: Mapping[str, pa.Table], storage_options: dict[str, Any] | None = None
) -> Duplicates:
    """What each shard needs to apply the rule, for the shards of a plan (in source order) and their ids
    (`ids_table`s by shard key).

    A shard is only told about an id when the rule rejects one of its copies, so the shard holding the one
    first copy of an id is unaffected by later copies (and stays reusable)."""
    # In bulk, without copying the ids: which occur more than once; then, shard by shard in source order, the
    # copies of those only.
    rids = pa.chunked_array([chunk for s in shards for chunk in ids[s.key]["rollout_id"].chunks], pa.string())
    counts = pa.table({"rollout_id": rids}).group_by("rollout_id").aggregate([("rollout_id", "count")])
    repeated = counts.filter(pc.greater(counts["rollout_id_count"], 1))["rollout_id"]
    first: dict[str, tuple[int, str]] = {}  # id -> (index of its shard, location) of its first copy
    seen_in: dict[str, list[int]] = {}  # duplicated id -> the shard index of each of its copies, in order
    for index, shard in enumerate(shards if len(repeated) else ()):
        table = ids[shard.key]
        copies = table.filter(pc.is_in(table["rollout_id"], value_set=repeated)).to_pydict()
        for location, rid in zip(copies["location"], copies["rollout_id"], strict=True):
            first.setdefault(rid, (index, location))
            seen_in.setdefault(rid, []).append(index)
    where = _whole_file_names(list(first.values()), shards, storage_options)
    out: Duplicates = {}
    for rid, indexes in seen_in.items():
        before = 0
        for i, group in groupby(indexes):  # shard indexes in source order
            copies_here = len(list(group))
            if before or copies_here > 1:
                out.setdefault(shards[i].key, {})[rid] = (where[first[rid]], before)
            before += copies_here
    return out


def _whole_file_names(
    firsts: Sequence[tuple[int, str]], shards: Sequence[Shard], storage_options: dict[str, Any] | None
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
