-- The viewer's rollout filters (docs/design.md §5.6); a NULL variable means "any". The label and status filters
-- (columns that differ from run to run) and the page bounds are added by pipeline.view.queries (label columns differ from run to run).
--   f_cause      first-error cause
--   f_tool       the tool of the first invalid call
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
  AND (getvariable('f_mismatch') IS NULL OR (r.n_output_mismatch > 0) = getvariable('f_mismatch'))
  AND (getvariable('f_tool') IS NULL OR EXISTS (
       SELECT 1 FROM steps_located AS s
       WHERE s.run_id = r.run_id AND s._shard = r._shard AND s.rollout_id = r.rollout_id AND s.step = r.fed
         AND s.tool = getvariable('f_tool')));
