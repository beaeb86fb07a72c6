-- jobs-pg migration 0013: the operator listing finds a tenant's rows and a queue's dead letters
-- without walking the whole table.
-- jobs-pg: online
--
-- The listing pages newest first on jobs_listing (created_at, id) and applies its filters while
-- it walks; a filter that matches few rows walks far, and one that matches none walks it all
-- (424 ms at p95 for a tenant with no rows in a table of 1,000,000). Two partial indexes lead
-- with the filtered column and end with the listing's order, so such a page reads only its rows:
--
-- * jobs_tenant_listing: rows that carry a tenant. A row enqueued without one never enters it,
--   so a deployment without tenants pays nothing; a tenanted enqueue pays one more index entry.
-- * jobs_dead_listing: dead letters by queue. A row enters it when it is dead-lettered, which is
--   rare, and leaves it when it is requeued or removed.
--
-- Online: CREATE INDEX CONCURRENTLY builds each index without blocking the enqueues, claims and
-- settles running meanwhile (a plain CREATE INDEX would hold off every write to jobs for the
-- whole build). It waits for transactions older than itself to end. An interrupted build leaves
-- an INVALID index, which the next migrate drops and builds again.
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_tenant_listing
    ON {schema}.jobs (tenant_id, created_at, id) WHERE tenant_id IS NOT NULL;
CREATE INDEX CONCURRENTLY IF NOT EXISTS jobs_dead_listing
    ON {schema}.jobs (queue, created_at, id) WHERE state = 'dead';
