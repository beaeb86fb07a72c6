"""Dramatiq on the shared Redis, in a db index of its own, as its docs show.

A ``RedisBroker`` with the ``Results`` middleware over a ``RedisBackend`` (Dramatiq records no
completion otherwise; the stored result is what we count, with namespaced keys so they can be
counted); ``actor.send`` one at a time and ``group([...]).run()`` for batches (Dramatiq has no
batch enqueue; a group sends each message); the worker is ``dramatiq MODULE --processes 1
--threads 8`` (its default thread count; one process for the one-process figure).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import dramatiq
from dramatiq.brokers.redis import RedisBroker
from dramatiq.results import Results
from dramatiq.results.backends import RedisBackend

from bench.common import flush_redis, redis_url
from bench.peers import body_latency, body_started, child, paced, pickup, processing, timed

NAME = "dramatiq"
VERSION = "2.2.1"
BACKEND = "redis"
THREADS = 8
SETTINGS = (
    f"`dramatiq --processes 1 --threads {THREADS}` (its default threads), Results middleware "
    "on a RedisBackend to record completion"
)
_BATCH = 1_000

broker = RedisBroker(url=redis_url(NAME))
broker.add_middleware(
    Results(backend=RedisBackend(url=redis_url(NAME), use_namespace_prefix_keys=True))
)
dramatiq.set_broker(broker)


@dramatiq.actor(queue_name="bench", actor_name="noop", store_results=True)
def noop(t: int = 0) -> None:
    """Do nothing."""
    body_started()


@dramatiq.actor(queue_name="bench", actor_name="pickup", store_results=True)
def probe(t: int = 0) -> None:
    """Record the pickup latency."""
    body_latency(t)


def _queued() -> int:
    return int(broker.client.hlen("dramatiq:bench.msgs"))


def enqueue_single(n: int) -> dict[str, Any]:
    """``noop.send()`` one at a time."""
    noop.send()
    started = time.perf_counter()
    for _ in range(n):
        noop.send()
    result = timed(n, started)
    assert _queued() == n + 1, f"{_queued()} queued, expected {n + 1}"
    return result


def enqueue_batch(n: int) -> dict[str, Any]:
    """``group([noop.message() ...]).run()`` with 1,000 messages per group."""
    noop.send()
    started = time.perf_counter()
    for _ in range(n // _BATCH):
        dramatiq.group([noop.message() for _ in range(_BATCH)]).run()
    result = timed(n // _BATCH * _BATCH, started)
    assert _queued() == n // _BATCH * _BATCH + 1, f"{_queued()} queued"
    return result


def fill(n: int, task: str = "noop") -> dict[str, Any]:
    """Queue ``n`` messages before the worker starts."""
    actor = noop if task == "noop" else probe
    for at in range(0, n, _BATCH):
        dramatiq.group([actor.message() for _ in range(min(_BATCH, n - at))]).run()
    return {"value": n}


async def probes(n: int) -> dict[str, Any]:
    """Probes 200 ms apart, each carrying the time taken just before its send call."""
    return await paced(n, lambda t: probe.send(t))


def _count(actor: str) -> int:
    import redis

    client = redis.Redis.from_url(redis_url(NAME))
    count = sum(1 for _ in client.scan_iter(f"dramatiq-results:bench:{actor}:*", count=1000))
    client.close()
    return count


def _drained() -> bool:
    import redis

    client = redis.Redis.from_url(redis_url(NAME))
    empty = client.hlen("dramatiq:bench.msgs") == 0
    client.close()
    return bool(empty)


def _worker_argv() -> list[str]:
    return [
        sys.executable,
        "-m",
        "dramatiq",
        "bench.peers.dramatiq_peer",
        "--processes",
        "1",
        "--threads",
        str(THREADS),
    ]


def _processing(sizes: Any) -> dict[str, Any]:
    flush_redis(NAME)
    return processing(
        fill=lambda: child(NAME, "fill", n=sizes.processing),
        worker_argv=_worker_argv(),
        count=lambda: _count("noop"),
        gate=_drained,
        n=sizes.processing,
        extra={"concurrency": THREADS},
    )


def _pickup(sizes: Any) -> dict[str, Any]:
    flush_redis(NAME)
    return pickup(
        worker_argv=_worker_argv(),
        warm_up=lambda: child(NAME, "fill", n=1, task="pickup"),
        count=lambda: _count("pickup"),
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
