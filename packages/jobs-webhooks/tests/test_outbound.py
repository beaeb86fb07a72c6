"""Outbound webhook(): real HTTP to uvicorn endpoints on 127.0.0.1, a real worker (run_jobs)."""

from __future__ import annotations

import asyncio
import email.utils
import json
import time
from typing import Any

import pytest
from standardwebhooks import Webhook

from conftest import new_secret
from jobs_core import JobRegistry, JobState, Retry, Worker
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.errors import JobDuplicateError
from jobs_core.introspect import cancel
from jobs_core.testing import ManualClock, run_jobs, use_driver
from jobs_webhooks import Endpoint, WebhookEvent, webhook
from webhook_servers import Reply, Scripted, Served
from webhook_world import Delivery, World, deliver, ran_out


async def test_a_delivery_is_signed_per_secret_and_our_headers_win(
    world: World, driver: MemoryDriver, registry: JobRegistry, name: str
) -> None:
    app = Scripted(Reply(204, body=b""))
    old, new = new_secret(), new_secret()
    async with Served(app) as server:
        ep = world.add(
            server.url + "/hooks?token=t0p",
            secrets=[old, new],
            headers={"webhook-signature": "v1,forged", "X-Tenant": "acme", "Host": "evil"},
        )
        hook = world.declare(name, registry)
        row = await deliver(hook, driver, registry, ep)
    assert row.state == JobState.DONE
    (seen,) = app.seen
    assert seen.method == "POST" and seen.path == "/hooks"
    assert seen.headers["webhook-id"] == "evt_1"
    assert seen.headers["webhook-topic"] == "orders.paid"
    assert seen.headers["x-tenant"] == "acme"
    assert seen.headers["host"] == f"127.0.0.1:{server.port}"
    assert seen.headers["content-type"] == "application/json"
    assert json.loads(seen.body) == {"type": "orders.paid", "data": {"order": 42, "total": "9.90"}}
    signatures = seen.headers["webhook-signature"].split(" ")
    assert len(signatures) == 2 and all(s.startswith("v1,") for s in signatures)
    # Each secret alone verifies it with the standardwebhooks package (rotation).
    for secret in (old, new):
        assert Webhook(secret).verify(seen.body, seen.headers) == json.loads(seen.body)
    (attempt,) = await world.ledger.attempts(endpoint_id=ep.id)
    assert attempt.outcome == "delivered" and attempt.status == 204 and attempt.attempt == 1
    assert attempt.url == f"http://127.0.0.1:{server.port}/hooks"  # the query is not kept
    assert attempt.job_id == row.id and attempt.event_id == "evt_1"


async def test_each_attempt_reads_the_endpoint_and_signs_at_its_own_send_time(
    world: World, registry: JobRegistry, name: str
) -> None:
    clock = ManualClock()
    driver = MemoryDriver(clock=clock)
    app = Scripted(Reply(500, body=b"down"), Reply(200))
    async with Served(app) as server:
        ep = world.add(server.url)
        hook = world.declare(
            name, registry, clock=clock, retry=Retry(attempts=2, delay="2m", jitter=False)
        )
        with use_driver(driver):
            row = await deliver(hook, driver, registry, ep, clock=clock)
    assert row.state == JobState.DONE
    first, second = app.seen
    assert first.headers["webhook-id"] == second.headers["webhook-id"] == "evt_1"
    sent = [int(s.headers["webhook-timestamp"]) for s in (first, second)]
    assert sent[1] - sent[0] == 120
    assert world.lookups == 2  # read per attempt, never from a step
    assert not await driver.steps.load(row.run_id)  # no step holds the endpoint
    failed, delivered = sorted(await world.ledger.attempts(), key=lambda a: a.attempt)
    assert (failed.outcome, failed.status, failed.excerpt) == ("failed", 500, "down")
    assert failed.code == "X_WEBHOOK_DELIVERY_FAILED" and failed.retry_after_ms == 120_000
    assert (delivered.outcome, delivered.attempt) == ("delivered", 2)


async def _throttled_gap(
    world: World, driver: MemoryDriver, registry: JobRegistry, name: str, first: Reply, **kw: Any
) -> float:
    app = Scripted(first, Reply(200))
    async with Served(app) as server:
        ep = world.add(server.url)
        hook = world.declare(name, registry, **kw)
        row = await deliver(hook, driver, registry, ep)
    assert row.state == JobState.DONE
    throttled, delivered = sorted(await world.ledger.attempts(), key=lambda a: a.attempt)
    assert throttled.outcome == "throttled" and throttled.code == "X_WEBHOOK_DELIVERY_THROTTLED"
    assert delivered.outcome == "delivered"
    return (delivered.started_at - throttled.started_at).total_seconds()


async def test_retry_after_seconds_is_honoured_never_sooner(
    world: World, driver: MemoryDriver, registry: JobRegistry, name: str
) -> None:
    gap = await _throttled_gap(
        world,
        driver,
        registry,
        name,
        Reply(429, {"retry-after": "2"}),
        retry=Retry(attempts=3, delay="50ms"),
    )
    assert 2.0 <= gap <= 3.0, gap


async def test_a_retry_after_date_is_read_against_the_responses_own_date(
    world: World, driver: MemoryDriver, registry: JobRegistry, name: str
) -> None:
    # The endpoint's clock is an hour behind ours: against our clock the date is long past.
    theirs = time.time() - 3600
    reply = Reply(
        503,
        {
            "date": email.utils.formatdate(theirs, usegmt=True),
            "retry-after": email.utils.formatdate(theirs + 2, usegmt=True),
        },
    )
    gap = await _throttled_gap(
        world, driver, registry, name, reply, retry=Retry(attempts=3, delay="50ms")
    )
    assert 1.9 <= gap <= 3.2, gap


async def test_a_long_retry_after_is_clamped_to_max_delay(
    world: World, driver: MemoryDriver, registry: JobRegistry, name: str
) -> None:
    gap = await _throttled_gap(
        world,
        driver,
        registry,
        name,
        Reply(429, {"retry-after": "86400"}),
        retry=Retry(attempts=3, delay="50ms", max_delay="2s"),
    )
    assert 1.5 <= gap <= 3.0, gap
    (throttled,) = [a for a in await world.ledger.attempts() if a.outcome == "throttled"]
    assert throttled.retry_after_ms is not None and 1500 <= throttled.retry_after_ms <= 2000


async def test_a_429_without_retry_after_follows_the_backoff(
    world: World, driver: MemoryDriver, registry: JobRegistry, name: str
) -> None:
    app = Scripted(Reply(429), Reply(200))
    async with Served(app) as server:
        ep = world.add(server.url)
        hook = world.declare(name, registry, retry=Retry(attempts=2, delay="100ms"))
        row = await deliver(hook, driver, registry, ep)
    assert row.state == JobState.DONE
    first = min(await world.ledger.attempts(), key=lambda a: a.attempt)
    assert first.outcome == "failed" and first.retry_after_ms is not None
    assert 50 <= first.retry_after_ms <= 100


async def test_a_redirect_is_a_failure_and_its_target_receives_nothing(
    world: World, driver: MemoryDriver, registry: JobRegistry, name: str
) -> None:
    elsewhere = Scripted(Reply(200))
    async with Served(elsewhere) as other:
        app = Scripted(Reply(302, {"location": other.url + "/steal"}))
        async with Served(app) as server:
            ep = world.add(server.url)
            hook = world.declare(name, registry)
            row = await deliver(hook, driver, registry, ep)
    assert row.state == JobState.DEAD and ran_out(row, "X_WEBHOOK_DELIVERY_FAILED")
    assert "redirect" in (row.last_error or "")
    assert other.connections == 0 and elsewhere.seen == []
    (attempt,) = await world.ledger.attempts()
    assert (attempt.outcome, attempt.status) == ("failed", 302)


async def test_410_gone_is_terminal_whatever_the_attempts_left(
    world: World, driver: MemoryDriver, registry: JobRegistry, name: str
) -> None:
    app = Scripted(Reply(410, body=b"subscription deleted"))
    async with Served(app) as server:
        ep = world.add(server.url)
        hook = world.declare(name, registry, retry=Retry(attempts=5, delay="50ms"))
        row = await deliver(hook, driver, registry, ep)
    assert row.state == JobState.DEAD and row.last_error_code == "X_WEBHOOK_DELIVERY_REJECTED"
    assert row.attempt == 1 and len(app.seen) == 1
    (attempt,) = await world.ledger.attempts()
    assert (attempt.outcome, attempt.excerpt) == ("rejected", "subscription deleted")


async def test_disable_after_3_the_4th_delivery_opens_no_socket(
    world: World, driver: MemoryDriver, registry: JobRegistry, name: str
) -> None:
    # The endpoint closes every connection, so each attempt must dial anew: connections count
    # attempts that reached the socket.
    app = Scripted(Reply(500, close=True))
    for n in range(2, 6):
        world.events[f"evt_{n}"] = WebhookEvent(f"evt_{n}", "orders.paid", {"n": n})
    async with Served(app) as server:
        ep = world.add(server.url)
        hook = world.declare(name, registry, disable_after=3)
        rows = [await deliver(hook, driver, registry, ep, f"evt_{n}") for n in (1, 2, 3, 4)]
        assert server.connections == 3 and len(app.seen) == 3
        assert all(ran_out(r, "X_WEBHOOK_DELIVERY_FAILED") for r in rows[:3])
        assert rows[3].last_error_code == "X_WEBHOOK_ENDPOINT_DISABLED"
        health = await world.ledger.health(ep.id)
        assert health.disabled and health.consecutive_failures == 3
        assert len(await world.ledger.attempts(endpoint_id=ep.id)) == 3  # none for the 4th
        # Re-enabling is the app's: then the next delivery dials again.
        await world.ledger.enable(ep.id)
        await deliver(hook, driver, registry, ep, "evt_5")
        assert server.connections == 4


async def test_a_slow_endpoint_times_out_as_a_failed_attempt(
    world: World, driver: MemoryDriver, registry: JobRegistry, name: str
) -> None:
    never = asyncio.Event()
    app = Scripted(Reply(200, hold=never))
    async with Served(app) as server:
        ep = world.add(server.url)
        hook = world.declare(name, registry, timeout="300ms")
        started = time.monotonic()
        row = await deliver(hook, driver, registry, ep)
        elapsed = time.monotonic() - started
        never.set()
    assert row.state == JobState.DEAD and ran_out(row, "X_WEBHOOK_DELIVERY_FAILED")
    assert elapsed < 5
    (attempt,) = await world.ledger.attempts()
    assert attempt.outcome == "failed" and attempt.status is None
    assert attempt.excerpt.startswith("TimeoutError")


async def test_a_refused_connection_is_a_failed_attempt(
    world: World, driver: MemoryDriver, registry: JobRegistry, name: str
) -> None:
    from webhook_servers import free_port

    ep = world.add(f"http://127.0.0.1:{free_port()}/")
    hook = world.declare(name, registry)
    row = await deliver(hook, driver, registry, ep)
    assert ran_out(row, "X_WEBHOOK_DELIVERY_FAILED")
    (attempt,) = await world.ledger.attempts()
    assert attempt.outcome == "failed" and attempt.excerpt.startswith("ConnectError")


async def test_the_response_is_read_up_to_the_cap_and_only_an_escaped_excerpt_is_kept(
    world: World, driver: MemoryDriver, registry: JobRegistry, name: str
) -> None:
    async def endless(scope: dict[str, Any], receive: Any, send: Any) -> None:
        while (await receive()).get("more_body") is not False:
            pass
        await send({"type": "http.response.start", "status": 500, "headers": []})
        chunk = b"\x1b[2J<script>\xff" + b"x" * 16_384
        # Far more than the cap, and never finished: only the cap bounds the read.
        for _ in range(10_000):
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b""})

    async with Served(endless) as server:
        ep = world.add(server.url)
        hook = world.declare(name, registry, timeout="5s", max_response_bytes=4096)
        started = time.monotonic()
        await deliver(hook, driver, registry, ep)
        elapsed = time.monotonic() - started
    (attempt,) = await world.ledger.attempts()
    assert attempt.outcome == "failed" and attempt.status == 500
    assert attempt.excerpt.startswith("\\u001b[2J<script>\\ufffd")
    assert (
        len(attempt.excerpt) <= 512 and attempt.excerpt.isascii() and attempt.excerpt.isprintable()
    )
    assert elapsed < 4  # not the 5 s timeout: the read stopped at the cap


async def test_an_operator_cancel_aborts_the_post_and_writes_no_row(
    world: World, driver: MemoryDriver, registry: JobRegistry, name: str
) -> None:
    never = asyncio.Event()
    app = Scripted(Reply(200, hold=never))
    async with Served(app) as server:
        ep = world.add(server.url)
        hook = world.declare(name, registry, timeout="20s")
        result = await hook.enqueue(Delivery(endpoint_id=ep.id, event_id="evt_1"))
        worker = Worker(driver, registry=registry, visibility_timeout="3s", poll_interval="10ms")
        running = asyncio.create_task(worker.run())
        await asyncio.wait_for(app.arrived.wait(), 10)
        await cancel(driver, result.id)
        deadline = time.monotonic() + 10
        while worker.stats().in_flight:
            assert time.monotonic() < deadline, "the body did not stop"
            await asyncio.sleep(0.02)
        await worker.stop()
        await running
        never.set()
        await hook.aclose()
    assert (await driver.introspect.get(result.id)).state == JobState.CANCELLED
    assert await world.ledger.attempts() == []


async def test_the_drain_lets_a_post_on_the_wire_finish(
    world: World, driver: MemoryDriver, registry: JobRegistry, name: str
) -> None:
    release = asyncio.Event()
    app = Scripted(Reply(200, hold=release))
    async with Served(app) as server:
        ep = world.add(server.url)
        hook = world.declare(name, registry)
        result = await hook.enqueue(Delivery(endpoint_id=ep.id, event_id="evt_1"))
        worker = Worker(driver, registry=registry, poll_interval="10ms", drain_timeout="10s")
        running = asyncio.create_task(worker.run())
        await asyncio.wait_for(app.arrived.wait(), 10)
        draining = asyncio.create_task(worker.drain(close_driver=False))
        await asyncio.sleep(0.2)
        release.set()
        await draining
        await running
        await hook.aclose()
    assert (await driver.introspect.get(result.id)).state == JobState.DONE
    (attempt,) = await world.ledger.attempts()
    assert attempt.outcome == "delivered"


async def test_the_drain_stops_a_post_not_yet_sent(
    world: World, driver: MemoryDriver, registry: JobRegistry, name: str
) -> None:
    looking = asyncio.Event()
    answer = asyncio.Event()
    app = Scripted(Reply(200))
    async with Served(app) as server:
        ep = world.add(server.url)

        async def slow_lookup(i: Delivery) -> Endpoint:
            looking.set()
            await answer.wait()
            return ep

        hook = webhook(
            name=name,
            input=Delivery,
            endpoint=slow_lookup,
            event=lambda i: world.events[i.event_id],
            ledger=world.ledger,
            tenant="none",
            retry=Retry(attempts=1),
            registry=registry,
        )
        result = await hook.enqueue(Delivery(endpoint_id=ep.id, event_id="evt_1"))
        worker = Worker(driver, registry=registry, poll_interval="10ms", drain_timeout="10s")
        running = asyncio.create_task(worker.run())
        await asyncio.wait_for(looking.wait(), 10)
        draining = asyncio.create_task(worker.drain(close_driver=False))
        await asyncio.sleep(0.05)
        answer.set()
        await draining
        await running
        await hook.aclose()
    row = await driver.introspect.get(result.id)
    # Interrupted: handed back ready with its one attempt not spent, nothing sent, no row.
    assert row.state == JobState.READY and row.attempt == 0
    assert app.seen == [] and server.connections == 0
    assert await world.ledger.attempts() == []


async def test_a_missing_endpoint_or_event_is_terminal_and_sends_nothing(
    world: World, driver: MemoryDriver, registry: JobRegistry, name: str
) -> None:
    app = Scripted(Reply(200))
    async with Served(app) as server:
        ep = world.add(server.url)
        hook = world.declare(name, registry, retry=Retry(attempts=3))
        gone_event = await deliver(hook, driver, registry, ep, "evt_deleted")
        world.endpoints.clear()
        gone_endpoint = await deliver(hook, driver, registry, ep)
    assert gone_event.state == JobState.DEAD and gone_event.attempt == 1
    assert gone_event.last_error_code == "X_WEBHOOK_EVENT_MISSING"
    assert gone_endpoint.last_error_code == "X_WEBHOOK_ENDPOINT_INVALID"
    assert server.connections == 0


async def test_a_failing_lookup_is_retried_on_the_jittered_backoff(
    world: World, driver: MemoryDriver, registry: JobRegistry, name: str
) -> None:
    calls = []

    def flaky(i: Delivery) -> Endpoint:
        calls.append(time.monotonic())
        raise ConnectionError("the endpoints table is unreachable")

    hook = webhook(
        name=name,
        input=Delivery,
        endpoint=flaky,
        event=lambda i: world.events[i.event_id],
        ledger=world.ledger,
        tenant="none",
        retry=Retry(attempts=2, delay="400ms"),
        registry=registry,
    )
    result = await hook.enqueue(Delivery(endpoint_id="ep", event_id="evt_1"))
    await run_jobs(driver, registry=registry, timeout="20s")
    row = await driver.introspect.get(result.id)
    assert row.state == JobState.DEAD and ran_out(row, "X_WEBHOOK_DELIVERY_FAILED")
    assert "ConnectionError" in (row.last_error or "")
    assert 0.18 <= calls[1] - calls[0] <= 1.5  # equal jitter of 400 ms: 200-400 ms, plus polls


def test_two_webhooks_of_one_name_are_a_duplicate(
    world: World, registry: JobRegistry, name: str
) -> None:
    """The core tells the two declarations apart by the factory's call site (job(declared_at=)):
    one body serves every webhook, so the body's location alone would let the second replace
    the first silently."""
    options: dict[str, Any] = {
        "name": name,
        "input": Delivery,
        "endpoint": world.endpoint,
        "event": lambda i: world.events.get(i.event_id),
        "ledger": world.ledger,
        "tenant": "none",
        "registry": registry,
    }
    first = webhook(**options)
    with pytest.raises(JobDuplicateError) as caught:
        webhook(**options)
    assert caught.value.code == "X_JOB_DUPLICATE"
    assert "test_outbound.py" in str(caught.value)
    assert registry.get(name) is first.job
