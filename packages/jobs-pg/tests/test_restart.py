"""A failover-like loss of every connection: PostgreSQL restarts under a running worker.

Marked ``slow`` and run by its own nox session (``pg-restart``, last in the default list): it
restarts the server every other test uses.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pg_workload
import pytest

from jobs_core import use_driver
from jobs_core.errors import DriverUnavailableError
from jobs_pg import PostgresDriver
from pg_helpers import Fleet, until

pytestmark = pytest.mark.slow

TOTAL = 2_000


def restart_postgres() -> None:
    """Restart the local cluster (``pg_ctlcluster``, the version read from /etc/postgresql)."""
    version = sorted(p.name for p in Path("/etc/postgresql").iterdir())[-1]
    subprocess.run(
        ["pg_ctlcluster", "--skip-systemctl-redirect", version, "main", "restart"],
        check=True,
        timeout=120,
    )


@pytest.fixture
def fleet(url: str, migrated: str, tmp_path: Path) -> Iterator[Fleet]:
    workers = Fleet(url, tmp_path)
    yield workers
    workers.stop()


async def test_a_restart_mid_run_loses_no_job_and_the_worker_survives(
    driver: PostgresDriver, fleet: Fleet
) -> None:
    with use_driver(driver):
        await pg_workload.count.enqueue_many(
            [pg_workload.Item(n=i, sleep_ms=20) for i in range(TOTAL)]
        )
    worker = fleet.start("count", "--concurrency", "8", "--visibility-timeout", "3s")

    async def done_at_least(n: int) -> bool:
        try:
            return sum(s.done for s in await driver.stats()) >= n
        except DriverUnavailableError:
            return False  # the test's own pool reconnects too

    await until(lambda: done_at_least(300), timeout=60)
    restarted = time.monotonic()
    await asyncio.to_thread(restart_postgres)
    await until(lambda: done_at_least(TOTAL), timeout=180, every=0.5)
    recovered = time.monotonic() - restarted
    assert worker.poll() is None, "the worker process died with the server"
    [stats] = await driver.stats()
    assert (stats.done, stats.ready, stats.running, stats.dead, stats.failed) == (TOTAL, 0, 0, 0, 0)
    runs = Counter(fields[2] for fields in fleet.lines("run"))
    assert len(runs) == TOTAL  # every job ran (at least once: a lost ack re-runs after its lease)
    print(
        f"\nrestart at ~300 done: all {TOTAL} done {recovered:.1f} s after the restart began; "
        f"{sum(n > 1 for n in runs.values())} jobs ran twice (acks lost with the server)"
    )
