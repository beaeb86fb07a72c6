"""The soak: enqueue and processing at once for a long time (``python -m bench --soak MINUTES``).

Three processes over a Postgres database of its own (``bench_i23_soak`` on the bench server,
autovacuum as the server has it plus what the migrations set; ``--private-server`` starts a fresh
server at PostgreSQL's default settings for the run, :mod:`bench.private_pg`, since this
machine's shared server has autovacuum off):

* the enqueuer: 8 concurrent callers, each one ``await enqueue`` at a time, paced together to
  ``--rate`` jobs/s (default 1,500); it prints how many it enqueued and how long each call took
  (the pickup latency includes that call: it is timed from just before it);
* the worker: one :class:`~jobs_core.worker.Worker` at its defaults (64 slots), no-op bodies whose
  first line takes the wall clock; it prints each minute's pickup latency (body start minus the
  instant taken just before the enqueue call) p50 and p95;
* this process: every 10 s the retention sweep (``RetentionStore.purge_settled`` in batches of
  1,000, the purge factory's batch, until a call deletes fewer) for ``done`` rows settled more
  than ``--retention`` ago (default 5 min); each minute it prints the rates, pickup, the
  ``jobs`` and ``job_steps`` tables' total size (table + indexes + TOAST), their dead tuples,
  the rows kept (the statistics' live rows less the backlog: an estimate, so that no count scans
  the table) and the worker's RSS.

The last line is a JSON summary. Figures are read from the backend and ``/proc``, never timed in
the orchestrating process's own work.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

from pydantic import BaseModel

from bench.common import ROOT, drop_database, fresh_database, percentile, rss_kib
from bench.private_pg import add_arguments, server_for

DATABASE = "bench_i23_soak"
QUEUE = "soak"
CALLERS = 8
REPORT_S = 2.0
"""How often the children print (the enqueuer its total so far, the worker its new pickups)."""


class Tick(BaseModel):
    """A soak job's input: a unique key and the enqueuer's ``time.time_ns()``."""

    k: str
    t: int


def _declare() -> Any:
    from jobs_core import JobRegistry, job

    registry = JobRegistry()
    pickups: list[float] = []

    @job(
        input=Tick,
        idempotency_key=lambda i: i.k,
        tenant="none",
        name="bench.soak",
        queue=QUEUE,
        registry=registry,
    )
    async def tick(input: Tick, step: Any, ctx: Any) -> None:
        pickups.append((time.time_ns() - input.t) / 1e6)

    return registry, tick, pickups


async def _worker(url: str) -> None:
    import logging

    from jobs_core.driver import open_driver
    from jobs_core.worker import Worker

    logging.basicConfig(level=logging.WARNING)
    registry, _, pickups = _declare()
    driver = open_driver(url)
    worker = Worker(driver, queues=[QUEUE], registry=registry)
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, worker.request_drain)
    running = asyncio.create_task(worker.run())
    while not running.done():
        await asyncio.wait({running}, timeout=REPORT_S)
        taken, pickups[:] = list(pickups), []
        print(json.dumps({"pickups": [round(ms, 2) for ms in taken]}), flush=True)
    running.result()


async def _enqueuer(url: str, rate: float) -> None:
    from jobs_core.driver import open_driver
    from jobs_core.testing import use_driver

    _, tick, _ = _declare()
    driver = open_driver(url)
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    count = 0
    calls: list[float] = []
    start = time.monotonic()
    interval = CALLERS / rate

    async def caller(n: int) -> None:
        nonlocal count
        due = start + n * interval / CALLERS
        while not stop.is_set():
            wait = due - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            sent = time.time_ns()
            await tick.enqueue(Tick(k=uuid.uuid4().hex, t=sent))
            calls.append((time.time_ns() - sent) / 1e6)
            count += 1
            due += interval

    async def report() -> None:
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), REPORT_S)
            taken, calls[:] = list(calls), []
            line = {"enqueued": count, "calls": [round(ms, 2) for ms in taken]}
            print(json.dumps(line), flush=True)

    with use_driver(driver):
        callers = [asyncio.create_task(caller(n)) for n in range(CALLERS)]
        await report()
        for task in callers:
            task.cancel()
        await asyncio.gather(*callers, return_exceptions=True)
    await driver.close()


class _Lines:
    """The JSON lines a child prints, read on a thread and taken per minute."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[dict[str, Any]] = []
        self.lock = threading.Lock()
        assert proc.stdout is not None
        self.thread = threading.Thread(target=self._read, args=(proc.stdout,), daemon=True)
        self.thread.start()

    def _read(self, stream: Any) -> None:
        for line in stream:
            if line.startswith("{"):
                with self.lock:
                    self.lines.append(json.loads(line))

    def take(self) -> list[dict[str, Any]]:
        with self.lock:
            taken, self.lines = self.lines, []
        return taken


def _spawn(role: str, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "bench.soak", role, *args],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _tables(url: str) -> dict[str, Any]:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        rows = conn.execute(
            "SELECT c.relname, pg_total_relation_size(c.oid), coalesce(s.n_dead_tup, 0),"
            " coalesce(s.n_live_tup, 0), coalesce(s.autovacuum_count, 0)"
            " FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " LEFT JOIN pg_stat_user_tables s ON s.relid = c.oid"
            " WHERE n.nspname = 'jobs' AND c.relname IN ('jobs', 'job_steps')"
        ).fetchall()
        # The claim index's rows, not a count over the table: a scan of the whole table (a
        # quarter of a gigabyte by minute 7) once a minute ran on the cores being measured.
        backlog = conn.execute(
            "SELECT count(*) FROM jobs.jobs WHERE state IN ('ready', 'delayed')"
        ).fetchone()
    out: dict[str, Any] = {"backlog": int(backlog[0]) if backlog else 0}
    for name, size, dead, live, vacuums in rows:
        out[name] = {"bytes": size, "dead": dead, "live": live, "autovacuums": vacuums}
    return out


async def _sweep(url: str, retention_s: float, stop: threading.Event) -> int:
    from jobs_core.driver import open_driver, require_capability
    from jobs_core.types import JobState, RetentionRequest

    driver = open_driver(url)
    store = require_capability(driver, "retention")
    purged = 0
    while not stop.is_set():
        before = datetime.now(UTC) - timedelta(seconds=retention_s)
        while True:
            gone = await store.purge_settled(
                RetentionRequest(frozenset({JobState.DONE}), before, 1_000)
            )
            purged += gone
            if gone < 1_000:
                break
        await asyncio.sleep(10)
    await driver.close()
    return purged


def _ms(row: dict[str, Any], figure: str) -> str:
    """Answer ``p50 X ms p95 Y ms`` for ``figure`` of a minute's row (``-`` for none)."""
    p50, p95 = (row[f"{figure}_{p}_ms"] for p in ("p50", "p95"))
    return f"p50 {_or_dash(p50)} ms p95 {_or_dash(p95)} ms"


def _or_dash(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def main(argv: list[str]) -> int:
    """Run the soak for the minutes in ``argv``; print a line a minute and a JSON summary."""
    parser = argparse.ArgumentParser(prog="python -m bench --soak")
    parser.add_argument("minutes", type=float)
    parser.add_argument("--rate", type=float, default=1_500.0, help="jobs/s offered")
    parser.add_argument("--retention", type=float, default=300.0, help="done retention, s")
    add_arguments(parser)
    args = parser.parse_args(argv)
    with server_for(args):
        return _soak(args)


def _soak(args: argparse.Namespace) -> int:
    import psycopg

    url = fresh_database(DATABASE)
    with psycopg.connect(url, autocommit=True) as conn:
        autovacuum = conn.execute("SHOW autovacuum").fetchone()
    from jobs_core.driver import open_driver

    async def migrate() -> None:
        driver = open_driver(url)
        await driver.migrate()  # type: ignore[attr-defined]
        await driver.close()

    asyncio.run(migrate())
    print(
        f"soak: {args.minutes:g} min, {args.rate:,.0f} jobs/s offered by {CALLERS} callers, "
        f"done retention {args.retention:.0f} s, "
        f"autovacuum {autovacuum[0] if autovacuum else '?'}, server {url.rsplit('/', 1)[0]}",
        flush=True,
    )
    worker = _spawn("worker", url)
    enqueuer = _spawn("enqueue", url, str(args.rate))
    worker_lines, enqueuer_lines = _Lines(worker), _Lines(enqueuer)
    stop = threading.Event()
    swept: list[int] = []
    sweeper = threading.Thread(
        target=lambda: swept.append(asyncio.run(_sweep(url, args.retention, stop))), daemon=True
    )
    sweeper.start()
    minutes: list[dict[str, Any]] = []
    enqueued_before = 0
    started = time.monotonic()
    try:
        for minute in range(1, int(args.minutes) + 1):
            time.sleep(max(0.0, started + minute * 60 + 1 - time.monotonic()))
            picked = [ms for line in worker_lines.take() for ms in line["pickups"]]
            enq = enqueuer_lines.take()
            total = enq[-1]["enqueued"] if enq else enqueued_before
            calls = [ms for line in enq for ms in line["calls"]]
            tables = _tables(url)
            row = {
                "minute": minute,
                "enqueued_per_s": (total - enqueued_before) / 60,
                "processed_per_s": len(picked) / 60,
                "pickup_p50_ms": percentile(picked, 50) if picked else None,
                "pickup_p95_ms": percentile(picked, 95) if picked else None,
                "enqueue_call_p50_ms": percentile(calls, 50) if calls else None,
                "enqueue_call_p95_ms": percentile(calls, 95) if calls else None,
                "backlog": tables["backlog"],
                "jobs_mb": tables.get("jobs", {}).get("bytes", 0) / 2**20,
                "steps_mb": tables.get("job_steps", {}).get("bytes", 0) / 2**20,
                "jobs_dead": tables.get("jobs", {}).get("dead", 0),
                "steps_dead": tables.get("job_steps", {}).get("dead", 0),
                "autovacuums": tables.get("jobs", {}).get("autovacuums", 0),
                "kept_rows": tables.get("jobs", {}).get("live", 0) - tables["backlog"],
                "worker_rss_mb": rss_kib(worker.pid) / 1024,
            }
            minutes.append(row)
            enqueued_before = total
            print(
                f"min {minute:>3}: enqueue {row['enqueued_per_s']:7,.0f}/s  process "
                f"{row['processed_per_s']:7,.0f}/s  pickup {_ms(row, 'pickup')}  "
                f"(enqueue call {_ms(row, 'enqueue_call')})  backlog {row['backlog']:,}  "
                f"jobs+steps {row['jobs_mb'] + row['steps_mb']:.1f} MB (jobs "
                f"{row['jobs_mb']:.1f}, steps {row['steps_mb']:.1f})  dead tuples "
                f"{row['jobs_dead']:,}/{row['steps_dead']:,}  rows kept ~{row['kept_rows']:,}  "
                f"autovacuums {row['autovacuums']}  worker RSS {row['worker_rss_mb']:.1f} MB",
                flush=True,
            )
    finally:
        for proc in (enqueuer, worker):
            proc.send_signal(signal.SIGTERM)
        for proc in (enqueuer, worker):
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
        stop.set()
        sweeper.join(30)
        drop_database(DATABASE)
    print(json.dumps({"minutes": minutes, "purged": swept[0] if swept else None}))
    return 0


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        asyncio.run(_worker(sys.argv[2]))
    elif sys.argv[1] == "enqueue":
        asyncio.run(_enqueuer(sys.argv[2], float(sys.argv[3])))
    else:
        sys.exit(main(sys.argv[1:]))
