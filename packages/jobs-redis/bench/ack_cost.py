"""Bench: what one ack costs on Redis, alone and batched (``ack.lua``, counters included).

Starts a private ``redis-server`` on a free loopback port (never the shared one), enqueues and
claims ``--rows`` rows of ``--names`` job names, then settles them two ways: one ``ack`` at a
time (a round trip each: the latency a lone ack sees) and ``--batch`` acks gathered at once (the
driver sends them in one ``ack.lua`` call: the throughput a busy worker sees). It reports acks
per second on the client and the server's own time per ``ack.lua`` call (``INFO
commandstats``, reset before each phase), so a change inside the script shows even on a noisy
machine.

To compare with another version of the driver, run the same command with that version's
``jobs_redis`` first on ``PYTHONPATH``.

Run: ``python packages/jobs-redis/bench/ack_cost.py --rows 20000``. Not a test: nothing here
asserts a time.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import time
from uuid import uuid4

import redis
from private_server import start_server

from jobs_core.types import ClaimedJob, ClaimRequest, EnqueueRequest, Settle
from jobs_redis import RedisDriver

CHUNK = 1_000


async def _claimed(driver: RedisDriver, rows: int, names: int) -> list[ClaimedJob]:
    for start in range(0, rows, CHUNK):
        await driver.enqueue_many(
            [
                EnqueueRequest(
                    id=uuid4(),
                    run_id=uuid4(),
                    name=f"bench.job{i % names}",
                    queue="q",
                    input={"n": i},
                    idempotency_key=str(i),
                    tenant_id=None,
                    max_attempts=3,
                )
                for i in range(start, min(rows, start + CHUNK))
            ]
        )
    held: list[ClaimedJob] = []
    while len(held) < rows:
        held += await driver.claim(ClaimRequest(["q"], CHUNK, 600_000, "bench"))
    return held


def _server_us(client: redis.Redis) -> tuple[float, int]:
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return float(stats.get("usec_per_call", 0)), int(stats.get("calls", 0))


async def main(rows: int, names: int, batch: int) -> None:
    """Fill a private server, settle two ways, and print the figures."""
    server, workdir, url = start_server()
    client = redis.Redis.from_url(url)
    try:
        driver = await RedisDriver.connect(url, prefix="bench", command_timeout="60s")
        held = await _claimed(driver, 2 * rows, names)
        alone, gathered = held[:rows], held[rows:]
        client.config_resetstat()
        started = time.perf_counter()
        for job in alone:
            assert await driver.ack(job.id, Settle(job.fence, duration_ms=3.5))
        spent = time.perf_counter() - started
        us, calls = _server_us(client)
        print(
            f"one ack a call: {rows / spent:,.0f} acks/s, {spent / rows * 1e6:.0f} µs each on the "
            f"client; ack.lua {us:.1f} µs per call on the server ({calls:,} calls)"
        )
        client.config_resetstat()
        started = time.perf_counter()
        for i in range(0, rows, batch):
            chunk = gathered[i : i + batch]
            landed = await asyncio.gather(
                *(driver.ack(job.id, Settle(job.fence, duration_ms=3.5)) for job in chunk)
            )
            assert all(landed)
        spent = time.perf_counter() - started
        us, calls = _server_us(client)
        print(
            f"{batch} acks gathered: {rows / spent:,.0f} acks/s; ack.lua {us:.1f} µs per call on "
            f"the server ({calls:,} calls, {us / max(rows / max(calls, 1), 1):.1f} µs per ack)"
        )
        await driver.close()
    finally:
        client.close()
        server.kill()
        server.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000, help="acks per phase")
    parser.add_argument("--names", type=int, default=10, help="distinct job names")
    parser.add_argument("--batch", type=int, default=100, help="acks gathered at once")
    args = parser.parse_args()
    asyncio.run(main(args.rows, args.names, args.batch))
