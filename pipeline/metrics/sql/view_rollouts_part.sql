-- view_rollouts.sql over one part file of a run (a task of the distributed metrics, pipeline.metrics.partials),
-- with every column of the whole run in the run's order: relation `run_columns` (registered by
-- pipeline.metrics._population) is an empty table of the run's columns. A column the part lacks is NULL, as the
-- run's union_by_name view makes it.
CREATE OR REPLACE TEMP VIEW rollouts AS
SELECT * FROM run_columns
UNION ALL BY NAME
SELECT * FROM read_parquet(getvariable('rollouts_files'), union_by_name = true, hive_partitioning = false);
