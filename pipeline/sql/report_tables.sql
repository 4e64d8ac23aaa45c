-- Descriptive tables of `pexec report` (docs/design.md §2 "Aggregates", "Paper check"), one row per cohort (× category).
-- Variables set by pipeline.report.tables: cohort_cols (VARCHAR[]: 'benchmark' and the `by` labels).
-- Every table starts with the cohort's label columns (unnest of the key struct), so Python joins by value.

CREATE OR REPLACE TEMP TABLE report_rollouts AS
SELECT struct_pack(*COLUMNS(lambda c: list_contains(getvariable('cohort_cols'), c))) AS key,
       task_id, T, fed, executable, success, first_cause
FROM rollouts;

-- The recovery arithmetic: success = (executable and successful) + (invalid prefix and successful).
-- Rollouts with an unknown verdict (success IS NULL) are counted apart and enter no numerator.
CREATE OR REPLACE TEMP TABLE report_recovery AS
SELECT unnest(key),
       count(*)::BIGINT AS n,
       count_if(executable)::BIGINT AS n_executable,
       count_if(executable AND success)::BIGINT AS n_executable_success,
       count_if(NOT executable)::BIGINT AS n_invalid_prefix,
       count_if(NOT executable AND success)::BIGINT AS n_invalid_prefix_success,
       count_if(success)::BIGINT AS n_success,
       count_if(success IS NULL)::BIGINT AS n_success_unknown,
       count_if(NOT executable AND success)::DOUBLE / nullif(count_if(success), 0)::DOUBLE
           AS share_successes_after_invalid_prefix
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
