-- How many rollouts each run has and how many both have (the same rollout_id for the same task), over
-- paired_views.sql: whether two runs can be compared step by step.
CREATE OR REPLACE TEMP VIEW paired_shared AS
SELECT (SELECT count(*) FROM a_rollouts) AS rollouts_a,
       (SELECT count(*) FROM b_rollouts) AS rollouts_b,
       (SELECT count(*) FROM (
            SELECT DISTINCT rollout_id, task_id FROM a_rollouts
            INTERSECT
            SELECT DISTINCT rollout_id, task_id FROM b_rollouts
       )) AS shared;
