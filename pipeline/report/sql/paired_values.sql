-- The values the compared column takes among the rollouts counted, most rollouts first: the error for a value no
-- rollout has lists them. Variables: compare_col. Needs rollout_parts.
CREATE OR REPLACE TEMP TABLE paired_values AS
SELECT compared AS value, count(*) AS n
FROM (SELECT COLUMNS(lambda c: c = getvariable('compare_col'))::VARCHAR AS compared FROM rollout_parts)
WHERE compared IS NOT NULL
GROUP BY compared
ORDER BY n DESC, value;
