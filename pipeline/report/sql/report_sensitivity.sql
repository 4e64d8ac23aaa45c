-- `report --sensitivity`: per cohort, the rollouts whose looser-level numbers come from verdicts that a rescoring
-- could change. The run was scored with every check on, so after a call rejected only by P (or by D) the later
-- calls were judged in a state without that call; with the check off it would have run and changed the state.
-- Variables: cohort_cols. Needs the view `rollout_parts`.
CREATE OR REPLACE TEMP TABLE report_sensitivity AS
SELECT unnest(key),
       count(*)::BIGINT AS n,
       count_if(fed < fed_schema_dependency AND fed < T)::BIGINT AS n_approx_schema_dependency,
       count_if(fed < fed_schema AND fed < T)::BIGINT AS n_approx_schema
FROM (
    SELECT struct_pack(*COLUMNS(lambda c: list_contains(getvariable('cohort_cols'), c))) AS key, *
    FROM rollout_parts
)
GROUP BY key
ORDER BY key;
