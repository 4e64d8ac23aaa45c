"""The run folder's JSON as a typed, versioned contract: every file round-trips through its type, a folder written
before the version was recorded is read as layout 1, and one from a newer pexec is refused in one line by every
reader and by a rescore (until --force), never read as if its fields meant the same."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from pipeline.apps.cli import app
from pipeline.core.errors import RunFolderError, UnknownLayout
from pipeline.core.run_folder import SCHEMA_VERSION, Manifest, Plan, ShardMarker, decode, encode
from pipeline.metrics.run import open_run
from pipeline.scoring.driver import run_scoring
from pipeline.scoring.settings import ScoreSettings
from pipeline.storage.run import read_manifest, read_plan, read_shard_markers
from pipeline.storage.stores import write_store
from pipeline.synthetic.rollouts import synthesize


@pytest.fixture(scope="module")
def scored(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(store, run): 120 synthetic rollouts in 3 files, scored inline."""
    root = tmp_path_factory.mktemp("folder")
    store, run = root / "store", root / "run"
    write_store(iter(synthesize("shop", 120, 12, 5)), str(store), per_file=40)
    run_scoring(str(store), str(run), ScoreSettings(inline=True))
    return store, run


def copy(run: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(run, out)
    return out


def rewrite(path: Path, change) -> None:
    doc = orjson.loads(path.read_bytes())
    change(doc)
    path.write_bytes(orjson.dumps(doc))


def cli(*args: str):
    return CliRunner().invoke(app, list(args))


def test_the_files_scoring_writes_read_back_as_their_types(scored: tuple[Path, Path]) -> None:
    store, run = scored
    manifest, plan, markers = read_manifest(str(run)), read_plan(str(run)), read_shard_markers(str(run))
    assert isinstance(manifest, Manifest) and isinstance(plan, Plan) and len(markers) == 3
    assert manifest.schema_version == plan.schema_version == SCHEMA_VERSION
    assert manifest.counts.read == manifest.counts.scored + manifest.counts.rejected == 120
    assert {m.shard: m for m in manifest.shards} == markers
    assert [s.shard for s in plan.shards] == [m.shard for m in manifest.shards]
    assert manifest.input.store == str(store) and manifest.settings.executor == "inline"
    on_disk = orjson.loads((run / "_manifest.json").read_bytes())
    assert on_disk["schema_version"] == 2 and on_disk["counts"]["scored"] == 120
    for marker in markers.values():  # each part's recorded size, rows and digest are those of the file on disk
        for table in ("steps", "rollouts", "rejects"):
            data = (run / table / f"part-{marker.shard}.parquet").read_bytes()
            assert marker.parts[table] == len(data)
            assert marker.part_digests[table] == "sha256:" + hashlib.sha256(data).hexdigest()
            assert marker.part_rows[table] == pq.read_metadata(pa.BufferReader(data)).num_rows
        assert marker.part_rows["rollouts"] == marker.scored and marker.part_rows["steps"] == marker.steps


def as_layout_1(doc: dict) -> None:
    """A layout 1 file as an earlier pexec wrote it: no part rows or digests, and (earlier still) no version."""
    for d in [doc, *doc.get("shards", [])]:
        for key in ("schema_version", "part_rows", "part_digests"):
            d.pop(key, None)


def test_a_folder_written_before_the_version_was_recorded_reads_as_layout_1(
    scored: tuple[Path, Path], tmp_path: Path
) -> None:
    store, original = scored
    run = copy(original, tmp_path)
    for path in [run / "_manifest.json", run / "_plan.json", *run.glob("_shards/*.json")]:
        rewrite(path, as_layout_1)
    assert "schema_version" not in (run / "_manifest.json").read_text()
    manifest = read_manifest(str(run))
    assert manifest is not None and manifest.schema_version == 1
    assert all(m.schema_version == 1 for m in manifest.shards)
    assert all(m.schema_version == 1 and not m.part_digests for m in read_shard_markers(str(run)).values())
    assert open_run(str(run)).snapshot.complete  # still read (its parts cannot be verified: `pexec verify` says so)
    again = run_scoring(str(store), str(run), ScoreSettings(inline=True))
    # Its markers cannot vouch for their parts: each shard is scored once more, to record them.
    assert again.counts.shards_reused == 0
    assert {s.shard: s.why for s in again.reuse.shards} == {
        m.shard: "its marker records no part digests (run folder layout 1): scored again to record them"
        for m in again.shards
    }
    assert again.schema_version == 2 and all(m.part_digests for m in again.shards)
    assert run_scoring(str(store), str(run), ScoreSettings(inline=True)).counts.shards_reused == 3


@pytest.mark.parametrize("file", ["_manifest.json", "_plan.json"])
def test_every_reader_refuses_a_newer_layout_in_one_line(scored: tuple[Path, Path], tmp_path: Path, file: str) -> None:
    _, original = scored
    run = copy(original, tmp_path)
    if file == "_plan.json":
        (run / "_manifest.json").unlink()  # an unfinished run: its plan is what says its coverage
    rewrite(run / file, lambda doc: doc.update(schema_version=3, new_field="?"))
    with pytest.raises(UnknownLayout, match=f"{file}: written by a newer pexec"):
        open_run(str(run), partial=True)
    for command in (["metrics", str(run), "--bootstrap", "20"], ["sql", str(run), "SELECT 1"]):
        result = cli(*command, "--partial")
        assert result.exit_code == 2, result.output
        line = f"error: {run / file}: written by a newer pexec (run folder layout 3; this pexec reads layouts up to 2)"
        assert result.output.replace("\n", " ").startswith(line) and "Traceback" not in result.output


def test_a_rescore_refuses_a_newer_marker_until_forced(scored: tuple[Path, Path], tmp_path: Path) -> None:
    store, original = scored
    run = copy(original, tmp_path)
    marker = sorted(run.glob("_shards/*.json"))[1]
    rewrite(marker, lambda doc: doc.update(schema_version=7))
    result = cli("score", str(store), "--out", str(run), "--inline")
    assert result.exit_code == 2 and "written by a newer pexec (run folder layout 7" in result.output
    assert (run / "_manifest.json").exists()  # refused before the run was touched
    forced = cli("score", str(store), "--out", str(run), "--inline", "--force")
    assert forced.exit_code == 0, forced.output
    assert orjson.loads(marker.read_bytes())["schema_version"] == 2


def test_a_damaged_manifest_makes_the_run_incomplete_and_a_damaged_marker_is_no_commit(
    scored: tuple[Path, Path], tmp_path: Path
) -> None:
    store, original = scored
    run = copy(original, tmp_path)
    (run / "_manifest.json").write_bytes((original / "_manifest.json").read_bytes()[:200])
    result = cli("metrics", str(run), "--bootstrap", "20")
    assert result.exit_code == 2 and "is not a finished run's manifest" in result.output
    marker = sorted(run.glob("_shards/*.json"))[0]
    rewrite(marker, lambda doc: doc.update(read="many"))
    assert len(read_shard_markers(str(run))) == 2
    again = run_scoring(str(store), str(run), ScoreSettings(inline=True))
    assert again.counts.shards_reused == 2 and again.counts.scored == 120


_NAMES = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=12)
_MARKERS = st.builds(
    ShardMarker,
    shard=_NAMES,
    source=_NAMES,
    start=st.integers(0, 2**62),
    stop=st.none() | st.integers(0, 2**62),
    fingerprint=_NAMES,
    read=st.integers(0, 2**40),
    scored=st.integers(0, 2**40),
    rejected=st.integers(0, 2**40),
    seconds=st.floats(0, 1e9),
    environments=st.dictionaries(_NAMES, st.none() | _NAMES, max_size=3),
    parts=st.dictionaries(_NAMES, st.integers(0, 2**40), max_size=3),
    part_rows=st.dictionaries(_NAMES, st.integers(0, 2**40), max_size=3),
    part_digests=st.dictionaries(_NAMES, _NAMES, max_size=3),
    reused=st.booleans(),
)


@settings(max_examples=examples(100), deadline=None)
@given(_MARKERS)
def test_a_marker_round_trips_and_a_changed_field_type_is_refused(marker: ShardMarker) -> None:
    assert decode(ShardMarker, encode(marker, indent=False), "m") == marker
    doc = orjson.loads(encode(marker))
    doc["start"] = str(doc["start"])
    with pytest.raises(RunFolderError, match=r"m: not a pexec run file of layout 2 \(Expected `int`, got `str`"):
        decode(ShardMarker, orjson.dumps(doc), "m")
