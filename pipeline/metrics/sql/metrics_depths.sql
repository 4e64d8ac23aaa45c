-- What metrics_prepare.sql needs to know before it reads the rollouts: K of PEC(k), and the depths some rollout
-- has. Variables set by pipeline.metrics.cohorts: max_k (BIGINT or NULL).

-- K of PEC(k): max_k if given, else the run's largest T, at most 20.
SET VARIABLE pexec_k = coalesce(getvariable('max_k'), least((SELECT max(T) FROM rollout_parts), 20), 0);

-- A rollout's PEC depth is min(T, FED - 1, K); the depths >= 1 that occur get a histogram column each
-- (pipeline.metrics.cohorts makes the view rollout_keys with one column per depth).
CREATE OR REPLACE TEMP TABLE pec_depths AS
SELECT DISTINCT least(T, fed - 1, getvariable('pexec_k')) AS depth
FROM rollout_parts
WHERE least(T, fed - 1, getvariable('pexec_k')) >= 1;
