-- One row per cohort, as written by pipeline.aggregate.write_metrics.
CREATE OR REPLACE TEMP VIEW metrics AS SELECT * FROM read_parquet(getvariable('metrics_file'));
