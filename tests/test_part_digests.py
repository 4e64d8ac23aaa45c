"""Every part verified: `pexec verify` checks each part of a run against the size, digest and rows its marker
recorded, lists the damaged ones and exits non-zero; a layout 1 run's parts are unverified, never reported as
verified; every reader (metrics, sql, report, the Python handle) refuses a damaged part on one line naming it and
the command that repairs it, and running that command restores the run's numbers exactly."""

from __future__ import annotations

import shlex
import shutil
from pathlib import Path

import orjson
import pytest
from conftest import s3_filesystem
from typer.testing import CliRunner

from pipeline.apps.cli import app
from pipeline.core.errors import PartDamaged
from pipeline.metrics.completeness import rescore_command
from pipeline.metrics.run import open_run
from pipeline.metrics.verify import verify_run
from pipeline.scoring.driver import run_scoring
from pipeline.scoring.settings import ScoreSettings
from pipeline.storage.fs import open_whole
from pipeline.storage.run import read_manifest
from pipeline.storage.stores import write_store
from pipeline.synthetic.rollouts import synthesize
from pipeline.synthetic.support_logs import write_samples

SHARDS = 4


@pytest.fixture(scope="module")
def scored(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(store, run): 200 synthetic rollouts in 4 files, scored inline (4 shards, 12 parts)."""
    root = tmp_path_factory.mktemp("digests")
    store, run = root / "store", root / "run"
    write_store(iter(synthesize("shop", 200, 20, 3)), str(store), per_file=50)
    run_scoring(str(store), str(run), ScoreSettings(inline=True))
    return store, run


def copy(run: Path, tmp_path: Path) -> Path:
    out = tmp_path / "run"
    shutil.copytree(run, out)
    return out


def cli(*args: str):
    return CliRunner().invoke(app, list(args))


def zero(path: Path, at: int = 4000, n: int = 64) -> None:
    data = bytearray(path.read_bytes())
    data[at : at + n] = bytes(n)
    path.write_bytes(bytes(data))


def as_layout_1(run: Path) -> None:
    """The run as an earlier pexec wrote it: markers and manifest without part rows and digests, layout 1."""
    for path in [run / "_manifest.json", run / "_plan.json", *run.glob("_shards/*.json")]:
        doc = orjson.loads(path.read_bytes())
        for d in [doc, *doc.get("shards", [])]:
            d.pop("part_rows", None)
            d.pop("part_digests", None)
            d["schema_version"] = 1
        path.write_bytes(orjson.dumps(doc))


def test_an_intact_run_verifies_every_part(scored: tuple[Path, Path]) -> None:
    _, run = scored
    found = verify_run(str(run))
    assert (found.runs, found.shards, found.parts, found.verified) == (1, SHARDS, 3 * SHARDS, 3 * SHARDS)
    assert found.ok and not found.damaged and not found.unverified
    result = cli("verify", str(run))
    assert result.exit_code == 0, result.output
    assert (
        result.output.strip()
        == f"{3 * SHARDS} parts of {SHARDS} shards: {3 * SHARDS} verified, 0 damaged, 0 unverified"
    )


def test_verify_lists_every_damaged_part_and_exits_2(scored: tuple[Path, Path], tmp_path: Path) -> None:
    store, original = scored
    run = copy(original, tmp_path)
    steps, rollouts, rejects = (sorted((run / t).iterdir()) for t in ("steps", "rollouts", "rejects"))
    zero(rollouts[0])  # same size
    steps[1].write_bytes(steps[1].read_bytes()[:100])  # cut short
    rejects[2].unlink()  # gone
    found = verify_run(str(run))
    assert {Path(d.url): d.problem.split(" ")[0] for d in found.damaged} == {
        rollouts[0]: "its",
        steps[1]: "100",
        rejects[2]: "missing",
    }
    assert found.verified == 3 * SHARDS - 3 and not found.unverified
    result = cli("verify", str(run))
    assert result.exit_code == 2, result.output
    lines = result.output.strip().splitlines()
    assert lines[0] == f"{3 * SHARDS} parts of {SHARDS} shards: {3 * SHARDS - 3} verified, 3 damaged, 0 unverified"
    assert sum(line.startswith("damaged: ") for line in lines) == 3 and "Traceback" not in result.output
    assert lines[-1] == (
        f"error: 3 of {3 * SHARDS} parts damaged; `pexec score {store} --out {run} "
        "--checks schema,dependency,precondition` rescores their shards"
    )
    # The repair it names restores every part (and the rerun scores only the three damaged shards).
    again = run_scoring(str(store), str(run), ScoreSettings(inline=True))
    assert again.counts.shards_reused == SHARDS - 3
    assert cli("verify", str(run)).exit_code == 0


def test_a_layout_1_run_is_unverified_not_verified_and_its_size_still_checked(
    scored: tuple[Path, Path], tmp_path: Path
) -> None:
    _, original = scored
    run = copy(original, tmp_path)
    as_layout_1(run)
    found = verify_run(str(run))
    assert found.verified == 0 and len(found.unverified) == 3 * SHARDS and not found.ok
    result = cli("verify", str(run))
    assert result.exit_code == 1, result.output
    assert "0 verified, 0 damaged, 12 unverified" in result.output and "no recorded digest" in result.output
    cut, broken = sorted((run / "steps").iterdir())[:2]
    size = cut.stat().st_size
    cut.write_bytes(cut.read_bytes()[:-10])  # its size was recorded in layout 1 too
    data = broken.read_bytes()
    broken.write_bytes(data[:-4] + bytes(4))  # the same size, the footer's magic bytes gone
    found = verify_run(str(run))
    assert {Path(d.url): d.problem for d in found.damaged} == {
        cut: f"{size - 10:,} bytes where {size:,} were written",
        broken: "not a readable Parquet file (Parquet magic bytes not found in footer. Either the file is corrupted "
        "or this is not a parquet file.)",
    }
    assert cli("verify", str(run)).exit_code == 2
    # Readers refuse them on one line too (before: DuckDB's traceback out of `sql` and `report`).
    for command in (
        ["sql", str(run), "SELECT count(*) FROM steps"],
        ["report", str(run), "--out", str(tmp_path / "report"), "--bootstrap", "20"],
    ):
        result = cli(*command)
        assert result.exit_code == 2, result.output
        assert any(result.output.startswith(f"error: damaged part {p}: ") for p in (cut, broken)), result.output
    cut.write_bytes((original / "steps" / cut.name).read_bytes())
    result = cli("report", str(run), "--out", str(tmp_path / "report"), "--bootstrap", "20")
    assert result.exit_code == 2, result.output
    assert result.output.startswith(f"error: damaged part {broken}: not a readable Parquet file")


@pytest.mark.parametrize("damage", ["zeroed", "truncated"])
def test_every_reader_refuses_a_damaged_part_in_one_line_and_the_repair_restores_the_numbers(
    scored: tuple[Path, Path], tmp_path: Path, damage: str
) -> None:
    store, original = scored
    run = copy(original, tmp_path)
    before = cli("metrics", str(run), "--bootstrap", "50", "--json")
    assert before.exit_code == 0, before.output
    victim = sorted((run / "rollouts").iterdir())[1]
    if damage == "zeroed":
        zero(victim)
    else:
        victim.write_bytes(victim.read_bytes()[: victim.stat().st_size // 2])
    line = f"error: damaged part {victim}: "
    repair = (
        f"`pexec score {store} --out {run} --checks schema,dependency,precondition` rescores its shard "
        f"(`pexec verify {run}` lists every damaged part)"
    )
    for command in (
        ["metrics", str(run), "--bootstrap", "50"],
        ["sql", str(run), "SELECT count(*) FROM rollouts"],
        ["report", str(run), "--out", str(tmp_path / "report"), "--bootstrap", "20"],
    ):
        result = cli(*command)
        assert result.exit_code == 2, (command, result.output)
        output = result.output.replace("\n", " ")
        assert output.startswith(line) and output.strip().endswith(repair), output
        assert "Traceback" not in result.output
    with pytest.raises(PartDamaged, match=victim.name):
        open_run(str(run)).rollouts()
    assert open_run(str(run)).steps().num_rows > 0  # a table whose parts are intact is still read
    run_scoring(str(store), str(run), ScoreSettings(inline=True))
    after = cli("metrics", str(run), "--bootstrap", "50", "--json")
    assert after.exit_code == 0 and after.output == before.output


def test_a_rerun_on_ray_rescores_the_shard_whose_part_was_zeroed(
    scored: tuple[Path, Path], tmp_path: Path, shared_ray: None
) -> None:
    store, original = scored
    run = copy(original, tmp_path)
    victim = sorted((run / "steps").iterdir())[2]
    zero(victim)
    again = run_scoring(str(store), str(run), ScoreSettings())
    assert [s.shard for s in again.shards if not s.reused] == [victim.stem.removeprefix("part-")]
    assert verify_run(str(run)).ok


def test_parts_on_an_s3_compatible_store_are_verified_refused_and_rescored(scored: tuple[Path, Path], s3: dict) -> None:
    store, _ = scored
    url = "s3://pexec-test/digests-run"
    run_scoring(str(store), url, ScoreSettings(inline=True, storage_options=s3))
    assert verify_run(url, s3).verified == 3 * SHARDS
    fs = s3_filesystem(s3)
    victim = sorted(fs.ls(f"{url.removeprefix('s3://')}/rollouts"))[0]
    data = bytearray(fs.cat(victim))
    data[4000:4064] = bytes(64)
    fs.pipe(victim, bytes(data))  # the same size: only the digest tells
    assert [d.url for d in verify_run(url, s3).damaged] == [f"s3://{victim}"]
    with pytest.raises(PartDamaged, match=f"damaged part s3://{victim}: its bytes changed"):
        open_run(url, s3).rollouts()
    again = run_scoring(str(store), url, ScoreSettings(inline=True, storage_options=s3))
    assert again.counts.shards_reused == SHARDS - 1 and verify_run(url, s3).ok


def test_a_write_that_fails_midway_leaves_no_object_on_an_s3_compatible_store(s3: dict) -> None:
    """A scoring task that fails while it streams a part (or writes a marker) to an object store abandons the
    upload: no object that looks written, no multipart upload left open; a write that ends uploads its bytes."""
    fs = s3_filesystem(s3)
    url = "s3://pexec-test/abandoned/part-0.parquet"
    block = b"x" * (6 * 2**20)  # past s3fs's 5 MiB block: the first block goes up as a multipart upload
    with pytest.raises(RuntimeError, match="mid-part"), open_whole(url, s3) as f:
        f.write(block)
        f.write(block)
        raise RuntimeError("the task fails mid-part")
    fs.invalidate_cache()
    assert not fs.exists(url)
    assert fs.call_s3("list_multipart_uploads", Bucket="pexec-test").get("Uploads", []) == []
    with open_whole(url, s3) as f:
        f.write(block)
    fs.invalidate_cache()
    assert fs.cat(url) == block


def test_the_repair_command_scores_as_the_run_was_scored(tmp_path: Path) -> None:
    """Followed as printed, the repair rescores under the run's own format, options, labels, environment, spec and
    checks: every other shard is reused (with other settings none would be, and the numbers would change)."""
    write_samples(tmp_path / "logs", ("2026-11-28", "2026-11-29"), per_date=10)
    run = tmp_path / "run with space"
    asked = ["--format", "openai", "--option", "error_prefix=Error:", "--option", "allow_no_calls=true",
             "--label", "team=a b", "--env", "observed",
             "--spec", "support", "--checks", "schema,precondition"]  # fmt: skip
    assert cli("score", str(tmp_path / "logs"), "--out", str(run), "--inline", *asked).exit_code == 0
    manifest = read_manifest(str(run))
    assert manifest is not None
    command = rescore_command(manifest, str(run))
    assert command.startswith(f"pexec score {tmp_path / 'logs'} --out '{run}' --format openai ")
    for said in ("--option error_prefix=Error:", "--label 'team=a b'", "--option allow_no_calls=true",
                 "--env observed --spec support",
                 "--checks schema,precondition"):  # fmt: skip
        assert said in command
    victim = sorted((run / "rollouts").iterdir())[0]
    zero(victim)
    again = cli(*shlex.split(command)[1:], "--inline")
    assert again.exit_code == 0, again.output
    assert "1 of 2 shard(s) reused" in again.output
