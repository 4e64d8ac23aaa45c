-- Steps for a synthetic rollouts part (pipeline.apps.perf.view): calls 1..T, valid before the first error,
-- invalid at it (with the rollout's first cause), a tool picked by the call's position. Variables:
-- rollouts_part (read), steps_part (written).
COPY (
    SELECT r.run_id, r.rollout_id, r.task_id, r.benchmark, r.model,
           s.step::INTEGER AS step, 0 AS turn,
           'tool_' || ((s.step * 7 + length(r.rollout_id)) % 8)::VARCHAR AS tool,
           s.step < r.fed AS valid, s.step < r.fed AS prefix_executable,
           CASE WHEN s.step = r.fed THEN 'P' END AS failed_check,
           CASE WHEN s.step = r.fed THEN r.first_cause END AS cause,
           CASE WHEN s.step = r.fed THEN 'synthetic failure' END AS detail,
           'precondition' AS decided_by, NULL::BOOLEAN AS output_match
    FROM read_parquet(getvariable('rollouts_part')) AS r, generate_series(1, r.T) AS s(step)
    WHERE s.step <= least(r.fed, r.T)
) TO (getvariable('steps_part')) (FORMAT parquet, COMPRESSION zstd);
