"""The Redis listing index: it always agrees with the rows, and no operator call scans keys.

The conformance suite proves the operator semantics; these tests prove what is Redis's own: the
index sets (``<base>x:<queue>:<state>``) move with every state change, members left by expired
``done`` rows go away, walks bounded per call still find every row, and the server is never
asked for ``KEYS`` or ``SCAN``.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

import pytest
import redis.asyncio as aioredis

from jobs_core.types import (
    ErrorInfo,
    JobFilter,
    JobState,
    NackOptions,
    RetentionRequest,
    Settle,
)
from jobs_redis import RedisDriver, _introspect
from redis_helpers import claim, request

ALL = [str(s) for s in JobState]


async def index_snapshot(url: str, prefix: str, queues: list[str]) -> dict[str, str]:
    """Answer ``{job id: state}`` as the index holds it, failing on a member listed twice."""
    client = aioredis.Redis.from_url(url, decode_responses=True)
    seen: dict[str, str] = {}
    try:
        for queue in queues:
            for state in ALL:
                for member in await client.zrange(f"{{{prefix}}}:x:{queue}:{state}", 0, -1):
                    job_id = member.split(":", 1)[1]
                    assert job_id not in seen, f"{job_id} is indexed as {seen[job_id]} and {state}"
                    seen[job_id] = state
    finally:
        await client.aclose()
    return seen


async def row_states(url: str, prefix: str, ids: list[str]) -> dict[str, str]:
    client = aioredis.Redis.from_url(url, decode_responses=True)
    try:
        states = [await client.hget(f"{{{prefix}}}:j:{i}", "state") for i in ids]
    finally:
        await client.aclose()
    return {i: s for i, s in zip(ids, states, strict=True) if s is not None}


async def test_the_index_moves_with_every_state_change(
    driver: RedisDriver, redis_url: str, prefix: str
) -> None:
    op = driver.introspect
    ids = [
        (await driver.enqueue(request(f"k{i}", queue="a" if i % 2 else "b"))).id for i in range(12)
    ]
    later = await driver.enqueue(request("later", queue="a", delay_ms=60_000))
    ids.append(later.id)
    running = await claim(driver, "a", "b", limit=8)
    await driver.ack(running[0].id, Settle(running[0].fence, {"ok": 1}))
    await driver.nack(
        running[1].id,
        NackOptions(running[1].fence, error=ErrorInfo("boom", "X_BOOM"), dead_letter=True),
    )
    await driver.nack(running[2].id, NackOptions(running[2].fence, delay_ms=60_000))
    await driver.nack(running[3].id, NackOptions(running[3].fence, park=True, delay_ms=60_000))
    await op.cancel(running[4].id, "stop")
    await op.cancel(ids[-2], "queued stop")
    await op.requeue(running[1].id)
    await op.promote(later.id)
    await op.remove(running[0].id)
    buried = await claim(driver, "a", "b", limit=1, vt=1)
    await asyncio.sleep(0.01)
    await claim(driver, "a", "b", limit=20)
    await driver.retention.purge_settled(
        RetentionRequest(frozenset({JobState.CANCELLED}), datetime.now(UTC) + timedelta(1), 1)
    )
    names = [str(i) for i in ids]
    rows = await row_states(redis_url, prefix, names)
    assert await index_snapshot(redis_url, prefix, ["a", "b"]) == rows
    assert len(rows) == len(names) - 2  # one removed, one purged
    assert buried  # the lapsed claim above ran through claim.lua's moves too
    listed = await op.list(JobFilter(limit=200))
    assert {str(r.id): str(r.state) for r in listed.rows} == rows


async def test_an_expired_done_row_leaves_the_index(redis_url: str, prefix: str) -> None:
    driver = await RedisDriver.connect(redis_url, prefix=prefix, done_ttl="50ms")
    try:
        first = await driver.enqueue(request("one"))
        (job,) = await claim(driver)
        await driver.ack(job.id, Settle(job.fence))
        await asyncio.sleep(0.2)
        page = await driver.introspect.list(JobFilter(state=JobState.DONE))
        assert page.rows == ()
        assert await index_snapshot(redis_url, prefix, ["default"]) == {}
        assert await driver.introspect.get(first.id) is None
    finally:
        await driver.close()


async def test_walks_bounded_per_call_find_every_row(
    driver: RedisDriver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_introspect, "WALK_BUDGET", 7)
    await driver.enqueue_many(
        [request(f"k{i}", name="rare" if i % 10 == 0 else "job") for i in range(60)]
    )
    op = driver.introspect
    page = await op.list(JobFilter(name="rare", limit=4))
    assert len(page.rows) == 4 and page.next is not None
    rest = await op.list(JobFilter(name="rare", limit=4, after=page.next))
    assert len(rest.rows) == 2 and rest.next is None and rest.prev is not None
    back = await op.list(JobFilter(name="rare", limit=4, before=rest.prev))
    assert back.rows == page.rows
    removed = await op.remove_many(JobFilter(name="job"))
    assert (removed.affected, removed.remaining) == (54, 0)


async def test_operator_calls_never_scan_keys(throwaway: object) -> None:
    url = throwaway.url  # type: ignore[attr-defined]
    driver = await RedisDriver.connect(url, prefix="ops")
    client = aioredis.Redis.from_url(url, decode_responses=True)
    try:
        await driver.enqueue_many([request(f"k{i}") for i in range(30)])
        jobs = await claim(driver, limit=10)
        for job in jobs:
            await driver.nack(job.id, NackOptions(job.fence, dead_letter=True))
        await client.config_resetstat()
        op = driver.introspect
        page = await op.list(JobFilter(state=JobState.DEAD, queue="default", limit=5))
        await op.list(JobFilter(limit=5, after=page.next))
        await op.list(JobFilter(tenant_id="t", id_prefix="ab"))
        await op.get(jobs[0].id)
        await op.requeue(jobs[0].id)
        await op.requeue_many(JobFilter(state=JobState.DEAD))
        await op.remove_many(JobFilter(queue="default"))
        await op.promote_many(JobFilter())
        await op.paused_queues()
        since = datetime(2000, 1, 1, tzinfo=UTC)
        await driver.counters.counters("job", since)
        await driver.counters.totals(since)
        await driver.counters.rollup(now=datetime.now(UTC) + timedelta(days=40))
        stats = await client.info("commandstats")
        assert not {"cmdstat_keys", "cmdstat_scan"} & set(stats)
    finally:
        await client.aclose()
        await driver.close()
