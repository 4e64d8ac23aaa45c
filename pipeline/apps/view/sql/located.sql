-- The run's rollouts and steps (the parts pipeline.metrics.completeness allows: rollouts_files, located_steps_files) with
-- the part file each row sits in and its shard (parts are `part-<shard>.parquet`): (run_id, shard, rollout_id)
-- names one rollout, and the shard leads back to its input (the shards the manifest and plan list).
CREATE OR REPLACE TEMP VIEW located AS
SELECT *, regexp_extract(_file, 'part-([^/]+)\.parquet$', 1) AS _shard
FROM read_parquet(getvariable('rollouts_files'), union_by_name = true, hive_partitioning = false, filename = '_file');
-- Only the columns the filters read (the failed check's column name differs between layouts: view_steps.sql; runs
-- from before `actor` have only the agent's calls, read as actor 'agent').
CREATE OR REPLACE TEMP VIEW steps_located AS
SELECT run_id, rollout_id, step, tool, coalesce(actor, 'agent') AS actor,
       regexp_extract(_file, 'part-([^/]+)\.parquet$', 1) AS _shard
FROM (
    SELECT * FROM read_parquet(getvariable('located_steps_files'), union_by_name = true, hive_partitioning = false,
                               filename = '_file')
    UNION ALL BY NAME
    SELECT NULL::VARCHAR AS actor WHERE false
);
