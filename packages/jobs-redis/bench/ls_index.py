"""Bench: ``ls --state dead --queue q`` over a large Redis backlog, and the index's memory cost.

Starts a private ``redis-server`` on a free loopback port (never the shared one), fills it with
``--rows`` dead rows in queue ``q`` plus ``--others`` ready rows in queue ``other`` (so the index
has to pick one set out of several), then times the listing the CLI's ``jobsctl ls --state dead
--queue q`` sends (:meth:`RedisIntrospector.list`), first page and a page deep behind a cursor,
and reports ``MEMORY USAGE`` of the index per row next to a row's own hash.

Dead rows are made the way the driver makes them: enqueued with ``max_attempts=1``, claimed
with a 1 ms lease, and buried by the next claim when the lease lapsed on the final attempt.

Run: ``python packages/jobs-redis/bench/ls_index.py --rows 1000000`` (about 5 minutes and 1.2 GB
of server memory for a million rows). Not a test: nothing here asserts a time.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import time
from uuid import uuid4

import redis
from private_server import start_server

from jobs_core.types import ClaimRequest, EnqueueRequest, JobFilter, JobState
from jobs_redis import RedisDriver

BATCH = 1_000


def _request(queue: str, i: int) -> EnqueueRequest:
    return EnqueueRequest(
        id=uuid4(),
        run_id=uuid4(),
        name="bench.job",
        queue=queue,
        input={"n": i},
        idempotency_key=f"{queue}-{i}",
        tenant_id=None,
        max_attempts=1,
    )


async def _fill(driver: RedisDriver, queue: str, rows: int, *, dead: bool) -> None:
    for start in range(0, rows, BATCH):
        await driver.enqueue_many(
            [_request(queue, i) for i in range(start, min(rows, start + BATCH))]
        )
        if dead:
            claim = ClaimRequest(
                queues=[queue], limit=BATCH, visibility_timeout_ms=1, worker_id="w"
            )
            await driver.claim(claim)
    if dead:
        await asyncio.sleep(0.01)
        while (  # noqa: ASYNC110
            await driver.claim(
                ClaimRequest(queues=[queue], limit=BATCH, visibility_timeout_ms=1, worker_id="w")
            )
            or (
                await driver.introspect.list(
                    JobFilter(queue=queue, state=JobState.RUNNING, limit=1)
                )
            ).rows
        ):
            await asyncio.sleep(0.002)


def _ms(samples: list[float]) -> str:
    samples = sorted(samples)
    p95 = samples[int(len(samples) * 0.95) - 1]
    return f"p50 {statistics.median(samples) * 1000:.2f} ms, p95 {p95 * 1000:.2f} ms"


async def main(rows: int, others: int, limit: int, repeats: int) -> None:
    """Fill a private server, time the listing, and print the figures."""
    server, workdir, url = start_server()
    try:
        driver = await RedisDriver.connect(url, prefix="bench", command_timeout="60s")
        started = time.perf_counter()
        await _fill(driver, "q", rows, dead=True)
        await _fill(driver, "other", others, dead=False)
        print(
            f"filled {rows:,} dead rows in q and {others:,} ready rows in other "
            f"in {time.perf_counter() - started:.0f} s"
        )
        op = driver.introspect
        flt = JobFilter(state=JobState.DEAD, queue="q", limit=limit)
        client = redis.Redis.from_url(url)
        client.config_resetstat()
        first: list[float] = []
        page = None
        for _ in range(repeats):
            t0 = time.perf_counter()
            page = await op.list(flt)
            first.append(time.perf_counter() - t0)
        assert page is not None and len(page.rows) == min(limit, rows)
        deep = page
        for _ in range(50):
            assert deep.next is not None
            deep = await op.list(
                JobFilter(state=JobState.DEAD, queue="q", limit=limit, after=deep.next)
            )
        later: list[float] = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            await op.list(JobFilter(state=JobState.DEAD, queue="q", limit=limit, after=deep.next))
            later.append(time.perf_counter() - t0)
        # The server's own time per script call: what the listing costs Redis, whatever the
        # load on the client's machine adds to the round trip.
        evalsha = client.info("commandstats").get("cmdstat_evalsha", {})
        print(f"ls --state dead --queue q (limit {limit}), first page: {_ms(first)}")
        print(f"  the page after {51 * limit:,} rows (cursor): {_ms(later)}")
        print(
            f"  server time per listing script call: {evalsha.get('usec_per_call', 0):.0f} µs "
            f"({evalsha.get('calls', 0)} calls)"
        )
        index = client.memory_usage("{bench}:x:q:dead", samples=0) or 0
        members = client.zcard("{bench}:x:q:dead")
        row_key = "{bench}:j:" + str(page.rows[0].id)
        row = client.memory_usage(row_key, samples=0) or 0
        print(
            f"index {{bench}}:x:q:dead: {members:,} members, {index / 1e6:.1f} MB, "
            f"{index / max(members, 1):.0f} bytes per job (a row's own hash: {row} bytes)"
        )
        used = client.info("memory")["used_memory"]
        print(f"server used_memory: {used / 1e6:.0f} MB for {rows + others:,} rows")
        await driver.close()
    finally:
        server.kill()
        server.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000, help="dead rows in queue q")
    parser.add_argument("--others", type=int, default=10_000, help="ready rows in queue other")
    parser.add_argument("--limit", type=int, default=50, help="page size (jobsctl ls's default)")
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    asyncio.run(main(args.rows, args.others, args.limit, args.repeats))
