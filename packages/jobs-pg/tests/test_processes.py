"""What must hold with real worker processes, real kills and real network faults.

Workers are ``jobsctl worker`` subprocesses running :mod:`apps.pg_workload`; every execution is
recorded in a per-process log, and outcomes are read from the database, never from logs alone.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, suppress
from pathlib import Path
from typing import Any

import pg_workload  # the app module the worker subprocesses import too
import psycopg
import pytest

from jobs_core import Worker, use_driver
from jobs_core.outbox import Relay, use_outbox
from jobs_core.types import JobState
from jobs_pg import PostgresDriver, transaction
from pg_helpers import APPS, Fleet, info, until


@pytest.fixture
def fleet(url: str, migrated: str, tmp_path: Path) -> Iterator[Fleet]:
    workers = Fleet(url, tmp_path)
    yield workers
    workers.stop()


async def _done(driver: PostgresDriver, queue: str) -> int:
    for stats in await driver.stats():
        if stats.queue == queue:
            return stats.done
    return 0


async def test_four_processes_run_ten_thousand_jobs_exactly_once(
    driver: PostgresDriver, fleet: Fleet
) -> None:
    total = 10_000
    with use_driver(driver):
        enqueued = await pg_workload.count.enqueue_many(
            [pg_workload.Item(n=i) for i in range(total)]
        )
    assert len({r.id for r in enqueued}) == total
    started = time.monotonic()
    for _ in range(4):
        fleet.start("count", "--concurrency", "16")

    async def all_done() -> bool:
        return await _done(driver, "count") == total

    await until(all_done, timeout=240)
    elapsed = time.monotonic() - started
    runs = fleet.lines("run")
    per_job = Counter(fields[2] for fields in runs)
    assert len(per_job) == total
    assert set(per_job.values()) == {1}, "a job ran twice"
    assert {fields[3] for fields in runs} == {"1"}  # no attempt was ever retried or re-claimed
    assert len({fields[0] for fields in runs}) == 4  # every process took part
    [stats] = [s for s in await driver.stats() if s.queue == "count"]
    assert (stats.done, stats.ready, stats.running, stats.dead) == (total, 0, 0, 0)
    stamps = sorted(float(fields[4]) for fields in runs)
    print(
        f"\n4 processes x 16 slots: {total} jobs in {elapsed:.1f} s including start-up; "
        f"{total / (stamps[-1] - stamps[0]):.0f} jobs/s first-to-last body start"
    )


@pytest.mark.parametrize("signum", [signal.SIGKILL, signal.SIGTERM], ids=["kill", "term"])
async def test_a_worker_killed_mid_body_is_reclaimed_with_the_attempt_counted(
    driver: PostgresDriver, fleet: Fleet, signum: signal.Signals
) -> None:
    """FIELD-FAILURES C01/C02: SIGKILL, or SIGTERM with a drain shorter than the body."""
    with use_driver(driver):
        result = await pg_workload.sleepy.enqueue(pg_workload.Item(n=1))
    options = ("--visibility-timeout", "2s", "--drain-timeout", "500ms")
    first = fleet.start("sleepy", *options)
    await until(lambda: bool(fleet.lines("start")))
    first.send_signal(signum)
    await asyncio.to_thread(first.wait, 20)
    fleet.start("sleepy", *options)

    async def done() -> bool:
        return (await info(driver, result.id)).state is JobState.DONE

    await until(done, timeout=30)
    row = await info(driver, result.id)
    assert (row.attempt, row.claim, row.result) == (2, 2, 2)
    starts = sorted(fleet.lines("start"), key=lambda fields: fields[3])
    assert [fields[3] for fields in starts] == ["1", "2"]
    assert starts[0][0] == str(first.pid) != starts[1][0]
    assert [fields[3] for fields in fleet.lines("end")] == ["2"]


async def test_a_stalled_worker_whose_lease_lapsed_writes_nothing(
    driver: PostgresDriver, fleet: Fleet
) -> None:
    """A SIGSTOPped worker resumes after its row was re-claimed: its step write and settle are
    refused (the fence), and the row keeps the second worker's steps and result."""
    with use_driver(driver):
        result = await pg_workload.stall.enqueue(pg_workload.Item(n=1))
    stalled = fleet.start("stall", "--visibility-timeout", "1500ms")
    await until(lambda: bool(fleet.lines("paused")))
    stalled.send_signal(signal.SIGSTOP)
    try:
        await asyncio.sleep(2)  # the lease lapses while the process is stopped
        other = fleet.start("stall", "--visibility-timeout", "1500ms")

        async def done() -> bool:
            return (await info(driver, result.id)).state is JobState.DONE

        await until(done, timeout=30)
    finally:
        stalled.send_signal(signal.SIGCONT)
    await until(lambda: any(f[0] == str(stalled.pid) for f in fleet.lines("resumed")))
    await asyncio.sleep(1)  # let the stalled body try its write and its ack
    row = await info(driver, result.id)
    steps = {s.name: s.output for s in row.steps}
    assert (row.state, row.claim, row.result) == (JobState.DONE, 2, other.pid)
    assert steps == {"first": stalled.pid, "second": other.pid}


async def test_fleet_concurrency_holds_across_processes(
    driver: PostgresDriver, fleet: Fleet
) -> None:
    """FIELD-FAILURES C28: limit 1, four processes with two slots each: never two at once."""
    with use_driver(driver):
        await pg_workload.limited.enqueue_many(
            [pg_workload.Item(n=i, sleep_ms=300) for i in range(6)]
        )
    for _ in range(4):
        fleet.start("limited", "--concurrency", "2")

    async def all_done() -> bool:
        return await _done(driver, "limited") == 6

    await until(all_done, timeout=90)
    spans = sorted((float(f[3]), float(f[4])) for f in fleet.lines("span"))
    assert len(spans) == 6
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end, "two limited jobs overlapped"


async def test_outbox_rollback_commit_and_a_relay_killed_between_publish_and_mark(
    driver: PostgresDriver, pg_url: str, migrated: str
) -> None:
    committed: list[Any] = []
    async with await psycopg.AsyncConnection.connect(pg_url) as conn:
        with use_outbox(driver.outbox, driver, mode="required"), use_driver(driver):
            for i in range(120):
                async with transaction(conn):
                    assert driver.outbox.ambient() is conn
                    committed.append(await pg_workload.count.enqueue(pg_workload.Item(n=i)))
            for i in range(120, 150):
                with suppress(RuntimeError):
                    async with transaction(conn):
                        await pg_workload.count.enqueue(pg_workload.Item(n=i))
                        raise RuntimeError("the business transaction failed")
    assert driver.outbox.ambient() is None
    killed = await asyncio.create_subprocess_exec(
        sys.executable,
        str(APPS / "pg_relay.py"),
        pg_url,
        migrated,
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await killed.communicate()
    assert (killed.returncode, out) == (-signal.SIGKILL, b"published 50\n")
    relays = [Relay(driver.outbox, driver, batch=20, claim_lease="1s") for _ in range(2)]
    running = [asyncio.create_task(relay.run()) for relay in relays]

    async def published() -> bool:
        async with await psycopg.AsyncConnection.connect(pg_url) as conn:
            cur = await conn.execute(
                f'SELECT count(*) FROM "{migrated}".outbox WHERE published_at IS NULL'
            )
            row = await cur.fetchone()
            return row is not None and row[0] == 0

    try:
        await until(published, timeout=30)
    finally:
        for relay in relays:
            await relay.stop()
        await asyncio.gather(*running)
    [stats] = await driver.stats()
    assert stats.ready == 120  # one job per committed stage, none for a rolled-back one
    for result in committed:
        assert (await info(driver, result.id)).run_id == result.run_id


@asynccontextmanager
async def _worker(driver: PostgresDriver, queue: str) -> AsyncIterator[Worker]:
    worker = Worker(
        driver,
        queues=[queue],
        concurrency=4,
        poll_interval="250ms",
        idle_poll_max="1s",
        registry=pg_workload.count.registry,
    )
    task = asyncio.create_task(worker.run())
    try:
        yield worker
    finally:
        await worker.stop()
        await task


async def test_a_terminated_listen_connection_falls_back_to_the_poll_and_comes_back(
    driver: PostgresDriver, pg_url: str, tmp_path: Path, monkeypatch: Any, caplog: Any
) -> None:
    monkeypatch.setenv("PG_WORKLOAD_LOG", str(tmp_path))
    caplog.set_level(logging.INFO, logger="jobs.wake")
    async with _worker(driver, "count"):
        await until(lambda: driver.wake.live, timeout=10)
        before = driver.wake.backend_pid
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (before,))
        with use_driver(driver):
            await pg_workload.count.enqueue_many([pg_workload.Item(n=i) for i in range(20)])

        async def all_done() -> bool:
            return await _done(driver, "count") == 20

        await until(all_done, timeout=20)
        await until(lambda: driver.wake.live and driver.wake.backend_pid != before, timeout=20)
    events = [r.__dict__.get("event") for r in caplog.records]
    assert events.count("jobs.wake.live") >= 2
    assert "jobs.wake.lost" in events[events.index("jobs.wake.live") :]


class BlackHole:
    """A TCP proxy to the server that can cut its open connections without closing them: to
    the client each one looks open and silent (a half-open connection, FIELD-FAILURES C09).
    Connections made after a cut pass normally."""

    def __init__(self) -> None:
        self.server: asyncio.Server | None = None
        self._open: set[int] = set()
        self._cut: set[int] = set()
        self._ids = iter(range(1_000_000))

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    def cut(self) -> None:
        self._cut |= self._open

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        ident = next(self._ids)
        self._open.add(ident)
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", 5432)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            with suppress(Exception):
                while data := await src.read(65536):
                    if ident not in self._cut:
                        dst.write(data)
                        await dst.drain()

        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()


async def test_a_half_open_listen_connection_is_detected_and_redialled(
    pg_url: str, migrated: str, caplog: Any
) -> None:
    proxy = BlackHole()
    port = await proxy.start()
    driver = await PostgresDriver.connect(
        pg_url, schema=migrated, listen_url=f"postgresql://postgres@127.0.0.1:{port}/test"
    )
    driver.wake.probe_interval, driver.wake.probe_timeout = 1.0, 0.5
    caplog.set_level(logging.INFO, logger="jobs.wake")
    heard: list[str] = []
    unsubscribe = await driver.wake.subscribe(heard.append)
    try:
        await until(lambda: driver.wake.live, timeout=10)
        proxy.cut()  # the LISTEN socket stays open, and nothing passes any more
        await until(lambda: not driver.wake.live, timeout=10)
        await until(lambda: driver.wake.live, timeout=10)
        await asyncio.sleep(0.3)  # a new 250 ms wake slot
        await driver.enqueue(pg_workload_request())
        await until(lambda: heard == ["count"], timeout=5)
    finally:
        await unsubscribe()
        await driver.close()
        await proxy.close()
    events = [r.__dict__.get("event") for r in caplog.records]
    assert events == ["jobs.wake.live", "jobs.wake.lost", "jobs.wake.live"]


def pg_workload_request() -> Any:
    return pg_workload.count.build_request(pg_workload.Item(n=1))


async def test_a_killed_holder_of_the_only_slot_does_not_block_the_key(
    driver: PostgresDriver, fleet: Fleet
) -> None:
    """FIELD-FAILURES C02 (#475 variant): limit 1, the holder is SIGKILLed mid-body. Its row and
    its slot both lapse; the killed row is re-claimed and the waiting rows run."""
    with use_driver(driver):
        await pg_workload.gate.enqueue_many([pg_workload.Item(n=i) for i in range(3)])
    options = ("--visibility-timeout", "2s", "--concurrency", "2")
    holder = fleet.start("gate", *options)
    await until(lambda: any(f[3] == "0" for f in fleet.lines("gate")), timeout=60)
    holder.send_signal(signal.SIGKILL)
    await asyncio.to_thread(holder.wait, 20)
    fleet.start("gate", *options)

    async def all_done() -> bool:
        return await _done(driver, "gate") == 3

    await until(all_done, timeout=120)
    runs = [(f[3], f[4]) for f in fleet.lines("gate")]
    assert {("0", "1"), ("0", "2")} <= set(runs)
    # The others each ran once; a row the killed worker had claimed (waiting for the slot) had
    # its lapsed attempt counted, so it may run on attempt 2.
    for item in ("1", "2"):
        ran = [attempt for n, attempt in runs if n == item]
        assert len(ran) == 1 and ran[0] in ("1", "2"), (item, ran)


class NoNotifications:
    """A TCP proxy to the server that drops every NotificationResponse ('A') message, as a
    transaction-pooling proxy does to LISTEN: the session works, the notifications never come."""

    def __init__(self) -> None:
        self.server: asyncio.Server | None = None
        self.accepted = 0

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", 5432)

        async def upstream() -> None:
            with suppress(Exception):
                while data := await reader.read(65536):
                    up_writer.write(data)
                    await up_writer.drain()

        async def downstream() -> None:
            # Every server message is a type byte and a 4-byte length (sslmode=disable: no
            # one-byte SSL answer comes first).
            with suppress(Exception):
                while header := await up_reader.readexactly(5):
                    body = await up_reader.readexactly(int.from_bytes(header[1:], "big") - 4)
                    if header[:1] != b"A":
                        writer.write(header + body)
                        await writer.drain()

        await asyncio.gather(upstream(), downstream())

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()


async def test_a_listen_path_that_never_delivers_is_reported_unverified_once(
    pg_url: str, migrated: str, caplog: Any
) -> None:
    proxy = NoNotifications()
    port = await proxy.start()
    listen_url = f"postgresql://postgres@127.0.0.1:{port}/test?sslmode=disable"
    driver = await PostgresDriver.connect(pg_url, schema=migrated, listen_url=listen_url)
    driver.wake.probe_timeout = 0.3
    caplog.set_level(logging.INFO, logger="jobs.wake")
    unsubscribe = await driver.wake.subscribe(lambda queue: None)
    try:
        # Dial, probe, give up, back off 0.5 s, dial again, ... several times over.
        await asyncio.sleep(3)
        assert not driver.wake.live
    finally:
        await unsubscribe()
        await driver.close()
        await proxy.close()
    events = [r.__dict__.get("event") for r in caplog.records]
    assert events == ["jobs.wake.unverified"]
    assert proxy.accepted >= 3  # it kept re-dialling, and said so once
