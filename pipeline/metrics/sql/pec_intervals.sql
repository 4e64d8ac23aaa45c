-- The percentile interval of PEC(k) per cohort, from its replicates' shares (pipeline.metrics.pec registers
-- pec_shares: cohort, and a column p_<depth> per depth column, NULL where a replicate drew no rollout). The same
-- quantile_cont as metrics_intervals.sql, per column: lo_<depth> and hi_<depth>.
CREATE OR REPLACE TEMP TABLE pec_intervals AS
SELECT cohort,
       quantile_cont(COLUMNS('^p_(.*)$'), getvariable('q_lo')) AS 'lo_\1',
       quantile_cont(COLUMNS('^p_(.*)$'), getvariable('q_hi')) AS 'hi_\1'
FROM pec_shares
GROUP BY cohort;
