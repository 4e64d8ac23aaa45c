-- One row per rollout; part files may carry different label columns, hence union_by_name.
-- Folder names are not columns (hive_partitioning = false): the columns are the files' own.
CREATE OR REPLACE TEMP VIEW rollouts AS
SELECT * FROM read_parquet(getvariable('rollouts_glob'), union_by_name = true, hive_partitioning = false);
