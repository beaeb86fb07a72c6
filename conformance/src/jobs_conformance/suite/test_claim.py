"""Claim: due rows only, queues, limits, ordinals, pauses, lapses, burial, exclusive hand-out."""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Sequence
from uuid import UUID

import pytest

from jobs_conformance.target import Target, claim, request, state_counts
from jobs_core.driver import JobDriver
from jobs_core.errors import DriverRequestInvalidError
from jobs_core.types import (
    LEASE_LAPSED_FINAL_ATTEMPT,
    BuriedJob,
    ClaimRequest,
    JobState,
    NackOptions,
    Settle,
)


async def test_only_due_rows_are_claimed_oldest_first(target: Target) -> None:
    """Ready rows come out oldest ``run_at`` first; delayed rows wait."""
    driver = target.driver
    await driver.enqueue(request("later", delay_ms=60_000))
    for key in ("a", "b", "c"):
        await driver.enqueue(request(key))
        await target.advance(5)
    claimed = await claim(driver)
    assert [c.idempotency_key for c in claimed] == ["a", "b", "c"]
    assert all(c.worker_id == "w1" for c in claimed)
    assert await claim(driver) == []


async def test_claim_takes_only_the_named_queues(target: Target) -> None:
    """Rows of queues not named stay where they are."""
    driver = target.driver
    for queue in ("q1", "q2", "q3"):
        await driver.enqueue(request(f"k-{queue}", queue=queue))
    claimed = await claim(driver, "q1", "q3", "missing")
    assert sorted(c.queue for c in claimed) == ["q1", "q3"]
    assert [c.queue for c in await claim(driver, "q2")] == ["q2"]


async def test_limit_bounds_each_claim(target: Target) -> None:
    """A claim hands out at most ``limit`` rows; later claims take the rest."""
    driver = target.driver
    await driver.enqueue_many([request(f"k{i}") for i in range(5)])
    sizes = [len(await claim(driver, limit=2)) for _ in range(4)]
    assert sizes == [2, 2, 1, 0]


async def test_empty_queue_list_and_bad_limit_are_refused(target: Target) -> None:
    """An empty queue list or a limit below 1 is ``X_DRIVER_REQUEST_INVALID``."""
    await target.driver.enqueue(request("a"))
    for queues, limit in (([], 1), (["default"], 0)):
        with pytest.raises(DriverRequestInvalidError) as raised:
            await target.driver.claim(ClaimRequest(queues, limit, 30_000, "w1"))
        assert raised.value.code == "X_DRIVER_REQUEST_INVALID"
    assert state_counts(await target.driver.stats()) == {"ready": 1}


async def test_each_claim_increments_the_ordinal(target: Target) -> None:
    """Claim ordinals count every hand-out of a row: retry, lapse and park alike."""
    driver = target.driver
    await driver.enqueue(request("a", max_attempts=5))
    [first] = await claim(driver, vt=300)
    assert (first.claim, first.attempt) == (1, 1)
    assert await driver.nack(first.id, NackOptions(first.fence))
    [second] = await claim(driver, vt=300)
    assert (second.claim, second.attempt) == (2, 2)
    await target.advance(500)
    [third] = await claim(driver, worker="w2")
    assert (third.claim, third.attempt, third.worker_id) == (3, 3, "w2")
    assert await driver.nack(third.id, NackOptions(third.fence, park=True, count_attempt=False))
    [fourth] = await claim(driver)
    assert (fourth.claim, fourth.attempt) == (4, 3)


async def test_a_lapsed_lease_is_claimed_again_with_the_attempt_counted(target: Target) -> None:
    """A running row whose lease lapsed goes to the next claimant; the old claim is fenced."""
    driver = target.driver
    await driver.enqueue(request("a"))
    [held] = await claim(driver, vt=300, worker="w1")
    assert await claim(driver, worker="w2") == []
    assert state_counts(await driver.stats()) == {"running": 1}
    await target.advance(500)
    [again] = await claim(driver, worker="w2")
    assert (again.id, again.attempt, again.claim, again.worker_id) == (held.id, 2, 2, "w2")
    assert not await driver.ack(held.id, Settle(held.fence))
    assert not await driver.heartbeat(held.id, held.fence, 30_000)
    assert await driver.ack(again.id, Settle(again.fence))
    assert state_counts(await driver.stats()) == {"done": 1}


@pytest.mark.parametrize("dropped", [False, True], ids=["dead", "failed"])
async def test_a_lapse_on_the_final_attempt_is_buried(target: Target, dropped: bool) -> None:
    """A lapsed row at its last attempt is buried (dead, or failed via drop_exhausted)."""
    driver = target.driver
    await driver.enqueue(request("a", max_attempts=2, name="conformance.bury"))
    await driver.enqueue(request("b", max_attempts=2, name="conformance.other"))
    buried: list[BuriedJob] = []
    drop = frozenset({"conformance.bury", "conformance.other"} if dropped else ())
    [a, b] = await claim(driver, vt=300)
    assert await driver.nack(b.id, NackOptions(b.fence))
    await target.advance(500)
    [a2, b2] = await claim(driver, vt=300, drop_exhausted=drop, on_exhausted=buried.append)
    assert (a2.id, a2.attempt, b2.id, b2.attempt) == (a.id, 2, b.id, 2)
    assert buried == []
    await target.advance(500)
    assert await claim(driver, drop_exhausted=drop, on_exhausted=buried.append) == []
    state = JobState.FAILED if dropped else JobState.DEAD
    assert sorted((job.id, job.name, job.queue, job.state) for job in buried) == sorted(
        [
            (a.id, "conformance.bury", "default", state),
            (b.id, "conformance.other", "default", state),
        ]
    )
    assert state_counts(await driver.stats()) == {state.value: 2}
    again = await driver.enqueue(request("a", max_attempts=2, name="conformance.bury"))
    assert not again.deduped
    if "introspect" in driver.capabilities:
        info = await driver.introspect.get(a.id)  # type: ignore[attr-defined]
        assert info.state == state
        assert info.last_error == LEASE_LAPSED_FINAL_ATTEMPT
        # Its attempts ran out: the code says so, as for a body that failed on its last one.
        assert info.last_error_code == "X_JOB_MAX_ATTEMPTS"


async def test_paused_queues_yield_nothing(target: Target) -> None:
    """A paused queue hands out nothing (enqueues still land) until it is resumed."""
    introspect = target.require("introspect")
    driver = target.driver
    await introspect.pause_queue("q1")
    await driver.enqueue(request("a", queue="q1"))
    await driver.enqueue(request("b", queue="q2"))
    assert await introspect.paused_queues() == ["q1"]
    assert [c.queue for c in await claim(driver, "q1", "q2")] == ["q2"]
    assert await claim(driver, "q1") == []
    await introspect.resume_queue("q1")
    assert await introspect.paused_queues() == []
    assert [c.queue for c in await claim(driver, "q1")] == ["q1"]


def _exactly_once(claimed: Sequence[UUID], expected: set[UUID]) -> None:
    counts = Counter(claimed)
    doubled = {job_id: n for job_id, n in counts.items() if n > 1}
    assert doubled == {}, f"rows handed to more than one claimant: {doubled}"
    assert set(counts) == expected


async def test_no_row_goes_to_two_concurrent_claimers(target: Target) -> None:
    """Thirty claimers racing on one loop never share a row, and every row is handed out."""
    driver = target.driver
    reqs = [request(f"k{i}") for i in range(300)]
    await driver.enqueue_many(reqs)
    claimed: list[UUID] = []

    async def claimer(n: int) -> None:
        while True:
            batch = await claim(driver, limit=1 + n % 3, worker=f"w{n}")
            if not batch:
                return
            claimed.extend(c.id for c in batch)
            await asyncio.sleep(0)

    await asyncio.gather(*(claimer(n) for n in range(30)))
    _exactly_once(claimed, {r.id for r in reqs})


async def test_no_row_goes_to_two_claimers_on_other_threads(target: Target) -> None:
    """Claimers on four threads, each with its own loop and driver, never share a row."""
    reqs = [request(f"k{i}") for i in range(300)]
    await target.driver.enqueue_many(reqs)
    claimed: list[UUID] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    async def claim_until_empty(n: int) -> None:
        driver: JobDriver = await target.another()
        try:
            while batch := await claim(driver, limit=2, worker=f"thread-{n}"):
                with lock:
                    claimed.extend(c.id for c in batch)
        finally:
            await target.release(driver)

    def thread(n: int) -> None:
        try:
            asyncio.run(claim_until_empty(n))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=thread, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        await asyncio.to_thread(t.join)
    assert errors == []
    _exactly_once(claimed, {r.id for r in reqs})
