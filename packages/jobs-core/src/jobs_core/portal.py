"""The process-wide portal loop: where synchronous code hands the async API its coroutines.

Every ``*_sync`` call outside a worker (a Django or Flask view, a management command, a script)
submits its coroutine to one event loop run by one daemon thread, started on first use. The
driver's pool and its background tasks (the pool's growers and re-dialers) live on that loop for
the life of the process, so a pool opened by the first sync call can still re-dial after an
outage, and many threads share one pool instead of each dialling its own.

Rejected alternatives:

* **A fresh loop per call** (``asyncio.run``, what the sync API did first): the pool's tasks die
  with the first call's loop, later calls meet a pool bound to a closed loop, and the pool cannot
  re-dial after an outage.
* **A loop per thread**: a threaded server (gunicorn ``--threads``) would open one pool per
  thread, multiplying server connections by the thread count.

Fork safety: ``os.register_at_fork`` forgets the parent's loop in the child (its thread does not
exist there) and asks the installed driver for a copy that shares none of the parent's sockets
(:meth:`reopened`, when the driver has it). The child's first sync call starts its own portal.
At interpreter exit the portal closes the installed driver it served, ends the tasks left on its
loop, and stops its thread.
"""

from __future__ import annotations

import asyncio
import atexit
import concurrent.futures
import contextvars
import logging
import os
import threading
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

from jobs_core.errors import SyncCallInLoopError

T = TypeVar("T")

_log = logging.getLogger("jobs.portal")

SHUTDOWN_WAIT_S = 5.0
"""Seconds the exit hook waits for the installed driver to close and the loop to stop."""


class _Portal:
    """One daemon thread running one event loop, for the process that started it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        self.pid = os.getpid()
        self.used = False

    def get_loop(self) -> asyncio.AbstractEventLoop:
        """Answer the running portal loop, starting its thread on first use."""
        loop = self.loop
        if loop is not None and loop.is_running():
            return loop
        with self.lock:
            if self.loop is None or not self.loop.is_running():
                self._start()
            assert self.loop is not None
            return self.loop

    def _start(self) -> None:
        loop = asyncio.new_event_loop()
        ready = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(loop)
            loop.call_soon(ready.set)
            try:
                loop.run_forever()
            finally:
                loop.close()

        thread = threading.Thread(target=serve, name="jobs-portal", daemon=True)
        thread.start()
        ready.wait()
        self.loop, self.thread, self.pid, self.used = loop, thread, os.getpid(), True


_portal = _Portal()

_captures: list[Callable[[], None]] = []


def add_capture(hook: Callable[[], None]) -> None:
    """Run ``hook`` on the caller's thread, inside the copied context, before each submit.

    For integrations whose state is thread-local rather than a context variable: Django keeps
    one connection per thread, so ``jobs_pg.django`` reads the caller's open ``atomic()`` here
    (the portal's thread has no such connection) and sets the context variable the stage reads.
    A hook added twice runs once. What it raises reaches the caller of the ``*_sync`` function.
    """
    if hook not in _captures:
        _captures.append(hook)


def remove_capture(hook: Callable[[], None]) -> None:
    """Stop running ``hook`` (a hook never added is ignored)."""
    if hook in _captures:
        _captures.remove(hook)


def portal_loop() -> asyncio.AbstractEventLoop:
    """Answer the process's portal loop (started on first use, and again after a fork)."""
    return _portal.get_loop()


def on_portal() -> bool:
    """Answer whether the calling thread is the portal loop's thread."""
    thread = _portal.thread
    return thread is not None and thread is threading.current_thread()


def submit(
    coro: Coroutine[Any, Any, T], loop: asyncio.AbstractEventLoop | None = None
) -> concurrent.futures.Future[T]:
    """Start ``coro`` on ``loop`` (the portal by default) in a copy of the caller's context.

    The copy carries the caller's context variables (the driver installed with ``use_driver``,
    the ambient transaction of ``jobs_pg.transaction``) to the task, which
    :func:`asyncio.run_coroutine_threadsafe` would not: it starts the task in the loop's own
    context.

    The hooks of :func:`add_capture` run first, on the caller's thread, in that copy.

    Returns:
        A thread-safe future of the coroutine's result; cancelling it cancels the task.
    """
    target = loop if loop is not None else portal_loop()
    done: concurrent.futures.Future[T] = concurrent.futures.Future()
    context = contextvars.copy_context()
    try:
        for hook in _captures:
            context.run(hook)
    except BaseException:
        coro.close()
        raise

    def settle(task: asyncio.Task[T]) -> None:
        if done.cancelled():
            return
        if task.cancelled():
            done.cancel()
        elif (error := task.exception()) is not None:
            done.set_exception(error)
        else:
            done.set_result(task.result())

    def start() -> None:
        if not done.set_running_or_notify_cancel():
            coro.close()
            return
        task = target.create_task(coro)
        task.add_done_callback(settle)
        done.add_done_callback(
            lambda f: target.call_soon_threadsafe(task.cancel) if f.cancelled() else None
        )

    target.call_soon_threadsafe(start, context=context)
    return done


def run(coro: Coroutine[Any, Any, T], *, twin: str | None = None) -> T:
    """Run ``coro`` on the portal loop from synchronous code and answer its result.

    This is what every ``*_sync`` function does; call it for any coroutine of the async API
    (``run(driver.introspect.get_job(job_id))``). It is safe from many threads at once.

    Args:
        coro: the coroutine to run.
        twin: how to name the async form in the error below (default: the coroutine's name).

    Raises:
        SyncCallInLoopError: ``X_SYNC_IN_LOOP`` on a thread that runs an event loop; ``await``
            the async twin there instead.
        BaseException: whatever ``coro`` raises.
    """
    refuse_in_loop(coro, twin)
    return submit(coro).result()


def refuse_in_loop(coro: Coroutine[Any, Any, Any], twin: str | None = None) -> None:
    """Raise ``SyncCallInLoopError`` (``X_SYNC_IN_LOOP``), closing ``coro``, in a running loop.

    Blocking there would stall that loop, and deadlock when the work needs the same loop.
    """
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return
    name = twin or getattr(coro, "__qualname__", None) or "the async form"
    coro.close()
    raise SyncCallInLoopError(
        f"a *_sync function was called inside a running event loop, which it would block; "
        f"use `await {name}(...)` there instead"
    )


# --- fork and exit ------------------------------------------------------------------------------


def _before_fork() -> None:
    # A fork while another thread holds the lock would leave the child's copy locked for good.
    _portal.lock.acquire()


def _after_fork_parent() -> None:
    _portal.lock.release()


def _after_fork_child() -> None:
    global _portal
    # The portal's thread does not exist in the child; its loop (and the sockets of the pool on
    # it) are the parent's. Abandon them: psycopg closes a connection only in the process that
    # opened it, so dropping them never sends a Terminate on the parent's sockets.
    _portal = _Portal()

    from jobs_core._current import reopen_after_fork

    reopen_after_fork()


os.register_at_fork(
    before=_before_fork, after_in_parent=_after_fork_parent, after_in_child=_after_fork_child
)


def shutdown(timeout: float = SHUTDOWN_WAIT_S) -> None:
    """Close the installed driver on the portal, end the loop's tasks, and stop its thread.

    Called at interpreter exit; safe to call earlier (the next sync call starts a new portal,
    with the installed driver re-dialling on it). Does nothing if this process never used it.
    """
    portal = _portal
    if not portal.used or portal.pid != os.getpid():
        return
    loop, thread = portal.loop, portal.thread
    if loop is None or thread is None or not loop.is_running():
        return
    from jobs_core._current import close_portal_driver, end_leftovers

    try:
        submit(close_portal_driver(), loop).result(timeout)
        submit(end_leftovers(), loop).result(timeout)
    except Exception as exc:  # an exit hook must not raise; say what was left behind
        _log.warning(
            "jobs.portal.shutdown-incomplete",
            extra={"event": "jobs.portal.shutdown-incomplete", "error": type(exc).__name__},
        )
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout)
    with portal.lock:
        portal.loop, portal.thread = None, None


atexit.register(shutdown)
