-- What metrics_prepare.sql needs to know before it reads the rollouts: K of PEC(k), and the depths some rollout
-- has. Variables set by pipeline.metrics.cohorts: max_k (BIGINT or NULL), default_max_k, min_default_k.

-- K of PEC(k): max_k if given, else the run's largest T, at most default_max_k and at least min_default_k (the
-- depths the metrics table shows; PEC is 0 past every rollout's length); 0 for a run without rollouts
-- (pipeline.metrics.settings.default_k).
SET VARIABLE pexec_run_max_t = (SELECT max(T) FROM rollout_parts);
SET VARIABLE pexec_k = CASE
    WHEN getvariable('max_k') IS NOT NULL THEN getvariable('max_k')
    WHEN getvariable('pexec_run_max_t') IS NULL THEN 0
    ELSE greatest(least(getvariable('pexec_run_max_t'), getvariable('default_max_k')), getvariable('min_default_k'))
END;

-- A rollout's PEC depth is min(T, FED - 1, K); the depths >= 1 that occur get a histogram column each
-- (pipeline.metrics.cohorts makes the view rollout_keys with one column per depth).
CREATE OR REPLACE TEMP TABLE pec_depths AS
SELECT DISTINCT least(T, fed - 1, getvariable('pexec_k')) AS depth
FROM rollout_parts
WHERE least(T, fed - 1, getvariable('pexec_k')) >= 1;
