-- jobs-pg migration 0008: autovacuum keeps up with a queue's churn on jobs and job_steps.
--
-- 0003 made autovacuum visit the jobs table early (1,000 + 2 % of its rows dead). Two gaps
-- remained for a deployment that keeps a day of settled rows:
--
-- * job_steps had the server's defaults (a vacuum after 20 % of the rows died): every durable
--   run writes its steps and the retention sweep deletes them again, so a table of millions of
--   step rows carried hundreds of thousands of dead ones between vacuums. It gets 0003's
--   thresholds.
-- * A vacuum of either table, once started, ran at the server's default cost budget (200 page
--   credits per 2 ms sleep): on a table of tens of millions of rows a pass took long enough for
--   the next one to be due before it ended. Both tables get a budget of 2,000 per 1 ms sleep
--   (a pass over a hot, mostly cached table ends in a fraction of the time, its I/O bounded).
--
-- These are per-table storage parameters: ALTER TABLE ... SET takes a SHARE UPDATE EXCLUSIVE
-- lock, which never blocks the enqueues, claims and settles running meanwhile (only another
-- schema change or a VACUUM waits), and rewrites nothing. An operator may set them again; they
-- do nothing while the server runs with autovacuum = off.
ALTER TABLE {schema}.jobs SET (
    autovacuum_vacuum_cost_limit = 2000,
    autovacuum_vacuum_cost_delay = 1
);
ALTER TABLE {schema}.job_steps SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02,
    autovacuum_vacuum_cost_limit = 2000,
    autovacuum_vacuum_cost_delay = 1
);
