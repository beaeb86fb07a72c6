"""Child jobs on the memory driver: what the conformance area does not cover per driver.

Options a child enqueue refuses, the child's code on the parent, ``cancel_children=False``, a
sync body's blocking facade, a driver without the capability, and one parent slot at a time.
"""

from __future__ import annotations

import asyncio
from typing import Any

from pydantic import BaseModel

from jobs_core import JobRegistry, Retry, classify, job, use_driver
from jobs_core import introspect as ops
from jobs_core.children import CHILD_SETTLED, child_ids, child_key
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.testing import run_jobs
from jobs_core.worker import Worker

NOPE = "X_TEST_CHILD_NOPE"
classify({NOPE: "terminal"})


class Nope(Exception):
    code = NOPE


class N(BaseModel):
    n: int
    fail: bool = False


def _declare(registry: JobRegistry) -> tuple[Any, Any]:
    @job(
        input=N,
        idempotency_key=lambda i: str(i.n),
        tenant="none",
        name="t.kid",
        retry=Retry(attempts=1),
        registry=registry,
    )
    async def kid(input: N, step: Any, ctx: Any) -> int:
        if input.fail:
            raise Nope("no")
        return input.n + 1

    return kid, registry


async def _run(mem: MemoryDriver, registry: JobRegistry, concurrency: int = 4) -> Any:
    return await run_jobs(mem, registry=registry, concurrency=concurrency, timeout="20s")


async def test_invoke_answers_the_child_result_and_derives_ids_and_key() -> None:
    mem = MemoryDriver()
    kid, registry = _declare(JobRegistry())

    @job(input=N, idempotency_key=lambda i: str(i.n), tenant="none", name="t.p", registry=registry)
    async def parent(input: N, step: Any, ctx: Any) -> int:
        return int(str(await step.invoke("one", kid, N(n=input.n))))

    with use_driver(mem):
        res = await parent.enqueue(N(n=41))
    await _run(mem, registry, concurrency=1)
    info = await mem.introspect.get(res.id)
    assert info is not None and (info.state.value, info.result) == ("done", 42)
    # Parks spend no attempt: the parent parked, was woken by its child, and completed.
    assert info.attempt <= 1 and info.claim >= 2
    (row,) = await mem.children.children(res.run_id)
    job_id, run_id = child_ids(res.run_id, "one", 0)
    assert (row.id, row.run_id, row.parent_run_id) == (job_id, run_id, res.run_id)
    assert row.idempotency_key == child_key(res.run_id, "one", 0)
    (step,) = info.steps
    assert (step.name, step.status, step.event, step.output) == (
        "one",
        "completed",
        CHILD_SETTLED,
        42,
    )


async def test_the_parent_fails_with_the_childs_code() -> None:
    mem = MemoryDriver()
    kid, registry = _declare(JobRegistry())

    @job(
        input=N,
        idempotency_key=lambda i: str(i.n),
        tenant="none",
        name="t.p",
        retry=Retry(attempts=3, delay="10ms"),
        registry=registry,
    )
    async def parent(input: N, step: Any, ctx: Any) -> None:
        await step.invoke("one", kid, N(n=1, fail=True))

    with use_driver(mem):
        res = await parent.enqueue(N(n=1))
    await _run(mem, registry)
    info = await mem.introspect.get(res.id)
    assert info is not None
    assert (info.state.value, info.last_error_code) == ("dead", NOPE)
    assert "child #0 t.kid" in (info.last_error or "") and "X_TEST_CHILD_NOPE" in info.last_error
    # Terminal: the parent spent one attempt of its three.
    assert info.attempt == 1
    (step,) = info.steps
    assert step.status == "failed"


async def test_ids_run_ids_and_keys_cannot_be_passed_to_a_child() -> None:
    mem = MemoryDriver()
    kid, registry = _declare(JobRegistry())

    @job(input=N, idempotency_key=lambda i: str(i.n), tenant="none", name="t.p", registry=registry)
    async def parent(input: N, step: Any, ctx: Any) -> None:
        await step.invoke("one", kid, N(n=1), run_id=None)

    with use_driver(mem):
        res = await parent.enqueue(N(n=1))
    await _run(mem, registry)
    info = await mem.introspect.get(res.id)
    assert info is not None and info.last_error_code == "X_JOB_OPTIONS_INVALID"
    assert await mem.children.children(res.run_id) == []


async def test_cancel_children_false_leaves_the_children_running() -> None:
    mem = MemoryDriver()
    kid, registry = _declare(JobRegistry())

    @job(input=N, idempotency_key=lambda i: str(i.n), tenant="none", name="t.p", registry=registry)
    async def parent(input: N, step: Any, ctx: Any) -> None:
        await step.gather("all", [(kid, N(n=1)), (kid, N(n=2))], cancel_children=False)

    with use_driver(mem):
        res = await parent.enqueue(N(n=1), queue="parents")
    # Only the parent's queue is served: the children stay queued while it parks.
    worker = Worker(mem, queues=["parents"], registry=registry, poll_interval="5ms")
    task = asyncio.create_task(worker.run())
    for _ in range(400):
        row = await mem.introspect.get(res.id)
        if row is not None and row.state.value == "suspended":
            break
        await asyncio.sleep(0.005)
    await worker.stop()
    await task
    assert row is not None and row.state.value == "suspended"
    await ops.cancel(mem, res.id)
    states = {row.state.value for row in await mem.children.children(res.run_id)}
    assert states == {"ready"}


def test_a_sync_body_gathers_through_the_blocking_facade() -> None:
    mem = MemoryDriver()
    kid, registry = _declare(JobRegistry())

    @job(input=N, idempotency_key=lambda i: str(i.n), tenant="none", name="t.p", registry=registry)
    def parent(input: N, step: Any, ctx: Any) -> list[Any]:
        return list(step.gather("all", [(kid, N(n=i)) for i in range(3)]))

    async def go() -> Any:
        with use_driver(mem):
            res = await parent.enqueue(N(n=1))
        await _run(mem, registry)
        return await mem.introspect.get(res.id)

    info = asyncio.run(go())
    assert info is not None and info.result == [1, 2, 3]


async def test_without_the_children_capability_invoke_is_not_implemented() -> None:
    mem = MemoryDriver()
    mem.capabilities = mem.capabilities - {"children"}
    kid, registry = _declare(JobRegistry())

    @job(input=N, idempotency_key=lambda i: str(i.n), tenant="none", name="t.p", registry=registry)
    async def parent(input: N, step: Any, ctx: Any) -> None:
        await step.invoke("one", kid, N(n=1))

    with use_driver(mem):
        res = await parent.enqueue(N(n=1))
    await _run(mem, registry)
    info = await mem.introspect.get(res.id)
    assert info is not None and info.last_error_code == "X_NOT_IMPLEMENTED"
