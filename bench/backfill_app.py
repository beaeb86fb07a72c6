"""The app the backfill benchmark's workers import: one keyset backfill over ``bench_posts``.

Everything comes from the environment at call time, so the orchestrator and its worker
subprocesses declare the same backfill: ``BENCH_BF_URL`` (the database), ``BENCH_BF_BATCH``
(rows per page) and ``BENCH_BF_RATE`` (pages per second). The handler marks each row handled
(a counter, so a page handled twice shows) and logs the page's first id in ``bench_pages``.
"""

from __future__ import annotations

import os
from typing import Any

import psycopg

from jobs_core import Retry, backfill, keyset

NAME = "bench.posts"


async def handle(rows: list[dict[str, Any]], cancel: Any) -> None:
    """Mark a page handled, in one statement, and log it."""
    ids = [row["id"] for row in rows]
    connect = psycopg.AsyncConnection.connect(os.environ["BENCH_BF_URL"])
    async with await connect as conn, conn.transaction():
        await conn.execute("UPDATE bench_posts SET handled = handled + 1 WHERE id = ANY(%s)", [ids])
        await conn.execute("INSERT INTO bench_pages (first_id) VALUES (%s)", [ids[0]])


posts = backfill(
    name=NAME,
    tenant="none",
    source=lambda ctx: keyset(os.environ["BENCH_BF_URL"], "bench_posts", key="id"),
    handle=handle,
    batch=int(os.environ.get("BENCH_BF_BATCH", "1000")),
    rate=float(os.environ.get("BENCH_BF_RATE", "20")),
    retry=Retry(attempts=5, delay="200ms"),
)
