"""The shipped Lua scripts: headers, hash tags, and every one of them called by the driver."""

from __future__ import annotations

import re
from datetime import UTC, datetime

import redis.asyncio as aioredis

from conftest import Throwaway
from jobs_core.driver import (
    EventQuery,
    LeaseRequest,
    PublishRequest,
    RateRequest,
    StepResolution,
)
from jobs_core.types import (
    JobFilter,
    JobState,
    NackOptions,
    RetentionRequest,
    Settle,
    StepRecord,
    StepWrite,
)
from jobs_redis import RedisDriver
from jobs_redis._scripts import SCRIPTS
from redis_helpers import claim, request


def test_every_script_opens_with_its_keys_args_and_reply() -> None:
    assert len(SCRIPTS) >= 20
    for script in SCRIPTS.values():
        header = script.text.split("\n\n", 1)[0]
        assert header.startswith(f"-- {script.name}.lua: "), script.name
        for part in ("KEYS[1]", "Reply:"):
            assert part in header, f"{script.name}.lua does not list {part}"
        used_args = set(re.findall(r"ARGV\[(\d+)", script.text.split("\n\n", 1)[1]))
        if used_args:
            assert "ARGV[1]" in header, f"{script.name}.lua does not list its ARGV"


def test_scripts_build_keys_only_from_the_tagged_base() -> None:
    # Every key a script names is KEYS[i] or starts with ARGV[1] (the "{prefix}:" base), so all
    # of them share the prefix's hash tag and land in one Cluster slot.
    literal_key = re.compile(r"redis\.call\('\w+', '")
    for script in SCRIPTS.values():
        assert not literal_key.search(script.text), f"{script.name}.lua names a literal key"


async def test_every_script_is_called_by_the_driver(throwaway: Throwaway) -> None:
    """Run every operation against a fresh server, then ask it which scripts it was sent."""
    driver = await RedisDriver.connect(throwaway.url, prefix="tour")
    client = aioredis.Redis.from_url(throwaway.url)
    await client.script_flush()
    op = driver.operator
    first = await driver.enqueue(request("a"))
    await driver.enqueue_many([request(f"b{i}") for i in range(1_500)])
    jobs = await claim(driver, limit=3)
    job, other, third = jobs
    await driver.steps.write(
        StepWrite(job.id, job.fence, job.run_id, StepRecord("pay", "started", once=True))
    )
    await driver.steps.load(job.run_id)
    await driver.steps.now()
    await op.resolve_step(first.id, "pay", StepResolution(ran=False))
    await driver.heartbeat(job.id, job.fence, 30_000)
    await driver.ack(job.id, Settle(job.fence))
    await driver.nack(other.id, NackOptions(other.fence))
    await op.cancel(third.id, "tour")
    await op.get(first.id)
    await op.record_progress(job.id, job.fence, {"done": 1})
    await op.list(JobFilter())
    await op.promote_many(JobFilter())
    await driver.scheduler_state.advance("t", None, datetime.now(UTC))
    await driver.scheduler_state.watermarks()
    await driver.leader.acquire("h", 1_000)
    await driver.workers.list()
    await op.pause_queue("default")
    await op.resume_queue("default")
    await driver.stats()
    await driver.demand()
    await driver.wake.next_due_ms(["default"])
    await driver.events.publish(PublishRequest("e", {"a": 1}, None, 1_000))
    await driver.events.find(EventQuery("e", datetime(2000, 1, 1, tzinfo=UTC)))
    await driver.events.purge_expired()
    await driver.events.reset()
    lease = LeaseRequest("k", 1, "h", 1_000)
    await driver.leases.acquire(lease)
    await driver.leases.renew(lease)
    await driver.leases.holders("k")
    await driver.leases.release("k", "h")
    await driver.retention.purge_settled(
        RetentionRequest(frozenset({JobState.CANCELLED}), datetime.now(UTC), 10)
    )
    await driver.children.children(first.run_id)
    await driver.rate.take_token(RateRequest("rate:tour", 1, 1_000))
    since = datetime(2000, 1, 1, tzinfo=UTC)
    await driver.counters.counters("job", since)
    await driver.counters.totals(since)
    await driver.counters.rollup()
    names = sorted(SCRIPTS)
    loaded = await client.script_exists(*(SCRIPTS[n].sha for n in names))
    await client.aclose()
    await driver.close()
    assert [n for n, ok in zip(names, loaded, strict=True) if not ok] == []
