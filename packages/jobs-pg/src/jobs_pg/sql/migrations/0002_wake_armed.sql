-- jobs-pg migration 0002: a wake is never swallowed while a worker waits for it.
--
-- 0001 sent at most one NOTIFY per queue per 250 ms slot: a second enqueue in the slot of one a
-- worker had already claimed (probes 200 ms apart often are) woke nobody, and its row waited for
-- the worker's next poll. Now a queue is also "armed" once a worker found it empty after hearing
-- its last NOTIFY (wake_arm(), called by that worker): the next wake() of an armed queue notifies
-- at once and disarms it. Under load nothing re-arms a queue (its workers' claims keep finding
-- rows), so a burst still costs one NOTIFY per slot; each idle spell of a worker costs one more.

ALTER TABLE {schema}.wake_slots ADD COLUMN armed boolean NOT NULL DEFAULT true;

-- wake(): NOTIFY each named queue that is armed, or not notified yet in this 250 ms slot, and
-- disarm it, in the calling statement's transaction. Every call first takes the schema's wake
-- lock in SHARE mode until that transaction ends (no two callers ever wait for each other):
-- wake_arm() takes it exclusively, so it re-arms only after every transaction that decided not
-- to notify has committed its rows. Answers how many queues were notified.
CREATE OR REPLACE FUNCTION {schema}.wake(queues text[]) RETURNS bigint
-- PL/pgSQL rather than SQL: its statement plans are kept for the session instead of being made
-- again at every call from every enqueue. The generic plan is forced because the custom one
-- (re-planned at every call, its unnest() estimate differing) cost ~0.2 ms of server CPU per call.
LANGUAGE plpgsql VOLATILE
SET plan_cache_mode = force_generic_plan
AS $fn$
DECLARE
    notified bigint;
BEGIN
    IF coalesce(cardinality(queues), 0) = 0 THEN
        RETURN 0;
    END IF;
    PERFORM pg_advisory_xact_lock_shared(hashtext('jobs-pg.wake'), hashtext({channel}));
    WITH slot AS (
        SELECT floor(extract(epoch FROM clock_timestamp()) * 4)::bigint AS n
    ),
    due AS (
        SELECT DISTINCT q.name, slot.n FROM unnest(queues) AS q(name), slot
        WHERE NOT EXISTS (
            SELECT 1 FROM {schema}.wake_slots w
            WHERE w.queue = q.name AND NOT w.armed AND w.slot >= slot.n
        )
    ),
    -- Two callers that both saw the queue due meet on its row: the second re-reads it after the
    -- first commits, finds it disarmed in the slot, and does not notify again.
    marked AS (
        INSERT INTO {schema}.wake_slots AS w (queue, slot, armed)
        SELECT due.name, due.n, false FROM due ORDER BY due.name
        ON CONFLICT (queue) DO UPDATE SET slot = EXCLUDED.slot, armed = false
        WHERE w.armed OR w.slot < EXCLUDED.slot
        RETURNING w.queue
    )
    SELECT count(pg_notify({channel}, marked.queue)) INTO notified FROM marked;
    RETURN notified;
END
$fn$;

-- wake_arm(): a worker that heard a queue's NOTIFY and then found it empty re-arms it. Waiting
-- for the wake lock (at most 20 ms, so enqueuers queued behind this request are never held
-- longer) orders this after every wake() caller still in flight: one that saw the queue
-- disarmed committed its rows before the re-arm, so they are visible to the check that follows,
-- and one that comes later sees the queue armed and notifies. Answers NULL when the lock stayed
-- busy (nothing changed: try again later), else whether a row of the queues is due now (the
-- caller then claims once more instead of waiting).
CREATE FUNCTION {schema}.wake_arm(queues text[], at timestamptz) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $fn$
BEGIN
    IF NOT EXISTS (
        SELECT 1 FROM {schema}.wake_slots w WHERE w.queue = ANY(queues) AND NOT w.armed
    ) THEN
        RETURN false;
    END IF;
    PERFORM set_config('lock_timeout', '20ms', true);
    -- The flag is a hint (a lost re-arm only means a poll): its commit need not wait for a flush.
    PERFORM set_config('synchronous_commit', 'off', true);
    BEGIN
        PERFORM pg_advisory_xact_lock(hashtext('jobs-pg.wake'), hashtext({channel}));
    EXCEPTION WHEN lock_not_available THEN
        RETURN NULL;
    END;
    UPDATE {schema}.wake_slots SET armed = true WHERE queue = ANY(queues) AND NOT armed;
    RETURN EXISTS (
        SELECT 1 FROM {schema}.jobs j
        WHERE j.queue = ANY(queues)
          AND j.state IN ('ready', 'delayed', 'suspended')
          AND j.run_at <= at
          AND NOT EXISTS (SELECT 1 FROM {schema}.paused_queues p WHERE p.queue = j.queue)
    );
END
$fn$;
