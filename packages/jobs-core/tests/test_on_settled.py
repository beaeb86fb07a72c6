"""on_settled: told once per ending, every ending outcome, never changing the row."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

from jobs_core import Concurrency, JobRegistry, JobState, Retry, Settled, current_actor, job
from jobs_core.driver import LeaseRequest
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.testing import ManualClock, run_jobs


class Item(BaseModel):
    key: str
    org: str = "org-1"
    fail: bool = False


def item_job(registry: JobRegistry, name: str, **options: Any) -> Any:
    return job(
        input=Item,
        idempotency_key=lambda i: f"{name}:{i.key}",
        tenant=lambda i: i.org,
        name=name,
        registry=registry,
        **options,
    )


async def test_each_ending_is_told_once_with_its_details(
    driver: MemoryDriver, clock: ManualClock, registry: JobRegistry
) -> None:
    told: list[tuple[str, Any, Any, Any, str | None]] = []

    async def hook(settled: Settled) -> None:
        actor = current_actor()
        told.append(
            (
                settled.outcome,
                settled.input.key if settled.input else None,
                settled.result,
                settled.code,
                actor.org_id if actor else None,
            )
        )

    @item_job(registry, "told", on_settled=hook, retry=Retry(attempts=2))
    async def body(input: Item, step: Any, ctx: Any) -> str:
        await step.sleep("1m")
        if input.fail:
            raise PermissionError("nope")
        return f"done:{input.key}"

    @item_job(registry, "told-drop", on_settled=hook, retry=Retry(attempts=2, dead_letter=False))
    async def dropped(input: Item, step: Any, ctx: Any) -> None:
        raise RuntimeError("again")

    @item_job(
        registry,
        "told-busy",
        on_settled=hook,
        concurrency=Concurrency(key=lambda i: i.key, when_busy="fail"),
    )
    async def busy(input: Item, step: Any, ctx: Any) -> None:
        raise AssertionError("never runs")

    await driver.leases.acquire(LeaseRequest("job-key:told-busy:b", 1, "other", 600_000))
    await body.enqueue(Item(key="ok", org="org-3"))
    await body.enqueue(Item(key="bad", fail=True))
    await dropped.enqueue(Item(key="d"))
    await busy.enqueue(Item(key="b"))
    await run_jobs(driver, clock=clock, registry=registry)
    assert sorted(told, key=str) == sorted(
        [
            ("completed", "ok", "done:ok", None, "org-3"),
            ("dead-lettered", "bad", None, None, "org-1"),
            ("dropped", "d", None, "X_JOB_MAX_ATTEMPTS", "org-1"),
            ("refused", "b", None, "X_JOB_KEY_BUSY", "org-1"),
        ],
        key=str,
    )


async def test_a_failing_hook_is_tried_three_times_and_never_changes_the_row(
    driver: MemoryDriver,
    clock: ManualClock,
    registry: JobRegistry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[str] = []

    def hook(settled: Settled) -> None:
        calls.append(settled.outcome)
        raise ValueError("hook broke")

    @item_job(registry, "bad-hook", on_settled=hook)
    async def body(input: Item, step: Any, ctx: Any) -> str:
        return "fine"

    result = await body.enqueue(Item(key="a"))
    await run_jobs(driver, clock=clock, registry=registry)
    row = await driver.introspect.get(result.id)
    assert row is not None and row.state == JobState.DONE and row.result == "fine"
    assert calls == ["completed"] * 3
    failed = [r for r in caplog.records if r.message == "jobs.on-settled.failed"]
    assert len(failed) == 1
    assert failed[0].code == "X_JOB_ON_SETTLED_FAILED"  # type: ignore[attr-defined]


async def test_a_slow_hook_is_bounded_by_its_timeout(
    driver: MemoryDriver,
    clock: ManualClock,
    registry: JobRegistry,
    caplog: pytest.LogCaptureFixture,
) -> None:
    import asyncio

    async def hook(settled: Settled) -> None:
        await asyncio.sleep(10)

    @item_job(registry, "slow-hook", on_settled=hook, on_settled_timeout="100ms")
    async def body(input: Item, step: Any, ctx: Any) -> None:
        return None

    await body.enqueue(Item(key="a"))
    loop = asyncio.get_running_loop()
    started = loop.time()
    await run_jobs(driver, clock=clock, registry=registry, timeout="5s")
    assert loop.time() - started < 3
    assert any(r.message == "jobs.on-settled.failed" for r in caplog.records)
