-- For user queries (pipeline.metrics.cohorts.sql), before the lockdown freezes settings: a memory limit, and spill
-- files in a private empty folder (DuckDB's default, ./.tmp, is also a folder queries may read).
SET memory_limit = getvariable('memory_limit');
SET temp_directory = getvariable('temp_directory');
