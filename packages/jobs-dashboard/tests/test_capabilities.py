"""A driver without a capability: the dashboard says what is missing, never hard-codes a name.

Redis carries every capability the pages read (``introspect``, ``workers``, ``counters``,
``scheduler_state``), so the missing ones are shown with a real Redis driver that declares none
of them; a second test reads the counters chart Redis fills.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import AsyncIterator

import dash_jobs
import httpx
import pytest
import redis

from dash_helpers import AUTH, CREDENTIALS, csrf_of, serving
from jobs_core import use_driver
from jobs_core.driver import capability
from jobs_core.types import ClaimRequest, NackOptions, Settle
from jobs_dashboard import PAGE_CAPABILITIES, dashboard_app
from jobs_redis import CARRIED, RedisDriver

REDIS_URL = os.environ.get("JOBS_REDIS_URL", "redis://127.0.0.1:6379/0")


class PlainRedis(RedisDriver):
    """A real Redis driver that declares none of the capabilities the pages read."""

    capabilities = CARRIED - set(PAGE_CAPABILITIES)


@contextlib.asynccontextmanager
async def _opened(kind: type[RedisDriver]) -> AsyncIterator[RedisDriver]:
    prefix = f"dash-{uuid.uuid4().hex[:12]}"
    try:
        opened = await kind.connect(REDIS_URL, prefix=prefix)
    except Exception as exc:
        pytest.fail(f"Redis at {REDIS_URL} does not answer ({exc}); start it (.ci/run does)")
    try:
        yield opened
    finally:
        await opened.close()
        client = redis.Redis.from_url(REDIS_URL)
        keys = list(client.scan_iter(match="{" + prefix + "}*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()


@pytest.fixture
async def plain_redis() -> AsyncIterator[RedisDriver]:
    async with _opened(PlainRedis) as opened:
        yield opened


@pytest.fixture
async def redis_driver() -> AsyncIterator[RedisDriver]:
    async with _opened(RedisDriver) as opened:
        yield opened


async def test_a_driver_without_introspect_gets_counts_and_plain_notices(
    plain_redis: RedisDriver,
) -> None:
    redis_driver = plain_redis
    with use_driver(redis_driver):
        await dash_jobs.noop.enqueue_many([dash_jobs.N(n=i) for i in range(3)], queue="r1")
    lacking = sorted(name for name in PAGE_CAPABILITIES if capability(redis_driver, name) is None)
    assert lacking == sorted(PAGE_CAPABILITIES)
    async with (
        serving(dashboard_app(redis_driver, auth=AUTH)) as base,
        httpx.AsyncClient(base_url=base, auth=CREDENTIALS) as client,
    ):
        overview = await client.get("/")
        assert overview.status_code == 200
        assert 'data-queue="r1"' in overview.text
        assert '<td data-stat="ready">3</td>' in overview.text
        pages = {
            path: (await client.get(path)).text for path in ("/", "/jobs", "/workers", "/tasks")
        }
        job = await client.get(f"/jobs/{uuid.uuid4()}")
        for name in lacking:
            sentence = f"does not carry the {name!r} capability"
            assert any(sentence.replace("'", "&#39;") in html for html in pages.values()), name
        if "introspect" in lacking:
            assert "does not carry" in job.text
            token = csrf_of(overview.text)
            refused = await client.post("/queues/pause", data={"csrf": token, "queue": "r1"})
            assert refused.status_code == 501
            assert "X_NOT_IMPLEMENTED" in refused.text


async def test_the_overview_charts_what_redis_counted(redis_driver: RedisDriver) -> None:
    assert [n for n in PAGE_CAPABILITIES if capability(redis_driver, n) is None] == []
    with use_driver(redis_driver):
        await dash_jobs.noop.enqueue_many([dash_jobs.N(n=i) for i in range(3)], queue="r2")
    jobs = await redis_driver.claim(ClaimRequest(["r2"], 3, 30_000, "w"))
    for held in jobs[:2]:
        assert await redis_driver.ack(held.id, Settle(held.fence, duration_ms=10.0))
    assert await redis_driver.nack(jobs[2].id, NackOptions(jobs[2].fence, dead_letter=True))
    async with (
        serving(dashboard_app(redis_driver, auth=AUTH)) as base,
        httpx.AsyncClient(base_url=base, auth=CREDENTIALS) as client,
    ):
        overview = (await client.get("/")).text
    assert "does not carry the &#39;counters&#39; capability" not in overview
    # The totals row: done, retried, failed, dead.
    assert "dash.noop</a></td><td>2</td><td>0</td><td>0</td><td>1</td>" in overview
    assert ": 2 done</title>" in overview and ": 1 failures</title>" in overview
