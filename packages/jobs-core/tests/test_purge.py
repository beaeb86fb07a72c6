"""purge(): one step per target, one clock reading per pass, duplicate names refused; the
retention targets as a nightly task on the memory driver."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest
from pydantic import BaseModel

from jobs_core import (
    DEFAULT_PURGE_CRON,
    JobRegistry,
    JobState,
    PurgeTarget,
    Retry,
    TaskRegistry,
    events_purge_target,
    job,
    publish_event,
    purge,
    retention_targets,
    task,
)
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.errors import JobDeclarationInvalidError
from jobs_core.testing import ManualClock, run_jobs, use_driver
from jobs_core.types import RetentionRequest


class Item(BaseModel):
    n: int


async def test_one_step_per_target_each_handed_the_passs_one_clock_reading(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    seen: list[tuple[str, datetime | None]] = []

    def sessions(now: datetime) -> int:
        clock.advance("1s")  # time moves between targets; the pass's instant does not
        seen.append(("sessions", now))
        return 4

    async def uploads(now: datetime) -> int:
        seen.append(("uploads", now))
        return 2

    def no_instant() -> int:
        seen.append(("plain", None))
        return 0

    sweep = purge(
        name="p.one",
        targets=[
            PurgeTarget("sessions", sessions),
            PurgeTarget("uploads", uploads),
            PurgeTarget("plain", no_instant),
            events_purge_target(driver.events),
        ],
        registry=registry,
    )
    started = clock.now()
    result = await sweep.enqueue({})
    await run_jobs(driver, registry=registry, clock=clock)
    info = await driver.introspect.get(result.id)
    assert info.state == JobState.DONE
    assert info.result == {
        "at": started.isoformat(),
        "removed": {"sessions": 4, "uploads": 2, "plain": 0, "events": 0},
    }
    assert [s.name for s in info.steps] == [
        "now",
        "target:sessions",
        "target:uploads",
        "target:plain",
        "target:events",
    ]
    assert seen == [("sessions", started), ("uploads", started), ("plain", None)]


async def test_a_retried_pass_hands_its_targets_the_same_instant(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    calls: list[datetime] = []

    def flaky(now: datetime) -> int:
        calls.append(now)
        if len(calls) == 1:
            raise ConnectionError("the store blinked")
        return 1

    sweep = purge(
        name="p.retried",
        targets=[PurgeTarget("flaky", flaky)],
        retry=Retry(attempts=2, delay="1s"),
        registry=registry,
    )
    result = await sweep.enqueue({})
    await run_jobs(driver, registry=registry, clock=clock)
    assert (await driver.introspect.get(result.id)).attempt == 2
    assert len(calls) == 2 and calls[0] == calls[1], "the clock reading is a step: replayed"


def test_two_targets_of_one_name_are_refused_at_declaration(registry: JobRegistry) -> None:
    with pytest.raises(JobDeclarationInvalidError) as refused:
        purge(
            name="p.dup",
            targets=[PurgeTarget("a", lambda now: 0), PurgeTarget("a", lambda now: 0)],
            registry=registry,
        )
    assert refused.value.code == "X_JOB_DECLARATION_INVALID"
    assert "a second target named 'a'" in str(refused.value)
    with pytest.raises(JobDeclarationInvalidError, match="not a purge target"):
        purge(name="p.bad", targets=[object()], registry=registry)  # type: ignore[list-item]
    assert registry.all() == []


async def test_targets_built_at_the_pass_are_checked_before_any_delete(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    deleted: list[str] = []

    def first(now: datetime) -> int:
        deleted.append("first")
        return 1

    sweep = purge(
        name="p.late-dup",
        targets=lambda: [PurgeTarget("x", first), PurgeTarget("x", first)],
        registry=registry,
    )
    result = await sweep.enqueue({})
    await run_jobs(driver, registry=registry, clock=clock)
    info = await driver.introspect.get(result.id)
    assert info.state == JobState.DEAD and info.last_error_code == "X_JOB_DECLARATION_INVALID"
    assert deleted == [] and info.attempt == 1, "terminal, before any target ran"


class CountingRetention:
    """The memory driver's retention store, counting the calls a sweep makes."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.calls: list[RetentionRequest] = []

    async def purge_settled(self, req: RetentionRequest) -> int:
        self.calls.append(req)
        return int(await self.inner.purge_settled(req))


async def test_the_nightly_task_is_a_retention_sweep_in_bounded_batches(
    clock: ManualClock, registry: JobRegistry
) -> None:
    """task(cron=DEFAULT_PURGE_CRON, tz="UTC") firing purge(retention_targets()) deletes the
    done rows older than done_retention and the dead ones older than dead_retention, with their
    steps, a batch at a time; newer rows and live ones stay."""
    driver = MemoryDriver(clock=clock)
    counting = CountingRetention(driver.retention)
    driver.retention = counting  # type: ignore[assignment]

    @job(
        input=Item,
        idempotency_key=lambda i: str(i.n),
        tenant="none",
        name="p.work",
        retry=Retry(attempts=1),
        registry=registry,
    )
    async def work(item: Item, step: Any, ctx: Any) -> None:
        await step.run("effect", lambda: item.n)
        if item.n >= 100:
            raise PermissionError("refused for good")

    sweep = purge(
        name="p.retention", targets=retention_targets("7d", "30d", batch=2), registry=registry
    )
    nightly = task(
        cron=DEFAULT_PURGE_CRON,
        tz="UTC",
        enqueue=lambda at: [(sweep, {})],
        name="p.nightly",
        registry=TaskRegistry(),
    )
    with use_driver(driver):
        await work.enqueue_many([Item(n=n) for n in (1, 2, 3, 4, 5, 100, 101)])
        await run_jobs(driver, registry=registry, clock=clock)
        old_runs = [r.run_id for r in (await driver.introspect.list(_filter())).rows]
        await publish_event("old", {}, ttl="1d")
        clock.advance("8d")
        await work.enqueue(Item(n=6))
        await run_jobs(driver, registry=registry, clock=clock)
        [fired] = await nightly.enqueue()
        await run_jobs(driver, registry=registry, clock=clock)
        info = await driver.introspect.get(fired.id)
        assert info.result["removed"] == {"jobs.done": 5, "jobs.dead": 0, "events": 1}
        # Five done rows at two per call: three calls; one more finds no dead row.
        assert [len(c.states) for c in counting.calls] == [3, 3, 3, 1]
        assert all(c.limit == 2 for c in counting.calls)
        left = {r.input["n"] for r in (await driver.introspect.list(_filter())).rows if r.input}
        assert left == {6, 100, 101}
        for run_id in old_runs:
            steps = await driver.steps.load(run_id)
            assert steps == [] or steps[0].output in (100, 101)
        clock.advance("23d")
        [again] = await nightly.enqueue()
        await run_jobs(driver, registry=registry, clock=clock)
        removed = (await driver.introspect.get(again.id)).result["removed"]
        assert removed["jobs.dead"] == 2
        assert removed["jobs.done"] >= 1, "the newer done row (and the first sweep's own row)"
    await driver.close()


def _filter() -> Any:
    from jobs_core.types import JobFilter

    return JobFilter(name="p.work", limit=200)


def test_retention_targets_refuse_bad_settings() -> None:
    with pytest.raises(JobDeclarationInvalidError) as refused:
        retention_targets("0s", "soon", batch=0)
    fields = [p.split(":")[0] for p in refused.value.meta["problems"]]
    assert fields == ["done_retention", "dead_retention", "batch"]
    assert [t.name for t in retention_targets(events=False)] == ["jobs.done", "jobs.dead"]
    assert DEFAULT_PURGE_CRON == "17 3 * * *"
