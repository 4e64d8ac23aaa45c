-- The population every aggregate counts (docs/explanation/data-model.md), over the view `rollouts` of view_rollouts.sql, which
-- this file renames `run_rollouts` (all rows, as scored). Variables set by pipeline.metrics.cohorts:
--   harness_errors  'exclude': harness-error rollouts are left out; 'fail': they count as non-executable
--                   failures (executable false, fed 1, auc_term 0, success false, recovered false,
--                   first_cause 'harness_error'; T and the steps stay as scored);
--   pool_from, pool_to  (VARCHAR[]) benchmark pool_from[i] is counted as benchmark pool_to[i]; its task ids get
--                   the original benchmark as a prefix, so tasks stay distinct per benchmark in the bootstrap.
-- Runs scored before rollouts had a status have no such column: their rows count as `ok` (status NULL); tables
-- without recovered/first_cause, or scored before tools had effect classes (n_writes … weighted_auc_term), get
-- them as NULL: the harm metrics of such rollouts are undefined, never 0 (pipeline/core/metric_catalogue.py, part `eff`); so
-- are the check-level metrics of runs scored before fed_schema (part `lvl`).
ALTER VIEW rollouts RENAME TO run_rollouts;

CREATE OR REPLACE TEMP VIEW all_rollouts AS
SELECT * REPLACE (
    coalesce(
        list_extract(getvariable('pool_to')::VARCHAR[], list_position(getvariable('pool_from')::VARCHAR[], benchmark)),
        benchmark
    ) AS benchmark,
    CASE WHEN list_contains(getvariable('pool_from')::VARCHAR[], benchmark) THEN benchmark || '/' || task_id
         ELSE task_id END AS task_id
)
FROM (
    SELECT * FROM run_rollouts
    UNION ALL BY NAME
    SELECT NULL::VARCHAR AS status, NULL::BOOLEAN AS recovered, NULL::VARCHAR AS first_cause,
           NULL::INTEGER AS n_writes, NULL::INTEGER AS n_unclassified, NULL::INTEGER AS n_invalid_irreversible,
           NULL::INTEGER AS write_fed, NULL::DOUBLE AS write_auc_term, NULL::DOUBLE AS weighted_auc_term,
           NULL::INTEGER AS fed_schema, NULL::INTEGER AS fed_schema_dependency
    WHERE false
);

CREATE OR REPLACE TEMP VIEW rollouts AS
SELECT * REPLACE (
    CASE WHEN status = 'harness_error' THEN false ELSE executable END AS executable,
    CASE WHEN status = 'harness_error' THEN 1 ELSE fed END AS fed,
    CASE WHEN status = 'harness_error' THEN 0.0 ELSE auc_term END AS auc_term,
    CASE WHEN status = 'harness_error' THEN 0.0 ELSE weighted_auc_term END AS weighted_auc_term,
    CASE WHEN status = 'harness_error' THEN 1 ELSE fed_schema END AS fed_schema,
    CASE WHEN status = 'harness_error' THEN 1 ELSE fed_schema_dependency END AS fed_schema_dependency,
    CASE WHEN status = 'harness_error' THEN false ELSE success END AS success,
    CASE WHEN status = 'harness_error' THEN false ELSE recovered END AS recovered,
    CASE WHEN status = 'harness_error' THEN 'harness_error' ELSE first_cause END AS first_cause
)
FROM all_rollouts
WHERE status IS DISTINCT FROM 'harness_error' OR getvariable('harness_errors') = 'fail';
