"""RQ on the shared Redis, in a db index of its own, as its docs show.

``Queue.enqueue`` one at a time and ``Queue.enqueue_many`` (with ``Queue.prepare_data``) for
batches; the worker is ``rq worker --worker-class rq.worker.SimpleWorker`` (one job at a time in
the worker process, no fork per job), logging at WARNING. Completed jobs are counted in the
queue's ``FinishedJobRegistry``.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from bench.common import flush_redis, redis_url
from bench.peers import body_latency, body_started, child, paced, pickup, processing, timed

NAME = "rq"
VERSION = "3.0.0"
BACKEND = "redis"
SETTINGS = "`rq worker --worker-class rq.worker.SimpleWorker` (one job at a time, no fork)"
_BATCH = 1_000


def noop(t: int = 0) -> None:
    """Do nothing."""
    body_started()


def probe(t: int = 0) -> None:
    """Record the pickup latency."""
    body_latency(t)


def _queue() -> Any:
    from redis import Redis
    from rq import Queue

    return Queue("bench", connection=Redis.from_url(redis_url(NAME)))


def enqueue_single(n: int) -> dict[str, Any]:
    """``queue.enqueue(noop)`` one at a time."""
    queue = _queue()
    queue.enqueue(noop)
    started = time.perf_counter()
    for _ in range(n):
        queue.enqueue(noop)
    result = timed(n, started)
    assert queue.count == n + 1, f"{queue.count} queued, expected {n + 1}"
    return result


def enqueue_batch(n: int) -> dict[str, Any]:
    """``queue.enqueue_many([...])`` with 1,000 jobs per call."""
    from rq import Queue

    queue = _queue()
    queue.enqueue(noop)
    started = time.perf_counter()
    for _ in range(n // _BATCH):
        queue.enqueue_many([Queue.prepare_data(noop) for _ in range(_BATCH)])
    result = timed(n // _BATCH * _BATCH, started)
    assert queue.count == n // _BATCH * _BATCH + 1, f"{queue.count} queued"
    return result


def fill(n: int, task: str = "noop") -> dict[str, Any]:
    """Queue ``n`` jobs in batches before the worker starts."""
    from rq import Queue

    queue = _queue()
    func = noop if task == "noop" else probe
    for at in range(0, n, _BATCH):
        queue.enqueue_many([Queue.prepare_data(func) for _ in range(min(_BATCH, n - at))])
    return {"value": n}


async def probes(n: int) -> dict[str, Any]:
    """Probes 200 ms apart, each carrying the time taken just before its enqueue call."""
    queue = _queue()
    return await paced(n, lambda t: queue.enqueue(probe, t))


def _count() -> int:
    return int(_queue().finished_job_registry.count)


def _worker_argv() -> list[str]:
    return [
        sys.executable,
        "-m",
        "rq.cli",
        "worker",
        "--worker-class",
        "rq.worker.SimpleWorker",
        "--url",
        redis_url(NAME),
        "--logging_level",
        "WARNING",
        "bench",
    ]


def _processing(sizes: Any) -> dict[str, Any]:
    flush_redis(NAME)
    return processing(
        fill=lambda: child(NAME, "fill", n=sizes.processing),
        worker_argv=_worker_argv(),
        count=_count,
        n=sizes.processing,
        extra={"concurrency": 1},
    )


def _pickup(sizes: Any) -> dict[str, Any]:
    flush_redis(NAME)
    return pickup(
        worker_argv=_worker_argv(),
        warm_up=lambda: child(NAME, "fill", n=1, task="pickup"),
        count=_count,
        enqueue_probes=lambda n: child(NAME, "probes", n=n),
        n=sizes.pickup,
    )


def _single(sizes: Any) -> dict[str, Any]:
    flush_redis(NAME)
    return child(NAME, "enqueue_single", n=sizes.single)


def _batch(sizes: Any) -> dict[str, Any]:
    flush_redis(NAME)
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
    """Empty the peer's db index."""
    flush_redis(NAME)
