-- One row per replayed call (variable steps_files, as view_rollouts.sql).
-- The failed check was stored as `check` before it became `failed_check` (an SQL reserved word no query had to
-- quote): the empty row source with both columns makes either name exist, so runs of both layouts, and folders
-- of several runs mixing them, read as `failed_check`. Runs from before `actor` have only the agent's calls: their
-- rows read as actor 'agent', and `seq` (the position among both actors' calls) as `step`, the same way. Runs
-- scored before steps recorded `schema_source` read it as null.
CREATE OR REPLACE TEMP VIEW steps AS
SELECT * EXCLUDE ("check") REPLACE (
    coalesce(failed_check, "check") AS failed_check, coalesce(actor, 'agent') AS actor, coalesce(seq, step) AS seq
)
FROM (
    SELECT * FROM read_parquet(getvariable('steps_files'), union_by_name = true, hive_partitioning = false)
    UNION ALL BY NAME
    SELECT NULL::VARCHAR AS failed_check, NULL::VARCHAR AS "check", NULL::VARCHAR AS actor, NULL::INTEGER AS seq,
        NULL::VARCHAR AS schema_source
    WHERE false
);
