"""The README's Factories example runs as written against the real server (in a private schema
for the app's tables and another for the driver's)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path
from urllib.parse import quote

import psycopg

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_factories_example_runs(pg_url: str) -> None:
    section = README.read_text(encoding="utf-8").split("\n## Factories\n", 1)[1]
    [code] = re.findall(r"```python\n(.*?)```", section.split("\n## ", 1)[0], flags=re.S)
    app, jobs = f"t_{uuid.uuid4().hex[:16]}", f"t_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{app}"')
    try:
        url = f"{pg_url}?options={quote(f'-csearch_path={app}')}"
        env = {**os.environ, "DATABASE_URL": url, "JOBS_SCHEMA": jobs}
        done = subprocess.run(
            [sys.executable, "-c", code],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        first, second = done.stdout.splitlines()
        assert first.startswith("{'buckets': 3, 'rows': 3,"), first
        assert second == "{'view': 'click_totals', 'concurrently': True}"
    finally:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            for schema in (app, jobs):
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
