-- Harness-error rollouts per cohort, counted over every scored rollout (all_rollouts of view_population.sql),
-- whatever the population: they are always counted, and shown beside the metrics. Variables: cohort_cols.
CREATE OR REPLACE TEMP TABLE harness_counts AS
SELECT struct_pack(*COLUMNS(lambda c: list_contains(getvariable('cohort_cols'), c))) AS key,
       (count(*) FILTER (WHERE status = 'harness_error'))::BIGINT AS n_harness_error
FROM all_rollouts
GROUP BY key;
