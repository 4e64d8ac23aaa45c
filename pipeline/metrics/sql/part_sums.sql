-- What one rollouts part file of a run contributes to the distributed metrics (pipeline.metrics.partials), after
-- metrics_prepare.sql ran over that part alone: its per-(cohort key, task) sums, each row with the partition its
-- task falls in (the task's 64-bit key of hash.sql modulo variable `partitions`, so a task's rows from every part
-- meet in one partition), and its counts per cohort key, which add up across parts.
CREATE OR REPLACE TEMP TABLE part_task_sums AS
SELECT i.key, t.task_id, (pexec_task_key(t.task_id) % getvariable('partitions'))::INTEGER AS partition,
       t.* EXCLUDE (cohort, task_id)
FROM task_sums AS t JOIN cohort_info AS i USING (cohort);

CREATE OR REPLACE TEMP TABLE part_counts AS
SELECT key, n, n_no_calls, n_unknown_success FROM cohort_info;

CREATE OR REPLACE TEMP TABLE part_facts AS
SELECT (SELECT max(T) FROM rollout_parts) AS max_t,
       (SELECT list(DISTINCT benchmark) FROM run_rollouts) AS benchmarks;
