-- The steps of one rollout, read from the one steps part of its shard (variable r_steps).
CREATE OR REPLACE TEMP VIEW one_rollout_steps AS
SELECT * FROM read_parquet(getvariable('r_steps'))
WHERE run_id = getvariable('r_run') AND rollout_id = getvariable('r_id')
ORDER BY step;
