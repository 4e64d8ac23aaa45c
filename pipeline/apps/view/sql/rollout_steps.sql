-- The steps of one rollout (variables r_run, r_id), over the `steps` view of its shard's part (view_steps.sql).
CREATE OR REPLACE TEMP VIEW one_rollout_steps AS
SELECT * FROM steps
WHERE run_id = getvariable('r_run') AND rollout_id = getvariable('r_id')
ORDER BY seq;
