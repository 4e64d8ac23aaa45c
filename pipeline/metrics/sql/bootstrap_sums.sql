-- Per-(cohort, replicate) sums of the resampled tasks' s_* columns, from what pipeline.metrics.bootstrap computed
-- (numpy: the draws of hash.sql, weights times per-task sums, exact), registered by pipeline.metrics.cohorts:
--   rep_wide   cohort, b and a BIGINT per s_* column: the cohorts whose sums all fit in 64 bits (nearly every one);
--   rep_limbs  cohort, b, part (an s_* column), shift, total: the others, each sum being sum(total * 2^shift),
--              HUGEINT as DuckDB's own sum of the per-task sums would be.
-- A cohort is in one of the two; rep_sums holds both (a column BIGINT, or HUGEINT when some cohort needs it).
CREATE OR REPLACE TEMP TABLE rep_sums AS
SELECT * FROM rep_wide
UNION ALL BY NAME
PIVOT (
    SELECT cohort, b, part::VARCHAR AS part, total::HUGEINT * (1::HUGEINT << shift) AS total FROM rep_limbs
) ON part USING sum(total) GROUP BY cohort, b;
