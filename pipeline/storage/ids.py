"""Rollout ids are unique per run (docs/design.md §4): the id pass that finds every id carried by more than one
record of a store, within a file or across files, before any shard is scored.

The rule: the first copy in source order (files by URL, then their order within the file) is scored; every
later copy is rejected with "duplicate rollout_id '…' (first at FILE LOCATION)". A record counts as a copy
when it carries a valid id, even if it is rejected for another reason. The outcome does not depend on how
the store is cut into shards: each shard is told, for the duplicated ids it holds, where the first copy is
and how many copies come before the shard.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_right
from collections.abc import Sequence
from itertools import groupby
from typing import Any

import orjson

from pipeline.storage.inputs import Shard, read_ids

# shard key -> {rollout id -> (where the first copy is, copies of the id in earlier shards)}
Duplicates = dict[str, dict[str, tuple[str, int]]]


def duplicate_ids(shards: Sequence[Shard], storage_options: dict[str, Any] | None = None) -> Duplicates:
    """What each shard needs to apply the rule, for the shards of a plan (in source order).

    A shard is only told about an id when the rule rejects one of its copies, so the shard holding the one
    first copy of an id is unaffected by later copies (and stays reusable)."""
    first: dict[str, tuple[int, str]] = {}  # id -> (index of its shard, location) of its first copy
    seen_in: dict[str, list[int]] = {}  # duplicated id -> the shard index of each of its copies, in order
    begin = 0
    for _, file_shards in groupby(shards, key=lambda s: s.file.url):
        ordered = list(file_shards)
        stops = [s.stop for s in ordered[:-1]]  # every shard of a file but the last has a stop
        for location, position, rid in read_ids(ordered[0].file, storage_options):
            # The shard owning the record: the first whose stop lies beyond its position.
            index = begin + bisect_right(stops, position)
            if rid not in first:
                first[rid] = (index, location)
            else:
                seen_in.setdefault(rid, [first[rid][0]]).append(index)
        begin += len(ordered)
    out: Duplicates = {}
    for rid, indexes in seen_in.items():
        index, location = first[rid]
        where = f"{shards[index].file.url} {location}"
        before = 0
        for i, group in groupby(indexes):
            copies = len(list(group))
            if before or copies > 1:
                out.setdefault(shards[i].key, {})[rid] = (where, before)
            before += copies
    return out


def digest(duplicates: dict[str, tuple[str, int]]) -> str:
    """A short fingerprint of one shard's duplicate ids ("" for none): part of what decides its reuse."""
    if not duplicates:
        return ""
    return hashlib.sha1(orjson.dumps(duplicates, option=orjson.OPT_SORT_KEYS)).hexdigest()[:16]
