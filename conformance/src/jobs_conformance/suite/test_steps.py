"""Steps: the step store's records and fences, and replay through a real worker."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from pydantic import BaseModel

from jobs_conformance.target import (
    Target,
    claim,
    eventually,
    outcome,
    request,
    running_worker,
    state_counts,
)
from jobs_core import JobHandle, JobRegistry, Retry, job, use_driver
from jobs_core.testing import run_jobs
from jobs_core.types import Fence, NackOptions, Settle, StepRecord, StepWrite


class Order(BaseModel):
    """A reference job's input."""

    order_id: str


def order_job(
    registry: JobRegistry, name: str, **options: Any
) -> Callable[[Callable[..., Any]], JobHandle[Any, Any]]:
    """Declare a job of ``Order`` keyed by the order id, in ``registry``."""
    return job(
        input=Order,
        idempotency_key=lambda i: i.order_id,
        tenant="none",
        name=name,
        registry=registry,
        **options,
    )


async def test_step_records_persist_in_seq_order_and_replace_in_place(target: Target) -> None:
    """Records load in first-write order; a replacement keeps its seq; outputs are JSON."""
    driver = target.driver
    await driver.enqueue(request("a"))
    [held] = await claim(driver)
    store = driver.steps
    assert await store.load(held.run_id) == []
    now = await store.now()
    output = {"nested": [1, 2.5, "x", None, True, {"k": "v"}]}
    writes = [
        StepRecord("first", "started", started_at=now, once=True),
        StepRecord("second", "failed", started_at=now, attempts=1, error="boom"),
        StepRecord("first", "completed", output=output, started_at=now, completed_at=now),
        StepRecord("third", "waiting", started_at=now, wake_at=now + timedelta(hours=1)),
    ]
    for record in writes:
        assert await store.write(StepWrite(held.id, held.fence, held.run_id, record))
    loaded = await store.load(held.run_id)
    assert [(r.name, r.seq, r.status) for r in loaded] == [
        ("first", 0, "completed"),
        ("second", 1, "failed"),
        ("third", 2, "waiting"),
    ]
    assert loaded[0].output == output
    assert (loaded[1].attempts, loaded[1].error) == (1, "boom")
    assert loaded[2].wake_at == now + timedelta(hours=1)


async def test_step_writes_are_fenced_on_the_claim(target: Target) -> None:
    """A write lands only under the running claim of the run's own row."""
    driver = target.driver
    store = driver.steps
    await driver.enqueue(request("a"))
    await driver.enqueue(request("b"))
    [held, other] = await claim(driver, vt=300)
    record = StepRecord("s", "completed", output=1)
    assert not await store.write(StepWrite(held.id, Fence("w2", held.claim), held.run_id, record))
    assert not await store.write(StepWrite(held.id, held.fence, other.run_id, record))
    await target.advance(500)
    [again, _] = await claim(driver, worker="w2")
    assert again.id == held.id
    assert not await store.write(StepWrite(held.id, held.fence, held.run_id, record))
    assert await store.write(StepWrite(again.id, again.fence, again.run_id, record))
    assert await driver.ack(again.id, Settle(again.fence))
    late = StepRecord("late", "completed")
    assert not await store.write(StepWrite(again.id, again.fence, again.run_id, late))
    assert [r.name for r in await store.load(held.run_id)] == ["s"]
    inline = StepRecord("inline", "completed", output="x")
    assert await store.write(StepWrite(None, None, other.run_id, inline))
    assert [r.output for r in await store.load(other.run_id)] == ["x"]


async def test_completed_steps_replay_from_storage(target: Target) -> None:
    """A retried attempt answers completed steps from storage and reruns only the failed one."""
    registry = JobRegistry()
    calls: Counter[str] = Counter()
    seen: list[Any] = []

    def provision(order_id: str) -> dict[str, Any]:
        calls["provision"] += 1
        return {"order": order_id, "amount": "9.50"}

    def charge(org: dict[str, Any]) -> str:
        calls["charge"] += 1
        if calls["charge"] == 1:
            raise ConnectionError("gateway down")
        return f"charged:{org['order']}"

    @order_job(registry, "conformance.replay", retry=Retry(attempts=3, delay="100ms"))
    async def onboard(input: Order, step: Any, ctx: Any) -> Any:
        org = await step.run("provision", provision, input.order_id)
        seen.append(org)
        return await step.run("charge", charge, org)

    with use_driver(target.driver):
        result = await onboard.enqueue(Order(order_id="o1"))
    await run_jobs(target.driver, clock=target.clock, registry=registry, timeout="20s")
    assert calls == {"provision": 1, "charge": 2}
    assert seen == [{"order": "o1", "amount": "9.50"}] * 2
    assert await outcome(target.driver, result.id) == ("done", None)
    records = {r.name: r for r in await target.driver.steps.load(result.run_id)}
    assert records["provision"].output == {"order": "o1", "amount": "9.50"}
    assert (records["charge"].status, records["charge"].output) == ("completed", "charged:o1")


async def test_a_duplicate_step_name_is_terminal(target: Target) -> None:
    """Two steps with one name in a run dead-letter the row with X_STEP_DUPLICATE."""
    registry = JobRegistry()
    calls: Counter[str] = Counter()

    def effect() -> int:
        calls["effect"] += 1
        return calls["effect"]

    @order_job(registry, "conformance.duplicate", retry=Retry(attempts=3, delay="100ms"))
    async def twice(input: Order, step: Any, ctx: Any) -> None:
        await step.run("same", effect)
        await step.run("same", effect)

    with use_driver(target.driver):
        result = await twice.enqueue(Order(order_id="o1"))
    await run_jobs(target.driver, clock=target.clock, registry=registry, timeout="20s")
    state, code = await outcome(target.driver, result.id)
    assert state == "dead"
    assert code in ("X_STEP_DUPLICATE", None)
    assert calls == {"effect": 1}


async def test_a_once_step_started_without_completion_is_never_rerun(target: Target) -> None:
    """A ``once`` step found ``started`` is X_STEP_OUTCOME_UNKNOWN; its function never reruns."""
    registry = JobRegistry()
    calls: Counter[str] = Counter()

    def send() -> str:
        calls["send"] += 1
        return "sent"

    @order_job(registry, "conformance.once", retry=Retry(attempts=3, delay="100ms"))
    async def notify(input: Order, step: Any, ctx: Any) -> None:
        await step.run("send", send, once=True)

    with use_driver(target.driver):
        result = await notify.enqueue(Order(order_id="o1"))
    # A worker that persisted ``started`` and then vanished (its claim handed back unspent).
    [held] = await claim(target.driver)
    started = StepRecord("send", "started", started_at=await target.driver.steps.now(), once=True)
    assert await target.driver.steps.write(StepWrite(held.id, held.fence, held.run_id, started))
    assert await target.driver.nack(held.id, NackOptions(held.fence, count_attempt=False))
    await run_jobs(target.driver, clock=target.clock, registry=registry, timeout="20s")
    assert calls == {}
    state, code = await outcome(target.driver, result.id)
    assert state == "dead"
    assert code in ("X_STEP_OUTCOME_UNKNOWN", None)
    [record] = await target.driver.steps.load(result.run_id)
    assert (record.status, record.once) == ("started", True)


async def test_a_wait_records_its_event_and_parks_the_run(target: Target) -> None:
    """``wait_for_event`` persists a waiting record (event, match, deadline); the row parks."""
    target.require("events")
    registry = JobRegistry()

    class Paid(BaseModel):
        order_id: str

    @order_job(registry, "conformance.wait", event_poll="1h")
    async def await_payment(input: Order, step: Any, ctx: Any) -> None:
        await step.wait_for_event(
            "paid",
            "conformance.paid",
            schema=Paid,
            match={"order_id": input.order_id},
            timeout="2h",
        )

    with use_driver(target.driver):
        result = await await_payment.enqueue(Order(order_id="o1"))
    async with running_worker(target, registry):

        async def parked() -> bool:
            return state_counts(await target.driver.stats()).get("suspended") == 1

        await eventually(parked, what="the waiting run to park")
    [record] = await target.driver.steps.load(result.run_id)
    assert (record.name, record.status, record.event) == ("paid", "waiting", "conformance.paid")
    assert dict(record.match or {}) == {"order_id": "o1"}
    assert record.started_at is not None and record.wake_at is not None
    assert record.wake_at - record.started_at == timedelta(hours=2)


async def test_a_sleep_parks_and_wakes_without_spending_an_attempt(target: Target) -> None:
    """A sleep parks the run, then it resumes after the sleep and finishes on attempt 1."""
    registry = JobRegistry()
    calls: Counter[str] = Counter()
    attempts: list[int] = []

    def before() -> str:
        calls["before"] += 1
        return "b"

    def after() -> str:
        calls["after"] += 1
        return "a"

    @order_job(registry, "conformance.sleep", retry=Retry(attempts=1))
    async def nap(input: Order, step: Any, ctx: Any) -> None:
        attempts.append(ctx.attempt)
        await step.run("before", before)
        await step.sleep("nap", "300ms")
        await step.run("after", after)

    with use_driver(target.driver):
        result = await nap.enqueue(Order(order_id="o1"))
    await run_jobs(target.driver, clock=target.clock, registry=registry, timeout="20s")
    assert calls == {"before": 1, "after": 1}
    assert attempts == [1, 1]
    assert await outcome(target.driver, result.id) == ("done", None)
    records = await target.driver.steps.load(result.run_id)
    assert [(r.name, r.status) for r in records] == [
        ("before", "completed"),
        ("nap", "completed"),
        ("after", "completed"),
    ]
    nap_record = records[1]
    assert nap_record.started_at is not None and nap_record.wake_at is not None
    assert nap_record.wake_at - nap_record.started_at == timedelta(milliseconds=300)
