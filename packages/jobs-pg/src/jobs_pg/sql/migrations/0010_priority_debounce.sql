-- jobs-pg migration 0010: claim priorities and debounced enqueues (issue 24).
--
-- priority: lower is claimed first within a queue (jobs_core.priority, a smallint's range),
-- FIFO by (run_at, seq) within one priority. debounced: the row came from a debounced enqueue,
-- which holds its live key only until its first claim (claim > 0), so the next burst of the same
-- key makes a new row while this one runs. Both are NOT NULL with a constant default: a
-- catalog-only change, no table rewrite.
ALTER TABLE {schema}.jobs ADD COLUMN priority smallint NOT NULL DEFAULT 0;
ALTER TABLE {schema}.jobs ADD COLUMN debounced boolean NOT NULL DEFAULT false;
-- A staged enqueue keeps its priority until the relay publishes it.
ALTER TABLE {schema}.outbox ADD COLUMN priority smallint NOT NULL DEFAULT 0;

-- The claim index leads with priority: a claim walks each priority's due rows in (run_at, seq)
-- order, lowest priority first (claim_waiting() below), replacing 0001's (queue, run_at, seq).
DROP INDEX {schema}.jobs_claim;
CREATE INDEX jobs_claim ON {schema}.jobs (queue, priority, run_at, seq)
    WHERE state IN ('ready', 'delayed', 'suspended');

-- The live key: a debounced row that was claimed no longer holds it.
DROP INDEX {schema}.jobs_live_key;
CREATE UNIQUE INDEX jobs_live_key ON {schema}.jobs (name, (coalesce(tenant_id, '')), idempotency_key)
    WHERE state IN ('ready', 'delayed', 'running', 'suspended') AND NOT (debounced AND claim > 0);

-- claim_waiting(): the first `lim` due rows of a queue, lowest priority first, then (run_at,
-- seq). A loose index scan: the next priority present is one LIMIT 1 probe of jobs_claim past
-- the last, and each priority's due rows are one ordered walk that stops at `lim` (or at its
-- first row not due yet), so rows waiting for later never make the walk read on; the cost is a
-- few probes per priority present in the queue, whatever the backlog. Same planner settings as
-- migration 0004 (bitmap scans and sorts priced out, a generic plan kept for the session).
DROP FUNCTION {schema}.claim_waiting(text, timestamptz, integer);
CREATE FUNCTION {schema}.claim_waiting(queue text, at timestamptz, lim integer)
RETURNS TABLE (job_id uuid, job_priority smallint, job_run_at timestamptz, job_seq bigint)
LANGUAGE plpgsql VOLATILE
ROWS 100
SET enable_bitmapscan = off
SET enable_sort = off
SET plan_cache_mode = force_generic_plan
AS $fn$
DECLARE
    p smallint;
    got bigint := 0;
    n bigint;
BEGIN
    SELECT j.priority INTO p FROM {schema}.jobs j
    WHERE j.queue = claim_waiting.queue AND j.state IN ('ready', 'delayed', 'suspended')
    ORDER BY j.priority
    LIMIT 1;
    WHILE p IS NOT NULL AND got < lim LOOP
        RETURN QUERY
        SELECT j.id, j.priority, j.run_at, j.seq FROM {schema}.jobs j
        WHERE j.queue = claim_waiting.queue
          AND j.state IN ('ready', 'delayed', 'suspended')
          AND j.priority = p
          AND j.run_at <= at
        ORDER BY j.run_at, j.seq
        LIMIT lim - got
        FOR UPDATE OF j SKIP LOCKED;
        GET DIAGNOSTICS n = ROW_COUNT;
        got := got + n;
        SELECT j.priority INTO p FROM {schema}.jobs j
        WHERE j.queue = claim_waiting.queue AND j.state IN ('ready', 'delayed', 'suspended')
          AND j.priority > p
        ORDER BY j.priority
        LIMIT 1;
    END LOOP;
END
$fn$;

-- first_waiting(): the earliest run_at after `after` of a queue's waiting rows (NULL: none),
-- by the same loose scan (one LIMIT 1 probe per priority present), for the probes that used to
-- read jobs_claim in run_at order: an idle worker's timer and an enqueue's wake decision.
-- STABLE, so inside a statement it reads that statement's snapshot (not the rows it inserts).
CREATE FUNCTION {schema}.first_waiting(queue text, after timestamptz)
RETURNS timestamptz
LANGUAGE plpgsql STABLE
SET enable_bitmapscan = off
SET enable_sort = off
SET plan_cache_mode = force_generic_plan
AS $fn$
DECLARE
    p smallint;
    t timestamptz;
    best timestamptz;
BEGIN
    SELECT j.priority INTO p FROM {schema}.jobs j
    WHERE j.queue = first_waiting.queue AND j.state IN ('ready', 'delayed', 'suspended')
    ORDER BY j.priority
    LIMIT 1;
    WHILE p IS NOT NULL LOOP
        SELECT j.run_at INTO t FROM {schema}.jobs j
        WHERE j.queue = first_waiting.queue
          AND j.state IN ('ready', 'delayed', 'suspended')
          AND j.priority = p
          AND j.run_at > after
        ORDER BY j.run_at
        LIMIT 1;
        IF t IS NOT NULL AND (best IS NULL OR t < best) THEN
            best := t;
        END IF;
        SELECT j.priority INTO p FROM {schema}.jobs j
        WHERE j.queue = first_waiting.queue AND j.state IN ('ready', 'delayed', 'suspended')
          AND j.priority > p
        ORDER BY j.priority
        LIMIT 1;
    END LOOP;
    RETURN best;
END
$fn$;
