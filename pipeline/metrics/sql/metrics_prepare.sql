-- Per-(cohort, task) sums: the only input of the bootstrap (docs/explanation/measured-facts.md: aggregate first, then resample).
-- Variables set by pipeline.metrics.cohorts: cohort_cols (VARCHAR[]: 'benchmark' and the `by` labels), and
-- pexec_k (metrics_depths.sql). Reads the view rollout_keys (pipeline.metrics.cohorts): per rollout its cohort
-- key, task_id, T, success, the catalogue's parts p_<name> and a BOOLEAN column h_<d> per PEC depth d that occurs,
-- and h_0 (depth 0, counted in no PEC(k >= 1): there so that the h_ columns are never none, left out below).
--
-- The rollouts are summed as they are read, straight to one row per (cohort, task): no table holds a row per
-- rollout, so memory grows with tasks x cohorts (x depths), not with the rollouts. Every figure shown of a
-- cohort is a sum over its tasks of what these rows hold: counts, parts and the PEC histogram.
--
-- On one thread: DuckDB's parallel hash aggregate gives each thread a table of bounded size and flushes it, as
-- partial sums to merge at the end, whenever it is full; with more (cohort, task) groups than that, the flushed
-- partials grow with the rollouts read (1M -> 10M rollouts over the same 400,000 groups: 353 -> 542 MiB on two
-- threads; 259 -> 284 MiB on one). One thread's table grows to hold every group instead.
SET VARIABLE pexec_threads = current_setting('threads');
SET threads = 1;

-- The key is a struct of the cohort columns so that the rest of this file does not depend on which labels
-- define a cohort; a NULL label is a cohort value of its own.
CREATE OR REPLACE TEMP TABLE key_task_sums AS
SELECT key,
       task_id,
       count(*) AS t_n,
       count_if(T = 0)::BIGINT AS t_no_calls,
       count_if(success IS NULL)::BIGINT AS t_unknown_success,
       -- Sums per task of the catalogue's parts (pipeline/core/metric_catalogue.py): p_<name> -> s_<name>; every
       -- ratio metric is sum(s_<num>) / sum(s_<den>). BIGINT: a task would need over 8.3 million rollouts to
       -- overflow the sum of auc_term's 2^-40 units (an error, not a silent wrap).
       sum(COLUMNS('^p_(.*)$'))::BIGINT AS 's_\1',
       -- PEC counts per task, one column per depth: s_h<d> = #{rollouts with min(T, FED - 1, K) = d}, d >= 1;
       -- PEC(k) * N = sum of s_h<d> over d >= k. NULL where the task has none (it counts as 0 downstream).
       nullif(count_if(COLUMNS('^h_([0-9]+)$')), 0)::INTEGER AS 's_h\1'
FROM rollout_keys
GROUP BY key, task_id;

SET threads = getvariable('pexec_threads');

-- Cohorts numbered over their keys, in key order.
CREATE OR REPLACE TEMP TABLE cohort_keys AS
SELECT key, row_number() OVER (ORDER BY key) - 1 AS cohort FROM (SELECT DISTINCT key FROM key_task_sums);

-- Rollouts whose replay diverged from the log before their first error, over every rollout of the run: under
-- --strict-replay they are not in rollout_parts, and this is the count of those left out.
CREATE OR REPLACE TEMP TABLE cohort_diverged AS
SELECT struct_pack(*COLUMNS(lambda c: list_contains(getvariable('cohort_cols'), c))) AS key,
       count_if(diverged_before_fed)::BIGINT AS n_diverged_before_fed
FROM rollouts
GROUP BY ALL;

CREATE OR REPLACE TEMP TABLE cohort_info AS
SELECT i.*, coalesce(d.n_diverged_before_fed, 0) AS n_diverged_before_fed
FROM (
    SELECT c.cohort,
           any_value(s.key) AS key,
           sum(s.t_n)::BIGINT AS n,
           count(s.task_id) AS n_tasks,  -- a row per task (a NULL task_id is no task)
           sum(s.t_no_calls)::BIGINT AS n_no_calls,
           sum(s.t_unknown_success)::BIGINT AS n_unknown_success
    FROM key_task_sums AS s JOIN cohort_keys AS c ON s.key IS NOT DISTINCT FROM c.key
    GROUP BY c.cohort
) AS i
LEFT JOIN cohort_diverged AS d ON d.key IS NOT DISTINCT FROM i.key
ORDER BY i.cohort;

-- A cohort's tasks in task_id order: task i of cohort c (i = 0 .. m-1) is slot i of the bootstrap draws
-- (pipeline.metrics.bootstrap).
CREATE OR REPLACE TEMP TABLE task_sums AS
SELECT cohort, task_id, COLUMNS(lambda c: starts_with(c, 's_') AND c <> 's_h0')
FROM (SELECT c.cohort, s.* FROM key_task_sums AS s JOIN cohort_keys AS c ON s.key IS NOT DISTINCT FROM c.key)
ORDER BY cohort, task_id;
