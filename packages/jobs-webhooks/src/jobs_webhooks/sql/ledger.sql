-- The statements of PostgresWebhookLedger, one named block each ("-- name: x").
-- {schema} is the ledger's schema, quoted by psycopg.sql.Identifier.

-- name: record
-- One statement: the attempt's row, and its endpoint's count (reset by a delivered attempt,
-- else one more, disabling at disable_after). The upsert's row lock orders two attempts at one
-- endpoint, so the count never loses an increment.
WITH attempt AS (
    INSERT INTO {schema}.webhook_attempts (
        endpoint_id, event_id, topic, attempt, url, started_at, duration_ms, outcome, status,
        code, excerpt, retry_after_ms, job_id, run_id
    ) VALUES (
        %(endpoint_id)s, %(event_id)s, %(topic)s, %(attempt)s, %(url)s, %(started_at)s,
        %(duration_ms)s, %(outcome)s, %(status)s, %(code)s, %(excerpt)s, %(retry_after_ms)s,
        %(job_id)s, %(run_id)s
    )
)
INSERT INTO {schema}.webhook_endpoints AS e (endpoint_id, consecutive_failures, disabled_at)
VALUES (
    %(endpoint_id)s,
    CASE WHEN %(outcome)s = 'delivered' THEN 0 ELSE 1 END,
    CASE WHEN %(outcome)s <> 'delivered' AND %(disable_after)s::integer <= 1
         THEN %(started_at)s::timestamptz END
)
ON CONFLICT (endpoint_id) DO UPDATE SET
    consecutive_failures = CASE WHEN %(outcome)s = 'delivered' THEN 0
                                ELSE e.consecutive_failures + 1 END,
    disabled_at = coalesce(e.disabled_at, CASE
        WHEN %(outcome)s <> 'delivered'
         AND e.consecutive_failures + 1 >= %(disable_after)s::integer
        THEN %(started_at)s::timestamptz END),
    updated_at = now()
RETURNING consecutive_failures, disabled_at;

-- name: health
SELECT consecutive_failures, disabled_at
FROM {schema}.webhook_endpoints
WHERE endpoint_id = %(endpoint_id)s;

-- name: enable
UPDATE {schema}.webhook_endpoints
SET consecutive_failures = 0, disabled_at = NULL, updated_at = now()
WHERE endpoint_id = %(endpoint_id)s;

-- name: disable
INSERT INTO {schema}.webhook_endpoints AS e (endpoint_id, disabled_at)
VALUES (%(endpoint_id)s, now())
ON CONFLICT (endpoint_id) DO UPDATE SET
    disabled_at = coalesce(e.disabled_at, now()), updated_at = now();

-- name: attempts
-- Newest first; either filter may be NULL (both NULL: every endpoint's attempts).
SELECT endpoint_id, event_id, topic, attempt, url, started_at, duration_ms, outcome, status,
       code, excerpt, retry_after_ms, job_id, run_id
FROM {schema}.webhook_attempts
WHERE (%(endpoint_id)s::text IS NULL OR endpoint_id = %(endpoint_id)s::text)
  AND (%(event_id)s::text IS NULL OR event_id = %(event_id)s::text)
ORDER BY id DESC
LIMIT %(limit)s;

-- name: purge
DELETE FROM {schema}.webhook_attempts WHERE started_at < %(before)s;
