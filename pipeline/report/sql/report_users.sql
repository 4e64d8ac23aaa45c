-- The user simulator's own calls per cohort (dual control, τ telecom), run only when the rollouts carry `user_T`: a
-- diagnostic beside the agent's headline. n_with_user_calls = rollouts whose user made calls; over those, its calls,
-- invalid calls, and rollouts whose user calls were all valid. Over rollout_parts: the rollouts the metrics count.
CREATE OR REPLACE TEMP TABLE report_users AS
SELECT unnest(key),
       count(*) FILTER (WHERE user_T > 0)::BIGINT AS n_with_user_calls,
       coalesce(sum(user_T), 0)::BIGINT AS n_user_calls,
       coalesce(sum(user_n_invalid), 0)::BIGINT AS n_user_invalid,
       count(*) FILTER (WHERE user_T > 0 AND user_fed = user_T + 1)::BIGINT AS n_user_executable
FROM (
    SELECT struct_pack(*COLUMNS(lambda c: list_contains(getvariable('cohort_cols'), c))) AS key, user_T, user_fed,
           user_n_invalid
    FROM rollout_parts
)
GROUP BY key
HAVING count(*) FILTER (WHERE user_T > 0) > 0
ORDER BY key;
