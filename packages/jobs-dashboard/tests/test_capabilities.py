"""A driver without a capability: the dashboard says what is missing, never hard-codes a name.

Redis carries no ``introspect``, ``workers``, ``counters`` or ``scheduler_state`` today; if a
later change adds one, the page that needs it starts working without a change here.
"""

from __future__ import annotations

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
from jobs_dashboard import PAGE_CAPABILITIES, dashboard_app
from jobs_redis import RedisDriver

REDIS_URL = os.environ.get("JOBS_REDIS_URL", "redis://127.0.0.1:6379/0")


@pytest.fixture
async def redis_driver() -> AsyncIterator[RedisDriver]:
    prefix = f"dash-{uuid.uuid4().hex[:12]}"
    try:
        opened = await RedisDriver.connect(REDIS_URL, prefix=prefix)
    except Exception as exc:
        pytest.fail(f"Redis at {REDIS_URL} does not answer ({exc}); start it (.ci/run does)")
    yield opened
    await opened.close()
    client = redis.Redis.from_url(REDIS_URL)
    keys = list(client.scan_iter(match="{" + prefix + "}*", count=1000))
    if keys:
        client.delete(*keys)
    client.close()


async def test_a_driver_without_introspect_gets_counts_and_plain_notices(
    redis_driver: RedisDriver,
) -> None:
    with use_driver(redis_driver):
        await dash_jobs.noop.enqueue_many([dash_jobs.N(n=i) for i in range(3)], queue="r1")
    lacking = sorted(name for name in PAGE_CAPABILITIES if capability(redis_driver, name) is None)
    assert lacking  # the premise of this test; drop a name from it once Redis carries it
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
