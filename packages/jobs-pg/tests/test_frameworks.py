"""The README's "Using it from your framework" examples, run as written against the real server.

Each example is written to a module of its own in a temporary directory and driven in a
subprocess (Flask's and FastAPI's test clients, the SQLAlchemy script itself), with the app's
tables in one schema (the URL's search_path) and the jobs tables in another. The Django example
is the project tests/djangoproject (run by test_django.py): its README blocks must match it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
PROJECT = Path(__file__).parent / "djangoproject"


def section(title: str) -> str:
    text = README.read_text(encoding="utf-8").split("\n## Using it from your framework\n", 1)[1]
    text = text.split("\n## ", 1)[0]
    return text.split(f"\n### {title}\n", 1)[1].split("\n### ", 1)[0]


def blocks(title: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", section(title), flags=re.S)


class Site:
    """Two schemas (the app's, the jobs'), a temporary directory, and a runner of scripts."""

    def __init__(self, pg_url: str, tmp: Path) -> None:
        self.pg_url, self.tmp = pg_url, tmp
        self.app, self.jobs = f"t_{uuid.uuid4().hex[:16]}", f"t_{uuid.uuid4().hex[:16]}"
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{self.app}"')
        self.url = f"{pg_url}?options={quote(f'-csearch_path={self.app}')}"
        driver_env = {**os.environ, "DATABASE_URL": f"{pg_url}?schema={self.jobs}"}
        subprocess.run(
            [
                sys.executable,
                "-m",
                "jobs_core",
                "pg",
                "migrate",
                "--driver",
                driver_env["DATABASE_URL"],
            ],
            env=driver_env,
            check=True,
            capture_output=True,
            timeout=60,
        )

    def run(self, script: str) -> str:
        env = {
            **os.environ,
            "DATABASE_URL": self.url,
            "JOBS_SCHEMA": self.jobs,
            "PYTHONPATH": os.pathsep.join([str(self.tmp), *sys.path]),
        }
        done = subprocess.run(
            [sys.executable, "-c", script],
            cwd=self.tmp,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def query(self, sql: str) -> list[tuple[object, ...]]:
        with psycopg.connect(self.pg_url, autocommit=True) as conn:
            cur = conn.execute(
                sql.replace("{app}", f'"{self.app}"').replace("{jobs}", f'"{self.jobs}"')
            )
            return cur.fetchall() if cur.description is not None else []

    def drop(self) -> None:
        with psycopg.connect(self.pg_url, autocommit=True) as conn:
            for schema in (self.app, self.jobs):
                conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')


@pytest.fixture
def site(pg_url: str, tmp_path: Path) -> Iterator[Site]:
    made = Site(pg_url, tmp_path)
    yield made
    made.drop()


def test_the_flask_example_commits_the_order_with_its_receipt(site: Site) -> None:
    [code] = blocks("Flask")
    (site.tmp / "shop_flask.py").write_text(code)
    site.query("CREATE TABLE {app}.orders (id bigserial PRIMARY KEY)")
    out = site.run(
        "from shop_flask import app\n"
        "client = app.test_client()\n"
        "print(client.post('/orders?fail=1').status_code)\n"
        "print(client.post('/orders').status_code)\n"
    )
    assert out.split() == ["500", "201"]
    assert site.query("SELECT count(*) FROM {app}.orders") == [(1,)]
    assert site.query("SELECT input FROM {jobs}.outbox") == [({"order_id": 2},)]


def test_the_sqlalchemy_example_publishes_the_committed_shipment_only(site: Site) -> None:
    [code] = blocks("SQLAlchemy")
    (site.tmp / "shop_sa.py").write_text(code)
    out = site.run("import shop_sa")
    assert out.splitlines() == ["published 1"]
    assert site.query("SELECT item FROM {app}.orders") == [("book",)]
    assert site.query("SELECT name, input FROM {jobs}.jobs") == [("shop_sa.ship", {"order_id": 1})]


def test_the_fastapi_example_enqueues_from_async_and_sync_routes(site: Site) -> None:
    [code] = blocks("FastAPI and Starlette")
    (site.tmp / "shop_api.py").write_text(code)
    out = site.run(
        "from fastapi.testclient import TestClient\n"
        "from shop_api import app\n"
        "with TestClient(app) as client:\n"
        "    print(client.post('/orders/1').status_code)\n"
        "    print(client.post('/sync-orders/2').status_code)\n"
    )
    assert out.split() == ["200", "200"]
    assert sorted(site.query("SELECT input->>'order_id' FROM {jobs}.jobs")) == [("1",), ("2",)]


def test_the_django_blocks_are_the_tested_projects_files() -> None:
    settings, jobs, views = blocks("Django")
    assert "jobs_pg.django" in settings
    assert jobs == (PROJECT / "shop" / "jobs.py").read_text()
    assert views == (PROJECT / "shop" / "views.py").read_text()
