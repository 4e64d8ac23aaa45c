-- One row per rollout, over the part files pipeline.metrics.completeness allows (variable rollouts_files: the parts of the
-- shards a complete run's manifest lists, or of the committed shards of a partial read; never a stray part).
-- Part files may carry different label columns, hence union_by_name. Folder names are not columns
-- (hive_partitioning = false): the columns are the files' own.
CREATE OR REPLACE TEMP VIEW rollouts AS
SELECT * FROM read_parquet(getvariable('rollouts_files'), union_by_name = true, hive_partitioning = false);
