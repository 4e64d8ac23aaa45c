"""Scoring: a store's shards, or raw logs' shards decoded by their format inside the task, replayed as Ray tasks
(or inline), each writing its parts of the run's tables, the manifest written last.

settings.py      ScoreSettings: how a run is scored, as `pexec score` options and a job file say
driver.py        plan shards, submit them (bounded in flight), reuse unchanged ones, commit with the manifest
shard.py         one shard: read its records (a store's, or a raw format's), replay each rollout, write its parts
memory.py        a process's peak memory (VmHWM), restarted as a Ray task begins: what a shard's marker reports
sniff.py         a store given without a format whose records are another format's logs: refused, named
shuffle.py       rollouts that span files: items hash-partitioned by key through the run's staging area
convert.py       `pexec ingest`: the same shards decoded here or in Ray tasks, records in source order to a store
run_tables.py    results -> the steps, rollouts and rejects tables as Arrow
_code_version.py  what decides whether an earlier run's shards can be reused
_held.py         a shard's converted steps and rollouts, held up to a bound, then spilled to local disk, then written
id_check.py      the duplicate-id check on Ray, in hash partitions: the driver never holds the ids

Imports: core, storage, envs, replay, ingest.
"""

# What the package exports: its public modules (a `_x.py` module is its own).
__all__ = [
    "convert",
    "driver",
    "id_check",
    "memory",
    "run_tables",
    "settings",
    "shard",
    "shuffle",
    "sniff",
]
