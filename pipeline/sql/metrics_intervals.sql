-- Ratios of sums for the full data (b = -1: the point estimates) and for every replicate (b >= 0), then
-- percentile intervals. Variables: q_lo, q_hi = (1 -/+ level) / 2, pexec_k.
--
-- Percentile rule: quantile_cont, i.e. linear interpolation between order statistics at position
-- q * (n - 1) of the n replicate values, the same as numpy.quantile(method="linear"). Replicates whose
-- denominator is 0 (e.g. no RR-eligible rollout among the drawn tasks) give NULL and are left out.
CREATE OR REPLACE TEMP TABLE all_sums AS
SELECT cohort, -1 AS b, sum(COLUMNS('^s_')) FROM task_sums GROUP BY cohort
UNION ALL BY NAME
SELECT * FROM rep_sums;

CREATE OR REPLACE TEMP TABLE rep_metrics AS
SELECT cohort, b,
       s_succ::DOUBLE / nullif(s_known, 0)::DOUBLE AS success,
       s_exec::DOUBLE / nullif(s_n, 0)::DOUBLE AS ter,
       s_auc::DOUBLE / nullif(s_n, 0)::DOUBLE / 1099511627776::DOUBLE AS auc_pec,
       s_rec::DOUBLE / nullif(s_elig, 0)::DOUBLE AS rr,
       s_rec::DOUBLE / nullif(s_succ, 0)::DOUBLE AS successes_after_invalid_prefix
FROM all_sums;

CREATE OR REPLACE TEMP TABLE metric_intervals AS
SELECT cohort, metric,
       any_value(value) FILTER (WHERE b = -1) AS value,
       quantile_cont(value, getvariable('q_lo')) FILTER (WHERE b >= 0) AS lo,
       quantile_cont(value, getvariable('q_hi')) FILTER (WHERE b >= 0) AS hi
FROM (
    UNPIVOT rep_metrics ON success, ter, auc_pec, rr, successes_after_invalid_prefix
    INTO NAME metric VALUE value
)
GROUP BY cohort, metric
ORDER BY cohort, metric;

-- PEC(k) = #{min(T, FED - 1) >= k} / N = (sum of s_h<d> over d >= k) / s_n, k = 0 .. K (PEC(0) = 1).
CREATE OR REPLACE TEMP TABLE rep_pec AS
WITH hist AS (
    SELECT cohort, b, CAST(substr(depth, 4) AS BIGINT) AS d, cnt
    FROM (
        UNPIVOT (SELECT cohort, b, COLUMNS('^s_(n|h[0-9]+)$')::DOUBLE FROM all_sums)
        ON COLUMNS('^s_(n|h[0-9]+)$') INTO NAME depth VALUE cnt
    )
    WHERE depth <> 's_n'
)
SELECT a.cohort, a.b, k.k,
       CASE WHEN k.k = 0 THEN any_value(a.s_n)::DOUBLE ELSE coalesce(sum(h.cnt), 0) END
           / nullif(any_value(a.s_n), 0)::DOUBLE AS value
FROM all_sums AS a
CROSS JOIN range(0, getvariable('pexec_k') + 1) AS k(k)
LEFT JOIN hist AS h ON h.cohort = a.cohort AND h.b = a.b AND h.d >= k.k
GROUP BY a.cohort, a.b, k.k;

CREATE OR REPLACE TEMP TABLE pec_intervals AS
SELECT cohort, k,
       any_value(value) FILTER (WHERE b = -1) AS value,
       quantile_cont(value, getvariable('q_lo')) FILTER (WHERE b >= 0) AS lo,
       quantile_cont(value, getvariable('q_hi')) FILTER (WHERE b >= 0) AS hi
FROM rep_pec
GROUP BY cohort, k
ORDER BY cohort, k;
