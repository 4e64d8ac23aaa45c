-- Task-level bootstrap by true resampling with replacement: replicate b of a cohort with m tasks draws
-- m task numbers j_i = pexec_draw(key_b, lb32(i)) mod m, i = 0 .. m-1, and sums the drawn tasks' s_*
-- columns (a task drawn twice counts twice). The draw depends only on (seed, b, i, m): two cohorts over
-- the same tasks get the same draws, which is what a paired comparison needs.
-- One pass for all cohorts: the slots (cohort, i) are the rows of task_sums themselves.
-- DuckDB's partial_aggregate_pushdown would pre-aggregate task_sums below the join and then combine
-- aggregate states for each of the 10^8 joined rows: 3x slower than summing plain integers.
SET disabled_optimizers = 'partial_aggregate_pushdown';
CREATE OR REPLACE TEMP TABLE rep_sums AS
SELECT d.cohort, d.b, sum(COLUMNS('^s_'))
FROM (
    SELECT s.cohort, r.b, s.g_off + (pexec_draw(r.key_b, s.ti_mixed) % s.m)::BIGINT AS g
    FROM task_sums AS s CROSS JOIN replicates AS r
) AS d
JOIN task_sums AS t USING (g)
GROUP BY d.cohort, d.b;
RESET disabled_optimizers;
