"""The canonical store `pexec ingest` writes is byte-for-byte what it was before the chat adapters built the model's
objects directly (the digests were taken from the store the earlier code wrote, from these same inputs), and a
rollout scored from raw logs is the rollout the store gives back."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pipeline.apps.cli import app
from pipeline.core.model import Rollout
from pipeline.core.records import check_rollout, parse_rollout, rollout_record
from pipeline.ingest import IngestOptions
from pipeline.ingest.sharded import plan_raw, raw_source, read_raw_rollouts
from pipeline.synthetic.support_logs import write_night, write_samples

REAL = Path(__file__).resolve().parents[2] / "shared" / "data" / "real"
ERROR_PREFIX = "--option=error_prefix=Error:"

# sha256 of the store's part-00000.jsonl, written by the code before the change from the same inputs.
SYNTHETIC = {
    "night": "045a156be286717972f0f405201f4a958a65329044a913672103f50ff6d0015b",
    "night_tools": "67b2da4c27c9190d470823b928f27a50195336c27804749e8799eee3d79c15a9",
    "samples": "0f6f5972a751abad6b8b8063674d0037bd3226ce742003055a79ca0bc64e01b0",
}
SHARED = {
    ("tau2", "tau2"): "04da0ba2790af21a8517aadcd5a88eaf7af2a9430435d7f44f01f37a70814ef9",
    ("bfcl", "bfcl/gpt-oss-120b"): "7d4817f6ef5cbdbc8c79b617eba074059138580b82a4f071b16d678ad68d784c",
}


def synthetic(name: str, out: Path) -> Path:
    """The inputs the digests were taken from (the generators are seeded)."""
    if name == "night":
        write_night(out, 3000, 2)
    elif name == "night_tools":
        write_night(out, 1000, 2, seed=1, tools=True)
    else:
        write_samples(out, tools=True)
    return out


def ingested(fmt: str, source: Path, out: Path, *options: str) -> str:
    shown = CliRunner().invoke(app, ["ingest", fmt, str(source), *options, "--out", str(out)])
    assert shown.exit_code == 0, shown.output
    return hashlib.sha256((out / "part-00000.jsonl").read_bytes()).hexdigest()


@pytest.mark.parametrize("name", sorted(SYNTHETIC))
def test_the_store_of_synthetic_openai_logs_is_unchanged(name: str, tmp_path: Path) -> None:
    source = synthetic(name, tmp_path / "logs")
    assert ingested("openai", source, tmp_path / "store", ERROR_PREFIX) == SYNTHETIC[name]


@pytest.mark.parametrize("fmt, folder", sorted(SHARED))
def test_the_store_of_the_shared_real_logs_is_unchanged(fmt: str, folder: str, tmp_path: Path) -> None:
    if not (REAL / folder).exists():
        pytest.fail(f"the shared real logs are missing: {REAL / folder} (../shared/data must be beside the project)")
    assert ingested(fmt, REAL / folder, tmp_path / "store") == SHARED[fmt, folder]


def test_a_rollout_scored_from_raw_logs_is_the_one_its_stored_record_gives(tmp_path: Path) -> None:
    source = raw_source(
        "openai", [str(synthetic("night_tools", tmp_path))], IngestOptions(extra={"error_prefix": "Error:"})
    )
    built = [r for shard in plan_raw(source, 2**30) for _, r in read_raw_rollouts(source, shard)]
    assert len(built) == 1000
    for rollout in built:
        assert isinstance(rollout, Rollout)  # built as the model's objects: no record, no reject
        assert parse_rollout(rollout_record(rollout)) == check_rollout(rollout)
