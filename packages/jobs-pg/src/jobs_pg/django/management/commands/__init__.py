"""``jobs_migrate`` and ``jobs_worker``."""
