-- For user queries (pipeline.metrics.query), before the lockdown freezes settings: a memory limit, and spill
-- files in a private empty folder (DuckDB's default, ./.tmp, is also a folder queries may read), at most
-- spill_limit of them (DuckDB's default is 90% of the free disk).
SET memory_limit = getvariable('memory_limit');
SET temp_directory = getvariable('temp_directory');
SET max_temp_directory_size = getvariable('spill_limit');
