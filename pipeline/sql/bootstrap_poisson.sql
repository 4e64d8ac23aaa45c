-- Poisson bootstrap (an approximation of task resampling for very many tasks): task i of a cohort gets
-- weight w = Poisson(1) inverse CDF of pexec_draw(key_b, lb32(i)) in replicate b. No join: every
-- (task, replicate) pair is visited once. No `WHERE w > 0` either: DuckDB would push it into the cross
-- product as a join condition and evaluate the hash there without sharing subexpressions (5x slower).
-- A replicate in which all of a cohort's weights are 0 sums to 0 and its ratios (0/0) are left out.
CREATE OR REPLACE TEMP TABLE rep_sums AS
SELECT cohort, b, sum(COLUMNS('^s_') * w)
FROM (
    SELECT s.*, r.b, pexec_poisson1(pexec_draw(r.key_b, s.ti_mixed)) AS w
    FROM task_sums AS s CROSS JOIN replicates AS r
)
GROUP BY cohort, b;
