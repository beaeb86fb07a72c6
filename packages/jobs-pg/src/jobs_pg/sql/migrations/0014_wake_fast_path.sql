-- jobs-pg migration 0014: a throttled wake() returns after one probe.
--
-- Most calls of wake() (every enqueue of a due row calls it) find each queue already notified in
-- the current 250 ms slot and not armed, and notify nobody. They still ran the whole notifying
-- statement: an INSERT ... ON CONFLICT into wake_slots over no rows, planned and executed with
-- its CTEs. pg_stat_statements over a soak at ~1,500 enqueues/s (8 callers, one worker): that
-- statement was 0.234 ms of the enqueue's 0.584 ms mean, 40 % of its server time, under
-- concurrent enqueues (alone, on an idle server, it costs a few tens of us). Now the lock, then one
-- probe that collects the queues due a NOTIFY: when there is none, the call ends there; else the
-- upsert runs over those alone. The notifying path, the slot rule and the wake lock (see 0002)
-- are unchanged.
CREATE OR REPLACE FUNCTION {schema}.wake(queues text[]) RETURNS bigint
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $fn$
DECLARE
    notified bigint;
    n bigint;
    due text[];
BEGIN
    IF coalesce(cardinality(queues), 0) = 0 THEN
        RETURN 0;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(hashtext('jobs-pg.wake'), hashtext({channel}));
    n := floor(extract(epoch FROM clock_timestamp()) * 4)::bigint;
    due := array(
        SELECT q.name FROM unnest(queues) AS q(name)
        WHERE NOT EXISTS (
            SELECT 1 FROM {schema}.wake_slots w
            WHERE w.queue = q.name AND NOT w.armed AND w.slot >= n
        )
    );
    IF cardinality(due) = 0 THEN
        RETURN 0;
    END IF;
    -- Two callers that both saw the queue due meet on its row: the second re-reads it after the
    -- first commits, finds it disarmed in the slot, and does not notify again.
    WITH marked AS (
        INSERT INTO {schema}.wake_slots AS w (queue, slot, armed)
        SELECT DISTINCT d.name, n, false FROM unnest(due) AS d(name) ORDER BY d.name
        ON CONFLICT (queue) DO UPDATE SET slot = EXCLUDED.slot, armed = false
        WHERE w.armed OR w.slot < EXCLUDED.slot
        RETURNING w.queue
    )
    SELECT count(pg_notify({channel}, marked.queue)) INTO notified FROM marked;
    RETURN notified;
END
$fn$;
