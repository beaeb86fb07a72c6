"""Which driver an enqueue goes to, and which event loop sync callers hand work to.

The driver is looked up context-first (a :class:`~contextvars.ContextVar` set by
:func:`use_driver` or by the worker for its bodies), then process-wide (:func:`install_driver`).
A sync body runs in a worker thread; its ``enqueue_sync`` must run on the loop that owns the
driver's connections, which the worker records here as the *home loop* of the body's context.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

from jobs_core.driver import JobDriver
from jobs_core.errors import DriverUnavailableError

T = TypeVar("T")

_installed: JobDriver | None = None
_context_driver: ContextVar[JobDriver | None] = ContextVar("jobs_driver", default=None)
_home_loop: ContextVar[asyncio.AbstractEventLoop | None] = ContextVar(
    "jobs_home_loop", default=None
)


def install_driver(driver: JobDriver | None) -> None:
    """Install ``driver`` process-wide for every enqueue that has no context driver.

    ``None`` uninstalls it.
    """
    global _installed
    _installed = driver


def current_driver() -> JobDriver:
    """Answer the driver an enqueue made here would use.

    Raises:
        DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` when none is installed (never drop a job).
    """
    driver = _context_driver.get() or _installed
    if driver is None:
        raise DriverUnavailableError(
            "no driver is installed: call install_driver(open_driver(url)), use "
            "jobs_core.testing.use_driver(driver), or enqueue from inside a worker"
        )
    return driver


@contextmanager
def use_driver(driver: JobDriver) -> Iterator[JobDriver]:
    """Install ``driver`` for the current context only (tasks created inside inherit it)."""
    token = _context_driver.set(driver)
    try:
        yield driver
    finally:
        _context_driver.reset(token)


@contextmanager
def home_loop(loop: asyncio.AbstractEventLoop) -> Iterator[None]:
    """Record ``loop`` as the loop sync code in this context hands coroutines to."""
    token = _home_loop.set(loop)
    try:
        yield
    finally:
        _home_loop.reset(token)


def bind_worker(driver: JobDriver, loop: asyncio.AbstractEventLoop) -> None:
    """Set ``driver`` and the home ``loop`` in the current context, with no reset.

    For a context made to be copied into each attempt's task (``Context.run(bind_worker, ...)``):
    one binding then serves every attempt, instead of a ``use_driver`` and a :func:`home_loop`
    block entered and left per job.
    """
    _context_driver.set(driver)
    _home_loop.set(loop)


def run_sync(coro: Coroutine[Any, Any, T]) -> T:
    """Run ``coro`` to completion from synchronous code and answer its result.

    In a worker thread of a sync body, the coroutine runs on the worker's loop (the driver's
    connections live there). With no home loop it runs in a fresh loop, as :func:`asyncio.run`
    would, except that tasks it leaves running are cancelled until they end
    (:func:`_end_leftovers`).

    Raises:
        RuntimeError: called from a thread that is running an event loop (``await`` instead).
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        pass
    else:
        coro.close()
        raise RuntimeError("a *_sync call was made on a running event loop; await the async form")
    loop = _home_loop.get()
    if loop is not None and loop.is_running():
        return asyncio.run_coroutine_threadsafe(coro, loop).result()
    with asyncio.Runner() as runner:
        try:
            return runner.run(coro)
        finally:
            runner.run(_end_leftovers())


LEFTOVER_ROUNDS = 10
"""How many times a sync call's closing loop cancels the tasks still running in it."""

LEFTOVER_WAIT_S = 0.1
"""Seconds each round waits for the cancelled tasks to end (a round ends sooner once they have)."""


async def _end_leftovers() -> None:
    """Cancel the tasks still running in a closing loop, again while any survives a round.

    ``asyncio.run`` cancels them once and waits for all of them. A task that swallows the
    cancellation then never ends, and neither does the sync call: psycopg-pool retries a
    connection whose set-up was cancelled (its task catches ``CancelledError``), which a
    ``*_sync`` call met whenever it returned while the pool was still dialling its second
    connection. A task that still runs after :data:`LEFTOVER_ROUNDS` rounds is left to the
    loop's close.
    """
    me = asyncio.current_task()
    for _ in range(LEFTOVER_ROUNDS):
        left = [task for task in asyncio.all_tasks() if task is not me and not task.done()]
        if not left:
            return
        for task in left:
            task.cancel()
        await asyncio.wait(left, timeout=LEFTOVER_WAIT_S)
