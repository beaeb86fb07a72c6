"""pgqueuer on the shared Postgres, in a database of its own, as its README shows.

Schema by ``pgq install`` (default durability ``durable``: every table logged, like ours); the
worker is ``pgq run module:factory`` with an asyncpg connection (the README's driver), default
batch size and no per-entrypoint limit; enqueue with ``Queries.enqueue`` (lists for a batch).
Completed jobs are counted in ``pgqueuer_log`` (``status = 'successful'``).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from bench.common import drop_database, fresh_database, pg_count, pg_url
from bench.peers import body_latency, body_started, child, paced, pickup, processing, timed

NAME = "pgqueuer"
VERSION = "1.6.0"
BACKEND = "pg"
DATABASE = "bench_pgqueuer"
SETTINGS = (
    "`pgq run` (asyncpg driver), default --batch-size 10, no concurrency_limit on the "
    "entrypoint (its default), durability durable, --log-level WARNING (through "
    "bench/peers/pgq_cli.py, which fixes that flag under typer 0.29)"
)
_BATCH = 1_000


def _env_for(database: str) -> dict[str, str]:
    from bench.common import PG_HOST, PG_PORT, PG_USER

    return {"PGHOST": PG_HOST, "PGPORT": str(PG_PORT), "PGUSER": PG_USER, "PGDATABASE": database}


def _prepare() -> str:
    import subprocess

    url = fresh_database(DATABASE)
    env = dict(os.environ) | _env_for(DATABASE)
    subprocess.run(
        [sys.executable, "-m", "pgqueuer", "install"],
        env=env,
        check=True,
        capture_output=True,
    )
    return url


@asynccontextmanager
async def factory() -> AsyncIterator[Any]:
    """The worker factory ``pgq run`` calls (1.6.0 wants an async context manager)."""
    import asyncpg
    from pgqueuer import PgQueuer
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.models import Job

    connection = await asyncpg.connect(pg_url(DATABASE))
    pgq = PgQueuer(AsyncpgDriver(connection))

    @pgq.entrypoint("noop")
    async def noop(job: Job) -> None:
        body_started()

    @pgq.entrypoint("pickup")
    async def probe(job: Job) -> None:
        body_latency(int(job.payload or b"0"))

    try:
        yield pgq
    finally:
        await connection.close()


async def _queries() -> tuple[Any, Any]:
    import asyncpg
    from pgqueuer.db import AsyncpgDriver
    from pgqueuer.queries import Queries

    connection = await asyncpg.connect(pg_url(DATABASE))
    return connection, Queries(AsyncpgDriver(connection))


async def enqueue_single(n: int) -> dict[str, Any]:
    """``await queries.enqueue("noop", payload)`` one at a time."""
    connection, queries = await _queries()
    await queries.enqueue("noop", b"warm-up")
    started = time.perf_counter()
    for i in range(n):
        await queries.enqueue("noop", str(i).encode())
    result = timed(n, started)
    queued = await connection.fetchval("SELECT count(*) FROM pgqueuer")
    await connection.close()
    assert queued == n + 1, f"{queued} queued, expected {n + 1}"
    return result


async def enqueue_batch(n: int) -> dict[str, Any]:
    """``queries.enqueue([...], [...], [...])`` with 1,000 jobs per call."""
    connection, queries = await _queries()
    await queries.enqueue(["noop"], [b"warm-up"], [0])
    payloads = [str(i).encode() for i in range(_BATCH)]
    started = time.perf_counter()
    for _ in range(n // _BATCH):
        await queries.enqueue(["noop"] * _BATCH, payloads, [0] * _BATCH)
    result = timed(n // _BATCH * _BATCH, started)
    queued = await connection.fetchval("SELECT count(*) FROM pgqueuer")
    await connection.close()
    assert queued == n // _BATCH * _BATCH + 1, f"{queued} queued"
    return result


async def fill(n: int, entrypoint: str = "noop") -> dict[str, Any]:
    """Queue ``n`` jobs in batches (before the worker starts)."""
    connection, queries = await _queries()
    for at in range(0, n, _BATCH):
        size = min(_BATCH, n - at)
        await queries.enqueue([entrypoint] * size, [b"0"] * size, [0] * size)
    await connection.close()
    return {"value": n}


async def probes(n: int) -> dict[str, Any]:
    """Probes 200 ms apart, each carrying the time taken just before its enqueue call."""
    connection, queries = await _queries()
    result = await paced(n, lambda t: queries.enqueue("pickup", str(t).encode()))
    await connection.close()
    return result


def _count(entrypoint: str) -> int:
    return pg_count(
        pg_url(DATABASE),
        "SELECT count(*) FROM pgqueuer_log WHERE status = 'successful' AND entrypoint = %s",
        (entrypoint,),
    )


def _drained() -> bool:
    """Answer whether the queue table is empty (a finished job's row moves to the log)."""
    return bool(pg_count(pg_url(DATABASE), "SELECT (NOT EXISTS (SELECT 1 FROM pgqueuer))::int"))


def _worker_argv(*, quiet: bool = True) -> list[str]:
    argv = [sys.executable, "-m", "bench.peers.pgq_cli", "run", "bench.peers.pgqueuer_peer:factory"]
    return argv + (["--log-level", "WARNING"] if quiet else [])


def _processing(sizes: Any) -> dict[str, Any]:
    _prepare()
    return processing(
        fill=lambda: child(NAME, "fill", n=sizes.processing),
        worker_argv=_worker_argv(),
        count=lambda: _count("noop"),
        gate=_drained,
        n=sizes.processing,
        pg_database=DATABASE,
    )


def _cli_defaults(sizes: Any) -> dict[str, Any]:
    """``pgq run`` with nothing but the factory: every option at pgqueuer's default."""
    _prepare()
    return processing(
        fill=lambda: child(NAME, "fill", n=sizes.processing),
        worker_argv=_worker_argv(quiet=False),
        count=lambda: _count("noop"),
        gate=_drained,
        n=sizes.processing,
        pg_database=DATABASE,
    )


def _pickup(sizes: Any) -> dict[str, Any]:
    _prepare()
    return pickup(
        worker_argv=_worker_argv(),
        warm_up=lambda: child(NAME, "fill", n=1, entrypoint="pickup"),
        count=lambda: _count("pickup"),
        enqueue_probes=lambda n: child(NAME, "probes", n=n),
        n=sizes.pickup,
    )


def _single(sizes: Any) -> dict[str, Any]:
    _prepare()
    return child(NAME, "enqueue_single", n=sizes.single)


def _batch(sizes: Any) -> dict[str, Any]:
    _prepare()
    return child(NAME, "enqueue_batch", n=sizes.batch_total)


FIGURES = {
    "enqueue-single": _single,
    "enqueue-batch": _batch,
    "processing": _processing,
    "cli-defaults": _cli_defaults,
    "pickup": _pickup,
}
WORKLOADS = {
    "enqueue_single": enqueue_single,
    "enqueue_batch": enqueue_batch,
    "fill": fill,
    "probes": probes,
}


def cleanup() -> None:
    """Drop the peer's database."""
    drop_database(DATABASE)
