-- Rollouts per cohort (the columns in variable `cohort_cols`) and first-error cause ('' = executable): the
-- counts behind the viewer's front page, and the check that a stored metrics.parquet still fits the run.
CREATE OR REPLACE TEMP TABLE cohort_causes AS
SELECT struct_pack(*COLUMNS(lambda c: list_contains(getvariable('cohort_cols'), c))) AS key,
       coalesce(first_cause, '') AS cause, count(*) AS n
FROM rollouts
GROUP BY ALL
ORDER BY ALL;
