-- The distributed metrics (pipeline.metrics.partials) after bootstrap_sums.sql: rep_sums holds the point estimates'
-- sums (b = -1) beside the replicates', merged from every partition; task_sums is left without rows (relation
-- `sum_columns`, registered empty: cohort and the s_* columns), so metrics_intervals.sql adds nothing to them and
-- still finds every column when no cohort has a rollout.
CREATE OR REPLACE TEMP TABLE task_sums AS SELECT * FROM sum_columns;
