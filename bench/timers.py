"""Timers on time: how late delayed jobs start (``python -m bench --timers [--quick]``).

One process per driver runs a worker at its defaults; once it has gone idle, another driver
object (its own pool and connections: an application process) enqueues ``--jobs`` rows whose
``run_at`` is spread evenly over ``--spread`` seconds from ``--lead`` seconds on, in a shuffled
order (so many of them come
first in their queue when they arrive, and must wake the sleeping worker). Each body's first line
takes the wall clock; its lateness is that minus the ``run_at`` it was enqueued with. Prints p50,
p95 and the maximum per driver against the targets (pg and redis p95 < 50 ms, memory < 10 ms),
beside the floor: plain ``asyncio.sleep`` timers for the same instants in the same process (on a
loaded machine both include the wait for a CPU).

The rows carry ``run_at`` instants on this machine's clock, which the backends (on loopback)
share. Postgres runs in a database of its own (``bench_i23_timers``), Redis under a prefix of
its own in the bench's db index: nothing of another run is touched.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
import uuid
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel

from bench.common import drop_database, fresh_database, percentile, redis_url, run_child

TARGET_MS = {"memory": 10.0, "pg": 50.0, "redis": 50.0}
PG_DB = "bench_i23_timers"


class Due(BaseModel):
    """A timer job's input: its key and the ``run_at`` it was enqueued with (epoch seconds)."""

    k: str
    due: float


async def _measure(
    url: str, jobs: int, spread: float, redis_prefix: str | None, lead_s: float
) -> dict[str, Any]:
    from jobs_core import JobRegistry, job
    from jobs_core.driver import JobDriver, open_driver
    from jobs_core.worker import Worker

    registry = JobRegistry()
    late_by_key: dict[str, float] = {}
    # Keys whose enqueue returned after their due instant: their lateness is the enqueuer's.
    enqueued_late: set[str] = set()
    finished = asyncio.Event()

    @job(
        input=Due,
        idempotency_key=lambda i: i.k,
        tenant="none",
        name="bench.timer",
        queue="timers",
        registry=registry,
    )
    async def timer(input: Due, step: Any, ctx: Any) -> None:
        late_by_key[input.k] = (time.time() - input.due) * 1000
        if len(late_by_key) == jobs:
            finished.set()

    options: dict[str, Any] = {} if redis_prefix is None else {"prefix": redis_prefix}
    worker_driver: JobDriver = open_driver(url, **options)
    app_driver: JobDriver = (
        worker_driver if url.startswith("memory") else open_driver(url, **options)
    )
    migrate = getattr(worker_driver, "migrate", None)
    if migrate is not None:
        await migrate()
    worker = Worker(worker_driver, queues=["timers"], registry=registry)
    running = asyncio.create_task(worker.run())
    # Idle first: the worker's poll has backed off to its longest wait.
    await asyncio.sleep(3.0)
    # A lead before the first due instant: a loaded machine's enqueues must all be in first.
    start = time.time() + lead_s
    dues = [start + spread * i / max(jobs - 1, 1) for i in range(jobs)]
    random.Random(23).shuffle(dues)
    from jobs_core.testing import use_driver

    floor_ms: list[float] = []

    async def plain(due: float) -> None:
        await asyncio.sleep(due - time.time())
        floor_ms.append((time.time() - due) * 1000)

    # The floor: the same instants slept on by plain asyncio timers in this process, so a loaded
    # machine's scheduling delay shows in both figures of one run.
    plain_timers = [asyncio.create_task(plain(due)) for due in dues]
    enqueue_started = time.monotonic()
    with use_driver(app_driver):
        for i, due in enumerate(dues):
            key = f"t{i}-{uuid.uuid4().hex[:8]}"
            await timer.enqueue(Due(k=key, due=due), run_at=datetime.fromtimestamp(due, UTC))
            if time.time() >= due:
                enqueued_late.add(key)
    enqueue_s = time.monotonic() - enqueue_started
    try:
        await asyncio.wait_for(finished.wait(), spread + 30)
        await asyncio.gather(*plain_timers)
    finally:
        await worker.stop()
        await running
        if app_driver is not worker_driver:
            await app_driver.close()
        await worker_driver.close()
    late_ms = sorted(ms for key, ms in late_by_key.items() if key not in enqueued_late)
    return {
        "enqueued_late": len(enqueued_late),
        "enqueue_s": enqueue_s,
        "floor_p50_ms": percentile(floor_ms, 50),
        "floor_p95_ms": percentile(floor_ms, 95),
        "jobs": len(late_ms),
        "p50_ms": percentile(late_ms, 50),
        "p95_ms": percentile(late_ms, 95),
        "max_ms": late_ms[-1],
        "min_ms": late_ms[0],
    }


async def child(
    url: str, jobs: int, spread: float, lead_s: float, prefix: str | None = None
) -> dict[str, Any]:
    """Run one driver's measurement (inside a child process: ``bench.child timers``)."""
    return await _measure(url, jobs, spread, prefix, lead_s)


def main(argv: list[str]) -> int:
    """Measure each driver; print one line each and the JSON results."""
    parser = argparse.ArgumentParser(prog="python -m bench --timers")
    parser.add_argument("--drivers", default="memory,pg,redis")
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--spread", type=float, default=60.0, help="seconds the run_at span")
    parser.add_argument("--quick", action="store_true", help="a 15 s spread")
    parser.add_argument(
        "--lead", type=float, default=5.0, help="seconds from the enqueues to the first due row"
    )
    args = parser.parse_args(argv)
    spread = 15.0 if args.quick else args.spread
    results: dict[str, Any] = {}
    for driver in [d.strip() for d in args.drivers.split(",") if d.strip()]:
        params: dict[str, Any] = {"jobs": args.jobs, "spread": spread, "lead_s": args.lead}
        if driver == "memory":
            params["url"] = "memory://"
        elif driver == "pg":
            params["url"] = fresh_database(PG_DB)
        elif driver == "redis":
            params["url"] = redis_url("ours")
            params["prefix"] = f"bench-timers-{uuid.uuid4().hex[:8]}"
        else:
            raise SystemExit(f"unknown driver {driver!r} (memory, pg, redis)")
        try:
            got = run_child("timers", params, timeout=spread + 120)
        finally:
            if driver == "pg":
                drop_database(PG_DB)
            elif driver == "redis":
                _drop_prefix(params["url"], params["prefix"])
        results[driver] = got
        verdict = "ok" if got["p95_ms"] < TARGET_MS[driver] else "MISSED"
        print(
            f"timers {driver:<6} {got['jobs']} jobs over {spread:.0f} s: lateness p50 "
            f"{got['p50_ms']:.1f} ms, p95 {got['p95_ms']:.1f} ms, max {got['max_ms']:.1f} ms "
            f"(target p95 < {TARGET_MS[driver]:.0f} ms: {verdict}); plain asyncio timers in "
            f"the same process: p50 {got['floor_p50_ms']:.1f} ms, p95 {got['floor_p95_ms']:.1f} ms"
            f"; enqueues took {got['enqueue_s']:.1f} s, {got['enqueued_late']} returned after "
            "their due instant (left out)",
            flush=True,
        )
    print(json.dumps(results))
    return 0


def _drop_prefix(url: str, prefix: str) -> None:
    import redis

    client = redis.Redis.from_url(url)
    keys = list(client.scan_iter(match="{" + prefix + "}:*", count=1000))
    for i in range(0, len(keys), 1000):
        client.delete(*keys[i : i + 1000])
    client.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
