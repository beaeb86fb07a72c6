"""Regressions from an adversarial pass over the runtime: each test failed before its fix."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from jobs_core import JobRegistry, JobState, Retry, Settled, Worker, job, use_driver
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.errors import JobNotRequeueableError, JobOptionsInvalidError
from jobs_core.steps import StepSuspended
from jobs_core.testing import ManualClock, run_jobs


class Item(BaseModel):
    key: str


def item_job(registry: JobRegistry, name: str, **options: Any) -> Any:
    return job(
        input=Item,
        idempotency_key=lambda i: f"{name}:{i.key}",
        tenant="none",
        name=name,
        registry=registry,
        **options,
    )


async def until(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.005)


async def test_one_lapse_costs_one_attempt_even_when_the_same_worker_reclaims(
    clock: ManualClock, registry: JobRegistry
) -> None:
    driver = MemoryDriver(clock=clock)
    runs: list[int] = []
    release = asyncio.Event()

    @item_job(registry, "lapse-once", retry=Retry(attempts=3))
    async def body(input: Item, step: Any, ctx: Any) -> str:
        runs.append(ctx.attempt)
        if ctx.attempt == 1:
            await release.wait()
        return "ok"

    with use_driver(driver):
        result = await body.enqueue(Item(key="a"))
    worker = Worker(
        driver, registry=registry, poll_interval="2ms", idle_poll_max="5ms", clock=clock
    )
    running = asyncio.create_task(worker.run())
    await until(lambda: runs == [1])
    clock.advance("31s")  # a pause longer than the lease: the same worker re-claims its own row
    await until(lambda: runs == [1, 2])
    release.set()
    await until(lambda: worker.stats().in_flight == 0)
    await worker.stop()
    await running
    row = await driver.introspect.get(result.id)
    assert row is not None and row.state == JobState.DONE
    assert runs == [1, 2]


async def test_a_failing_slot_renewal_does_not_stop_the_heartbeats(registry: JobRegistry) -> None:
    driver = MemoryDriver()
    runs: list[int] = []
    renewals = {"n": 0}
    original = driver.leases.renew

    async def flaky_renew(req: Any) -> bool:
        renewals["n"] += 1
        if renewals["n"] == 1:
            raise ConnectionError("blip")
        return await original(req)

    driver.leases.renew = flaky_renew  # type: ignore[method-assign]

    @item_job(registry, "renew-blip", concurrency=1, retry=Retry(attempts=3))
    async def body(input: Item, step: Any, ctx: Any) -> None:
        runs.append(ctx.attempt)
        await asyncio.sleep(1.2)

    with use_driver(driver):
        result = await body.enqueue(Item(key="a"))
    stats = await run_jobs(driver, registry=registry, visibility_timeout="300ms", timeout="10s")
    row = await driver.introspect.get(result.id)
    assert row is not None and row.state == JobState.DONE
    assert runs == [1]
    assert renewals["n"] >= 3
    assert stats.leases_lost == {}


async def test_abandoned_sync_steps_do_not_starve_other_jobs(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    stop = threading.Event()

    def hang() -> None:
        stop.wait(10)

    @item_job(registry, "hung-step", step_timeout="30ms", retry=Retry(attempts=1))
    def hung(input: Item, step: Any, ctx: Any) -> None:
        step.run("hang", hang)

    @item_job(registry, "innocent", retry=Retry(attempts=1))
    def innocent(input: Item, step: Any, ctx: Any) -> str:
        return str(step.run("work", lambda: "done"))

    try:
        await hung.enqueue_many([Item(key=str(n)) for n in range(12)])
        result = await innocent.enqueue(Item(key="x"))
        await run_jobs(driver, clock=clock, registry=registry, concurrency=2, timeout="10s")
        row = await driver.introspect.get(result.id)
        assert row is not None and row.state == JobState.DONE and row.result == "done"
    finally:
        stop.set()


async def test_a_slow_on_settled_hook_is_not_a_lost_lease(
    registry: JobRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    driver = MemoryDriver()

    async def slow(settled: Settled) -> None:
        await asyncio.sleep(0.8)

    @item_job(registry, "slow-hook-lease", on_settled=slow)
    async def body(input: Item, step: Any, ctx: Any) -> str:
        return "ok"

    with use_driver(driver):
        await body.enqueue(Item(key="a"))
    with caplog.at_level(logging.INFO):
        stats = await run_jobs(driver, registry=registry, visibility_timeout="300ms")
    assert stats.leases_lost == {}
    assert not [r for r in caplog.records if r.message == "jobs.lease.lost"]


async def test_system_exit_in_a_body_fails_the_attempt_not_the_worker(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    @item_job(registry, "exits", retry=Retry(attempts=1))
    async def exits(input: Item, step: Any, ctx: Any) -> None:
        raise SystemExit(3)

    @item_job(registry, "exits-sync", retry=Retry(attempts=1))
    def exits_sync(input: Item, step: Any, ctx: Any) -> None:
        raise KeyboardInterrupt

    @item_job(registry, "bystander")
    async def bystander(input: Item, step: Any, ctx: Any) -> str:
        return "fine"

    first = await exits.enqueue(Item(key="a"))
    second = await exits_sync.enqueue(Item(key="a"))
    third = await bystander.enqueue(Item(key="a"))
    await run_jobs(driver, clock=clock, registry=registry)
    states = [(await driver.introspect.get(r.id)) for r in (first, second, third)]
    assert [s.state for s in states if s] == [JobState.DEAD, JobState.DEAD, JobState.DONE]
    assert states[0] is not None and "SystemExit" in (states[0].last_error or "")


async def test_run_jobs_gives_up_on_a_body_that_never_ends(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    @item_job(registry, "forever")
    async def forever(input: Item, step: Any, ctx: Any) -> None:
        await asyncio.Event().wait()

    await forever.enqueue(Item(key="a"))
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        await run_jobs(driver, clock=clock, registry=registry, timeout="300ms")
    assert time.monotonic() - started < 5
    assert await driver.stats()  # the driver is still open for the test's checks


async def test_steps_after_a_swallowed_suspension_do_not_run(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    effects: list[str] = []

    @item_job(registry, "swallower", retry=Retry(attempts=1))
    async def body(input: Item, step: Any, ctx: Any) -> None:
        with contextlib.suppress(BaseException):  # the very mistake under test
            await step.sleep("1h")
        await step.run("after", lambda: effects.append(str(clock.now())))

    result = await body.enqueue(Item(key="a"))
    start = clock.now()
    await run_jobs(driver, clock=clock, registry=registry)
    row = await driver.introspect.get(result.id)
    assert row is not None and row.state == JobState.DONE
    assert len(effects) == 1
    assert clock.now() - start >= timedelta(hours=1)
    assert StepSuspended.__mro__[1] is BaseException


async def test_a_required_wait_that_timed_out_is_not_retried(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    class Answer(BaseModel):
        ok: bool

    @item_job(registry, "required-wait", retry=Retry(attempts=3))
    async def body(input: Item, step: Any, ctx: Any) -> None:
        await step.wait_for_event("w", "never", schema=Answer, timeout="1m", required=True)

    result = await body.enqueue(Item(key="a"))
    await run_jobs(driver, clock=clock, registry=registry)
    row = await driver.introspect.get(result.id)
    assert row is not None and row.state == JobState.DEAD
    assert row.last_error_code == "X_JOB_TIMEOUT"
    assert row.attempt == 1


@pytest.mark.parametrize(
    ("event", "correlation_key"), [("", None), ("ev\x00t", None), ("event", "k\x00")]
)
async def test_event_names_are_checked_like_every_other_name(
    driver: MemoryDriver,
    clock: ManualClock,
    registry: JobRegistry,
    event: str,
    correlation_key: str | None,
) -> None:
    from jobs_core import publish_event

    class Answer(BaseModel):
        ok: bool

    @item_job(registry, f"bad-wait-{len(event)}-{correlation_key is None}")
    async def body(input: Item, step: Any, ctx: Any) -> None:
        await step.wait_for_event("w", event, schema=Answer, correlation_key=correlation_key)

    result = await body.enqueue(Item(key="a"))
    await run_jobs(driver, clock=clock, registry=registry)
    row = await driver.introspect.get(result.id)
    assert row is not None and row.last_error_code == "X_JOB_OPTIONS_INVALID"
    with pytest.raises(JobOptionsInvalidError):
        await publish_event(event or "\x00", {"ok": True}, correlation_key=correlation_key)


async def test_a_nul_in_a_step_name_is_refused(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    @item_job(registry, "nul-step", retry=Retry(attempts=1))
    async def body(input: Item, step: Any, ctx: Any) -> None:
        await step.run("a\x00b", lambda: 1)

    result = await body.enqueue(Item(key="a"))
    await run_jobs(driver, clock=clock, registry=registry)
    row = await driver.introspect.get(result.id)
    assert row is not None and row.last_error_code == "X_STEP_NAME_INVALID"


async def test_inputs_pydantic_would_mangle_are_refused_by_name(
    driver: MemoryDriver, registry: JobRegistry
) -> None:
    from datetime import datetime, timezone

    from jobs_core.errors import JobInputInvalidError

    class Reading(BaseModel):
        key: str
        value: float
        raw: bytes = b""

    @job(
        input=Reading,
        idempotency_key=lambda i: i.key,
        tenant="none",
        name="mangle",
        registry=registry,
    )
    async def body(input: Reading, step: Any, ctx: Any) -> None:
        return None

    for bad in (
        Reading(key="nan", value=float("nan")),
        Reading(key="inf", value=float("inf")),
        Reading(key="bytes", value=1.0, raw=b"\xff"),
    ):
        with pytest.raises(JobInputInvalidError):
            await body.enqueue(bad)
    late = datetime(9999, 12, 31, 23, 59, tzinfo=timezone(timedelta(hours=-14)))
    with pytest.raises(JobOptionsInvalidError, match="run_at"):
        await body.enqueue(Reading(key="late", value=1.0), run_at=late)
    assert await driver.stats() == []


def test_a_registry_that_is_not_a_registry_is_a_declaration_problem() -> None:
    from jobs_core.errors import JobDeclarationInvalidError

    with pytest.raises(JobDeclarationInvalidError, match="registry"):

        @job(
            input=Item,
            idempotency_key=lambda i: i.key,
            tenant="none",
            name="bad-registry",
            registry="x",  # type: ignore[arg-type]
        )
        async def body(input: Item, step: Any, ctx: Any) -> None:
            return None


async def test_an_unwound_saga_is_requeued_only_from_its_first_compensated_step(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    from jobs_core import introspect

    effects: list[str] = []
    car = {"ok": False}

    def book(what: str) -> Any:
        def effect() -> str:
            if what == "car" and not car["ok"]:
                raise PermissionError("no cars for you")
            effects.append(what)
            return what

        return effect

    def undo(output: Any) -> None:
        effects.append(f"cancel-{output}")

    @item_job(registry, "trip", compensates=True, retry=Retry(attempts=1))
    async def trip(input: Item, step: Any, ctx: Any) -> None:
        await step.run("flight", book("flight"), compensate=undo)
        await step.run("hotel", book("hotel"), compensate=undo)
        await step.run("car", book("car"))

    result = await trip.enqueue(Item(key="a"))
    await run_jobs(driver, clock=clock, registry=registry)
    assert effects == ["flight", "hotel", "cancel-hotel", "cancel-flight"]
    car["ok"] = True
    with pytest.raises(JobNotRequeueableError) as refused:
        await introspect.requeue(driver, result.id, from_step="car")
    assert refused.value.code == "X_JOB_NOT_REQUEUEABLE"
    assert refused.value.meta["earliest"] == "flight"
    await introspect.requeue(driver, result.id, from_step="flight")
    await run_jobs(driver, clock=clock, registry=registry)
    row = await driver.introspect.get(result.id)
    assert row is not None and row.state == JobState.DONE
    assert effects[4:] == ["flight", "hotel", "car"]


async def test_an_abandoned_body_closed_later_closes_quietly() -> None:
    # A timed-out async body is left running; when nothing references it any more the collector
    # closes its coroutine, throwing GeneratorExit in: it must leave unchanged (issue 14 item 12),
    # not as a BodyExitError the interpreter reports as unraisable.
    from jobs_core.execute import _guarded

    closed: list[str] = []

    async def body() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            closed.append("body")

    guarded = _guarded(body())
    guarded.send(None)
    guarded.close()
    assert closed == ["body"]
