-- jobs-pg migration 0001: the initial schema.
--
-- Shipped files are never edited once released: a change is a new numbered file. Every name is
-- qualified with the driver's schema ({schema}, substituted as a quoted identifier).

-- Job rows. ``attempts`` counts SPENT attempts (a claim hands out attempt attempts + 1);
-- ``claim`` is the claim ordinal every settle is fenced on; ``seq`` breaks ``run_at`` ties in
-- insertion order; ``visible_at`` is a running row's lease expiry; ``wake_pending`` records an
-- event published for a waiting step while its run was still running, so the park that follows
-- makes the run due at once instead of at the backstop.
CREATE TABLE {schema}.jobs (
    id uuid PRIMARY KEY,
    seq bigint GENERATED ALWAYS AS IDENTITY,
    name text NOT NULL,
    queue text NOT NULL,
    input jsonb NOT NULL,
    idempotency_key text NOT NULL,
    tenant_id text,
    run_id uuid NOT NULL,
    state text NOT NULL,
    attempts integer NOT NULL DEFAULT 0,
    max_attempts integer NOT NULL,
    run_at timestamptz NOT NULL,
    visible_at timestamptz,
    claimed_by text,
    claim integer NOT NULL DEFAULT 0,
    wake_pending boolean NOT NULL DEFAULT false,
    last_error text,
    last_error_code text,
    last_error_stack text,
    result jsonb,
    progress jsonb,
    traceparent text,
    enqueued_by text,
    created_at timestamptz NOT NULL,
    updated_at timestamptz NOT NULL,
    CONSTRAINT jobs_state_known CHECK (
        state IN ('ready', 'delayed', 'running', 'suspended', 'done', 'failed', 'dead', 'cancelled')
    ),
    CONSTRAINT jobs_max_attempts_positive CHECK (max_attempts >= 1)
);

-- One LIVE row per (name, tenant or '', key): enqueue dedupe and C27 rest on this index.
CREATE UNIQUE INDEX jobs_live_key ON {schema}.jobs (name, (coalesce(tenant_id, '')), idempotency_key)
    WHERE state IN ('ready', 'delayed', 'running', 'suspended');

-- The claim walks this index per queue in (run_at, seq) order; it covers only waiting rows.
CREATE INDEX jobs_claim ON {schema}.jobs (queue, run_at, seq)
    WHERE state IN ('ready', 'delayed', 'suspended');

-- Finds running rows whose lease lapsed (normally none, so the claim's second arm is free).
CREATE INDEX jobs_lapse ON {schema}.jobs (visible_at) WHERE state = 'running';

-- The operator listing pages newest first by (created_at, id).
CREATE INDEX jobs_listing ON {schema}.jobs (created_at, id);

-- An event publish wakes suspended rows by run id.
CREATE INDEX jobs_run ON {schema}.jobs (run_id);

-- Every queue that ever had a row, so stats() and demand() list idle queues too.
CREATE TABLE {schema}.queues (
    name text PRIMARY KEY,
    created_at timestamptz NOT NULL
);

-- A pause is a row the claim reads, never a column on every job.
CREATE TABLE {schema}.paused_queues (
    queue text PRIMARY KEY,
    paused_at timestamptz NOT NULL
);

-- The wake throttle: the last 250 ms slot in which each queue was notified.
CREATE TABLE {schema}.wake_slots (
    queue text PRIMARY KEY,
    slot bigint NOT NULL
);

-- Throttled wake-up (20-pg.md): NOTIFY each queue named at most once per 250 ms slot, the
-- slot recorded in wake_slots by the calling statement's transaction, so a burst of enqueues
-- costs one NOTIFY (every NOTIFY serialises commits). Queues are locked in name order so two
-- statements waking the same queues cannot deadlock. Answers how many were notified.
CREATE FUNCTION {schema}.wake(queues text[]) RETURNS bigint
-- PL/pgSQL rather than SQL: its statement plan is kept for the session instead of being made
-- again at every call from every enqueue.
LANGUAGE plpgsql VOLATILE AS $fn$
DECLARE
    notified bigint;
BEGIN
    IF coalesce(cardinality(queues), 0) = 0 THEN
        RETURN 0;
    END IF;
    WITH slot AS (
        SELECT floor(extract(epoch FROM clock_timestamp()) * 4)::bigint AS n
    ),
    due AS (
        SELECT DISTINCT q.name, slot.n FROM unnest(queues) AS q(name), slot
        WHERE NOT EXISTS (
            SELECT 1 FROM {schema}.wake_slots w WHERE w.queue = q.name AND w.slot >= slot.n
        )
    ),
    marked AS (
        INSERT INTO {schema}.wake_slots AS w (queue, slot)
        SELECT due.name, due.n FROM due ORDER BY due.name
        ON CONFLICT (queue) DO UPDATE SET slot = EXCLUDED.slot WHERE w.slot < EXCLUDED.slot
        RETURNING w.queue
    )
    SELECT count(pg_notify({channel}, marked.queue)) INTO notified FROM marked;
    RETURN notified;
END
$fn$;

CREATE TABLE {schema}.job_steps (
    run_id uuid NOT NULL,
    name text NOT NULL,
    seq integer NOT NULL,
    status text NOT NULL,
    output jsonb,
    started_at timestamptz,
    completed_at timestamptz,
    wake_at timestamptz,
    event text,
    match jsonb,
    attempts integer NOT NULL DEFAULT 0,
    error text,
    once boolean NOT NULL DEFAULT false,
    PRIMARY KEY (run_id, name),
    CONSTRAINT job_steps_status_known CHECK (
        status IN ('started', 'completed', 'waiting', 'failed')
    )
);

-- An event publish finds the runs waiting for it by event name.
CREATE INDEX job_steps_waiting ON {schema}.job_steps (event) WHERE status = 'waiting';

CREATE TABLE {schema}.events (
    id uuid PRIMARY KEY,
    seq bigint GENERATED ALWAYS AS IDENTITY,
    name text NOT NULL,
    payload jsonb NOT NULL,
    correlation_key text,
    published_at timestamptz NOT NULL,
    expires_at timestamptz NOT NULL
);

CREATE INDEX events_find ON {schema}.events (name, published_at, seq);
CREATE INDEX events_expiry ON {schema}.events (expires_at);

-- Fleet-wide concurrency slots: (key, slot) is one place; an expired row is a free place.
CREATE TABLE {schema}.leases (
    lease_key text NOT NULL,
    slot integer NOT NULL,
    holder text NOT NULL,
    expires_at timestamptz NOT NULL,
    acquired_at timestamptz NOT NULL,
    PRIMARY KEY (lease_key, slot)
);

-- Enqueues staged on the caller's transaction; the id is the job id.
CREATE TABLE {schema}.outbox (
    id uuid PRIMARY KEY,
    name text NOT NULL,
    queue text NOT NULL,
    input jsonb NOT NULL,
    idempotency_key text NOT NULL,
    tenant_id text,
    max_attempts integer NOT NULL,
    run_id uuid NOT NULL,
    run_at timestamptz NOT NULL,
    traceparent text,
    enqueued_by text,
    staged_at timestamptz NOT NULL,
    claimed_at timestamptz,
    claimed_by text,
    claim_expires_at timestamptz,
    published_at timestamptz
);

CREATE INDEX outbox_unpublished ON {schema}.outbox (staged_at, id) WHERE published_at IS NULL;

CREATE TABLE {schema}.scheduler_state (
    task text PRIMARY KEY,
    watermark timestamptz NOT NULL,
    updated_at timestamptz NOT NULL
);

CREATE TABLE {schema}.task_fires (
    task text PRIMARY KEY,
    occurrence timestamptz NOT NULL,
    watermark timestamptz NOT NULL,
    fired_at timestamptz NOT NULL,
    job_ids uuid[] NOT NULL
);

CREATE TABLE {schema}.paused_tasks (
    task text PRIMARY KEY,
    paused_at timestamptz NOT NULL
);

CREATE TABLE {schema}.scheduler_leader (
    name text PRIMARY KEY,
    holder text NOT NULL,
    expires_at timestamptz NOT NULL
);

CREATE TABLE {schema}.workers (
    id text PRIMARY KEY,
    host text NOT NULL,
    build text NOT NULL,
    started_at timestamptz NOT NULL,
    queues text[] NOT NULL,
    slots integer NOT NULL,
    in_flight uuid[] NOT NULL,
    last_heartbeat timestamptz NOT NULL,
    draining_at timestamptz,
    expires_at timestamptz NOT NULL
);

-- Outcome counters. Settles add to the current 1-minute bucket of their connection's shard, so
-- concurrent settles of one job name never queue on one row lock; rollup folds the shards of
-- closed buckets into shard 0 and the tiers into coarser ones.
CREATE TABLE {schema}.counters (
    name text NOT NULL,
    tier text NOT NULL,
    bucket timestamptz NOT NULL,
    shard smallint NOT NULL,
    done bigint NOT NULL DEFAULT 0,
    retried bigint NOT NULL DEFAULT 0,
    failed bigint NOT NULL DEFAULT 0,
    dead bigint NOT NULL DEFAULT 0,
    duration_ms double precision NOT NULL DEFAULT 0,
    PRIMARY KEY (name, tier, bucket, shard),
    CONSTRAINT counters_tier_known CHECK (tier IN ('1m', '5m', '1h'))
);

-- The backfill ledger (50-factories.md): one row per pass.
CREATE TABLE {schema}.backfills (
    id uuid PRIMARY KEY,
    name text NOT NULL,
    checksum text NOT NULL,
    status text NOT NULL,
    app_version text,
    rows bigint NOT NULL DEFAULT 0,
    last_cursor jsonb,
    started_at timestamptz NOT NULL,
    completed_at timestamptz
);

CREATE INDEX backfills_name ON {schema}.backfills (name, started_at);
