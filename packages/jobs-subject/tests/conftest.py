"""Fixtures over the real server: a fresh jobs schema and a fresh app schema per test.

Every test here needs PostgreSQL at ``JOBS_PG_URL`` (default ``postgresql://postgres@127.0.0.1:
5432/test``). A server that does not answer FAILS the session at its first test: these tests
never skip. Each test gets its own schemas, ``t_<random>`` (the jobs tables, migrated) and
``a_<random>`` (the app's tables the subject hangs off), dropped afterwards, so tests can run in
parallel and never see each other's rows.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import psycopg
import pytest

from jobs_core import JobRegistry, use_driver
from jobs_pg import PostgresDriver

# Test modules import subject_world, and the kill test's worker app subject_kill_app (names no
# other package's tests use: several packages' tests may share one session).
APPS = Path(__file__).parent / "apps"
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(APPS))

PG_URL = os.environ.get("JOBS_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.pg)


@pytest.fixture(scope="session")
def pg_url() -> str:
    try:
        with psycopg.connect(PG_URL, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL at {PG_URL} does not answer ({exc}); start it (.ci/run does)")
    return PG_URL


def _fresh(pg_url: str, prefix: str) -> Iterator[str]:
    name = f"{prefix}_{uuid.uuid4().hex[:16]}"
    yield name
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture
def schema(pg_url: str) -> Iterator[str]:
    """The jobs tables' schema of this test (migrated by the ``driver`` fixture)."""
    yield from _fresh(pg_url, "t")


@pytest.fixture
def app_schema(pg_url: str) -> Iterator[str]:
    """The app tables' schema of this test (created empty)."""
    for name in _fresh(pg_url, "a"):
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{name}"')
        yield name


@pytest.fixture
def url(pg_url: str, schema: str) -> str:
    """The driver URL of this test's jobs schema (what a worker subprocess is given)."""
    return f"{pg_url}?schema={schema}"


@pytest.fixture
async def driver(pg_url: str, schema: str) -> AsyncIterator[PostgresDriver]:
    """A migrated PostgreSQL driver on this test's jobs schema, installed for the test.

    Without the ``wake`` capability: ``run_jobs`` polls, and each of its workers would dial,
    probe and drop a LISTEN connection; on Python 3.11 a stop landing as that first probe
    finished was lost and the stop waited for good (jobs-dashboard's hangs under load, left to
    issue 14 to fix in jobs-pg).
    """
    opened = await PostgresDriver.connect(pg_url, schema=schema, min_size=1, max_size=4)
    opened.capabilities = opened.capabilities - {"wake"}
    await opened.migrate()
    with use_driver(opened):
        yield opened
    await opened.close()


@pytest.fixture
def registry() -> JobRegistry:
    """A job registry of this test's own, so declarations never collide across tests."""
    return JobRegistry()


@pytest.fixture
def conn(pg_url: str, app_schema: str) -> Iterator[psycopg.Connection[tuple[object, ...]]]:
    """A sync autocommit connection whose search_path is the app schema."""
    with psycopg.connect(pg_url, autocommit=True) as opened:
        opened.execute(f'SET search_path TO "{app_schema}"')
        yield opened
