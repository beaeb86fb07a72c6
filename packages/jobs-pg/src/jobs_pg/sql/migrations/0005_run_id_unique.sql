-- jobs-pg migration 0005: a run id belongs to one job.
--
-- Steps are keyed by run id alone, so a new job inserted under a run id an earlier job used
-- would answer that job's step outputs (a new checkout answered with the old charge, never
-- charging). The run id index becomes unique; the enqueue statement answers a request whose run
-- id another row holds by calling run_id_taken(), which raises, so the statement inserts nothing
-- at all. A schema where two rows already share a run id cannot take this migration; list them
-- with: SELECT run_id, array_agg(id) FROM jobs GROUP BY run_id HAVING count(*) > 1.
DROP INDEX {schema}.jobs_run;
CREATE UNIQUE INDEX jobs_run ON {schema}.jobs (run_id);

-- Raised by the enqueue statement; the driver maps it to X_JOB_RUN_ID_TAKEN (the holder's id is
-- the DETAIL, the constraint the index's name).
CREATE FUNCTION {schema}.run_id_taken(run uuid, holder uuid) RETURNS uuid
LANGUAGE plpgsql VOLATILE
AS $fn$
BEGIN
    RAISE EXCEPTION 'run id % belongs to job %', run, holder
        USING ERRCODE = 'unique_violation', CONSTRAINT = 'jobs_run', DETAIL = holder::text;
END
$fn$;
