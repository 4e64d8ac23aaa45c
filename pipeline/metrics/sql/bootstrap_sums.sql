-- Per-(cohort, replicate) sums of the resampled tasks' s_* columns, from the limbs pipeline.metrics.bootstrap computed
-- (numpy: the draws of hash.sql, weights times per-task sums, exact). Relation `rep_limbs` (registered by
-- pipeline.metrics.cohorts): cohort, b, part (an s_* column), shift, total; the sum is sum(total * 2^shift), HUGEINT
-- as DuckDB's own sum of the per-task sums would be.
CREATE OR REPLACE TEMP TABLE rep_sums AS
PIVOT (
    SELECT cohort, b, part::VARCHAR AS part, total::HUGEINT * (1::HUGEINT << shift) AS total FROM rep_limbs
) ON part USING sum(total) GROUP BY cohort, b;
