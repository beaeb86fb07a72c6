"""Our library's workloads, each run inside a child process (see :mod:`bench.child`).

The jobs are declared with explicit names so the enqueuing process and the worker process agree
on them. A body's first line takes ``time.time_ns()``: that is "the body started" for the
processing rate (the first one) and for pickup latency (every one).
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import threading
import time
import uuid
from typing import Any

from pydantic import BaseModel

from bench.common import percentile, rss_kib
from jobs_core import job
from jobs_core.driver import JobDriver, open_driver
from jobs_core.testing import use_driver
from jobs_core.worker import Worker

QUEUE = "bench"
FILL_BATCH = 10_000
"""Inputs per ``enqueue_many`` call when filling a queue (the API's maximum)."""


class Probe(BaseModel):
    """A bench job's input: a unique key and the enqueuer's ``time.time_ns()``."""

    k: str
    t: int = 0


class _Seen:
    """What the bodies of this process saw (bodies run on the worker's loop or its threads)."""

    def __init__(self) -> None:
        self.count = 0
        self.first_ns: int | None = None
        self.latencies_ns: list[int] = []
        self.lock = threading.Lock()

    def hit(self, now: int) -> None:
        with self.lock:
            self.count += 1
            if self.first_ns is None:
                self.first_ns = now
                # A worker the orchestrator started as a CLI reports its first body start the
                # way the peers' workers do (bench.peers.MARK_ENV).
                _mark_first(now)


def _mark_first(now: int) -> None:
    path = os.environ.get("BENCH_MARK_FILE")
    if path:
        with open(path, "a") as f:
            f.write(f"{now}\n")


SEEN = _Seen()


class _RoundTrips:
    """Counts this process's Redis round trips.

    redis-py writes one packed buffer per command, script call or pipeline and then reads the
    reply, so one write is one round trip.
    """

    def __init__(self) -> None:
        self.count = 0
        self.paused = False

    def install(self) -> None:
        """Wrap redis-py's asyncio connection write (once per process)."""
        from redis.asyncio.connection import AbstractConnection

        original = AbstractConnection.send_packed_command

        async def counted(conn: Any, command: Any, check_health: bool = True) -> None:
            if not self.paused:
                self.count += 1
            await original(conn, command, check_health)

        AbstractConnection.send_packed_command = counted  # type: ignore[method-assign]


TRIPS = _RoundTrips()


@job(input=Probe, idempotency_key=lambda p: p.k, tenant="none", name="bench.noop", queue=QUEUE)
async def noop(input: Probe, step: Any, ctx: Any) -> None:
    """Do nothing (record that the body ran)."""
    SEEN.hit(time.time_ns())


async def _unit() -> int:
    return 1


@job(input=Probe, idempotency_key=lambda p: p.k, tenant="none", name="bench.three", queue=QUEUE)
async def three_steps(input: Probe, step: Any, ctx: Any) -> None:
    """Run three durable no-op steps."""
    SEEN.hit(time.time_ns())
    await step.run("a", _unit)
    await step.run("b", _unit)
    await step.run("c", _unit)


@job(input=Probe, idempotency_key=lambda p: p.k, tenant="none", name="bench.pickup", queue=QUEUE)
async def pickup(input: Probe, step: Any, ctx: Any) -> None:
    """Record the time from the enqueue call to this line."""
    now = time.time_ns()
    SEEN.latencies_ns.append(now - input.t)
    SEEN.hit(now)


JOBS = {"noop": noop, "three": three_steps, "pickup": pickup}


def _quiet() -> None:
    # Production log level for a worker under load: per-job INFO lines are off.
    logging.basicConfig(level=logging.WARNING)


def _logs(log: str | None) -> None:
    """Configure this process's logging: :func:`_quiet`, or as ``jobsctl worker`` does.

    ``log`` is ``None``, or ``"warning"``, ``"text"`` (the CLI's default: info, text lines) or
    ``"json"`` (info, ``--log-format json``), through the CLI's own ``configure_logging``, the
    lines going to this child's stderr (a pipe the orchestrator drains, as a log collector would).
    """
    if log is None:
        _quiet()
        return
    from jobs_core.logs import configure_logging

    if log == "warning":
        configure_logging("warning", "text")
    else:
        configure_logging("info", log)


async def open_ours(url: str) -> JobDriver:
    """Open our driver for ``url`` (its schema was applied by :func:`migrate`)."""
    return open_driver(url)


async def migrate(url: str) -> dict[str, Any]:
    """Apply the driver's schema, if it has one (``await driver.migrate()``), and close it."""
    driver = open_driver(url)
    method = getattr(driver, "migrate", None)
    applied = await method() if callable(method) else []
    await driver.close()
    return {"value": len(applied or [])}


async def done_count(driver: JobDriver) -> int:
    """Answer how many bench rows are ``done`` in the backend (its round trips not counted)."""
    TRIPS.paused = True
    try:
        return sum(s.done for s in await driver.stats() if s.queue == QUEUE)
    finally:
        TRIPS.paused = False


async def ready_count(driver: JobDriver) -> int:
    """Answer how many bench rows are ``ready`` in the backend."""
    return sum(s.ready for s in await driver.stats() if s.queue == QUEUE)


def _probes(n: int) -> list[Probe]:
    nonce = uuid.uuid4().hex[:12]
    return [Probe(k=f"{nonce}-{i}") for i in range(n)]


async def fill(driver: JobDriver, which: str, n: int) -> float:
    """Queue ``n`` runs of job ``which`` with ``enqueue_many``; answer seconds taken."""
    handle = JOBS[which]
    probes = _probes(n)
    started = time.perf_counter()
    with use_driver(driver):
        for at in range(0, n, FILL_BATCH):
            await handle.enqueue_many(probes[at : at + FILL_BATCH])
    return time.perf_counter() - started


async def enqueue_single(url: str, n: int) -> dict[str, Any]:
    """Enqueue ``n`` no-op jobs one ``await enqueue`` at a time; verify ``ready == n``."""
    _quiet()
    driver = await open_ours(url)
    probes = _probes(n)
    with use_driver(driver):
        await noop.enqueue(Probe(k="warm-up"))
        started = time.perf_counter()
        for probe in probes:
            await noop.enqueue(probe)
        elapsed = time.perf_counter() - started
    queued = await ready_count(driver)
    await driver.close()
    _check(queued == n + 1, f"{queued} rows ready, expected {n + 1}")
    return {"value": n / elapsed, "unit": "jobs/s", "n": n, "seconds": elapsed}


async def enqueue_many(url: str, n: int, batch: int) -> dict[str, Any]:
    """Enqueue ``n`` no-op jobs with ``enqueue_many`` in batches of ``batch``; verify the count."""
    _quiet()
    driver = await open_ours(url)
    probes = _probes(n)
    with use_driver(driver):
        await noop.enqueue_many([Probe(k="warm-up")])
        started = time.perf_counter()
        for at in range(0, n, batch):
            await noop.enqueue_many(probes[at : at + batch])
        elapsed = time.perf_counter() - started
    queued = await ready_count(driver)
    await driver.close()
    _check(queued == n + 1, f"{queued} rows ready, expected {n + 1}")
    return {"value": n / elapsed, "unit": "jobs/s", "n": n, "seconds": elapsed, "batch": batch}


async def fill_only(url: str, which: str, n: int) -> dict[str, Any]:
    """Queue ``n`` runs of ``which`` and exit (the worker is another process)."""
    _quiet()
    driver = await open_ours(url)
    seconds = await fill(driver, which, n)
    queued = await ready_count(driver)
    await driver.close()
    _check(queued == n, f"{queued} rows ready, expected {n}")
    return {"value": n / seconds, "unit": "jobs/s", "n": n}


async def drain(
    url: str, which: str, n: int, concurrency: int, fill_here: bool, log: str | None = None
) -> dict[str, Any]:
    """Run one worker until ``n`` bench rows are ``done`` in the backend.

    The rate is ``n`` over the time from the first body's first line to the poll that saw the
    last row ``done``. The backend is polled loosely until this process's bodies ran ``n`` times,
    then every millisecond, so the poll neither loads the worker nor adds its interval. ``log``
    configures logging as the CLI does (see :func:`_logs`); by default it is quiet.
    """
    _logs(log)
    driver = await open_ours(url)
    if fill_here:  # the memory driver lives in this process: it must be filled here
        await fill(driver, which, n)
        queued = await ready_count(driver)
        _check(queued == n, f"{queued} rows ready after the fill, expected {n}")
    else:
        queued = await ready_count(driver)
        _check(queued == n, f"{queued} rows ready before the worker started, expected {n}")
    if url.startswith("redis"):
        TRIPS.install()
    worker = Worker(driver, queues=[QUEUE], concurrency=concurrency)
    running = asyncio.create_task(worker.run())
    # A loose look at this process's own counter: no backend round trip, no GIL contention.
    await _until(lambda: SEEN.count >= n, worker, running, driver)
    while await done_count(driver) < n:
        if running.done():
            running.result()
        await _stalled(worker, driver, SEEN.count)
        await asyncio.sleep(0.001)
    finished = time.time_ns()
    done = await done_count(driver)
    await worker.stop()
    await running
    await driver.close()
    assert SEEN.first_ns is not None
    elapsed = (finished - SEEN.first_ns) / 1e9
    _check(done == n, f"{done} rows done, expected {n}")
    trips = {"round_trips_per_job": TRIPS.count / n} if url.startswith("redis") else {}
    return trips | {
        "value": n / elapsed,
        "unit": "runs/s" if which == "three" else "jobs/s",
        "n": n,
        "seconds": elapsed,
        "concurrency": concurrency,
        "bodies": SEEN.count,
    }


async def latency_worker(url: str, n: int, concurrency: int, enqueue_here: bool) -> dict[str, Any]:
    """Idle worker; report pickup latency once ``n`` probes ran and are ``done``.

    Prints ``BENCH_READY`` after the worker has idled a second (its poll backed off), so the
    enqueuer (another process, or with ``enqueue_here`` a thread of this one for the memory
    driver) starts against an idle worker.
    """
    from bench.common import ready

    _quiet()
    driver = await open_ours(url)
    worker = Worker(driver, queues=[QUEUE], concurrency=concurrency)
    running = asyncio.create_task(worker.run())
    await asyncio.sleep(1.5)
    feeder = None
    if enqueue_here:
        feeder = threading.Thread(target=_enqueue_thread, args=(driver, n, 0.2), daemon=True)
        feeder.start()
    else:
        ready()
    deadline = time.monotonic() + 60 + n * 0.2
    while (SEEN.count < n or await done_count(driver) < n) and time.monotonic() < deadline:
        if running.done():
            running.result()
        await asyncio.sleep(0.05)
    done = await done_count(driver)
    await worker.stop()
    await running
    await driver.close()
    _check(done == n, f"{done} probes done, expected {n}")
    return latency_figures(SEEN.latencies_ns) | {"concurrency": concurrency}


def latency_figures(latencies_ns: list[int]) -> dict[str, Any]:
    """Answer p50/p95/max in ms of ``latencies_ns``."""
    ms = [x / 1e6 for x in latencies_ns]
    return {
        "p50": percentile(ms, 50),
        "p95": percentile(ms, 95),
        "max": max(ms),
        "n": len(ms),
        "unit": "ms",
    }


def _enqueue_thread(driver: JobDriver, n: int, gap: float) -> None:
    asyncio.run(enqueue_probes(driver, n, gap))


async def enqueue_probes(driver: JobDriver, n: int, gap: float) -> None:
    """Enqueue ``n`` pickup probes ``gap`` seconds apart, each stamped just before the call."""
    nonce = uuid.uuid4().hex[:12]
    with use_driver(driver):
        for i in range(n):
            await pickup.enqueue(Probe(k=f"{nonce}-{i}", t=time.time_ns()))
            await asyncio.sleep(gap)


async def latency_enqueuer(url: str, n: int, gap_ms: int) -> dict[str, Any]:
    """The other process of the pickup figure: ``n`` probes ``gap_ms`` apart."""
    _quiet()
    driver = await open_ours(url)
    await enqueue_probes(driver, n, gap_ms / 1000)
    await driver.close()
    return {"value": n, "unit": "probes"}


async def rss(
    url: str, checkpoints: list[int], concurrency: int, fill_here: bool
) -> dict[str, Any]:
    """Drain ``max(checkpoints)`` no-op jobs; answer this worker's RSS at each checkpoint (KiB).

    The queue is filled before the worker starts (here for the memory driver, whose rows live in
    this process from the start; by another process otherwise), so what grows between
    checkpoints is what the worker keeps per job settled.
    """
    _quiet()
    driver = await open_ours(url)
    total = max(checkpoints)
    if fill_here:
        await fill(driver, "noop", total)
    start_rss = rss_kib()
    worker = Worker(driver, queues=[QUEUE], concurrency=concurrency)
    running = asyncio.create_task(worker.run())
    marks: dict[str, Any] = {}
    started = time.monotonic()
    for checkpoint in sorted(checkpoints):
        await _until(lambda c=checkpoint: SEEN.count >= c, worker, running, driver)
        marks[str(checkpoint)] = {
            "rss_kib": rss_kib(),
            "seconds": time.monotonic() - started,
        }
        # On stderr as it happens, so a run cut short still shows what it measured.
        print(f"rss checkpoint {checkpoint}: {marks[str(checkpoint)]}", file=sys.stderr, flush=True)
    while await done_count(driver) < total:  # noqa: ASYNC110 - the count lives in the backend
        await asyncio.sleep(0.1)
    await worker.stop()
    await running
    await driver.close()
    return {"start_rss_kib": start_rss, "checkpoints": marks, "unit": "KiB"}


STALL_S = 60.0
"""Seconds without a body starting (rows left to run) after which a run is declared stalled."""

_progress = {"count": -1, "since": 0.0}


async def _until(done: Any, worker: Worker, running: asyncio.Task[None], driver: JobDriver) -> None:
    while not done():  # bodies bump a counter in this process; polling it costs nothing
        if running.done():
            running.result()
            raise AssertionError("the worker returned before the rows were done")
        await _stalled(worker, driver, SEEN.count)
        await asyncio.sleep(0.05)


async def _stalled(worker: Worker, driver: JobDriver, count: int) -> None:
    """Raise with a diagnosis when no body started for :data:`STALL_S` seconds."""
    now = time.monotonic()
    if count != _progress["count"]:
        _progress["count"], _progress["since"] = count, now
        return
    if now - _progress["since"] < STALL_S:
        return
    stats = [s for s in await driver.stats() if s.queue == QUEUE]
    raise AssertionError(
        f"stalled: no body started for {STALL_S:.0f} s after {count} bodies; "
        f"worker {worker.stats()}; backend {stats}"
    )


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise AssertionError(message)
