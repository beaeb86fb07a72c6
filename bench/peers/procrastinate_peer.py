"""Procrastinate on the shared Postgres, in a database of its own, as its docs show.

An ``App`` over ``PsycopgConnector``; schema by ``procrastinate schema --apply``; the worker is
``procrastinate worker`` (LISTEN/NOTIFY on, its default) at ``--concurrency 64`` for these async
I/O-bound tasks (its concurrency how-to shows ``--concurrency=30``; 64 is our worker's slot
count in the bench); ``defer_async`` one at a time and ``batch_defer_async`` for batches.
Completed jobs are counted in ``procrastinate_jobs`` (``status = 'succeeded'``).
"""

from __future__ import annotations

import subprocess
import sys
import time
from typing import Any

import procrastinate

from bench.common import child_env, drop_database, fresh_database, pg_count, pg_url
from bench.peers import body_latency, body_started, child, paced, pickup, processing, timed

NAME = "procrastinate"
VERSION = "3.10.0"
BACKEND = "pg"
DATABASE = "bench_procrastinate"
CONCURRENCY = 64
SETTINGS = (
    f"`procrastinate worker --concurrency {CONCURRENCY}` (async tasks, LISTEN/NOTIFY on, the "
    "slot count of our worker; its docs' example is 30)"
)
_BATCH = 1_000

app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=pg_url(DATABASE)))


@app.task(name="noop", queue="bench")
async def noop(t: int = 0) -> None:
    """Do nothing."""
    body_started()


@app.task(name="pickup", queue="bench")
async def probe(t: int = 0) -> None:
    """Record the pickup latency."""
    body_latency(t)


_APP = "bench.peers.procrastinate_peer.app"


def _prepare() -> None:
    fresh_database(DATABASE)
    subprocess.run(
        [sys.executable, "-m", "procrastinate", "--app", _APP, "schema", "--apply"],
        env=child_env(),
        check=True,
        capture_output=True,
    )


async def _count_async(task: str | None = None) -> int:
    async with app.open_async():
        rows = await app.connector.execute_query_all_async(
            "SELECT count(*) AS n FROM procrastinate_jobs"
            + (" WHERE task_name = %(task)s" if task else ""),
            task=task,
        )
    return int(rows[0]["n"])


async def enqueue_single(n: int) -> dict[str, Any]:
    """``await noop.defer_async(t=0)`` one at a time."""
    async with app.open_async():
        await noop.defer_async(t=0)
        started = time.perf_counter()
        for _ in range(n):
            await noop.defer_async(t=0)
        result = timed(n, started)
    queued = await _count_async()
    assert queued == n + 1, f"{queued} queued, expected {n + 1}"
    return result


async def enqueue_batch(n: int) -> dict[str, Any]:
    """``await noop.batch_defer_async(*kwargs)`` with 1,000 jobs per call."""
    batch = [{"t": 0}] * _BATCH
    async with app.open_async():
        await noop.batch_defer_async({"t": 0})
        started = time.perf_counter()
        for _ in range(n // _BATCH):
            await noop.batch_defer_async(*batch)
        result = timed(n // _BATCH * _BATCH, started)
    queued = await _count_async()
    assert queued == n // _BATCH * _BATCH + 1, f"{queued} queued"
    return result


async def fill(n: int, task: str = "noop") -> dict[str, Any]:
    """Queue ``n`` jobs in batches before the worker starts."""
    target = noop if task == "noop" else probe
    async with app.open_async():
        for at in range(0, n, _BATCH):
            await target.batch_defer_async(*([{"t": 0}] * min(_BATCH, n - at)))
    return {"value": n}


async def probes(n: int) -> dict[str, Any]:
    """Probes 200 ms apart, each carrying the time taken just before its defer call."""
    async with app.open_async():
        return await paced(n, lambda t: probe.defer_async(t=t))


def _count(task: str) -> int:
    return pg_count(
        pg_url(DATABASE),
        "SELECT count(*) FROM procrastinate_jobs WHERE status = 'succeeded' AND task_name = %s",
        (task,),
    )


def _worker_argv() -> list[str]:
    return [
        sys.executable,
        "-m",
        "procrastinate",
        "--app",
        _APP,
        "worker",
        "--queues",
        "bench",
        "--concurrency",
        str(CONCURRENCY),
    ]


def _processing(sizes: Any) -> dict[str, Any]:
    _prepare()
    return processing(
        fill=lambda: child(NAME, "fill", n=sizes.processing),
        worker_argv=_worker_argv(),
        count=lambda: _count("noop"),
        n=sizes.processing,
        pg_database=DATABASE,
        extra={"concurrency": CONCURRENCY},
    )


def _pickup(sizes: Any) -> dict[str, Any]:
    _prepare()
    return pickup(
        worker_argv=_worker_argv(),
        warm_up=lambda: child(NAME, "fill", n=1, task="pickup"),
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
