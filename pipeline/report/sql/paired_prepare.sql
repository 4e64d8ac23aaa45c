-- Paired comparison A - B (docs/explanation/intervals.md, "Paired differences": the same task draws for both conditions, over the tasks they
-- share). Variables set by pipeline.report.paired: pair_cols (VARCHAR[]: 'benchmark' and the `by` labels other
-- than the compared column), compare_col, compare_a, compare_b, ks (BIGINT[]: the k of PEC@k), seed, B.
-- Needs the view `rollouts` and the macros of hash.sql.

-- The rollouts of both conditions with their pair key and side; all columns kept (the cost_* ones are
-- read by paired_costs.sql).
CREATE OR REPLACE TEMP TABLE paired_rollouts AS
SELECT * EXCLUDE (compared),
       CASE compared WHEN getvariable('compare_a') THEN 'A' WHEN getvariable('compare_b') THEN 'B' END AS side
FROM (
    SELECT struct_pack(*COLUMNS(lambda c: list_contains(getvariable('pair_cols'), c))) AS key,
           COLUMNS(lambda c: c = getvariable('compare_col'))::VARCHAR AS compared,
           *
    FROM rollout_parts
)
WHERE side IS NOT NULL;

-- Per (pair, side, task) sums of the parts of rollout_parts.sql, long: part -> value (exact integers).
CREATE OR REPLACE TEMP TABLE paired_parts AS
SELECT key, side, task_id, part, sum(value)::BIGINT AS value
FROM (
    UNPIVOT (SELECT key, side, task_id, COLUMNS('^p_')::BIGINT FROM paired_rollouts)
    ON COLUMNS('^p_') INTO NAME part VALUE value
)
GROUP BY key, side, task_id, part
UNION ALL
-- PEC@k numerators: #{T >= k and FED > k} = #{min(T, FED - 1) >= k}.
SELECT key, side, task_id, 'pec' || k AS part, count_if(least(T, fed - 1) >= k)::BIGINT AS value
FROM paired_rollouts CROSS JOIN (SELECT unnest(getvariable('ks')) AS k)
GROUP BY key, side, task_id, k;

-- The catalogue's ratio metrics (variable metric_defs, as in metrics_intervals.sql), then PEC@k after them:
-- value = sum(num) / sum(den) / scale; kind 'diff' reports A - B.
CREATE OR REPLACE TEMP TABLE paired_defs AS
SELECT metric, 'p_' || num AS num, 'p_' || den AS den, scale, 'diff' AS kind, ord
FROM (SELECT unnest(getvariable('metric_defs'), recursive := true))
UNION ALL
SELECT 'pec@' || k, 'pec' || k, 'p_n', 1.0, 'diff', len(getvariable('metric_defs')) + k
FROM (SELECT unnest(getvariable('ks')) AS k);

-- Which of the two conditions occur at all (an absent one is the user's typo, reported by name).
CREATE OR REPLACE TEMP TABLE paired_sides AS SELECT DISTINCT side FROM paired_rollouts;
