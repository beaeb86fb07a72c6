-- jobs-pg migration 0006: the outbox keeps its order across relay crashes.
--
-- A relay restarted after a SIGKILL used to skip the rows still leased to the dead relay and
-- publish later rows first. A claim now never takes a row staged after an unpublished row of
-- its lane that an unexpired claim holds; order_key names a row's lane (NULL: the one lane of
-- every row without a key), so relays publishing side by side keep the order per key.
-- outbox_held finds the held rows (a few batches at most) without walking the backlog.
ALTER TABLE {schema}.outbox ADD COLUMN order_key text;

CREATE INDEX outbox_held ON {schema}.outbox (claim_expires_at)
    WHERE published_at IS NULL AND claim_expires_at IS NOT NULL;
