-- Cost parts of the paired comparison, for every `cost_*` column; run only when the logs carry one. Costs are
-- summed in integer micro-units (exact, order-independent sums), with the count of rollouts that have a
-- value (a missing cost is left out, never counted as 0). The metric is the change of the mean cost in % of
-- B's: 100 * (mean_A / mean_B - 1), kind 'pct'.
CREATE OR REPLACE TEMP TABLE paired_cost_values AS
SELECT key, side, task_id, cost, value
FROM (
    UNPIVOT (SELECT key, side, task_id, COLUMNS('^cost_')::DOUBLE FROM paired_rollouts)
    ON COLUMNS('^cost_') INTO NAME cost VALUE value
);

INSERT INTO paired_parts
SELECT key, side, task_id, cost, sum(round(value * 1000000)::BIGINT)::BIGINT
FROM paired_cost_values GROUP BY ALL
UNION ALL
SELECT key, side, task_id, 'n_' || cost, count(*)::BIGINT
FROM paired_cost_values GROUP BY ALL;

INSERT INTO paired_defs
SELECT DISTINCT cost, cost, 'n_' || cost, 1000000.0, 'pct', 100 FROM paired_cost_values;
