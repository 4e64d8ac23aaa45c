"""The duplicate-id check in hash partitions (what Ray runs, pipeline.scoring.id_check) tells every shard exactly
what the check over every shard's ids in one process tells it (pipeline.storage.ids.duplicate_ids), for any
store, any cut into shards and any number of partitions."""

from __future__ import annotations

import itertools
from pathlib import Path

import pyarrow as pa
import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.scoring.id_check import RayIdCheck
from pipeline.storage.ids import (
    Copies,
    Duplicates,
    duplicate_ids,
    ids_table,
    partition_copies,
    partition_ids,
    shard_ids,
    told,
)
from pipeline.storage.inputs import list_inputs, plan_shards
from pipeline.storage.shards import InputFile, Shard


def in_partitions(shards: list[Shard], ids: dict[str, pa.Table], partitions: int) -> Duplicates:
    """The partitioned check in this process: every shard cut, each partition checked on its own."""
    cut = [partition_ids(ids[s.key], i, partitions) for i, s in enumerate(shards)]
    copies: dict[str, Copies] = {}
    for p in range(partitions):
        copies |= partition_copies([parts[p] for parts in cut])
    return told(copies, shards)


# A store: files of records, each record an id drawn from few names (so that copies are common) and its line.
files = st.lists(st.lists(st.integers(0, 12), max_size=15), min_size=1, max_size=4)


@st.composite
def cut_store(draw: st.DrawFn) -> tuple[list[Shard], dict[str, pa.Table]]:
    shards, ids = [], {}
    for f, records in enumerate(draw(files)):
        file = InputFile(f"mem://store/{f}.jsonl", "jsonl", None, len(records), str(len(records)))
        cuts = sorted(draw(st.sets(st.integers(0, len(records)), max_size=4)) | {0, len(records)})
        for start, stop in itertools.pairwise(cuts):
            shard = Shard(file, start, stop)
            shards.append(shard)
            ids[shard.key] = ids_table((f"line {i + 1}", f"r{records[i]}") for i in range(start, stop))
    return shards, ids


@pytest.mark.fuzz
@settings(max_examples=examples(50), deadline=None)
@given(store=cut_store(), partitions=st.integers(1, 6))
def test_partitions_tell_every_shard_what_the_whole_check_tells_it(
    store: tuple[list[Shard], dict[str, pa.Table]], partitions: int
) -> None:
    shards, ids = store
    assert in_partitions(shards, ids, partitions) == duplicate_ids(shards, ids)


def test_a_known_store() -> None:
    # One file, cut in two: r1 twice in the first shard, once in the second; r2 once in each.
    file = InputFile("mem://f.jsonl", "jsonl", None, 0, "0")
    first, second = Shard(file, 0, 3), Shard(file, 3, 5)
    ids = {
        first.key: ids_table([("line 1", "r1"), ("line 2", "r2"), ("line 3", "r1")]),
        second.key: ids_table([("line 4", "r1"), ("line 5", "r2")]),
    }
    expected = {
        first.key: {"r1": ("mem://f.jsonl line 1", 0)},
        second.key: {"r1": ("mem://f.jsonl line 1", 2), "r2": ("mem://f.jsonl line 2", 1)},
    }
    for partitions in (1, 2, 5):
        assert in_partitions([first, second], ids, partitions) == expected


def test_ray_reads_and_checks_the_ids_of_real_shards_as_one_process_does(tmp_path: Path, shared_ray: None) -> None:
    # Byte-range shards of plain JSON Lines: first copies are named by their line, as a whole-file read names them.
    lines = [f'{{"rollout_id": "r{i % 7}", "n": {i}}}' for i in range(40)] + ["not json", '{"rollout_id": "r3"}']
    (tmp_path / "a.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "b.jsonl").write_text('{"rollout_id": "r5"}\n{"rollout_id": "zz"}\n')
    files, _ = list_inputs(str(tmp_path))
    shards = plan_shards(files, 200)
    assert len(shards) > 5
    ids = {s.key: shard_ids(s) for s in shards}
    expected = duplicate_ids(shards, ids)
    assert any(where.endswith("line 4") for told_ in expected.values() for where, _ in told_.values())
    for partitions in (1, 3):
        check = RayIdCheck(shards, partitions)
        check.read(shard_ids, shards, None)
        assert check.duplicates() == expected


def test_every_shard_must_be_submitted_before_the_check(shared_ray: None) -> None:
    file = InputFile("mem://f.jsonl", "jsonl", None, 0, "0")
    with pytest.raises(ValueError, match="never submitted"):
        RayIdCheck([Shard(file, 0, 1)], 1).duplicates()
