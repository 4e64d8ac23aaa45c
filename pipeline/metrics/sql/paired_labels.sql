-- Shared rollouts (the same rollout_id for the same task) whose condition labels differ between the two runs, over
-- paired_views.sql: two runs of the same rollouts carry the same labels, so a differing one says the ids collide
-- (two models' logs numbered alike) rather than that the rollouts are the same. Variables: label_cols (VARCHAR[],
-- the label columns both runs have, at least one). `example`: the first such rollout by id, its labels in A and B.
CREATE OR REPLACE TEMP TABLE paired_relabelled AS
WITH a AS (
    SELECT rollout_id, task_id, struct_pack(*COLUMNS(lambda c: list_contains(getvariable('label_cols'), c))) AS labels
    FROM (
        SELECT rollout_id, task_id, COLUMNS(lambda c: list_contains(getvariable('label_cols'), c))::VARCHAR
        FROM a_rollouts_all
    )
),
b AS (
    SELECT rollout_id, task_id, struct_pack(*COLUMNS(lambda c: list_contains(getvariable('label_cols'), c))) AS labels
    FROM (
        SELECT rollout_id, task_id, COLUMNS(lambda c: list_contains(getvariable('label_cols'), c))::VARCHAR
        FROM b_rollouts_all
    )
)
SELECT count(*) AS relabelled,
       arg_min(struct_pack(a := a.labels::VARCHAR, b := b.labels::VARCHAR), rollout_id) AS example
FROM a JOIN b USING (rollout_id, task_id)
WHERE a.labels IS DISTINCT FROM b.labels;
