-- The delivery ledger of jobs-webhooks: one row per attempt, one row per endpoint's health.
-- Applied by PostgresWebhookLedger.migrate(), recorded in {schema}.webhook_migrations (its own
-- bookkeeping: jobs-pg's migrations table numbers the driver's files).

CREATE TABLE {schema}.webhook_endpoints (
    endpoint_id          text        PRIMARY KEY,
    consecutive_failures integer     NOT NULL DEFAULT 0 CHECK (consecutive_failures >= 0),
    disabled_at          timestamptz,
    updated_at           timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE {schema}.webhook_attempts (
    id             bigint           GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    endpoint_id    text             NOT NULL,
    event_id       text             NOT NULL,
    topic          text             NOT NULL,
    attempt        integer          NOT NULL CHECK (attempt >= 1),
    url            text             NOT NULL,
    started_at     timestamptz      NOT NULL,
    duration_ms    double precision NOT NULL,
    outcome        text             NOT NULL
        CHECK (outcome IN ('delivered', 'failed', 'throttled', 'rejected', 'refused')),
    status         integer,
    code           text,
    excerpt        text             NOT NULL DEFAULT '',
    retry_after_ms bigint,
    job_id         uuid,
    run_id         uuid
);

-- An endpoint's attempts, newest first (the owner's view), and one event's attempts.
CREATE INDEX webhook_attempts_endpoint ON {schema}.webhook_attempts (endpoint_id, id DESC);
CREATE INDEX webhook_attempts_event ON {schema}.webhook_attempts (event_id, id DESC);
-- Retention: purge(before) deletes by start time.
CREATE INDEX webhook_attempts_started ON {schema}.webhook_attempts (started_at);
