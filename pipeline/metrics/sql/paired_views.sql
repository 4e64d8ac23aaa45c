-- The rollouts and steps of two runs, A and B, side by side (pipeline.metrics.verdicts). Variables: a_rollouts_files,
-- b_rollouts_files, a_steps_files, b_steps_files: the parts each run's snapshot allows.
-- Every column of each run's rollouts: the condition labels are the run's own (paired_labels.sql).
CREATE OR REPLACE TEMP VIEW a_rollouts_all AS
SELECT * FROM read_parquet(getvariable('a_rollouts_files'), union_by_name = true, hive_partitioning = false);

CREATE OR REPLACE TEMP VIEW b_rollouts_all AS
SELECT * FROM read_parquet(getvariable('b_rollouts_files'), union_by_name = true, hive_partitioning = false);

CREATE OR REPLACE TEMP VIEW a_rollouts AS
SELECT rollout_id, task_id, benchmark, run_id, coalesce(status, 'ok') AS status, T, fed, executable, auc_term,
       regexp_extract(_file, 'part-([^/]+)\.parquet$', 1) AS shard
FROM (
    SELECT * FROM read_parquet(getvariable('a_rollouts_files'), union_by_name = true, hive_partitioning = false,
                               filename = '_file')
    UNION ALL BY NAME
    SELECT NULL::VARCHAR AS status WHERE false
);

CREATE OR REPLACE TEMP VIEW b_rollouts AS
SELECT rollout_id, task_id, benchmark, run_id, coalesce(status, 'ok') AS status, T, fed, executable, auc_term,
       regexp_extract(_file, 'part-([^/]+)\.parquet$', 1) AS shard
FROM (
    SELECT * FROM read_parquet(getvariable('b_rollouts_files'), union_by_name = true, hive_partitioning = false,
                               filename = '_file')
    UNION ALL BY NAME
    SELECT NULL::VARCHAR AS status WHERE false
);

-- The failed check was once stored as `check` (metrics/sql/view_steps.sql): either name reads as failed_check; the
-- empty row source makes every column read here exist in any layout. Steps are paired by depth among the agent's
-- calls: a user simulator's own calls (actor 'user', τ telecom) are not compared.
CREATE OR REPLACE TEMP VIEW a_steps AS
SELECT rollout_id, step, tool, valid, coalesce(failed_check, "check") AS failed_check, cause, detail
FROM (
    SELECT * FROM read_parquet(getvariable('a_steps_files'), union_by_name = true, hive_partitioning = false)
    UNION ALL BY NAME
    SELECT NULL::VARCHAR AS failed_check, NULL::VARCHAR AS "check", NULL::VARCHAR AS cause, NULL::VARCHAR AS detail,
           NULL::VARCHAR AS actor
    WHERE false
)
WHERE coalesce(actor, 'agent') = 'agent';

CREATE OR REPLACE TEMP VIEW b_steps AS
SELECT rollout_id, step, tool, valid, coalesce(failed_check, "check") AS failed_check, cause, detail
FROM (
    SELECT * FROM read_parquet(getvariable('b_steps_files'), union_by_name = true, hive_partitioning = false)
    UNION ALL BY NAME
    SELECT NULL::VARCHAR AS failed_check, NULL::VARCHAR AS "check", NULL::VARCHAR AS cause, NULL::VARCHAR AS detail,
           NULL::VARCHAR AS actor
    WHERE false
)
WHERE coalesce(actor, 'agent') = 'agent';
