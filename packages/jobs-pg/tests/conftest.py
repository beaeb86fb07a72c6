"""Fixtures over the real server: a fresh schema per test, drivers on it, and the suite opt-in.

Every test here needs PostgreSQL at ``JOBS_PG_URL`` (default ``postgresql://postgres@127.0.0.1:
5432/test``). A server that does not answer FAILS the session at its first test: these tests
never skip. Each test gets its own schema (``t_<random>``), migrated, and dropped afterwards, so
tests can run in parallel and never see each other's rows.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobs_core.clock import Clock
from jobs_core.testing import ManualClock
from jobs_pg import PostgresDriver

pytest_plugins = ["jobs_conformance.plugin"]

# Test modules import pg_helpers, and the worker app pg_workload (unique names: several
# packages' tests share one session).
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent / "apps"))

PG_URL = os.environ.get("JOBS_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents or "jobs-conformance" in item.nodeid:
            item.add_marker(pytest.mark.pg)


@pytest.fixture(scope="session")
def pg_url() -> str:
    try:
        with psycopg.connect(PG_URL, connect_timeout=5) as conn:
            conn.execute("SELECT 1")
    except psycopg.OperationalError as exc:
        pytest.fail(f"PostgreSQL at {PG_URL} does not answer ({exc}); start it (.ci/run does)")
    return PG_URL


@pytest.fixture
def schema(pg_url: str) -> Iterator[str]:
    name = f"t_{uuid.uuid4().hex[:16]}"
    yield name
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


def schema_url(pg_url: str, schema: str) -> str:
    return f"{pg_url}?schema={schema}"


@pytest.fixture
def url(pg_url: str, schema: str) -> str:
    """The driver URL of this test's schema (what a worker subprocess is given)."""
    return schema_url(pg_url, schema)


@pytest.fixture
async def migrated(pg_url: str, schema: str) -> str:
    driver = PostgresDriver(pg_url, schema=schema, min_size=0, max_size=1)
    try:
        await driver.migrate()
    finally:
        await driver.close()
    return schema


@pytest.fixture
def driver_factory(pg_url: str, migrated: str) -> Callable[..., Any]:
    """The conformance contract: drivers over this test's fresh, migrated schema."""

    async def open_driver(clock: Clock | None = None) -> PostgresDriver:
        return await PostgresDriver.connect(
            pg_url, schema=migrated, clock=clock, min_size=1, max_size=6
        )

    return open_driver


@pytest.fixture
async def driver(driver_factory: Callable[..., Any]) -> AsyncIterator[PostgresDriver]:
    opened: PostgresDriver = await driver_factory()
    yield opened
    await opened.close()


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
async def timed(
    driver_factory: Callable[..., Any], clock: ManualClock
) -> AsyncIterator[PostgresDriver]:
    """A driver deciding due and lapsed on a manual clock (tests move it)."""
    opened: PostgresDriver = await driver_factory(clock=clock)
    yield opened
    await opened.close()


@pytest.fixture
def crash_worker_command(pg_url: str, migrated: str) -> Callable[[str], list[str]]:
    """The conformance contract: a real worker subprocess on this test's schema."""

    def command(app: str) -> list[str]:
        return [
            sys.executable,
            "-m",
            "jobs_core.cli",
            "worker",
            app,
            "--driver",
            schema_url(pg_url, migrated),
        ]

    return command


@pytest.fixture
def outbox_transaction(pg_url: str) -> Callable[[], Any]:
    """The conformance contract: a transaction on an app connection of its own."""

    @asynccontextmanager
    async def transaction() -> AsyncIterator[psycopg.AsyncConnection[Any]]:
        conn = await psycopg.AsyncConnection.connect(pg_url, autocommit=True)
        try:
            async with conn.transaction():
                yield conn
        finally:
            await conn.close()

    return transaction
