-- Two runs of the same rollouts compared step by step (pipeline.metrics.verdicts), over paired_views.sql.
-- Variables: auc_unit, examples. A rollout is paired by its rollout_id and task_id (the environment, and so
-- `benchmark`, may differ between the runs: a rescore under another spec); a harness error in either run leaves it out (counted).

-- Rollout ids that repeat within one run cannot be paired (a folder of several runs of the same rollouts).
CREATE OR REPLACE TEMP TABLE paired_repeats AS
SELECT (SELECT count(*) - count(DISTINCT rollout_id) FROM a_rollouts) AS repeated_a,
       (SELECT count(*) - count(DISTINCT rollout_id) FROM b_rollouts) AS repeated_b;

CREATE OR REPLACE TEMP TABLE paired_rollouts AS
SELECT a.rollout_id, a.task_id, a.benchmark AS benchmark_a, b.benchmark AS benchmark_b,
       a.run_id AS run_a, a.shard AS shard_a, b.run_id AS run_b, b.shard AS shard_b,
       a.status = 'harness_error' OR b.status = 'harness_error' AS harness_error,
       a.T AS t_a, b.T AS t_b, a.fed AS fed_a, b.fed AS fed_b,
       a.executable AS exec_a, b.executable AS exec_b, a.auc_term AS auc_a, b.auc_term AS auc_b
FROM a_rollouts a JOIN b_rollouts b USING (rollout_id, task_id);

CREATE OR REPLACE TEMP TABLE paired_counts AS
SELECT (SELECT count(*) FROM a_rollouts) AS rollouts_a,
       (SELECT count(*) FROM b_rollouts) AS rollouts_b,
       count(*) AS shared,
       count(*) FILTER (WHERE harness_error) AS harness_errors,
       count(*) FILTER (WHERE NOT harness_error) AS compared,
       count(DISTINCT task_id) FILTER (WHERE NOT harness_error) AS tasks,
       count(*) FILTER (WHERE NOT harness_error AND fed_a <> fed_b) AS fed_changed,
       count(*) FILTER (WHERE NOT harness_error AND exec_a AND NOT exec_b) AS became_not_executable,
       count(*) FILTER (WHERE NOT harness_error AND NOT exec_a AND exec_b) AS became_executable,
       count(*) FILTER (WHERE NOT harness_error AND t_a <> t_b) AS calls_differ
FROM paired_rollouts;

-- One row per step of a compared rollout, in either run; `kind` says how its verdict changed (the first that
-- applies): only in one run (the rollouts differ in length), valid -> invalid, invalid -> valid, the failed check
-- changed, the cause changed, or the same.
CREATE OR REPLACE TEMP TABLE step_pairs AS
WITH both_runs AS (
    SELECT coalesce(a.rollout_id, b.rollout_id) AS rollout_id, coalesce(a.step, b.step) AS step,
           coalesce(b.tool, a.tool) AS tool, a.step IS NULL OR b.step IS NULL AS unmatched,
           a.valid AS valid_a, b.valid AS valid_b, a.failed_check AS check_a, b.failed_check AS check_b,
           a.cause AS cause_a, b.cause AS cause_b, a.detail AS detail_a, b.detail AS detail_b
    FROM a_steps a FULL JOIN b_steps b ON a.rollout_id = b.rollout_id AND a.step = b.step
)
SELECT s.rollout_id, r.task_id, s.step, s.tool, s.check_a, s.check_b, s.cause_a, s.cause_b, s.detail_a, s.detail_b,
       CASE
           WHEN s.unmatched THEN 'unmatched'
           WHEN s.valid_a AND NOT s.valid_b THEN 'valid_to_invalid'
           WHEN NOT s.valid_a AND s.valid_b THEN 'invalid_to_valid'
           WHEN NOT s.valid_a AND s.check_a IS DISTINCT FROM s.check_b THEN 'check_changed'
           WHEN NOT s.valid_a AND s.cause_a IS DISTINCT FROM s.cause_b THEN 'cause_changed'
           ELSE 'same'
       END AS kind
FROM both_runs s JOIN paired_rollouts r ON r.rollout_id = s.rollout_id AND NOT r.harness_error;

CREATE OR REPLACE TEMP VIEW flips AS SELECT * FROM step_pairs WHERE kind NOT IN ('same', 'unmatched');

CREATE OR REPLACE TEMP VIEW paired_kinds AS
SELECT kind, count(*) AS steps, count(DISTINCT rollout_id) AS rollouts, count(DISTINCT task_id) AS tasks
FROM step_pairs GROUP BY kind ORDER BY kind;

CREATE OR REPLACE TEMP VIEW paired_by_tool AS
SELECT kind, tool, count(*) AS steps FROM flips GROUP BY ALL ORDER BY kind, steps DESC, tool;

CREATE OR REPLACE TEMP VIEW paired_by_cause AS
SELECT kind, cause_a, cause_b, count(*) AS steps FROM flips GROUP BY ALL ORDER BY kind, steps DESC, cause_a, cause_b;

CREATE OR REPLACE TEMP VIEW paired_by_check AS
SELECT kind, check_a, check_b, count(*) AS steps FROM flips GROUP BY ALL ORDER BY kind, steps DESC, check_a, check_b;

-- The first rollouts (by id) of each kind, with where each run holds them (for links into `pexec view`).
CREATE OR REPLACE TEMP VIEW paired_examples AS
SELECT f.kind, f.rollout_id, f.task_id, min(f.step) AS first_step, count(*) AS steps,
       any_value(r.run_a) AS run_a, any_value(r.shard_a) AS shard_a,
       any_value(r.run_b) AS run_b, any_value(r.shard_b) AS shard_b
FROM flips f JOIN paired_rollouts r USING (rollout_id)
GROUP BY f.kind, f.rollout_id, f.task_id
QUALIFY row_number() OVER (PARTITION BY f.kind ORDER BY f.rollout_id) <= getvariable('examples')
ORDER BY f.kind, f.rollout_id;

-- Per-task sums (tasks in task_id order: the bootstrap's draws index them so): steps compared, flips of each
-- kind, rollouts, and the paired rollout quantities (auc_term in units of auc_unit, exact integers).
CREATE OR REPLACE TEMP TABLE paired_task_sums AS
WITH st AS (
    SELECT task_id,
           count(*) FILTER (WHERE kind <> 'unmatched') AS steps,
           count(*) FILTER (WHERE kind NOT IN ('same', 'unmatched')) AS flips,
           count(*) FILTER (WHERE kind = 'valid_to_invalid') AS to_invalid,
           count(*) FILTER (WHERE kind = 'invalid_to_valid') AS to_valid
    FROM step_pairs GROUP BY task_id
), ro AS (
    SELECT task_id, count(*) AS n,
           sum(exec_a::INTEGER) AS exec_a, sum(exec_b::INTEGER) AS exec_b,
           sum(round(auc_a * getvariable('auc_unit'))::BIGINT) AS auc_a,
           sum(round(auc_b * getvariable('auc_unit'))::BIGINT) AS auc_b,
           sum(fed_a) AS fed_a, sum(fed_b) AS fed_b
    FROM paired_rollouts WHERE NOT harness_error GROUP BY task_id
)
SELECT ro.task_id, ro.n::BIGINT AS n, ro.exec_a::BIGINT AS exec_a, ro.exec_b::BIGINT AS exec_b,
       ro.auc_a::BIGINT AS auc_a, ro.auc_b::BIGINT AS auc_b, ro.fed_a::BIGINT AS fed_a, ro.fed_b::BIGINT AS fed_b,
       coalesce(st.steps, 0)::BIGINT AS steps, coalesce(st.flips, 0)::BIGINT AS flips,
       coalesce(st.to_invalid, 0)::BIGINT AS to_invalid, coalesce(st.to_valid, 0)::BIGINT AS to_valid
FROM ro LEFT JOIN st USING (task_id)
ORDER BY ro.task_id;
