-- Child jobs (issue 24): the run whose step.invoke/step.gather enqueued a row, so a child's
-- settle can wake its parent and introspection can list a run's children. A nullable column with
-- no default is a catalog-only change (no table rewrite); the partial index holds child rows only,
-- so it costs nothing for jobs enqueued any other way.
ALTER TABLE {schema}.jobs ADD COLUMN IF NOT EXISTS parent_run_id uuid;
CREATE INDEX IF NOT EXISTS jobs_parent_run
    ON {schema}.jobs (parent_run_id, created_at, id) WHERE parent_run_id IS NOT NULL;
