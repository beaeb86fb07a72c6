"""The worker on the memory driver: drain, leases, limits, fleet concurrency, outcomes."""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from collections import Counter
from typing import Any
from uuid import UUID

import pytest
from pydantic import BaseModel

from jobs_core import (
    Concurrency,
    JobFilter,
    JobRegistry,
    JobState,
    Limits,
    Retry,
    Worker,
    current_actor,
    job,
    use_driver,
)
from jobs_core.driver import LeaseRequest
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.errors import ConcurrencyUnenforceableError, JobOptionsInvalidError
from jobs_core.ids import new_id
from jobs_core.testing import ManualClock, run_jobs
from jobs_core.types import ClaimedJob, ClaimRequest, EnqueueRequest, Settle


class Task(BaseModel):
    key: str
    org: str = "org-1"
    hold_ms: int = 0


def task_job(registry: JobRegistry, name: str, **options: Any) -> Any:
    return job(
        input=Task,
        idempotency_key=lambda i: f"{name}:{i.key}",
        tenant=lambda i: i.org,
        name=name,
        registry=registry,
        **options,
    )


async def state_of(driver: MemoryDriver, job_id: UUID) -> Any:
    row = await driver.introspect.get(job_id)
    assert row is not None
    return row


class _Peak:
    """Counts bodies running at once; ``most`` is the highest count seen."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0

    async def hold(self, seconds: float) -> None:
        """Count one body in for ``seconds`` (s)."""
        self.now += 1
        self.most = max(self.most, self.now)
        await asyncio.sleep(seconds)
        self.now -= 1


async def wait_for(predicate: Any, timeout: float = 5.0) -> None:
    deadline = time.monotonic() + timeout
    while not await predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        await asyncio.sleep(0.005)


async def test_sigterm_interrupts_a_waiting_body_without_spending_its_attempt(
    registry: JobRegistry,
) -> None:
    driver = MemoryDriver()
    runs: list[str] = []

    @task_job(registry, "deploy-safe", retry=Retry(attempts=1))
    async def body(input: Task, step: Any, ctx: Any) -> str:
        if ctx.attempt == 1 and not runs:
            runs.append("waiting")
            await ctx.cancel.wait()
            ctx.cancel.raise_if_cancelled()
        runs.append(f"done on attempt {ctx.attempt}")
        return "ok"

    with use_driver(driver):
        result = await body.enqueue(Task(key="a"))
    worker = Worker(driver, registry=registry, poll_interval="5ms", drain_timeout="5s")
    worker.install_signal_handlers()
    running = asyncio.create_task(worker.run())
    try:
        await wait_for(lambda: _running(driver, result.id))
        os.kill(os.getpid(), signal.SIGTERM)
        await asyncio.wait_for(running, 5)
    finally:
        loop = asyncio.get_running_loop()
        loop.remove_signal_handler(signal.SIGTERM)
        loop.remove_signal_handler(signal.SIGINT)
    row = await state_of(driver, result.id)
    assert row.state == JobState.READY
    assert row.attempt == 0
    assert worker.stats().outcomes == {"interrupted": 1}

    await run_jobs(driver, registry=registry, timeout="5s")
    row = await state_of(driver, result.id)
    assert row.state == JobState.DONE
    assert runs == ["waiting", "done on attempt 1"]


async def _running(driver: MemoryDriver, job_id: UUID) -> bool:
    row = await driver.introspect.get(job_id)
    return row is not None and row.state == JobState.RUNNING


async def test_sync_body_is_interrupted_by_drain_too(registry: JobRegistry) -> None:
    driver = MemoryDriver()
    started = threading.Event()

    @task_job(registry, "sync-drain", retry=Retry(attempts=1))
    def body(input: Task, step: Any, ctx: Any) -> None:
        started.set()
        ctx.cancel.wait_sync(10)
        ctx.cancel.raise_if_cancelled()

    with use_driver(driver):
        result = await body.enqueue(Task(key="a"))
    worker = Worker(driver, registry=registry, poll_interval="5ms", drain_timeout="5s")
    running = asyncio.create_task(worker.run())
    await asyncio.to_thread(started.wait, 5)
    await worker.drain()
    await asyncio.wait_for(running, 5)
    row = await state_of(driver, result.id)
    assert (row.state, row.attempt) == (JobState.READY, 0)


async def _drain_past_budget(driver: MemoryDriver, registry: JobRegistry, body: Any) -> None:
    """Enqueue one ``body`` job, start a worker with a 100 ms drain budget, drain it mid-body."""
    with use_driver(driver):
        await body.enqueue(Task(key="a"))
    worker = Worker(driver, registry=registry, poll_interval="5ms", drain_timeout="100ms")
    running = asyncio.create_task(worker.run())
    await wait_for(lambda: _any_running(worker))
    await worker.drain()
    await asyncio.wait_for(running, 5)


async def test_drain_past_its_budget_abandons_and_closes_the_driver(
    registry: JobRegistry, caplog: pytest.LogCaptureFixture
) -> None:
    driver = MemoryDriver()

    @task_job(registry, "stubborn")
    async def body(input: Task, step: Any, ctx: Any) -> None:
        await asyncio.sleep(30)

    await _drain_past_budget(driver, registry, body)
    assert any(r.message == "jobs.worker.drain-abandoned" for r in caplog.records)
    with pytest.raises(Exception, match="X_DRIVER_UNAVAILABLE"):
        await driver.stats()


@pytest.mark.parametrize(
    ("options", "in_step"),
    [({}, False), ({"timeout": "10s"}, False), ({}, True), ({"step_timeout": "10s"}, True)],
    ids=["body", "body-with-timeout", "step", "step-with-timeout"],
)
async def test_a_drain_past_its_budget_cancels_the_async_body_it_abandons(
    registry: JobRegistry, options: dict[str, str], in_step: bool
) -> None:
    # The body does not run on unseen after the driver is closed: its await is cancelled, whether
    # it runs in the attempt's task or (with a deadline) in a task of its own, in a step or not.
    driver = MemoryDriver()
    cancelled = asyncio.Event()

    async def stubborn() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.set()
            raise

    @task_job(registry, "stubborn", **options)
    async def body(input: Task, step: Any, ctx: Any) -> None:
        if in_step:
            await step.run("hold", stubborn)
        else:
            await stubborn()

    await _drain_past_budget(driver, registry, body)
    await asyncio.wait_for(cancelled.wait(), 5)


async def _any_running(worker: Worker) -> bool:
    return worker.stats().in_flight > 0


async def _claims_and_bodies(registry: JobRegistry, jobs: int, **options: Any) -> list[str]:
    """Run a worker over ``jobs`` queued rows; answer its claims (``claim <limit>``) and bodies."""
    events: list[str] = []

    class Recording(MemoryDriver):
        async def claim(self, req: ClaimRequest) -> list[ClaimedJob]:
            events.append(f"claim {req.limit}")
            return await super().claim(req)

    driver = Recording()

    @task_job(registry, "recorded")
    async def body(input: Task, step: Any, ctx: Any) -> None:
        events.append("body")

    with use_driver(driver):
        for i in range(jobs):
            await body.enqueue(Task(key=f"k{i}"))
    worker = Worker(driver, registry=registry, poll_interval="5ms", **options)
    running = asyncio.create_task(worker.run())

    async def all_ran() -> bool:
        return events.count("body") == jobs

    await wait_for(all_ran)
    await worker.stop()
    await running
    assert worker.stats().peak_in_flight <= worker.capacity
    return events


async def test_a_claimed_body_starts_before_the_next_claim(registry: JobRegistry) -> None:
    """After a claim the loop yields once: new attempts reach their bodies first.

    So an idle worker's pickup latency does not include building and sending the next claim.
    """
    events = await _claims_and_bodies(registry, 1, concurrency=8)
    assert events[:2] == ["claim 4", "body"]


async def test_a_full_claim_sends_the_next_before_its_bodies_run(registry: JobRegistry) -> None:
    """Over a backlog a claim takes half the slots, and one that comes back full sends the next.

    So the database works on the next claim while the rows just claimed run.
    """
    events = await _claims_and_bodies(registry, 6, concurrency=4)
    assert events[:3] == ["claim 2", "claim 2", "body"]


async def test_a_settled_attempt_leaves_no_reference_cycle(registry: JobRegistry) -> None:
    """Reference counting frees an attempt's objects as it settles.

    The lending callback held its row, which held the callback: ~19 objects per job (the row,
    its attempt, task, coroutine, context, step runner...) waited for the cycle collector, which
    cost a pg worker draining a backlog ~4% of its rate.
    """
    import gc

    @task_job(registry, "w.acyclic")
    async def acyclic(input: Task, step: Any, ctx: Any) -> None:
        await step.run("one", _one)

    driver = MemoryDriver()
    with use_driver(driver):
        await acyclic.enqueue_many([Task(key=f"k{i}") for i in range(50)])
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        stats = await run_jobs(driver, registry=registry)
        gc.collect()
        kinds = Counter(type(o).__name__ for o in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert stats.outcomes == {"completed": 50}
    assert {k: kinds[k] for k in ("_Held", "Attempt", "StepRunner", "ClaimedJob") if kinds[k]} == {}


async def _one() -> int:
    return 1


async def test_rows_a_claim_brings_after_the_stop_began_are_handed_back_unrun(
    registry: JobRegistry,
) -> None:
    claim_sent = asyncio.Event()
    claim_go = asyncio.Event()

    class Held(MemoryDriver):
        async def claim(self, req: ClaimRequest) -> list[ClaimedJob]:
            claim_sent.set()
            await claim_go.wait()
            return await super().claim(req)

    driver = Held()
    ran: list[str] = []

    @task_job(registry, "late")
    async def body(input: Task, step: Any, ctx: Any) -> None:
        ran.append(input.key)

    with use_driver(driver):
        queued = await body.enqueue(Task(key="a"))
    worker = Worker(driver, registry=registry, poll_interval="5ms")
    running = asyncio.create_task(worker.run())
    await claim_sent.wait()
    stopping = asyncio.create_task(worker.stop())
    await asyncio.sleep(0.01)
    claim_go.set()
    await stopping
    await running
    row = await state_of(driver, queued.id)
    assert (ran, row.state, row.attempt) == ([], JobState.READY, 0)


async def test_a_slot_is_lent_while_its_ack_is_in_flight_one_slot_deep(
    registry: JobRegistry,
) -> None:
    """A completed body's ack does not hold its slot: the next row runs while the ack lands.

    With acks held back, a worker of 2 slots runs 2 more bodies (their slots lent), then stops
    claiming: 4 rows leased at most, and never more than 2 bodies at once. Released, every ack
    lands and every row ends done.
    """
    acks_go = asyncio.Event()
    bodies = _Peak()

    class SlowAcks(MemoryDriver):
        async def ack(self, job_id: UUID, by: Settle) -> bool:
            await acks_go.wait()
            return await super().ack(job_id, by)

    driver = SlowAcks()

    @task_job(registry, "lent")
    async def body(input: Task, step: Any, ctx: Any) -> None:
        await bodies.hold(0.001)

    with use_driver(driver):
        for i in range(8):
            await body.enqueue(Task(key=f"k{i}"))
    worker = Worker(driver, registry=registry, concurrency=2, poll_interval="5ms")
    running = asyncio.create_task(worker.run())

    async def in_state(state: JobState) -> int:
        return len((await driver.introspect.list(JobFilter(state=state))).rows)

    async def leased(n: int) -> bool:
        return await in_state(JobState.RUNNING) == n

    await wait_for(lambda: leased(4))
    await asyncio.sleep(0.05)  # the claim loop had ten polls to over-claim
    assert await leased(4)
    assert worker.stats().in_flight == 0
    acks_go.set()

    async def all_done() -> bool:
        return await in_state(JobState.DONE) == 8

    await wait_for(all_done)
    await worker.stop()
    await running
    assert bodies.most == 2
    assert worker.stats().peak_in_flight == 2


class _SlowAcks(MemoryDriver):
    """Acks that take 20 ms, as a network store's do."""

    async def ack(self, job_id: UUID, by: Settle) -> bool:
        await asyncio.sleep(0.02)
        return await super().ack(job_id, by)


@pytest.mark.parametrize(
    ("gated", "options", "limits"),
    [
        ("key", {"concurrency": Concurrency(key=lambda i: i.org, limit=1, when_busy="fail")}, None),
        ("fleet", {"concurrency": 1}, None),
        ("tenant", {}, Limits(per_tenant=1)),
    ],
)
async def test_a_lent_slot_is_not_refused_by_the_acking_rows_gate(
    registry: JobRegistry, gated: str, options: dict[str, Any], limits: Limits | None
) -> None:
    """A one-slot worker runs one row at a time, so its own rows never find a gate taken.

    The row claimed into a slot lent by an acking row must not meet that row's fleet lease or
    in-process Limits count still held: it was refused (``X_JOB_KEY_BUSY``) or handed back.
    """
    driver = _SlowAcks()

    @task_job(registry, f"gated-{gated}", **options)
    async def body(input: Task, step: Any, ctx: Any) -> None:
        await asyncio.sleep(0.001)

    with use_driver(driver):
        for i in range(6):
            await body.enqueue(Task(key=f"k{i}"))
    worker = Worker(driver, registry=registry, concurrency=1, poll_interval="5ms", limits=limits)
    running = asyncio.create_task(worker.run())

    async def all_ended() -> bool:
        return sum(worker.stats().outcomes.values()) >= 6

    await wait_for(all_ended)
    await worker.stop()
    await running
    assert worker.stats().outcomes == {"completed": 6}


async def test_a_lapsed_lease_is_reclaimed_and_the_attempt_counted(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    attempts: list[int] = []

    @task_job(registry, "crashy", retry=Retry(attempts=3))
    async def body(input: Task, step: Any, ctx: Any) -> None:
        attempts.append(ctx.attempt)

    result = await body.enqueue(Task(key="a"))
    [claimed] = await driver.claim(ClaimRequest(["default"], 1, 30_000, "killed-worker"))
    clock.advance("31s")
    await run_jobs(driver, clock=clock, registry=registry)
    row = await state_of(driver, result.id)
    assert row.state == JobState.DONE
    assert attempts == [2]
    assert await driver.ack(claimed.id, Settle(claimed.fence)) is False


async def test_a_job_that_kills_its_worker_on_the_final_attempt_is_buried(
    driver: MemoryDriver,
    clock: ManualClock,
    registry: JobRegistry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    @task_job(registry, "killer", retry=Retry(attempts=2))
    async def body(input: Task, step: Any, ctx: Any) -> None:
        raise AssertionError("never runs")

    result = await body.enqueue(Task(key="a"))
    for worker_id in ("w1", "w2"):
        assert await driver.claim(ClaimRequest(["default"], 1, 30_000, worker_id))
        clock.advance("31s")
    await run_jobs(driver, clock=clock, registry=registry)
    row = await state_of(driver, result.id)
    assert row.state == JobState.DEAD
    assert row.last_error == "LEASE_LAPSED_FINAL_ATTEMPT"
    assert any(r.message == "jobs.lease.lapsed-final" for r in caplog.records)


async def test_heartbeat_keeps_a_long_body_leased_and_cancel_fires_its_signal(
    registry: JobRegistry,
) -> None:
    driver = MemoryDriver()
    reasons: list[str] = []

    @task_job(registry, "long", retry=Retry(attempts=1))
    async def body(input: Task, step: Any, ctx: Any) -> None:
        reasons.append((await ctx.cancel.wait()).code)

    with use_driver(driver):
        result = await body.enqueue(Task(key="a"))
    worker = Worker(driver, registry=registry, visibility_timeout="300ms", poll_interval="5ms")
    running = asyncio.create_task(worker.run())
    await wait_for(lambda: _running(driver, result.id))
    await asyncio.sleep(0.7)
    row = await state_of(driver, result.id)
    assert row.state == JobState.RUNNING
    assert row.claim == 1
    await driver.introspect.cancel(result.id, "operator said stop")
    await wait_for(lambda: _async_true(bool(reasons)))
    await worker.stop()
    await running
    assert reasons == ["X_JOB_CANCELLED"]
    assert (await state_of(driver, result.id)).state == JobState.CANCELLED
    assert worker.stats().leases_lost == {}


async def _async_true(value: bool) -> bool:
    return value


async def test_heartbeat_longer_than_a_third_of_the_lease_is_refused() -> None:
    with pytest.raises(JobOptionsInvalidError, match="heartbeat"):
        Worker(MemoryDriver(), visibility_timeout="3s", heartbeat="2s")


async def test_fleet_concurrency_per_key_never_overlaps(registry: JobRegistry) -> None:
    driver = MemoryDriver()
    running: Counter[str] = Counter()
    peak: Counter[str] = Counter()

    @task_job(
        registry,
        "per-key",
        concurrency=Concurrency(key=lambda i: i.org, limit=1),
        retry=Retry(attempts=1),
    )
    async def body(input: Task, step: Any, ctx: Any) -> None:
        running[input.org] += 1
        peak[input.org] = max(peak[input.org], running[input.org])
        await asyncio.sleep(0.01)
        running[input.org] -= 1

    with use_driver(driver):
        await body.enqueue_many([Task(key=str(n), org=f"org-{n % 2}") for n in range(10)])
    workers = [
        Worker(driver, registry=registry, concurrency=4, poll_interval="2ms", idle_poll_max="5ms")
        for _ in range(2)
    ]
    tasks = [asyncio.create_task(w.run()) for w in workers]
    await wait_for(lambda: _all_done(driver), timeout=20)
    for w in workers:
        await w.stop()
    await asyncio.gather(*tasks)
    assert peak == {"org-0": 1, "org-1": 1}
    assert sum(w.stats().outcomes.get("completed", 0) for w in workers) == 10
    assert all(w.stats().outcomes.get("deferred", 0) >= 0 for w in workers)


async def _all_done(driver: MemoryDriver) -> bool:
    return sum(s.ready + s.delayed + s.running + s.suspended for s in await driver.stats()) == 0


async def test_when_busy_fail_refuses_without_running_the_body(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    ran: list[str] = []

    @task_job(
        registry,
        "busy-fail",
        concurrency=Concurrency(key=lambda i: i.org, limit=1, when_busy="fail"),
    )
    async def body(input: Task, step: Any, ctx: Any) -> None:
        ran.append(input.key)

    await driver.leases.acquire(LeaseRequest("job-key:busy-fail:org-1", 1, "someone-else", 60_000))
    result = await body.enqueue(Task(key="a"))
    stats = await run_jobs(driver, clock=clock, registry=registry)
    row = await state_of(driver, result.id)
    assert row.state == JobState.FAILED
    assert row.last_error_code == "X_JOB_KEY_BUSY"
    assert ran == []
    assert stats.outcomes == {"refused": 1}


async def test_a_run_is_not_refused_by_its_own_leftover_slot(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    @task_job(registry, "own-slot", concurrency=1)
    async def body(input: Task, step: Any, ctx: Any) -> str:
        return "ran"

    result = await body.enqueue(Task(key="a"))
    row = await state_of(driver, result.id)
    await driver.leases.acquire(LeaseRequest("job:own-slot", 1, str(row.run_id), 60_000))
    await run_jobs(driver, clock=clock, registry=registry)
    assert (await state_of(driver, result.id)).state == JobState.DONE


class NoLeases:
    """The memory driver with its lease store hidden: a driver that cannot hold fleet caps."""

    def __init__(self, inner: MemoryDriver) -> None:
        self._inner = inner
        self.name = "no-leases"
        self.capabilities = inner.capabilities - {"leases"}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


async def test_worker_refuses_to_start_when_concurrency_cannot_be_enforced(
    registry: JobRegistry,
) -> None:
    @task_job(registry, "capped", concurrency=2)
    async def body(input: Task, step: Any, ctx: Any) -> None:
        return None

    worker = Worker(NoLeases(MemoryDriver()), registry=registry)  # type: ignore[arg-type]
    with pytest.raises(ConcurrencyUnenforceableError) as caught:
        await worker.run()
    assert caught.value.code == "X_JOB_CONCURRENCY_UNENFORCEABLE"
    assert "capped" in str(caught.value)


async def test_in_process_limits_hand_back_without_spending_attempts(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    bodies = _Peak()

    @task_job(registry, "limited", retry=Retry(attempts=1))
    async def body(input: Task, step: Any, ctx: Any) -> None:
        await bodies.hold(0.01)

    await body.enqueue_many([Task(key=str(n)) for n in range(6)])
    stats = await run_jobs(
        driver, clock=clock, registry=registry, concurrency=6, limits=Limits(per_tenant=2)
    )
    assert bodies.most == 2
    assert stats.outcomes["completed"] == 6
    page = await driver.introspect.list(JobFilter(name="limited"))
    assert all(r.state == JobState.DONE and r.attempt == 1 for r in page.rows)


async def test_per_queue_slots_and_unknown_jobs(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    @task_job(registry, "fast-q", queue="fast")
    async def body(input: Task, step: Any, ctx: Any) -> str:
        return "ok"

    result = await body.enqueue(Task(key="a"))
    other = JobRegistry()
    worker = Worker(driver, queues=["fast"], registry=other, poll_interval="5ms")
    running = asyncio.create_task(worker.run())
    await wait_for(lambda: _async_true(worker.stats().outcomes.get("retried", 0) == 1))
    await worker.stop()
    await running
    row = await state_of(driver, result.id)
    assert row.state == JobState.DELAYED
    assert row.last_error_code == "X_JOB_UNKNOWN"
    with pytest.raises(JobOptionsInvalidError):
        Worker(driver, queues=["fast", "slow"], concurrency={"fast": 2})


async def test_a_row_queued_for_another_tenant_is_refused_before_the_body(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    ran: list[str] = []

    @task_job(registry, "tenant-row")
    async def body(input: Task, step: Any, ctx: Any) -> None:
        ran.append(input.key)

    forged = EnqueueRequest(
        name="tenant-row",
        queue="default",
        input={"key": "a", "org": "org-1", "hold_ms": 0},
        idempotency_key="k",
        tenant_id="org-2",
        max_attempts=3,
        id=new_id(),
        run_id=new_id(),
    )
    result = await driver.enqueue(forged)
    await run_jobs(driver, clock=clock, registry=registry)
    row = await state_of(driver, result.id)
    assert row.state == JobState.DEAD
    assert row.last_error_code == "X_JOB_TENANT_MISMATCH"
    assert ran == []


async def test_the_body_runs_as_its_declared_tenant(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    seen: list[Any] = []

    @task_job(registry, "tenant-ctx")
    async def body(input: Task, step: Any, ctx: Any) -> None:
        actor = current_actor()
        seen.append((actor.org_id if actor else None, ctx.tenant_id))

    await body.enqueue(Task(key="a", org="org-7"))
    await run_jobs(driver, clock=clock, registry=registry)
    assert seen == [("org-7", "org-7")]


async def test_a_failing_body_releases_its_exception(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    import gc
    import weakref

    refs: list[weakref.ref[BaseException]] = []

    class Big(Exception):
        pass

    @task_job(registry, "leaky", retry=Retry(attempts=1))
    async def body(input: Task, step: Any, ctx: Any) -> None:
        payload = bytearray(1_000_000)  # noqa: F841 - a large local the traceback would pin
        error = Big("boom")
        refs.append(weakref.ref(error))
        raise error

    await body.enqueue(Task(key="a"))
    await run_jobs(driver, clock=clock, registry=registry)
    gc.collect()
    assert refs and refs[0]() is None
