"""The portal loop: every sync call of the process runs on one loop, on one thread, in its caller's
context; an async caller on another loop hops to the installed driver's home; exit ends it all.

The pg must-shows (32 threads on one pool, an outage, a fork) live in jobs-pg's test_portal_pg.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from typing import Any

import pytest
from pydantic import BaseModel

from jobs_core import JobRegistry, install_driver, job, portal, use_driver
from jobs_core._current import run_sync
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.errors import DriverUnavailableError, SyncCallInLoopError
from jobs_core.types import EnqueueResult


class Note(BaseModel):
    n: int


async def _noop(input: Note, step: Any, ctx: Any) -> None:
    return None


def note_job(registry: JobRegistry) -> Any:
    return job(
        input=Note, idempotency_key=lambda i: f"note:{i.n}", tenant="none", registry=registry
    )(_noop)


class ThreadRecordingDriver(MemoryDriver):
    """A memory driver that records the thread each enqueue ran on (``enqueue`` delegates to
    ``enqueue_many``, so one record per call)."""

    def __init__(self) -> None:
        super().__init__()
        self.threads: list[str] = []

    async def enqueue_many(self, reqs: Any) -> list[EnqueueResult]:
        self.threads.append(threading.current_thread().name)
        return await super().enqueue_many(reqs)


@pytest.fixture
def installed() -> Iterator[ThreadRecordingDriver]:
    mem = ThreadRecordingDriver()
    install_driver(mem)
    yield mem
    install_driver(None)


def test_sync_calls_from_many_threads_share_one_loop_on_one_thread() -> None:
    async def where() -> tuple[int, str]:
        return id(asyncio.get_running_loop()), threading.current_thread().name

    with ThreadPoolExecutor(max_workers=16) as pool:
        seen = set(pool.map(lambda _: run_sync(where()), range(200)))
    assert seen == {(id(portal.portal_loop()), "jobs-portal")}


def test_enqueue_sync_from_32_threads_lands_every_row(
    registry: JobRegistry, installed: ThreadRecordingDriver
) -> None:
    handle = note_job(registry)

    def burst(t: int) -> None:
        for i in range(50):
            handle.enqueue_sync(Note(n=t * 1000 + i))

    with ThreadPoolExecutor(max_workers=32) as pool:
        list(pool.map(burst, range(32)))
    assert installed.live_count() == 32 * 50
    assert set(installed.threads) == {"jobs-portal"}


def test_a_sync_call_carries_the_callers_context_variables() -> None:
    var: ContextVar[str] = ContextVar("portal_test", default="unset")

    async def read() -> str:
        return var.get()

    var.set("caller's")
    assert run_sync(read()) == "caller's"


def test_use_driver_in_sync_code_reaches_the_portal_task(registry: JobRegistry) -> None:
    handle = note_job(registry)
    mem = MemoryDriver()
    with use_driver(mem):
        handle.enqueue_sync(Note(n=1))
        handle.enqueue_many_sync([Note(n=2), Note(n=3)])
    assert mem.live_count() == 3


def test_an_async_enqueue_on_another_loop_hops_to_the_drivers_home(
    registry: JobRegistry, installed: ThreadRecordingDriver
) -> None:
    handle = note_job(registry)
    handle.enqueue_sync(Note(n=1))  # first use: the portal becomes the driver's home

    async def from_an_app_loop() -> None:
        await handle.enqueue(Note(n=2))
        await handle.enqueue_many([Note(n=3)])

    asyncio.run(from_an_app_loop())
    assert installed.threads == ["jobs-portal"] * 3
    assert installed.live_count() == 3


def test_a_driver_first_used_on_a_running_loop_serves_sync_threads_there(
    registry: JobRegistry, installed: ThreadRecordingDriver
) -> None:
    """A FastAPI app's loop owns the driver; its sync routes (a thread pool) enqueue onto it."""
    handle = note_job(registry)

    async def app() -> None:
        await handle.enqueue(Note(n=1))
        await asyncio.to_thread(handle.enqueue_sync, Note(n=2))

    threading.current_thread().name = "app-main"
    try:
        asyncio.run(app())
    finally:
        threading.current_thread().name = "MainThread"
    assert installed.threads == ["app-main", "app-main"]


async def test_a_sync_call_in_a_running_loop_names_the_async_twin(registry: JobRegistry) -> None:
    handle = note_job(registry)
    with pytest.raises(SyncCallInLoopError) as raised:
        handle.enqueue_many_sync([Note(n=1)])
    assert raised.value.code == "X_SYNC_IN_LOOP"
    assert "await JobHandle.enqueue_many(...)" in str(raised.value)


def test_shutdown_ends_the_tasks_left_on_the_loop_and_stops_its_thread() -> None:
    """psycopg-pool's dial task catches ``CancelledError`` once and retries: the exit hook cancels
    until such a task ends, then stops the thread; the next sync call starts a fresh portal."""
    swallowed: list[bool] = []

    async def stubborn() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            swallowed.append(True)
            await asyncio.sleep(3600)

    async def call() -> str:
        asyncio.get_running_loop().create_task(stubborn())
        await asyncio.sleep(0)
        return "answered"

    assert run_sync(call()) == "answered"
    assert swallowed == []  # a task left by a sync call keeps running (a pool's re-dialer)
    old = portal.portal_loop()
    thread = portal._portal.thread
    portal.shutdown()
    assert swallowed == [True]
    assert thread is not None and not thread.is_alive()
    assert old.is_closed()

    async def ping() -> str:
        return "again"

    assert run_sync(ping()) == "again"
    assert portal.portal_loop() is not old


def test_shutdown_closes_the_installed_driver_whose_home_is_the_portal(
    registry: JobRegistry, installed: ThreadRecordingDriver
) -> None:
    note_job(registry).enqueue_sync(Note(n=1))
    closed: list[bool] = []
    original = installed.close

    async def close() -> None:
        closed.append(True)
        await original()

    installed.close = close  # type: ignore[method-assign]
    portal.shutdown()
    assert closed == [True]


async def test_the_lifespan_installs_the_driver_on_the_apps_loop_and_closes_it(
    registry: JobRegistry,
) -> None:
    """What a FastAPI app gets: async routes and thread-pool sync routes share its loop's pool."""
    from jobs_core.lifespan import jobs_lifespan

    mem = ThreadRecordingDriver()
    closed: list[bool] = []
    original = mem.close

    async def close() -> None:
        closed.append(True)
        await original()

    mem.close = close  # type: ignore[method-assign]
    handle = note_job(registry)
    here = threading.current_thread().name
    async with jobs_lifespan(driver=mem)(object()):
        await handle.enqueue(Note(n=1))
        await asyncio.to_thread(handle.enqueue_sync, Note(n=2))
        assert mem.live_count() == 2
    assert mem.threads == [here, here]
    assert closed == [True]
    with pytest.raises(DriverUnavailableError):
        await handle.enqueue(Note(n=3))


def test_the_lifespan_takes_exactly_one_of_url_and_driver() -> None:
    from jobs_core.lifespan import jobs_lifespan

    with pytest.raises(ValueError, match="exactly one"):
        jobs_lifespan()
    with pytest.raises(ValueError, match="exactly one"):
        jobs_lifespan("memory://", driver=MemoryDriver())
