-- Each distinct (benchmark, task_id) of the view `rollouts` as the two 64-bit halves of an md5 of both, for
-- pipeline.metrics.drift to count the tasks two runs share. The text digested is `<length>:<benchmark>` then
-- `:<task_id>`, each `-` when NULL: no two pairs give the same text, whatever characters their ids hold.
CREATE OR REPLACE TEMP TABLE task_digests AS
WITH digested AS (
    SELECT DISTINCT md5_number(
        coalesce(length(benchmark)::VARCHAR || ':' || benchmark, '-') || coalesce(':' || task_id, '-')
    ) AS digest
    FROM rollouts
)
SELECT (digest >> 64)::UBIGINT AS hi, (digest & 18446744073709551615::UHUGEINT)::UBIGINT AS lo FROM digested;
