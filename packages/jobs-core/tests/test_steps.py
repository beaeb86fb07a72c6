"""Durable steps through a real worker on the memory driver: replay, parking, unwinding."""

from __future__ import annotations

import asyncio
from collections import Counter
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any
from uuid import UUID

import pytest
from pydantic import BaseModel

from jobs_core import JobRegistry, JobState, Retry, job, publish_event, use_driver
from jobs_core.driver import StepResolution
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.errors import AbortedError, JobsError
from jobs_core.testing import ManualClock, run_jobs
from jobs_core.types import ClaimRequest, StepRecord, StepWrite


class Order(BaseModel):
    order_id: str
    org_id: str = "org-1"


def order_job(registry: JobRegistry, name: str, **options: Any) -> Any:
    return job(
        input=Order,
        idempotency_key=lambda i: f"{name}:{i.order_id}",
        tenant=lambda i: i.org_id,
        name=name,
        registry=registry,
        **options,
    )


async def info(driver: MemoryDriver, job_id: UUID) -> Any:
    row = await driver.introspect.get(job_id)
    assert row is not None
    return row


async def test_failed_step_reruns_and_completed_steps_replay(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    calls: Counter[str] = Counter()
    seen: list[Any] = []

    def provision(order_id: str) -> dict[str, Any]:
        calls["provision"] += 1
        return {"at": datetime(2030, 1, 1, tzinfo=UTC), "amount": Decimal("9.50"), "id": order_id}

    async def welcome(org: dict[str, Any]) -> str:
        calls["welcome"] += 1
        if calls["welcome"] == 1:
            raise ConnectionError("smtp down")
        return f"sent:{org['id']}"

    @order_job(registry, "replay", retry=Retry(attempts=3, delay="1s"))
    async def onboard(input: Order, step: Any, ctx: Any) -> str:
        org = await step.run("provision", provision, input.order_id)
        seen.append((ctx.attempt, org))
        return await step.run("welcome", welcome, org)

    result = await onboard.enqueue(Order(order_id="o1"))
    await run_jobs(driver, clock=clock, registry=registry)

    assert calls == {"provision": 1, "welcome": 2}
    json_form = {"at": "2030-01-01T00:00:00+00:00", "amount": "9.50", "id": "o1"}
    assert seen == [(1, json_form), (2, json_form)]
    row = await info(driver, result.id)
    assert row.state == JobState.DONE
    assert row.result == "sent:o1"
    assert row.attempt == 2
    steps = {s.name: s for s in row.steps}
    assert steps["welcome"].status == "completed"
    assert steps["welcome"].attempts == 1


@pytest.mark.parametrize(
    ("value", "path_part"),
    [(b"raw", "bytes"), ({1, 2}, "set"), ("cycle", "cycle")],
)
async def test_unserializable_step_output_is_terminal_on_attempt_one(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry, value: Any, path_part: str
) -> None:
    calls = Counter[str]()
    if value == "cycle":
        value = []
        value.append(value)

    def produce() -> Any:
        calls["produce"] += 1
        return value

    @order_job(registry, f"unserializable-{path_part}", retry=Retry(attempts=3))
    async def body(input: Order, step: Any, ctx: Any) -> None:
        await step.run("produce", produce)

    result = await body.enqueue(Order(order_id="o1"))
    await run_jobs(driver, clock=clock, registry=registry)
    row = await info(driver, result.id)
    assert row.state == JobState.DEAD
    assert row.last_error_code == "X_STEP_OUTPUT_UNSERIALIZABLE"
    assert path_part in row.last_error
    assert calls["produce"] == 1
    assert row.attempt == 1


async def test_duplicate_step_name_is_refused(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    @order_job(registry, "dup-step")
    async def body(input: Order, step: Any, ctx: Any) -> None:
        await step.run("a", lambda: 1)
        await step.run("a", lambda: 2)

    result = await body.enqueue(Order(order_id="o1"))
    await run_jobs(driver, clock=clock, registry=registry)
    row = await info(driver, result.id)
    assert row.state == JobState.DEAD
    assert row.last_error_code == "X_STEP_DUPLICATE"
    assert [s.name for s in row.steps] == ["a"]


async def test_reserved_step_names_are_refused(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    @order_job(registry, "reserved")
    async def body(input: Order, step: Any, ctx: Any) -> None:
        await step.run("compensate:x", lambda: 1)

    result = await body.enqueue(Order(order_id="o1"))
    await run_jobs(driver, clock=clock, registry=registry)
    row = await info(driver, result.id)
    assert row.last_error_code == "X_STEP_NAME_INVALID"


async def test_sleep_parks_without_spending_an_attempt(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    calls: Counter[str] = Counter()
    start = clock.now()

    @order_job(registry, "sleeper", retry=Retry(attempts=1))
    async def body(input: Order, step: Any, ctx: Any) -> str:
        await step.run("welcome", lambda: calls.update(["welcome"]))
        await step.sleep("3d")
        await step.run("nudge", lambda: calls.update(["nudge"]))
        return "ok"

    result = await body.enqueue(Order(order_id="o1"))
    await run_jobs(driver, clock=clock, registry=registry)
    row = await info(driver, result.id)
    assert row.state == JobState.DONE
    assert calls == {"welcome": 1, "nudge": 1}
    assert clock.now() - start >= timedelta(days=3)
    assert row.attempt == 1
    assert [s.name for s in row.steps] == ["welcome", "sleep:259200000ms", "nudge"]


async def test_sleep_until_past_instant_does_not_park(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    @order_job(registry, "sleep-until-past")
    async def body(input: Order, step: Any, ctx: Any) -> str:
        await step.sleep_until("past", datetime(2000, 1, 1, tzinfo=UTC))
        return "ran"

    result = await body.enqueue(Order(order_id="o1"))
    before = clock.now()
    await run_jobs(driver, clock=clock, registry=registry)
    assert (await info(driver, result.id)).state == JobState.DONE
    assert clock.now() == before


class Confirmation(BaseModel):
    order_id: str
    accepted: bool


async def test_wait_for_event_resumes_on_publish(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    answers: list[Any] = []

    @order_job(registry, "waiter")
    async def body(input: Order, step: Any, ctx: Any) -> None:
        got = await step.wait_for_event(
            "confirm",
            "order.confirmed",
            schema=Confirmation,
            match={"order_id": input.order_id},
            timeout="1d",
        )
        answers.append(got)

    result = await body.enqueue(Order(order_id="o1"))
    runner = asyncio.create_task(run_jobs(driver, clock=clock, registry=registry, timeout="10s"))
    while (await info(driver, result.id)).state != JobState.SUSPENDED:
        await asyncio.sleep(0.005)
    await publish_event("order.confirmed", {"order_id": "other", "accepted": False})
    await publish_event("order.confirmed", {"order_id": "o1", "accepted": True})
    await runner
    row = await info(driver, result.id)
    assert row.state == JobState.DONE
    assert answers[-1] == Confirmation(order_id="o1", accepted=True)


async def test_wait_for_event_times_out_to_none_or_raises_when_required(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    answers: list[Any] = []

    @order_job(registry, "wait-timeout")
    async def optional(input: Order, step: Any, ctx: Any) -> None:
        answers.append(await step.wait_for_event("w", "never", schema=Confirmation, timeout="2h"))

    @order_job(registry, "wait-required", retry=Retry(attempts=1))
    async def required(input: Order, step: Any, ctx: Any) -> None:
        await step.wait_for_event("w", "never", schema=Confirmation, timeout="2h", required=True)

    first = await optional.enqueue(Order(order_id="o1"))
    second = await required.enqueue(Order(order_id="o1"))
    start = clock.now()
    await run_jobs(driver, clock=clock, registry=registry)
    assert answers == [None]
    assert clock.now() - start >= timedelta(hours=2)
    assert (await info(driver, first.id)).state == JobState.DONE
    row = await info(driver, second.id)
    assert row.state == JobState.DEAD
    assert row.last_error_code == "X_JOB_TIMEOUT"


async def test_invalid_event_is_terminal_and_hides_the_payload(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    @order_job(registry, "wait-invalid")
    async def body(input: Order, step: Any, ctx: Any) -> None:
        await step.wait_for_event("w", "order.confirmed", schema=Confirmation, timeout="1d")

    result = await body.enqueue(Order(order_id="o1"))
    runner = asyncio.create_task(run_jobs(driver, clock=clock, registry=registry, timeout="10s"))
    while (await info(driver, result.id)).state != JobState.SUSPENDED:
        await asyncio.sleep(0.005)
    await publish_event("order.confirmed", {"order_id": "secret-value-123", "accepted": "maybe"})
    await runner
    row = await info(driver, result.id)
    assert row.state == JobState.DEAD
    assert row.last_error_code == "X_JOB_EVENT_INVALID"
    assert "accepted" in row.last_error
    assert "secret-value-123" not in row.last_error
    assert "maybe" not in row.last_error


async def test_compensators_run_once_newest_first_when_the_run_fails_for_good(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    log: list[str] = []

    def refund(output: Any) -> None:
        log.append(f"refund:{output}")

    async def release(output: Any) -> None:
        log.append(f"release:{output}")

    def ship() -> None:
        log.append("ship")
        raise RuntimeError("carrier refused")

    @order_job(registry, "saga", compensates=True, retry=Retry(attempts=2, delay="1s"))
    async def checkout(input: Order, step: Any, ctx: Any) -> None:
        await step.run("charge", lambda: "ch_1", compensate=refund)
        await step.run("reserve", lambda: "rs_1", compensate=release)
        await step.run("ship", ship)

    result = await checkout.enqueue(Order(order_id="o1"))
    await run_jobs(driver, clock=clock, registry=registry)
    row = await info(driver, result.id)
    assert row.state == JobState.DEAD
    assert "carrier refused" in row.last_error
    assert log == ["ship", "ship", "release:rs_1", "refund:ch_1"]
    names = [s.name for s in row.steps]
    assert (
        names.index("unwinding")
        < names.index("compensate:reserve")
        < names.index("compensate:charge")
    )


async def test_a_crash_mid_unwind_resumes_without_rerunning_finished_compensators(
    clock: ManualClock, registry: JobRegistry
) -> None:
    driver = MemoryDriver(clock=clock)
    log: list[str] = []
    crash = {"armed": True}

    def refund(output: Any) -> None:
        log.append("refund")

    async def release(output: Any) -> None:
        log.append("release")
        if crash["armed"]:
            crash["armed"] = False
            # Simulate the process dying right after this compensator was persisted: the next
            # write of the attempt never lands and the lease lapses.
            raise_after_persist.append(True)

    raise_after_persist: list[bool] = []

    @order_job(registry, "saga-crash", compensates=True, retry=Retry(attempts=1))
    async def checkout(input: Order, step: Any, ctx: Any) -> None:
        await step.run("charge", lambda: "ch", compensate=refund)
        await step.run("reserve", lambda: "rs", compensate=release)
        raise RuntimeError("fail for good")

    with use_driver(driver):
        result = await checkout.enqueue(Order(order_id="o1"))
    original_write = driver.steps.write

    async def dying_write(write: Any) -> bool:
        landed = await original_write(write)
        if raise_after_persist and write.record.name == "compensate:reserve":
            raise_after_persist.clear()
            raise asyncio.CancelledError
        return landed

    driver.steps.write = dying_write  # type: ignore[method-assign]
    with pytest.raises(TimeoutError):
        await run_jobs(driver, clock=clock, registry=registry, timeout="2s")
    assert log == ["release"]
    driver.steps.write = original_write  # type: ignore[method-assign]
    clock.advance("31s")
    await run_jobs(driver, clock=clock, registry=registry)
    row = await info(driver, result.id)
    assert log == ["release", "refund"]
    assert row.state == JobState.DEAD
    assert "fail for good" in row.last_error


async def test_once_step_left_started_is_outcome_unknown_until_resolved(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    calls: Counter[str] = Counter()

    @order_job(registry, "payout", retry=Retry(attempts=2))
    async def body(input: Order, step: Any, ctx: Any) -> Any:
        return await step.run("payout", lambda: calls.update(["payout"]) or "paid", once=True)

    result = await body.enqueue(Order(order_id="o1"))
    claimed = await driver.claim(ClaimRequest(["default"], 1, 30_000, "dead-worker"))
    await driver.steps.write(
        StepWrite(
            claimed[0].id,
            claimed[0].fence,
            claimed[0].run_id,
            StepRecord("payout", "started", once=True),
        )
    )
    clock.advance("31s")
    await run_jobs(driver, clock=clock, registry=registry)
    row = await info(driver, result.id)
    assert row.state == JobState.DEAD
    assert row.last_error_code == "X_STEP_OUTCOME_UNKNOWN"
    assert calls["payout"] == 0

    await driver.introspect.resolve_step(result.id, "payout", StepResolution(ran=True, output="x"))
    row = await info(driver, result.id)
    assert [(s.name, s.status, s.output) for s in row.steps] == [("payout", "completed", "x")]


async def test_step_timeout_fires_the_step_signal_then_fails_the_step(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    seen: list[str] = []

    async def slow(cancel: Any) -> None:
        reason = await cancel.wait()
        seen.append(reason.code)
        await asyncio.sleep(10)

    @order_job(registry, "step-timeout", step_timeout="50ms", retry=Retry(attempts=1))
    async def body(input: Order, step: Any, ctx: Any) -> None:
        await step.run("slow", slow)

    result = await body.enqueue(Order(order_id="o1"))
    await run_jobs(driver, clock=clock, registry=registry, timeout="5s")
    row = await info(driver, result.id)
    assert seen == ["X_STEP_TIMEOUT"]
    assert row.state == JobState.DEAD
    # Its only attempt ran out; the step timeout is the last attempt's own code.
    assert row.last_error_code == "X_JOB_MAX_ATTEMPTS"
    assert row.last_error is not None and "X_STEP_TIMEOUT" in row.last_error


async def test_job_timeout_cancels_the_body_before_failing_and_refuses_late_writes(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    late: list[Any] = []
    released = asyncio.Event()

    @order_job(registry, "job-timeout", timeout="50ms", retry=Retry(attempts=1))
    async def body(input: Order, step: Any, ctx: Any) -> None:
        reason = await ctx.cancel.wait()
        late.append(reason.code)
        try:
            await step.run("late", lambda: "too late")
        except JobsError as exc:
            late.append(exc.code)
        released.set()

    result = await body.enqueue(Order(order_id="o1"))
    await run_jobs(driver, clock=clock, registry=registry, timeout="5s")
    await asyncio.wait_for(released.wait(), 2)
    row = await info(driver, result.id)
    assert row.state == JobState.DEAD
    assert row.last_error_code == "X_JOB_MAX_ATTEMPTS"
    assert row.last_error is not None and "X_JOB_TIMEOUT" in row.last_error
    assert late == ["X_JOB_TIMEOUT", AbortedError.code]
    assert all(s.name != "late" for s in row.steps)


async def test_sync_body_uses_the_blocking_step_facade(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    calls: Counter[str] = Counter()

    def fetch(order_id: str) -> dict[str, str]:
        calls["fetch"] += 1
        return {"id": order_id}

    @order_job(registry, "sync-body", retry=Retry(attempts=2, delay="1s"))
    def body(input: Order, step: Any, ctx: Any) -> str:
        got = step.run("fetch", fetch, input.order_id)
        step.sleep("1h")
        if ctx.attempt == 1:
            raise RuntimeError("first attempt fails after the sleep")
        return f"{got['id']}:{ctx.attempt}"

    result = await body.enqueue(Order(order_id="o9"))
    await run_jobs(driver, clock=clock, registry=registry)
    row = await info(driver, result.id)
    assert row.state == JobState.DONE
    assert row.result == "o9:2"
    assert calls["fetch"] == 1


@pytest.mark.parametrize("jitter", [False, True])
async def test_retry_after_classification_waits_the_named_time(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry, jitter: bool
) -> None:
    """The retry comes no sooner than the named hour, jitter or not (jitter only adds)."""
    from jobs_core import classify

    class Throttled(Exception):
        code = "X_TEST_THROTTLED"

        def __init__(self) -> None:
            super().__init__("slow down")
            self.meta = {"retry_after_seconds": 3600}

    classify({"X_TEST_THROTTLED": "retry_after"})
    attempts: list[datetime] = []

    @order_job(registry, "retry-after", retry=Retry(attempts=2, max_delay="2h", jitter=jitter))
    async def body(input: Order, step: Any, ctx: Any) -> None:
        attempts.append(clock.now())
        if ctx.attempt == 1:
            raise Throttled()

    await body.enqueue(Order(order_id="o1"))
    await run_jobs(driver, clock=clock, registry=registry)
    assert len(attempts) == 2
    assert timedelta(hours=1) <= attempts[1] - attempts[0] <= timedelta(hours=1.25, seconds=1)


async def test_terminal_error_dead_letters_with_attempts_unspent(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    @order_job(registry, "terminal", retry=Retry(attempts=5))
    async def body(input: Order, step: Any, ctx: Any) -> None:
        raise PermissionError("not allowed")

    result = await body.enqueue(Order(order_id="o1"))
    await run_jobs(driver, clock=clock, registry=registry)
    row = await info(driver, result.id)
    assert row.state == JobState.DEAD
    assert row.attempt == 1


async def test_dead_letter_false_settles_failed(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    @order_job(registry, "dropped", retry=Retry(attempts=2, dead_letter=False))
    async def body(input: Order, step: Any, ctx: Any) -> None:
        raise RuntimeError("boom")

    result = await body.enqueue(Order(order_id="o1"))
    stats = await run_jobs(driver, clock=clock, registry=registry)
    row = await info(driver, result.id)
    assert row.state == JobState.FAILED
    assert row.attempt == 2
    assert stats.outcomes == {"retried": 1, "dropped": 1}


async def test_run_inline_persists_steps_and_replays(registry: JobRegistry) -> None:
    calls: Counter[str] = Counter()

    @order_job(registry, "inline")
    async def body(input: Order, step: Any, ctx: Any) -> str:
        first = await step.run("a", lambda: calls.update(["a"]) or "A")
        await step.sleep("10ms")
        second = await step.run("b", lambda: calls.update(["b"]) or "B")
        return first + second

    with use_driver(MemoryDriver()):
        assert await body.run_inline(Order(order_id="o1")) == "AB"
    assert calls == {"a": 1, "b": 1}
