"""Scoring: a store's shards replayed as Ray tasks (or inline), each writing its parts of the run's tables, the
manifest written last.

driver.py        plan shards, submit them (bounded in flight), reuse unchanged ones, commit with the manifest
shard.py         one shard: read its records, replay each rollout, write its parts
run_tables.py    results -> the steps, rollouts and rejects tables as Arrow
code_version.py  what decides whether an earlier run's shards can be reused
id_check.py      the duplicate-id check on Ray, in hash partitions: the driver never holds the ids

Imports: core, storage, envs, replay.
"""
