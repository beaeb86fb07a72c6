"""A failover under a running worker: a streaming replica promoted, a proxy switched to it.

Marked ``slow`` (the ``pg-restart`` session). The test starts two PRIVATE servers, a primary and
a streaming hot-standby replica (``pg_basebackup``), and a TCP proxy the worker dials (the stable
DNS name or VIP of a real deployment). With 20 jobs running (lease 30 s, 4 slots left free, so
the worker's claims go on) it fences the old primary, waits 2 s, lets the replica catch up,
promotes it and switches the proxy (new connections reach the new primary). The old primary
stays up and answers read-only, as a demoted one does. Two fences:

* ``sessions-ended``: read-only and every session terminated (a demotion restarts the server).
  The driver re-dials through the proxy; until the switch those dials meet the read-only old
  primary and are refused (``target_session_attrs=read-write``), so no connection settles on it.
  Within 3 s of the switch no statement reaches the old primary.
* ``sessions-kept``: read-only with its sessions left open through the proxy, the harder case:
  each pooled connection's next statement is refused (SQLSTATE 25006), that connection is
  closed and the pool drained. The old primary then gets at most one statement per connection
  the worker's pool holds (a connection idle since the switch is only found out at its next
  use, so no time bound holds here), and none once every job is done.

Either way the acks refused meanwhile are retried: every job ends done and each body ran once.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pg_workload
import psycopg
import pytest

from jobs_core import use_driver
from jobs_core.errors import DriverUnavailableError
from jobs_pg import PostgresDriver
from pg_helpers import Fleet, until
from private_pg import Cluster, Proxy

pytestmark = pytest.mark.slow

JOBS = 20
SCHEMA = "jobs_failover"
QUIET_AFTER_S = 3.0
POOL_MAX = 10
"""The worker's pool size (the driver's default ``max_size``)."""
FENCED_S = 2.0
"""How long the old primary is fenced before the replica is promoted (a failover manager's
detection and decision time): the worker's idle claims re-dial meanwhile."""


@pytest.fixture
def servers() -> Iterator[tuple[Cluster, Cluster]]:
    primary = Cluster.create()
    try:
        replica = Cluster.replica_of(primary)
    except BaseException:
        primary.remove()
        raise
    yield primary, replica
    replica.remove()
    primary.remove()


@pytest.fixture
async def proxy(servers: tuple[Cluster, Cluster]) -> AsyncIterator[Proxy]:
    relay = Proxy(servers[0].port)
    await relay.start()
    yield relay
    await relay.close()


def lsn(url: str, query: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query).fetchone()  # type: ignore[arg-type]
    assert row is not None and row[0] is not None
    high, low = str(row[0]).split("/")
    return (int(high, 16) << 32) + int(low, 16)


def fail_over(primary: Cluster, replica: Cluster, proxy: Proxy, end_sessions: bool) -> float:
    """Fence the old primary, let the replica catch up, promote it, switch; answer the switch."""
    primary.set_read_only(True)
    if end_sessions:
        primary.terminate_clients()
    time.sleep(FENCED_S)
    written = lsn(primary.url, "SELECT pg_current_wal_lsn()")
    deadline = time.monotonic() + 30
    while lsn(replica.url, "SELECT pg_last_wal_replay_lsn()") < written:
        assert time.monotonic() < deadline, "the replica never caught up"
        time.sleep(0.02)
    replica.promote()
    proxy.switch(replica.port)
    return time.monotonic()


@pytest.mark.parametrize("fence", ["sessions-ended", "sessions-kept"])
async def test_a_failover_behind_a_proxy_finishes_every_job_once(
    servers: tuple[Cluster, Cluster], proxy: Proxy, tmp_path: Path, fence: str
) -> None:
    primary, replica = servers
    seeding = PostgresDriver(primary.url, schema=SCHEMA, min_size=1, max_size=1)
    try:
        await seeding.migrate()
        with use_driver(seeding):
            await pg_workload.count.enqueue_many(
                [pg_workload.Item(n=i, sleep_ms=4000) for i in range(JOBS)]
            )
    finally:
        await seeding.close()
    fleet = Fleet(
        f"postgresql://postgres@127.0.0.1:{proxy.port}/postgres?schema={SCHEMA}", tmp_path
    )
    try:
        worker = fleet.start(
            # Free slots: the idle claim loop keeps sending statements through the failover.
            "count", "--concurrency", str(JOBS + 4), "--visibility-timeout", "30s"
        )  # fmt: skip
        await until(lambda: len(fleet.lines("run")) >= JOBS, timeout=60)
        switched = await asyncio.to_thread(
            fail_over, primary, replica, proxy, fence == "sessions-ended"
        )
        after = PostgresDriver(replica.url, schema=SCHEMA, min_size=1, max_size=1)
        try:

            async def all_done() -> bool:
                try:
                    return sum(s.done for s in await after.stats()) >= JOBS
                except DriverUnavailableError:
                    return False

            await until(all_done, timeout=90, every=0.2)
            finished = time.monotonic() - switched
            [stats] = await after.stats()
        finally:
            await after.close()
        assert worker.poll() is None, "the worker died in the failover"
    finally:
        fleet.stop()
    runs = Counter(fields[2] for fields in fleet.lines("run"))
    old = [t - switched for t in proxy.statements.get(primary.port, []) if t > switched]
    print(
        f"\nfailover ({fence}) with {JOBS} jobs running (lease 30 s): all done {finished:.1f} s "
        f"after the switch; {sum(n > 1 for n in runs.values())} bodies ran twice; statements to "
        f"the old primary after the switch: {len(old)} (last at "
        f"{max(old, default=0.0):+.2f} s); to the new one: {len(proxy.statements[replica.port])}"
    )
    assert (stats.done, stats.ready, stats.running, stats.dead, stats.failed) == (JOBS, 0, 0, 0, 0)
    assert len(runs) == JOBS and set(runs.values()) == {1}
    if fence == "sessions-ended":
        assert max(old, default=0.0) < QUIET_AFTER_S
    else:
        assert len(old) <= POOL_MAX
        assert max(old, default=0.0) < finished
