-- Ratios of sums for the full data (b = -1: the point estimates) and for every replicate (b >= 0), then
-- percentile intervals. Variables: q_lo, q_hi = (1 -/+ level) / 2, pexec_k, replicated (VARCHAR[]), and from the
-- catalogue metric_defs (STRUCT[]: metric, num, den, scale, ord) and parts (the s_<name> columns of the parts).
--
-- What the small-sample interval needs (the moments of the per-task sums) pipeline.metrics.cohorts computes in numpy
-- from task_sums.
--
-- Percentile rule: quantile_cont, i.e. linear interpolation between order statistics at position
-- q * (n - 1) of the n replicate values, the same as numpy.quantile(method="linear"). Replicates whose
-- denominator is 0 (e.g. no RR-eligible rollout among the drawn tasks) give NULL and are left out.
CREATE OR REPLACE TEMP TABLE all_sums AS
SELECT cohort, -1 AS b, sum(COLUMNS('^s_')) FROM task_sums GROUP BY cohort
UNION ALL BY NAME
SELECT * FROM rep_sums;

-- The catalogue's ratio metrics (pipeline/core/metric_catalogue.py), one row each: metric, num, den, scale, ord.
CREATE OR REPLACE TEMP TABLE metric_defs AS SELECT unnest(getvariable('metric_defs'), recursive := true);

-- Every metric of every (cohort, replicate): sum(s_<num>) / sum(s_<den>) / scale, with the denominator's total
-- (at b = -1, the count shown beside a metric such as RR).
CREATE OR REPLACE TEMP TABLE rep_metrics AS
WITH part_totals AS (
    UNPIVOT (SELECT cohort, b, COLUMNS(lambda c: list_contains(getvariable('parts'), c)) FROM all_sums)
    ON COLUMNS(* EXCLUDE (cohort, b)) INTO NAME part VALUE total
)
SELECT n.cohort, n.b, d.metric, den.total AS den_total,
       n.total::DOUBLE / nullif(den.total, 0)::DOUBLE / d.scale AS value
FROM metric_defs AS d
JOIN part_totals AS n ON n.part = 's_' || d.num
JOIN part_totals AS den ON den.part = 's_' || d.den AND den.cohort = n.cohort AND den.b = n.b;

-- The replicates' values of the metrics named in variable `replicated` (the report's ranking: how often a
-- flip holds), in replicate order.
CREATE OR REPLACE TEMP TABLE replicated_values AS
SELECT cohort, metric, list(value ORDER BY b) AS replicate_values
FROM rep_metrics
WHERE b >= 0 AND list_contains(getvariable('replicated'), metric)
GROUP BY cohort, metric;

CREATE OR REPLACE TEMP TABLE metric_intervals AS
SELECT cohort, metric,
       any_value(value) FILTER (WHERE b = -1) AS value,
       quantile_cont(value, getvariable('q_lo')) FILTER (WHERE b >= 0) AS lo,
       quantile_cont(value, getvariable('q_hi')) FILTER (WHERE b >= 0) AS hi,
       any_value(den_total) FILTER (WHERE b = -1)::BIGINT AS den_total
FROM rep_metrics
GROUP BY cohort, metric
ORDER BY cohort, metric;

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
