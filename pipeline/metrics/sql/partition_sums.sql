-- One partition of the distributed metrics (pipeline.metrics.partials): relation `partition_rows` holds the
-- per-(cohort key, task) sums that every part file found for the tasks of this partition (part_sums.sql); a task
-- whose rollouts lie in several parts has a row from each, added up here into its whole-task sums. Cohorts are
-- numbered over the partition's keys (code), tasks keyed as hash.sql keys them.
CREATE OR REPLACE TEMP TABLE partition_sums AS
SELECT dense_rank() OVER (ORDER BY key) - 1 AS code, key, pexec_task_key(task_id) AS task_key,
       coalesce(COLUMNS('^s_'), 0)::BIGINT
FROM (SELECT key, task_id, sum(COLUMNS('^s_')) FROM partition_rows GROUP BY key, task_id)
ORDER BY code, task_key;


CREATE OR REPLACE TEMP TABLE partition_keys AS
SELECT code, any_value(key) AS key FROM partition_sums GROUP BY code ORDER BY code;
