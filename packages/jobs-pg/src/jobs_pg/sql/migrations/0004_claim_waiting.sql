-- jobs-pg migration 0004: the claim walks the claim index whatever the table's statistics say.
--
-- The claim's waiting arm wants the first `lim` due rows of a queue in (run_at, seq) order: an
-- ordered walk of jobs_claim that stops after `lim` rows is right for any backlog. The planner
-- only picks it when it expects many due rows. With no column statistics (after a bulk fill
-- that only VACUUM saw, or statistics gathered before a burst) it expected a handful and chose
-- a bitmap scan of every due row plus a sort: 1.5 s per claim over a 1M backlog. Here the walk
-- runs in a function whose plans are made with bitmap scans and sorts priced out, so it is the
-- only plan left; the plan is made once per session (PL/pgSQL keeps it; generic, forced).
CREATE FUNCTION {schema}.claim_waiting(queue text, at timestamptz, lim integer)
RETURNS TABLE (job_id uuid, job_run_at timestamptz, job_seq bigint)
LANGUAGE plpgsql VOLATILE
-- A claim takes tens of rows, not the default guess of 1,000 for a function's answer.
ROWS 100
SET enable_bitmapscan = off
SET enable_sort = off
SET plan_cache_mode = force_generic_plan
AS $fn$
BEGIN
    RETURN QUERY
    SELECT j.id, j.run_at, j.seq FROM {schema}.jobs j
    WHERE j.queue = claim_waiting.queue
      AND j.state IN ('ready', 'delayed', 'suspended')
      AND j.run_at <= at
    ORDER BY j.run_at, j.seq
    LIMIT lim
    FOR UPDATE OF j SKIP LOCKED;
END
$fn$;
