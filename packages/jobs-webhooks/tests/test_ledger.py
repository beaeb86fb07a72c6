"""The ledgers: memory and PostgreSQL answer alike; the pg one migrates and uses every block."""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from jobs_core import JobRegistry, JobState, Retry
from jobs_core.errors import DriverRequestInvalidError
from jobs_core.testing import run_jobs, use_driver
from jobs_pg import PostgresDriver
from jobs_webhooks import (
    DeliveryAttempt,
    PostgresWebhookLedger,
    WebhookLedger,
    memory_webhook_ledger,
)
from jobs_webhooks._ledger_pg import blocks
from webhook_servers import Reply, Scripted, Served
from webhook_world import Delivery, World

T0 = datetime(2031, 5, 1, 12, 0, tzinfo=UTC)


def attempt(n: int, outcome: str = "failed", endpoint: str = "ep_1", **kw: Any) -> DeliveryAttempt:
    return DeliveryAttempt(
        endpoint_id=endpoint,
        event_id=kw.pop("event_id", f"evt_{n}"),
        topic="orders.paid",
        attempt=1,
        url="https://hooks.example.test/in",
        started_at=T0 + timedelta(seconds=n),
        duration_ms=12.5,
        outcome=outcome,  # type: ignore[arg-type]
        status=kw.pop("status", 500 if outcome == "failed" else 200),
        **kw,
    )


@pytest.fixture(params=["memory", "pg"])
async def ledger(request: pytest.FixtureRequest) -> AsyncIterator[WebhookLedger]:
    if request.param == "memory":
        yield memory_webhook_ledger()
        return
    pg = PostgresWebhookLedger(
        request.getfixturevalue("pg_url"), schema=request.getfixturevalue("schema")
    )
    await pg.migrate()
    yield pg
    await pg.close()


async def test_failures_count_up_a_delivery_resets_and_disable_after_disables(
    ledger: WebhookLedger,
) -> None:
    assert isinstance(ledger, WebhookLedger)
    assert (await ledger.health("ep_1")).consecutive_failures == 0
    await ledger.record(attempt(1), disable_after=3)
    health = await ledger.record(attempt(2), disable_after=3)
    assert (health.consecutive_failures, health.disabled) == (2, False)
    health = await ledger.record(attempt(3, "delivered"), disable_after=3)
    assert health.consecutive_failures == 0
    for n in (4, 5):
        await ledger.record(attempt(n, "throttled", status=429), disable_after=3)
    health = await ledger.record(attempt(6, "refused", status=None), disable_after=3)
    assert health.disabled and health.disabled_at == T0 + timedelta(seconds=6)
    assert await ledger.is_disabled("ep_1") and not await ledger.is_disabled("ep_2")
    await ledger.enable("ep_1")
    assert (await ledger.health("ep_1")).consecutive_failures == 0
    assert not await ledger.is_disabled("ep_1")
    await ledger.disable("ep_2")
    assert await ledger.is_disabled("ep_2")


async def test_never_disabled_without_disable_after(ledger: WebhookLedger) -> None:
    for n in range(1, 6):
        health = await ledger.record(attempt(n), disable_after=None)
    assert (health.consecutive_failures, health.disabled) == (5, False)


async def test_attempts_newest_first_filtered_and_purged(ledger: WebhookLedger) -> None:
    rows = [
        attempt(1, job_id=None, code="X_WEBHOOK_DELIVERY_FAILED", excerpt="down"),
        attempt(2, "delivered", endpoint="ep_2", event_id="evt_1"),
        attempt(3, "throttled", status=429, retry_after_ms=2000),
    ]
    for row in rows:
        await ledger.record(row, disable_after=None)
    assert await ledger.attempts() == list(reversed(rows))
    assert await ledger.attempts(endpoint_id="ep_1") == [rows[2], rows[0]]
    assert await ledger.attempts(event_id="evt_1") == [rows[1], rows[0]]
    assert await ledger.attempts(endpoint_id="ep_2", event_id="evt_1") == [rows[1]]
    assert await ledger.attempts(limit=1) == [rows[2]]
    with pytest.raises(ValueError):
        await ledger.attempts(limit=0)
    assert await ledger.purge(T0 + timedelta(seconds=2)) == 1
    assert await ledger.attempts() == [rows[2], rows[1]]


async def test_concurrent_failures_at_one_endpoint_lose_no_count(pg_ledger: Any) -> None:
    await asyncio.gather(*(pg_ledger.record(attempt(n), disable_after=None) for n in range(40)))
    assert (await pg_ledger.health("ep_1")).consecutive_failures == 40


async def test_every_sql_block_is_used() -> None:
    source = Path(__file__).parents[1] / "src" / "jobs_webhooks" / "_ledger_pg.py"
    used = set(re.findall(r'_rows\("(\w+)"|_sql\["(\w+)"\]', source.read_text()))
    names = {a or b for a, b in used}
    assert names == set(blocks())


async def test_migrate_is_idempotent_and_refuses_an_edited_file(
    pg_url: str, schema: str, pg_ledger: Any
) -> None:
    assert await pg_ledger.migrate() == []
    again = PostgresWebhookLedger(pg_url, schema=schema)
    assert await asyncio.gather(again.migrate(), again.migrate()) == [[], []]
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(f'UPDATE "{schema}".webhook_migrations SET checksum = %s', ("edited",))
    with pytest.raises(DriverRequestInvalidError, match="edited"):
        await again.migrate()
    await again.close()
    fresh = PostgresWebhookLedger(pg_url, schema=schema + "_2")
    try:
        assert await fresh.migrate() == ["0001_webhook_ledger.sql"]
    finally:
        await fresh.close()
        with psycopg.connect(pg_url, autocommit=True) as conn:
            conn.execute(f'DROP SCHEMA IF EXISTS "{schema}_2" CASCADE')


def test_a_bad_schema_is_refused() -> None:
    with pytest.raises(DriverRequestInvalidError):
        PostgresWebhookLedger("postgresql://x", schema="bad; drop")


async def test_a_delivery_on_the_pg_driver_records_in_the_pg_ledger(
    pg_url: str, schema: str, pg_ledger: Any, registry: JobRegistry, name: str
) -> None:
    driver = await PostgresDriver.connect(pg_url, schema=schema, min_size=1, max_size=4)
    await driver.migrate()
    world = World()
    world.ledger = pg_ledger
    app = Scripted(Reply(503, {"retry-after": "0"}), Reply(200))
    try:
        async with Served(app) as server:
            endpoint = world.add(server.url)
            hook = world.declare(name, registry, retry=Retry(attempts=2))
            with use_driver(driver):
                sent = await hook.enqueue(Delivery(endpoint_id=endpoint.id, event_id="evt_1"))
                await run_jobs(driver, registry=registry, timeout="20s")
            await hook.aclose()
        assert (await driver.introspect.get(sent.id)).state == JobState.DONE
    finally:
        await driver.close()
    delivered, throttled = await pg_ledger.attempts(endpoint_id=endpoint.id)
    assert (throttled.outcome, throttled.status, throttled.attempt) == ("throttled", 503, 1)
    assert (delivered.outcome, delivered.attempt, delivered.job_id) == ("delivered", 2, sent.id)
    assert delivered.started_at.tzinfo is not None


async def test_the_migrated_attempts_table_holds_exactly_a_delivery_attempt(
    pg_url: str, schema: str, pg_ledger: Any
) -> None:
    import dataclasses

    with psycopg.connect(pg_url) as conn:
        columns = {
            row[0]
            for row in conn.execute(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_schema = %s AND table_name = 'webhook_attempts'",
                (schema,),
            )
        }
        endpoints = {
            row[0]
            for row in conn.execute(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_schema = %s AND table_name = 'webhook_endpoints'",
                (schema,),
            )
        }
    assert columns == {f.name for f in dataclasses.fields(DeliveryAttempt)} | {"id"}
    assert endpoints == {"endpoint_id", "consecutive_failures", "disabled_at", "updated_at"}
