-- Step-level cohorts (benchmark × tool [× labels]) for the per-tool error profile: the same per-(cohort, task)
-- sums as metrics_prepare.sql, with the run's calls as units instead of its rollouts, so that
-- pipeline.metrics.cohorts's bootstrap and metrics_intervals.sql resample tasks (the calls of a task move together: the interval
-- is clustered by task). Variables set by pipeline.metrics.tool_profiles: steps_files, cohort_cols (VARCHAR[]: 'benchmark',
-- 'tool' and the `by` labels). Needs the views `steps` (view_steps.sql) and `rollout_parts`.

-- The calls of the rollouts the metrics count (the population: harness errors, pools, strict replay), with the
-- rollout's benchmark and task as counted (a pool renames both) and its labels, and per call the integer parts:
-- s_n every call, s_inv invalid, s_first the rollout's first invalid call, s_cmp/s_match the replayed output
-- compared with / equal to the logged one. A user simulator's calls (actor 'user') are calls of their own tools
-- here; `actor` is a column a profile can be grouped by, and only the agent's calls can be a rollout's first error.
CREATE OR REPLACE TEMP TABLE tool_calls AS
SELECT r.*,
       s.actor,
       coalesce(s.tool, '(none)') AS tool,
       s.cause,
       1 AS p_n,
       (NOT s.valid)::INTEGER AS p_inv,
       (NOT s.valid AND s.step = r.fed AND s.actor = 'agent')::INTEGER AS p_first,
       (s.output_match IS NOT NULL)::INTEGER AS p_cmp,
       (s.output_match IS TRUE)::INTEGER AS p_match
FROM steps AS s
JOIN (SELECT COLUMNS(lambda c: NOT starts_with(c, 'p_')) FROM rollout_parts) AS r ON r.rollout_id = s.rollout_id AND r.run_id IS NOT DISTINCT FROM s.run_id;

CREATE OR REPLACE TEMP TABLE tool_rollouts AS
SELECT dense_rank() OVER (ORDER BY key) - 1 AS cohort, key, task_id, cause, COLUMNS('^p_')
FROM (
    SELECT struct_pack(*COLUMNS(lambda c: list_contains(getvariable('cohort_cols'), c))) AS key, *
    FROM tool_calls
);

-- Per cohort: calls, distinct tasks, and its invalid calls' causes (most frequent first).
CREATE OR REPLACE TEMP TABLE tool_info AS
SELECT c.cohort, c.key, c.n_calls, c.n_tasks, c.n_invalid, c.n_first_errors, coalesce(k.causes, []) AS causes
FROM (
    SELECT cohort, any_value(key) AS key, sum(p_n)::BIGINT AS n_calls, count(DISTINCT task_id) AS n_tasks,
           sum(p_inv)::BIGINT AS n_invalid, sum(p_first)::BIGINT AS n_first_errors
    FROM tool_rollouts GROUP BY cohort
) AS c
LEFT JOIN (
    SELECT cohort, list({'cause': cause, 'n': n} ORDER BY n DESC, cause) AS causes
    FROM (
        SELECT cohort, coalesce(cause, 'unknown') AS cause, count(*)::BIGINT AS n
        FROM tool_rollouts WHERE p_inv = 1 GROUP BY ALL
    )
    GROUP BY cohort
) AS k USING (cohort)
ORDER BY c.cohort;

-- As metrics_prepare.sql: sums per (cohort, task), a cohort's tasks in task_id order (the bootstrap's slots).
CREATE OR REPLACE TEMP TABLE task_sums AS
SELECT cohort, task_id, sum(COLUMNS('^p_(.*)$'))::BIGINT AS 's_\1'
FROM tool_rollouts
GROUP BY cohort, task_id
ORDER BY cohort, task_id;

-- No PEC curve over calls: metrics_intervals.sql then computes only its trivial k = 0.
SET VARIABLE pexec_k = 0;
