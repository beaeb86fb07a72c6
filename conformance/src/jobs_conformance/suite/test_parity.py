"""Parity: one seeded script of random operations, answered alike by the memory driver.

Both drivers get the very same requests (ids included) in the same order; every answer is
normalised (a job id becomes the index of the enqueue that created it) and compared at once, so
the first divergence names its operation. Time moves in steps of ``TICK_MS`` while every lease
and delay lasts ``SPAN_MS`` (one and a half ticks): on a real clock, where a step takes a little
longer than its sleep, no due instant can fall near the moment either driver checks it as long
as the operations between two ticks take less than half a tick (500 ms: a loaded two-core
machine once took more than the 250 ms a 500 ms tick left).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from jobs_conformance.target import Target, request
from jobs_core.clock import Clock
from jobs_core.driver import JobDriver
from jobs_core.drivers.memory import MemoryDriver
from jobs_core.testing import ManualClock
from jobs_core.types import (
    ClaimedJob,
    ClaimRequest,
    EnqueueRequest,
    ErrorInfo,
    Fence,
    NackOptions,
    Settle,
)

SEED = 20_240_611
OPERATIONS = 240
TICK_MS = 1000
SPAN_MS = 1500
QUEUES = ("p1", "p2")
KEYS = tuple(f"k{n}" for n in range(12))
TENANTS = ("t1", "t2", None)
NAMES = ("conformance.alpha", "conformance.beta")


def _error() -> ErrorInfo:
    return ErrorInfo("parity failure", "X_PARITY")


@dataclass
class _Script:
    """The random script: it picks each operation from what the answers so far made possible."""

    rng: random.Random
    ids: dict[UUID, int] = field(default_factory=dict)
    runs: dict[UUID, int] = field(default_factory=dict)
    held: list[ClaimedJob] = field(default_factory=list)
    fences: list[tuple[UUID, Fence]] = field(default_factory=list)
    known: list[EnqueueRequest] = field(default_factory=list)

    def new_request(self) -> EnqueueRequest:
        """A request over a small key space, so dedupe and explicit-id meetings happen."""
        rng = self.rng
        reuse = self.known and rng.random() < 0.1
        req = request(
            rng.choice(KEYS),
            name=rng.choice(NAMES),
            queue=rng.choice(QUEUES),
            tenant=rng.choice(TENANTS),
            max_attempts=rng.choice((1, 2, 3)),
            delay_ms=rng.choice((0, 0, 0, SPAN_MS)),
            job_id=rng.choice(self.known).id if reuse else None,
        )
        self.known.append(req)
        self.ids.setdefault(req.id, len(self.ids))
        self.runs.setdefault(req.run_id, len(self.runs))
        return req

    def job(self, job_id: UUID) -> int | str:
        """A job id as the index of the enqueue that first named it."""
        return self.ids.get(job_id, f"unknown:{job_id}")

    def run(self, run_id: UUID) -> int | str:
        """A run id as the index of the enqueue that first named it."""
        return self.runs.get(run_id, f"unknown:{run_id}")

    def nack_options(self, fence: Fence) -> NackOptions:
        """Random nack flags: mostly retries, sometimes parks, deaths, drops and hand-backs."""
        rng = self.rng
        return NackOptions(
            fence,
            error=_error(),
            delay_ms=rng.choice((0, SPAN_MS)),
            dead_letter=rng.random() < 0.15,
            fail=rng.random() < 0.15,
            park=rng.random() < 0.25,
            count_attempt=rng.random() < 0.8,
        )


async def _apply(
    script: _Script, driver: JobDriver, op: str, args: Any, claimed: list[ClaimedJob]
) -> Any:
    """Apply one operation to one driver and answer its result with ids normalised.

    A claim also appends the rows it handed out to ``claimed``.
    """
    if op == "enqueue":
        r = await driver.enqueue(args)
        return (script.job(r.id), script.run(r.run_id), r.deduped)
    if op == "enqueue_many":
        return [
            (script.job(r.id), script.run(r.run_id), r.deduped)
            for r in await driver.enqueue_many(args)
        ]
    if op == "claim":
        buried: list[Any] = []
        jobs = await driver.claim(
            ClaimRequest(**args, drop_exhausted=frozenset({NAMES[1]}), on_exhausted=buried.append)
        )
        claimed.extend(jobs)
        return (
            [
                (
                    *(script.job(j.id), script.run(j.run_id), j.attempt, j.max_attempts, j.claim),
                    *(j.queue, j.worker_id, j.input, j.tenant_id, j.idempotency_key, j.name),
                )
                for j in jobs
            ],
            sorted((script.job(b.id), b.name, b.queue, str(b.state)) for b in buried),
        )
    if op == "ack":
        job_id, fence = args
        return await driver.ack(job_id, Settle(fence, result={"ok": True}))
    if op == "nack":
        job_id, opts = args
        return await driver.nack(job_id, opts)
    if op == "heartbeat":
        job_id, fence = args
        return await driver.heartbeat(job_id, fence, SPAN_MS)
    if op == "stats":
        return [
            (s.queue, s.ready, s.delayed, s.running, s.suspended, s.done, s.failed, s.dead)
            for s in await driver.stats()
        ]
    assert op == "demand", op
    return await driver.demand()


def _choose(script: _Script) -> tuple[str, Any]:
    """Pick the next operation and its arguments."""
    rng = script.rng
    roll = rng.random()
    if roll < 0.24:
        return "enqueue", script.new_request()
    if roll < 0.32:
        return "enqueue_many", [script.new_request() for _ in range(rng.randint(2, 5))]
    if roll < 0.54 or not script.held:
        queues = rng.sample(QUEUES, k=rng.choice((1, 2)))
        worker = rng.choice(("w1", "w2"))
        return "claim", {
            "queues": queues,
            "limit": rng.randint(1, 3),
            "visibility_timeout_ms": SPAN_MS,
            "worker_id": worker,
        }
    if roll < 0.64:
        job = script.held.pop(rng.randrange(len(script.held)))
        return "ack", (job.id, job.fence)
    if roll < 0.76:
        job = script.held.pop(rng.randrange(len(script.held)))
        return "nack", (job.id, script.nack_options(job.fence))
    if roll < 0.82:
        job = rng.choice(script.held)
        return "heartbeat", (job.id, job.fence)
    if roll < 0.87:
        job_id, fence = rng.choice(script.fences)
        stale = rng.choice(("ack", "nack", "heartbeat"))
        if stale == "nack":
            return "nack", (job_id, script.nack_options(fence))
        return stale, (job_id, fence)
    if roll < 0.95:
        return "tick", None
    return rng.choice(("stats", "demand")), None


async def test_a_seeded_script_answers_alike_on_the_memory_driver(target: Target) -> None:
    """240 seeded random operations answer exactly as on a fresh memory driver."""
    reference_clock = ManualClock(target.clock.now()) if target.clock is not None else None
    clock: Clock | None = reference_clock
    reference = MemoryDriver(clock)
    script = _Script(random.Random(SEED))
    counts: dict[str, int] = {}
    try:
        for n in range(OPERATIONS):
            op, args = _choose(script)
            counts[op] = counts.get(op, 0) + 1
            if op == "tick":
                await target.advance(TICK_MS)
                if reference_clock is not None:
                    reference_clock.advance(TICK_MS)
                continue
            claimed: list[ClaimedJob] = []
            got = await _apply(script, target.driver, op, args, [])
            want = await _apply(script, reference, op, args, claimed)
            assert got == want, f"operation #{n} ({op}) diverged from the memory driver"
            script.held.extend(claimed)
            script.fences.extend((job.id, job.fence) for job in claimed)
        final = [await _apply(script, d, "stats", None, []) for d in (target.driver, reference)]
        assert final[0] == final[1]
    finally:
        await reference.close()
    assert sum(counts.values()) >= 200
    assert {"enqueue", "enqueue_many", "claim", "ack", "nack", "heartbeat", "tick"} <= set(counts)
