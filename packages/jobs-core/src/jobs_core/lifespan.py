"""An ASGI lifespan (FastAPI, Starlette) that installs a driver at start-up and closes it at exit.

``FastAPI(lifespan=jobs_lifespan("postgresql://..."))``: the driver opens on the app's event
loop and is installed with that loop as its home, so ``await handle.enqueue(...)`` in async
routes and ``handle.enqueue_sync(...)`` in sync routes (which Starlette runs on a thread pool)
share its one pool. The worker runs in a process of its own (``jobsctl worker``).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from jobs_core._current import install_driver
from jobs_core.driver import JobDriver, open_driver
from jobs_core.outbox import install_outbox, uninstall_outbox

Lifespan = Callable[[Any], AbstractAsyncContextManager[None]]
"""What ``FastAPI(lifespan=...)`` and ``Starlette(lifespan=...)`` take."""


def jobs_lifespan(
    url: str | None = None,
    *,
    driver: JobDriver | None = None,
    outbox: bool = False,
    inner: Lifespan | None = None,
    **options: Any,
) -> Lifespan:
    """Answer a lifespan that installs a driver for the app's life, then closes it.

    Args:
        url: the driver URL (``open_driver(url, **options)``); or pass ``driver``.
        driver: an already built driver (closed at shutdown all the same).
        outbox: also install the driver's transactional outbox (``driver.outbox``), so that an
            enqueue inside ``jobs_pg.transaction(conn)`` or a SQLAlchemy session's transaction
            stages; run a relay (``jobsctl relay``) beside the worker.
        inner: the app's own lifespan, entered inside this one (the driver is installed first).
        **options: the driver's options (``schema=``, ``max_size=`` ...).

    Returns:
        The lifespan function.

    Raises:
        ValueError: neither or both of ``url`` and ``driver`` were given.
    """
    if (url is None) == (driver is None):
        raise ValueError("jobs_lifespan: pass exactly one of url= or driver=")

    @asynccontextmanager
    async def lifespan(app: Any) -> AsyncIterator[None]:
        opened = driver if driver is not None else open_driver(str(url), **options)
        install_driver(opened, loop=asyncio.get_running_loop())
        store = getattr(opened, "outbox", None) if outbox else None
        if store is not None:
            install_outbox(store, opened)
        try:
            if inner is None:
                yield
            else:
                async with inner(app):
                    yield
        finally:
            if store is not None:
                uninstall_outbox()
            install_driver(None)
            await opened.close()

    return lifespan
