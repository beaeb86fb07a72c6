-- The schedule a fire was made under, so `jobsctl tasks` without the app's code can show it
-- (issue 16). Nullable columns with no default: a catalog-only change, no table rewrite.
ALTER TABLE {schema}.task_fires ADD COLUMN IF NOT EXISTS cron text;
ALTER TABLE {schema}.task_fires ADD COLUMN IF NOT EXISTS tz text;
