-- One rollout, named by (run_id, shard, rollout_id): variables r_run, r_shard, r_id.
CREATE OR REPLACE TEMP VIEW one_rollout AS
SELECT * FROM located
WHERE run_id = getvariable('r_run') AND _shard = getvariable('r_shard') AND rollout_id = getvariable('r_id');
