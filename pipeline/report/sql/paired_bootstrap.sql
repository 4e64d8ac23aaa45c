-- Paired task-level bootstrap over the tasks both sides share (run after paired_prepare.sql and, when there
-- are costs, paired_costs.sql). Variables: method ('multinomial' | 'poisson'), seed, B, q_lo, q_hi, min_tasks,
-- min_denominator (pipeline.core.intervals: below either, on either side, the percentiles say nothing).
--
-- Shared tasks of a pair are numbered ti = 0 .. m-1 by task_id, as metrics_prepare.sql numbers a cohort's
-- tasks, and replicate b weighs task ti with the same draws as the cohort bootstrap: multinomial = how often
-- ti is among the m draws pexec_draw(key_b, lb32(i)) mod m; poisson = Poisson(1) of pexec_draw(key_b, lb32(ti)).
-- Both sides get the same weights: that is what makes the comparison paired.

CREATE OR REPLACE TEMP TABLE paired_tasks AS
SELECT key, task_id,
       row_number() OVER (PARTITION BY key ORDER BY task_id) - 1 AS ti,
       (count(*) OVER (PARTITION BY key))::UBIGINT AS m
FROM (
    SELECT key, task_id FROM paired_parts WHERE part = 'p_n'
    GROUP BY key, task_id HAVING count(DISTINCT side) = 2
);

CREATE OR REPLACE TEMP TABLE paired_replicates AS
SELECT b, pexec_rep_key(getvariable('seed'), b) AS key_b FROM range(getvariable('B')) AS t(b);

CREATE OR REPLACE TEMP TABLE paired_weights AS
SELECT key, b, ti, w FROM (
    SELECT t.key, r.b, (pexec_draw(r.key_b, pexec_lb32(t.ti::UBIGINT)) % t.m)::BIGINT AS ti, 1 AS w
    FROM paired_tasks AS t CROSS JOIN paired_replicates AS r
    WHERE getvariable('method') = 'multinomial'
    UNION ALL
    SELECT t.key, r.b, t.ti, pexec_poisson1(pexec_draw(r.key_b, pexec_lb32(t.ti::UBIGINT))) AS w
    FROM paired_tasks AS t CROSS JOIN paired_replicates AS r
    WHERE getvariable('method') = 'poisson'
);

-- Sums per (pair, replicate, side, part); b = -1 is the full data of the shared tasks (point estimates).
CREATE OR REPLACE TEMP TABLE paired_sums AS
WITH shared AS (
    SELECT p.key, t.ti, p.side, p.part, p.value
    FROM paired_parts AS p JOIN paired_tasks AS t USING (key, task_id)
)
SELECT key, -1 AS b, side, part, sum(value)::HUGEINT AS total FROM shared GROUP BY ALL
UNION ALL
SELECT w.key, w.b, s.side, s.part, sum(s.value * w.w)::HUGEINT AS total
FROM (SELECT key, b, ti, sum(w)::BIGINT AS w FROM paired_weights GROUP BY ALL) AS w
JOIN shared AS s USING (key, ti)
GROUP BY ALL;

-- Metric per (pair, replicate, side), then the contrast A - B ('diff') or 100 * (A / B - 1) ('pct').
-- A replicate where either side's ratio is undefined (denominator 0) is left out of the interval.
CREATE OR REPLACE TEMP TABLE paired_contrasts AS
WITH side_values AS (
    SELECT n.key, n.b, n.side, d.metric, d.kind, d.ord,
           n.total::DOUBLE / nullif(den.total, 0)::DOUBLE / d.scale AS value
    FROM paired_defs AS d
    JOIN paired_sums AS n ON n.part = d.num
    JOIN paired_sums AS den ON den.part = d.den AND den.key = n.key AND den.b = n.b AND den.side = n.side
)
SELECT a.key, a.b, a.metric, a.kind, a.ord, a.value AS value_a, bb.value AS value_b,
       CASE a.kind WHEN 'diff' THEN a.value - bb.value ELSE 100 * (a.value / nullif(bb.value, 0) - 1) END AS contrast
FROM side_values AS a
JOIN side_values AS bb ON bb.key = a.key AND bb.b = a.b AND bb.metric = a.metric AND bb.side = 'B'
WHERE a.side = 'A';

-- Per (pair, metric) what its interval rests on, the smaller side's: shared tasks with a nonzero denominator,
-- and the denominator's total over them.
CREATE OR REPLACE TEMP TABLE paired_support AS
SELECT key, metric, min(den_tasks)::BIGINT AS den_tasks, min(den_total)::BIGINT AS den_total
FROM (
    SELECT p.key, d.metric, p.side, count_if(p.value > 0) AS den_tasks, sum(p.value) AS den_total
    FROM paired_defs AS d
    JOIN paired_parts AS p ON p.part = d.den
    JOIN paired_tasks AS t ON t.key = p.key AND t.task_id = p.task_id
    GROUP BY ALL
)
GROUP BY key, metric;

CREATE OR REPLACE TEMP TABLE paired_intervals AS
SELECT unnest(c.key), c.metric, c.kind,
       any_value(t.m)::BIGINT AS shared_tasks,
       coalesce(any_value(s.den_tasks), 0) AS den_tasks,
       coalesce(any_value(s.den_total), 0) AS den_total,
       coalesce(any_value(s.den_tasks), 0) < getvariable('min_tasks')
           OR coalesce(any_value(s.den_total), 0) < getvariable('min_denominator') AS small_sample,
       any_value(c.value_a) FILTER (WHERE c.b = -1) AS value_a,
       any_value(c.value_b) FILTER (WHERE c.b = -1) AS value_b,
       any_value(c.contrast) FILTER (WHERE c.b = -1) AS value,
       CASE WHEN NOT small_sample THEN quantile_cont(c.contrast, getvariable('q_lo')) FILTER (WHERE c.b >= 0) END AS lo,
       CASE WHEN NOT small_sample THEN quantile_cont(c.contrast, getvariable('q_hi')) FILTER (WHERE c.b >= 0) END AS hi,
       count(c.contrast) FILTER (WHERE c.b >= 0) AS replicates_used
FROM paired_contrasts AS c
JOIN (SELECT key, any_value(m) AS m FROM paired_tasks GROUP BY key) AS t USING (key)
LEFT JOIN paired_support AS s ON s.key = c.key AND s.metric = c.metric
GROUP BY c.key, c.metric, c.kind, c.ord
ORDER BY c.key, c.ord, c.metric;
