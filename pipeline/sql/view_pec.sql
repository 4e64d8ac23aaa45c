-- One row per cohort and k: PEC(k) with its interval, as written by pipeline.aggregate.write_metrics.
CREATE OR REPLACE TEMP VIEW pec AS SELECT * FROM read_parquet(getvariable('pec_file'));
