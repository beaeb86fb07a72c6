"""Fixtures: a fresh pg schema per test, the dashboard served by uvicorn on 127.0.0.1, Chromium.

Every test needs PostgreSQL at ``JOBS_PG_URL`` (default ``postgresql://postgres@127.0.0.1:5432/
test``); a server that does not answer FAILS the test (never a skip). Each test gets its own
schema (``d_<random>``), migrated, and dropped afterwards. The dashboard runs in a real uvicorn
server on a free loopback port, in the test's own event loop, over the same driver object the
test seeds through. Browser tests drive Debian's Chromium (``/usr/bin/chromium``, or
``JOBS_DASHBOARD_CHROMIUM``) through Playwright; screenshots go to ``JOBS_DASHBOARD_SCREENSHOTS``
(the nox session points it into its own output folder) or a pytest temp folder.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import psycopg
import pytest
from playwright.async_api import Browser, BrowserContext, async_playwright

from jobs_core import install_driver
from jobs_dashboard import dashboard_app
from jobs_pg import PostgresDriver

# Test modules import dash_helpers, and the declarations dash_jobs (unique names: several
# packages' tests share one session).
sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).parent / "apps"))

from dash_helpers import AUTH, PASSWORD, USER, serving

PG_URL = os.environ.get("JOBS_PG_URL", "postgresql://postgres@127.0.0.1:5432/test")
CHROMIUM = os.environ.get("JOBS_DASHBOARD_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


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
    name = f"d_{uuid.uuid4().hex[:16]}"
    yield name
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@pytest.fixture
def url(pg_url: str, schema: str) -> str:
    return f"{pg_url}?schema={schema}"


@pytest.fixture
async def driver(pg_url: str, schema: str) -> AsyncIterator[PostgresDriver]:
    """The test's pg driver, without the ``wake`` capability (the dashboard never reads it).

    Seeding calls ``run_jobs`` (which polls every 2-20 ms) one to three times a test, so wake-ups
    buy it nothing, and each of its workers would dial, probe and drop a LISTEN connection moments
    after starting. On Python 3.11 a stop landing as that first probe finished was lost (its
    ``asyncio.wait_for`` swallows a cancel that arrives as the awaited call completes) and the
    worker's stop waited on the listener for good: this suite's hangs under load. The listener's
    stop is jobs-pg's to fix and test (issue 14).
    """
    opened = await PostgresDriver.connect(pg_url, schema=schema, min_size=1, max_size=6)
    opened.capabilities = opened.capabilities - {"wake"}
    await opened.migrate()
    install_driver(opened)
    yield opened
    install_driver(None)
    await opened.close()


@pytest.fixture
def sql(pg_url: str, schema: str) -> Callable[[str], list[tuple[Any, ...]]]:
    """Run one read-only statement on the test's schema (what "checked in the database" means)."""

    def run(statement: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f'SET search_path = "{schema}"')
            return conn.execute(statement).fetchall()  # type: ignore[arg-type]

    return run


Serve = Callable[..., AbstractAsyncContextManager[str]]


@pytest.fixture
def serve(driver: PostgresDriver) -> Serve:
    """``async with serve(read_only=False, auth=AUTH) as base:`` the dashboard over ``driver``."""

    def start(**options: Any) -> AbstractAsyncContextManager[str]:
        options.setdefault("auth", AUTH)
        return serving(dashboard_app(driver, **options))

    return start


@pytest.fixture(scope="session")
def chromium() -> str:
    if not Path(CHROMIUM).exists():
        pytest.fail(f"no Chromium at {CHROMIUM}: apt-get install -y chromium (.ci/run does)")
    return CHROMIUM


@pytest.fixture
async def browser(chromium: str) -> AsyncIterator[Browser]:
    async with async_playwright() as playwright:
        launched = await playwright.chromium.launch(
            executable_path=chromium, headless=True, args=CHROMIUM_ARGS
        )
        yield launched
        await launched.close()


@pytest.fixture
async def context(browser: Browser) -> AsyncIterator[BrowserContext]:
    """A browser context signed in as the test operator."""
    made = await browser.new_context(
        http_credentials={"username": USER, "password": PASSWORD},
        viewport={"width": 1360, "height": 900},
    )
    yield made
    await made.close()


@pytest.fixture(scope="session")
def screenshots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    chosen = os.environ.get("JOBS_DASHBOARD_SCREENSHOTS")
    folder = Path(chosen) if chosen else tmp_path_factory.mktemp("screenshots")
    folder.mkdir(parents=True, exist_ok=True)
    return folder
