-- The viewer's rollout filters (docs/explanation/architecture.md, "The viewer"); a NULL variable means "any". The label and status filters
-- (columns that differ from run to run), the tool filter and the page bounds are added by pipeline.apps.view._queries.
--   f_cause      first-error cause
--   f_tool       the tool of the first invalid call (view tool_steps)
--   f_fed        first-error depth; 0 for executable rollouts
--   f_success    the benchmark's verdict; 'null' for rollouts without one
--   f_mismatch   true: some replayed output differs from the logged one; false: none does
CREATE OR REPLACE TEMP VIEW filtered AS
SELECT *
FROM located AS r
WHERE (getvariable('f_cause') IS NULL OR r.first_cause = getvariable('f_cause'))
  AND (getvariable('f_fed') IS NULL
       OR (getvariable('f_fed') = 0 AND r.executable)
       OR (NOT r.executable AND r.fed = getvariable('f_fed')))
  AND (getvariable('f_success') IS NULL
       OR (getvariable('f_success') = 'null' AND r.success IS NULL)
       OR r.success::VARCHAR = getvariable('f_success'))
  AND (getvariable('f_mismatch') IS NULL OR (r.n_output_mismatch > 0) = getvariable('f_mismatch'));
-- The steps of tool f_tool: a rollout whose (run_id, _shard, rollout_id, fed) is among them failed first at a
-- call of that tool. Joined only when the filter is set (pipeline.apps.view._queries): a disjunction with
-- "f_tool IS NULL" would keep the tool condition from reaching the steps scan.
CREATE OR REPLACE TEMP VIEW tool_steps AS
SELECT run_id, _shard, rollout_id, step FROM steps_located WHERE tool = getvariable('f_tool') AND actor = 'agent';
