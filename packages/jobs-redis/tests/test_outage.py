"""A Redis outage: refusal at once, and the same worker carrying on after it (C01, C12).

Every test here runs its own throwaway ``redis-server`` on a free port and SIGKILLs it; the shared
server at 6379 is never touched.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import redis
from pydantic import BaseModel

from conftest import Throwaway
from jobs_core import JobRegistry, JobState, Retry, Worker, job, use_driver
from jobs_core.errors import DriverRequestInvalidError, DriverUnavailableError
from jobs_core.types import ClaimRequest
from jobs_redis import RedisDriver, RedisWakeSource
from redis_helpers import claim, eventually, request


class Item(BaseModel):
    key: str
    hold_ms: int = 0


def counting_job(registry: JobRegistry, ran: list[str]) -> Any:
    @job(
        input=Item,
        idempotency_key=lambda i: i.key,
        tenant="none",
        name="outage.count",
        retry=Retry(attempts=5, delay="50ms", max_delay="200ms"),
        registry=registry,
    )
    async def count(item: Item, step: Any, ctx: Any) -> None:
        await asyncio.sleep(item.hold_ms / 1000)
        ran.append(item.key)

    return count


async def states(driver: RedisDriver, ids: list[Any]) -> list[JobState | None]:
    found = [await driver.operator.get(i) for i in ids]
    return [None if f is None else f.state for f in found]


async def test_enqueue_and_claim_refuse_at_once_while_the_server_is_down(
    throwaway: Throwaway, capsys: pytest.CaptureFixture[str]
) -> None:
    driver = await RedisDriver.connect(throwaway.url, prefix="outage")
    assert not (await driver.enqueue(request("before"))).deduped
    throwaway.stop()

    refused: list[float] = []
    for attempt in range(5):
        started = time.perf_counter()
        with pytest.raises(DriverUnavailableError) as caught:
            await driver.enqueue(request(f"down-{attempt}"))
        refused.append(time.perf_counter() - started)
        assert caught.value.code == "X_DRIVER_UNAVAILABLE"
    started = time.perf_counter()
    with pytest.raises(DriverUnavailableError):
        await claim(driver)
    claim_s = time.perf_counter() - started
    assert max(refused) < 1.0 and claim_s < 1.0
    with capsys.disabled():
        print(
            f"\nrefusal latency, server stopped: enqueue max {max(refused) * 1000:.1f} ms "
            f"(median {sorted(refused)[2] * 1000:.1f} ms over 5), claim {claim_s * 1000:.1f} ms"
        )

    # The same driver object works again once the server is back: no restart, no reconnect call.
    throwaway.start()
    again = await driver.enqueue(request("after"))
    assert not again.deduped
    [job] = await claim(driver)
    assert job.id == again.id  # a server without persistence lost the row from before
    await driver.close()


async def test_a_worker_starting_during_an_outage_starts_and_picks_up_later(
    throwaway: Throwaway,
) -> None:
    throwaway.stop()
    driver = RedisDriver(throwaway.url, prefix="late")
    registry = JobRegistry()
    ran: list[str] = []
    count = counting_job(registry, ran)
    worker = Worker(driver, registry=registry, poll_interval="20ms", idle_poll_max="200ms")
    started = time.perf_counter()
    running = asyncio.create_task(worker.run())
    await asyncio.sleep(0.3)
    assert not running.done()
    assert time.perf_counter() - started < 2.0
    assert not driver.wake.healthy
    throwaway.start()
    await eventually(lambda: _true(driver.wake.healthy), timeout=10)
    with use_driver(driver):
        await count.enqueue(Item(key="x"))
    await eventually(lambda: _true(ran == ["x"]), timeout=10)
    await worker.stop()
    await running
    await driver.close()


async def _true(value: bool) -> bool:
    return value


async def test_the_same_worker_claims_and_finishes_new_jobs_after_an_outage(
    throwaway: Throwaway, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="jobs.redis")
    driver = await RedisDriver.connect(throwaway.url, prefix="same")
    registry = JobRegistry()
    ran: list[str] = []
    count = counting_job(registry, ran)
    # A long idle poll: pickup after the outage must come from the re-established wake.
    worker = Worker(driver, registry=registry, poll_interval="100ms", idle_poll_max="30s")
    running = asyncio.create_task(worker.run())
    with use_driver(driver):
        await count.enqueue(Item(key="before"))
        await eventually(lambda: _true(ran == ["before"]), timeout=10)

        throwaway.stop()
        await eventually(lambda: _true(not driver.wake.healthy), timeout=15)
        with pytest.raises(DriverUnavailableError):
            await count.enqueue(Item(key="refused"))
        await asyncio.sleep(1.0)
        throwaway.start()
        await eventually(lambda: _true(driver.wake.healthy), timeout=10)
        # The worker's idle back-off has grown to seconds by now; the wake brings it at once.
        await asyncio.sleep(2.5)
        enqueued_at = time.perf_counter()
        results = [await count.enqueue(Item(key=f"after-{i}")) for i in range(10)]
        await eventually(lambda: _true(len(ran) == 11), timeout=10)
        pickup = time.perf_counter() - enqueued_at
    assert sorted(ran[1:]) == sorted(f"after-{i}" for i in range(10))
    assert await states(driver, [r.id for r in results]) == [JobState.DONE] * 10
    assert pickup < 2.0, f"pickup after the outage took {pickup:.2f} s: the wake did not come back"
    assert not running.done()
    events = [r.getMessage() for r in caplog.records]
    assert "jobs.wake.lost" in events and "jobs.wake.live" in events
    await worker.stop()
    await running
    await driver.close()


async def test_a_restart_with_aof_mid_run_loses_no_job(tmp_path: Path) -> None:
    """SIGKILL a server with ``appendonly yes``/``appendfsync always`` under a running worker."""
    server = Throwaway("--appendonly", "yes", "--appendfsync", "always", workdir=tmp_path)
    server.start()
    try:
        driver = await RedisDriver.connect(server.url, prefix="aof")
        registry = JobRegistry()
        ran: list[str] = []
        count = counting_job(registry, ran)
        worker = Worker(
            driver,
            registry=registry,
            concurrency=4,
            visibility_timeout="1s",
            poll_interval="20ms",
            idle_poll_max="200ms",
        )
        with use_driver(driver):
            results = await count.enqueue_many([Item(key=f"k{i}", hold_ms=20) for i in range(200)])
        running = asyncio.create_task(worker.run())
        await eventually(lambda: _true(len(ran) >= 40), timeout=20)
        server.stop()
        await asyncio.sleep(0.5)
        server.start()
        await eventually(lambda: _stats_done(driver, 200), timeout=60)
        await worker.stop()
        await running
        assert not running.exception()
        # Every job ran; one that ran twice was in flight when the server died (at least once).
        assert set(ran) == {f"k{i}" for i in range(200)}
        assert len(ran) - 200 <= 4 + 4  # at most the held rows plus the acks lost in flight
        assert await states(driver, [r.id for r in results]) == [JobState.DONE] * 200
        await driver.close()
    finally:
        if server.proc is not None:
            server.stop()


async def _stats_done(driver: RedisDriver, n: int) -> bool:
    try:
        stats = await driver.stats()
    except DriverUnavailableError:
        return False
    return sum(s.done for s in stats) >= n and all(s.ready + s.running == 0 for s in stats)


async def test_a_restart_without_persistence_mid_run_keeps_the_worker_alive(
    throwaway: Throwaway,
) -> None:
    """What a non-persistent server loses: every row; the worker survives and runs new work."""
    driver = await RedisDriver.connect(throwaway.url, prefix="volatile")
    registry = JobRegistry()
    ran: list[str] = []
    count = counting_job(registry, ran)
    worker = Worker(driver, registry=registry, poll_interval="20ms", idle_poll_max="200ms")
    running = asyncio.create_task(worker.run())
    with use_driver(driver):
        await count.enqueue_many([Item(key=f"slow{i}", hold_ms=300) for i in range(4)])
        await eventually(lambda: _true(worker.stats().in_flight > 0), timeout=10)
        throwaway.stop()
        throwaway.start()
        # The held rows are gone with the data: their acks find nothing and are fenced out.
        await eventually(lambda: _true(worker.stats().in_flight == 0), timeout=10)
        result = await count.enqueue(Item(key="new"))
        await eventually(lambda: _true("new" in ran), timeout=10)
    assert await states(driver, [result.id]) == [JobState.DONE]
    assert worker.stats().outcomes.get("lost", 0) + worker.stats().outcomes.get("crashed", 0) >= 1
    await worker.stop()
    await running
    await driver.close()


async def test_claim_request_is_refused_before_any_server_contact(throwaway: Throwaway) -> None:
    throwaway.stop()
    driver = RedisDriver(throwaway.url, prefix="x")
    with pytest.raises(DriverRequestInvalidError):
        await driver.claim(ClaimRequest([], 1, 1_000, "w"))
    await driver.close()


async def test_a_frozen_server_is_refused_after_the_command_timeout_and_the_wake_recovers(
    throwaway: Throwaway, caplog: pytest.LogCaptureFixture
) -> None:
    """SIGSTOP the server: sockets stay open and nothing answers (a half-open connection)."""
    caplog.set_level(logging.INFO, logger="jobs.redis")
    driver = await RedisDriver.connect(throwaway.url, prefix="frozen", command_timeout="500ms")
    wake = RedisWakeSource(driver._s, ping_s=0.3)
    heard: list[str] = []
    unsubscribe = await wake.subscribe(heard.append)
    assert wake.healthy
    assert throwaway.proc is not None
    throwaway.proc.send_signal(signal.SIGSTOP)
    try:
        started = time.perf_counter()
        with pytest.raises(DriverUnavailableError):
            await driver.enqueue(request("frozen"))
        assert time.perf_counter() - started < 1.5
        # No error reaches a silent subscription: only the unanswered PING shows it is dead.
        await eventually(lambda: _true(not wake.healthy), timeout=5)
    finally:
        throwaway.proc.send_signal(signal.SIGCONT)
    await eventually(lambda: _true(wake.healthy), timeout=10)
    heard.clear()
    await driver.enqueue(request("after"))
    await eventually(lambda: _true("default" in heard), timeout=5)
    events = [r.getMessage() for r in caplog.records]
    assert events.count("jobs.wake.lost") == 1 and "jobs.wake.live" in events
    await unsubscribe()
    await driver.close()


async def test_a_server_that_never_answers_bounds_every_call_and_the_wake(
    unused_tcp_port: int,
) -> None:
    """A listener that accepts and never replies: the handshake itself must be bounded too."""
    silent: list[asyncio.StreamWriter] = []

    async def accept(_reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        silent.append(writer)

    server = await asyncio.start_server(accept, "127.0.0.1", unused_tcp_port)
    driver = RedisDriver(
        f"redis://127.0.0.1:{unused_tcp_port}/0", prefix="silent", command_timeout="300ms"
    )
    try:
        for call in (driver.enqueue(request("k")), claim(driver), driver.operator.paused_queues()):
            started = time.perf_counter()
            with pytest.raises(DriverUnavailableError):
                await call
            assert time.perf_counter() - started < 1.5
        started = time.perf_counter()
        unsubscribe = await driver.wake.subscribe(print)
        assert time.perf_counter() - started < 1.5
        assert not driver.wake.healthy
        await unsubscribe()
    finally:
        await driver.close()
        for writer in silent:
            writer.close()
        server.close()
        await server.wait_closed()


async def test_a_command_is_sent_without_a_task_of_its_own(
    throwaway: Throwaway, monkeypatch: pytest.MonkeyPatch
) -> None:
    """redis-py's socket_timeout sends through asyncio.wait_for (a task and two loop passes on
    Python 3.11); the driver bounds the whole call with one asyncio.timeout instead."""
    import redis.asyncio.connection as redis_connection

    async def no_wait_for(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("a command went through asyncio.wait_for")

    driver = await RedisDriver.connect(throwaway.url, prefix="inline")
    monkeypatch.setattr(redis_connection.asyncio, "wait_for", no_wait_for)
    assert not (await driver.enqueue(request("k"))).deduped
    [job] = await claim(driver)
    monkeypatch.undo()
    await driver.close()
    assert job.idempotency_key == "k"


async def test_a_restart_leaves_no_stale_pooled_connection_in_the_way(
    throwaway: Throwaway, caplog: pytest.LogCaptureFixture, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 14 item 3: a command on a connection the restarted server closed is sent again."""
    caplog.set_level(logging.INFO, logger="jobs")
    driver = await RedisDriver.connect(throwaway.url, prefix="stale")
    registry = JobRegistry()
    ran: list[str] = []
    count = counting_job(registry, ran)
    worker = Worker(driver, registry=registry, concurrency=8, poll_interval="100ms")
    running = asyncio.create_task(worker.run())
    with use_driver(driver):
        # Several jobs at once, so the pool holds several connections when the server goes.
        await count.enqueue_many([Item(key=f"warm{i}", hold_ms=50) for i in range(16)])
        await eventually(lambda: _true(len(ran) == 16), timeout=10)
        throwaway.stop()
        throwaway.start()
        enqueued_at = time.perf_counter()
        result = await count.enqueue(Item(key="after"))

        async def finished() -> bool:
            return await states(driver, [result.id]) == [JobState.DONE]

        await eventually(finished, timeout=10)
        took = time.perf_counter() - enqueued_at
    with capsys.disabled():
        print(f"\njob enqueued after a restart: done in {took * 1000:.0f} ms")
    assert took < 2.0, f"the job enqueued after the restart took {took:.2f} s"
    events = [r.getMessage() for r in caplog.records]
    assert "jobs.attempt.crashed" not in events
    await worker.stop()
    await running
    await driver.close()


async def test_a_stale_connection_is_retried_once_and_a_down_server_still_refuses_at_once(
    throwaway: Throwaway, capsys: pytest.CaptureFixture[str]
) -> None:
    driver = await RedisDriver.connect(throwaway.url, prefix="stale1")
    await asyncio.gather(*(driver.enqueue(request(f"k{i}")) for i in range(4)))
    throwaway.stop()
    throwaway.start()
    # Every pooled connection is stale now: each call still lands, on a fresh connection.
    landed = await asyncio.gather(*(driver.enqueue(request(f"n{i}")) for i in range(4)))
    assert [r.deduped for r in landed] == [False] * 4
    assert len(await claim(driver, limit=10)) == 4
    throwaway.stop()
    started = time.perf_counter()
    with pytest.raises(DriverUnavailableError):
        await driver.enqueue(request("down"))
    refused = time.perf_counter() - started
    assert refused < 0.5, f"a down server was refused after {refused:.3f} s"
    with capsys.disabled():
        print(f"\nrefusal with a stale pool and the server down: {refused * 1000:.1f} ms")
    await driver.close()


async def test_a_refused_first_subscribe_is_logged_retried_and_the_worker_still_woken(
    throwaway: Throwaway, caplog: pytest.LogCaptureFixture
) -> None:
    """The server refuses SUBSCRIBE with an error reply (an ACL user without channel access),
    not an outage: the listener logs it, keeps retrying, and wakes the worker once allowed."""
    caplog.set_level(logging.INFO, logger="jobs.redis")
    admin = redis.Redis.from_url(throwaway.url)
    admin.execute_command("ACL", "SETUSER", "waker", "on", ">pw", "~*", "resetchannels", "+@all")
    driver = RedisDriver(
        f"redis://waker:pw@127.0.0.1:{throwaway.port}/0", prefix="acl", command_timeout="2s"
    )
    enqueuer = RedisDriver(throwaway.url, prefix="acl")
    registry = JobRegistry()
    ran: list[str] = []
    count = counting_job(registry, ran)
    # A long idle poll: a pickup within 2 s must come from the wake.
    worker = Worker(driver, registry=registry, poll_interval="100ms", idle_poll_max="30s")
    running = asyncio.create_task(worker.run())
    try:

        def refused() -> list[logging.LogRecord]:
            return [r for r in caplog.records if r.getMessage() == "jobs.wake.error"]

        await eventually(lambda: _true(bool(refused())), timeout=10)
        assert "NoPermissionError" in refused()[0].error  # type: ignore[attr-defined]
        assert not driver.wake.healthy
        with use_driver(enqueuer):
            await count.enqueue(Item(key="during"))
        await eventually(lambda: _true(ran == ["during"]), timeout=10)
        admin.execute_command("ACL", "SETUSER", "waker", "allchannels")
        await eventually(lambda: _true(driver.wake.healthy), timeout=10)
        # The worker's idle back-off has grown to seconds by now; the wake brings it at once.
        await asyncio.sleep(2.5)
        enqueued_at = time.perf_counter()
        with use_driver(enqueuer):
            await count.enqueue(Item(key="after"))
        await eventually(lambda: _true(ran == ["during", "after"]), timeout=10)
        pickup = time.perf_counter() - enqueued_at
        assert pickup < 2.0, f"pickup took {pickup:.2f} s: the wake never came back"
        assert not running.done()
        assert len(refused()) == 1, "one record per distinct error, not one per retry"
        assert refused()[0].levelno == logging.ERROR
        assert "jobs.wake.live" in [r.getMessage() for r in caplog.records]
    finally:
        await asyncio.wait_for(worker.stop(), 10)
        await asyncio.wait_for(running, 10)
        await driver.close()
        await enqueuer.close()
        admin.close()
