-- Mean cost per cohort for every `cost_*` column (tokens, latency, ...); run only when the logs carry one.
-- n_known = rollouts with a value: a missing cost is left out of the mean, never counted as 0. Over rollout_parts:
-- the rollouts the metrics count. The mean is summed in one fixed order: DuckDB's parallel sum of doubles otherwise
-- differs in the last digits from run to run (7 distinct averages in 8 runs of 3M values).
CREATE OR REPLACE TEMP TABLE report_costs AS
SELECT unnest(key), cost, avg(value ORDER BY run_id, rollout_id, value) AS mean, count(value)::BIGINT AS n_known
FROM (
    UNPIVOT (
        SELECT struct_pack(*COLUMNS(lambda c: list_contains(getvariable('cohort_cols'), c))) AS key,
               run_id, rollout_id, COLUMNS('^cost_')::DOUBLE
        FROM rollout_parts
    ) ON COLUMNS('^cost_') INTO NAME cost VALUE value
)
GROUP BY key, cost
ORDER BY key, cost;
