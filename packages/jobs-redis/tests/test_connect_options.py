"""Ways to open the driver: ``REDIS_URL`` when no URL is given, an app's ready client, and
``done_ttl=0`` in a URL meaning "keep"."""

from __future__ import annotations

import socket

import pytest
import redis.asyncio as aioredis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from conftest import drop_prefix
from jobs_conformance.target import claim, request
from jobs_core.errors import DriverRequestInvalidError, DriverUnavailableError
from jobs_redis import RedisDriver, open_redis_driver


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


async def test_no_url_reads_redis_url(
    redis_url: str, prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    spelled = redis_url.replace("127.0.0.1", "localhost")
    monkeypatch.setenv("REDIS_URL", spelled)
    driver = await RedisDriver.connect(prefix=prefix)
    try:
        assert driver.describe()["url"] == spelled
        queued = await driver.enqueue(request("from-env"))
        [held] = await claim(driver)
        assert held.id == queued.id
    finally:
        await driver.close()
    monkeypatch.setenv("REDIS_URL", f"redis://127.0.0.1:{_closed_port()}/0")
    away = RedisDriver(prefix=prefix)
    with pytest.raises(DriverUnavailableError):
        await away.enqueue(request("nowhere"))
    await away.close()


async def test_a_ready_client_is_used_and_keeps_the_unavailable_mapping(
    redis_url: str, prefix: str
) -> None:
    client = aioredis.Redis.from_url(redis_url, decode_responses=True)
    try:
        driver = await RedisDriver.connect(client=client, prefix=prefix)
        queued = await driver.enqueue(request("given"))
        [held] = await claim(driver)
        assert held.id == queued.id
        assert driver.describe()["url"] == "redis://127.0.0.1:6379/0"
        await driver.close()
        assert await client.ping(), "the app's client stays open: the app owns it"
        with pytest.raises(DriverUnavailableError):
            await driver.enqueue(request("after-close"))
    finally:
        await client.aclose()
        drop_prefix(redis_url, prefix)
    # The app's client keeps its own retries: these make it give up at once.
    dead = aioredis.Redis(port=_closed_port(), decode_responses=True, retry=Retry(NoBackoff(), 0))
    away = RedisDriver(client=dead, prefix=prefix)
    with pytest.raises(DriverUnavailableError) as refused:
        await away.enqueue(request("nowhere"))
    assert refused.value.code == "X_DRIVER_UNAVAILABLE"
    await dead.aclose()
    raw = aioredis.Redis.from_url(redis_url)
    with pytest.raises(DriverRequestInvalidError, match="decode_responses=True"):
        RedisDriver(client=raw)
    with pytest.raises(DriverRequestInvalidError, match="not both"):
        RedisDriver(redis_url, client=client)
    await raw.aclose()


def test_done_ttl_zero_in_a_url_keeps_done_rows(redis_url: str) -> None:
    for spelled in ("0", "0ms", "0s"):
        assert open_redis_driver(f"{redis_url}?done_ttl={spelled}").done_ttl_ms == 0
    assert open_redis_driver(f"{redis_url}?done_ttl=1d").done_ttl_ms == 86_400_000
