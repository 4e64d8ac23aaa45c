-- What one shard contributes to the per-tool profiles computed in Ray tasks (pipeline.metrics.tool_partials), after
-- tool_prepare.sql ran over its rollouts and steps parts alone: its per-(cohort key, task) sums, each row with the
-- partition its task falls in (as part_sums.sql cuts them, so a task's rows from every shard meet in one partition).
CREATE OR REPLACE TEMP TABLE part_task_sums AS
SELECT i.key, t.task_id, (pexec_task_key(t.task_id) % getvariable('partitions'))::INTEGER AS partition,
       t.* EXCLUDE (cohort, task_id)
FROM task_sums AS t JOIN tool_info AS i USING (cohort);
