-- jobs-pg migration 0003: autovacuum visits the jobs table early.
--
-- Every job leaves two dead row versions behind (its claim and its settle are updates that cannot
-- be HOT: state is in the claim indexes' predicates), and their index entries stay until VACUUM
-- removes them. The claim walks jobs_claim from its oldest entry, so it steps over the entries of
-- every row claimed since the last vacuum: at the default threshold (20 % of the table dead) a
-- table holding a million finished rows is vacuumed every ~100k jobs, and claims slow down in
-- between. Here a vacuum starts after 1,000 + 2 % of the rows died, and inserts alone trigger one
-- too (it marks pages all-visible, so the claim's lapse probe reads the index alone). These are
-- per-table storage parameters: an operator may ALTER TABLE them again; they do nothing while the
-- server runs with autovacuum = off.
ALTER TABLE {schema}.jobs SET (
    autovacuum_vacuum_scale_factor = 0.02,
    autovacuum_vacuum_threshold = 1000,
    autovacuum_vacuum_insert_scale_factor = 0.02,
    autovacuum_analyze_scale_factor = 0.02
);
