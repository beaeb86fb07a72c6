"""Fleet-wide rate limits, the issue-24 must-show: 3 worker processes, ``Rate(20, per="1s")``.

``python -m bench.rate --driver pg`` (or ``redis``, ``memory``; ``--jobs 200 --limit 20
--workers 3 --concurrency 10 --work-ms 0``, ``--margin-ms N``) starts ``--workers`` worker
PROCESSES on one backend (a private pg schema ``bench_rate`` in db ``test``, or the Redis prefix
``bench-rate``), enqueues ``--jobs`` rows of one job declared ``rate=Rate(limit, per="1s")``,
and waits until every row is done. Each body records its start and end instants
(``time.time()``, one host's clock) as its result. It prints:

* ``max_per_window``: the most starts inside any rolling 1-second window ``[s, s + 1 s)``, over
  every start ``s`` (the bound is the limit);
* ``span_s``: first start to last start (at least ``(jobs / limit - 1)`` s when the bound holds);
* ``total_s``: the enqueue to the last body's end;
* ``limited``: how many attempts were handed back (the workers' ``deferred`` outcomes).

It exits 1 when ``max_per_window`` exceeds the limit or ``total_s`` falls outside 9.5..11 s (the
issue's figures, for the default sizes). ``memory`` runs the workers as tasks of this process on
one memory driver (a memory driver cannot be shared across processes).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from jobs_core import JobRegistry, Rate, job, open_driver, use_driver
from jobs_core.driver import JobDriver, capability
from jobs_core.types import JobFilter, JobState
from jobs_core.worker import Worker

ROOT = Path(__file__).resolve().parents[1]
QUEUE = "rate-bench"
NAME = "bench.rate.call"
PG_URL = "postgresql://postgres@127.0.0.1:5432/test?schema=bench_rate"
REDIS_URL = "redis://127.0.0.1:6379/0?prefix=bench-rate"
WORKER_CONCURRENCY = 10

REGISTRY = JobRegistry()


class Call(BaseModel):
    """One rate-limited call."""

    n: int


def declare(limit: int, work_ms: int, margin_ms: int | None = None) -> None:
    """Declare the rate-limited job in :data:`REGISTRY` (once per process)."""

    @job(
        input=Call,
        idempotency_key=lambda c: str(c.n),
        tenant="none",
        name=NAME,
        queue=QUEUE,
        rate=Rate(limit, per="1s", margin=margin_ms),
        registry=REGISTRY,
    )
    async def call(c: Call) -> dict[str, float]:
        start = time.time()
        if work_ms:
            await asyncio.sleep(work_ms / 1000)
        return {"start": start, "end": time.time()}


def make_worker(driver: JobDriver, slots: int = WORKER_CONCURRENCY) -> Worker:
    """A worker of the bench queue on ``driver`` (``slots`` slots, the default poll)."""
    return Worker(driver, queues=[QUEUE], concurrency=slots, registry=REGISTRY)


async def worker_process(url: str, slots: int) -> None:
    """Run one worker until SIGTERM; print its outcomes as one JSON line at the end."""
    driver = open_driver(url)
    worker = make_worker(driver, slots)
    worker.install_signal_handlers()
    print("READY", flush=True)
    await worker.run()
    print(json.dumps({"outcomes": dict(worker.stats().outcomes)}), flush=True)


async def prepare(url: str) -> JobDriver:
    """Open the backend's driver, empty the bench's own schema or prefix, migrate."""
    if url.startswith("postgresql"):
        import psycopg

        with psycopg.connect("postgresql://postgres@127.0.0.1:5432/test", autocommit=True) as c:
            c.execute("DROP SCHEMA IF EXISTS bench_rate CASCADE")
    elif url.startswith("redis"):
        import redis

        client = redis.Redis.from_url("redis://127.0.0.1:6379/0")
        keys = list(client.scan_iter(match="{bench-rate}:*", count=1000))
        if keys:
            client.delete(*keys)
        client.close()
    driver = open_driver(url)
    migrate = getattr(driver, "migrate", None)
    if migrate is not None:
        await migrate()
    return driver


def max_per_window(starts: list[float], window: float = 1.0) -> int:
    """Answer the most ``starts`` inside any ``[s, s + window)`` with ``s`` a start."""
    ordered = sorted(starts)
    best, j = 0, 0
    for i, s in enumerate(ordered):
        j = max(j, i)
        while j < len(ordered) and ordered[j] < s + window:
            j += 1
        best = max(best, j - i)
    return best


async def results(driver: JobDriver) -> list[dict[str, float]]:
    """Read every done row's result through the operator surface."""
    introspect = capability(driver, "introspect")
    assert introspect is not None
    found: list[dict[str, float]] = []
    cursor = None
    while True:
        page = await introspect.list(
            JobFilter(queue=QUEUE, state=JobState.DONE, limit=200, after=cursor)
        )
        found.extend(info.result for info in page.rows)
        cursor = page.next
        if cursor is None:
            return found


async def run(args: argparse.Namespace) -> int:
    """Run the bench in the parent; answer the exit status."""
    url = {"pg": PG_URL, "redis": REDIS_URL, "memory": "memory://"}[args.driver]
    declare(args.limit, args.work_ms, args.margin_ms)
    driver = await prepare(url)
    procs: list[asyncio.subprocess.Process] = []
    local: list[tuple[Worker, asyncio.Task[None]]] = []
    env = {
        **os.environ,
        "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
        "BENCH_RATE": json.dumps(
            {
                "limit": args.limit,
                "work_ms": args.work_ms,
                "margin_ms": args.margin_ms,
                "slots": args.concurrency,
            }
        ),
    }
    if args.driver == "memory":
        for _ in range(args.workers):
            worker = make_worker(driver, args.concurrency)
            local.append((worker, asyncio.get_running_loop().create_task(worker.run())))
    else:
        for _ in range(args.workers):
            procs.append(
                await asyncio.create_subprocess_exec(
                    sys.executable,
                    "-m",
                    "bench.rate",
                    "--worker",
                    url,
                    cwd=ROOT,
                    env=env,
                    stdout=asyncio.subprocess.PIPE,
                )
            )
        for proc in procs:
            assert proc.stdout is not None
            line = (await proc.stdout.readline()).decode()
            assert line.strip() == "READY", f"a worker did not start: {line!r}"
        await asyncio.sleep(1.0)  # every worker past its preflight and first (empty) claim
    handle = REGISTRY.get(NAME)
    assert handle is not None
    began = time.time()
    with use_driver(driver):
        await handle.enqueue_many([Call(n=n) for n in range(args.jobs)])
    deadline = time.monotonic() + 120
    while True:
        stats = {s.queue: s for s in await driver.stats()}
        if QUEUE in stats and stats[QUEUE].done == args.jobs:
            break
        if time.monotonic() > deadline:
            print(f"timed out: {stats.get(QUEUE)}", file=sys.stderr)
            break
        await asyncio.sleep(0.05)
    found = await results(driver)
    outcomes: dict[str, int] = {}
    for proc in procs:
        proc.send_signal(signal.SIGTERM)
    for proc in procs:
        out, _ = await asyncio.wait_for(proc.communicate(), 30)
        for line in out.decode().splitlines():
            if line.startswith("{"):
                for k, v in json.loads(line)["outcomes"].items():
                    outcomes[k] = outcomes.get(k, 0) + v
    for worker, task in local:
        await worker.stop()
        await task
        for k, v in worker.stats().outcomes.items():
            outcomes[k] = outcomes.get(k, 0) + v
    await driver.close()
    starts = [r["start"] for r in found]
    ends = [r["end"] for r in found]
    figures: dict[str, Any] = {
        "driver": args.driver,
        "jobs": len(found),
        "limit": args.limit,
        "workers": args.workers,
        "concurrency": args.concurrency,
        "work_ms": args.work_ms,
        "margin_ms": args.margin_ms,
        "max_per_window": max_per_window(starts),
        "span_s": round(max(starts) - min(starts), 3),
        "total_s": round(max(ends) - began, 3),
        "first_start_after_enqueue_s": round(min(starts) - began, 3),
        "limited": outcomes.get("deferred", 0),
        "outcomes": outcomes,
    }
    print(json.dumps(figures))
    if os.environ.get("BENCH_RATE_DUMP"):
        t0 = min(starts)
        print(" ".join(f"{s - t0:.3f}" for s in sorted(starts)))
    ok = (
        len(found) == args.jobs
        and figures["max_per_window"] <= args.limit
        and (args.jobs != 200 or args.limit != 20 or 9.5 <= figures["total_s"] <= 11)
    )
    return 0 if ok else 1


def main() -> None:
    """Parse the command line; run the parent or one worker process."""
    parser = argparse.ArgumentParser(prog="python -m bench.rate", description=__doc__)
    parser.add_argument("--driver", choices=["pg", "redis", "memory"], default="pg")
    parser.add_argument("--jobs", type=int, default=200)
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--work-ms", type=int, default=0)
    parser.add_argument("--concurrency", type=int, default=WORKER_CONCURRENCY, help="slots each")
    parser.add_argument("--margin-ms", type=int, default=None, help="Rate(margin=); default auto")
    parser.add_argument("--worker", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        spec = json.loads(os.environ["BENCH_RATE"])
        declare(spec["limit"], spec["work_ms"], spec["margin_ms"])
        asyncio.run(worker_process(args.worker, spec["slots"]))
        return
    sys.exit(asyncio.run(run(args)))


if __name__ == "__main__":
    main()
