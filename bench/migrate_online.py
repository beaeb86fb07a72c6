"""How long an online migration holds off enqueues on a table of 1,000,000 rows.

``python -m bench --migrate-online [--rows N] [--reuse]`` fills a ``bench_migrate`` database
through the pg driver's ``enqueue_many`` (every row with a tenant; ``--reuse`` keeps the rows of
an earlier run), takes the schema back to before migration 0013 (its two indexes dropped, its
record deleted) and then, while 4 callers enqueue single jobs back to back, builds the same two
indexes twice:

* ``plain``: ``CREATE INDEX`` in one transaction, as a migration that is not online would (the
  indexes are dropped again afterwards);
* ``online``: ``driver.migrate()``, which runs 0013 with ``CREATE INDEX CONCURRENTLY``.

For each it prints the build's wall time, the enqueues completed during it, and the enqueue
latency p50/p99/max: the longest an enqueue waited is the lock time a deployment would see.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from dataclasses import replace

from bench.common import pg_admin, pg_url
from jobs_core.types import EnqueueRequest

DATABASE = "bench_migrate"
SCHEMA = "jobs"
CALLERS = 4


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench --migrate-online", description=__doc__)
    parser.add_argument("--rows", type=int, default=1_000_000, help="rows in the table")
    parser.add_argument("--reuse", action="store_true", help="reuse the rows of an earlier run")
    return parser.parse_args(argv)


def _request(n: int, tag: str) -> EnqueueRequest:
    return EnqueueRequest(
        name="bench.migrate",
        queue="default",
        input={"n": n},
        idempotency_key=f"{tag}-{n}",
        tenant_id=f"t{n % 100}",
        max_attempts=3,
        id=uuid.uuid4(),
        run_id=uuid.uuid4(),
    )


async def _fill(url: str, rows: int) -> None:
    from jobs_pg import PostgresDriver

    driver = await PostgresDriver.connect(url, schema=SCHEMA, min_size=1, max_size=2)
    await driver.migrate()
    base = _request(0, "fill")
    for at in range(0, rows, 1000):
        await driver.enqueue_many(
            [
                replace(
                    base,
                    idempotency_key=f"fill-{i}",
                    tenant_id=f"t{i % 100}",
                    id=uuid.uuid4(),
                    run_id=uuid.uuid4(),
                )
                for i in range(at, min(rows, at + 1000))
            ]
        )
    await driver.close()


def _forget(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f"DROP INDEX IF EXISTS {SCHEMA}.jobs_tenant_listing")
        conn.execute(f"DROP INDEX IF EXISTS {SCHEMA}.jobs_dead_listing")
        conn.execute(f"DELETE FROM {SCHEMA}.migrations WHERE version = 13")
        conn.execute(f"VACUUM (ANALYZE) {SCHEMA}.jobs")


async def _plain(url: str) -> None:
    import psycopg

    from jobs_pg._sql import migrations

    [online] = [m for m in migrations() if m.online]
    async with await psycopg.AsyncConnection.connect(url) as conn, conn.transaction():
        for statement in online.statements(SCHEMA):
            await conn.execute(statement.replace(b" CONCURRENTLY", b""))


async def _online(url: str) -> None:
    from jobs_pg import PostgresDriver

    driver = await PostgresDriver.connect(url, schema=SCHEMA, min_size=1, max_size=1)
    try:
        applied = await driver.migrate()
        assert applied == ["0013_listing_indexes.sql"], applied
    finally:
        await driver.close()


async def _under_load(url: str, build: str) -> dict[str, float]:
    from jobs_pg import PostgresDriver

    driver = await PostgresDriver.connect(url, schema=SCHEMA, min_size=CALLERS, max_size=CALLERS)
    stop = asyncio.Event()
    latencies: list[float] = []
    counter = iter(range(10**9))

    async def caller() -> None:
        while not stop.is_set():
            started = time.perf_counter()
            await driver.enqueue(_request(next(counter), f"{build}-{uuid.uuid4().hex[:6]}"))
            latencies.append(time.perf_counter() - started)

    callers = [asyncio.create_task(caller()) for _ in range(CALLERS)]
    await asyncio.sleep(1.0)  # steady state before the build
    latencies.clear()
    started = time.perf_counter()
    await (_plain(url) if build == "plain" else _online(url))
    took = time.perf_counter() - started
    stop.set()
    await asyncio.gather(*callers)
    await driver.close()
    ms = sorted(x * 1000 for x in latencies)
    return {
        "build_s": took,
        "enqueues": len(ms),
        "p50_ms": statistics.median(ms),
        "p99_ms": ms[int(len(ms) * 0.99) - 1],
        "max_ms": ms[-1],
    }


def main(argv: list[str]) -> int:
    """Run the measurement; answer the exit code."""
    args = _parse(argv)
    url = pg_url(DATABASE)
    if not args.reuse:
        pg_admin(f"DROP DATABASE IF EXISTS {DATABASE}")
        pg_admin(f"CREATE DATABASE {DATABASE}")
        print(f"filling {args.rows:,} rows into {DATABASE}", flush=True)
        asyncio.run(_fill(url, args.rows))
    _forget(url)
    plain = asyncio.run(_under_load(url, "plain"))
    _forget(url)
    online = asyncio.run(_under_load(url, "online"))
    print()
    print(
        f"| building 0013's two indexes on {args.rows:,} rows, {CALLERS} callers enqueuing "
        "| build s | enqueues meanwhile | p50 ms | p99 ms | max ms |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, got in (
        ("plain CREATE INDEX (one transaction)", plain),
        ("online (CREATE INDEX CONCURRENTLY, migrate())", online),
    ):
        print(
            f"| {name} | {got['build_s']:.1f} | {got['enqueues']} | {got['p50_ms']:.1f} "
            f"| {got['p99_ms']:.1f} | {got['max_ms']:.0f} |"
        )
    return 0
