-- Descriptive tables of `pexec report` (docs/explanation/definitions.md, "Aggregates" and "The identity and the paper check"), one row per cohort (× category).
-- Variables set by pipeline.report._tables: cohort_cols (VARCHAR[]: 'benchmark' and the `by` labels).
-- Every table starts with the cohort's label columns (unnest of the key struct), so Python joins by value.

-- rollout_parts: the rollouts the metrics count (all, or under --strict-replay those whose replay did not
-- diverge before their first error), with the catalogue's parts p_<name>.
CREATE OR REPLACE TEMP TABLE report_rollouts AS
SELECT struct_pack(*COLUMNS(lambda c: list_contains(getvariable('cohort_cols'), c))) AS key,
       task_id, T, fed, executable, success, first_cause, COLUMNS('^p_')
FROM rollout_parts;

-- The recovery arithmetic, from the same parts as the metrics (pipeline/core/metric_catalogue.py), so its counts are the
-- metrics' numerators and denominators: over the rollouts with a verdict (p_known),
-- with a verdict = executable with a verdict (p_exec_known) + invalid prefix with a verdict (p_elig = RR n),
-- successes (p_succ) = executable & successful (p_succ_exec) + invalid prefix & successful (p_rec).
-- Rollouts without a verdict are counted apart (n_unknown_success) and enter none of these.
CREATE OR REPLACE TEMP TABLE report_recovery AS
SELECT unnest(key),
       count(*)::BIGINT AS n,
       count_if(success IS NULL)::BIGINT AS n_unknown_success,
       sum(p_known)::BIGINT AS n_with_verdict,
       sum(p_exec_known)::BIGINT AS n_executable_with_verdict,
       sum(p_succ_exec)::BIGINT AS n_executable_success,
       count_if(NOT executable)::BIGINT AS n_invalid_prefix,
       sum(p_elig)::BIGINT AS n_invalid_prefix_with_verdict,
       sum(p_rec)::BIGINT AS n_invalid_prefix_success,
       sum(p_succ)::BIGINT AS n_success,
       sum(p_rec)::DOUBLE / nullif(sum(p_succ), 0)::DOUBLE AS share_successes_after_invalid_prefix
FROM report_rollouts
GROUP BY key
ORDER BY key;

-- First-cause distribution over the rollouts with an invalid prefix (executable rollouts have no cause).
CREATE OR REPLACE TEMP TABLE report_causes AS
SELECT unnest(key), cause, n, n::DOUBLE / sum(n) OVER (PARTITION BY key)::DOUBLE AS share
FROM (
    SELECT key, coalesce(first_cause, 'unknown') AS cause, count(*)::BIGINT AS n
    FROM report_rollouts
    WHERE NOT executable
    GROUP BY key, cause
)
ORDER BY key, cause;

-- FED histogram: rollouts by first-error depth; fed = T + 1 (fully executable) is its own bin, `executable`.
CREATE OR REPLACE TEMP TABLE report_fed AS
SELECT unnest(key), executable, fed, n, n::DOUBLE / sum(n) OVER (PARTITION BY key)::DOUBLE AS share
FROM (
    SELECT key, executable, CASE WHEN executable THEN NULL ELSE fed END AS fed, count(*)::BIGINT AS n
    FROM report_rollouts
    GROUP BY ALL
)
ORDER BY key, executable, fed;

-- Largest depth in the run: the PEC curves are drawn up to it (at most 20, as metrics_prepare.sql).
CREATE OR REPLACE TEMP TABLE report_depth AS SELECT coalesce(max(T), 0)::BIGINT AS max_t FROM report_rollouts;
