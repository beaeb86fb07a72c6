"""Priorities: where urgent rows land behind a backlog, and what the pg claim costs over one.

``python -m bench.priority positions [--drivers memory,pg,redis] [--backlog 10000] [--limit 10]``
    enqueues ``--backlog`` ready rows of priority 5, then 10 rows of priority 0, then claims
    ``--limit`` rows at a time (a worker's claim batch) until the 10 are out; prints the start
    position (1-based, in claim order) and the claim number of each of the 10. With
    ``--worker SLOTS`` a real worker runs through the backlog instead, the 10 are enqueued once it
    has started 200 rows, and the positions count the starts that followed.

``python -m bench.priority claim-cost [--rows 1000000] [--claims 200] [--mixed]``
    fills a fresh database (``bench_i24a_claim``) with ``--rows`` ready rows by one
    ``INSERT ... SELECT``, then prints ``EXPLAIN (ANALYZE, BUFFERS)`` of one claim statement of
    10 rows (its second run in the session, rolled back) and the median and p95 milliseconds of
    ``--claims`` claims of 10 through the driver. ``--mixed`` gives the backlog priority 5 and
    adds 10 rows of priority 0 (needs migration 0010). To measure the schema before 0010, run
    it with an older jobs-pg first on ``PYTHONPATH`` (``git archive`` of the base commit)::

        git archive 74a92e1 packages/jobs-pg/src | tar -x -C /tmp/base
        PYTHONPATH=/tmp/base/packages/jobs-pg/src python -m bench.priority claim-cost

Postgres runs in databases of its own (``bench_i24a_*``), Redis under a prefix of its own
(``bench-i24a-<pid>``, deleted afterwards): nothing of another run is touched.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
import uuid
from typing import Any

from bench.common import REDIS_HOST, REDIS_PORT, drop_database, fresh_database, percentile

URGENT = 10
# db 0 under a prefix of its own, as the tests do: the bench db indexes are flushed by other runs.
REDIS_URL = f"redis://{REDIS_HOST}:{REDIS_PORT}/0"


def _request(key: str, priority: int) -> Any:
    from jobs_core.types import EnqueueRequest

    return EnqueueRequest(
        name="bench.priority",
        queue="default",
        input={"k": key},
        idempotency_key=key,
        tenant_id=None,
        max_attempts=3,
        id=uuid.uuid4(),
        run_id=uuid.uuid4(),
        priority=priority,
    )


async def _open(driver: str) -> tuple[Any, Any]:
    """Answer ``(driver, cleanup)`` for a fresh, empty backend of ``driver``."""
    if driver == "memory":
        from jobs_core.drivers.memory import MemoryDriver

        memory = MemoryDriver()

        async def close_memory() -> None:
            await memory.close()

        return memory, close_memory
    if driver == "pg":
        from jobs_pg import PostgresDriver

        url = fresh_database("bench_i24a_positions")
        pg = PostgresDriver(url)
        await pg.migrate()

        async def close_pg() -> None:
            await pg.close()
            drop_database("bench_i24a_positions")

        return pg, close_pg
    from jobs_redis import RedisDriver

    prefix = f"bench-i24a-{time.time_ns()}"
    rd = await RedisDriver.connect(REDIS_URL, prefix=prefix)

    async def close_redis() -> None:
        import redis.asyncio as aioredis

        client = aioredis.from_url(REDIS_URL)
        async for key in client.scan_iter(match=f"{{{prefix}}}*", count=1000):
            await client.delete(key)
        await client.aclose()
        await rd.close()

    return rd, close_redis


async def positions(driver_name: str, backlog: int, limit: int) -> dict[str, Any]:
    """Enqueue the backlog then the urgent rows; answer where the urgent rows were claimed."""
    from jobs_core.types import ClaimRequest

    driver, cleanup = await _open(driver_name)
    try:
        for start in range(0, backlog, 10_000):
            end = min(backlog, start + 10_000)
            await driver.enqueue_many([_request(f"bulk-{i}", 5) for i in range(start, end)])
        await driver.enqueue_many([_request(f"urgent-{i}", 0) for i in range(URGENT)])
        found: dict[str, tuple[int, int]] = {}
        position = 0
        claims = 0
        while len(found) < URGENT and claims < backlog // limit + 2:
            claims += 1
            took = await driver.claim(ClaimRequest(["default"], limit, 60_000, "bench"))
            for job in took:
                position += 1
                if job.idempotency_key.startswith("urgent-"):
                    found[job.idempotency_key] = (position, claims)
        return {
            "driver": driver_name,
            "backlog": backlog,
            "limit": limit,
            "positions": [found.get(f"urgent-{i}", (None, None))[0] for i in range(URGENT)],
            "claims": sorted({claim for _, claim in found.values()}),
        }
    finally:
        await cleanup()


async def worker_positions(driver_name: str, backlog: int, concurrency: int) -> dict[str, Any]:
    """A worker is busy with the backlog when the urgent rows arrive: where do they start?

    Answers, for each urgent row, how many rows had started since the urgent rows were enqueued
    when it started (1 = the first start after the enqueue), and the worker's slots.
    """
    from pydantic import BaseModel

    from jobs_core import JobRegistry, job, use_driver
    from jobs_core.worker import Worker

    class Item(BaseModel):
        k: str

    driver, cleanup = await _open(driver_name)
    registry = JobRegistry()
    starts: list[str] = []
    busy = asyncio.Event()

    @job(
        input=Item,
        idempotency_key=lambda i: i.k,
        tenant="none",
        name="bench.priority.worker",
        registry=registry,
    )
    async def body(input: Item) -> None:
        starts.append(input.k)
        if len(starts) >= 200:
            busy.set()
        await asyncio.sleep(0.005)

    worker = Worker(driver, concurrency=concurrency, registry=registry, drain_timeout="5s")
    task: asyncio.Task[None] | None = None
    try:
        with use_driver(driver):
            for start in range(0, backlog, 10_000):
                end = min(backlog, start + 10_000)
                await body.enqueue_many(
                    [Item(k=f"bulk-{i}") for i in range(start, end)], priority=5
                )
            task = asyncio.get_running_loop().create_task(worker.run())
            await asyncio.wait_for(busy.wait(), 60)
            mark = len(starts)
            await body.enqueue_many([Item(k=f"urgent-{i}") for i in range(URGENT)], priority=0)
            deadline = time.monotonic() + 30
            while sum(k.startswith("urgent-") for k in starts) < URGENT:
                if time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.005)
        after = starts[mark:]
        return {
            "driver": driver_name,
            "backlog": backlog,
            "concurrency": concurrency,
            "started_before": mark,
            "positions": [
                after.index(f"urgent-{i}") + 1 for i in range(URGENT) if f"urgent-{i}" in after
            ],
        }
    finally:
        if task is not None:
            await worker.drain(close_driver=False)
            await task
        await cleanup()


async def claim_cost(rows: int, claims: int, mixed: bool) -> dict[str, Any]:
    """Fill ``rows`` ready rows; answer the claim's plan and its timings (milliseconds)."""
    import psycopg

    from jobs_core.types import ClaimRequest
    from jobs_pg import PostgresDriver

    database = "bench_i24a_claim"
    url = fresh_database(database)
    driver = PostgresDriver(url)
    try:
        applied = await driver.migrate()
        has_priority = any("0010" in name for name in applied)
        if mixed and not has_priority:
            raise SystemExit("--mixed needs migration 0010 (priorities)")
        priority = ", priority" if has_priority else ""
        value = (", 5" if mixed else ", 0") if has_priority else ""
        fill = f"""
            INSERT INTO jobs.jobs (id, run_id, name, queue, input, idempotency_key, state,
                                   max_attempts, run_at, created_at, updated_at{priority})
            SELECT gen_random_uuid(), gen_random_uuid(), 'bench.priority', 'default', '{{}}',
                   'k' || g, 'ready', 3, now() - interval '2 hours' + g * interval '1 ms',
                   now(), now(){value}
            FROM generate_series(1, %(rows)s) AS g
        """
        started = time.perf_counter()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(fill, {"rows": rows})
            if mixed:
                conn.execute(
                    fill.replace("'k' || g", "'urgent-' || g").replace(", 5\n", ", 0\n"),
                    {"rows": URGENT},
                )
            conn.execute("VACUUM ANALYZE jobs.jobs")
        fill_s = time.perf_counter() - started
        statement = driver._db.statements["claim"]
        params = {
            "now": None,
            "queues": ["default"],
            "limit": 10,
            "lease_ms": 60_000,
            "worker": "bench",
            "drop": [],
            "reason": "bench",
        }
        with psycopg.connect(url) as conn:
            # The second run of the session: the first also plans claim_waiting()'s queries,
            # whose catalog reads would count in its buffers.
            for _ in range(2):
                explain = b"EXPLAIN (ANALYZE, BUFFERS) " + statement
                plan = conn.execute(explain, params).fetchall()
                conn.rollback()
        times = []
        urgent_positions: list[int] = []
        position = 0
        for _ in range(claims):
            t0 = time.perf_counter()
            took = await driver.claim(ClaimRequest(["default"], 10, 60_000, "bench"))
            times.append((time.perf_counter() - t0) * 1000)
            for job in took:
                position += 1
                if job.idempotency_key.startswith("urgent-"):
                    urgent_positions.append(position)
        return {
            "rows": rows,
            "mixed": mixed,
            "migration_0010": has_priority,
            "fill_s": round(fill_s, 1),
            "plan": [line for (line,) in plan],
            "claim_ms_median": round(statistics.median(times), 2),
            "claim_ms_p95": round(percentile(times, 95), 2),
            "urgent_positions": urgent_positions,
        }
    finally:
        await driver.close()
        drop_database(database)


def main(argv: list[str] | None = None) -> None:
    """Parse the command line and print each measurement."""
    parser = argparse.ArgumentParser(prog="python -m bench.priority", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    pos = sub.add_parser("positions")
    pos.add_argument("--drivers", default="memory,pg,redis")
    pos.add_argument("--backlog", type=int, default=10_000)
    pos.add_argument("--limit", type=int, default=10)
    pos.add_argument(
        "--worker",
        type=int,
        default=0,
        metavar="SLOTS",
        help="run a worker of SLOTS slots through the backlog and enqueue the urgent rows mid-way",
    )
    cost = sub.add_parser("claim-cost")
    cost.add_argument("--rows", type=int, default=1_000_000)
    cost.add_argument("--claims", type=int, default=200)
    cost.add_argument("--mixed", action="store_true")
    args = parser.parse_args(argv)
    if args.command == "positions":
        for name in args.drivers.split(","):
            if args.worker:
                busy = asyncio.run(worker_positions(name, args.backlog, args.worker))
                print(
                    f"{busy['driver']}: a worker of {busy['concurrency']} slots had started "
                    f"{busy['started_before']} of {busy['backlog']} priority-5 rows when "
                    f"{URGENT} priority-0 rows came: they started at positions "
                    f"{busy['positions']} of the starts that followed"
                )
                continue
            result = asyncio.run(positions(name, args.backlog, args.limit))
            print(
                f"{result['driver']}: {URGENT} priority-0 rows behind {result['backlog']} "
                f"priority-5 rows, claims of {result['limit']}: start positions "
                f"{result['positions']} (claim {result['claims']})"
            )
    else:
        result = asyncio.run(claim_cost(args.rows, args.claims, args.mixed))
        print("\n".join(result.pop("plan")))
        print({k: v for k, v in result.items()})
    sys.stdout.flush()


if __name__ == "__main__":
    main()
