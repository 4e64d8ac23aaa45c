-- One row per replayed call.
CREATE OR REPLACE TEMP VIEW steps AS
SELECT * FROM read_parquet(getvariable('steps_glob'), union_by_name = true, hive_partitioning = false);
