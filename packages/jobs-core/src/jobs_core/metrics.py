"""Prometheus series for workers and queues (``40-operator.md``), in a registry of their own.

========================================  =========  ==========================================
series                                    kind       meaning
========================================  =========  ==========================================
``queue_depth{queue}``                    gauge      due rows no worker holds yet (backlog)
``queue_demand{queue}``                   gauge      running under a live lease + due and
                                                     claimable (0 from a draining worker)
``jobs_total{queue,outcome}``             counter    attempts by outcome (``completed``,
                                                     ``retried``, ``dead-lettered``, ...)
``job_duration_seconds{queue,job}``       histogram  attempt wall time (bodies that ran)
``queue_oldest_ready_seconds{queue}``     gauge      how long the oldest due row has waited
``queue_oldest_running_seconds{queue}``   gauge      how long the oldest attempt still running
                                                     in this process has run (0 if none)
``queue_dead_jobs{queue}``                gauge      dead-letter size
``job_leases_lost_total{queue}``          counter    leases that lapsed while the body ran
``job_rate_limited_total{queue,job,mode}``  counter  attempts a fleet ``Rate`` refused a token
                                                     (``mode``: ``wait`` handed back, ``fail``
                                                     failed)
``job_worker_in_flight``                  gauge      attempts running, summed over the
                                                     process's workers
``job_worker_capacity``                   gauge      slots, summed likewise
``scheduler_clock_skew_seconds``          gauge      a scheduler's clock minus its store's
                                                     (positive: its host runs ahead)
========================================  =========  ==========================================

No ``*_created`` series: prometheus-client adds a ``<name>_created`` timestamp beside every
counter and histogram, which dashboards read as one more series per label set. The registry
here leaves them out when it is collected (prometheus-client's ``disable_created_metrics()``
was rejected: it is process-wide, and would change an application's own series too).

Each :class:`JobsMetrics` owns a :class:`~prometheus_client.CollectorRegistry` rather than using
the library's global one, so two workers in one test process, or an application's own series,
never collide. A worker given one records outcomes, durations and lost leases as they happen and
refreshes the queue gauges from ``driver.stats()`` and ``driver.demand()`` on a cadence
(``metrics_interval``). Reading the driver at scrape time from a custom collector was rejected:
the scrape runs on the HTTP server's thread, while the driver's connections belong to the
worker's event loop, and a stuck backend would hang every scrape.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.metrics_core import Metric

from jobs_core.driver import JobDriver, demand_when_busy

if TYPE_CHECKING:
    from jobs_core.worker import Worker, WorkerStats

__all__ = ["DURATION_BUCKETS", "JobsMetrics", "MetricsServer"]

DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300, 900, 3600)
"""``job_duration_seconds`` buckets: from a quick call to an hour-long import."""

_NOT_RUN = frozenset({"deferred", "refused"})
"""Outcomes of attempts whose body never ran: counted, but no duration."""


class _WithoutCreated(CollectorRegistry):
    """A registry whose collection leaves out the ``*_created`` samples of every family."""

    def collect(self) -> Iterator[Metric]:
        """Yield each family of the registered collectors without its ``_created`` samples."""
        for family in super().collect():
            family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family


@dataclass(frozen=True, slots=True)
class MetricsServer:
    """A running ``/metrics`` HTTP endpoint (see :meth:`JobsMetrics.serve`).

    Attributes:
        host: the address it is bound to.
        port: the port it listens on (the one picked by the system when 0 was asked).
    """

    host: str
    port: int
    _server: WSGIServer
    _thread: threading.Thread

    def close(self) -> None:
        """Stop serving and release the port."""
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


class JobsMetrics:
    """The series of one process (or one test), in their own registry.

    Args:
        registry: where the series live; a new :class:`~prometheus_client.CollectorRegistry`
            when ``None``.

    Attributes:
        registry: the registry (pass it to ``generate_latest`` or serve it); it yields no
            ``*_created`` series.
    """

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        own = _WithoutCreated()
        if registry is not None:
            # The series live in a registry of ours, collected through the caller's.
            registry.register(own)
        self.registry = registry if registry is not None else own
        self._workers: list[Worker] = []
        # Per attached worker: {queue: age in seconds of its oldest running attempt}.
        self._running_ages: dict[int, dict[str, float]] = {}
        self._lock = threading.Lock()
        # prometheus_client appends ``_total`` to a counter's name when it exposes it.
        self.jobs = Counter("jobs", "Attempts by outcome.", ["queue", "outcome"], registry=own)
        self.durations = Histogram(
            "job_duration_seconds",
            "Attempt wall time of bodies that ran, in seconds.",
            ["queue", "job"],
            buckets=DURATION_BUCKETS,
            registry=own,
        )
        self.leases_lost = Counter(
            "job_leases_lost",
            "Leases that lapsed while the body ran (alert on any rate).",
            ["queue"],
            registry=own,
        )
        self.rate_limited_attempts = Counter(
            "job_rate_limited",
            "Attempts a fleet rate limit refused a token (mode wait: handed back; fail: failed).",
            ["queue", "job", "mode"],
            registry=own,
        )
        self.depth = Gauge("queue_depth", "Due rows no worker holds yet.", ["queue"], registry=own)
        self.demand = Gauge(
            "queue_demand",
            "Rows running under a live lease plus rows due and claimable (0 while draining).",
            ["queue"],
            registry=own,
        )
        self.oldest_ready = Gauge(
            "queue_oldest_ready_seconds",
            "How long the oldest due row has waited, in seconds.",
            ["queue"],
            registry=own,
        )
        self.oldest_running = Gauge(
            "queue_oldest_running_seconds",
            "How long the oldest attempt still running in this process has run, in seconds.",
            ["queue"],
            registry=own,
        )
        self.dead = Gauge(
            "queue_dead_jobs", "Rows in the dead-letter state.", ["queue"], registry=own
        )
        in_flight = Gauge(
            "job_worker_in_flight",
            "Attempts running, summed over this process's workers.",
            registry=own,
        )
        in_flight.set_function(self._summed(lambda stats: stats.in_flight))
        capacity = Gauge(
            "job_worker_capacity",
            "Slots, summed over this process's workers.",
            registry=own,
        )
        capacity.set_function(self._summed(lambda stats: stats.capacity))
        self.clock_skew = Gauge(
            "scheduler_clock_skew_seconds",
            "The scheduler's clock minus its store's at the last measure, in seconds.",
            registry=self.registry,
        )

    def _summed(self, read: Callable[[WorkerStats], int]) -> Callable[[], float]:
        def total() -> float:
            with self._lock:
                workers = list(self._workers)
            return float(sum(read(worker.stats()) for worker in workers))

        return total

    def attach(self, worker: Worker) -> None:
        """Count ``worker`` in ``job_worker_in_flight`` and ``job_worker_capacity``."""
        with self._lock:
            self._workers.append(worker)

    def detach(self, worker: Worker) -> None:
        """Stop counting ``worker`` (no-op if it is not attached)."""
        with self._lock:
            if worker in self._workers:
                self._workers.remove(worker)
            ages = self._running_ages.pop(id(worker), {})
        self._publish_running(ages)

    def running_ages(self, worker: Worker, ages: dict[str, float]) -> None:
        """Record ``worker``'s oldest running attempt per queue (seconds; 0 for none).

        ``queue_oldest_running_seconds`` is the largest over the process's workers.
        """
        with self._lock:
            self._running_ages[id(worker)] = dict(ages)
        self._publish_running(ages)

    def _publish_running(self, queues: dict[str, float]) -> None:
        with self._lock:
            every = list(self._running_ages.values())
        for queue in queues:
            self.oldest_running.labels(queue).set(
                max((a.get(queue, 0.0) for a in every), default=0.0)
            )

    def attempt(self, queue: str, job: str, outcome: str, seconds: float) -> None:
        """Record one attempt's outcome, and its duration when its body ran.

        Args:
            queue: the row's queue.
            job: the job name.
            outcome: the worker's outcome (``completed``, ``retried``, ``dead-lettered``, ...).
            seconds: how long the attempt took, wall time.
        """
        self.jobs.labels(queue, outcome).inc()
        if outcome not in _NOT_RUN:
            self.durations.labels(queue, job).observe(seconds)

    def rate_limited(self, queue: str, job: str, mode: str) -> None:
        """Count one attempt a fleet rate limit refused a token.

        Args:
            queue: the row's queue.
            job: the job name.
            mode: the job's ``when_limited``: ``wait`` (handed back) or ``fail`` (failed).
        """
        self.rate_limited_attempts.labels(queue, job, mode).inc()

    def lease_lost(self, queue: str) -> None:
        """Count a lease that lapsed while its body ran."""
        self.leases_lost.labels(queue).inc()

    async def refresh(self, driver: JobDriver, *, draining: bool = False) -> None:
        """Set the queue gauges from ``driver.stats()`` and ``driver.demand()``.

        ``demand()`` is asked only when the stats show work (a ready, running or suspended row):
        an idle fleet refreshes its gauges with one query, not two.

        Args:
            driver: the driver to read.
            draining: publish a demand of 0 for every queue (this process is going away, so an
                autoscaler reading the max over pods must not count it).

        Raises:
            JobsError: whatever the driver raises (``X_DRIVER_UNAVAILABLE``); gauges keep their
                last values.
        """
        stats = await driver.stats()
        demand = {} if draining else await demand_when_busy(driver, stats)
        for queue in stats:
            self.depth.labels(queue.queue).set(queue.ready)
            self.oldest_ready.labels(queue.queue).set(queue.oldest_ready_ms / 1000)
            self.dead.labels(queue.queue).set(queue.dead)
        for name in {queue.queue for queue in stats} | set(demand):
            self.demand.labels(name).set(demand.get(name, 0))

    def serve(self, port: int, host: str = "127.0.0.1") -> MetricsServer:
        """Serve the registry over HTTP (``GET /metrics``) on a daemon thread.

        Args:
            port: the TCP port; 0 lets the system pick one (see :attr:`MetricsServer.port`).
            host: the address to bind; loopback by default, ``0.0.0.0`` for a pod's scraper.

        Raises:
            OSError: the address is taken or cannot be bound.
        """
        server, thread = start_http_server(port, addr=host, registry=self.registry)
        return MetricsServer(host=host, port=server.server_port, _server=server, _thread=thread)
