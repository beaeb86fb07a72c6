"""arq on the shared Redis, in a db index of its own, as its docs show.

``ArqRedis.enqueue_job`` one at a time (arq has no batch enqueue, so it has no batch figure);
the worker is ``arq bench.peers.arq_peer.WorkerSettings`` at its default ``max_jobs`` (10).
Completed jobs are counted by their stored results (``arq:result:*``, kept an hour by default).
"""

from __future__ import annotations

import sys
import time
from typing import Any

from arq.connections import RedisSettings, create_pool

from bench.common import flush_redis, redis_url
from bench.peers import body_latency, body_started, child, paced, pickup, processing, timed

NAME = "arq"
VERSION = "0.28.0"
BACKEND = "redis"
SETTINGS = "`arq WorkerSettings` at its default max_jobs=10 (async functions)"


async def noop(ctx: dict[str, Any], t: int = 0) -> None:
    """Do nothing."""
    body_started()


async def pickup_probe(ctx: dict[str, Any], t: int = 0) -> None:
    """Record the pickup latency."""
    body_latency(t)


class WorkerSettings:
    """What ``arq`` reads to run the worker."""

    functions = [noop, pickup_probe]  # noqa: RUF012 - arq reads a class attribute
    redis_settings = RedisSettings.from_dsn(redis_url(NAME))


async def _pool() -> Any:
    return await create_pool(RedisSettings.from_dsn(redis_url(NAME)))


async def enqueue_single(n: int) -> dict[str, Any]:
    """``await pool.enqueue_job("noop")`` one at a time."""
    pool = await _pool()
    await pool.enqueue_job("noop")
    started = time.perf_counter()
    for _ in range(n):
        await pool.enqueue_job("noop")
    result = timed(n, started)
    queued = await pool.zcard("arq:queue")
    await pool.aclose()
    assert queued == n + 1, f"{queued} queued, expected {n + 1}"
    return result


async def fill(n: int, task: str = "noop") -> dict[str, Any]:
    """Queue ``n`` jobs before the worker starts (one call each: arq has no batch call)."""
    pool = await _pool()
    for _ in range(n):
        await pool.enqueue_job(task)
    await pool.aclose()
    return {"value": n}


async def probes(n: int) -> dict[str, Any]:
    """Probes 200 ms apart, each carrying the time taken just before its enqueue call."""
    pool = await _pool()
    result = await paced(n, lambda t: pool.enqueue_job("pickup_probe", t))
    await pool.aclose()
    return result


def _client() -> Any:
    import redis

    return redis.Redis.from_url(redis_url(NAME))


def _count() -> int:
    client = _client()
    count = sum(1 for _ in client.scan_iter("arq:result:*", count=1000))
    client.close()
    return count


def _drained() -> bool:
    client = _client()
    empty = client.zcard("arq:queue") == 0
    client.close()
    return bool(empty)


def _worker_argv() -> list[str]:
    return [sys.executable, "-m", "arq", "bench.peers.arq_peer.WorkerSettings"]


def _processing(sizes: Any) -> dict[str, Any]:
    flush_redis(NAME)
    return processing(
        fill=lambda: child(NAME, "fill", n=sizes.processing),
        worker_argv=_worker_argv(),
        count=_count,
        gate=_drained,
        n=sizes.processing,
        extra={"concurrency": 10},
    )


def _pickup(sizes: Any) -> dict[str, Any]:
    flush_redis(NAME)
    return pickup(
        worker_argv=_worker_argv(),
        warm_up=lambda: child(NAME, "fill", n=1, task="pickup_probe"),
        count=_count,
        enqueue_probes=lambda n: child(NAME, "probes", n=n),
        n=sizes.pickup,
    )


def _single(sizes: Any) -> dict[str, Any]:
    flush_redis(NAME)
    return child(NAME, "enqueue_single", n=sizes.single)


FIGURES = {
    "enqueue-single": _single,
    "processing": _processing,
    "pickup": _pickup,
}
WORKLOADS = {
    "enqueue_single": enqueue_single,
    "fill": fill,
    "probes": probes,
}


def cleanup() -> None:
    """Empty the peer's db index."""
    flush_redis(NAME)
