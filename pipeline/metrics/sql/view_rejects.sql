-- One row per record that could not be scored: shard, source, location, reason, raw (variable rejects_files,
-- as view_rollouts.sql).
CREATE OR REPLACE TEMP VIEW rejects AS
SELECT * FROM read_parquet(getvariable('rejects_files'), union_by_name = true, hive_partitioning = false);
