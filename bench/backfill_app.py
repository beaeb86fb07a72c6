"""The app the backfill benchmark's workers import: one keyset backfill over ``bench_posts``.

Everything comes from the environment at call time, so the orchestrator and its worker
subprocesses declare the same backfill: ``BENCH_BF_URL`` (the database), ``BENCH_BF_BATCH``
(rows per page) and ``BENCH_BF_RATE`` (pages per second). The handler marks each row handled
(a counter, so a page handled twice shows) and logs the page's first id in ``bench_pages``. Pages
are read and handled over one small pool per worker process, as an app would.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from psycopg_pool import AsyncConnectionPool

from jobs_core import Retry, backfill, keyset

NAME = "bench.posts"

_pools: list[AsyncConnectionPool[Any]] = []


@asynccontextmanager
async def connection() -> AsyncIterator[Any]:
    """Lend a connection of this process's pool (opened on first use, on the worker's loop)."""
    if not _pools:
        pool: AsyncConnectionPool[Any] = AsyncConnectionPool(
            os.environ["BENCH_BF_URL"], min_size=1, max_size=4, open=False
        )
        await pool.open(wait=True)
        _pools.append(pool)
    async with _pools[0].connection() as conn:
        yield conn


async def handle(rows: list[dict[str, Any]], cancel: Any) -> None:
    """Mark a page handled, in one transaction, and log it."""
    ids = [row["id"] for row in rows]
    async with connection() as conn, conn.transaction():
        await conn.execute("UPDATE bench_posts SET handled = handled + 1 WHERE id = ANY(%s)", [ids])
        await conn.execute("INSERT INTO bench_pages (first_id) VALUES (%s)", [ids[0]])


posts = backfill(
    name=NAME,
    tenant="none",
    source=lambda ctx: keyset(connection, "bench_posts", key="id"),
    handle=handle,
    batch=int(os.environ.get("BENCH_BF_BATCH", "1000")),
    rate=float(os.environ.get("BENCH_BF_RATE", "20")),
    retry=Retry(attempts=5, delay="200ms"),
)
