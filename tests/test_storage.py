"""pipeline.storage: listing by URL, and ingest reading its sources from an S3-compatible store (moto on
loopback) with the same `--endpoint-url` as its output."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import fsspec
import pytest
from conftest import s3_filesystem
from typer.testing import CliRunner

from pipeline.apps.cli import app
from pipeline.storage.fs import list_files
from pipeline.storage.inputs import list_inputs, plan_shards, read_shard
from pipeline.storage.shards import RecordError
from pipeline.storage.stores import write_store
from pipeline.synthetic.rollouts import synthesize
from pipeline.synthetic.support_logs import write_samples

DATA = Path(__file__).resolve().parent / "data"
REAL = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "real"


def test_list_files_patterns_depth_and_hidden_names(mem_root: str) -> None:
    fs = fsspec.filesystem("memory")
    root = mem_root.removeprefix("memory://")
    for name in ["a.json", "b.jsonl", "notes.txt", "x/c.json", "x/y/d.json", "_tmp/e.json", "x/.f.json"]:
        fs.pipe(f"{root}/{name}", b"{}")

    def names(**kw) -> list[str]:
        return [url.removeprefix(f"memory:///{root}/") for url in list_files(mem_root, **kw)]

    assert names() == ["a.json", "b.jsonl", "notes.txt", "x/c.json", "x/y/d.json"]
    assert names(patterns=["*.json"]) == ["a.json", "x/c.json", "x/y/d.json"]
    assert names(patterns=["*.json", "*.txt"], max_depth=1) == ["a.json", "notes.txt"]
    assert names(patterns=["*.json"], max_depth=2) == ["a.json", "x/c.json"]
    # A file named directly is listed whatever its name; nothing at the URL is None, not an error.
    assert list(list_files(f"{mem_root}/notes.txt", patterns=["*.json"])) == [f"memory:///{root}/notes.txt"]
    assert list_files(f"{mem_root}/absent") is None


def _records(store: str, storage_options: dict | None = None) -> list[dict]:
    files, _ = list_inputs(store, storage_options)
    records = [r for shard in plan_shards(files) for _, r in read_shard(shard, storage_options)]
    assert not any(isinstance(r, RecordError) for r in records)
    return records


def _copy(base: Path, *names: str) -> Callable[[Path], None]:
    """A source maker: copies the files or folders `base/NAME` to `folder/NAME`."""

    def copy(folder: Path) -> None:
        for name in names:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (shutil.copytree if (base / name).is_dir() else shutil.copy)(base / name, folder / name)

    return copy


# One source of each kind of adapter: a canonical store, a folder of run folders, BFCL results joined with the
# score file beside them (the model named by their folder), a tau2 results file, OpenAI logs in date partitions.
SOURCES: dict[str, tuple[Callable[[Path], None], list[str]]] = {
    "canonical": (lambda folder: write_store(synthesize("shop", 40, 8, seed=4), str(folder)), ["--label", "x=y"]),
    "toolsandbox": (_copy(DATA / "toolsandbox", *(p.name for p in (DATA / "toolsandbox").iterdir())), []),
    "bfcl": (
        _copy(REAL / "bfcl", *(f"gpt-oss-120b/BFCL_v4_multi_turn_base_{kind}.json" for kind in ("result", "score"))),
        ["--label", "run=nightly"],
    ),
    "tau2": (_copy(REAL / "tau2", "retail_gpt-4.1.json"), []),
    "openai": (
        lambda folder: write_samples(folder, ("2026-11-28", "2026-11-29"), per_date=20),
        ["--option", "error_prefix=Error:"],
    ),
}


@pytest.mark.parametrize("fmt", sorted(SOURCES))
def test_ingest_reads_sources_from_an_s3_compatible_store(s3: dict, tmp_path: Path, fmt: str) -> None:
    make, args = SOURCES[fmt]
    local = tmp_path / "src"
    make(local)
    source = f"s3://pexec-test/sources-{fmt}"
    s3_filesystem(s3).put(f"{local}/", source.removeprefix("s3://"), recursive=True)

    runner = CliRunner()
    result = runner.invoke(app, ["ingest", fmt, str(local), "--out", str(tmp_path / "local-store"), *args])
    assert result.exit_code == 0, result.output
    store = f"s3://pexec-test/store-{fmt}"
    endpoint = ["--endpoint-url", s3["endpoint_url"]]
    result = runner.invoke(app, ["ingest", fmt, source, "--out", store, *args, *endpoint])
    assert result.exit_code == 0, result.output

    expected = _records(str(tmp_path / "local-store"))
    assert len(expected) > 0
    assert _records(store, s3) == expected
