-- Every statement jobs-pg runs, one named block each (``-- name: <block>``).
--
-- Placeholders filled once at load time: {schema} (the driver's schema, a quoted identifier),
-- {now} (the statement's clock: ``now()`` of the database, or the instant a test injected) and,
-- in the blocks that filter jobs, {filter} (the ``job_filter`` block). Parameters are psycopg's
-- named ``%(name)s``. To run one by hand, substitute those and the parameters; nothing else is
-- hidden. Braces never appear in the SQL itself (the loader formats the text), and the modulo
-- operator is written mod().

-- name: job_filter
-- The operator listing filter (JobFilter); every field is optional and they combine with AND.
(%(f_queue)s::text IS NULL OR j.queue = %(f_queue)s)
AND (%(f_name)s::text IS NULL OR j.name = %(f_name)s)
AND (%(f_state)s::text IS NULL OR j.state = %(f_state)s)
AND (%(f_tenant)s::text IS NULL OR j.tenant_id = %(f_tenant)s)
AND (%(f_prefix)s::text IS NULL OR starts_with(j.id::text, %(f_prefix)s))
AND (%(f_from)s::timestamptz IS NULL OR j.created_at >= %(f_from)s)
AND (%(f_to)s::timestamptz IS NULL OR j.created_at < %(f_to)s)

-- name: enqueue
-- Inserts up to 1,000 rows in one statement. ON CONFLICT DO NOTHING covers the primary key (an
-- explicit id that already names a row), the live-key index (dedupe) and the run id index; the
-- final SELECT answers each request that inserted nothing with the row that holds it: the row its
-- id names, the live row holding its key, or an earlier request of this batch with the same key;
-- one whose run id another row holds raises X_JOB_RUN_ID_TAKEN instead. A request answered
-- by nothing lost a race with a transaction that committed after this statement's snapshot; the
-- driver runs those again. Due rows wake their queues through the throttle (wake()).
-- The requests come as one JSON array of objects keyed by column (a JSON null input comes out
-- as SQL NULL, hence the coalesce). A JSON recordset's row estimate is fixed, so the plan (and
-- its cost) is the same for 1 and for 1,000 requests: the prepared statement keeps its generic
-- plan instead of being planned again at every run, and a batch is never JIT-compiled.
WITH req AS (
    SELECT r.id, r.run_id, r.name, r.queue, coalesce(r.input, 'null') AS input,
           r.idempotency_key, r.tenant_id, r.max_attempts, r.traceparent, r.enqueued_by, r.ord,
           coalesce(r.priority, 0) AS priority,
           r.parent_run_id,
           greatest(coalesce(r.run_at, {now} + r.delay_ms * interval '1 millisecond'), {now}) AS due
    FROM ROWS FROM (
        json_to_recordset(%(rows)s::json) AS (
            id uuid, run_id uuid, name text, queue text, input jsonb, idempotency_key text,
            tenant_id text, max_attempts integer, run_at timestamptz, delay_ms bigint,
            traceparent text, enqueued_by text, priority smallint, parent_run_id uuid
        )
    ) WITH ORDINALITY AS r(id, run_id, name, queue, input, idempotency_key, tenant_id,
                           max_attempts, run_at, delay_ms, traceparent, enqueued_by, priority,
                           parent_run_id, ord)
),
inserted AS (
    INSERT INTO {schema}.jobs AS j (
        id, run_id, name, queue, input, idempotency_key, tenant_id, state, max_attempts,
        run_at, traceparent, enqueued_by, created_at, updated_at, priority, parent_run_id
    )
    SELECT id, run_id, name, queue, input, idempotency_key, tenant_id,
           CASE WHEN due > {now} THEN 'delayed' ELSE 'ready' END, max_attempts,
           due, traceparent, enqueued_by, {now}, {now}, priority, parent_run_id
    FROM req
    ORDER BY ord
    ON CONFLICT DO NOTHING
    RETURNING j.id, j.run_id, j.name, j.tenant_id, j.idempotency_key, j.queue, j.run_at
),
known AS (
    INSERT INTO {schema}.queues (name, created_at)
    SELECT DISTINCT queue, {now} FROM inserted
    ON CONFLICT DO NOTHING
),
-- A queue is woken for a row due within a second, and for a row due later that comes before
-- every other waiting row of its queue due later than now (first_waiting(), migration 0010: one
-- probe of jobs_claim per priority present in the queue):
-- an idle worker sleeps until the earliest due row it knows of, and must hear of an earlier one.
later AS (
    SELECT queue, min(run_at) AS first FROM inserted
    WHERE run_at > {now} + interval '1 second'
    GROUP BY queue
),
woken AS (
    SELECT {schema}.wake(array(
        SELECT queue FROM inserted WHERE run_at <= {now} + interval '1 second'
        UNION
        SELECT l.queue FROM later l
        WHERE coalesce({schema}.first_waiting(l.queue, {now}) > l.first, true)
    )) AS notified
)
-- A summary row (no position) carries how many queues were woken (and makes the wake run: a plain
-- CTE runs only when read); then one row per request that inserted nothing, by its position, with
-- the row that holds it (NULL: none visible, run it again). An inserted request is not answered:
-- its row is the id and run id it brought.
SELECT NULL::bigint, NULL::uuid, NULL::uuid, (SELECT notified FROM woken)
UNION ALL
(SELECT r.ord, coalesce(e.id, k.id, b.id, x.id), coalesce(e.run_id, k.run_id, b.run_id), NULL
FROM req r
-- Each lookup is a LIMIT 1 lateral: the planner cannot turn it into a hash join over the whole
-- table (a plan cached while the table was small would scan it at every enqueue).
LEFT JOIN LATERAL (
    SELECT e.id, e.run_id FROM {schema}.jobs e WHERE e.id = r.id LIMIT 1
) e ON true
LEFT JOIN LATERAL (
    SELECT j.id, j.run_id FROM {schema}.jobs j
    WHERE e.id IS NULL
      AND j.name = r.name AND coalesce(j.tenant_id, '') = coalesce(r.tenant_id, '')
      AND j.idempotency_key = r.idempotency_key
      AND j.state IN ('ready', 'delayed', 'running', 'suspended')
      AND NOT (j.debounced AND j.claim > 0)
    LIMIT 1
) k ON true
LEFT JOIN LATERAL (
    SELECT b.id, b.run_id FROM inserted b
    WHERE e.id IS NULL
      AND b.name = r.name AND coalesce(b.tenant_id, '') = coalesce(r.tenant_id, '')
      AND b.idempotency_key = r.idempotency_key
    LIMIT 1
) b ON true
-- A request that met neither its id nor a live key inserted nothing because another row holds
-- its run id: run_id_taken() raises, and the whole statement inserts nothing (migration 0005).
LEFT JOIN LATERAL (
    SELECT {schema}.run_id_taken(r.run_id, x.id) AS id FROM {schema}.jobs x
    WHERE e.id IS NULL AND k.id IS NULL AND b.id IS NULL AND x.run_id = r.run_id
    LIMIT 1
) x ON true
WHERE NOT EXISTS (SELECT 1 FROM inserted i WHERE i.id = r.id)
ORDER BY r.ord)

-- name: enqueue_debounce
-- One debounced enqueue (migration 0010), an upsert on the live key: with no live row holding
-- the key it inserts a row due now + debounce; when a live row holds it and still waits for its
-- first claim (ready or delayed, claim 0), that row takes the request's input and priority and is
-- due now + debounce, capped at its first enqueue (created_at) + debounce_max, never before now;
-- a holder already claimed is answered unchanged (only a non-debounced one can hold the key then).
-- Answers (id, run_id, inserted); no row: the holder committed after this statement's snapshot,
-- and the driver runs it again. The queue is woken (through the throttle) either way: an idle
-- worker sleeping until a later instant must hear of the new due time.
WITH up AS (
    INSERT INTO {schema}.jobs AS j (
        id, run_id, name, queue, input, idempotency_key, tenant_id, state, max_attempts,
        run_at, traceparent, enqueued_by, created_at, updated_at, priority, debounced
    )
    VALUES (
        %(id)s, %(run_id)s, %(name)s, %(queue)s, %(input)s::jsonb, %(key)s, %(tenant)s,
        'delayed', %(max_attempts)s, {now} + %(debounce_ms)s * interval '1 millisecond',
        %(traceparent)s, %(enqueued_by)s, {now}, {now}, %(priority)s, true
    )
    ON CONFLICT (name, (coalesce(tenant_id, '')), idempotency_key)
        WHERE state IN ('ready', 'delayed', 'running', 'suspended') AND NOT (debounced AND claim > 0)
    DO UPDATE SET
        input = EXCLUDED.input,
        priority = EXCLUDED.priority,
        debounced = true,
        run_at = greatest({now}, least(
            EXCLUDED.run_at,
            j.created_at + %(debounce_max_ms)s::bigint * interval '1 millisecond'
        )),
        state = CASE WHEN greatest({now}, least(
            EXCLUDED.run_at,
            j.created_at + %(debounce_max_ms)s::bigint * interval '1 millisecond'
        )) > {now} THEN 'delayed' ELSE 'ready' END,
        updated_at = {now}
    WHERE j.state IN ('ready', 'delayed') AND j.claim = 0
    RETURNING j.id, j.run_id, j.queue, j.xmax = 0 AS inserted
),
known AS (
    INSERT INTO {schema}.queues (name, created_at)
    SELECT queue, {now} FROM up WHERE inserted
    ON CONFLICT DO NOTHING
),
woken AS (
    SELECT {schema}.wake(array(SELECT queue FROM up)) AS notified
)
SELECT id, run_id, inserted, (SELECT notified FROM woken) FROM up
UNION ALL
SELECT h.id, h.run_id, false, NULL FROM {schema}.jobs h
WHERE NOT EXISTS (SELECT 1 FROM up)
  AND h.name = %(name)s AND coalesce(h.tenant_id, '') = coalesce(%(tenant)s, '')
  AND h.idempotency_key = %(key)s
  AND h.state IN ('ready', 'delayed', 'running', 'suspended')
  AND NOT (h.debounced AND h.claim > 0)

-- name: claim
-- One statement per claim over every queue served. Arm 1 walks each unpaused queue's claim index
-- in (priority, run_at, seq) order (lowest priority first, migration 0010), locking with SKIP LOCKED so concurrent claimers take different rows
-- (in claim_waiting(), which keeps that plan whatever the table's statistics say).
-- Arm 2 takes running rows whose lease lapsed (normally none): it runs only when a probe finds one
-- (an ordered LIMIT 1 walk of jobs_lapse, which marks the entries of settled rows dead as it passes
-- them, so later probes skip them; a bitmap scan, the planner's choice for the arm itself, would
-- fetch every dead row version behind the index at every claim). Merged in (priority, run_at,
-- seq) order, the
-- first `limit` rows that are not at their final attempt are handed out (a lapsed one spends its
-- attempt); a lapsed row at its final attempt that comes before the cut is buried, dead or (for
-- names in `drop`) failed, and counted. Rows locked but not handed out are released when the
-- statement ends. Each row says whether its run has step records yet.
-- The claim commits without waiting for its WAL flush (`synchronous_commit` off for this
-- statement's transaction only): an idle worker's pickup waited for that flush at every claim. A
-- lease is safe to lose: a server crash forgets at most the last fraction of a second of claims,
-- whose rows are then claimed again (at least once, as after a lapsed lease), and their workers'
-- settles miss the fence. Anything durable a claimed attempt writes (a step, its ack) flushes the
-- WAL up to itself, the claim's commit record included. The setting is a one-time filter of the
-- outermost query, the one node that always runs (in a CTE, a join over an empty table skipped it).
WITH served AS (
    SELECT DISTINCT u.name FROM unnest(%(queues)s::text[]) AS u(name)
    WHERE NOT EXISTS (SELECT 1 FROM {schema}.paused_queues p WHERE p.queue = u.name)
),
waiting AS (
    SELECT c.id, c.priority, c.run_at, c.seq, false AS lapsed, false AS final
    FROM served
    CROSS JOIN LATERAL {schema}.claim_waiting(served.name, {now}, %(limit)s)
        AS c(id, priority, run_at, seq)
),
lapsed AS (
    SELECT j.id, j.priority, j.run_at, j.seq, true AS lapsed,
           j.attempts + 1 >= j.max_attempts AS final
    FROM {schema}.jobs j
    WHERE j.state = 'running'
      AND j.visible_at <= {now}
      AND j.queue IN (SELECT name FROM served)
      AND EXISTS (
          SELECT 1 FROM {schema}.jobs probe
          WHERE probe.state = 'running' AND probe.visible_at <= {now}
          ORDER BY probe.visible_at
          LIMIT 1
      )
    ORDER BY j.priority, j.run_at, j.seq
    LIMIT %(limit)s + 100
    FOR UPDATE OF j SKIP LOCKED
),
ranked AS (
    SELECT id, lapsed, final,
           count(*) FILTER (WHERE NOT final) OVER (ORDER BY priority, run_at, seq) AS taken
    FROM (SELECT * FROM waiting UNION ALL SELECT * FROM lapsed) AS candidates
),
claimed AS (
    UPDATE {schema}.jobs j
    SET state = 'running',
        claimed_by = %(worker)s,
        claim = j.claim + 1,
        wake_pending = false,
        attempts = j.attempts + CASE WHEN r.lapsed THEN 1 ELSE 0 END,
        visible_at = {now} + %(lease_ms)s * interval '1 millisecond',
        updated_at = {now}
    FROM ranked r
    WHERE j.id = r.id AND NOT r.final AND r.taken <= %(limit)s
    RETURNING j.id, j.run_id, j.name, j.queue, j.input, j.attempts, j.max_attempts, j.claim,
              j.tenant_id, j.idempotency_key, j.traceparent, j.enqueued_by, j.created_at,
              j.state, j.run_at, j.seq, j.priority, j.parent_run_id
),
buried AS (
    UPDATE {schema}.jobs j
    SET state = CASE WHEN j.name = ANY(%(drop)s::text[]) THEN 'failed' ELSE 'dead' END,
        attempts = j.attempts + 1,
        last_error = %(reason)s,
        -- Its attempts ran out (jobs_core.errors.MaxAttemptsError's code).
        last_error_code = 'X_JOB_MAX_ATTEMPTS',
        last_error_stack = NULL,
        updated_at = {now}
    FROM ranked r
    WHERE j.id = r.id AND r.final AND r.taken < %(limit)s
    RETURNING j.id, j.run_id, j.name, j.queue, j.input, j.attempts, j.max_attempts, j.claim,
              j.tenant_id, j.idempotency_key, j.traceparent, j.enqueued_by, j.created_at,
              j.state, j.run_at, j.seq, j.priority, j.parent_run_id
),
counted AS (
    INSERT INTO {schema}.counters AS c (name, tier, bucket, shard, failed, dead)
    SELECT name, '1m', to_timestamp(floor(extract(epoch FROM {now}) / 60) * 60),
           mod(pg_backend_pid(), 16), count(*) FILTER (WHERE state = 'failed'),
           count(*) FILTER (WHERE state = 'dead')
    FROM buried
    GROUP BY name
    ON CONFLICT (name, tier, bucket, shard) DO UPDATE
    SET failed = c.failed + EXCLUDED.failed, dead = c.dead + EXCLUDED.dead
)
SELECT settled.*,
       -- Whether the run has step records: a worker loads them before the body, and a run
       -- without any (most first attempts) is answered without that query.
       EXISTS (SELECT 1 FROM {schema}.job_steps s WHERE s.run_id = settled.run_id)
FROM (SELECT * FROM claimed UNION ALL SELECT * FROM buried) AS settled
WHERE (SELECT set_config('synchronous_commit', 'off', true)) IS NOT NULL
ORDER BY settled.priority, settled.run_at, settled.seq

-- name: ack
-- Settles many rows done in one statement, each fenced on (state, claimed_by, claim); answers
-- the ids that were settled. The counters ride in the same statement, on this connection's shard.
-- The arrays go in binary (the b placeholders): psycopg dumps them several times faster so.
WITH settle AS (
    SELECT * FROM unnest(
        %(ids)b::uuid[], %(workers)b::text[], %(claims)b::int[], %(results)b::text[],
        %(durations)b::float8[]
    ) AS s(id, worker, claim, result, duration_ms)
),
done AS (
    UPDATE {schema}.jobs j
    SET state = 'done',
        attempts = j.attempts + 1,
        result = s.result::jsonb,
        updated_at = {now}
    FROM settle s
    WHERE j.id = s.id AND j.state = 'running' AND j.claimed_by = s.worker AND j.claim = s.claim
    RETURNING j.id, j.name, s.duration_ms
),
counted AS (
    INSERT INTO {schema}.counters AS c (name, tier, bucket, shard, done, duration_ms)
    SELECT name, '1m', to_timestamp(floor(extract(epoch FROM {now}) / 60) * 60),
           mod(pg_backend_pid(), 16), count(*), coalesce(sum(duration_ms), 0)
    FROM done
    GROUP BY name
    ON CONFLICT (name, tier, bucket, shard) DO UPDATE
    SET done = c.done + EXCLUDED.done, duration_ms = c.duration_ms + EXCLUDED.duration_ms
)
SELECT id FROM done

-- name: nack
-- Settles one row in the state nack_state() chose, fenced like ack. A row settled ready, delayed
-- or suspended is due at now + delay_ms and wakes its queue when that is within a second; a park
-- whose run an event woke while it was still running (wake_pending) is due now. The counters
-- gain retried, failed or dead in the same statement.
WITH settled AS (
    UPDATE {schema}.jobs j
    SET state = %(state)s,
        attempts = j.attempts + %(spent)s,
        last_error = CASE WHEN %(has_error)s THEN %(error)s ELSE j.last_error END,
        last_error_code = CASE WHEN %(has_error)s THEN %(error_code)s ELSE j.last_error_code END,
        last_error_stack = CASE WHEN %(has_error)s THEN %(error_stack)s ELSE j.last_error_stack END,
        run_at = CASE WHEN %(state)s = 'suspended' AND j.wake_pending THEN {now}
                      WHEN %(state)s IN ('ready', 'delayed', 'suspended')
                      THEN {now} + %(delay_ms)s * interval '1 millisecond'
                      ELSE j.run_at END,
        wake_pending = false,
        updated_at = {now}
    WHERE j.id = %(id)s AND j.state = 'running' AND j.claimed_by = %(worker)s
      AND j.claim = %(claim)s
    RETURNING j.name, j.queue, j.state, j.run_at
),
counted AS (
    INSERT INTO {schema}.counters AS c (name, tier, bucket, shard, retried, failed, dead)
    SELECT name, '1m', to_timestamp(floor(extract(epoch FROM {now}) / 60) * 60),
           mod(pg_backend_pid(), 16),
           (state IN ('ready', 'delayed'))::int, (state = 'failed')::int, (state = 'dead')::int
    FROM settled
    WHERE %(spent)s = 1 OR state IN ('failed', 'dead')
    ON CONFLICT (name, tier, bucket, shard) DO UPDATE
    SET retried = c.retried + EXCLUDED.retried, failed = c.failed + EXCLUDED.failed,
        dead = c.dead + EXCLUDED.dead
),
woken AS (
    SELECT {schema}.wake(array(
        SELECT queue FROM settled
        WHERE state IN ('ready', 'delayed', 'suspended')
          AND run_at <= {now} + interval '1 second'
    )) AS notified
)
SELECT count(*), (SELECT notified FROM woken) FROM settled

-- name: heartbeat
-- Renews a lease to now + lease_ms, fenced like ack.
UPDATE {schema}.jobs j
SET visible_at = {now} + %(lease_ms)s * interval '1 millisecond'
WHERE j.id = %(id)s AND j.state = 'running' AND j.claimed_by = %(worker)s AND j.claim = %(claim)s
RETURNING 1

-- name: stats
-- Counts per queue and state; due and not-yet-due waiting rows are told apart at {now}.
SELECT q.name,
       count(j.id) FILTER (WHERE j.state IN ('ready', 'delayed') AND j.run_at <= {now}),
       count(j.id) FILTER (WHERE j.state IN ('ready', 'delayed') AND j.run_at > {now}),
       count(j.id) FILTER (WHERE j.state = 'running'),
       count(j.id) FILTER (WHERE j.state = 'suspended'),
       count(j.id) FILTER (WHERE j.state = 'done'),
       count(j.id) FILTER (WHERE j.state = 'failed'),
       count(j.id) FILTER (WHERE j.state = 'dead'),
       count(j.id) FILTER (WHERE j.state = 'cancelled'),
       coalesce(floor(extract(epoch FROM {now} - min(j.run_at) FILTER (
           WHERE j.state IN ('ready', 'delayed') AND j.run_at <= {now}
       )) * 1000), 0)::bigint
FROM {schema}.queues q
LEFT JOIN {schema}.jobs j ON j.queue = q.name
GROUP BY q.name
ORDER BY q.name

-- name: demand
-- Per queue: rows running under a live lease plus rows due and claimable (waiting rows whose
-- run_at passed, running rows whose lease lapsed); a paused queue counts only the first kind.
-- Reads only the live-row indexes.
SELECT q.name,
       (SELECT count(*) FROM {schema}.jobs j
        WHERE j.queue = q.name AND j.state = 'running' AND j.visible_at > {now})
       + CASE WHEN p.queue IS NOT NULL THEN 0 ELSE
           (SELECT count(*) FROM {schema}.jobs j
            WHERE j.queue = q.name AND j.state IN ('ready', 'delayed', 'suspended')
              AND j.run_at <= {now})
           + (SELECT count(*) FROM {schema}.jobs j
              WHERE j.queue = q.name AND j.state = 'running' AND j.visible_at <= {now})
         END
FROM {schema}.queues q
LEFT JOIN {schema}.paused_queues p ON p.queue = q.name
ORDER BY q.name

-- name: demand_keda
-- For a KEDA ``postgresql`` trigger: the largest demand of any queue named in the array (every
-- queue when it is NULL). Pods needed = ceil(this / slots per pod); set targetQueryValue to the
-- worker's per-queue concurrency.
SELECT coalesce(max(demand), 0) FROM (
    SELECT q.name,
           (SELECT count(*) FROM {schema}.jobs j
            WHERE j.queue = q.name AND j.state = 'running' AND j.visible_at > now())
           + CASE WHEN p.queue IS NOT NULL THEN 0 ELSE
               (SELECT count(*) FROM {schema}.jobs j
                WHERE j.queue = q.name AND j.state IN ('ready', 'delayed', 'suspended')
                  AND j.run_at <= now())
               + (SELECT count(*) FROM {schema}.jobs j
                  WHERE j.queue = q.name AND j.state = 'running' AND j.visible_at <= now())
             END AS demand
    FROM {schema}.queues q
    LEFT JOIN {schema}.paused_queues p ON p.queue = q.name
    WHERE %(queues)s::text[] IS NULL OR q.name = ANY(%(queues)s::text[])
) AS per_queue

-- name: now
SELECT {now}

-- name: steps_load
SELECT name, status, output, seq, started_at, completed_at, wake_at, event, match, attempts,
       error, once
FROM {schema}.job_steps
WHERE run_id = %(run_id)s
ORDER BY seq

-- name: step_write
-- Inserts or replaces one step record. A fenced write lands only while its job row is running
-- under the fence and belongs to the run; FOR SHARE holds that row so a re-claim cannot commit
-- between the check and this write. A new step's seq is one past the run's highest.
WITH fence AS (
    SELECT 1 FROM {schema}.jobs j
    WHERE j.id = %(job_id)s AND j.state = 'running' AND j.claimed_by = %(worker)s
      AND j.claim = %(claim)s AND j.run_id = %(run_id)s
    FOR SHARE
)
INSERT INTO {schema}.job_steps AS s (
    run_id, name, seq, status, output, started_at, completed_at, wake_at, event, match,
    attempts, error, once
)
SELECT %(run_id)s, %(name)s,
       coalesce((SELECT max(seq) + 1 FROM {schema}.job_steps WHERE run_id = %(run_id)s), 0),
       %(status)s, %(output)s::jsonb, %(started_at)s, %(completed_at)s, %(wake_at)s, %(event)s,
       %(match)s::jsonb, %(attempts)s, %(error)s, %(once)s
WHERE %(unfenced)s OR EXISTS (SELECT 1 FROM fence)
ON CONFLICT (run_id, name) DO UPDATE
SET status = EXCLUDED.status, output = EXCLUDED.output, started_at = EXCLUDED.started_at,
    completed_at = EXCLUDED.completed_at, wake_at = EXCLUDED.wake_at, event = EXCLUDED.event,
    match = EXCLUDED.match, attempts = EXCLUDED.attempts, error = EXCLUDED.error,
    once = EXCLUDED.once
RETURNING 1

-- name: job_get
SELECT id, run_id, name, queue, state, attempts, max_attempts, claim, tenant_id,
       idempotency_key, input, run_at, created_at, updated_at, claimed_by, last_error,
       last_error_code, last_error_stack, result, progress, enqueued_by, traceparent, priority,
       parent_run_id
FROM {schema}.jobs
WHERE id = %(id)s

-- name: job_state
SELECT state FROM {schema}.jobs WHERE id = %(id)s

-- name: list_older
-- One listing page: rows older than a position (from the newest without one), newest first.
SELECT j.id, j.run_id, j.name, j.queue, j.state, j.attempts, j.max_attempts, j.claim,
       j.tenant_id, j.idempotency_key, j.input, j.run_at, j.created_at, j.updated_at,
       j.claimed_by, j.last_error, j.last_error_code, j.last_error_stack, j.result, j.progress,
       j.enqueued_by, j.traceparent, j.priority, j.parent_run_id
FROM {schema}.jobs j
WHERE {filter}
  AND (%(at)s::timestamptz IS NULL OR (j.created_at, j.id) < (%(at)s, %(at_id)s::uuid))
ORDER BY j.created_at DESC, j.id DESC
LIMIT %(limit)s

-- name: list_newer
-- One listing page: rows newer than a position, oldest first (the caller reverses it).
SELECT j.id, j.run_id, j.name, j.queue, j.state, j.attempts, j.max_attempts, j.claim,
       j.tenant_id, j.idempotency_key, j.input, j.run_at, j.created_at, j.updated_at,
       j.claimed_by, j.last_error, j.last_error_code, j.last_error_stack, j.result, j.progress,
       j.enqueued_by, j.traceparent, j.priority, j.parent_run_id
FROM {schema}.jobs j
WHERE {filter}
  AND (j.created_at, j.id) > (%(at)s, %(at_id)s::uuid)
ORDER BY j.created_at, j.id
LIMIT %(limit)s

-- name: cancel
-- Cancels a live row; a running one's next fenced write finds it cancelled, and the attempt
-- it was on is counted (it ran).
UPDATE {schema}.jobs
SET state = 'cancelled', last_error = %(reason)s, last_error_code = %(code)s,
    last_error_stack = NULL, updated_at = {now},
    attempts = attempts + CASE WHEN state = 'running' THEN 1 ELSE 0 END
WHERE id = %(id)s AND state IN ('ready', 'delayed', 'running', 'suspended')
RETURNING 1

-- name: resolve_step_ran
UPDATE {schema}.job_steps s
SET status = 'completed', output = %(output)s::jsonb, completed_at = {now}
FROM {schema}.jobs j
WHERE j.id = %(id)s AND s.run_id = j.run_id AND s.name = %(step)s AND s.once
  AND s.status = 'started'
RETURNING 1

-- name: resolve_step_not_ran
DELETE FROM {schema}.job_steps s
USING {schema}.jobs j
WHERE j.id = %(id)s AND s.run_id = j.run_id AND s.name = %(step)s AND s.once
  AND s.status = 'started'
RETURNING 1

-- name: step_status
SELECT s.status FROM {schema}.job_steps s JOIN {schema}.jobs j ON s.run_id = j.run_id
WHERE j.id = %(id)s AND s.name = %(step)s

-- name: record_progress
UPDATE {schema}.jobs j
SET progress = %(progress)s::jsonb, updated_at = {now}
WHERE j.id = %(id)s AND j.state = 'running' AND j.claimed_by = %(worker)s AND j.claim = %(claim)s
RETURNING 1

-- name: pause_queue
INSERT INTO {schema}.paused_queues (queue, paused_at) VALUES (%(queue)s, {now})
ON CONFLICT DO NOTHING

-- name: resume_queue
-- Deletes the pause row and wakes the queue's workers in the same statement.
WITH resumed AS (
    DELETE FROM {schema}.paused_queues WHERE queue = %(queue)s RETURNING queue
)
SELECT {schema}.wake(array(SELECT queue FROM resumed))

-- name: paused_queues
SELECT queue FROM {schema}.paused_queues ORDER BY queue

-- name: requeue
-- Makes one finished row ready now with attempts 0 (result and progress cleared, last error
-- kept); with from_step, that step and every later one (by seq) are deleted in the same
-- statement, and nothing changes when the run has no such step. A live row holding the key makes
-- the insert into the live-key index fail (X_JOB_DUPLICATE), undoing the whole statement.
WITH target AS (
    SELECT j.id, j.run_id FROM {schema}.jobs j
    WHERE j.id = %(id)s AND j.state IN ('done', 'failed', 'dead', 'cancelled')
),
cut AS (
    SELECT s.seq FROM {schema}.job_steps s JOIN target t ON s.run_id = t.run_id
    WHERE s.name = %(from_step)s
),
requeued AS (
    UPDATE {schema}.jobs j
    SET state = 'ready', attempts = 0, run_at = {now}, visible_at = NULL, result = NULL,
        progress = NULL, updated_at = {now}, debounced = false
    FROM target t
    WHERE j.id = t.id AND (%(from_step)s::text IS NULL OR EXISTS (SELECT 1 FROM cut))
    RETURNING j.queue, j.run_id
),
dropped AS (
    DELETE FROM {schema}.job_steps s
    USING requeued r
    WHERE s.run_id = r.run_id AND s.seq >= (SELECT seq FROM cut)
),
woken AS (
    SELECT {schema}.wake(array(SELECT queue FROM requeued)) AS notified
)
SELECT (SELECT count(*) FROM requeued), (SELECT notified FROM woken)

-- name: remove
-- Deletes a row that is not running, with its run's steps.
WITH removed AS (
    DELETE FROM {schema}.jobs WHERE id = %(id)s AND state <> 'running' RETURNING run_id
),
steps AS (
    DELETE FROM {schema}.job_steps s USING removed r WHERE s.run_id = r.run_id
)
SELECT count(*) FROM removed

-- name: promote
-- Makes a delayed or suspended row whose run_at is ahead due now (delayed becomes ready).
WITH promoted AS (
    UPDATE {schema}.jobs
    SET state = CASE WHEN state = 'delayed' THEN 'ready' ELSE state END, run_at = {now},
        updated_at = {now}
    WHERE id = %(id)s AND state IN ('delayed', 'suspended') AND run_at > {now}
    RETURNING queue
),
woken AS (
    SELECT {schema}.wake(array(SELECT queue FROM promoted)) AS notified
)
SELECT (SELECT count(*) FROM promoted), (SELECT notified FROM woken)

-- name: requeue_many
-- Requeues up to 1,000 finished rows matching the filter, newest first, the newest per key whose
-- key no live row holds; answers how many, and how many eligible rows remain after it.
WITH eligible AS (
    SELECT j.id, j.name, coalesce(j.tenant_id, '') AS tenant, j.idempotency_key,
           j.created_at
    FROM {schema}.jobs j
    WHERE {filter}
      AND j.state IN ('done', 'failed', 'dead', 'cancelled')
      AND NOT EXISTS (
          SELECT 1 FROM {schema}.jobs l
          WHERE l.name = j.name AND coalesce(l.tenant_id, '') = coalesce(j.tenant_id, '')
            AND l.idempotency_key = j.idempotency_key
            AND l.state IN ('ready', 'delayed', 'running', 'suspended')
            AND NOT (l.debounced AND l.claim > 0)
      )
),
picked AS (
    SELECT id, name, tenant, idempotency_key FROM (
        SELECT DISTINCT ON (name, tenant, idempotency_key) *
        FROM eligible
        ORDER BY name, tenant, idempotency_key, created_at DESC, id DESC
    ) AS newest
    ORDER BY created_at DESC, id DESC
    LIMIT 1000
),
requeued AS (
    UPDATE {schema}.jobs j
    SET state = 'ready', attempts = 0, run_at = {now}, visible_at = NULL, result = NULL,
        progress = NULL, updated_at = {now}, debounced = false
    FROM picked p
    WHERE j.id = p.id AND j.state IN ('done', 'failed', 'dead', 'cancelled')
    RETURNING j.queue
),
woken AS (
    SELECT {schema}.wake(array(SELECT DISTINCT queue FROM requeued)) AS notified
)
SELECT (SELECT count(*) FROM requeued),
       (SELECT count(*) FROM eligible e WHERE NOT EXISTS (
            SELECT 1 FROM picked p
            WHERE p.name = e.name AND p.tenant = e.tenant
              AND p.idempotency_key = e.idempotency_key)),
       (SELECT notified FROM woken)

-- name: remove_many
-- Removes up to 1,000 rows matching the filter that are not running, newest first, with their
-- runs' steps; answers how many, and how many such rows remain.
WITH candidates AS (
    SELECT j.id FROM {schema}.jobs j
    WHERE {filter} AND j.state <> 'running'
),
removed AS (
    DELETE FROM {schema}.jobs j
    WHERE j.id IN (
        SELECT c.id FROM candidates c JOIN {schema}.jobs o ON o.id = c.id
        ORDER BY o.created_at DESC, o.id DESC
        LIMIT 1000
    ) AND j.state <> 'running'
    RETURNING j.run_id
),
steps AS (
    DELETE FROM {schema}.job_steps s USING removed r WHERE s.run_id = r.run_id
)
SELECT (SELECT count(*) FROM removed), (SELECT count(*) FROM candidates) - (SELECT count(*) FROM removed)

-- name: promote_many
-- Promotes up to 1,000 waiting rows matching the filter, newest first; answers how many, and how
-- many waiting rows remain.
WITH candidates AS (
    SELECT j.id, j.created_at FROM {schema}.jobs j
    WHERE {filter} AND j.state IN ('delayed', 'suspended') AND j.run_at > {now}
),
promoted AS (
    UPDATE {schema}.jobs j
    SET state = CASE WHEN j.state = 'delayed' THEN 'ready' ELSE j.state END, run_at = {now},
        updated_at = {now}
    WHERE j.id IN (SELECT id FROM candidates ORDER BY created_at DESC, id DESC LIMIT 1000)
      AND j.state IN ('delayed', 'suspended') AND j.run_at > {now}
    RETURNING j.queue
),
woken AS (
    SELECT {schema}.wake(array(SELECT DISTINCT queue FROM promoted)) AS notified
)
SELECT (SELECT count(*) FROM promoted),
       (SELECT count(*) FROM candidates) - (SELECT count(*) FROM promoted),
       (SELECT notified FROM woken)

-- name: lease_lock
-- Serialises acquirers of one lease key for the rest of the transaction (C28): the capacity
-- check and the slot insert below then see every committed holder.
SELECT pg_advisory_xact_lock(hashtext(%(namespace)s), hashtext(%(key)s))

-- name: lease_acquire
-- Renews the holder's live slot, or takes the lowest free slot while fewer than `limit` slots
-- are live. Runs after lease_lock in one transaction.
WITH mine AS (
    UPDATE {schema}.leases
    SET expires_at = {now} + %(ttl_ms)s * interval '1 millisecond'
    WHERE lease_key = %(key)s AND holder = %(holder)s AND expires_at > {now}
    RETURNING slot
),
live AS (
    SELECT slot FROM {schema}.leases WHERE lease_key = %(key)s AND expires_at > {now}
),
free AS (
    SELECT s.slot FROM generate_series(0, %(limit)s - 1) AS s(slot)
    WHERE NOT EXISTS (SELECT 1 FROM mine)
      AND (SELECT count(*) FROM live) < %(limit)s
      AND s.slot NOT IN (SELECT slot FROM live)
    ORDER BY s.slot
    LIMIT 1
),
taken AS (
    INSERT INTO {schema}.leases AS l (lease_key, slot, holder, expires_at, acquired_at)
    SELECT %(key)s, slot, %(holder)s, {now} + %(ttl_ms)s * interval '1 millisecond',
           clock_timestamp()
    FROM free
    ON CONFLICT (lease_key, slot) DO UPDATE
    SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at,
        acquired_at = EXCLUDED.acquired_at
    RETURNING slot
)
SELECT EXISTS (SELECT 1 FROM mine) OR EXISTS (SELECT 1 FROM taken)

-- name: lease_renew
UPDATE {schema}.leases
SET expires_at = {now} + %(ttl_ms)s * interval '1 millisecond'
WHERE lease_key = %(key)s AND holder = %(holder)s AND expires_at > {now}
RETURNING 1

-- name: lease_release
DELETE FROM {schema}.leases WHERE lease_key = %(key)s AND holder = %(holder)s

-- name: lease_holders
SELECT holder FROM {schema}.leases
WHERE lease_key = %(key)s AND expires_at > {now}
ORDER BY acquired_at, slot

-- name: event_publish
-- Stores an event and, in the same statement, makes every suspended run with a matching waiting
-- step due now and wakes their queues (a rollback undoes all three). A matching run that is still
-- running (it wrote its waiting step and has not parked yet) gets wake_pending instead, which its
-- park honours: the row lock orders the two statements, so the event is never missed until the
-- backstop. A step's match holds when every key of it is a top-level key of the payload with an
-- equal JSON value.
WITH event AS (
    INSERT INTO {schema}.events (id, name, payload, correlation_key, published_at, expires_at)
    VALUES (%(id)s, %(name)s, %(payload)s::jsonb, %(correlation_key)s, {now},
            {now} + %(ttl_ms)s * interval '1 millisecond')
    RETURNING id, name, payload, correlation_key, published_at, expires_at
),
woken AS (
    UPDATE {schema}.jobs j
    SET run_at = CASE WHEN j.state = 'suspended' THEN {now} ELSE j.run_at END,
        wake_pending = j.state = 'running',
        updated_at = {now}
    WHERE ((j.state = 'suspended' AND j.run_at > {now}) OR j.state = 'running')
      AND j.run_id IN (
          SELECT s.run_id FROM {schema}.job_steps s
          WHERE s.event = %(name)s AND s.status = 'waiting'
            AND (s.match IS NULL OR NOT EXISTS (
                SELECT 1 FROM jsonb_each(s.match) AS m(key, value)
                WHERE jsonb_typeof(%(payload)s::jsonb) <> 'object'
                   OR (%(payload)s::jsonb -> m.key) IS DISTINCT FROM m.value
            ))
      )
    RETURNING j.queue, j.state
),
notified AS (
    SELECT {schema}.wake(array(SELECT DISTINCT queue FROM woken WHERE state = 'suspended')) AS n
)
SELECT e.id, e.name, e.payload, e.correlation_key, e.published_at, e.expires_at,
       (SELECT n FROM notified)
FROM event e

-- name: event_find
-- The earliest unexpired event with the name, published at or after `since`, with the
-- correlation key when one is given, whose payload holds every key of `match` with an equal value.
SELECT e.id, e.name, e.payload, e.correlation_key, e.published_at, e.expires_at
FROM {schema}.events e
WHERE e.name = %(name)s
  AND e.expires_at > {now}
  AND e.published_at >= %(since)s
  AND (%(correlation_key)s::text IS NULL OR e.correlation_key = %(correlation_key)s)
  AND NOT EXISTS (
      SELECT 1 FROM jsonb_each(%(match)s::jsonb) AS m(key, value)
      WHERE jsonb_typeof(e.payload) <> 'object' OR (e.payload -> m.key) IS DISTINCT FROM m.value
  )
ORDER BY e.published_at, e.seq
LIMIT 1

-- name: event_purge
WITH purged AS (
    DELETE FROM {schema}.events WHERE expires_at <= {now} RETURNING 1
)
SELECT count(*) FROM purged

-- name: event_reset
WITH purged AS (
    DELETE FROM {schema}.events RETURNING 1
)
SELECT count(*) FROM purged

-- name: outbox_stage
-- Stages up to 1,000 enqueues on the caller's transaction. A delay becomes an absolute run_at
-- here, so the relay publishes the instant the caller asked for.
INSERT INTO {schema}.outbox (
    id, name, queue, input, idempotency_key, tenant_id, max_attempts, run_id, run_at,
    traceparent, enqueued_by, order_key, staged_at, priority
)
SELECT r.id, r.name, r.queue, r.input::jsonb, r.idempotency_key, r.tenant_id, r.max_attempts,
       r.run_id, greatest(coalesce(r.run_at, {now} + r.delay_ms * interval '1 millisecond'), {now}),
       r.traceparent, r.enqueued_by, r.order_key, {now}, r.priority
FROM unnest(
    %(ids)s::uuid[], %(run_ids)s::uuid[], %(names)s::text[], %(queues)s::text[],
    %(inputs)s::text[], %(keys)s::text[], %(tenants)s::text[], %(max_attempts)s::int[],
    %(run_ats)s::timestamptz[], %(delays)s::bigint[], %(traceparents)s::text[],
    %(enqueued_bys)s::text[], %(order_keys)s::text[], %(priorities)s::smallint[]
) WITH ORDINALITY AS r(id, run_id, name, queue, input, idempotency_key, tenant_id, max_attempts,
                       run_at, delay_ms, traceparent, enqueued_by, order_key, priority, ord)
ORDER BY r.ord

-- name: outbox_claim_lock
-- Serialises claims for the rest of the transaction: the claim that follows, in a statement of
-- its own, sees every claim committed before it (two claims side by side would each see the
-- other's rows as free, and the second would take the rows after the first's).
SELECT pg_advisory_xact_lock(hashtext(%(namespace)s), hashtext(%(key)s))

-- name: outbox_claim
-- Takes up to `limit` committed, unpublished rows whose claim is free or lapsed, in
-- (staged_at, id) order, under a new token; runs after outbox_claim_lock. A row is never taken
-- when an unpublished row of its lane (order_key, or '' without one) staged before it is held
-- by an unexpired claim: no row overtakes one a relay still holds (migration 0006).
WITH held AS (
    SELECT DISTINCT ON (coalesce(h.order_key, '')) coalesce(h.order_key, '') AS lane,
           h.staged_at, h.id
    FROM {schema}.outbox h
    WHERE h.published_at IS NULL AND h.claim_expires_at IS NOT NULL
      AND h.claim_expires_at > {now}
    ORDER BY coalesce(h.order_key, ''), h.staged_at, h.id
),
picked AS (
    SELECT o.id FROM {schema}.outbox o
    WHERE o.published_at IS NULL AND (o.claim_expires_at IS NULL OR o.claim_expires_at <= {now})
      AND NOT EXISTS (
          SELECT 1 FROM held
          WHERE held.lane = coalesce(o.order_key, '')
            AND (held.staged_at, held.id) < (o.staged_at, o.id)
      )
    ORDER BY o.staged_at, o.id
    LIMIT %(limit)s
    FOR UPDATE
)
UPDATE {schema}.outbox o
SET claimed_at = {now}, claimed_by = %(token)s,
    claim_expires_at = {now} + %(lease_ms)s * interval '1 millisecond'
FROM picked
WHERE o.id = picked.id
RETURNING o.id, o.name, o.queue, o.input, o.idempotency_key, o.tenant_id, o.max_attempts,
          o.run_id, o.run_at, o.traceparent, o.enqueued_by, o.staged_at, o.order_key, o.priority

-- name: outbox_release
UPDATE {schema}.outbox
SET claimed_at = NULL, claimed_by = NULL, claim_expires_at = NULL
WHERE id = ANY(%(ids)s::uuid[]) AND claimed_by = %(token)s AND published_at IS NULL

-- name: outbox_mark
WITH marked AS (
    UPDATE {schema}.outbox
    SET published_at = {now}
    WHERE id = ANY(%(ids)s::uuid[]) AND claimed_by = %(token)s AND published_at IS NULL
    RETURNING 1
)
SELECT count(*) FROM marked

-- name: watermarks
SELECT task, watermark FROM {schema}.scheduler_state

-- name: watermark_move
-- Compare-and-set of one task's watermark: it moves only from `expected` (a task with none is
-- created only when `expected` is NULL). Answers whether it moved.
WITH moved AS (
    UPDATE {schema}.scheduler_state
    SET watermark = %(to)s, updated_at = {now}
    WHERE task = %(task)s AND watermark = %(expected)s
    RETURNING 1
),
created AS (
    INSERT INTO {schema}.scheduler_state (task, watermark, updated_at)
    SELECT %(task)s, %(to)s, {now} WHERE %(expected)s::timestamptz IS NULL
    ON CONFLICT (task) DO NOTHING
    RETURNING 1
)
SELECT EXISTS (SELECT 1 FROM moved) OR EXISTS (SELECT 1 FROM created)

-- name: task_fire_record
-- Runs in the fire's transaction, after the watermark moved and the jobs were enqueued.
INSERT INTO {schema}.task_fires AS f (task, occurrence, watermark, fired_at, job_ids, cron, tz)
VALUES (%(task)s, %(occurrence)s, %(watermark)s, {now}, %(job_ids)s::uuid[], %(cron)s, %(tz)s)
ON CONFLICT (task) DO UPDATE
SET occurrence = EXCLUDED.occurrence, watermark = EXCLUDED.watermark,
    fired_at = EXCLUDED.fired_at, job_ids = EXCLUDED.job_ids, cron = EXCLUDED.cron,
    tz = EXCLUDED.tz
RETURNING fired_at

-- name: task_fires
SELECT task, occurrence, watermark, fired_at, job_ids, cron, tz
FROM {schema}.task_fires ORDER BY task

-- name: pause_task
INSERT INTO {schema}.paused_tasks (task, paused_at) VALUES (%(task)s, {now})
ON CONFLICT DO NOTHING

-- name: resume_task
DELETE FROM {schema}.paused_tasks WHERE task = %(task)s

-- name: paused_tasks
SELECT task FROM {schema}.paused_tasks ORDER BY task

-- name: leader_acquire
-- Takes the leader row `name` ('scheduler', or 'outbox-relay' for the relay lease) when it is
-- free or lapsed, or renews it for its holder; answers whether `holder` holds it now.
INSERT INTO {schema}.scheduler_leader AS l (name, holder, expires_at)
VALUES (%(name)s, %(holder)s, {now} + %(ttl_ms)s * interval '1 millisecond')
ON CONFLICT (name) DO UPDATE
SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
WHERE l.holder = EXCLUDED.holder OR l.expires_at <= {now}
RETURNING 1

-- name: leader_release
DELETE FROM {schema}.scheduler_leader WHERE name = %(name)s AND holder = %(holder)s

-- name: leader_holder
SELECT holder FROM {schema}.scheduler_leader WHERE name = %(name)s AND expires_at > {now}

-- name: worker_beat
-- Inserts or refreshes a worker's row; rows expired a day ago are swept in the same statement.
WITH swept AS (
    DELETE FROM {schema}.workers WHERE expires_at < {now} - interval '1 day'
)
INSERT INTO {schema}.workers AS w (
    id, host, build, started_at, queues, slots, in_flight, last_heartbeat, draining_at,
    expires_at
)
VALUES (%(id)s, %(host)s, %(build)s, %(started_at)s, %(queues)s::text[], %(slots)s,
        %(in_flight)s::uuid[], {now}, %(draining_at)s,
        {now} + %(ttl_ms)s * interval '1 millisecond')
ON CONFLICT (id) DO UPDATE
SET host = EXCLUDED.host, build = EXCLUDED.build, started_at = EXCLUDED.started_at,
    queues = EXCLUDED.queues, slots = EXCLUDED.slots, in_flight = EXCLUDED.in_flight,
    last_heartbeat = EXCLUDED.last_heartbeat, draining_at = EXCLUDED.draining_at,
    expires_at = EXCLUDED.expires_at

-- name: worker_remove
DELETE FROM {schema}.workers WHERE id = %(id)s

-- name: workers
SELECT id, host, build, started_at, queues, slots, in_flight, last_heartbeat, draining_at
FROM {schema}.workers
WHERE expires_at > {now}
ORDER BY id

-- name: counters
-- One job's buckets that end after `since`, shards summed, the newest 4,176 oldest first.
SELECT tier, bucket, done, retried, failed, dead, duration_ms FROM (
    SELECT tier, bucket, sum(done)::bigint AS done, sum(retried)::bigint AS retried,
           sum(failed)::bigint AS failed, sum(dead)::bigint AS dead,
           sum(duration_ms) AS duration_ms
    FROM {schema}.counters
    WHERE name = %(name)s
      AND bucket + CASE tier WHEN '1m' THEN interval '1 minute'
                             WHEN '5m' THEN interval '5 minutes'
                             ELSE interval '1 hour' END > %(since)s
    GROUP BY tier, bucket
    ORDER BY bucket DESC, tier
    LIMIT %(limit)s
) AS newest
ORDER BY bucket, tier

-- name: counter_totals
-- Per job name, the sums of its buckets that end after `since`, and the coarsest tier summed.
SELECT name, sum(done)::bigint, sum(retried)::bigint, sum(failed)::bigint, sum(dead)::bigint,
       sum(duration_ms),
       (array['1m', '5m', '1h'])[max(CASE tier WHEN '1m' THEN 1 WHEN '5m' THEN 2 ELSE 3 END)]
FROM {schema}.counters
WHERE bucket + CASE tier WHEN '1m' THEN interval '1 minute'
                         WHEN '5m' THEN interval '5 minutes'
                         ELSE interval '1 hour' END > %(since)s
GROUP BY name
ORDER BY name

-- name: counter_fold
-- Folds one tier's aged buckets into the next tier in one statement (or drops them, for 1h): a
-- bucket ages once its whole parent bucket ended more than the tier's retention ago. Answers how
-- many buckets (not shard rows) moved.
WITH aged AS (
    DELETE FROM {schema}.counters c
    WHERE c.tier = %(tier)s
      AND to_timestamp(floor(extract(epoch FROM c.bucket) / %(parent_s)s) * %(parent_s)s)
          + %(parent_s)s * interval '1 second' <= {now} - %(kept_s)s * interval '1 second'
    RETURNING c.*
),
folded AS (
    INSERT INTO {schema}.counters AS c (name, tier, bucket, shard, done, retried, failed, dead,
                                        duration_ms)
    SELECT name, %(parent)s,
           to_timestamp(floor(extract(epoch FROM bucket) / %(parent_s)s) * %(parent_s)s), 0,
           sum(done), sum(retried), sum(failed), sum(dead), sum(duration_ms)
    FROM aged
    WHERE %(parent)s::text IS NOT NULL
    GROUP BY 1, 2, 3
    ON CONFLICT (name, tier, bucket, shard) DO UPDATE
    SET done = c.done + EXCLUDED.done, retried = c.retried + EXCLUDED.retried,
        failed = c.failed + EXCLUDED.failed, dead = c.dead + EXCLUDED.dead,
        duration_ms = c.duration_ms + EXCLUDED.duration_ms
)
SELECT count(*) FROM (SELECT DISTINCT name, bucket FROM aged) AS buckets

-- name: wake_probe
-- Sent through the pool to a wake listener's private channel: its arrival proves the LISTEN
-- connection is live (a half-open one never hears it).
SELECT pg_notify(%(channel)s, %(payload)s)

-- name: wake_arm
-- A worker heard a queue's NOTIFY and then claimed nothing: re-arm the queues so the next wake
-- notifies (wake_arm() in migration 0002). NULL: the wake lock stayed busy; true: a row became
-- due meanwhile, claim again.
SELECT {schema}.wake_arm(%(queues)s::text[], {now})

-- name: next_due_at
-- For tests on an injected clock: when the next claim could take a row of an unpaused queue
-- (a waiting row's run_at, a running row's lease expiry); it may be in the past.
SELECT min(CASE WHEN j.state = 'running' THEN j.visible_at ELSE j.run_at END)
FROM {schema}.jobs j
WHERE j.state IN ('ready', 'delayed', 'running', 'suspended')
  AND NOT EXISTS (SELECT 1 FROM {schema}.paused_queues p WHERE p.queue = j.queue)

-- name: next_due_ms
-- An idle worker's timer: milliseconds (rounded up; negative when one is due already) until a row
-- of the unpaused queues served becomes claimable, NULL when none waits: the first waiting row's
-- run_at (one ordered LIMIT 1 probe of jobs_claim per priority present per queue,
-- first_waiting(), migration 0010) or the first running row's lease expiry (an ordered LIMIT 1
-- walk of jobs_lapse, as the claim's own lapse probe), so an idle worker wakes when a dead
-- worker's lease lapses rather than at its next poll.
WITH served AS (
    SELECT q.name FROM unnest(%(queues)s::text[]) AS q(name)
    WHERE NOT EXISTS (SELECT 1 FROM {schema}.paused_queues p WHERE p.queue = q.name)
)
SELECT ceil(extract(epoch FROM least(
    (SELECT min({schema}.first_waiting(s.name, '-infinity')) FROM served s),
    (SELECT j.visible_at FROM {schema}.jobs j
     WHERE j.state = 'running' AND j.queue IN (SELECT name FROM served)
     ORDER BY j.visible_at
     LIMIT 1)
) - {now}) * 1000)::bigint

-- name: queue_names
-- Every queue that ever had a row: a listener that becomes live wakes them all, so rows that
-- arrived while it could not hear are claimed now rather than at the next poll.
SELECT name FROM {schema}.queues ORDER BY name

-- name: backfill_begin
-- Opens a running pass unless its id (the job's) already has a row; answers the pass either way.
-- The second arm reads the snapshot the INSERT ran on, so it sees only a row made before.
WITH made AS (
    INSERT INTO {schema}.backfills AS b
        (id, name, scope, checksum, status, app_version, rows, last_cursor, started_at)
    VALUES
        (%(id)s, %(name)s, %(scope)s, %(checksum)s, 'running', %(app_version)s, 0, 'null', {now})
    ON CONFLICT (id) DO NOTHING
    RETURNING b.id, b.name, b.scope, b.checksum, b.status, b.app_version, b.rows, b.last_cursor,
        b.started_at, b.completed_at
)
SELECT * FROM made
UNION ALL
SELECT id, name, scope, checksum, status, app_version, rows, last_cursor, started_at,
    completed_at
FROM {schema}.backfills
WHERE id = %(id)s AND NOT EXISTS (SELECT 1 FROM made)

-- name: backfill_record
-- A pass's rows and cursor after a page; a completed pass is final.
UPDATE {schema}.backfills
SET status = 'running', rows = %(rows)s, last_cursor = %(cursor)s::jsonb
WHERE id = %(id)s AND status <> 'completed'
RETURNING id

-- name: backfill_settle
UPDATE {schema}.backfills
SET status = %(status)s::text,
    completed_at = CASE WHEN %(status)s::text = 'completed' THEN {now} END
WHERE id = %(id)s AND status <> 'completed'
RETURNING id

-- name: backfill_completed
SELECT id, name, scope, checksum, status, app_version, rows, last_cursor, started_at,
    completed_at
FROM {schema}.backfills
WHERE name = %(name)s AND scope = %(scope)s AND status = 'completed'
ORDER BY started_at DESC, id DESC
LIMIT 1

-- name: backfill_passes
SELECT id, name, scope, checksum, status, app_version, rows, last_cursor, started_at,
    completed_at
FROM {schema}.backfills
WHERE (%(name)s::text IS NULL OR name = %(name)s::text)
  AND (%(scope)s::text IS NULL OR scope = %(scope)s::text)
ORDER BY started_at DESC, id DESC
LIMIT %(limit)s

-- name: retention_purge
-- Deletes up to %(limit)s rows in %(states)s last updated (settled) before %(before)s, and the
-- steps of their runs, in one short statement (a sweep calls it until it deletes fewer). The walk
-- is jobs_listing's created_at range: a row settled before the cutoff was created before it, so
-- the scan stops at the cutoff, passing over only old rows that are live or settled since.
WITH doomed AS (
    SELECT j.id, j.run_id FROM {schema}.jobs j
    WHERE j.created_at < %(before)s
      AND j.updated_at < %(before)s
      AND j.state = ANY (%(states)s::text[])
    ORDER BY j.created_at, j.id
    LIMIT %(limit)s
    FOR UPDATE SKIP LOCKED
),
gone AS (
    DELETE FROM {schema}.jobs j USING doomed d WHERE j.id = d.id RETURNING j.run_id
),
steps AS (
    -- A run id belongs to one row (jobs_run is unique, migration 0005): its steps go with it.
    DELETE FROM {schema}.job_steps s USING gone g WHERE s.run_id = g.run_id
)
SELECT count(*) FROM gone

-- name: consumer_cursor_load
SELECT cursor FROM {schema}.consumer_cursors WHERE consumer = %(consumer)s AND key = %(key)s

-- name: consumer_cursor_save
-- Runs on the app's connection, inside the transaction of the batch's effects.
INSERT INTO {schema}.consumer_cursors AS c (consumer, key, cursor, updated_at)
VALUES (%(consumer)s, %(key)s, %(cursor)s::jsonb, now())
ON CONFLICT (consumer, key) DO UPDATE SET cursor = EXCLUDED.cursor, updated_at = EXCLUDED.updated_at

-- name: rollup_unique_index
-- Whether a table has a plain unique index (no WHERE, no expressions) on exactly these columns,
-- the index an INSERT ... ON CONFLICT (columns) needs. NULL when the table does not exist.
SELECT CASE WHEN to_regclass(%(table)s::text) IS NULL THEN NULL ELSE EXISTS (
    SELECT 1 FROM pg_index i
    WHERE i.indrelid = to_regclass(%(table)s::text)
      AND i.indisunique AND i.indpred IS NULL AND i.indexprs IS NULL
      AND (
          SELECT array_agg(a.attname::text ORDER BY a.attname::text)
          FROM unnest(i.indkey) AS k(attnum)
          JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = k.attnum
      ) = (SELECT array_agg(c ORDER BY c) FROM unnest(%(columns)s::text[]) AS c)
) END

-- name: view_check
-- For a materialized view: whether it exists, and whether it has the plain unique index (no
-- WHERE, no expressions) REFRESH MATERIALIZED VIEW CONCURRENTLY needs.
SELECT
    EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = to_regclass(%(view)s::text) AND c.relkind = 'm'),
    EXISTS (
        SELECT 1 FROM pg_index i
        WHERE i.indrelid = to_regclass(%(view)s::text)
          AND i.indisunique AND i.indpred IS NULL AND i.indexprs IS NULL
    )

-- name: preflight
-- A worker's first-run check: the newest migration applied to the schema, the connecting role,
-- and the schema's tables that role may not read and write. A schema or migrations table that
-- does not exist fails the statement (undefined schema/table: not migrated), and so does a role
-- without USAGE on the schema (insufficient privilege). has_table_privilege answers true when
-- any of a list is held, hence one call per privilege.
SELECT (SELECT max(version) FROM {schema}.migrations),
       current_user::text,
       ARRAY(
           SELECT c.relname::text
           FROM pg_class c
           JOIN pg_namespace n ON n.oid = c.relnamespace
           WHERE n.nspname = %(schema)s AND c.relkind = 'r' AND c.relname <> 'migrations'
             AND NOT (has_table_privilege(c.oid, 'SELECT') AND has_table_privilege(c.oid, 'INSERT')
                      AND has_table_privilege(c.oid, 'UPDATE')
                      AND has_table_privilege(c.oid, 'DELETE'))
           ORDER BY 1
       )

-- name: children
-- A run's child jobs (step.invoke/step.gather), oldest first, on the jobs_parent_run index; with
-- `ids` only those rows.
SELECT j.id, j.run_id, j.name, j.queue, j.state, j.attempts, j.max_attempts, j.claim,
       j.tenant_id, j.idempotency_key, j.input, j.run_at, j.created_at, j.updated_at,
       j.claimed_by, j.last_error, j.last_error_code, j.last_error_stack, j.result, j.progress,
       j.enqueued_by, j.traceparent, j.priority, j.parent_run_id
FROM {schema}.jobs j
WHERE j.parent_run_id = %(run_id)s
  AND (%(ids)s::uuid[] IS NULL OR j.id = ANY(%(ids)s::uuid[]))
ORDER BY j.created_at, j.id

-- name: rate_take
-- Takes one token of a sliding-window bucket in one statement (jobs_core.rate). `held` locks the
-- bucket's row first, so concurrent takers queue on it and each sees every grant before it; the
-- instant is then read with clock_timestamp() (an injected test clock, or `now_ms`, wins): the
-- moment this taker holds the bucket, not when its statement began, so a grant's stamp is not
-- earlier than the grant by the time it queued. An instant before the newest grant counts as
-- that grant's (`greatest`), so the stamps never go backwards. The stamps are sorted, so the
-- window is full exactly when the `limit`-th newest stamp is inside it: then nothing is recorded
-- and the wait is that stamp plus the window minus the instant; else the instant is appended
-- (wait 0). Only the newest `limit` stamps are kept. The commit does not wait for its WAL flush
-- (`synchronous_commit` off for this statement's transaction only): takers queue on the lock,
-- and a flush each would hold the queue back; a server crash forgets at most the last fraction
-- of a second of grants. `t.quick` is tested so the planner cannot drop the set_config (it did:
-- every take then waited for a flush, 80-180 ms on a busy server, past the token's stamp).
WITH held AS (
    SELECT 1 FROM {schema}.rate_buckets WHERE bucket_key = %(key)s FOR UPDATE
),
t AS (
    SELECT coalesce(
               %(now_ms)s::int8,
               floor(extract(epoch FROM coalesce(%(now)s::timestamptz, clock_timestamp())) * 1000)::int8
           ) AS ms,
           set_config('synchronous_commit', 'off', true) AS quick
    FROM (SELECT count(*) FROM held) AS after_lock
)
INSERT INTO {schema}.rate_buckets AS b (bucket_key, stamps, touched_ms, wait_ms)
SELECT %(key)s, ARRAY[t.ms], t.ms, 0 FROM t WHERE t.quick IS NOT NULL
ON CONFLICT (bucket_key) DO UPDATE
SET stamps = CASE
        WHEN b.stamps[cardinality(b.stamps) - %(limit)s + 1]
             > greatest(EXCLUDED.touched_ms, b.stamps[cardinality(b.stamps)]) - %(per_ms)s
        THEN b.stamps[cardinality(b.stamps) - %(limit)s + 1:]
        ELSE b.stamps[greatest(1, cardinality(b.stamps) - %(limit)s + 2):]
             || greatest(EXCLUDED.touched_ms, b.stamps[cardinality(b.stamps)])
    END,
    wait_ms = CASE
        WHEN b.stamps[cardinality(b.stamps) - %(limit)s + 1]
             > greatest(EXCLUDED.touched_ms, b.stamps[cardinality(b.stamps)]) - %(per_ms)s
        THEN b.stamps[cardinality(b.stamps) - %(limit)s + 1] + %(per_ms)s
             - greatest(EXCLUDED.touched_ms, b.stamps[cardinality(b.stamps)])
        ELSE 0
    END,
    touched_ms = greatest(EXCLUDED.touched_ms, b.stamps[cardinality(b.stamps)])
RETURNING b.wait_ms
