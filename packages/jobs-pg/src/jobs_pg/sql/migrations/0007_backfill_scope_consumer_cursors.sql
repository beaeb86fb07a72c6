-- jobs-pg migration 0007: the backfill ledger's scope, and the consumers' cursors.
--
-- A backfill declared with input + scope makes one pass per scope; the ledger keeps the scope
-- beside the name ('' for a backfill without one), and a pass is looked up by both.
ALTER TABLE {schema}.backfills ADD COLUMN scope text NOT NULL DEFAULT '';
DROP INDEX {schema}.backfills_name;
CREATE INDEX backfills_pass ON {schema}.backfills (name, scope, started_at);

-- jobs_pg.PgCursorStore: each consumer key's cursor, written on the app's connection in the
-- transaction that holds the batch's effects, so the two commit together.
CREATE TABLE {schema}.consumer_cursors (
    consumer text NOT NULL,
    key text NOT NULL,
    cursor jsonb NOT NULL,
    updated_at timestamptz NOT NULL,
    PRIMARY KEY (consumer, key)
);
