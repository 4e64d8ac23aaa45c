"""Runs made without scoring, for benchmarks and tests of the DuckDB stage: a folder of rollouts parts written
directly is turned into a complete run (what every reader asks for)."""

from __future__ import annotations

import pyarrow.parquet as pq

from pipeline.scoring.run_tables import rejects_table, steps_table
from pipeline.storage.fs import exists, filesystem
from pipeline.storage.run import part_path, write_manifest, write_part


def commit_parts(run: str, storage_options: dict | None = None) -> None:
    """Make a run of rollouts parts written without scoring (benchmarks, tests of the DuckDB stage) a complete
    run: an empty steps and rejects part beside every rollouts part that has none, and a manifest listing
    them as its shards."""
    fs, folder = filesystem(f"{run.rstrip('/')}/rollouts", storage_options)
    keys = sorted(p.rsplit("/part-", 1)[1][: -len(".parquet")] for p in fs.glob(f"{folder}/part-*.parquet"))
    shards = []
    for key in keys:
        for table_name, empty in (("steps", steps_table("run", [])), ("rejects", rejects_table("run", key, []))):
            if not exists(part_path(run, table_name, key), storage_options):
                write_part(run, table_name, key, empty, storage_options)
        with fs.open(f"{folder}/part-{key}.parquet", "rb") as f:
            rows = pq.read_metadata(f).num_rows
        shards.append({"shard": key, "read": rows, "scored": rows, "rejected": 0})
    counts = {"read": sum(s["read"] for s in shards), "shards": len(shards)}
    write_manifest(run, {"complete": True, "shards": shards, "counts": counts}, storage_options)
