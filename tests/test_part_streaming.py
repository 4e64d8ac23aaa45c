"""A shard's steps and rollouts past the held bound: spilled to local disk and streamed to its parts. The parts hold
the same rows as when they are held whole; below the bound they are the bytes one `write_table` gives."""

from __future__ import annotations

import hashlib
import os
import tempfile
from itertools import pairwise
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.core.arrow import pa
from pipeline.core.records import parse_rollout
from pipeline.core.run_schema import ROLLOUTS, STEPS
from pipeline.envs import get_environment
from pipeline.replay.checker import replay
from pipeline.scoring import shard as shard_module
from pipeline.scoring._held import HeldParts
from pipeline.scoring.driver import run_scoring
from pipeline.scoring.run_tables import combined, rollouts_table, steps_table
from pipeline.scoring.settings import ScoreSettings
from pipeline.storage.run import TABLES, read_manifest, write_part
from pipeline.storage.stores import write_store
from pipeline.synthetic.rollouts import synthesize


def _varied(i: int, record: dict[str, Any]) -> dict[str, Any]:
    """Labels, attributes and costs that only some batches of a shard carry (the parts' columns are their union)."""
    record["labels"] = {"model": "m"} if i < 400 else {"zeta": str(i % 7), "alpha": "a"}
    record["attributes"] = {"seed": str(i)} if i % 300 < 20 else {}
    record["cost"] = {"tokens": i} if i < 600 else {"dollars": i / 10}
    return record


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    records: list[dict[str, Any]] = [_varied(i, r) for i, r in enumerate(synthesize("shop", 1_100, 60, seed=5))]
    records.insert(7, {"rollout_id": "not-a-rollout"})  # a reject of its own
    records.insert(900, dict(records[500]))  # a second copy of an id: the later one is a reject
    out = tmp_path_factory.mktemp("held") / "store"
    write_store(iter(records), str(out), per_file=600)
    return out


def _score(store: Path, run: Path) -> dict[str, list[dict[str, Any]]]:
    manifest = run_scoring(str(store), str(run), ScoreSettings(inline=True, shard_mb=64))
    assert manifest.reconciled
    assert (manifest.counts.read, manifest.counts.scored, manifest.counts.rejected) == (1_102, 1_100, 2)
    rows = {}
    for table in TABLES:
        parts = sorted((run / table).glob("*.parquet"))
        rows[table] = [r for p in parts for r in pq.read_table(p).to_pylist()]
    return rows


def test_a_shard_spilled_past_a_tiny_bound_has_every_row_of_the_shard_held_whole(
    store: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = _score(store, tmp_path / "whole" / "run")
    spill_root = tmp_path / "tmp"
    spill_root.mkdir()
    monkeypatch.setattr(shard_module, "HELD_PART_SHARDS", 0)  # every batch spilled
    monkeypatch.setattr(tempfile, "tempdir", str(spill_root))
    spilled = _score(store, tmp_path / "spilled" / "run")
    assert spilled == whole  # every table, every row, every column, in order
    assert len(whole["steps"]) > 5_000  # each shard: several batches, whose label and attribute columns differ
    assert {"alpha", "zeta", "model", "attr_seed", "cost_tokens", "cost_dollars"} <= set().union(*whole["rollouts"])
    assert os.listdir(spill_root) == []  # the spill folders are gone
    for table in ("steps", "rollouts"):
        for part in (tmp_path / "spilled" / "run" / table).glob("*.parquet"):
            assert pq.read_metadata(part).num_row_groups > 1  # streamed: a row group per spilled batch
            held = pq.read_metadata(tmp_path / "whole" / "run" / table / part.name)
            assert held.num_row_groups == 1 and held.schema.to_arrow_schema() == pq.read_schema(part)
    markers = {s.shard: s for s in read_manifest(str(tmp_path / "spilled" / "run")).shards}
    assert markers
    for shard in markers.values():  # the streamed bytes were hashed as they were written
        for table in TABLES:
            data = (tmp_path / "spilled" / "run" / table / f"part-{shard.shard}.parquet").read_bytes()
            assert shard.parts[table] == len(data)
            assert shard.part_digests[table] == "sha256:" + hashlib.sha256(data).hexdigest()


@pytest.fixture(scope="module")
def results() -> list[Any]:
    env = get_environment("shop")
    records = [_varied(i * 97, r) for i, r in enumerate(synthesize("shop", 40, 9, seed=2))]
    return [replay(env, parse_rollout(r)) for r in records]


@settings(max_examples=30, deadline=None)
@given(cuts=st.lists(st.integers(1, 39), max_size=6, unique=True), limit=st.sampled_from([1, 30_000, 2**30]))
def test_held_parts_write_the_rows_of_the_batches_combined(results: list[Any], cuts: list[int], limit: int) -> None:
    bounds = [0, *sorted(cuts), len(results)]
    batches = [results[a:b] for a, b in pairwise(bounds)]
    with tempfile.TemporaryDirectory() as run, HeldParts({"steps": STEPS, "rollouts": ROLLOUTS}, limit) as held:
        for batch in batches:
            held.add({"steps": steps_table("r", batch), "rollouts": rollouts_table("r", batch)})
        if limit == 1:
            assert held.spilled
        elif limit == 2**30:
            assert not held.spilled
        written = held.write(run, "k", None)
        for name, build, table in (("steps", steps_table, STEPS), ("rollouts", rollouts_table, ROLLOUTS)):
            part = pq.read_table(f"{run}/{name}/part-k.parquet")
            expected = combined([build("r", b) for b in batches], table)
            assert part.schema == expected.schema
            assert part.to_pylist() == expected.to_pylist()
            assert written[name].rows == expected.num_rows
        folder = held.folder
    assert folder is None or not os.path.exists(folder)


def test_the_spill_folder_is_removed_when_the_shard_fails(results: list[Any]) -> None:
    with pytest.raises(RuntimeError), HeldParts({"steps": STEPS}, 1) as held:
        held.add({"steps": steps_table("r", results[:3])})
        held.add({"steps": steps_table("r", results[3:9])})
        folder = held.folder
        assert folder is not None and len(os.listdir(folder)) == 2
        raise RuntimeError("the shard failed")
    assert not os.path.exists(folder)


def test_a_part_written_whole_is_the_bytes_of_one_write_table(results: list[Any], tmp_path: Path) -> None:
    table = steps_table("r", results)
    expected = pa.BufferOutputStream()
    pq.write_table(table, expected, compression="zstd")
    data = expected.getvalue().to_pybytes()
    facts = write_part(str(tmp_path), "steps", "k", table)
    assert (tmp_path / "steps" / "part-k.parquet").read_bytes() == data
    assert (facts.size, facts.rows, facts.digest) == (
        len(data),
        table.num_rows,
        f"sha256:{hashlib.sha256(data).hexdigest()}",
    )
