"""Queues sharded over a Redis Cluster: three prefixes on three masters, each worked at once.

Runs on the cluster ``nox -s cluster-redis`` started when ``JOBS_REDIS_URL`` names one
(``redis+cluster://``), else on a private 3-master cluster of its own (``with_cluster.py``), so it
always runs on a real cluster, never on the single shared server.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import pytest
import redis
import redis.asyncio as aioredis

from conftest import REDIS_URL, drop_prefix, free_port, sync_client
from jobs_core.driver import open_driver
from jobs_core.errors import DriverRequestInvalidError, DriverUnavailableError
from jobs_core.ids import new_id
from jobs_core.types import EnqueueRequest
from jobs_redis import RedisDriver, is_cluster_url, open_client
from redis_helpers import eventually
from test_processes import spawn, stop
from with_cluster import private_cluster

pytestmark = pytest.mark.processes

ROWS = 1_500
"""Rows per prefix: two ``enqueue_many`` chunks, so the ``MULTI``/``EXEC`` path runs too."""


@pytest.fixture(scope="module")
def cluster_url() -> Iterator[str]:
    if is_cluster_url(REDIS_URL):
        yield REDIS_URL
        return
    with private_cluster() as url:
        yield url


def shard_prefixes(url: str, count: int = 3) -> list[str]:
    """Answer ``count`` fresh prefixes whose hash tags are held by ``count`` different masters."""
    client = sync_client(url)
    assert isinstance(client, redis.RedisCluster)
    masters = {node.name for node in client.get_primaries()}
    assert len(masters) >= count, f"the cluster has {len(masters)} masters, not {count}"
    chosen: dict[str, str] = {}
    while len(chosen) < count:
        prefix = f"shard-{uuid.uuid4().hex[:10]}"
        node = client.get_node_from_key("{" + prefix + "}:seq").name
        if node not in chosen:
            chosen[node] = prefix
    client.close()
    return list(chosen.values())


def unit(n: int) -> EnqueueRequest:
    return EnqueueRequest(
        name="count.unit",
        queue="default",
        input={"n": n},
        idempotency_key=f"u{n}",
        tenant_id=None,
        max_attempts=3,
        id=new_id(),
        run_id=new_id(),
    )


async def test_three_prefixes_on_three_masters_each_run_their_rows_once(cluster_url: str) -> None:
    prefixes = shard_prefixes(cluster_url)
    drivers = [await RedisDriver.connect(cluster_url, prefix=p) for p in prefixes]
    procs = []
    try:
        for driver in drivers:
            results = await driver.enqueue_many([unit(n) for n in range(ROWS)])
            assert not any(r.deduped for r in results)
            # The same batch again: every row meets its live key, on the same master.
            again = await driver.enqueue_many([unit(n) for n in range(ROWS)])
            assert all(r.deduped for r in again)
        procs = [spawn(cluster_url, p, "redis_count_app", "--concurrency", "16") for p in prefixes]

        async def finished() -> bool:
            for p in procs:
                if p.poll() is not None:
                    assert p.stderr is not None
                    raise AssertionError(f"a worker process died: {p.stderr.read().decode()}")
            for driver in drivers:
                [stats] = await driver.stats()
                if stats.done != ROWS:
                    return False
            return True

        await eventually(finished, timeout=120)
    finally:
        stop(procs)
        for driver in drivers:
            await driver.close()

    client = open_client(cluster_url, decode_responses=True)
    try:
        for prefix in prefixes:
            effects = await client.hgetall("{" + prefix + "}:effects")
            assert len(effects) == ROWS
            assert set(effects.values()) == {"1"}, f"a row of {prefix} ran more than once"
        # Each prefix's keys all sit on the master that holds its slot, and only there.
        slots = {prefix: client.keyslot("{" + prefix + "}:seq") for prefix in prefixes}
        owners = {
            prefix: client.get_node_from_key("{" + prefix + "}:seq").name for prefix in prefixes
        }
        assert len(set(owners.values())) == len(prefixes)
        for prefix, slot in slots.items():
            for node in client.get_primaries():
                count = await client.execute_command(
                    "CLUSTER", "COUNTKEYSINSLOT", slot, target_nodes=node
                )
                held = node.name == owners[prefix]
                assert (int(count) > ROWS) is held, (prefix, node.name, count)
    finally:
        await client.aclose()
        for prefix in prefixes:
            drop_prefix(cluster_url, prefix)


async def test_an_apps_cluster_client_and_the_entry_point_reach_the_same_rows(
    cluster_url: str,
) -> None:
    [prefix] = shard_prefixes(cluster_url, 1)
    client = open_client(cluster_url, decode_responses=True)
    assert isinstance(client, aioredis.RedisCluster)
    given = RedisDriver(client=client, prefix=prefix)
    assert given.describe()["url"].startswith("redis+cluster://")
    opened = open_driver(f"{cluster_url}?prefix={prefix}")
    try:
        [result] = await given.enqueue_many([unit(1)])
        assert (await opened.introspect.get(result.id)) is not None
        [stats] = await opened.stats()
        assert stats.ready == 1
    finally:
        await given.close()
        await opened.close()
        await client.aclose()
        drop_prefix(cluster_url, prefix)


def test_a_cluster_url_takes_no_database_index() -> None:
    with pytest.raises(DriverRequestInvalidError, match="only database 0"):
        RedisDriver("redis+cluster://127.0.0.1:7101/3")
    RedisDriver("redis+cluster://127.0.0.1:7101/0")


async def test_a_cluster_no_seed_node_answers_refuses_at_once() -> None:
    driver = RedisDriver(f"redis+cluster://127.0.0.1:{free_port()}", prefix="down")
    try:
        for _ in range(2):
            started = time.perf_counter()
            with pytest.raises(DriverUnavailableError) as refused:
                await driver.enqueue(unit(1))
            assert time.perf_counter() - started < 1.0
            assert refused.value.code == "X_DRIVER_UNAVAILABLE"
    finally:
        await driver.close()
