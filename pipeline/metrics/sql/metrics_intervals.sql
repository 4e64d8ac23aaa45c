-- Ratios of sums for the full data (b = -1: the point estimates) and for every replicate (b >= 0), then
-- percentile intervals, of the cohorts pass_first .. pass_end - 1 (one pass: rep_sums holds theirs). Variables:
-- q_lo, q_hi = (1 -/+ level) / 2, pass_first, pass_end, replicated (VARCHAR[]), and from the catalogue
-- metric_defs (STRUCT[]: metric, num, den, scale, ord) and parts (the s_<name> columns of the parts).
--
-- What the small-sample interval needs (the moments of the per-task sums) pipeline.metrics.cohorts computes in numpy
-- from task_sums.
--
-- Percentile rule: quantile_cont, i.e. linear interpolation between order statistics at position
-- q * (n - 1) of the n replicate values, the same as numpy.quantile(method="linear"). Replicates whose
-- denominator is 0 (e.g. no RR-eligible rollout among the drawn tasks) give NULL and are left out.

-- A view, not a table: the pass's replicate sums are held once, in rep_sums (at B = 10,000 and 1,000 depths,
-- 80 MB a copy).
CREATE OR REPLACE TEMP VIEW all_sums AS
SELECT cohort, -1 AS b, sum(COLUMNS('^s_'))
FROM task_sums
WHERE cohort >= getvariable('pass_first') AND cohort < getvariable('pass_end')
GROUP BY cohort
UNION ALL BY NAME
SELECT * FROM rep_sums;

-- The catalogue's ratio metrics (pipeline/core/metric_catalogue.py), one row each: metric, num, den, scale, ord.
CREATE OR REPLACE TEMP TABLE metric_defs AS SELECT unnest(getvariable('metric_defs'), recursive := true);

-- Every metric of every (cohort, replicate): sum(s_<num>) / sum(s_<den>) / scale, with the denominator's total
-- (at b = -1, the count shown beside a metric such as RR). Each part's total meets the metrics it is a part of in
-- one hash join, and a metric's two parts meet in one group: no join of the totals with themselves.
CREATE OR REPLACE TEMP TABLE rep_metrics AS
WITH part_totals AS (
    UNPIVOT (SELECT cohort, b, COLUMNS(lambda c: list_contains(getvariable('parts'), c)) FROM all_sums)
    ON COLUMNS(* EXCLUDE (cohort, b)) INTO NAME part VALUE total
),
metric_parts AS (
    SELECT metric, scale, 's_' || num AS part, true AS numerator FROM metric_defs
    UNION ALL
    SELECT metric, scale, 's_' || den AS part, false AS numerator FROM metric_defs
)
SELECT t.cohort, t.b, m.metric,
       any_value(t.total) FILTER (WHERE NOT m.numerator) AS den_total,
       any_value(t.total) FILTER (WHERE m.numerator)::DOUBLE / nullif(den_total, 0)::DOUBLE / any_value(m.scale)
           AS value
FROM part_totals AS t
JOIN metric_parts AS m ON m.part = t.part
GROUP BY t.cohort, t.b, m.metric;

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

-- PEC(k) and its interval: pipeline.metrics.pec, from all_sums's depth histogram.
