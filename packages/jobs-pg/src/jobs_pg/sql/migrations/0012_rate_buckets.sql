-- Fleet-wide rate limits (issue 24): one sliding-window log per bucket key (jobs_core.rate).
-- `stamps` holds the instants (ms since the epoch, on the database's clock, non-decreasing) of
-- the grants still inside the bucket's window, at most its limit of them; `touched_ms` is the
-- last request's instant and `wait_ms` the last answer (0: granted), which the one-statement
-- take (`rate_take` in queries.sql) returns. A bucket whose newest stamp left its window holds
-- nothing a take still counts: deleting such a row at any time changes no answer.
CREATE TABLE IF NOT EXISTS {schema}.rate_buckets (
    bucket_key text PRIMARY KEY,
    stamps bigint[] NOT NULL,
    touched_ms bigint NOT NULL,
    wait_ms bigint NOT NULL
);
