"""The portal loop on a real server: 32 threads share one pool, the pool re-dials after an
outage, and a fork gives the child its own loop and pool.

The outage runs on a private cluster (:mod:`private_pg`), never on the shared server.
"""

from __future__ import annotations

import gc
import logging
import os
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psycopg
import pytest
from pydantic import BaseModel

from jobs_core import JobRegistry, install_driver, job, portal
from jobs_core.driver import open_driver
from jobs_pg import PostgresDriver
from private_pg import Cluster

APPS = Path(__file__).parent / "apps"
THREADS = 32
POOL_MAX = 10


class Item(BaseModel):
    n: int


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    private = Cluster.create()
    yield private
    private.remove()


@pytest.fixture
def fresh_portal() -> Iterator[None]:
    """Each test's sync calls start on a portal of their own; the installed driver is closed."""
    portal.shutdown()
    yield
    portal.shutdown()
    install_driver(None)


def count_rows(url: str, schema: str) -> int:
    with psycopg.connect(url) as conn:
        row = conn.execute(f'SELECT count(*) FROM "{schema}".jobs').fetchone()
    assert row is not None
    return int(row[0])


class ConnectionSampler:
    """Samples how many server sessions the driver's pool holds, every 20 ms, on a thread."""

    def __init__(self, url: str, schema: str) -> None:
        self.url, self.schema = url, schema
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        with psycopg.connect(self.url, autocommit=True) as conn:
            while not self._stop.is_set():
                row = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s",
                    (f"jobs-pg:{self.schema}",),
                ).fetchone()
                assert row is not None
                self.peak = max(self.peak, int(row[0]))
                self._stop.wait(0.02)

    def __enter__(self) -> ConnectionSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.mark.parametrize(
    "per_thread",
    # The full 16,000 rows take about a minute here: in the slow session (pg-restart).
    [50, pytest.param(500, marks=pytest.mark.slow)],
)
def test_32_threads_share_one_pool_and_it_redials_after_an_outage(
    cluster: Cluster,
    fresh_portal: None,
    caplog: pytest.LogCaptureFixture,
    per_thread: int,
) -> None:
    schema = "portal_load"
    driver = open_driver(f"{cluster.url}?schema={schema}", max_size=POOL_MAX)
    assert isinstance(driver, PostgresDriver)
    install_driver(driver)
    portal.run(driver.migrate())
    registry = JobRegistry()
    handle = job(
        input=Item, idempotency_key=lambda i: f"item:{i.n}", tenant="none", registry=registry
    )(_noop)

    def burst(t: int) -> None:
        for i in range(per_thread):
            handle.enqueue_sync(Item(n=t * per_thread + i))

    # Garbage an earlier test of the session left (another loop's transports) warns when it is
    # collected; collect it now so only this test's own warnings are recorded below.
    gc.collect()
    caplog.set_level(logging.WARNING)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        started = time.perf_counter()
        with ConnectionSampler(cluster.url, schema) as sampler, ThreadPoolExecutor(THREADS) as ex:
            list(ex.map(burst, range(THREADS)))
        elapsed = time.perf_counter() - started
    rows = count_rows(cluster.url, schema)
    print(
        f"\n{THREADS}x{per_thread} enqueue_sync: {rows} rows in {elapsed:.1f} s, "
        f"peak server sessions {sampler.peak} (pool max {POOL_MAX})"
    )
    assert rows == THREADS * per_thread
    assert 1 <= sampler.peak <= POOL_MAX
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []
    assert [str(w.message) for w in warned] == []

    cluster.stop()
    time.sleep(5)
    cluster.start()
    # The same process, the same driver: its pool lives on the portal loop and re-dials.
    handle.enqueue_sync(Item(n=-1))
    assert count_rows(cluster.url, schema) == THREADS * per_thread + 1


async def _noop(input: Item, step: object, ctx: object) -> None:
    return None


def test_a_process_that_forks_after_first_use_lands_every_row_of_both(
    pg_url: str, schema: str, migrated: str
) -> None:
    count = 200
    done = subprocess.run(
        [sys.executable, str(APPS / "pg_portal_fork.py"), f"{pg_url}?schema={schema}", str(count)],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 0, done.stderr
    lines = [line.split() for line in done.stdout.splitlines()]
    assert sorted(who for _, _, who, _ in lines) == ["before", "child", "parent"]
    assert len({pid for _, pid, _, _ in lines}) == 2
    for needle in ("connection in use", "another command is already in progress", "protocol"):
        assert needle not in done.stderr.lower()
    with psycopg.connect(pg_url) as conn:
        found = conn.execute(
            f"SELECT split_part(idempotency_key, ':', 1), count(*) FROM \"{schema}\".jobs "
            "GROUP BY 1 ORDER BY 1"
        ).fetchall()
    assert found == [("before", count), ("child", count), ("parent", count)]
