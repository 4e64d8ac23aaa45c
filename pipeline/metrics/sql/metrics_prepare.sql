-- Per-(cohort, task) sums: the only input of the bootstrap (docs/explanation/measured-facts.md: aggregate first, then resample).
-- Variables set by pipeline.metrics.cohorts: cohort_cols (VARCHAR[]: 'benchmark' and the `by` labels),
-- max_k (BIGINT or NULL).

-- K of PEC(k): max_k if given, else the run's largest T, at most 20.
SET VARIABLE pexec_k = coalesce(getvariable('max_k'), least((SELECT max(T) FROM rollout_parts), 20), 0);

-- Every rollout with its cohort number. The key is a struct of the cohort columns so that the rest of
-- this file does not depend on which labels define a cohort; a NULL label is a cohort value of its own.
CREATE OR REPLACE TEMP TABLE cohort_rollouts AS
WITH keyed AS (
    SELECT struct_pack(*COLUMNS(lambda c: list_contains(getvariable('cohort_cols'), c))) AS key, *
    FROM rollout_parts
),
-- Numbered over the distinct keys, not over every rollout (a window over all rows sorts them all: 3x slower).
numbered AS (SELECT key, row_number() OVER (ORDER BY key) - 1 AS cohort FROM (SELECT DISTINCT key FROM keyed))
SELECT n.cohort, k.key, task_id, T, fed, executable, success, COLUMNS('^p_')
FROM keyed AS k JOIN numbered AS n ON k.key IS NOT DISTINCT FROM n.key;

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
    SELECT cohort,
           any_value(key) AS key,
           count(*) AS n,
           count(DISTINCT task_id) AS n_tasks,
           count_if(T = 0)::BIGINT AS n_no_calls,
           count_if(success IS NULL)::BIGINT AS n_unknown_success
    FROM cohort_rollouts
    GROUP BY cohort
) AS i
LEFT JOIN cohort_diverged AS d ON d.key IS NOT DISTINCT FROM i.key
ORDER BY i.cohort;

-- Sums per task of the catalogue's parts (pipeline/core/metric_catalogue.py): p_<name> -> s_<name>; every ratio metric is
-- sum(s_<num>) / sum(s_<den>). BIGINT: a task would need over 8.3 million rollouts to overflow the sum of
-- auc_term's 2^-40 units (an error, not a silent wrap).
CREATE OR REPLACE TEMP TABLE task_base AS
SELECT cohort, task_id, sum(COLUMNS('^p_(.*)$'))::BIGINT AS 's_\1'
FROM cohort_rollouts
GROUP BY cohort, task_id;

-- PEC counts per task, one column per depth: s_h<d> = #{rollouts with min(T, FED - 1, K) = d}, d >= 1.
-- PEC(k) * N = sum of s_h<d> over d >= k. A dynamic PIVOT, so the columns follow K without editing SQL;
-- a depth that no rollout has gets no column (it counts as 0 downstream).
CREATE OR REPLACE TEMP TABLE task_hist AS
PIVOT (
    SELECT cohort, task_id, 's_h' || least(T, fed - 1, getvariable('pexec_k')) AS depth
    FROM cohort_rollouts
    WHERE least(T, fed - 1, getvariable('pexec_k')) >= 1
) ON depth USING count(*)::INTEGER GROUP BY cohort, task_id;

-- A cohort's tasks in task_id order: task i of cohort c (i = 0 .. m-1) is slot i of the bootstrap draws
-- (pipeline.metrics.bootstrap).
CREATE OR REPLACE TEMP TABLE task_sums AS
SELECT cohort, task_id, COLUMNS('^s_')
FROM task_base LEFT JOIN task_hist USING (cohort, task_id)
ORDER BY cohort, task_id;
