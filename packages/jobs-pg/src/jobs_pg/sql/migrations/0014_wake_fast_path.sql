-- jobs-pg migration 0014: a throttled wake() returns after one probe.
--
-- Most calls of wake() (every enqueue of a due row calls it) find each queue already notified in
-- the current 250 ms slot and not armed, and notify nobody. They still ran the whole notifying
-- statement: an INSERT ... ON CONFLICT into wake_slots over no rows, planned and executed with
-- its CTEs. pg_stat_statements over a soak at ~1,500 enqueues/s (8 callers, one worker): that
-- statement was 0.234 ms of the enqueue's 0.584 ms mean, 40 % of its server time; alone, on an
-- idle server, a throttled call cost 63 us over a bare SELECT. Now the lock, then one probe:
-- when no named queue is due a NOTIFY, the call ends there (18 us over a bare SELECT). The
-- notifying path, the slot rule and the wake lock (see 0002) are unchanged.
CREATE OR REPLACE FUNCTION {schema}.wake(queues text[]) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $fn$
DECLARE
    notified bigint;
    n bigint;
BEGIN
    IF coalesce(cardinality(queues), 0) = 0 THEN
        RETURN 0;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(hashtext('jobs-pg.wake'), hashtext({channel}));
    n := floor(extract(epoch FROM clock_timestamp()) * 4)::bigint;
    IF NOT EXISTS (
        SELECT 1 FROM unnest(queues) AS q(name)
        WHERE NOT EXISTS (
            SELECT 1 FROM {schema}.wake_slots w
            WHERE w.queue = q.name AND NOT w.armed AND w.slot >= n
        )
    ) THEN
        RETURN 0;
    END IF;
    -- Two callers that both saw the queue due meet on its row: the second re-reads it after the
    -- first commits, finds it disarmed in the slot, and does not notify again.
    WITH due AS (
        SELECT DISTINCT q.name FROM unnest(queues) AS q(name)
        WHERE NOT EXISTS (
            SELECT 1 FROM {schema}.wake_slots w
            WHERE w.queue = q.name AND NOT w.armed AND w.slot >= n
        )
    ),
    marked AS (
        INSERT INTO {schema}.wake_slots AS w (queue, slot, armed)
        SELECT due.name, n, false FROM due ORDER BY due.name
        ON CONFLICT (queue) DO UPDATE SET slot = EXCLUDED.slot, armed = false
        WHERE w.armed OR w.slot < EXCLUDED.slot
        RETURNING w.queue
    )
    SELECT count(pg_notify({channel}, marked.queue)) INTO notified FROM marked;
    RETURN notified;
END
$fn$;
