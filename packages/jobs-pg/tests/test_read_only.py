"""A server that refuses writes is an outage, not an app error (issue 14 item 2).

A session set ``default_transaction_read_only`` answers every write with SQLSTATE 25006, as a
demoted primary or a hot standby does; the shared server is never reconfigured (the slow tests
in test_restart.py make whole windows on a private server).
"""

from __future__ import annotations

import asyncio

import pytest

from jobs_core.errors import DriverUnavailableError
from jobs_pg import PostgresDriver
from pg_helpers import request


async def test_a_read_only_refusal_is_unavailable_and_its_connection_never_lent_again(
    pg_url: str, migrated: str
) -> None:
    driver = await PostgresDriver.connect(pg_url, schema=migrated, min_size=1, max_size=1)
    try:
        async with driver.connection() as conn:
            await conn.execute("SET default_transaction_read_only = on")
            refusing = conn.info.backend_pid
        with pytest.raises(DriverUnavailableError) as caught:
            await driver.enqueue(request("a"))
        assert caught.value.code == "X_DRIVER_UNAVAILABLE"
        assert caught.value.meta["sqlstate"] == "25006"
        queued = await driver.enqueue(request("b"))
        async with driver.connection() as conn:
            assert conn.info.backend_pid != refusing
        assert queued.deduped is False
    finally:
        await driver.close()


async def test_every_connection_asks_for_a_read_write_server(pg_url: str, migrated: str) -> None:
    driver = await PostgresDriver.connect(pg_url, schema=migrated, min_size=1, max_size=1)
    try:
        async with driver.connection() as conn:
            assert conn.info.get_parameters().get("target_session_attrs") == "read-write"
        unsubscribe = await driver.wake.subscribe(lambda queue: None)
        try:
            for _ in range(1000):  # up to 20 s on a loaded machine
                if driver.wake.live:
                    break
                await asyncio.sleep(0.02)
            assert driver.wake.live
        finally:
            await unsubscribe()
    finally:
        await driver.close()


async def test_an_app_url_may_choose_its_own_session_attrs(pg_url: str, migrated: str) -> None:
    driver = await PostgresDriver.connect(
        f"{pg_url}?target_session_attrs=any", schema=migrated, min_size=1, max_size=1
    )
    try:
        async with driver.connection() as conn:
            assert conn.info.get_parameters().get("target_session_attrs", "any") == "any"
    finally:
        await driver.close()
