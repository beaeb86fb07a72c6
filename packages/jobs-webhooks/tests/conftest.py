"""Fixtures for jobs-webhooks: a job registry and a memory driver per test, secrets, and pg.

Every delivery test speaks real HTTP to uvicorn servers on loopback addresses
(``webhook_servers.Served``); nothing here mocks a transport. The PostgreSQL tests need the
server at ``JOBS_PG_URL`` (default ``postgresql://postgres@127.0.0.1:5432/test``) and fail, never
skip, when it does not answer; each gets a schema of its own, dropped afterwards.
"""

from __future__ import annotations

import base64
import os
import secrets
import sys
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobs_core import JobFilter, JobRegistry
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.testing import use_driver

# Test modules import webhook_servers (a name no other package's tests use: one session may
# collect several packages).
sys.path.insert(0, str(Path(__file__).parent))

PG_URL = os.environ.get("JOBS_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")


async def jobs_of(driver: Any) -> list[Any]:
    """Every job row the driver holds, newest first."""
    return list((await driver.introspect.list(JobFilter())).rows)


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(24)).decode()


@pytest.fixture
def registry() -> JobRegistry:
    """A registry of the test's own, so declarations never meet another test's."""
    return JobRegistry()


@pytest.fixture
def driver() -> Iterator[MemoryDriver]:
    memory = MemoryDriver()
    with use_driver(memory):
        yield memory


@pytest.fixture
def world() -> object:
    from webhook_world import World

    return World()


@pytest.fixture
def name() -> str:
    return f"hooks.{uuid.uuid4().hex[:10]}"


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
    created = f"w_{uuid.uuid4().hex[:16]}"
    yield created
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{created}" CASCADE')


@pytest.fixture
async def pg_ledger(pg_url: str, schema: str) -> AsyncIterator[object]:
    from jobs_webhooks import PostgresWebhookLedger

    ledger = PostgresWebhookLedger(pg_url, schema=schema, min_size=1, max_size=4)
    await ledger.migrate()
    yield ledger
    await ledger.close()
