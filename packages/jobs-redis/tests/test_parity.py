"""Parity: one seeded random sequence run on this driver and on the memory driver.

Every answer is compared: enqueue results, claims (ids, attempts, ordinals, order), settle
booleans, pauses, stats (all counts), demand and each row's state. Time-dependent outcomes are
kept out (no delays, leases far longer than the run) so that real time on Redis and a clock on
the memory driver ticking one millisecond per operation agree on every "due" and "lapsed".
"""

from __future__ import annotations

import random
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from jobs_core.drivers.memory import MemoryDriver
from jobs_core.types import ClaimedJob, ErrorInfo, NackOptions, QueueStats, Settle
from jobs_redis import RedisDriver
from redis_helpers import claim, request


class Ticking:
    def __init__(self) -> None:
        self._now = datetime(2030, 1, 1, tzinfo=UTC)

    def now(self) -> datetime:
        return self._now

    def monotonic(self) -> float:
        return 0.0

    def tick(self) -> None:
        self._now += timedelta(milliseconds=1)


def counts(stats: list[QueueStats]) -> list[QueueStats]:
    return [replace(s, oldest_ready_ms=0) for s in stats]


@pytest.mark.parametrize("seed", range(3))
async def test_a_random_sequence_answers_like_the_memory_driver(
    driver: RedisDriver, seed: int
) -> None:
    rng = random.Random(seed)
    clock = Ticking()
    mem = MemoryDriver(clock)
    held: dict[Any, tuple[ClaimedJob, ClaimedJob]] = {}
    queues = ["a", "b", "c"]
    keys = [f"k{i}" for i in range(40)]
    ids: list[Any] = []

    for step in range(260):
        clock.tick()
        op = rng.random()
        if op < 0.3:
            batch = [
                request(rng.choice(keys), queue=rng.choice(queues), max_attempts=3)
                for _ in range(rng.choice([1, 1, 3]))
            ]
            if rng.random() < 0.1 and ids:
                batch[0] = replace(batch[0], id=rng.choice(ids))
            got = await driver.enqueue_many(batch)
            assert got == await mem.enqueue_many(batch), step
            ids.extend(r.id for r in got)
        elif op < 0.55:
            names = rng.sample(queues, rng.randint(1, 3))
            limit = rng.randint(1, 4)
            worker = f"w{step}"
            ours = await claim(driver, *names, limit=limit, worker=worker, vt=600_000)
            theirs = await claim(mem, *names, limit=limit, worker=worker, vt=600_000)
            assert [(j.id, j.attempt, j.claim, j.queue) for j in ours] == [
                (j.id, j.attempt, j.claim, j.queue) for j in theirs
            ], step
            for a, b in zip(ours, theirs, strict=True):
                held[a.id] = (a, b)
        elif op < 0.85 and held:
            job_id = rng.choice(sorted(held))
            a, b = held.pop(job_id)
            kind = rng.random()
            if kind < 0.35:
                assert await driver.ack(job_id, Settle(a.fence)) == await mem.ack(
                    job_id, Settle(b.fence)
                )
            else:
                flags = rng.choice(
                    [
                        {},
                        {"park": True},
                        {"dead_letter": True},
                        {"fail": True},
                        {"count_attempt": False},
                    ]
                )
                error = ErrorInfo("boom", "X_APP") if rng.random() < 0.5 else None
                assert await driver.nack(
                    job_id, NackOptions(a.fence, error=error, **flags)
                ) == await mem.nack(job_id, NackOptions(b.fence, error=error, **flags))
        else:
            if rng.random() < 0.3:
                queue = rng.choice(queues)
                if rng.random() < 0.5:
                    await driver.operator.pause_queue(queue)
                    await mem.introspect.pause_queue(queue)
                else:
                    await driver.operator.resume_queue(queue)
                    await mem.introspect.resume_queue(queue)
                assert await driver.operator.paused_queues() == await mem.introspect.paused_queues()
            assert counts(await driver.stats()) == counts(await mem.stats()), step
            assert await driver.demand() == await mem.demand(), step
    for job_id in ids:
        ours_row = await driver.operator.get(job_id)
        theirs_row = await mem.introspect.get(job_id)
        assert ours_row is not None and theirs_row is not None
        assert (ours_row.state, ours_row.attempt, ours_row.claim, ours_row.last_error) == (
            theirs_row.state,
            theirs_row.attempt,
            theirs_row.claim,
            theirs_row.last_error,
        )
    await mem.close()
