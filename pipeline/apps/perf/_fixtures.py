"""Runs made without scoring, for benchmarks and tests of the DuckDB stage: a folder of rollouts parts written
directly is turned into a complete run (what every reader asks for)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from pipeline.core.run_folder import (
    Counts,
    EnvironmentOptions,
    Manifest,
    Reuse,
    RunInput,
    RunSettings,
    ShardMarker,
)
from pipeline.scoring.run_tables import rejects_table, steps_table
from pipeline.storage.fs import exists, filesystem
from pipeline.storage.run import part_facts, part_path, write_manifest, write_part


def commit_parts(run: str, storage_options: dict[str, Any] | None = None) -> None:
    """Make a run of rollouts parts written without scoring (benchmarks, tests of the DuckDB stage) a complete
    run: an empty steps and rejects part beside every rollouts part that has none, and a manifest listing
    them as its shards."""
    fs, folder = filesystem(f"{run.rstrip('/')}/rollouts", storage_options)
    keys = sorted(p.rsplit("/part-", 1)[1][: -len(".parquet")] for p in fs.glob(f"{folder}/part-*.parquet"))
    shards = []
    for key in keys:
        facts = {}
        for table_name, empty in (("steps", steps_table("run", [])), ("rejects", rejects_table("run", key, []))):
            if not exists(part_path(run, table_name, key), storage_options):
                facts[table_name] = write_part(run, table_name, key, empty, storage_options)
            else:
                facts[table_name] = part_facts(run, table_name, key, storage_options)
        facts["rollouts"] = part_facts(run, "rollouts", key, storage_options)
        rows = facts["rollouts"].rows
        shards.append(
            ShardMarker(
                shard=key,
                source="",
                start=0,
                stop=None,
                fingerprint="",
                read=rows,
                scored=rows,
                parts={t: f.size for t, f in facts.items()},
                part_rows={t: f.rows for t, f in facts.items()},
                part_digests={t: f.digest for t, f in facts.items()},
            )
        )
    total = sum(s.read for s in shards)
    now = datetime.now(UTC).isoformat()
    manifest = Manifest(
        run_id=run.rstrip("/").rsplit("/", 1)[-1],
        complete=True,
        code_version="",
        input=RunInput(store="", format=None, files=(), ignored=()),
        settings=RunSettings(
            env=None,
            options=EnvironmentOptions(spec_dirs=(), spec=None, policy="code"),
            checks=(),
            executor="none",
            read=None,
        ),
        environments={},
        counts=Counts(read=total, scored=total, rejected=0, steps=0, shards=len(shards), shards_reused=0),
        reconciled=True,
        shards=tuple(shards),
        reuse=Reuse(core="", shards_reused=0, shards=()),
        started_at=now,
        finished_at=now,
        seconds=0.0,
    )
    write_manifest(run, manifest, storage_options)
