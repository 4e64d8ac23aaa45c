"""What a run holds does not depend on how it was cut or how often it was rerun: rollout ids are unique per run
whatever the sharding (pipeline.storage.ids), and a shard is reused only while its parts are on disk as they
were committed."""

from __future__ import annotations

import gzip
import random
from pathlib import Path
from typing import NamedTuple

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from msgspec import structs
from typer.testing import CliRunner

from pipeline.apps.cli import app
from pipeline.core.run_folder import Manifest
from pipeline.scoring.driver import run_scoring
from pipeline.scoring.settings import ScoreSettings
from pipeline.storage.fs import open_whole
from pipeline.storage.inputs import line_numbers, list_inputs
from pipeline.storage.stores import write_store
from pipeline.synthetic.rollouts import synthesize

SHARD_SIZES = (64 * 2**20, 20_000, 3_000)  # one shard per file; a few per file; about one record per shard


def rows(run: Path, name: str, drop: tuple[str, ...] = ()) -> list[dict]:
    # Part by part: a shard without rows has no label columns, and a folder read takes its first file's schema.
    table = pa.concat_tables([pq.read_table(p) for p in sorted((run / name).iterdir())], promote_options="default")
    out = [{k: v for k, v in r.items() if k not in drop} for r in table.to_pylist()]
    return sorted(out, key=lambda r: orjson.dumps(r, option=orjson.OPT_SORT_KEYS))


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three files in three formats sharing ids: within each file and across them.

    a.jsonl:       40 rollouts a0..a39, then a second copy of a5 (label copy=2)
    b.jsonl.gz:    b0..b9, then copies of a7 and b3
    c.parquet:     c0..c29 with copies of a5 and b0 in the middle, in row groups of 8
    """
    root = tmp_path_factory.mktemp("dups")
    base = list(synthesize("shop", 80, 20, seed=9))

    def rec(i: int, rid: str, copy: int = 1) -> dict:
        return {**base[i], "rollout_id": rid, "labels": {**base[i]["labels"], "copy": str(copy)}}

    a = [rec(i, f"a{i}") for i in range(40)] + [rec(41, "a5", 2)]
    (root / "a.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in a))
    b = [rec(50 + i, f"b{i}") for i in range(10)] + [rec(60, "a7", 2), rec(61, "b3", 2)]
    (root / "b.jsonl.gz").write_bytes(gzip.compress(b"".join(orjson.dumps(r) + b"\n" for r in b)))
    c = (
        [rec(i, f"c{i}") for i in range(15)]
        + [rec(62, "a5", 3), rec(63, "b0", 2)]
        + [rec(i, f"c{i}") for i in range(15, 30)]
    )
    staging = root / ".parquet"
    write_store(iter(c), str(staging), fmt="parquet")
    pq.write_table(pq.read_table(staging / "part-00000.parquet"), root / "c.parquet", row_group_size=8)
    return root


@pytest.fixture(scope="module")
def runs(store: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[int, Scored]:
    """Per shard size: the run, its manifest and the shards in the order they reported (a shard twice when it
    was scored again)."""
    out = {}
    for size in SHARD_SIZES:
        run = tmp_path_factory.mktemp(f"size{size}") / "run"
        reports: list = []
        manifest = run_scoring(
            str(store), str(run), ScoreSettings(inline=True, shard_mb=size / 2**20), on_shard=reports.append
        )
        out[size] = Scored(run, manifest, [r.shard for r in reports])
    return out


class Scored(NamedTuple):
    run: Path
    manifest: Manifest
    reported: list[str]


def test_shard_sizes_really_differ(runs: dict[int, Scored]) -> None:
    shards = [s.manifest.counts.shards for s in runs.values()]
    assert shards[0] == 3 and shards[0] < shards[1] < shards[2]


def test_the_first_copy_by_source_order_is_scored_and_later_ones_rejected(store: Path, runs: dict[int, Scored]) -> None:
    for run, manifest, _ in runs.values():
        c = manifest.counts
        assert (c.read, c.scored, c.rejected) == (41 + 12 + 32, 80, 5)
        scored = rows(run, "rollouts")
        assert len({r["rollout_id"] for r in scored}) == 80
        assert {r["copy"] for r in scored} == {"1"}  # every scored copy is the first one
        reasons = sorted((Path(r["source"]).name, r["reason"]) for r in rows(run, "rejects"))
        a, b = store / "a.jsonl", store / "b.jsonl.gz"
        assert reasons == [
            ("a.jsonl", f"duplicate rollout_id 'a5' (first at {a} line 6)"),
            ("b.jsonl.gz", f"duplicate rollout_id 'a7' (first at {a} line 8)"),
            ("b.jsonl.gz", f"duplicate rollout_id 'b3' (first at {b} line 4)"),
            ("c.parquet", f"duplicate rollout_id 'a5' (first at {a} line 6)"),
            ("c.parquet", f"duplicate rollout_id 'b0' (first at {b} line 1)"),
        ]


def test_the_tables_do_not_depend_on_the_shard_size(runs: dict[int, Scored]) -> None:
    (first, _, _), *others = runs.values()
    for run, _, _ in others:
        assert rows(run, "steps") == rows(first, "steps")
        assert rows(run, "rollouts") == rows(first, "rollouts")
        # Which shard read a reject, and its location in plain JSON Lines (line N in a whole file, byte N in a
        # byte range), follow the plan; `raw` (the record itself) and the reason do not.
        assert rows(run, "rejects", drop=("shard", "location")) == rows(first, "rejects", drop=("shard", "location"))


def test_only_the_shards_holding_a_later_copy_are_scored_again(runs: dict[int, Scored]) -> None:
    # Ids are checked once every shard has returned its own: a shard is scored a second time only when the
    # store shows it a copy to reject, and the rejects say which shards those are.
    for run, manifest, reported in runs.values():
        twice = {key for key in reported if reported.count(key) == 2}
        assert twice == {r["shard"] for r in rows(run, "rejects") if r["reason"].startswith("duplicate rollout_id")}
        assert len(reported) == manifest.counts.shards + len(twice)


def test_ray_finds_the_same_copies_as_inline_whatever_order_the_shards_finish(
    store: Path, runs: dict[int, Scored], tmp_path: Path, shared_ray: None
) -> None:
    inline = runs[20_000].run
    run_scoring(str(store), str(tmp_path / "run"), ScoreSettings(shard_mb=20_000 / 2**20), run_id="run")
    for table in ("steps", "rollouts", "rejects"):
        assert rows(tmp_path / "run", table) == rows(inline, table)


def test_a_byte_offset_is_named_by_its_line_as_a_whole_file_read_names_it(tmp_path: Path) -> None:
    rng = random.Random(3)
    lines = [b"x" * rng.choice((0, 1, 70, 3_000, 200_000)) for _ in range(400)]  # > 1 MiB: several chunks
    path = tmp_path / "f.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    (file,) = list_inputs(str(path))[0]
    starts = [0]
    for line in lines[:-1]:
        starts.append(starts[-1] + len(line) + 1)
    asked = [*rng.sample(range(len(starts)), 60), 0, len(starts) - 1]
    found = line_numbers(file, [starts[i] for i in asked])
    assert found == {starts[i]: i + 1 for i in asked}


def test_a_rerun_reuses_shards_until_a_copy_of_their_ids_appears_earlier(store: Path, tmp_path: Path) -> None:
    local = tmp_path / "store"
    local.mkdir()
    for name in ("a.jsonl", "b.jsonl.gz"):
        (local / name).write_bytes((store / name).read_bytes())
    run = tmp_path / "run"
    run_scoring(str(local), str(run), ScoreSettings(inline=True))
    again = run_scoring(str(local), str(run), ScoreSettings(inline=True))
    assert again.counts.shards_reused == 2
    # A file sorting first now holds b1: b.jsonl.gz's copy of b1 becomes a later copy; a.jsonl is unaffected.
    b1 = next(r for r in rows(run, "rollouts") if r["rollout_id"] == "b1")
    source = orjson.loads(gzip.decompress((local / "b.jsonl.gz").read_bytes()).splitlines()[1])
    (local / "0.jsonl").write_bytes(orjson.dumps({**source, "labels": {"copy": "0"}}) + b"\n")
    third = run_scoring(str(local), str(run), ScoreSettings(inline=True))
    assert [(Path(s.source).name, s.reused) for s in third.shards] == [
        ("0.jsonl", False),
        ("a.jsonl", True),
        ("b.jsonl.gz", False),
    ]
    now = {r["rollout_id"]: r for r in rows(run, "rollouts")}
    assert now["b1"]["copy"] == "0" and b1["copy"] == "1"
    assert len(now) == 50 and third.counts.rejected == 4  # a5, a7, b3 and now b1


def damage_part(victim: Path, damage: str, other: Path) -> None:
    """Damage a committed part file as storage or a person could: the marker beside it is left as committed."""
    data = victim.read_bytes()
    if damage == "deleted":
        victim.unlink()
    elif damage == "replaced":  # another shard's rows under this shard's name: a valid Parquet file of another size
        victim.write_bytes(other.read_bytes())
    elif damage == "zeroed":  # 64 bytes zeroed in the middle: the same size, so no listing can tell
        middle = len(data) // 2
        victim.write_bytes(data[:middle] + bytes(64) + data[middle + 64 :])
    elif damage == "emptied":  # a valid Parquet file of the same columns and no rows
        pq.write_table(pq.read_table(victim).slice(0, 0), victim)
    elif damage == "truncated":
        victim.write_bytes(data[: len(data) // 2])
    assert damage == "deleted" or victim.read_bytes() != data


DAMAGES = ["deleted", "replaced", "zeroed", "emptied", "truncated"]


@pytest.mark.parametrize("damage", DAMAGES)
def test_a_shard_whose_part_changed_is_refused_by_readers_then_rescored_and_counts_match_the_tables(
    store: Path, tmp_path: Path, damage: str
) -> None:
    run = tmp_path / "run"
    first = run_scoring(str(store), str(run), ScoreSettings(inline=True, shard_mb=20_000 / 2**20))
    parts = sorted((run / "rollouts").iterdir())
    victim = parts[1]
    damage_part(victim, damage, parts[2])
    # Read before the rerun: one line naming the part, exit 2, no number printed from it.
    result = CliRunner().invoke(app, ["metrics", str(run), "--bootstrap", "20"])
    assert result.exit_code == 2, result.output
    assert result.output.startswith("error: ") and victim.name in result.output and "Traceback" not in result.output
    expected = "are missing" if damage == "deleted" else f"damaged part {victim}"
    assert expected in result.output.replace("\n", " ")
    again = run_scoring(str(store), str(run), ScoreSettings(inline=True, shard_mb=20_000 / 2**20))
    rescored = [s.shard for s in again.shards if not s.reused]
    assert rescored == [victim.name.removeprefix("part-").removesuffix(".parquet")]
    why = {s.shard: s.why for s in again.reuse.shards}[rescored[0]]
    assert why.startswith("its rollouts part changed since it was committed: "), why
    if damage in ("deleted", "zeroed"):  # the one a size cannot tell says so
        assert why.endswith("missing" if damage == "deleted" else "was recorded)"), why
    counts = again.counts
    assert counts == structs.replace(first.counts, shards_reused=counts.shards - 1)
    assert (counts.scored, counts.steps, counts.rejected) == (
        len(rows(run, "rollouts")),
        len(rows(run, "steps")),
        len(rows(run, "rejects")),
    )
    assert len({r["rollout_id"] for r in rows(run, "rollouts")}) == counts.scored
    assert CliRunner().invoke(app, ["metrics", str(run), "--bootstrap", "20"]).exit_code == 0


def test_a_commit_point_is_seen_whole_or_not_at_all(tmp_path: Path) -> None:
    """Another process may list and read the run while a marker or the manifest is written (a partial read, a
    test's watcher): on a local disk the file appears only once its bytes are all there, and a write that fails
    leaves neither the file nor its temporary."""
    target = tmp_path / "_shards" / "0001.json"
    with open_whole(str(target)) as f:
        f.write(b'{"half": ')
        assert [p.name for p in target.parent.iterdir() if not p.name.startswith(".")] == []
        f.write(b"1}")
    assert target.read_bytes() == b'{"half": 1}'
    with pytest.raises(RuntimeError), open_whole(str(target)) as f:
        f.write(b"{")
        raise RuntimeError("the process is interrupted mid-write")
    assert target.read_bytes() == b'{"half": 1}' and sorted(p.name for p in target.parent.iterdir()) == ["0001.json"]
