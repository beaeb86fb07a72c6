"""Run blocking code on a thread of its own and await it.

Sync bodies, sync step functions and sync hooks each get a fresh daemon thread. A fixed pool was
rejected: a thread abandoned by a timeout cannot be stopped in Python, so every hung call would
keep one of a pool's few threads for good and unrelated jobs would queue behind it; and a pool's
non-daemon threads keep the process alive past its drain budget. A thread costs tens of
microseconds to start, which is small beside any I/O a job does.
"""

from __future__ import annotations

import asyncio
import contextvars
import threading
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def run_in_thread(fn: Callable[..., T], *args: Any, **kwargs: Any) -> asyncio.Future[T]:
    """Start ``fn(*args, **kwargs)`` on a new daemon thread; answer a future of its result.

    The call runs in a copy of the caller's context (the ambient actor, the installed driver).
    Cancelling the future abandons the call; the thread runs on until ``fn`` returns.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[T] = loop.create_future()
    context = contextvars.copy_context()

    def settle(outcome: Callable[[], None]) -> None:
        if not future.done():
            outcome()

    def target() -> None:
        try:
            result = context.run(fn, *args, **kwargs)
        except BaseException as exc:
            error = exc
            loop.call_soon_threadsafe(settle, lambda: future.set_exception(error))
        else:
            loop.call_soon_threadsafe(settle, lambda: future.set_result(result))

    threading.Thread(
        target=target, name=f"jobs-{getattr(fn, '__name__', 'call')}", daemon=True
    ).start()
    return future
