"""Which driver an enqueue goes to, and which event loop sync callers hand work to.

The driver is looked up context-first (a :class:`~contextvars.ContextVar` set by
:func:`use_driver` or by the worker for its bodies), then process-wide (:func:`install_driver`).
A sync body runs in a worker thread; its ``enqueue_sync`` must run on the loop that owns the
driver's connections, which the worker records here as the *home loop* of the body's context.
Elsewhere a sync call runs on the loop the process-wide driver lives on: the loop of its first
use through the enqueue API, which is the portal loop (:mod:`jobs_core.portal`) when that first
use is a sync call. An async enqueue made on another loop hops to that loop, so one pool serves
sync and async callers alike.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Coroutine, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

from jobs_core.driver import JobDriver
from jobs_core.errors import DriverUnavailableError
from jobs_core.portal import portal_loop, refuse_in_loop, submit

T = TypeVar("T")

_installed: JobDriver | None = None
# The loop the installed driver's connections live on (see the module docstring), under a lock:
# two threads' first calls must agree on one.
_installed_home: asyncio.AbstractEventLoop | None = None
_home_lock = threading.Lock()
_context_driver: ContextVar[JobDriver | None] = ContextVar("jobs_driver", default=None)
_home_loop: ContextVar[asyncio.AbstractEventLoop | None] = ContextVar(
    "jobs_home_loop", default=None
)


def install_driver(
    driver: JobDriver | None, *, loop: asyncio.AbstractEventLoop | None = None
) -> None:
    """Install ``driver`` process-wide for every enqueue that has no context driver.

    ``None`` uninstalls it.

    Args:
        driver: the driver, or ``None``.
        loop: the loop its connections live on (an ASGI app's, installed from its lifespan):
            sync calls from other threads run there. By default it is the loop of the driver's
            first use (see the module docstring).
    """
    global _installed, _installed_home
    with _home_lock:
        _installed, _installed_home = driver, loop


def _installed_home_for(here: asyncio.AbstractEventLoop | None) -> asyncio.AbstractEventLoop:
    """Answer the installed driver's home loop, making ``here`` (or the portal) it if none is.

    A home that stopped (the ``asyncio.run`` of a script that ended) is replaced the same way.
    """
    global _installed_home
    with _home_lock:
        home = _installed_home
        if home is None or not home.is_running():
            home = _installed_home = here if here is not None else portal_loop()
        return home


STALE_RETRIES = 3
"""How many more times :func:`call_driver` tries a call that failed on a stale connection."""

STALE_FAST_S = 1.0
"""A failure that came within this many seconds counts as a stale connection (see below)."""

STALE_BACKOFF_S = (0.05, 0.25, 1.0)
"""Seconds before each retry: the driver re-checks its idle connections meanwhile."""


async def call_driver(call: Callable[[JobDriver], Coroutine[Any, Any, T]]) -> T:
    """Await ``call(current_driver())`` on the loop that driver's connections live on.

    A context driver (``use_driver``, a worker's body) runs here. The process-wide one runs on
    its home loop: here when this is its first use, else a hop to its home (the portal loop,
    when sync code used it first), since a psycopg or redis pool serves only its own loop.

    Only idempotent calls come here (an enqueue carries its job id, so a second try answers the
    row the first one made): a call that failed with ``X_DRIVER_UNAVAILABLE`` at once is tried
    again, up to :data:`STALE_RETRIES` times. After a server restart every idle pooled
    connection is dead, and the first calls meet them one by one while the pool re-dials. A
    server that is down makes the pool wait its timeout, which is longer than
    :data:`STALE_FAST_S`, and that failure is reported at once.

    Raises:
        DriverUnavailableError: ``X_DRIVER_UNAVAILABLE`` as :func:`current_driver`, or from the
            driver when the server cannot be reached.
    """
    driver = current_driver()
    if _context_driver.get() is None:
        here = asyncio.get_running_loop()
        home = _installed_home_for(here)
        if home is not here:
            return await asyncio.wrap_future(submit(_retrying(call, driver), home))
    return await _retrying(call, driver)


async def _retrying(call: Callable[[JobDriver], Coroutine[Any, Any, T]], driver: JobDriver) -> T:
    loop = asyncio.get_running_loop()
    for pause in (*STALE_BACKOFF_S[:STALE_RETRIES], None):
        started = loop.time()
        try:
            return await call(driver)
        except DriverUnavailableError:
            if pause is None or loop.time() - started > STALE_FAST_S:
                raise
        await asyncio.sleep(pause)
    raise AssertionError("unreachable: the last round re-raises")


def reopen_after_fork() -> None:
    """In a forked child: swap the installed driver for one sharing no socket with the parent.

    A driver with ``reopened()`` answers a fresh copy of its configuration (its pool dials
    anew on the child's portal loop); one without it is kept (its client must be fork-aware,
    as redis-py's pools are).
    """
    global _installed, _installed_home
    _home_lock_reset()
    reopened = getattr(_installed, "reopened", None)
    if callable(reopened):
        _installed = reopened()
    _installed_home = None


def _home_lock_reset() -> None:
    # Another thread of the parent may have held the lock at the fork; the child has no such
    # thread, so it starts with a fresh one.
    global _home_lock
    _home_lock = threading.Lock()


async def close_portal_driver() -> None:
    """Close the installed driver if the portal loop is its home (the portal's exit hook)."""
    driver, home = _installed, _installed_home
    if driver is not None and home is asyncio.get_running_loop():
        await driver.close()


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


def run_sync(coro: Coroutine[Any, Any, T], *, twin: str | None = None) -> T:
    """Run ``coro`` to completion from synchronous code and answer its result.

    In a worker thread of a sync body, the coroutine runs on the worker's loop (the driver's
    connections live there). Elsewhere it runs on the process-wide driver's home loop (the
    portal loop, unless an async caller used that driver first on a loop still running), in a
    copy of the caller's context.

    Args:
        coro: the coroutine to run.
        twin: the async form's name for the error below (default: the coroutine's own).

    Raises:
        SyncCallInLoopError: ``X_SYNC_IN_LOOP`` from a thread that is running an event loop;
            the message names the async twin to ``await``.
    """
    refuse_in_loop(coro, twin)
    loop = _home_loop.get()
    if loop is None or not loop.is_running():
        loop = _installed_home_for(None) if _context_driver.get() is None else portal_loop()
    return submit(coro, loop).result()


LEFTOVER_ROUNDS = 10
"""How many times a sync call's closing loop cancels the tasks still running in it."""

LEFTOVER_WAIT_S = 0.1
"""Seconds each round waits for the cancelled tasks to end (a round ends sooner once they have)."""


async def end_leftovers() -> None:
    """Cancel the tasks still running in a closing loop, again while any survives a round.

    The portal's exit hook runs it before it stops the loop.

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
