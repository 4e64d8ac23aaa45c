-- The run's rollouts and steps with the part file they sit in and its shard (parts are `part-<shard>.parquet`):
-- (run_id, shard, rollout_id) names one rollout, and the shard leads back to its input (the manifest's shards).
CREATE OR REPLACE TEMP VIEW located AS
SELECT *, regexp_extract(_file, 'part-([^/]+)\.parquet$', 1) AS _shard
FROM read_parquet(getvariable('rollouts_glob'), union_by_name = true, hive_partitioning = false, filename = '_file');
CREATE OR REPLACE TEMP VIEW steps_located AS
SELECT *, regexp_extract(_file, 'part-([^/]+)\.parquet$', 1) AS _shard
FROM read_parquet(getvariable('steps_glob'), union_by_name = true, hive_partitioning = false, filename = '_file');
