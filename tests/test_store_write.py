"""Writing canonical stores (pipeline.storage.stores): refused into a non-empty folder unless overwriting or
appending, staged and published whole, and a failure leaves the old store as it was — on a local disk and
on the moto S3 server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.apps.cli import app
from pipeline.core.errors import StoreExists
from pipeline.storage.fs import filesystem, list_files
from pipeline.storage.inputs import list_inputs, plan_shards, read_shard
from pipeline.storage.stores import write_store
from pipeline.synthetic.rollouts import synthesize


@pytest.fixture(params=["local", pytest.param("s3", marks=pytest.mark.server)])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[str, dict | None]:
    if request.param == "local":
        return str(tmp_path / "store"), None
    return f"s3://pexec-test/{tmp_path.name}/store", request.getfixturevalue("s3")


def records(n: int, seed: int = 0) -> list[dict]:
    return list(synthesize("shop", n, 10, seed=seed))


def snapshot(store: str, storage: dict | None) -> dict[str, bytes]:
    """Every file under the store, hidden ones included, with its bytes."""
    fs, root = filesystem(store, storage)
    fs.invalidate_cache()
    if not fs.exists(root):
        return {}
    return {p.removeprefix(root.rstrip("/") + "/"): fs.cat_file(p) for p in fs.find(root)}


def ids(store: str, storage: dict | None) -> list[str]:
    files, _ = list_inputs(store, storage)
    return [r["rollout_id"] for s in plan_shards(files, storage_options=storage) for _, r in read_shard(s, storage)]


def test_a_non_empty_store_is_refused_and_left_alone(where: tuple[str, dict | None]) -> None:
    store, storage = where
    write_store(iter(records(30)), store, per_file=10, storage_options=storage)
    before = snapshot(store, storage)
    with pytest.raises(StoreExists, match=r"already holds 3 file\(s\) .*--overwrite .* --append"):
        write_store(iter(records(5, seed=1)), store, storage_options=storage)
    assert snapshot(store, storage) == before


def test_overwrite_replaces_every_old_file(where: tuple[str, dict | None]) -> None:
    store, storage = where
    write_store(iter(records(30)), store, per_file=10, storage_options=storage)
    new = records(12, seed=1)
    assert write_store(iter(new), store, per_file=10, storage_options=storage, mode="overwrite") == 12
    assert sorted(snapshot(store, storage)) == ["part-00000.jsonl", "part-00001.jsonl"]
    assert ids(store, storage) == [r["rollout_id"] for r in new]


def test_append_adds_files_whose_names_never_collide(where: tuple[str, dict | None]) -> None:
    store, storage = where
    first, second, third = records(20), records(15, seed=1), records(5, seed=2)
    write_store(iter(first), store, per_file=10, storage_options=storage)
    write_store(iter(second), store, per_file=10, storage_options=storage, mode="append")
    write_store(iter(third), store, per_file=10, storage_options=storage, mode="append")
    names = sorted(snapshot(store, storage))
    assert len(names) == 2 + 2 + 1 and names[:2] == ["part-00000.jsonl", "part-00001.jsonl"]
    # Later appends sort after earlier ones: the store reads back in write order.
    assert ids(store, storage) == [r["rollout_id"] for r in first + second + third]
    with pytest.raises(StoreExists, match=r"--append writes parquet but .* holds files of another format"):
        write_store(iter(third), store, fmt="parquet", storage_options=storage, mode="append")


@pytest.mark.parametrize("mode", ["overwrite", "append"])
@pytest.mark.parametrize("failure", [ValueError("bad record 25"), KeyboardInterrupt()], ids=["error", "ctrl-c"])
def test_a_failure_mid_write_leaves_the_old_store_and_no_partial_new_one(
    where: tuple[str, dict | None], mode: str, failure: BaseException
) -> None:
    store, storage = where
    write_store(iter(records(30)), store, per_file=10, storage_options=storage)
    before = snapshot(store, storage)

    def failing() -> Iterator[dict]:
        yield from records(25, seed=1)  # two full files of 10 are staged before the failure
        raise failure

    with pytest.raises(type(failure)):
        write_store(failing(), store, per_file=10, storage_options=storage, mode=mode)  # type: ignore[arg-type]
    assert snapshot(store, storage) == before  # no staging folder left either


def test_synth_and_ingest_refuse_a_non_empty_store_in_one_line(tmp_path: Path) -> None:
    runner = CliRunner()
    store = str(tmp_path / "store")
    assert runner.invoke(app, ["synth", "shop", "--rollouts", "20", "--out", store]).exit_code == 0
    again = runner.invoke(app, ["synth", "shop", "--rollouts", "20", "--out", store])
    assert again.exit_code == 2
    assert again.output.startswith(f"error: {store} already holds 1 file(s)")
    both = runner.invoke(app, ["synth", "shop", "--out", store, "--overwrite", "--append"])
    assert both.exit_code == 2 and "--overwrite and --append exclude each other" in both.output
    ok = runner.invoke(app, ["synth", "shop", "--rollouts", "7", "--out", store, "--overwrite"])
    assert ok.exit_code == 0 and len(ids(store, None)) == 7
    # ingest into a Parquet store of its own making, then append JSON Lines: refused, both formats never mix.
    out = str(tmp_path / "pq")
    args = ["ingest", "canonical", store, "--out", out]
    assert runner.invoke(app, [*args, "--output-format", "parquet"]).exit_code == 0
    mixed = runner.invoke(app, [*args, "--append"])
    assert mixed.exit_code == 2 and "holds files of another format" in mixed.output
    assert list(list_files(out) or {}) == [f"{out}/part-00000.parquet"]


def test_ingest_stopping_at_a_bad_record_leaves_no_partial_store(tmp_path: Path) -> None:
    source = tmp_path / "source"
    write_store(iter(records(30)), str(source), per_file=30)
    (source / "part-00000.jsonl").open("a").write("{not json\n")
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["ingest", "canonical", str(source), "--out", str(out)])
    assert result.exit_code == 2 and "invalid JSON" in result.output
    assert snapshot(str(out), None) == {}


def test_the_old_spelling_of_output_format_still_writes_and_says_it_is_renamed(tmp_path: Path) -> None:
    runner = CliRunner()
    for command in (["synth", "shop", "--rollouts", "5"], ["ingest", "canonical", str(tmp_path / "s0")]):
        out = str(tmp_path / f"s{len(list(tmp_path.iterdir()))}")
        shown = runner.invoke(app, [*command, "--out", out, "--format", "parquet"])
        assert shown.exit_code == 0, shown.stderr
        assert shown.stderr.startswith(f"note: `pexec {command[0]} --format` is now --output-format")
        assert [Path(u).suffix for u in list_files(out) or {}] == [".parquet"]
    both = runner.invoke(app, ["synth", "shop", "--out", "x", "--format", "jsonl", "--output-format", "parquet"])
    assert (both.exit_code, both.stderr.strip()) == (
        2,
        "error: --format is the old spelling of --output-format: give --output-format alone",
    )
