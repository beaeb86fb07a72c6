"""Management commands of jobs_pg.django."""
