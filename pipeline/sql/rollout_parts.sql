-- Per rollout, the integer parts that every metric is a ratio of sums of (metrics_prepare.sql sums them per
-- cohort and task, paired_prepare.sql per pair, side and task). Integers so that every bootstrap sum is exact
-- and independent of the order in which threads add rows up (a DOUBLE sum is not, in its last bits):
-- auc_term in units of 2^-40, each term rounded to the nearest unit (error <= 4.6e-13). Binary units keep the
-- last division exact, so TER <= AUC-PEC <= 1 holds exactly (an executable rollout is exactly 2^40 units).
-- RR's parts come from `executable` and `success`, the same columns as TER and the success rate, so that
-- success = TER * P(success | executable) + (1 - TER) * RR holds exactly.
CREATE OR REPLACE TEMP VIEW rollout_parts AS
SELECT *,
       1 AS p_n,
       executable::INTEGER AS p_exec,
       round(auc_term * 1099511627776::DOUBLE)::BIGINT AS p_auc,
       (success IS NOT NULL)::INTEGER AS p_known,
       (success IS TRUE)::INTEGER AS p_succ,
       (NOT executable AND success IS NOT NULL)::INTEGER AS p_elig,
       (NOT executable AND success IS TRUE)::INTEGER AS p_rec
FROM rollouts;
