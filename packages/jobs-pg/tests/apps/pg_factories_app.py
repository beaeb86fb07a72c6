"""A worker app for the factories' SIGKILL tests: a backfill over a real table, a consumer.

The test process imports it too (to enqueue); everything it needs is read from the environment
at call time: ``FACTORY_URL`` (the database), ``FACTORY_SCHEMA`` (the test's schema, which holds
the app tables), ``FACTORY_KILL`` = ``<point>:<step>`` to SIGKILL this process at that consumer
batch boundary once (a marker file beside ``FACTORY_EFFECTS`` keeps the next worker alive), and
``FACTORY_EFFECTS``, a file outside the database that every handler call appends one line to.
"""

from __future__ import annotations

import os
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import psycopg

from jobs_core import Retry, backfill, consumer, keyset
from jobs_core.faults import Boundary, install_fault_hook
from jobs_pg import PgCursorStore


def _env(name: str) -> str:
    return os.environ[name]


def _note(line: str) -> None:
    path = os.environ.get("FACTORY_EFFECTS")
    if path:
        with open(path, "a") as out:
            out.write(line + "\n")


def _hook(at: Boundary) -> None:
    kill = os.environ.get("FACTORY_KILL", "")
    effects = os.environ.get("FACTORY_EFFECTS")
    marker = Path(f"{effects}.killed") if effects else None
    if marker and f"{at.point}:{at.step}" == kill and not marker.exists():
        marker.write_text("killed")
        os.kill(os.getpid(), signal.SIGKILL)


install_fault_hook(_hook)


async def handle_posts(rows: list[dict[str, Any]], cancel: Any) -> None:
    """Mark a page of posts handled (a counter per row, so a page handled twice shows)."""
    schema = _env("FACTORY_SCHEMA")
    ids = [row["id"] for row in rows]
    async with await psycopg.AsyncConnection.connect(_env("FACTORY_URL"), autocommit=True) as conn:
        await conn.execute(
            f'UPDATE "{schema}".posts SET handled = handled + 1 WHERE id = ANY(%s)', [ids]
        )
        await conn.execute(f'INSERT INTO "{schema}".pages (first_id) VALUES (%s)', [ids[0]])


posts_backfill = backfill(
    name="factories.posts",
    tenant="none",
    source=lambda ctx: keyset(
        os.environ["FACTORY_URL"], f"{os.environ['FACTORY_SCHEMA']}.posts", key="id"
    ),
    handle=handle_posts,
    batch=int(os.environ.get("FACTORY_BATCH", "250")),
    rate=float(os.environ.get("FACTORY_RATE", "20")),
    retry=Retry(attempts=4, delay="100ms"),
)


async def _feed(cursor: Any, cancel: Any) -> AsyncIterator[int]:
    schema = _env("FACTORY_SCHEMA")
    async with await psycopg.AsyncConnection.connect(_env("FACTORY_URL"), autocommit=True) as conn:
        cur = await conn.execute(
            f'SELECT id FROM "{schema}".feed WHERE id > %s ORDER BY id', [cursor or 0]
        )
        for (item,) in await cur.fetchall():
            yield item


async def _sink(items: list[int], tx: Any) -> int:
    """Upsert a batch on the batch's own transaction; n counts committed writes per item."""
    _note("batch " + " ".join(str(i) for i in items))
    schema = _env("FACTORY_SCHEMA")
    async with tx.cursor() as cur:
        await cur.executemany(
            f'INSERT INTO "{schema}".sink AS s (id, n) VALUES (%s, 1) '
            "ON CONFLICT (id) DO UPDATE SET n = s.n + 1",
            [(i,) for i in items],
        )
    return items[-1]


feed_consumer = consumer(
    name="factories.feed",
    tenant="none",
    keys=lambda: ["feed"],
    open=_feed,
    handle=_sink,
    cursor=PgCursorStore(
        lambda: psycopg.AsyncConnection.connect(os.environ["FACTORY_URL"]),
        schema=os.environ.get("FACTORY_SCHEMA", "jobs"),
    ),
    batch=10,
    max_wait="50ms",
    retry=Retry(attempts=4, delay="100ms"),
)
