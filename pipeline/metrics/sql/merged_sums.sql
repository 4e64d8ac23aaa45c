-- The distributed metrics (pipeline.metrics.partials) after bootstrap_sums.sql: rep_sums holds the point estimates'
-- sums (b = -1) beside the replicates', merged from every partition; task_sums is left without rows (its columns
-- only), so metrics_intervals.sql adds nothing to them.
CREATE OR REPLACE TEMP TABLE task_sums AS SELECT * EXCLUDE (b) FROM rep_sums WHERE false;
