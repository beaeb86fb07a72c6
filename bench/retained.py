"""Claim throughput with millions of settled rows retained (``python -m bench --retained``).

A deployment keeping a day of done rows at 1,000 jobs/s holds 86M of them beside its live ones.
This measures what they cost the hot path, in one run over a database of its own
(``bench_retained``, the server's autovacuum plus what the migrations set; ``--private-server
--pg-setting shared_buffers=4GB`` runs it on a fresh server of its own, :mod:`bench.private_pg`):

1. ``empty``: ``--jobs`` no-op jobs are enqueued (``enqueue_many``) and one in-process
   :class:`~jobs_core.worker.Worker` at its defaults drains them; the figure is jobs/s from the
   first body's first line to the last completion the worker counted (no polling of the table);
2. ``--rows`` settled rows (default 10,000,000; 85 % done, 10 % failed, 5 % dead, created
   over the last 24 h) are inserted in bulk with one ``INSERT ... SELECT generate_series`` per
   million, then ``VACUUM (ANALYZE)`` (autovacuum caught up);
3. ``retained``: the same drain again.

Each drain runs ``--repeat`` times (median). The target (issue 23): ``retained`` within 15 % of
``empty``. The last line is a JSON summary.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid
from typing import Any

from pydantic import BaseModel

from bench.common import drop_database, fresh_database
from bench.private_pg import add_arguments, server_for

DATABASE = "bench_retained"
QUEUE = "retained"
CHUNK = 1_000_000


class Probe(BaseModel):
    """A retained-bench job's input."""

    k: str


FIRST: list[float] = []


def _declare() -> Any:
    from jobs_core import JobRegistry, job

    registry = JobRegistry()

    @job(
        input=Probe,
        idempotency_key=lambda p: p.k,
        tenant="none",
        name="bench.retained",
        queue=QUEUE,
        registry=registry,
    )
    async def probe(input: Probe) -> None:
        if not FIRST:
            FIRST.append(time.perf_counter())

    return registry, probe


async def _drain(url: str, n: int) -> float:
    from jobs_core import Worker, use_driver
    from jobs_pg import PostgresDriver

    registry, probe = _declare()
    driver = await PostgresDriver.connect(url)
    tag = uuid.uuid4().hex[:8]
    with use_driver(driver):
        for at in range(0, n, 1000):
            await probe.enqueue_many([Probe(k=f"{tag}-{i}") for i in range(at, min(n, at + 1000))])
    FIRST.clear()
    worker = Worker(driver, registry=registry, queues=[QUEUE])
    running = asyncio.create_task(worker.run())
    while worker.stats().outcomes.get("completed", 0) < n:
        if running.done():
            running.result()
        await asyncio.sleep(0.002)
    finished = time.perf_counter()
    await worker.stop()
    await running
    await driver.close()
    return n / (finished - FIRST[0])


def _retain(url: str, rows: int) -> float:
    import psycopg

    started = time.perf_counter()
    with psycopg.connect(url, autocommit=True) as conn:
        for at in range(0, rows, CHUNK):
            count = min(CHUNK, rows - at)
            conn.execute(
                "INSERT INTO jobs.jobs (id, run_id, name, queue, input, idempotency_key, state,"
                " attempts, max_attempts, run_at, claim, result, created_at, updated_at)"
                " SELECT gen_random_uuid(), gen_random_uuid(), 'bench.retained', %s,"
                " jsonb_build_object('k', 'old-' || (%s + g)), 'old-' || (%s + g),"
                " CASE WHEN g %% 20 = 0 THEN 'dead' WHEN g %% 10 = 0 THEN 'failed' ELSE 'done' END,"
                " 1, 3, t, 1, 'null', t, t"
                " FROM generate_series(1, %s) AS g,"
                " LATERAL (SELECT now() - random() * interval '24 hours' AS t) AS c",
                (QUEUE, at, at, count),
            )
            print(
                f"  retained {at + count:,} rows ({time.perf_counter() - started:.0f} s)",
                flush=True,
            )
        conn.execute("VACUUM (ANALYZE) jobs.jobs")
        size = conn.execute("SELECT pg_total_relation_size('jobs.jobs')").fetchone()
    print(f"  vacuumed; jobs is {size[0] / 2**30:.1f} GiB with its indexes" if size else "")
    return time.perf_counter() - started


def _parse(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench --retained", description=__doc__)
    parser.add_argument("--rows", type=int, default=10_000_000, help="settled rows kept")
    parser.add_argument("--jobs", type=int, default=20_000, help="jobs per drain")
    parser.add_argument("--repeat", type=int, default=3, help="drains per table state")
    parser.add_argument("--quick", action="store_true", help="1,000,000 retained, 5,000 jobs")
    parser.add_argument("--keep", action="store_true", help="keep the database afterwards")
    add_arguments(parser)
    return parser.parse_args(argv)


def main(argv: list[str]) -> int:
    """Run the measurement; answer the exit code."""
    args = _parse(argv)
    if args.quick:
        args.rows, args.jobs = 1_000_000, 5_000
    with server_for(args):
        return _measure(args)


def _measure(args: argparse.Namespace) -> int:
    url = fresh_database(DATABASE)

    async def migrate() -> None:
        from jobs_pg import PostgresDriver

        driver = await PostgresDriver.connect(url)
        await driver.migrate()
        await driver.close()

    asyncio.run(migrate())
    empty = [asyncio.run(_drain(url, args.jobs)) for _ in range(args.repeat)]
    print(f"empty table: {', '.join(f'{x:,.0f}' for x in empty)} jobs/s", flush=True)
    took = _retain(url, args.rows)
    retained = [asyncio.run(_drain(url, args.jobs)) for _ in range(args.repeat)]
    print(f"{args.rows:,} retained: {', '.join(f'{x:,.0f}' for x in retained)} jobs/s")
    ratio = statistics.median(retained) / statistics.median(empty)
    print()
    print(
        f"| claim throughput, {args.jobs:,} no-op jobs, worker at its defaults | jobs/s (median) |"
    )
    print("|---|---:|")
    print(f"| empty table | {statistics.median(empty):,.0f} |")
    print(f"| {args.rows:,} settled rows retained | {statistics.median(retained):,.0f} |")
    print(f"| ratio (target >= 0.85) | {ratio:.2f} |")
    print(
        json.dumps(
            {
                "empty": empty,
                "retained": retained,
                "ratio": ratio,
                "retain_s": took,
                "rows": args.rows,
                "jobs": args.jobs,
            }
        )
    )
    if not args.keep:
        drop_database(DATABASE)
    return 0
