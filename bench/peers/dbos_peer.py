"""DBOS on the shared Postgres (its system database is a database of its own), as its docs show.

The worker process calls ``DBOS.launch()`` and then ``DBOS.register_queue("bench")`` with its
defaults (no per-worker concurrency limit, 1 s polling; its README: register queues after
launch); the enqueuer is a
``DBOSClient`` (``client.enqueue`` one at a time: DBOS has no batch enqueue, so it has no batch
figure). Workflows and steps are plain functions (DBOS runs them on its thread pool); the durable
figure is a workflow of three ``@DBOS.step`` calls. Completed workflows are counted in
``dbos.workflow_status`` (``status = 'SUCCESS'``).
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from bench.common import drop_database, fresh_database, pg_count, pg_url
from bench.peers import body_latency, body_started, child, paced, pickup, processing, timed

NAME = "dbos"
VERSION = "3.4.0"
BACKEND = "pg"
DATABASE = "bench_dbos"
APP = "bench"
CONCURRENCY = None
SETTINGS = (
    "one launched DBOS process, `DBOS.register_queue` defaults (no worker_concurrency limit, 1 s "
    "polling), sync workflows and steps on its thread pool, log level WARNING"
)


def _declare() -> None:
    from dbos import DBOS

    @DBOS.workflow(name="noop_wf")
    def noop_wf(t: int = 0) -> None:
        body_started()

    @DBOS.step(name="unit")
    def unit() -> int:
        return 1

    @DBOS.workflow(name="three_wf")
    def three_wf(t: int = 0) -> None:
        body_started()
        unit()
        unit()
        unit()

    @DBOS.workflow(name="pickup_wf")
    def pickup_wf(t: int = 0) -> None:
        body_latency(t)


def serve() -> None:
    """The worker process: launch DBOS, register the queue, serve until terminated."""
    from dbos import DBOS

    DBOS(config={"name": APP, "system_database_url": pg_url(DATABASE), "log_level": "WARNING"})
    _declare()
    DBOS.launch()
    DBOS.register_queue("bench")
    threading.Event().wait()


def _client() -> Any:
    from dbos import DBOSClient

    return DBOSClient(system_database_url=pg_url(DATABASE), application_name=APP)


def _options(workflow: str) -> dict[str, Any]:
    return {"queue_name": "bench", "workflow_name": workflow, "application_name": APP}


def enqueue_single(n: int) -> dict[str, Any]:
    """``client.enqueue(options, 0)`` one at a time."""
    client = _client()
    client.enqueue(_options("noop_wf"), 0)
    started = time.perf_counter()
    for _ in range(n):
        client.enqueue(_options("noop_wf"), 0)
    result = timed(n, started)
    client.destroy()
    queued = _count("noop_wf", "ENQUEUED")
    assert queued == n + 1, f"{queued} queued, expected {n + 1}"
    return result


def fill(n: int, workflow: str = "noop_wf") -> dict[str, Any]:
    """Queue ``n`` workflows before the worker starts (one call each: no batch call)."""
    client = _client()
    for _ in range(n):
        client.enqueue(_options(workflow), 0)
    client.destroy()
    return {"value": n}


async def probes(n: int) -> dict[str, Any]:
    """Probes 200 ms apart, each carrying the time taken just before its enqueue call."""
    client = _client()
    result = await paced(n, lambda t: client.enqueue(_options("pickup_wf"), t))
    client.destroy()
    return result


def _count(workflow: str, status: str = "SUCCESS") -> int:
    return pg_count(
        pg_url(DATABASE),
        "SELECT count(*) FROM dbos.workflow_status WHERE status = %s AND name = %s",
        (status, workflow),
    )


def _prepare() -> None:
    fresh_database(DATABASE)
    # The system tables are created by the first launch; a client needs them to enqueue.
    from dbos._sys_db import SystemDatabase  # noqa: F401 - import check only

    child(NAME, "migrate")


def migrate() -> dict[str, Any]:
    """Create DBOS's system tables (what ``DBOS.launch()`` does first) and exit."""
    from dbos import DBOS

    DBOS(config={"name": APP, "system_database_url": pg_url(DATABASE), "log_level": "WARNING"})
    _declare()
    DBOS.launch()
    DBOS.destroy()
    return {"value": 1}


def _worker_argv() -> list[str]:
    return [sys.executable, "-c", "from bench.peers.dbos_peer import serve; serve()"]


def _drain(n: int, workflow: str, unit: str) -> dict[str, Any]:
    _prepare()
    return processing(
        fill=lambda: child(NAME, "fill", n=n, workflow=workflow),
        worker_argv=_worker_argv(),
        count=lambda: _count(workflow),
        n=n,
        pg_database=DATABASE,
        unit=unit,
        extra={"concurrency": "unlimited"},
    )


def _pickup(sizes: Any) -> dict[str, Any]:
    _prepare()
    return pickup(
        worker_argv=_worker_argv(),
        warm_up=lambda: child(NAME, "fill", n=1, workflow="pickup_wf"),
        count=lambda: _count("pickup_wf"),
        enqueue_probes=lambda n: child(NAME, "probes", n=n),
        n=sizes.pickup,
    )


def _single(sizes: Any) -> dict[str, Any]:
    _prepare()
    return child(NAME, "enqueue_single", n=sizes.single)


FIGURES = {
    "enqueue-single": _single,
    "processing": lambda sizes: _drain(sizes.processing, "noop_wf", "jobs/s"),
    "durable": lambda sizes: _drain(sizes.durable, "three_wf", "runs/s"),
    "pickup": _pickup,
}
WORKLOADS = {
    "enqueue_single": enqueue_single,
    "fill": fill,
    "probes": probes,
    "migrate": migrate,
}


def cleanup() -> None:
    """Drop the peer's database."""
    drop_database(DATABASE)
