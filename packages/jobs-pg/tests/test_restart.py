"""A restart and a read-only window of PostgreSQL under a running worker: no job runs twice.

Marked ``slow`` and run by their own nox session (``pg-restart``). Each test starts a PRIVATE
server (:class:`private_pg.Cluster`: initdb into a temp dir, a free loopback port) and restarts
or reconfigures only that one; the shared server is never touched.

A settle refused while the server is away is retried as long as the attempt's lease can hold
(issue 14 item 1), so an outage shorter than the lease loses no ack: every job runs once.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pg_workload
import pytest

from jobs_core import use_driver
from jobs_core.errors import DriverUnavailableError
from jobs_pg import PostgresDriver
from pg_helpers import Fleet, until
from private_pg import Cluster

pytestmark = pytest.mark.slow

TOTAL = 2_000
SCHEMA = "jobs_outage"


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    server = Cluster.create()
    yield server
    server.remove()


@pytest.fixture
async def driver(cluster: Cluster) -> AsyncIterator[PostgresDriver]:
    opened = PostgresDriver(cluster.url, schema=SCHEMA, min_size=1, max_size=2)
    await opened.migrate()
    yield opened
    await opened.close()


@pytest.fixture
def fleet(cluster: Cluster, tmp_path: Path) -> Iterator[Fleet]:
    workers = Fleet(f"{cluster.url}?schema={SCHEMA}", tmp_path)
    yield workers
    workers.stop()


async def done_at_least(driver: PostgresDriver, n: int) -> bool:
    try:
        return sum(s.done for s in await driver.stats()) >= n
    except DriverUnavailableError:
        return False  # the test's own pool reconnects too


async def run_through(
    driver: PostgresDriver, fleet: Fleet, lease: str, sleep_ms: int, outage: Callable[[], None]
) -> tuple[float, Counter[str]]:
    """Run :data:`TOTAL` jobs, ``outage()`` (blocking) at ~300 done; answer (recovery s, runs)."""
    with use_driver(driver):
        await pg_workload.count.enqueue_many(
            [pg_workload.Item(n=i, sleep_ms=sleep_ms) for i in range(TOTAL)]
        )
    worker = fleet.start("count", "--concurrency", "8", "--visibility-timeout", lease)
    await until(lambda: done_at_least(driver, 300), timeout=90)
    began = time.monotonic()
    await asyncio.to_thread(outage)
    await until(lambda: done_at_least(driver, TOTAL), timeout=180, every=0.2)
    recovered = time.monotonic() - began
    assert worker.poll() is None, "the worker process died with the server"
    [stats] = await driver.stats()
    assert (stats.done, stats.ready, stats.running, stats.dead, stats.failed) == (TOTAL, 0, 0, 0, 0)
    runs = Counter(fields[2] for fields in fleet.lines("run"))
    assert len(runs) == TOTAL
    return recovered, runs


async def test_a_restart_shorter_than_the_lease_runs_no_job_twice(
    cluster: Cluster, driver: PostgresDriver, fleet: Fleet
) -> None:
    timed: dict[str, float] = {}

    def restart() -> None:
        began = time.monotonic()
        cluster.restart()
        timed["restart"] = time.monotonic() - began

    recovered, runs = await run_through(driver, fleet, "10s", 20, restart)
    twice = sum(n > 1 for n in runs.values())
    print(
        f"\nrestart ({timed['restart']:.1f} s, lease 10 s) at ~300 of {TOTAL} done: all done "
        f"{recovered:.1f} s after the restart began; {twice} jobs ran twice"
    )
    assert twice == 0


async def test_a_6_s_read_only_window_runs_no_job_twice(
    cluster: Cluster, driver: PostgresDriver, fleet: Fleet
) -> None:
    def read_only_window() -> None:
        cluster.set_read_only(True)
        cluster.terminate_clients()
        time.sleep(6)
        cluster.set_read_only(False)

    recovered, runs = await run_through(driver, fleet, "30s", 0, read_only_window)
    twice = sum(n > 1 for n in runs.values())
    print(
        f"\nread-only window (6 s, connections terminated, lease 30 s) at ~300 of {TOTAL} done: "
        f"all done {recovered - 6:.1f} s after it ended; {twice} jobs ran twice"
    )
    assert twice == 0
